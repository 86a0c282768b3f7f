"""The SiteDataset contract rejects malformed arrays with a message that names the field and row."""

import numpy as np
import pytest

from fcd_secure.data.schema import SchemaError, SiteDataset, concat


def _ds(n=4, L=5, dx=2, da=1, n_actions=3, **over):
    rng = np.random.default_rng(0)
    M = np.ones((n, L), dtype=np.float32)
    M[0, 3:] = 0
    kw = dict(
        X=rng.normal(size=(n, dx)).astype(np.float32),
        A=rng.normal(size=(n, L, da)).astype(np.float32),
        T=rng.integers(0, n_actions, size=(n, L)),
        Y=rng.integers(0, 2, size=(n, L)).astype(np.float32),
        M=M,
        P=np.full((n, L), 0.5, dtype=np.float32),
        n_actions=n_actions,
    )
    kw.update(over)
    return SiteDataset(**kw)


def test_valid_dataset_shapes():
    ds = _ds()
    assert (ds.n, ds.L, ds.dx, ds.da) == (4, 5, 2, 1)
    assert ds.lengths.tolist() == [3, 5, 5, 5]


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("T", np.full((4, 5), 7), "T out of range"),
        ("P", np.full((4, 5), 1.5, dtype=np.float32), "propensity P outside"),
        ("Y", np.full((4, 5), np.nan, dtype=np.float32), "Y holds NaN"),
    ],
)
def test_bad_field_is_named(field, value, needle):
    with pytest.raises(SchemaError, match=needle) as err:
        _ds(**{field: value})
    assert "row 0" in str(err.value)


def test_mask_gap_rejected():
    M = np.ones((4, 5), dtype=np.float32)
    M[2, 1] = 0
    with pytest.raises(SchemaError, match="row 2"):
        _ds(M=M)


def test_concat_records_site_of_each_row():
    pooled = concat([_ds(), _ds(n=2)])
    assert pooled.n == 6
    assert pooled.meta["site"].tolist() == [0, 0, 0, 0, 1, 1]

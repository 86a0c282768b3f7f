"""Loaders of the real datasets in ../shared/data: shapes, dtypes, no NaN, counts that match the data folder's
PROVENANCE.md, propensities in (0, 1] for OBD, |T| reported."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from fcd_secure.data.sources.assistments2009 import load_assistments2009
from fcd_secure.data.sources.diabetes130 import load_diabetes130
from fcd_secure.data.sources.obd import load_open_bandit
from fcd_secure.data.sources.statics2011 import load_statics2011
from fcd_secure.data.spec import DataError


def _check_contract(ds, n_actions):
    assert ds.T.dtype == np.int64
    for k in ("X", "A", "Y", "M"):
        arr = getattr(ds, k)
        # A is large (Diabetes-130: ~350 MB); SiteDataset.validate already rejected NaN/inf in it
        assert arr.dtype == np.float32 and (k == "A" or np.isfinite(arr).all()), k
    assert ds.n_actions == n_actions == len(ds.meta["action_names"])
    assert len(ds.meta["x_names"]) == ds.dx and len(ds.meta["a_names"]) == ds.da
    assert not ds.A.any(axis=2)[ds.M == 0].any() and (ds.T[ds.M == 0] == 0).all()
    assert ds.meta["notes"], "a loader must state its modelling choices"


def test_statics2011(shared_data):
    ds = load_statics2011(shared_data)
    _check_contract(ds, 1224)
    assert ds.L == 200 and ds.da == 1
    assert int(ds.M.sum()) == 189_297  # PROVENANCE.md: every answer kept (chunks, not truncation)
    assert ds.n == 1127  # sum over students of ceil(len / 200); Table I says 1134
    assert ds.meta["truncated_entities"] == 243  # students longer than 200 steps (PROVENANCE.md)
    assert abs(float(ds.Y[ds.M > 0].mean()) - 0.765) < 0.01
    # A is the skill of the item: it agrees with the shipped qid -> skill map
    qmap = pd.read_csv(shared_data / "statics2011" / "STATICS_qid_sid_sname", sep="\t").set_index("qid")["skillid"]
    valid = ds.M > 0
    np.testing.assert_array_equal(ds.A[..., 0][valid].astype(int), qmap.loc[ds.T[valid]].to_numpy())
    # baseline X of a first chunk says "no prior history"; later chunks carry the student's prior record
    first = ds.X[:, 4] == 1
    assert first.sum() == 333 and (ds.X[first, 0] == 0).all() and (ds.X[~first, 0] > 0).all()


def test_assistments2009(shared_data):
    ds = load_assistments2009(shared_data)
    _check_contract(ds, 111)
    assert int(ds.M.sum()) == 325_637 and ds.L == 50
    assert ds.T[ds.M > 0].min() >= 1 and ds.T.max() <= 110


def test_open_bandit(shared_data):
    ds = load_open_bandit(shared_data)
    _check_contract(ds, 80)
    valid = ds.M > 0
    assert int(valid.sum()) == 20_000
    p = ds.P[valid]
    assert ds.P.dtype == np.float32 and (p > 0).all() and (p <= 1).all()
    bts = ds.X[:, ds.meta["x_names"].index("bts_log")] == 1
    # uniform-random log: every propensity is 1/80
    np.testing.assert_allclose(ds.P[~bts][valid[~bts]], 1 / 80, rtol=1e-6)
    assert ds.P[bts][valid[bts]].std() > 0
    assert abs(float(ds.Y[valid].mean()) - 0.004) < 0.001
    assert "pseudo-users" in " ".join(ds.meta["notes"])
    rand = load_open_bandit(shared_data, behavior="random")
    assert int(rand.M.sum()) == 10_000
    with pytest.raises(DataError, match="behavior"):
        load_open_bandit(shared_data, behavior="greedy")


@pytest.fixture(scope="module")
def diabetes(request):
    from conftest import real_data

    return load_diabetes130(real_data())


def test_diabetes130_shapes_and_counts(diabetes):
    ds = diabetes
    _check_contract(ds, 32)
    assert ds.L == 20 and int(ds.M.sum()) == 101_766
    assert ds.n == 71_526 and ds.meta["entities"] == 71_518 and ds.meta["truncated_entities"] == 8
    assert int(ds.Y[ds.M > 0].sum()) == 11_357  # readmitted "<30" (PROVENANCE.md)
    for k, card in ds.meta["a_categorical"].items():
        col = ds.A[..., int(k)][ds.M > 0]
        assert col.min() >= 0 and col.max() < card


def test_diabetes130_encoding_of_one_patient(diabetes, shared_data):
    with gzip.open(shared_data / "diabetes_130" / "diabetic_data.csv.gz", "rt") as fh:
        raw = pd.read_csv(fh, keep_default_na=False, dtype=str)
    counts = raw["patient_nbr"].value_counts()
    pid = counts.index[counts == 3][0]
    rows = raw[raw["patient_nbr"] == pid].assign(e=lambda d: d["encounter_id"].astype(int)).sort_values("e")
    # the trajectory of this patient: find it by its entity index (patients are in patient_nbr order)
    order = np.sort(raw["patient_nbr"].astype(np.int64).unique())
    ent = int(np.searchsorted(order, int(pid)))
    i = int(np.flatnonzero(diabetes.meta["entity"] == ent)[0])
    assert diabetes.lengths[i] == 3
    states = ["No", "Steady", "Up", "Down"]
    names = diabetes.meta["action_names"]
    for t, (_, r) in enumerate(rows.iterrows()):
        assert names[diabetes.T[i, t]].startswith(f"insulin={r['insulin']}|metformin={r['metformin']}|")
        assert diabetes.T[i, t] // 8 == states.index(r["insulin"])
        assert diabetes.Y[i, t] == float(r["readmitted"] == "<30")
        a = diabetes.meta["a_names"]
        assert diabetes.A[i, t, a.index("num_medications")] == float(r["num_medications"])
    x = diabetes.meta["x_names"]
    first = rows.iloc[0]
    assert diabetes.X[i, x.index("age_years")] == int(first["age"][1:].split("-")[0]) + 5
    assert diabetes.X[i, x.index("female")] == float(first["gender"] == "Female")


_LAYOUT = ("dataset", "x_names", "a_names", "x_continuous", "a_continuous", "x_categorical", "a_categorical",
           "levels", "action_names", "outcome_name", "notes")


def _check_levels(ds):
    """meta has build_dataset's layout, and every integer-id column of X and A has its levels (id k = levels[k-1])."""
    assert all(k in ds.meta for k in _LAYOUT), [k for k in _LAYOUT if k not in ds.meta]
    for side in ("x", "a"):
        names = ds.meta[f"{side}_names"]
        for j, card in ds.meta[f"{side}_categorical"].items():
            assert len(ds.meta["levels"][names[int(j)]]) == card - 1, names[int(j)]


def test_encoded_loaders_store_x_and_a_levels(diabetes, shared_data, long_case):
    from fcd_secure.data.preprocess import dataset_from_files

    _, built = dataset_from_files(*long_case())
    assert set(_LAYOUT) <= set(built.meta)
    _check_levels(diabetes)
    lv = diabetes.meta["levels"]
    # X levels (race, one-hot) next to A levels (one-hot and integer-id columns)
    assert lv["race"] == ["Caucasian", "AfricanAmerican", "Hispanic", "Asian", "Other"]
    assert {"payer_code", "medical_specialty", "admission_type_id", "A1Cresult", "diag_1"} <= set(lv)
    obd = load_open_bandit(shared_data, behavior="random")
    _check_levels(obd)
    assert {f"user_feature_{i}" for i in range(4)} <= set(obd.meta["levels"])
    assert obd.meta["behavior"] == "random" and obd.meta["outcome_name"] == "click"


def test_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="statics2011"):
        load_statics2011(tmp_path)

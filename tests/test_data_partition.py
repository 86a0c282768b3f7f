"""Dirichlet non-IID partition (paper §IV-A: α = 10, N = 10) and the per-site train/test split."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.data.partition import dirichlet_partition, train_test_split, trajectory_key
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError


def _pooled(n=400, L=6, seed=0, entity=None):
    rng = np.random.default_rng(seed)
    M = np.ones((n, L), np.float32)
    lens = rng.integers(1, L + 1, n)
    M[np.arange(L)[None, :] >= lens[:, None]] = 0
    meta = {"x_continuous": [], "a_continuous": []}
    if entity is not None:
        meta["entity"] = entity
    return SiteDataset(
        X=np.arange(n, dtype=np.float32)[:, None],  # X[:, 0] is the row's identity
        A=np.zeros((n, L, 1), np.float32),
        T=(rng.integers(0, 4, (n, L)) * M).astype(np.int64),
        Y=(rng.random((n, L)) < rng.random(n)[:, None]).astype(np.float32) * M,
        M=M,
        n_actions=4,
        name="toy",
        meta=meta,
    )


def _ids(sites):
    return [s.X[:, 0].astype(int).tolist() for s in sites]


def test_same_seed_same_split_different_seed_different():
    ds = _pooled()
    a = dirichlet_partition(ds, 10, 10.0, seed=3)
    b = dirichlet_partition(ds, 10, 10.0, seed=3)
    c = dirichlet_partition(ds, 10, 10.0, seed=4)
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)


@pytest.mark.parametrize("key", [None, "outcome", "action"])
@pytest.mark.parametrize("alpha", [0.05, 10.0])
def test_sizes_sum_to_n_never_empty_no_duplicates(key, alpha):
    ds = _pooled()
    sites = dirichlet_partition(ds, 10, alpha, seed=0, key=key)
    sizes = [s.n for s in sites]
    assert sum(sizes) == ds.n and min(sizes) >= max(2, int(0.1 * ds.n / 10))
    all_ids = sorted(i for ids in _ids(sites) for i in ids)
    assert all_ids == list(range(ds.n))
    assert [s.meta["site_index"] for s in sites] == list(range(10))


def test_small_alpha_skews_labels_more_than_large_alpha():
    ds = _pooled(n=2000)
    key = trajectory_key(ds)

    def skew(alpha):
        # label skew shows as a spread of the sites' outcome rates
        sites = dirichlet_partition(ds, 10, alpha, seed=0)
        return np.std([float((s.Y * s.M).sum() / s.M.sum()) for s in sites])

    assert len(np.unique(key)) >= 3
    assert skew(0.1) > 2 * skew(100.0)


def test_too_many_sites_is_a_clear_error():
    with pytest.raises(DataError, match="cannot fill 10 sites"):
        dirichlet_partition(_pooled(n=15), 10, 10.0, seed=0)


def test_bad_key_is_rejected():
    with pytest.raises(DataError, match="partition key"):
        dirichlet_partition(_pooled(), 3, 10.0, seed=0, key=np.zeros(7))


def test_train_test_split_deterministic_and_complete():
    ds = _pooled(n=100)
    tr, te = train_test_split(ds, 0.2, seed=1)
    tr2, te2 = train_test_split(ds, 0.2, seed=1)
    _, te3 = train_test_split(ds, 0.2, seed=2)
    assert _ids([te]) == _ids([te2]) and _ids([te]) != _ids([te3])
    assert te.n == 20 and tr.n == 80
    assert sorted(_ids([tr])[0] + _ids([te])[0]) == list(range(100))


def test_split_keeps_an_entity_on_one_side():
    entity = np.repeat(np.arange(25), 4)  # 25 entities cut into 4 chunks each
    ds = _pooled(n=100, entity=entity)
    tr, te = train_test_split(ds, 0.3, seed=0)
    assert set(tr.meta["entity"].tolist()).isdisjoint(te.meta["entity"].tolist())
    assert tr.n + te.n == 100 and te.n > 0 and tr.n > 0
    # per-row meta is sliced with the rows
    np.testing.assert_array_equal(te.meta["entity"], entity[te.X[:, 0].astype(int)])


def test_split_of_two_and_bad_fraction():
    tr, te = train_test_split(_pooled(n=2), 0.5, seed=0)
    assert (tr.n, te.n) == (1, 1)
    with pytest.raises(DataError, match="test_fraction"):
        train_test_split(_pooled(n=10), 1.0, seed=0)


def test_outcome_key_with_a_rare_outcome_still_has_two_classes():
    ds = _pooled(n=200)
    Y = np.zeros_like(ds.Y)
    Y[:15, 0] = 1  # 7.5% of trajectories ever have Y = 1: every quintile edge is 0
    from dataclasses import replace

    key = trajectory_key(replace(ds, Y=Y))
    assert sorted(np.unique(key).tolist()) == [0, 1]
    np.testing.assert_array_equal(key, (Y.sum(axis=1) > 0).astype(int))


def _entity_sites(sites):
    """{entity: set of site indices holding one of its trajectories}."""
    out: dict[int, set[int]] = {}
    for i, s in enumerate(sites):
        for e in s.meta["entity"].tolist():
            out.setdefault(int(e), set()).add(i)
    return out


@pytest.mark.parametrize("key", [None, "action"])
def test_chunks_of_one_entity_share_a_site_and_never_cross_train_test(key):
    # 100 entities whose long histories were cut into 4 chunks each (overflow="chunk"), rows of an entity spread out
    entity = np.tile(np.arange(100), 4)
    ds = _pooled(n=400, entity=entity)
    sites = dirichlet_partition(ds, 10, 10.0, seed=0, key=key)
    where = _entity_sites(sites)
    assert sorted(where) == list(range(100))
    assert all(len(s) == 1 for s in where.values()), {e: s for e, s in where.items() if len(s) > 1}
    assert sum(s.n for s in sites) == 400 and min(s.n for s in sites) >= 2 * 4
    train_e, test_e = set(), set()
    for i, site in enumerate(sites):
        tr, te = train_test_split(site, 0.2, seed=i)
        assert tr.n > 0 and te.n > 0
        train_e |= set(tr.meta["entity"].tolist())
        test_e |= set(te.meta["entity"].tolist())
    assert test_e and train_e.isdisjoint(test_e)


def test_entity_partition_counts_entities_for_min_size():
    entity = np.repeat(np.arange(15), 10)  # 150 trajectories, but only 15 entities: 10 sites of >= 2 cannot exist
    with pytest.raises(DataError, match="15 entities cannot fill 10 sites"):
        dirichlet_partition(_pooled(n=150, entity=entity), 10, 10.0, seed=0)

"""TSTR / TRTR with the fixed step predictor (fcd_secure.evaluation.tstr) on small generated SiteDatasets."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.data.schema import SiteDataset
from fcd_secure.evaluation.tstr import (
    StepPredictor,
    action_bucket,
    step_features,
    synthesize,
    trtr,
    tstr,
    utility_report,
)


def _make(seed: int, n: int = 300, L: int = 10, sign: float = 1.0, n_actions: int = 2, continuous=False, soft=False):
    """Y_t ~ Bernoulli(σ(sign·(1.5 x0 + 1.0·1[T_t=1] + 1.0 Y_{t−1} − 0.8))) with variable lengths."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)).astype(np.float32)
    A = rng.normal(size=(n, L, 1)).astype(np.float32)
    T = rng.integers(0, n_actions, size=(n, L)).astype(np.int64)
    lengths = rng.integers(L // 2, L + 1, size=n)
    M = (np.arange(L)[None, :] < lengths[:, None]).astype(np.float32)
    Y = np.zeros((n, L), np.float32)
    prev = np.zeros(n)
    for t in range(L):
        z = sign * (1.5 * X[:, 0] + 1.0 * (T[:, t] == 1) + 1.0 * prev - 0.8)
        p = 1 / (1 + np.exp(-z))
        if continuous:
            y = z + rng.normal(scale=0.5, size=n)
        elif soft:
            y = p
        else:
            y = (rng.random(n) < p).astype(float)
        Y[:, t] = y
        prev = (y > 0.5) if soft else y
    Y *= M
    T = T * (M > 0)
    return SiteDataset(X=X, A=A * M[..., None], T=T, Y=Y, M=M, n_actions=n_actions, name=f"gen-{seed}")


def test_trtr_learns_and_tstr_tracks_the_generator():
    real_train, real_test = _make(1), _make(2)
    ceiling = trtr(real_train, real_test)
    assert ceiling["auc"] > 0.75 and ceiling["rmse"] < 0.47
    assert ceiling["n_test"] == int(real_test.M.sum())
    good = tstr(_make(3), real_test)  # a generator that matches the real mechanism
    assert abs(good["auc"] - ceiling["auc"]) < 0.03
    bad = tstr(_make(4, sign=-1.0), real_test)  # a generator with the mechanism reversed
    assert bad["auc"] < 0.3 and bad["rmse"] > ceiling["rmse"] + 0.1
    rep = utility_report(_make(3), real_train, real_test)
    assert rep["trtr"] == ceiling and rep["tstr"] == good


def test_soft_label_generator_is_accepted():
    real_test = _make(2)
    res = tstr(_make(5, soft=True), real_test)  # a generator emitting probabilities instead of samples
    assert res["auc"] > 0.75


def test_deterministic():
    a = tstr(_make(6), _make(7))
    b = tstr(_make(6), _make(7))
    assert a == b


def test_continuous_outcome_uses_ridge_and_reports_rmse_only():
    train, test = _make(8, continuous=True), _make(9, continuous=True)
    res = trtr(train, test)
    assert np.isnan(res["auc"])
    # the mechanism is linear in the features, so only the noise (s.d. 0.5) should remain
    assert 0.4 < res["rmse"] < 0.6


def test_many_actions_are_hashed_into_fixed_buckets():
    ds = _make(10, n=50, n_actions=500)
    g = StepPredictor(binary=True).fit(ds)
    assert g.coef_.size == 1 + (2 + 1 + 4) + 32  # intercept, [X, A, history], 32 action buckets
    p, y = g.predict(ds)
    assert p.shape == y.shape and ((p > 0) & (p < 1)).all()


def test_action_hash_spreads_ids_that_are_32_apart():
    # ids 0, 32, 64, ..., 480: the low bits of id * 2654435761 are a permutation of id mod 32, so a low-bit hash
    # sends all 16 to one bucket; the top bits must spread them
    n = 16
    ds = SiteDataset(
        X=np.zeros((n, 1), np.float32), A=np.zeros((n, 1, 1), np.float32), T=(np.arange(n) * 32)[:, None],
        Y=(np.arange(n) % 2).astype(np.float32)[:, None], M=np.ones((n, 1), np.float32), n_actions=500, name="ids",
    )
    _, F_oh, _ = step_features(ds)
    assert F_oh.shape == (16, 32) and (F_oh.sum(axis=1) == 1).all()
    assert np.unique(F_oh.argmax(axis=1)).size >= 8
    # every bucket is used by the 500 ids, none by more than a few more than its fair share (500/32 ~ 16)
    counts = np.bincount(action_bucket(np.arange(500), 500), minlength=32)
    assert counts.size == 32 and counts.min() >= 12 and counts.max() <= 20
    # up to 32 actions the id is its own bucket
    np.testing.assert_array_equal(action_bucket(np.arange(32), 32), np.arange(32))


def test_layout_mismatch_is_named():
    with pytest.raises(ValueError, match="n_actions"):
        tstr(_make(11, n=30, n_actions=3), _make(12, n=30))


def test_synthesize_replaces_only_the_outcomes_under_the_logged_actions(one_torch_thread):
    from fcd_secure.model.baselines import SIMULATORS
    from tests.test_model_core import TINY

    real = _make(3, n=40, L=8)
    sim = SIMULATORS["crn"].from_dims(TINY, real.dx, real.da, real.n_actions, 1)
    sim.train_site(real, 0, 1, epochs=2, seed=0)
    syn = synthesize(sim.simulate, real, seed=7)
    for f in ("X", "A", "T", "M"):
        np.testing.assert_array_equal(getattr(syn, f), getattr(real, f))
    assert syn.P is None and syn.name.endswith("-synthetic")
    assert set(np.unique(syn.Y[syn.M > 0])) <= {0.0, 1.0} and (syn.Y[syn.M == 0] == 0).all()
    assert not np.array_equal(syn.Y, real.Y)
    np.testing.assert_array_equal(synthesize(sim.simulate, real, seed=7).Y, syn.Y)  # seeded
    assert not np.array_equal(synthesize(sim.simulate, real, seed=8).Y, syn.Y)
    # the actions the simulator was given are the logged ones
    res = sim.simulate(real, real.T.astype(np.int64), 1, 7, start_t=0)
    np.testing.assert_array_equal(res.actions[:, 0, :], real.T)
    assert np.isfinite(tstr(syn, real)["rmse"])

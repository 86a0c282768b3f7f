"""The truth-free one-step DR discrepancy D₁ (``evaluation/discrepancy.py``) on a known-answer world with true
propensities: hidden confounding drives both the logged action and the outcome, so the model that fits the logs
(the naive contrast) is wrong, and D₁ measures each model's one-step effect error without the truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fcd_secure.evaluation.discrepancy import DiscrepancySums, one_step_dr_terms

A_OFF, A_MID, A_ON = 0, 1, 2
ALPHA, TAU, BETA = -0.2, -0.4, 1.5  # the true one-step effect of a_on is negative; readiness U pushes Y up


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _world(seed: int, n: int = 4000, L: int = 6):
    """Logged steps: U hidden, the logging policy gives a_on more often to high-U entities (true P logged)."""
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n, L))
    logits = np.stack([np.zeros_like(U), 0.3 * np.ones_like(U), 1.2 * U], -1)  # a_off, a_mid, a_on
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    u = rng.random((n, L))
    T = (u[..., None] > np.cumsum(probs, -1)).sum(-1)
    P = np.take_along_axis(probs, T[..., None], -1)[..., 0]
    eff = np.where(T == A_ON, TAU, np.where(T == A_MID, 0.1, 0.0))
    Y = (rng.random((n, L)) < _sigmoid(ALPHA + eff + BETA * U)).astype(np.float64)
    M = np.ones((n, L))
    M[: n // 10, L - 2:] = 0.0  # some shorter trajectories
    z = np.random.default_rng(99).standard_normal(400_000)
    truth = {a: float(_sigmoid(ALPHA + e + BETA * z).mean()) for a, e in ((A_OFF, 0.0), (A_ON, TAU))}
    return Y, M, T, P, truth


def _sums(Y, M, T, P, mu_on, mu_off):
    full = lambda v: np.full(Y.shape, v)  # noqa: E731 - the model's prediction at every step
    return DiscrepancySums.from_terms(one_step_dr_terms(Y, M, T, P, full(mu_on), full(mu_off), A_ON, A_OFF))


def test_the_true_outcome_model_has_no_discrepancy_and_a_shifted_one_has_its_shift():
    Y, M, T, P, truth = _world(0)
    right = _sums(Y, M, T, P, truth[A_ON], truth[A_OFF])
    assert right.d1() < 3 * right.se()
    for b in (0.05, 0.1, 0.2):
        off = _sums(Y, M, T, P, truth[A_ON] + b, truth[A_OFF])  # the model's contrast is b too high
        assert abs(off.mean() - (-b)) < 3 * off.se(), (b, off.mean(), off.se())


def test_the_model_that_fits_the_confounded_logs_is_caught():
    Y, M, T, P, truth = _world(1)
    valid = M > 0
    naive = {a: float(Y[valid & (T == a)].mean()) for a in (A_ON, A_OFF)}  # E[Y | T = a]: the best fit
    true_contrast = truth[A_ON] - truth[A_OFF]
    naive_error = (naive[A_ON] - naive[A_OFF]) - true_contrast
    assert naive_error > 0.2  # readiness makes a_on look good: the naive contrast has the wrong sign
    s = _sums(Y, M, T, P, naive[A_ON], naive[A_OFF])
    assert abs(s.mean() + naive_error) < 3 * s.se()
    assert s.d1() > 10 * s.se()  # flagged far beyond noise


def test_d1_ranks_candidates_by_their_true_one_step_error():
    Y, M, T, P, truth = _world(2)
    shifts = [0.0, 0.03, -0.08, 0.15, -0.25]
    d1 = [_sums(Y, M, T, P, truth[A_ON] + b, truth[A_OFF]).d1() for b in shifts]
    assert np.argsort(d1).tolist() == np.argsort(np.abs(shifts)).tolist()


def test_sums_merge_exactly_over_sites_and_a_site_without_propensities_sends_nothing():
    Y, M, T, P, truth = _world(3, n=900)
    mu_on, mu_off = np.full(Y.shape, 0.5), np.full(Y.shape, 0.4)
    pooled = DiscrepancySums.from_terms(one_step_dr_terms(Y, M, T, P, mu_on, mu_off, A_ON, A_OFF))
    cuts = [0, 100, 101, 500, 900]
    parts = [DiscrepancySums.from_terms(one_step_dr_terms(Y[a:b], M[a:b], T[a:b], P[a:b], mu_on[a:b], mu_off[a:b],
                                                          A_ON, A_OFF)) for a, b in zip(cuts, cuts[1:])]
    merged = DiscrepancySums.merge_all([*parts, DiscrepancySums.empty()])
    assert merged.n == pooled.n and merged.clipped == pooled.clipped
    assert merged.mean() == pytest.approx(pooled.mean(), abs=1e-12)
    assert merged.se() == pytest.approx(pooled.se(), abs=1e-12)
    assert DiscrepancySums.empty().n == 0 and math.isnan(DiscrepancySums.empty().d1())


def test_clipping_counts_and_bad_inputs_are_refused():
    s = DiscrepancySums.from_terms(np.array([1.0, -200.0, 3.0]), clip=50.0)
    assert s.clipped == 1 and s.s == pytest.approx(1.0 - 50.0 + 3.0)
    Y = np.zeros((2, 3))
    with pytest.raises(ValueError, match="propensity"):
        one_step_dr_terms(Y, np.ones((2, 3)), np.zeros((2, 3), int), np.zeros((2, 3)), Y, Y, 1, 0)
    with pytest.raises(ValueError, match="differ"):
        one_step_dr_terms(Y, np.ones((2, 3)), np.zeros((2, 3), int), np.ones((2, 3)), Y, Y, 0, 0)

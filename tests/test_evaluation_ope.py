"""Known-answer tests of the OPE estimators (fcd_secure.evaluation.ope)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fcd_secure.data.schema import SiteDataset
from fcd_secure.evaluation.ope import (
    DM,
    IPW,
    PDIS,
    SNIPW,
    PerDecisionDR,
    SupportWarning,
    combine,
    estimate_on_site,
    target_probs,
)

# --------------------------------------------------------------------------------------------------------------
# Two-action bandit (horizon 1) whose logged action frequencies equal μ exactly, so the estimates are exact.
# μ(a=1) = 0.3, r(1) = 1, r(0) = 0.2; target π(a=1) = 0.8 → V(π) = 0.8·1 + 0.2·0.2 = 0.84.
# --------------------------------------------------------------------------------------------------------------


def _bandit(pi_on: float = 0.8):
    a = np.array([1] * 3 + [0] * 7)
    r = np.where(a == 1, 1.0, 0.2)[:, None]
    mu = np.where(a == 1, 0.3, 0.7)[:, None]
    pi = np.where(a == 1, pi_on, 1.0 - pi_on)[:, None]
    mask = np.ones_like(r)
    return a, r, mask, mu, pi


def test_bandit_ipw_snipw_known_value():
    _, r, m, mu, pi = _bandit()
    for est in (IPW(), SNIPW(), PDIS()):
        res = est.estimate(r, m, mu=mu, pi=pi)
        assert res.value == pytest.approx(0.84, abs=1e-12), est.name
        assert res.warning is None and res.n == 10 and res.n_consistent == 10
    # the deterministic "Always" policy: value r(1) = 1 from the 3 matching rows
    _, r, m, mu, pi = _bandit(pi_on=1.0)
    assert IPW().estimate(r, m, mu=mu, pi=pi).value == pytest.approx(1.0, abs=1e-12)
    res = SNIPW().estimate(r, m, mu=mu, pi=pi)
    assert res.value == pytest.approx(1.0, abs=1e-12)
    assert res.n_consistent == 3 and res.ess == pytest.approx(3.0)


def test_bandit_dr_correct_and_wrong_model():
    a, r, m, mu, pi = _bandit()
    q_true = np.where(a == 1, 1.0, 0.2)[:, None]
    v_true = np.full_like(r, 0.84)
    assert PerDecisionDR().estimate(r, m, mu, pi, q_true, v_true).value == pytest.approx(0.84, abs=1e-12)
    # a wrong but internally consistent model: Q̂ ≡ 0.5, V̂ = Σ_a π Q̂ = 0.5. DM is biased, DR corrects it.
    q_bad = np.full_like(r, 0.5)
    v_bad = np.full_like(r, 0.5)
    assert DM().estimate(r, m, v_hat=v_bad).value == pytest.approx(0.5)
    assert PerDecisionDR().estimate(r, m, mu, pi, q_bad, v_bad).value == pytest.approx(0.84, abs=1e-12)


def test_bandit_ipw_unbiased_on_samples():
    rng = np.random.default_rng(0)
    n = 200_000
    a = (rng.random(n) < 0.3).astype(int)
    r = (rng.random(n) < np.where(a == 1, 0.6, 0.25)).astype(float)[:, None]  # Bernoulli rewards
    mu = np.where(a == 1, 0.3, 0.7)[:, None]
    pi = np.where(a == 1, 0.8, 0.2)[:, None]
    truth = 0.8 * 0.6 + 0.2 * 0.25
    res = IPW().estimate(r, np.ones_like(r), mu=mu, pi=pi)
    w = (pi / mu)[:, 0]
    se = np.std(w * r[:, 0]) / np.sqrt(n)
    assert abs(res.value - truth) < 4 * se


# --------------------------------------------------------------------------------------------------------------
# Two-step sequential toy with deterministic transitions s1 = s0 + a0 (s0 ∈ {0, 1}, s1 ∈ {0, 1, 2}).
# --------------------------------------------------------------------------------------------------------------

MU0 = np.array([0.3, 0.6])  # behaviour P(a=1 | s) at step 0
MU1 = np.array([0.5, 0.2, 0.7])  # behaviour P(a=1 | s1) at step 1
PI0 = np.array([0.9, 0.4])  # target
PI1 = np.array([0.25, 0.8, 0.5])
R0 = np.array([[0.1, 0.7], [0.4, 0.3]])  # E[r0 | s0, a]
R1 = np.array([[0.2, 0.9], [0.5, 0.1], [0.6, 0.8]])  # E[r1 | s1, a]


def _q_tables(gamma: float, offset: float = 0.0):
    """Q^π at both steps (+ an arbitrary model error) and the consistent V̂ = Σ_a π Q̂."""
    Q1 = R1 + offset * np.array([[1.0, -2.0], [0.5, 1.5], [-1.0, 0.3]])
    V1_true = (1 - PI1) * R1[:, 0] + PI1 * R1[:, 1]
    Q0_true = R0 + gamma * np.stack([V1_true[[0, 1]], V1_true[[1, 2]]], axis=1)
    Q0 = Q0_true + offset * np.array([[-0.7, 0.4], [1.2, -0.9]])
    V1 = (1 - PI1) * Q1[:, 0] + PI1 * Q1[:, 1]
    V0 = (1 - PI0) * Q0[:, 0] + PI0 * Q0[:, 1]
    V0_true = (1 - PI0) * Q0_true[:, 0] + PI0 * Q0_true[:, 1]
    return Q0, Q1, V0, V1, V0_true


def _rollouts(n: int, rng: np.random.Generator, gamma: float, offset: float, s0=None, stochastic=False):
    s0 = rng.integers(0, 2, n) if s0 is None else s0
    a0 = (rng.random(n) < MU0[s0]).astype(int)
    s1 = s0 + a0
    a1 = (rng.random(n) < MU1[s1]).astype(int)
    e0, e1 = R0[s0, a0], R1[s1, a1]
    if stochastic:
        e0 = (rng.random(n) < e0).astype(float)
        e1 = (rng.random(n) < e1).astype(float)
    Q0, Q1, V0, V1, _ = _q_tables(gamma, offset)
    # L = 3 with a padded third step full of garbage that must be ignored
    r = np.stack([e0, e1, np.full(n, 99.0)], axis=1)
    m = np.tile([1.0, 1.0, 0.0], (n, 1))
    mu = np.stack([np.where(a0, MU0[s0], 1 - MU0[s0]), np.where(a1, MU1[s1], 1 - MU1[s1]), np.zeros(n)], axis=1)
    pi = np.stack([np.where(a0, PI0[s0], 1 - PI0[s0]), np.where(a1, PI1[s1], 1 - PI1[s1]), np.full(n, np.nan)], axis=1)
    q = np.stack([Q0[s0, a0], Q1[s1, a1], np.full(n, np.nan)], axis=1)
    v = np.stack([V0[s0], V1[s1], np.full(n, np.nan)], axis=1)
    return dict(rewards=r, mask=m, mu=mu, pi=pi, q_hat=q, v_hat=v), s0


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("normalise", ["none", "per_step", "horizon"])
def test_sequential_dr_with_true_q_is_exact(gamma, normalise):
    rng = np.random.default_rng(1)
    n = 40
    s0 = np.repeat([0, 1], n // 2)  # balanced start states: the truth is the plain average of V^π(s0)
    data, _ = _rollouts(n, rng, gamma, offset=0.0, s0=s0)
    *_, V0_true = _q_tables(gamma)
    c = {"none": 1.0, "per_step": 1 / (1 + gamma), "horizon": 1 / (1 + gamma + gamma**2)}[normalise]
    truth = c * V0_true.mean()
    res = PerDecisionDR(discount=gamma, normalise=normalise).estimate(**data)
    assert res.value == pytest.approx(truth, abs=1e-12)
    assert DM(discount=gamma, normalise=normalise).estimate(**data).value == pytest.approx(truth, abs=1e-12)


def test_sequential_dr_wrong_q_unbiased_but_dm_biased():
    """With correct propensities, DR with a wrong (but π-consistent) model is unbiased; DM inherits the model error.

    Tolerance: 4 standard errors, from 40 independent batches of 5,000 trajectories (Bernoulli rewards)."""
    gamma = 0.9
    rng = np.random.default_rng(2)
    *_, V0_true = _q_tables(gamma)
    truth = V0_true.mean() / (1 + gamma)  # s0 ~ Bernoulli(1/2), per-step normalised
    dr, dm, ipw, pdis = [], [], [], []
    for _ in range(40):
        data, _ = _rollouts(5_000, rng, gamma, offset=0.5, stochastic=True)
        dr.append(PerDecisionDR(discount=gamma).estimate(**data).value)
        dm.append(DM(discount=gamma).estimate(**data).value)
        ipw.append(IPW(discount=gamma).estimate(**data).value)
        pdis.append(PDIS(discount=gamma).estimate(**data).value)
    for name, vals in (("dr", dr), ("ipw", ipw), ("pdis", pdis)):
        vals = np.asarray(vals)
        se = vals.std(ddof=1) / np.sqrt(vals.size)
        assert abs(vals.mean() - truth) < 4 * se, name
    dm = np.asarray(dm)
    se_dr = np.std(dr, ddof=1) / np.sqrt(len(dr))
    assert abs(dm.mean() - truth) > 20 * se_dr  # the model error is real, so the check above can fail
    # DR's variance reduction over trajectory-wise IPW with a half-decent model
    assert np.std(dr) < np.std(ipw)


# --------------------------------------------------------------------------------------------------------------
# Zero support, thresholds, validation
# --------------------------------------------------------------------------------------------------------------


def _always_without_support(n=30, L=5, seed=3):
    rng = np.random.default_rng(seed)
    a = (rng.random((n, L)) < 0.4).astype(int)
    a[:, rng.integers(0, L)] = 0  # every trajectory holds at least one "off" step
    r = rng.random((n, L))
    mu = np.where(a == 1, 0.4, 0.6)
    pi = (a == 1).astype(float)  # deterministic Always: π(logged a) = 1[a = on]
    return dict(rewards=r, mask=np.ones((n, L)), mu=mu, pi=pi, q_hat=r * 0 + 0.5, v_hat=r * 0 + 0.5)


@pytest.mark.parametrize("cls", [IPW, SNIPW, PDIS, PerDecisionDR])
def test_zero_support_gives_nan_and_warning(cls):
    data = _always_without_support()
    with pytest.warns(SupportWarning, match="no support"):
        res = cls().estimate(**data)
    assert np.isnan(res.value)
    assert res.ess == 0.0 and res.n_consistent == 0
    assert res.warning is not None and "support" in res.warning and not res.supported


def test_dm_needs_no_support():
    data = _always_without_support()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = DM().estimate(**data)
    assert res.value == pytest.approx(0.5 / 5)  # V̂(h0) = 0.5 over 5 steps, per-step normalised
    assert res.warning is None


def test_min_ess_threshold():
    data = _always_without_support()
    data["pi"][0] = 1.0  # exactly one trajectory becomes consistent
    data["mu"][0] = 0.5
    res = IPW().estimate(**data)
    assert res.n_consistent == 1 and res.ess == pytest.approx(1.0) and np.isfinite(res.value)
    with pytest.warns(SupportWarning, match="effective sample size"):
        res = IPW(min_ess=5).estimate(**data)
    assert np.isnan(res.value) and res.ess == pytest.approx(1.0)


def test_horizon_truncation_restores_support():
    data = _always_without_support(n=20, L=4)
    data["pi"][:, 0] = 1.0  # every logged first action counts as consistent at t = 0
    res = SNIPW(normalise="none").estimate(**{k: data[k] for k in ("rewards", "mask", "mu", "pi")}, horizon=1)
    assert res.n_consistent == 20
    w = data["pi"][:, 0] / data["mu"][:, 0]
    assert res.value == pytest.approx(np.sum(w * data["rewards"][:, 0]) / w.sum())


def test_bad_inputs_name_the_field_row_and_step():
    data, _ = _rollouts(6, np.random.default_rng(4), 1.0, 0.0)
    bad = {k: v.copy() for k, v in data.items()}
    bad["mu"][2, 1] = 0.0
    with pytest.raises(ValueError, match=r"'mu'.*row 2, step 1"):
        IPW().estimate(**bad)
    bad = {k: v.copy() for k, v in data.items()}
    bad["pi"][4, 0] = 1.5
    with pytest.raises(ValueError, match=r"'pi'.*row 4, step 0"):
        IPW().estimate(**bad)
    with pytest.raises(ValueError, match="needs pi"):
        IPW().estimate(data["rewards"], data["mask"], mu=data["mu"])
    with pytest.raises(ValueError, match="shape"):
        IPW().estimate(data["rewards"], data["mask"], mu=data["mu"][:, :2], pi=data["pi"])
    with pytest.raises(ValueError, match="discount"):
        IPW(discount=0.0).estimate(**data)
    gap = data["mask"].copy()
    gap[1] = [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"'mask'.*row 1"):
        IPW().estimate(data["rewards"], gap, mu=data["mu"], pi=data["pi"])


# --------------------------------------------------------------------------------------------------------------
# Pooling across sites and the SiteDataset entry point
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [IPW, SNIPW, PDIS, DM, PerDecisionDR])
def test_combine_sites_equals_pooled_estimate(cls):
    data, _ = _rollouts(300, np.random.default_rng(5), 0.9, 0.5, stochastic=True)
    est = cls(discount=0.9)
    pooled = est.estimate(**data)
    cuts = [0, 40, 170, 300]  # unequal site sizes
    parts = [est.estimate(**{k: v[a:b] for k, v in data.items()}) for a, b in zip(cuts[:-1], cuts[1:])]
    merged = combine(parts)
    assert merged.value == pytest.approx(pooled.value, rel=1e-12)
    assert merged.ess == pytest.approx(pooled.ess, rel=1e-12)
    assert merged.n == pooled.n and merged.n_consistent == pooled.n_consistent
    if cls is not SNIPW:  # n-weighted mean of the site values
        assert merged.value == pytest.approx(sum(p.n * p.value for p in parts) / 300, rel=1e-12)


def test_combine_keeps_a_site_without_support_finite_and_pool_without_support_nan():
    rich = {k: v[:, :2] for k, v in _rollouts(50, np.random.default_rng(6), 1.0, 0.0)[0].items()}
    rich["pi"] = np.ones_like(rich["pi"])  # every trajectory consistent
    poor = {k: v for k, v in _always_without_support(n=10, L=2).items()}
    keys = ("rewards", "mask", "mu", "pi")
    with pytest.warns(SupportWarning):
        r_poor = IPW().estimate(**{k: poor[k] for k in keys})
    r_rich = IPW().estimate(**{k: rich[k] for k in keys})
    merged = combine([r_rich, r_poor])
    assert np.isfinite(merged.value) and merged.n == 60 and merged.n_consistent == 50
    with pytest.warns(SupportWarning):
        assert np.isnan(combine([r_poor, r_poor]).value)
    with pytest.raises(ValueError, match="different estimators"):
        combine([r_rich, DM().estimate(rich["rewards"], rich["mask"], v_hat=rich["rewards"])])


def test_estimate_on_site_uses_logged_propensities():
    data, _ = _rollouts(20, np.random.default_rng(7), 1.0, 0.0)
    n, L = data["rewards"].shape
    ds = SiteDataset(
        X=np.zeros((n, 1), np.float32),
        A=np.zeros((n, L, 1), np.float32),
        T=np.zeros((n, L), np.int64),
        Y=np.where(data["mask"] > 0, data["rewards"], 0).astype(np.float32),
        M=data["mask"].astype(np.float32),
        P=np.where(data["mask"] > 0, data["mu"], 1).astype(np.float32),
        n_actions=2,
        name="site-7",
    )
    res = estimate_on_site(IPW(), ds, pi=data["pi"])
    direct = IPW().estimate(ds.Y, ds.M, mu=ds.P, pi=data["pi"])
    assert res.value == direct.value
    with pytest.raises(ValueError, match="site-7.*propensities"):
        estimate_on_site(IPW(), ds.without_propensities(), pi=data["pi"])


def test_target_probs_of_a_real_policy_and_always_support():
    from fcd_secure.data.policy import default_policies

    T = np.array([[1, 1, 1], [1, 0, 1], [2, 1, 0]], dtype=np.int64)
    M = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=np.float32)
    ds = SiteDataset(
        X=np.zeros((3, 1), np.float32), A=np.zeros((3, 3, 1), np.float32), T=T,
        Y=np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]], np.float32), M=M,
        P=np.full((3, 3), 0.5, np.float32), n_actions=3, name="toy",
    )
    by_name = {p.name: p for p in default_policies()}
    always = target_probs(by_name["always"], ds, anchors=(0, 1))
    np.testing.assert_array_equal(always, [[1, 1, 1], [1, 0, 1], [0, 1, 0]])  # action 2 is outside the anchors
    res = estimate_on_site(IPW(normalise="none"), ds, pi=always)
    assert res.n_consistent == 1 and res.value == pytest.approx((2.0 * 8) / 3)  # only row 0 follows "always"

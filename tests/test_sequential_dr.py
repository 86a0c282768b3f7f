"""The sequential doubly robust value (``queries.sequential_dr``) is doubly robust, and its federated sums add up.

The world: one binary outcome a step, two actions, four steps; the logging policy treats more often after a bad
outcome (confounding by the last outcome), and the outcome's probability depends on the last outcome and the action.
Its own mechanism, rolled out from any logged history, is the exact simulator ("the oracle's Q̂"); a simulator whose
outcome probabilities are off by a constant is the wrong Q̂; the logged propensities are the right P, 0.9 at every
step the wrong P. The estimator's interval must cover the true value (the world's own rollout of 400 000 entities)
when either side is right (a 99.9 % interval: one draw of the logs per case), and miss it when both are wrong (so
the test can fail).
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.data.policy import bind_policy, load_policy_refs  # noqa: E402
from fcd_secure.data.schema import SiteDataset  # noqa: E402
from fcd_secure.evaluation.intervals import interval_from_sums, site_sums  # noqa: E402
from fcd_secure.model.simulator import FirstThen, check_window, plan_fn  # noqa: E402
from fcd_secure.queries.logged import target_probs  # noqa: E402
from fcd_secure.queries.sequential_dr import history_q, sequential_dr_per_entity  # noqa: E402

L = 4
ANCHORS = (0, 1)
#: P(y_t = 1 | y_{t−1}, a_t): rows the last outcome (index 2: none yet), columns the action
OUTCOME = np.array([[0.25, 0.55], [0.60, 0.80], [0.40, 0.65]])
#: P(a_t = 1 | y_{t−1}) of the logging policy
LOGGING = np.array([0.70, 0.25, 0.45])


def _last(y_hist: np.ndarray) -> np.ndarray:
    y = np.asarray(y_hist).reshape(len(y_hist), -1)
    return np.full(len(y), 2) if y.shape[1] == 0 else y[:, -1].astype(np.int64)


def logging_probs(t, y_hist, lengths, context=None) -> np.ndarray:
    """The logging policy's probabilities on any history, ``[B, 2]`` (what a stochastic policy shifts)."""
    p1 = LOGGING[_last(y_hist)]
    return np.stack([1.0 - p1, p1], axis=1)


class World:
    """The world's mechanism as a simulator (``shift`` moves every outcome probability: a wrong Q̂)."""

    def __init__(self, shift: float = 0.0) -> None:
        self.shift = shift

    def simulate(self, ds, plan, n_samples, seed, start_t=0, horizon=None, anchors=None):
        fn, _ = plan_fn(plan, anchors, ds)
        H = check_window(ds.L, start_t, horizon)
        rng = np.random.default_rng(seed)
        rows = np.repeat(np.arange(ds.n), n_samples)
        lengths = np.repeat(ds.lengths, n_samples)
        y_hist = np.repeat(ds.Y[:, :start_t], n_samples, axis=0)
        probs = np.zeros((ds.n, n_samples, H))
        for h in range(H):
            t = start_t + h
            ctx = np.repeat(ds.A[:, : t + 1], n_samples, axis=0)
            a = fn(h, t, y_hist, lengths, rows, ctx)
            p = np.clip(OUTCOME[_last(y_hist), a] + self.shift, 0.0, 1.0)
            probs[:, :, h] = p.reshape(ds.n, n_samples)
            y_hist = np.concatenate([y_hist, (rng.random(len(p)) < p).astype(np.float64)[:, None]], axis=1)
        return _Result(probs)

    def simulate_policy(self, ds, policy, anchors, n_samples, seed, **kw):
        return self.simulate(ds, policy, n_samples, seed, anchors=anchors, **kw)


class _Result:
    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs


def logged(n: int, seed: int) -> SiteDataset:
    """n entities logged under the logging policy, with their propensities."""
    rng = np.random.default_rng(seed)
    T = np.zeros((n, L), np.int64)
    Y = np.zeros((n, L))
    P = np.zeros((n, L))
    last = np.full(n, 2)
    for t in range(L):
        p1 = LOGGING[last]
        T[:, t] = rng.random(n) < p1
        P[:, t] = np.where(T[:, t] == 1, p1, 1.0 - p1)
        Y[:, t] = rng.random(n) < OUTCOME[last, T[:, t]]
        last = Y[:, t].astype(np.int64)
    return SiteDataset(X=np.zeros((n, 1), np.float32), A=np.zeros((n, L, 1), np.float32), T=T,
                       Y=Y.astype(np.float32), M=np.ones((n, L), np.float32), n_actions=2, P=P, name="world")


def policy(name: str, ds: SiteDataset):
    pol = bind_policy(load_policy_refs([name])[0], ds)
    return pol.with_behaviour(logging_probs, seed=5) if pol.stochastic else pol


def true_value(name: str) -> float:
    """The policy's value, the world rolled out from t = 0 for 400 000 entities (Monte-Carlo error about 0.0006)."""
    ds = logged(100_000, seed=99)
    sim = World().simulate_policy(ds, policy(name, ds), ANCHORS, 4, seed=7)
    return float(sim.probs.mean())


NAMES = ["always", "late_on", "incremental_on_x2"]


def sdr_interval(ds: SiteDataset, name: str, sim: World, P: np.ndarray, level: float = 0.999):
    """The interval of ``name``'s sequential DR value, its Q̂ rolled out in one batch with the other policies'
    (``model.simulator.ByRow``), as a site computes them."""
    pols = [policy(p, ds) for p in NAMES]
    pis = [target_probs(pol, replace(ds, P=P), *ANCHORS) for pol in pols]
    q_hat, v_hat = history_q(sim, ds, pols, pis, ANCHORS, L, n_samples=2, seed=11)[NAMES.index(name)]
    pi = pis[NAMES.index(name)]
    dr = sequential_dr_per_entity(ds.Y, ds.M, P, pi, q_hat, v_hat, L)
    return interval_from_sums(site_sums("sdr", dr), "sdr", level)


def wrong_p(ds: SiteDataset) -> np.ndarray:
    """0.9 at every step, as if the logging policy had almost always done what it did: wrong everywhere, and its
    weights' mean far from 1 (so a wrong Q̂'s error is not cancelled by chance)."""
    return np.full_like(ds.P, 0.9)


@pytest.fixture(scope="module")
def world():
    return logged(6000, seed=1)


@pytest.mark.parametrize("name", NAMES)
def test_doubly_robust_either_side_right_covers_both_wrong_misses(world, name):
    truth = true_value(name)
    right_q, wrong_q = World(), World(shift=0.2)
    assert not wrong_q.simulate_policy(world, policy(name, world), ANCHORS, 1, 0).probs.mean() == pytest.approx(
        truth, abs=0.05)  # the wrong Q̂ is wrong: its own value misses by far
    wrong_p_only = sdr_interval(world, name, right_q, wrong_p(world))
    wrong_q_only = sdr_interval(world, name, wrong_q, world.P)
    both_wrong = sdr_interval(world, name, wrong_q, wrong_p(world))
    assert wrong_p_only.covers(truth), (name, truth, wrong_p_only)
    assert wrong_q_only.covers(truth), (name, truth, wrong_q_only)
    if name == "incremental_on_x2":
        # its weights q/P stay within [1/2, 2] whatever P says, so a wrong P moves them little: both wrong is off by
        # less, but still farther from the truth than either one-sided case
        z = [abs(iv.estimate - truth) / iv.se for iv in (wrong_p_only, wrong_q_only, both_wrong)]
        assert z[2] > max(z[:2]) and z[2] > 2.5, (name, truth, z)
    else:
        assert not both_wrong.covers(truth), (name, truth, both_wrong)


def test_q_hat_is_conditioned_on_the_logged_history(world):
    """Q̂(h_t, a_t) of a stochastic policy is the rollout with the logged a_t at t and π after (``FirstThen``), so
    after a logged bad outcome with a logged a_t = 1 the exact world's one-step part is OUTCOME[0, 1]."""
    ds = world.subset(np.arange(400))
    pol = policy("incremental_on_x2", ds)
    pi = target_probs(pol, ds, *ANCHORS)
    (q_hat, v_hat), = history_q(World(), ds, [pol], [pi], ANCHORS, 1 + 1, n_samples=1, seed=3)
    rows = (ds.Y[:, 0] == 0) & (ds.T[:, 1] == 1)
    # with H = 2, the return-to-go at t = 1 is that one step's expected outcome
    np.testing.assert_allclose(q_hat[rows, 1], OUTCOME[0, 1])
    one = World().simulate(ds, FirstThen(ds.T[:, 1], pol), 1, 0, start_t=1, horizon=1, anchors=ANCHORS)
    np.testing.assert_allclose(one.probs[:, 0, 0], OUTCOME[ds.Y[:, 0].astype(int), ds.T[:, 1]])
    assert (v_hat[:, 0] > 0).all() and (v_hat[:, 2:] == 0).all()


def test_the_value_is_withheld_with_its_reason_where_few_entities_follow_the_policy(world):
    """The support rule (``queries.sequential_dr``): on 6000 entities "late_on" has an ESS in the hundreds over four
    steps and its value is shown; on 40 of them fewer than 20 effective entities follow it and the value is withheld,
    with the reason and the ESS, never printed as an answer."""
    from fcd_secure.queries.answers import EvaluationAnswer  # noqa: PLC0415
    from fcd_secure.queries.base import MergeContext, Totals  # noqa: PLC0415
    from fcd_secure.queries.sequential_dr import SequentialDR  # noqa: PLC0415
    from fcd_secure.queries.targeted import MIN_SUPPORT_ESS, final_weights  # noqa: PLC0415

    def merged(ds):
        pol = policy("late_on", ds)
        pi = target_probs(pol, ds, *ANCHORS)
        (q_hat, v_hat), = history_q(World(), ds, [pol], [pi], ANCHORS, L, n_samples=2, seed=11)
        dr = sequential_dr_per_entity(ds.Y, ds.M, ds.P, pi, q_hat, v_hat, L)
        wf = final_weights(ds, pi, L)
        sums = {**site_sums("whatif.sdr.late_on", dr), "whatif.sdr.late_on.sw": wf.sum(),
                "whatif.sdr.late_on.sww": (wf * wf).sum()}
        d: dict = {}
        SequentialDR().merge_policy(Totals(sums, 1), MergeContext(), "late_on", d)
        return d["sequential_dr"]

    big = merged(world)
    assert big["supported"] and big["ess"] >= MIN_SUPPORT_ESS and big["estimate"] is not None
    small = merged(world.subset(np.arange(40)))
    assert small["ess"] < MIN_SUPPORT_ESS and not small["supported"]
    assert small["estimate"] is None and small["withheld"]["estimate"] is not None
    assert "effective entities" in small["why"]
    rec = EvaluationAnswer.from_json({"policies": {"late_on": {"sequential_dr": small}}}).policies["late_on"]
    assert rec.sequential_dr.withheld and rec.sequential_dr.ess == small["ess"]


class Counting(World):
    """The exact world, counting the rows it simulates from each start step."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, int]] = []

    def simulate(self, ds, plan, n_samples, seed, start_t=0, horizon=None, anchors=None):
        self.rows.append((start_t, ds.n))
        return super().simulate(ds, plan, n_samples, seed, start_t=start_t, horizon=horizon, anchors=anchors)


def test_a_policy_no_entity_follows_through_the_horizon_runs_no_history_rollout(world):
    """The support first (``queries.sequential_dr``): on rows whose last logged action is 0, no entity follows
    "always" through the horizon (every weight product 0), so its Q̂ is the rollout from t = 0 and nothing is
    simulated for it, while "never" (followed) gets its history rollouts as before. A consortium where every site
    skips withholds the value and keeps no withheld estimate; one where another site carries the support shows it
    and says how many sites took the rollout from t = 0."""
    from fcd_secure.queries.base import MergeContext, Totals  # noqa: PLC0415
    from fcd_secure.queries.sequential_dr import SequentialDR, start_q, support_first_q  # noqa: PLC0415
    from fcd_secure.queries.targeted import final_weights  # noqa: PLC0415

    ds = world.subset(np.flatnonzero(world.T[:, L - 1] == 0)[:300])
    pols = [policy(p, ds) for p in ("always", "never")]
    pis = [target_probs(p, ds, *ANCHORS) for p in pols]
    assert final_weights(ds, pis[0], L).sum() == 0 and final_weights(ds, pis[1], L).sum() > 0
    v0 = [World().simulate_policy(ds, p, ANCHORS, 2, seed=11, horizon=L).probs.mean(1) for p in pols]
    sim = Counting()
    got = support_first_q(sim, ds, pols, pis, ANCHORS, L, 2, 11, v0=v0)
    assert got.from_start == [True, False]
    never_only = Counting()
    expected = history_q(never_only, ds, pols[1:], pis[1:], ANCHORS, L, 2, 11, v0=v0[1:])[0]
    assert sim.rows == never_only.rows and sim.rows  # only never's followers were simulated, from t = 1 on
    np.testing.assert_allclose(got.qv[1][0], expected[0])
    q0, v0_hat = start_q(v0[0], ds.M, L, ds.L)
    np.testing.assert_allclose(got.qv[0][1], v0_hat)
    np.testing.assert_allclose(v0_hat[:, 0], v0[0].sum(1))  # V̂(h_0) is the question's own rollout
    np.testing.assert_allclose(v0_hat[:, L - 1], v0[0][:, L - 1])
    dr = sequential_dr_per_entity(ds.Y, ds.M, ds.P, pis[0], *got.qv[0], L)

    def merged(sums: dict, sites: int) -> dict:
        d: dict = {}
        SequentialDR().merge_policy(Totals(sums, sites), MergeContext(), "always", d)
        return d["sequential_dr"]

    skipped = {**site_sums("whatif.sdr.always", dr), "whatif.sdr.always.sw": 0.0, "whatif.sdr.always.sww": 0.0,
               "whatif.sdr.always.q0": 1.0}
    alone = merged(skipped, 1)
    assert alone["supported"] is False and alone["estimate"] is None and alone["withheld"] is None
    assert alone["se"] is None and alone["q_from_start_sites"] == 1 and "not run" in alone["why"]
    # a second site whose 400 entities carry the support: weight products averaging 1 over both sites' 700, ESS 245
    other = {**site_sums("whatif.sdr.always", np.full(400, 0.6)), "whatif.sdr.always.sw": 700.0,
             "whatif.sdr.always.sww": 2000.0, "whatif.sdr.always.q0": 0.0}
    both = merged({k: skipped[k] + other[k] for k in skipped}, 2)
    assert both["supported"] and both["estimate"] is not None and both["q_from_start_sites"] == 1

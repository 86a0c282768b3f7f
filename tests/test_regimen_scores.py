"""The regimen-directed score check (``evaluation.regimen_scores``, ``queries.regimen_scores``): the covariance of the
tilt towards each regimen with the return-to-go, simulated on the natural course's rollout against logged.

On the small exact world of ``tests/test_sequential_dr.py`` (its own mechanism is the right simulator), a simulator
whose treatment effect is removed or doubled (the same outcome level, the action's contrast scaled) scores a larger
whole-trajectory gap than the right one, which the check passes; the returns-to-go and the baseline are what the
formulas say; the sites' sums add up to the pooled figures.
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.evaluation.natural_course import STEP_FIELDS  # noqa: E402
from fcd_secure.evaluation.regimen_scores import (  # noqa: E402
    WHOLE_FIELDS,
    centred_returns,
    regimen_score_summary,
    return_to_go,
    score_gap_sums,
)
from fcd_secure.model.simulator import check_window, plan_fn  # noqa: E402
from fcd_secure.queries.natural_course import LoggingPolicyPlan, regimens  # noqa: E402
from fcd_secure.queries.regimen_scores import logged_scores  # noqa: E402

from test_sequential_dr import ANCHORS, OUTCOME, _last, logged, logging_probs  # noqa: E402


class EffectWorld:
    """The world's mechanism with the action's effect scaled by ``scale`` around each row's mean over the actions
    (1: the world itself, 0: no effect, 2: doubled); its rollout keeps the actions drawn."""

    def __init__(self, scale: float = 1.0) -> None:
        base = OUTCOME.mean(1, keepdims=True)
        self.outcome = np.clip(base + scale * (OUTCOME - base), 0.0, 1.0)

    def simulate_policy(self, ds, plan, anchors, n_samples, seed, horizon=None):
        fn, _ = plan_fn(plan, anchors, ds)
        H = check_window(ds.L, 0, horizon)
        rng = np.random.default_rng([seed, 1])  # not the plan's stream: its actions and these outcomes independent
        rows = np.repeat(np.arange(ds.n), n_samples)
        lengths = np.repeat(ds.lengths, n_samples)
        y_hist = np.zeros((ds.n * n_samples, 0))
        probs = np.zeros((ds.n, n_samples, H))
        acts = np.zeros((ds.n, n_samples, H), np.int64)
        for t in range(H):
            a = fn(t, t, y_hist, lengths, rows, np.repeat(ds.A[:, : t + 1], n_samples, axis=0))
            p = self.outcome[_last(y_hist), a]
            probs[:, :, t], acts[:, :, t] = p.reshape(ds.n, n_samples), a.reshape(ds.n, n_samples)
            y_hist = np.concatenate([y_hist, (rng.random(len(p)) < p).astype(np.float64)[:, None]], axis=1)
        return _Rollout(probs, acts)


class _Rollout:
    def __init__(self, probs: np.ndarray, actions: np.ndarray) -> None:
        self.probs, self.actions = probs, actions


def check(sim: EffectWorld, ds, seed: int = 4) -> dict[str, dict]:
    """Each regimen's merged check of ``sim`` on ``ds`` (centred returns), as the query computes it on one site."""
    targets = regimens(ds)
    plan = LoggingPolicyPlan(logging_probs, seed, targets)
    out = sim.simulate_policy(ds, plan, ANCHORS, 4, seed)
    scores = plan.scores(out.actions)
    g_sim, g_obs = centred_returns(return_to_go(out.probs, ds.M), return_to_go(ds.Y, ds.M))
    obs = logged_scores(ds, targets, ANCHORS, logging_probs)
    return {p.name: regimen_score_summary(*score_gap_sums((scores[..., j] * g_sim).mean(1), obs[..., j] * g_obs,
                                                          ds.M))
            for j, p in enumerate(targets)}


def test_a_removed_or_doubled_effect_scores_worse_than_the_right_one():
    ds = logged(3000, seed=2)
    right, none, double = (check(EffectWorld(s), ds) for s in (1.0, 0.0, 2.0))
    assert set(right) == {"never", "always", "early_on", "late_on"}
    worst = {name: max(abs(r["z"]) for r in got.values()) for name, got in
             (("right", right), ("none", none), ("double", double))}
    assert worst["right"] < 2.5, worst  # the world's own mechanism passes
    assert worst["none"] > 4 and worst["double"] > 4, worst
    for name in ("never", "always"):  # (early_on and late_on sum the steps' gaps with opposite signs)
        assert abs(right[name]["gap"]) < min(abs(none[name]["gap"]), abs(double[name]["gap"])) / 5, name


def test_returns_to_go_the_baseline_and_the_site_sums():
    M = np.array([[1, 1, 0], [1, 1, 1]], np.float64)
    Y = np.array([[1, 0, 1], [1, 1, 1]], np.float64)
    np.testing.assert_allclose(return_to_go(Y, M), [[1 / 2, 0, 0], [1, 2 / 3, 1 / 3]])
    g_sim = np.array([[[1.0, 0.0], [3.0, 2.0]]])  # one entity, two futures, two steps
    c_sim, c_obs = centred_returns(g_sim, np.array([[2.0, 2.0]]))
    np.testing.assert_allclose(c_sim, [[[-2.0, -2.0], [2.0, 2.0]]])  # each future less the other one
    np.testing.assert_allclose(c_obs, [[0.0, 1.0]])  # the logged return less the futures' mean
    rng = np.random.default_rng(0)
    sim, obs, mask = rng.normal(size=(50, 5)), rng.normal(size=(50, 5)), (rng.random((50, 5)) < 0.8).astype(float)
    steps, whole = score_gap_sums(sim, obs, mask)
    parts = [score_gap_sums(sim[r], obs[r], mask[r]) for r in (slice(0, 20), slice(20, None))]
    for k in STEP_FIELDS:
        np.testing.assert_allclose(parts[0][0][k] + parts[1][0][k], steps[k])
    for k in WHOLE_FIELDS:
        assert np.isclose(parts[0][1][k] + parts[1][1][k], whole[k])
    d = ((sim - obs) * mask).sum(1)[mask.any(1)]
    got = regimen_score_summary(steps, whole)
    assert np.isclose(got["gap"], d.mean()) and np.isclose(got["se"], d.std(ddof=1) / np.sqrt(d.size))
    assert score_gap_sums(sim[:3], obs[:3], mask[:3], min_n=5)[1] == dict.fromkeys(WHOLE_FIELDS, 0.0)


def test_the_query_reads_the_natural_course_rollout_and_sends_its_declared_names(tiny_dkt_site):
    import pytest

    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.natural_course import NaturalCourse
    from fcd_secure.queries.regimen_scores import RegimenScores
    from fcd_secure.queries.request import EvaluationRequest

    cfg, data, model = tiny_dkt_site
    rs = RegimenScores()
    qs = [NaturalCourse(keep_scores=True), rs]
    rows = np.arange(min(data.test.n, 24))  # the site's floor (20) and a little more: the check's cost is its rows
    full = site_metrics(model, data, cfg, EvaluationRequest(n_samples=1), rows=rows, queries=qs)
    mine = {k for k in full if k.startswith("rscore.")}
    assert mine and mine <= set(rs.names([], None)) | set(rs.lists())
    assert len(full["rscore.always.n"]) == data.test.L and full["rscore.always.whole.n"] == len(rows)
    ans = merge_site_metrics([full, full], None, queries=qs)["regimen_scores"]
    assert ans["sites"] == 2 and set(ans["regimens"]) == {"never", "always", "early_on", "late_on"}
    assert ans["regimens"]["always"]["entities"] == 2 * len(rows) and ans["max_abs_z"] is not None
    # the natural course made its rollout without the scores: the check cannot share it
    with pytest.raises(ValueError, match="keep_scores"):
        site_metrics(model, data, cfg, EvaluationRequest(n_samples=1), rows=rows, queries=[NaturalCourse(), rs])

"""The regimen-directed score check (``evaluation.regimen_scores``) as the consortium's sums.

Each site reads its natural-course rollout (``queries.natural_course.logging_rollout``: the same rows, futures and
draws, so the check adds no rollout; ask ``NaturalCourse(keep_scores=True)`` before it) and, for each deterministic regimen π the rollout kept scores for, sends per step
the sums of the paired gap between the simulator's and the logs' score·return-to-go (``rscore.<π>.<field>``, lists
over the steps) and the per-entity whole-trajectory sums (``rscore.<π>.whole.<n|s|ss>``). On the logged side the
score reads the logging policy's probability of π's action: from the logged propensity where the action is binary
(P(a_on | h) = P or 1 − P), else from the site's model of its logging policy, the one the rollout draws from. The
server merges them per regimen into the per-step gaps and the whole-trajectory gap with SE and z, and the check's
summary figures: the largest whole-trajectory |z| and the mean |gap| over the regimens, the largest per-step |z| and
the mean per-step |gap| over regimens and steps. The returns are centred by default (``centred_returns``: the
baseline of the entity's start, which keeps the means and cut the per-step gaps' noise about threefold on the tumour
world).

Not registered (``queries.registry``): measured as a round criterion on issue 42's candidates (docs/benchmarks.md,
"A round criterion that reads the regimens"), it did not rank them by their true whole-trajectory error, so it is
run by ``benchmarks/horizon.py --spearman`` only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from fcd_secure.data.policy import DEFAULT_POLICY_NAMES
from fcd_secure.evaluation.natural_course import STEP_FIELDS
from fcd_secure.evaluation.regimen_scores import (
    WHOLE_FIELDS,
    centred_returns,
    regimen_score_summary,
    return_to_go,
    score_gap_sums,
    tilt_score,
)
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.natural_course import NC_MAX_STEPS, behaviour_model, logging_rollout

__all__ = ["RegimenScores", "logged_scores"]


def logged_scores(ds, targets: tuple, anchors: tuple[int, int], behaviour) -> np.ndarray:
    """The tilt scores 1{A_t = π(H_t)} − P(π(H_t) | H_t) on the logged histories, ``[n, L, len(targets)]`` (module
    docstring: the logged P where the action is binary, else ``behaviour``, the site's model)."""
    a_off, a_on = anchors
    n, L = ds.T.shape
    K = int(ds.n_actions)
    T = ds.T.astype(np.int64)
    lengths = ds.lengths
    out = np.zeros((n, L, len(targets)))
    rows = np.arange(n)
    for t in range(L):
        if ds.P is not None and K == 2:
            p = np.clip(np.asarray(ds.P[:, t], np.float64), 0.0, 1.0)
            q = np.zeros((n, K))
            q[rows, T[:, t]] = p
            q[rows, 1 - T[:, t]] = 1.0 - p
        else:
            q = np.asarray(behaviour(t, ds.Y[:, :t], lengths, ds.A[:, : t + 1]), np.float64)
        for j, pol in enumerate(targets):
            kw = {"context": ds.A[:, : t + 1]} if getattr(pol, "needs_context", False) else {}
            act = np.asarray(pol.actions(t, ds.Y[:, :t], lengths, a_off, a_on, **kw), dtype=np.int64)
            took, pi = np.zeros((n, K)), np.zeros((n, K))
            took[rows, T[:, t]] = 1.0
            pi[rows, act] = 1.0
            out[:, t, j] = tilt_score(took, pi, q)
    return out


class RegimenScores(Query):
    """The regimens' tilt scores, simulated against logged (module docstring): ``rscore.*``."""

    name = "regimen_scores"
    quick = True

    def __init__(self, centred: bool = True) -> None:
        #: the returns less their baseline of the entity's start (``evaluation.regimen_scores.centred_returns``)
        self.centred = bool(centred)

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return ["rscore.sites"] + [f"rscore.{p}.whole.{f}" for p in DEFAULT_POLICY_NAMES for f in WHOLE_FIELDS]

    def lists(self) -> dict[str, int]:
        return {f"rscore.{p}.{f}": NC_MAX_STEPS for p in DEFAULT_POLICY_NAMES for f in STEP_FIELDS}

    def applies(self, ctx: SiteContext) -> bool:
        # where the natural course runs: it reads that rollout
        return ctx.request.keep_round is not None or not ctx.request.quick

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        roll = logging_rollout(ctx, keep_scores=True)
        if roll is None or not roll.targets:
            return {}
        from fcd_secure.queries.natural_course import regimens  # noqa: PLC0415

        ds, H = roll.rows, roll.horizon
        M = ds.M[:, :H]
        g_sim = return_to_go(np.asarray(roll.sim.probs, np.float64), M)  # [n, S, H]
        g_obs = return_to_go(ds.Y[:, :H], M)  # [n, H]
        if self.centred:
            g_sim, g_obs = centred_returns(g_sim, g_obs)
        obs = logged_scores(ds, regimens(ds), ctx.data.anchors, behaviour_model(ctx))[:, :H]
        out: SiteSums = {}
        for j, name in enumerate(roll.targets):
            sim_terms = (roll.scores[..., j] * g_sim).mean(1)
            steps, whole = score_gap_sums(sim_terms, obs[..., j] * g_obs, M, ctx.floor)
            out.update({f"rscore.{name}.{k}": v.tolist() for k, v in steps.items()})
            out.update({f"rscore.{name}.whole.{k}": v for k, v in whole.items()})
        out["rscore.sites"] = 1.0
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if "rscore.sites" not in totals:
            return
        per: dict[str, Any] = {}
        for name in DEFAULT_POLICY_NAMES:
            if f"rscore.{name}.n" not in totals:
                continue
            steps = {k: np.asarray(totals[f"rscore.{name}.{k}"], np.float64) for k in STEP_FIELDS}
            whole = {k: float(totals[f"rscore.{name}.whole.{k}"]) for k in WHOLE_FIELDS}
            per[name] = regimen_score_summary(steps, whole, ctx.level)
        zs = [abs(r["z"]) for r in per.values() if r["z"] is not None]
        gaps = [abs(r["gap"]) for r in per.values() if r["gap"] is not None]
        step_z = [abs(r["max_abs_z"]) for r in per.values() if r["max_abs_z"] is not None]
        step_gap = [r["mean_abs_gap"] for r in per.values() if r["mean_abs_gap"] is not None]
        answer["regimen_scores"] = {
            "regimens": per, "sites": int(round(totals["rscore.sites"])), "sites_of": totals.sites,
            "max_abs_z": max(zs) if zs else None, "mean_abs_gap": float(np.mean(gaps)) if gaps else None,
            "step_max_abs_z": max(step_z) if step_z else None,
            "step_mean_abs_gap": float(np.mean(step_gap)) if step_gap else None}

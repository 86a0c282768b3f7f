"""The doubly robust value of each policy and its contrast to the reference, where the site logs propensities.

Per entity, the per-decision doubly robust term of Jiang & Li (2016, "Doubly robust off-policy value evaluation for
reinforcement learning", ICML) with the model's per-step outcomes under π as the control variate::

    DR_i = c_i [Σ_t v̂_it + Σ_t w_{i,0:t} (y_it − v̂_it)]

the model's value plus its importance-weighted error on the logged steps that π could have taken — prediction-powered
inference with importance weights, unbiased for the true value whatever the model's bias as long as the logged
propensities are right. ``whatif.dr.<π>.*`` (with ``support``: Σ_i the share of entity i's steps still consistent with
π) and ``whatif.drdiff.<π>.*`` (DR_i(π) − DR_i(ref)) are their sums. Where no logged step follows π the weights are zero
and DR_i is the model's value again: the interval is then honest only on the supported steps, which ``support``
reports. For binary outcomes each site also sends the two sums of the **unseen-mass bounds**
(``evaluation.intervals.unseen_mass_sums``): the share of π's distribution its logged sample did not reach times the
outcome's range on it, which widens the interval where heavy weights make the plain one too narrow (the server takes
the critical value of Imbens & Manski 2004, "Confidence intervals for partially identified parameters",
Econometrica 72(6), for the set they leave).

The model side: V̂_t is the model's return-to-go under π from a do-simulation started at t = 0 and Q̂_t = V̂_t. For a
deterministic policy Q̂_t enters only multiplied by w_{0:t}, which is zero unless the logged action equals π's action;
for a stochastic policy Q̂ = V̂ does not depend on the action, so the correction terms w_{0:t−1}(w_t − 1)V̂_t have mean 0
whenever the weights are exact (E[w_t | h_t] = 1): the rollout then sets only the variance.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from fcd_secure.evaluation.intervals import (
    UNSEEN_END_FIELDS,
    UNSEEN_FIELDS,
    interval_from_sums,
    site_sums,
    unseen_bounds,
    unseen_mass_sums,
)
from fcd_secure.queries.base import MergeContext, SiteContext, SiteSums, Totals
from fcd_secure.queries.policy_terms import PolicyRollout, Rollouts
from fcd_secure.queries.policy_values import SUM_FIELDS, PolicyPart
from fcd_secure.queries.targeted import in_range

__all__ = ["DoublyRobust", "keep_in_range"]


def dr_per_entity(r: PolicyRollout, sub) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Each entity's doubly robust value of ``r``'s policy over the simulated window, its share of supported steps and
    the per-step pieces of the unseen-mass bounds (``w``: w_{0:t}, ``scale``: the step's share of the value,
    ``v_hat``: the model's expected outcome, each ``[n, H]``); computed on the site from its own propensities, which
    never leave it."""
    from fcd_secure.evaluation.ope import PerDecisionDR  # noqa: PLC0415

    step_v = r.step_value
    H = min(step_v.shape[1], sub.L)
    v_hat = np.zeros((sub.n, sub.L))
    # return-to-go from t = 0's do-simulation: with Q̂ = V̂ the DR term is c_i [V̂_0 + Σ_t w_{0:t} (y_t − v̂_t)]
    v_hat[:, :H] = np.cumsum((step_v[:, :H] * sub.M[:, :H])[:, ::-1], axis=1)[:, ::-1]
    est = PerDecisionDR(horizon=H)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflowing weights give non-finite terms: the caller then sends no DR
        dr, support = est.per_entity(sub.Y, sub.M, sub.P, r.pi, q_hat=v_hat, v_hat=v_hat)
        w, scale = est.step_weights(sub.Y, sub.M, sub.P, r.pi)
    return dr, support, {"w": w, "scale": scale, "v_hat": np.where(scale > 0, step_v[:, :H], 0.0)}


def keep_in_range(iv: dict[str, Any], binary: bool, lo: float) -> None:
    """A doubly robust value (``lo`` = 0) or effect (``lo`` = −1) of a binary outcome kept within [lo, 1]; a raw
    estimate outside is named in ``out_of_range`` (``queries.targeted``'s rule for every printed estimate)."""
    if not binary:
        return
    est, low, high = iv.get("estimate"), iv.get("low"), iv.get("high")
    if est is None or not np.isfinite(est):
        return
    iv.update(in_range(est, low, high, lo, 1.0))


class DoublyRobust(PolicyPart):
    """Per-decision doubly robust values and contrasts with their unseen-mass bounds (module docstring)."""

    name = "doubly_robust"

    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        names = []
        for p in policy_names:
            names += [f"whatif.drdiff.{p}.{f}" for f in SUM_FIELDS]
            names += [f"whatif.dr.{p}.{f}" for f in (*SUM_FIELDS, "support", *UNSEEN_FIELDS, *UNSEEN_END_FIELDS)]
        return names

    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        sub = ctx.sub
        if sub.P is None:
            return {}
        drs, supports, steps = {}, {}, {}
        for r in terms.policies:
            drs[r.name], supports[r.name], steps[r.name] = dr_per_entity(r, sub)
        if not all(np.isfinite(d).all() for d in drs.values()):
            return {}  # weights past float64 (tiny propensities over many steps): no DR at all
        if ctx.cfg.model.outcome != "binary":
            steps = {}  # the unseen-mass bounds need an outcome in [0, 1]
        terms.dr, terms.dr_steps = drs, steps  # for the site's per-entity file
        out: SiteSums = {}
        for name, d in drs.items():
            out.update(site_sums(f"whatif.dr.{name}", d))
            out[f"whatif.dr.{name}.support"] = float(supports[name].sum())
            if name in steps:
                st = steps[name]
                out.update(unseen_mass_sums(f"whatif.dr.{name}", st["w"], st["scale"], st["v_hat"], dr=d))
        reference = ctx.request.whatif.reference
        for name, d in drs.items():
            if name != reference:
                out.update(site_sums(f"whatif.drdiff.{name}", d - drs[reference]))
        return out

    def merge_policy(self, s: Totals, ctx: MergeContext, name: str, d: dict[str, Any]) -> None:
        # doubly robust only when every site sent it (one without propensities would leave a partial population)
        if not s.all_sent(f"whatif.dr.{name}.n"):
            return
        iv = interval_from_sums(s, f"whatif.dr.{name}", ctx.level)
        d["doubly_robust"] = {**iv.to_dict(), "support": s[f"whatif.dr.{name}.support"] / s[f"whatif.dr.{name}.n"]}
        if s.all_sent(f"whatif.dr.{name}.unseen_lo"):
            d["doubly_robust"]["bounded"] = unseen_bounds(iv, s, f"whatif.dr.{name}")
        keep_in_range(d["doubly_robust"], ctx.binary, 0.0)
        if "effect" in d and f"whatif.drdiff.{name}.n" in s:
            iv = interval_from_sums(s, f"whatif.drdiff.{name}", ctx.level)
            d["effect"]["doubly_robust"] = iv.to_dict()
            ref_key = f"whatif.dr.{ctx.question.reference}"
            if all(s.all_sent(f"{k}.unseen_lo") for k in (f"whatif.dr.{name}", ref_key)):
                d["effect"]["doubly_robust"]["bounded"] = unseen_bounds(iv, s, f"whatif.dr.{name}", ref_key)
            keep_in_range(d["effect"]["doubly_robust"], ctx.binary, -1.0)

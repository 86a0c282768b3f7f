"""What happens under π: simulated policy values with intervals, contrasts to a reference policy, and the parts that say
how far the logs back them (paper §V "do-simulation and policy evaluation").

:class:`PolicyValues` is the one :class:`~fcd_secure.queries.base.Query` of a what-if question. It computes each
policy's terms once per site (``queries.policy_terms``) and hands them to its parts, each a :class:`PolicyPart`
with its own sums, names and merge, in this order (a later part may read what an earlier one put into a policy's
answer):

1. :class:`SimulatedValues` — ``policy.<π>.*`` (n, Σ simulated value, Σ true value with an oracle),
   ``whatif.value.<π>.*`` and, for π ≠ reference, ``whatif.diff.<π>.*`` (n, Σx, Σx², the Monte-Carlo variance of
   ``evaluation.intervals``), and the **factual rectifier** ``whatif.residual.*`` / ``whatif.rectified.<π>.*``: the
   prediction-powered estimate of Angelopoulos et al. (2023, "Prediction-powered inference", Science 382), whose
   interval covers the model's bias *if* that bias is the same under π as under the logged actions (an assumption,
   not a fact). In a contrast the rectifier cancels, so effects have no rectified form.
2. ``queries.doubly_robust.DoublyRobust`` — the per-decision doubly robust value and contrast where the site logs
   propensities, with the unseen-mass bounds.
3. ``queries.off_policy.OffPolicy`` — IPW / SNIPW / per-decision DR diagnostics on the full and a truncated horizon.
4. :class:`LoggedSupport` — ``whatif.support.<π>.*``: how much of π the logs show; a policy no logged step follows
   is "not identified" (its simulated numbers move to ``model_only``; only the bounds over the outcome's range stay).
5. ``queries.targeted.Identified`` — what the logs identify: DR values over the first h steps with their support.
6. ``queries.incremental.PiSource`` — where a stochastic policy's π_k came from.

The per-entity values and contrasts are written to the site's own state folder only (``queries.per_entity``).
A site answers only what its question budget allows (``queries.budget``, P41-P43).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fcd_secure.data.policy import ThresholdRule, anchor_labels
from fcd_secure.evaluation.intervals import interval_from_sums, site_sums
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.budget import fires
from fcd_secure.queries.per_entity import WHATIF_DIR, write_per_entity
from fcd_secure.queries.logged import logged_support
from fcd_secure.queries.policy_terms import Rollouts, rollouts, true_values

__all__ = ["NOT_IDENTIFIED", "LoggedSupport", "PolicyPart", "PolicyValues", "SimulatedValues"]

#: the interval fields of a sum triple (``evaluation.intervals.site_sums``)
SUM_FIELDS = ("n", "sum", "sumsq")


class PolicyPart(ABC):
    """One part of a what-if answer (module docstring): its sums from the question's terms, its names, its merge."""

    name: ClassVar[str]

    @abstractmethod
    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        """Every scalar sum this part may send for these policies."""

    @abstractmethod
    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        """The sums one site sends."""

    def merge_policy(self, s: Totals, ctx: MergeContext, name: str, d: dict[str, Any]) -> None:
        """Add this part's figures to policy ``name``'s answer ``d``."""

    def finish(self, s: Totals, ctx: MergeContext, per_policy: dict[str, dict[str, Any]]) -> None:
        """Figures that need every policy's answer (contrasts, truths of effects)."""


class SimulatedValues(PolicyPart):
    """The simulator's value of each policy, its contrasts and the factual rectifier (module docstring, part 1)."""

    name = "values"
    #: the scalars that do not depend on the policies (anchor ids, context counts, the residual)
    SCALARS = ("anchors.a_off", "anchors.a_on", "anchors.sites", "contexts.generated", "contexts.replayed",
               "whatif.residual.n", "whatif.residual.sum", "whatif.residual.sumsq")
    #: ``policy.<π>.<field>``
    POLICY_FIELDS = ("n", "sim_sum", "true_sum")

    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        names = list(self.SCALARS)
        for p in policy_names:
            names += [f"policy.{p}.{f}" for f in self.POLICY_FIELDS]
            names += [f"whatif.value.{p}.{f}" for f in (*SUM_FIELDS, "mc_var")]
            names += [f"whatif.{kind}.{p}.{f}" for kind in ("rectified", "diff") for f in SUM_FIELDS]
            names.append(f"whatif.fires.{p}")  # threshold rules: 1 where the rule fires on the site's rows (P43)
        return names

    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        sub, data, question = ctx.sub, ctx.data, ctx.request.whatif
        a_off, a_on = data.anchors
        n = float(sub.n)
        out: SiteSums = {"anchors.a_off": float(a_off), "anchors.a_on": float(a_on), "anchors.sites": 1.0}
        for r in terms.policies:
            if isinstance(r.policy.rule, ThresholdRule):  # P43: a threshold that never fires here is reported
                out[f"whatif.fires.{r.name}"] = 1.0 if fires(r.policy, sub, a_off, a_on, terms.horizon) else 0.0
        out.update(site_sums("whatif.residual", terms.residual))
        ref = terms.by_name(question.reference).value
        for r in terms.policies:
            per, v = r.per_sample, r.value
            mc = per.var(1, ddof=1) / per.shape[1] if per.shape[1] > 1 else None
            out.update(site_sums(f"whatif.value.{r.name}", v, mc))
            out.update(site_sums(f"whatif.rectified.{r.name}", v - terms.residual))
            out[f"policy.{r.name}.n"] = n
            out[f"policy.{r.name}.sim_sum"] = float(v.sum())  # in float64 like the interval's sums
            if data.oracle is not None and ctx.all_rows:
                out[f"policy.{r.name}.true_sum"] = float(true_values(ctx, terms, r)[question.horizon]) * n
            if r.name != question.reference:
                out.update(site_sums(f"whatif.diff.{r.name}", v - ref))
        out["contexts.generated"] = float(len(terms.contexts.get("generated", [])))
        out["contexts.replayed"] = float(len(terms.contexts.get("replayed", [])))
        return out

    def merge_policy(self, s: Totals, ctx: MergeContext, name: str, d: dict[str, Any]) -> None:
        n = s[f"policy.{name}.n"]
        d["value_sim"] = s[f"policy.{name}.sim_sum"] / n
        # the true value only when every site reported it (a partial truth would bias the error)
        if s.all_sent(f"policy.{name}.true_sum"):
            d["value_true"] = s[f"policy.{name}.true_sum"] / n
            d["value_error"] = abs(d["value_sim"] - d["value_true"])
        if f"whatif.value.{name}.n" in s:
            d["interval"] = interval_from_sums(s, f"whatif.value.{name}", ctx.level).to_dict()
        if f"whatif.rectified.{name}.n" in s:
            d["rectified"] = interval_from_sums(s, f"whatif.rectified.{name}", ctx.level).to_dict()
        if f"whatif.fires.{name}" in s:  # a threshold rule: on how many sites it fires at all (P43)
            d["fires_on_sites"] = int(round(s[f"whatif.fires.{name}"]))
            d["never_fires"] = d["fires_on_sites"] == 0  # its 'otherwise' action everywhere
        if f"whatif.diff.{name}.n" in s and ctx.question is not None:
            d["effect"] = {"reference": ctx.question.reference,
                           **interval_from_sums(s, f"whatif.diff.{name}", ctx.level).to_dict()}
        d["n"] = int(round(n))
        d["n_sites"] = s.reported_by(f"policy.{name}.n")

    def finish(self, s: Totals, ctx: MergeContext, per_policy: dict[str, dict[str, Any]]) -> None:
        if ctx.question is None:
            return
        ref = per_policy.get(ctx.question.reference, {})
        for d in per_policy.values():
            if "effect" in d and "value_true" in d and "value_true" in ref:
                d["effect"]["true"] = d["value_true"] - ref["value_true"]


NOT_IDENTIFIED = ("not identified: no logged step follows this policy, so the data cannot tell its value; only the "
                  "bounds over the outcome's range hold (the model's own value is kept under 'model_only')")


class LoggedSupport(PolicyPart):
    """Σ_i the share of entity i's steps whose logged actions π could have taken at every step so far, and 1 where
    no logged step of the site follows π (a count: under secure aggregation the server learns how many sites, not
    which). A policy with no support at all is not identified (module docstring, part 4)."""

    name = "support"
    FIELDS = ("sum", "none")

    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        return [f"whatif.support.{p}.{f}" for p in policy_names for f in self.FIELDS]

    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        a_off, a_on = ctx.data.anchors
        out: SiteSums = {}
        for r in terms.policies:
            pi = None if r.policy.stochastic else r.pi
            total = float(np.asarray(logged_support(r.policy, ctx.sub, a_off, a_on, terms.horizon, pi),
                                     dtype=np.float64).sum())
            out[f"whatif.support.{r.name}.sum"] = total
            out[f"whatif.support.{r.name}.none"] = 1.0 if total <= 0 else 0.0
        return out

    def merge_policy(self, s: Totals, ctx: MergeContext, name: str, d: dict[str, Any]) -> None:
        if not s.all_sent(f"whatif.support.{name}.sum"):
            return
        d["support"] = s[f"whatif.support.{name}.sum"] / s[f"policy.{name}.n"]
        d["n_sites_without_support"] = int(round(s[f"whatif.support.{name}.none"]))
        # logged support at all (queries.targeted's ``identified`` asks more: enough effective entities)
        d["supported"] = d["support"] > 0
        if not d["supported"]:
            not_identified(d)

    def finish(self, s: Totals, ctx: MergeContext, per_policy: dict[str, dict[str, Any]]) -> None:
        if ctx.question is None:
            return
        ref = per_policy.get(ctx.question.reference, {})
        for name, d in per_policy.items():
            if "effect" in d and (d.get("supported") is False or ref.get("supported") is False):
                not_identified_effect(d["effect"], name if d.get("supported") is False else ctx.question.reference)


def not_identified(d: dict[str, Any]) -> None:
    """A policy no logged step follows: its value is not identified by the data. The simulated value and every
    interval around a point (the model's, the rectified, the doubly robust one, which is the model's value again
    when every weight is zero) move to ``model_only``; what stays is the bounded interval (the unseen-mass bounds,
    which then span the outcome's range), where the sites' outcomes allow it."""
    d["model_only"] = {k: d.pop(k) for k in ("value_sim", "interval", "rectified") if k in d}
    d["value_sim"] = None
    d.pop("value_error", None)
    dr = d.get("doubly_robust")
    d["interval"] = dict(dr["bounded"]) if dr and dr.get("bounded") else None
    if dr:
        d["model_only"]["doubly_robust"] = {k: dr[k] for k in ("estimate", "low", "high") if k in dr}
        dr.update({"estimate": None, "low": None, "high": None})
    for est, r in d.items():  # the OPE points (ipw, snipw, dr, their truncated forms): no weight reached π
        if isinstance(r, dict) and "ess" in r and r.get("value") is not None:
            d["model_only"][est] = r["value"]
            r["value"] = None
    d["warning"] = NOT_IDENTIFIED


def not_identified_effect(eff: dict[str, Any], which: str) -> None:
    """An effect one side of which is not identified: only its bounded interval stays (see :func:`not_identified`)."""
    eff["model_only"] = {k: eff.get(k) for k in ("estimate", "low", "high")}
    eff.update({"estimate": None, "low": None, "high": None, "supported": False,
                "warning": f"not identified: no logged step follows {which}"})
    dr = eff.get("doubly_robust")
    if dr:
        dr.update({"estimate": None, "low": None, "high": None})


class PolicyValues(Query):
    """The what-if question's answer: every part's sums from terms computed once per policy (module docstring)."""

    name = "policies"

    def __init__(self, parts: Iterable[PolicyPart]) -> None:
        self.parts = tuple(parts)

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        pols = list(policy_names)
        return [n for part in self.parts for n in part.names(pols, ope_horizon)]

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        terms = rollouts(ctx)
        out: SiteSums = {}
        for part in self.parts:
            out.update(part.site_sums(ctx, terms))
        if ctx.site_dir is not None:
            write_per_entity(Path(ctx.site_dir), ctx.request.whatif, ctx.sub,
                             {r.name: r.value for r in terms.policies}, terms.residual, terms.contexts, terms.dr,
                             terms.dr_steps, terms.grid_notes)
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        s = totals
        names = list(dict.fromkeys(k.split(".")[1] for k in s if k.startswith("policy.") and k.endswith(".n")))
        if ctx.question is not None:
            asked = ctx.question.names
            names = [p for p in asked if p in names] + [x for x in names if x not in asked]
        per_policy: dict[str, dict[str, Any]] = {}
        for name in names:
            d: dict[str, Any] = {}
            for part in self.parts:
                part.merge_policy(s, ctx, name, d)
            per_policy[name] = d
        for part in self.parts:
            part.finish(s, ctx, per_policy)
        if "whatif.residual.n" in s:
            answer["factual_residual"] = interval_from_sums(s, "whatif.residual", ctx.level).to_dict()
        if per_policy:
            answer["policies"] = per_policy
            errs = [d["value_error"] for d in per_policy.values() if "value_error" in d]
            if errs:
                answer["value_error_mean"] = float(np.mean(errs))
        q = ctx.question
        if q is not None and per_policy:
            answer["whatif"] = {"query_id": q.query_id, "reference": q.reference, "horizon": q.horizon,
                                "level": q.level,
                                "per_entity_file": f"<site state>/{WHATIF_DIR}/{q.query_id}.csv (on each site only)"}
        if per_policy:
            # no weighted check reaches any number: no identified horizon, no doubly robust value, no one-step effect
            # (no site logged or could estimate propensities). Every figure is the simulator's alone: labelled so.
            answer["model_only"] = "one_step_effect" not in answer and not any(
                "identified" in d or "doubly_robust" in d for d in per_policy.values())
        k = s.get("anchors.sites")
        if k:
            anchors = (int(round(s["anchors.a_off"] / k)), int(round(s["anchors.a_on"] / k)))
            answer["anchors"] = anchor_labels(anchors, ctx.action_names)
        if "contexts.generated" in s and s.sites:
            answer["contexts"] = {"generated": int(round(s["contexts.generated"] / s.sites)),
                                  "replayed": int(round(s["contexts.replayed"] / s.sites))}

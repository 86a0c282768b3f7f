"""What kind each answer is, and what it rests on (issue 42 item 4, issue 43 item 4), stated once for every renderer.

Three kinds, each with its assumptions (Robins 1986; Hernán & Robins 2020, "Causal Inference: What If", ch. 3, 12,
19-21):

* **checked by weighting** — the doubly robust values and effects over the horizons the logs reach
  (``queries.targeted``) and the one-step effect: they rest on sequential exchangeability given the recorded history
  (the propensities are the true assignment probabilities: logged, or the sites' models of their logging policies),
  positivity (measured: the ESS of the weight products and the overlap check) and consistency; how far an unrecorded
  confounder could move them is the Γ of ``queries.sensitivity``;
* **g-computation by the simulator** — where the confounders are recorded, the simulator is a g-formula (Robins
  1986) and its whole-trajectory numbers are identified under the same assumptions, *checked without the truth* by
  the natural-course comparison and sequential doubly robust estimates where the run computed them;
* **extrapolation** — the simulator's numbers where nothing checks them: they rest on the model being right where
  the logs do not reach, and are never ranked.

Where the user declares an unrecorded confounder (``queries.declared``) the first two kinds keep their names and say
**not identified (declared unrecorded confounding: …)**: never ranked, and what is shown is the Γ-bounds of
``queries.sensitivity``; the simulator's numbers stay extrapolation.

``kinds`` has no sums: its merge reads what the earlier queries put into the answer (it is registered last).
"""

from __future__ import annotations

from typing import Any

from fcd_secure.queries.answers import CHECKED, EXTRAPOLATION, G_COMPUTATION, SHARED_SOURCES
from fcd_secure.queries.base import MergeContext, MergeOnly, Totals

__all__ = ["AnswerKinds", "CHECKED", "EXTRAPOLATION", "G_COMPUTATION"]

# its lines, as every renderer prints them: queries.answers.EvaluationAnswer.kind_lines (no heavy import for the CLI);
# the three names live there, beside the typed answer that reads them back
#: the identifying assumptions of every causal answer here
IDENTIFYING = ("sequential exchangeability given the recorded history", "positivity", "consistency")


def _gap(nc: dict[str, Any]) -> str:
    """The natural course's mean |gap| as the lines print it (``n/a`` where no step was compared)."""
    gap = nc.get("mean_abs_gap")
    return "n/a" if gap is None else f"{float(gap):.3f}"


class AnswerKinds(MergeOnly):
    """``answer["kinds"]``: per kind of answer present, its assumptions and what was measured of them."""

    name = "kinds"

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        props = answer.get("propensities") or {}
        estimated = SHARED_SOURCES.get(props.get("model") or "",
                                       "estimated by each site's own model of its logging policy")
        source = {"logged": "logged in the sites' tables", "estimated": estimated,
                  "mixed": "logged at some sites, estimated at others"}.get(props.get("source"))
        kinds: dict[str, Any] = {}
        weighted = answer.get("one_step_effect") is not None or any(
            (p or {}).get("identified", {}).get("answer") for p in (answer.get("policies") or {}).values())
        if weighted and source is not None:
            sens = answer.get("sensitivity") or {}
            flip = sens.get("gamma_sign_change")
            gamma = (None if not sens else "its sign already uncertain at Γ = 1" if sens.get("sign_at_1") == 0
                     else f"sign robust up to Γ < {flip:g}" if flip is not None
                     else f"sign robust beyond Γ = {sens.get('gamma_max', 10):g}")
            share = props.get("below_floor_share")
            kinds[CHECKED] = {
                "assumptions": list(IDENTIFYING), "propensities": source,
                "positivity": ("ESS of the weight products ≥ 20 on the horizons answered"
                               + (f"; {share:.0%} of test steps below the propensity floor" if share is not None
                                  else "")),
                "unrecorded_confounding": gamma or "not measured",
            }
        nc = answer.get("natural_course")
        # the simulator's whole-trajectory numbers count as g-computation only where its natural course matches the
        # logs; a misfit leaves them extrapolation, and the line says why
        # ... and only where the sites have propensities (logged or their own models): without them nothing else
        # checks the simulator (no sequential DR, no weighted answer) and the answer is model-only (issue 43 item 5)
        if nc is not None and nc.get("passes") and source is not None:
            kinds[G_COMPUTATION] = {"assumptions": list(IDENTIFYING) + ["the confounders are recorded"],
                                    "checked_by": f"natural course (mean |gap| {_gap(nc)}, "
                                                  "consistent with the logs)"}
        decl = answer.get("unrecorded_confounding")
        if G_COMPUTATION in kinds and not decl:
            # the simulator's whole-trajectory numbers are this kind, not extrapolation: ranked at the horizon asked
            # (EvaluationAnswer.simulated_ranking), where no policy is one the logs never follow
            kinds[G_COMPUTATION]["ranked"] = True
        elif answer.get("policies"):
            kinds[EXTRAPOLATION] = {"assumptions": ["a simulator that is right where the logs do not reach"],
                                    "ranked": False}
            if nc is not None and nc.get("passes") and source is None:
                kinds[EXTRAPOLATION]["checked_by"] = (
                    f"natural course consistent with the logs (mean |gap| {_gap(nc)}), but the "
                    "sites have no propensities: a model-only answer, nothing weighted checks it")
            if nc is not None and nc.get("passes") is False:
                kinds[EXTRAPOLATION]["checked_by"] = (
                    f"natural course MISFIT (mean |gap| {_gap(nc)}): the simulator under the "
                    "logging policy departs from the logs, so its whole-trajectory numbers are not g-computation")
            elif nc is not None and nc.get("passes") is None:
                # no step had a standard error (too few entities a step): unchecked is not a misfit, and not a pass
                kinds[EXTRAPOLATION]["checked_by"] = (
                    f"natural course not checkable (mean |gap| {_gap(nc)}, no step with a standard error): nothing "
                    "checks the simulator's whole-trajectory numbers")
        if decl:
            shown = "the Γ-bounds under the marginal sensitivity model (one-step effect; values at the horizon asked)"
            for kind in (CHECKED, G_COMPUTATION):
                if kind in kinds:
                    kinds[kind].update({"identified": decl["not_identified"], "ranked": False, "shown": shown})
        if kinds:
            answer["kinds"] = kinds


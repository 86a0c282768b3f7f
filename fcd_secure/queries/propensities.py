"""Where the answers' propensities come from, and how far they can be trusted without the truth.

A hospital's table logs no propensities: each site then fits its own model of its logging policy on its training rows
(``evaluation.propensity.RecordPropensity``, ``federation.learner.with_propensities``) and every estimator that
weights by propensities (the one-step effect, the identified values, the doubly robust values, the DR-learner, D₁)
uses its estimates on the validation and test rows. :class:`PropensitySource` makes the answer say so, through sums
only:

* ``overlap.logged`` / ``.estimated`` / ``.none``: one count per site, so the answer says how many sites logged
  their propensities, how many estimated them and how many had none (under secure aggregation the server learns how
  many, not which);
* ``overlap.steps`` / ``.below_floor``: the test steps, and those whose propensity (logged, or estimated before
  its floor) is below ``PROPENSITY_FLOOR`` — the overlap check: a weight's denominator there is the floor, not the
  data;
* ``overlap.cal.<k>.n|pred|hit``: the reliability sums of the sites' models on their test rows by decile of the
  predicted probability (count, Σ π̂, how many were the logged action): calibrated where the mean prediction equals
  the observed share, without any truth.

The assumptions every weighted answer rests on, which no sum can check, are stated with it: sequential
exchangeability given the recorded history (so a model of the record is the true assignment probability), positivity
(the overlap check measures it), consistency.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from fcd_secure.evaluation.propensity import PROPENSITY_FLOOR
from fcd_secure.queries.answers import SHARED_SOURCES
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals

__all__ = ["ASSUMPTIONS", "BINS", "PropensitySource"]

#: deciles of the reliability sums
BINS = 10
#: the sources a site's propensities can have (``federation.learner.SiteData.propensities``)
SOURCES = ("logged", "estimated", "none")
#: what every answer weighted by propensities rests on
ASSUMPTIONS = ("sequential exchangeability given the recorded history", "positivity (see the overlap check)",
               "consistency")


class PropensitySource(Query):
    """The propensities' source per site, their overlap and the sites' models' calibration (module docstring)."""

    # the sums' prefix: the egress gate refuses any key that names a propensity (audit.rules.PROPENSITY_NAME), so
    # these counts and sums of a site's own model are named by what they measure
    name = "overlap"

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        names = [f"overlap.{s}" for s in SOURCES] + ["overlap.steps", "overlap.below_floor"]
        return names + [f"overlap.cal.{k}.{f}" for k in range(BINS) for f in ("n", "pred", "hit")]

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        sub, source = ctx.sub, ctx.data.propensities
        out: SiteSums = {f"overlap.{s}": float(s == source) for s in SOURCES}
        valid = sub.M > 0
        out["overlap.steps"] = float(valid.sum())
        if sub.P is None:
            return out
        below = sub.meta.get("propensity_below_floor")  # estimated: counted before the floor, per row
        out["overlap.below_floor"] = float(np.sum(below) if below is not None
                                              else ((sub.P < PROPENSITY_FLOOR) & valid).sum())
        cal = sub.meta.get("propensity_calibration")  # [rows, (n, Σp, Σy), bins] of the site's model
        if cal is not None:
            tot = np.asarray(cal).sum(axis=0)
            for k in range(BINS):
                for j, f in enumerate(("n", "pred", "hit")):
                    out[f"overlap.cal.{k}.{f}"] = float(tot[j, k])
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if "overlap.steps" not in totals:
            return
        sites = {s: int(round(totals.get(f"overlap.{s}", 0.0))) for s in SOURCES}
        used = [s for s in ("logged", "estimated") if sites[s]]
        source = "none" if not used else used[0] if len(used) == 1 else "mixed"
        steps = float(totals["overlap.steps"])
        out: dict[str, Any] = {
            "source": source, "sites": sites, "floor": PROPENSITY_FLOOR, "assumptions": list(ASSUMPTIONS),
            "below_floor_share": (float(totals["overlap.below_floor"]) / steps
                                  if "overlap.below_floor" in totals and steps else None),
        }
        if ctx.behaviour_model in SHARED_SOURCES and sites["estimated"]:
            # the estimating sites used the consortium's model (federation.secure.secure_behaviour), not their own
            out["model"] = ctx.behaviour_model
        if totals.all_sent("overlap.cal.0.n"):
            rows = []
            for k in range(BINS):
                n = float(totals[f"overlap.cal.{k}.n"])
                if n > 0:
                    rows.append({"bin": [k / BINS, (k + 1) / BINS], "n": int(n),
                                 "predicted": float(totals[f"overlap.cal.{k}.pred"]) / n,
                                 "observed": float(totals[f"overlap.cal.{k}.hit"]) / n})
            out["calibration"] = rows
            # the largest gap between mean prediction and observed share, weighted by the bins' counts (ECE)
            total = sum(r["n"] for r in rows)
            out["calibration_error"] = (float(np.sum([r["n"] * abs(r["predicted"] - r["observed"]) for r in rows]))
                                        / total if total else None)
        answer["propensities"] = out

"""The run's policies' simulated values in the late scored rounds, as the consortium's sums (``rvalue.*``).

A g-computation answer ranks its policies (``EvaluationAnswer.simulated_ranking``). The intervals of that ranking
count entities and simulated futures, and its margin (twice the natural course's mean |gap|) counts the simulator's
error under the logging policy; neither sees how much the simulator's order of two policies owes to the round that
was picked. A run's late rounds are models of about equal standing (the round rule cannot tell them apart by their
true error: docs/benchmarks.md, the Spearman sections), and on issue 42's carry-over world they often disagree on a
pair that the chosen round orders confidently. So in every scored round of the run's second half (round ≥
``federation.rounds`` / 2), where no unrecorded confounder is declared (nothing is ranked there), each site also
simulates the run's own policies (``[evaluation] policies``, at ``[evaluation] horizon``) on its **validation rows**,
with the run's seed (common random numbers across rounds, as the natural course), and sends, per policy, the number
of entities and the sum of their simulated values. The server keeps each round's values (``rounds.json``); the final
answer carries those of :func:`late_round_values`, and a ranking's ``>`` needs every one of them to order the pair
the same way (snapshot disagreement as a reading of training noise: Huang et al. 2017, "Snapshot ensembles", ICLR;
Fort, Hu & Lakshminarayanan 2019, "Deep ensembles: a loss landscape perspective").

What leaves a site is what the final evaluation already sends of the same policies on other rows: one count and one
sum of simulated values per policy, added across sites (secure aggregation in secure mode), never a per-entity
value. The policies are bound as a question's are (thresholds on the site's grid, labels and contexts on its rows)
and admitted against the site's minimum difference and its own record of the validation rows' answered cohorts
(``queries.budget.admit_question`` with :data:`VALIDATION_SLOT`, docs/threats.md P70); a site that refuses, cannot
bind a policy, or whose validation rows are fewer than its cohort floor sends nothing for them, and a refusal is
written into the round's reply line in the site's ledger (``audit.rules.note_declined``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.cohort import entity_count

__all__ = ["RoundValues", "late_round_values"]

#: the key that counts the sites that sent their values
SITES_KEY = "rvalue.sites"
#: per policy: entities and the sum of their simulated values
FIELDS = ("n", "s")
#: the site's record of the validation rows' answered cohorts (``queries.budget.admit_question``; P70), beside the
#: test rows' (``queries.budget.QUESTION_SLOT``)
VALIDATION_SLOT = "round_value_cohorts.json"


class RoundValues(Query):
    """A scored round's simulated values of the run's policies on the validation rows (module docstring)."""

    name = "round_values"
    quick = True

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return [SITES_KEY] + [f"rvalue.{p}.{f}" for p in policy_names for f in FIELDS]

    def applies(self, ctx: SiteContext) -> bool:
        # only what a ranking can read (its cost: 0.6 s a site and scored round on DKT-Synth's diffusion rollouts,
        # +20 % of the README's main job when every scored round paid it): the rounds of the run's second half, and
        # never where the run declares an unrecorded confounder (nothing there is ranked: queries.kinds)
        from fcd_secure.queries.declared import declared_confounding  # noqa: PLC0415

        keep = ctx.request.keep_round
        return (keep is not None and keep >= ctx.cfg.federation.rounds / 2
                and ctx.once("round_values.declared", lambda: declared_confounding(ctx.cfg)) is None)

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.audit import Refusal, note_declined  # noqa: PLC0415
        from fcd_secure.data.spec import DataError  # noqa: PLC0415
        from fcd_secure.queries.policy_terms import bind_question, per_sample_values  # noqa: PLC0415
        from fcd_secure.queries.request import request_from_config  # noqa: PLC0415

        rows = ctx.data.validation
        if rows is None or entity_count(rows) < ctx.floor:
            return {}
        question = request_from_config(ctx.cfg)
        H = rows.L if question.horizon is None else min(int(question.horizon), rows.L)
        seed = int(ctx.cfg.seed)  # common random numbers across rounds: the rounds differ by their model only
        # the validation rows' own record of answered cohorts (P70): across rounds the same policies are free, and a
        # later run's policy a few patients from one answered before is refused, as on the test rows (P41)
        record = None if ctx.site_dir is None else Path(ctx.site_dir) / "slots" / VALIDATION_SLOT
        try:
            bound, _ = bind_question(ctx, list(question.policies), rows, H, seed, record)
        except Refusal as refusal:
            # nothing is sent for a pair the site refuses; the round's other sums (its selection) still count, and
            # the egress gate writes the refusal into the round's reply line (``declined``), where the site's
            # auditor sees the probe (docs/threats.md P70)
            note_declined(refusal)
            return {}
        except DataError:  # a policy the site's data cannot bind: the final evaluation says so in the open
            return {}
        out: SiteSums = {}
        for pol in bound:
            sim = ctx.model.simulate_policy(rows, pol, ctx.data.anchors, ctx.n_samples, seed, horizon=question.horizon)
            v = per_sample_values(sim).mean(1)
            if not np.isfinite(v).all():
                return {}
            out[f"rvalue.{pol.name}.n"] = float(v.size)
            out[f"rvalue.{pol.name}.s"] = float(v.sum())
        out[SITES_KEY] = 1.0
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if SITES_KEY not in totals:
            return
        names = [k[len("rvalue."):-len(".n")] for k in totals if k.startswith("rvalue.") and k.endswith(".n")]
        values = {p: float(totals[f"rvalue.{p}.s"]) / float(totals[f"rvalue.{p}.n"])
                  for p in names if float(totals.get(f"rvalue.{p}.n", 0.0)) > 0}
        values = {p: v for p, v in values.items() if math.isfinite(v)}
        if values:
            answer["round_values"] = values
            # how many sites sent them: a round some site left out is not compared with one all sites answered
            answer["round_values_sites"] = int(round(float(totals[SITES_KEY])))


def late_round_values(history: Iterable[Mapping[str, Any]], horizon: int | None) -> dict[str, dict[str, float]]:
    """The scored rounds' values (:class:`RoundValues`) of the run's second half, keyed by round (as a string, the
    JSON key): the rounds at or after half the last scored round, simulated at ``horizon`` (a resumed run may have
    changed ``[evaluation] horizon``) and sent by as many sites as the best-covered of them, the rounds a ranking's
    ``>`` must agree with."""
    scored = [r for r in history if r.get("round_values") and r.get("round_values_horizon") == horizon]
    if not scored:
        return {}
    last = max(int(r["round"]) for r in scored)
    most = max(int(r.get("round_values_sites") or 0) for r in scored)
    return {str(int(r["round"])): dict(r["round_values"]) for r in scored
            if int(r["round"]) >= last / 2 and int(r.get("round_values_sites") or 0) == most}

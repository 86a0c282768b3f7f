"""Where a stochastic policy's π_k came from on the sites: the logged propensity, or the site's own model of its
logging policy (``queries.incremental``). Sent as two counts per policy (``whatif.pik.<π>.logged`` / ``.model``) and
printed with the identified answer as the share of steps whose π_k was logged: a modelled π_k is a bias the interval
does not show where the model is wrong."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fcd_secure.queries.base import MergeContext, SiteContext, SiteSums, Totals
from fcd_secure.queries.incremental import PIK_FIELDS, incremental_target_probs
from fcd_secure.queries.policy_terms import Rollouts
from fcd_secure.queries.policy_values import PolicyPart

__all__ = ["PiSource"]


class PiSource(PolicyPart):
    """The counts of π_k's sources per stochastic policy (module docstring)."""

    name = "pi_k"

    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        return [f"whatif.pik.{p}.{f}" for p in policy_names for f in PIK_FIELDS]

    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        if ctx.sub.P is None:
            return {}
        out: SiteSums = {}
        for r in terms.policies:
            if r.policy.stochastic:
                counts = incremental_target_probs(r.policy, ctx.sub, ctx.data.anchors)[1]
                out.update({f"whatif.pik.{r.name}.{f}": float(counts[f]) for f in PIK_FIELDS})
        return out

    def finish(self, s: Totals, ctx: MergeContext, per_policy: dict[str, dict[str, Any]]) -> None:
        for name, d in per_policy.items():
            if "identified" not in d:
                continue
            src = {f: s[f"whatif.pik.{name}.{f}"] for f in PIK_FIELDS if s.all_sent(f"whatif.pik.{name}.{f}")}
            if len(src) == len(PIK_FIELDS) and sum(src.values()) > 0:  # a stochastic policy: where π_k came from
                d["identified"]["pi_k"] = {"logged_share": src["logged"] / sum(src.values()),
                                           "steps": int(sum(src.values()))}

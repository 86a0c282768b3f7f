"""Off-policy diagnostics of each policy on the sites' own logged propensities: IPW, SNIPW and per-decision DR.

Per policy and estimator (``evaluation.ope``: IPW and self-normalised IPW, Precup, Sutton & Singh 2000; per-decision
DR, Jiang & Li 2016), over the full horizon and over the first ``evaluation.ope_horizon`` steps (where deterministic
policies still have logged support), a site sends the estimator's additive sums ``ope.<π>.<estimator>[_h<H>].*``:
n, Σ value, Σ weight, Σ weight², the entities still consistent with π and whether the sum is finite. The server
pools them (``evaluation.ope.combine``) into a point estimate with its effective sample size. These are diagnostics
beside the answer (unbounded weights are flagged, never clipped), never the answer itself.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from fcd_secure.queries.base import MergeContext, SiteContext, SiteSums, Totals
from fcd_secure.queries.policy_terms import Rollouts
from fcd_secure.queries.policy_values import PolicyPart

__all__ = ["ESTIMATORS", "FIELDS", "OffPolicy"]

#: the estimators every site reports per policy
ESTIMATORS = ("ipw", "snipw", "dr")
#: the sums of one estimator (``evaluation.ope.OPEResult``)
FIELDS = ("n", "sum_value", "sum_weight", "sum_weight_sq", "n_consistent", "finite")


class OffPolicy(PolicyPart):
    """IPW / SNIPW / per-decision DR sums per policy on the full and a truncated horizon (module docstring)."""

    name = "ope"

    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        suffixes = [""] + ([f"_h{int(ope_horizon)}"] if ope_horizon else [])
        return [f"ope.{p}.{est}{suffix}.{f}" for p in policy_names for est in ESTIMATORS for suffix in suffixes
                for f in FIELDS]

    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        from fcd_secure.evaluation.ope import IPW, SNIPW, PerDecisionDR, estimate_on_site  # noqa: PLC0415

        sub = ctx.sub
        if sub.P is None or ctx.request.whatif.horizon is not None:
            return {}
        out: SiteSums = {}
        h_ope = ctx.cfg.evaluation.ope_horizon
        for r in terms.policies:
            step_v = r.step_value  # [n, H] expected outcome under π
            H = min(step_v.shape[1], sub.L)
            contrib = step_v[:, :H] * sub.M[:, :H]
            for suffix, hor in (("", None),) + (((f"_h{h_ope}", h_ope),) if h_ope and h_ope < sub.L else ()):
                Hh = H if hor is None else min(H, hor)
                v_hat = np.zeros((sub.n, sub.L))
                v_hat[:, :Hh] = np.cumsum(contrib[:, :Hh][:, ::-1], axis=1)[:, ::-1]  # return-to-go Σ_{t≤t'<Hh}
                for name, cls in (("ipw", IPW), ("snipw", SNIPW), ("dr", PerDecisionDR)):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # support warnings are reported through the merged result
                        res = estimate_on_site(cls(horizon=hor), sub, pi=r.pi, q_hat=v_hat, v_hat=v_hat)
                    key = f"ope.{r.name}.{name}{suffix}"
                    out[f"{key}.n"] = float(res.n)
                    out[f"{key}.sum_value"] = float(res.sum_value)
                    out[f"{key}.sum_weight"] = float(res.sum_weight)
                    out[f"{key}.sum_weight_sq"] = float(res.sum_weight_sq)
                    out[f"{key}.n_consistent"] = float(res.n_consistent)
                    out[f"{key}.finite"] = 1.0 if math.isfinite(res.sum_value) else 0.0
        return out

    def merge_policy(self, s: Totals, ctx: MergeContext, name: str, d: dict[str, Any]) -> None:
        from fcd_secure.evaluation.ope import OPEResult, combine  # noqa: PLC0415

        ests = sorted({k.split(".")[2] for k in s if k.startswith(f"ope.{name}.")}, key=lambda e: (len(e), e))
        for est in ests:  # ipw, snipw, dr, then their truncated-horizon forms (ipw_h2, ...)
            key = f"ope.{name}.{est}"
            if f"{key}.n" not in s:
                continue
            summed = OPEResult(
                estimator=est.split("_h")[0],  # the estimator class; '_h<H>' only names the truncated horizon
                value=float("nan"), n=int(s[f"{key}.n"]), ess=float("nan"), n_consistent=int(s[f"{key}.n_consistent"]),
                warning=None, sum_value=s[f"{key}.sum_value"], sum_weight=s[f"{key}.sum_weight"],
                sum_weight_sq=s[f"{key}.sum_weight_sq"],
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no support is reported in the result's 'warning' field
                pooled = combine([summed])  # the sums are already pooled over sites: combine finishes them
            d[est] = {"value": pooled.value, "ess": pooled.ess, "n_consistent": pooled.n_consistent,
                      "warning": pooled.warning}
            if ctx.binary and math.isfinite(pooled.value) and not 0.0 <= pooled.value <= 1.0:
                # a diagnostic estimator (IPW weights are unbounded): flagged, not clipped, never the answer
                d[est]["out_of_range"] = "outside the binary outcome's [0, 1]: unbounded importance weights"

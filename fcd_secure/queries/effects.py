"""The cheap answers of every evaluation: the effect figures against an oracle's truth, and the factual AUC.

* :class:`OracleEffects` — where the data has an oracle (DKT-Synth, tumour), the model's effect of the anchor regimes
  over the effect window per test entity against the truth, as ``EffectStats`` sums (n, Σ(τ̂−τ)², Στ̂, Στ, ...) →
  PEHE with its skill figures beside PEHE₀ and sd τ, |ATE error| (paper Table III); and how many entities follow
  each anchor regime over that window (the effect is identified from the logs only where enough do; elsewhere it is
  extrapolation, ``docs/fidelity.md``).
* :class:`FactualAUC` — a 100-cell histogram of the model's one-step probability of the factual outcome by class
  (``AUCStats``) → the factual AUC (paper §IV-C), for binary outcomes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals

__all__ = ["AUC_BINS", "FactualAUC", "OracleEffects", "effect_support"]

#: cells of each AUC histogram (the gate's list cap)
AUC_BINS = 100


def effect_support(s: Totals) -> dict[str, Any]:
    """The anchor regimes' support behind PEHE and the ATE error: how many evaluated entities follow "always a_off" and
    "always a_on" over the whole effect window, and whether that identifies the effect (both at least the support
    floor of ``queries.targeted``) or leaves it an extrapolation that no method can validate from these logs."""
    from fcd_secure.queries.targeted import MIN_SUPPORT_ESS  # noqa: PLC0415

    off, on = int(round(s["effect.regime_off"])), int(round(s["effect.regime_on"]))
    identified = min(off, on) >= MIN_SUPPORT_ESS
    return {"a_off": off, "a_on": on, "n": int(round(s["effect.n"])), "identified": identified,
            "label": "identified" if identified else "extrapolation"}


class OracleEffects(Query):
    """PEHE, skill and |ATE error| against an oracle's truth (module docstring): ``effect.*``."""

    name = "effect"
    quick = True
    FIELDS = ("n", "sse", "sum_hat", "sum_true", "sum_true_sq", "sum_hat_sq", "sum_cross", "regime_off", "regime_on")

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return ["n_test"] + [f"effect.{f}" for f in self.FIELDS]

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.data.policy import anchor_regime_support  # noqa: PLC0415
        from fcd_secure.evaluation.metrics import EffectStats  # noqa: PLC0415

        sub, data = ctx.sub, ctx.data
        out: SiteSums = {"n_test": float(sub.n)}
        oracle = data.oracle
        if oracle is None:
            return out
        tau = np.asarray(oracle.true_effects(data.site_index, "test", ctx.rows), dtype=np.float64)
        tau_hat = ctx.model.estimate_effects(sub, data.anchors, oracle.anchor_step, oracle.horizon, ctx.n_samples,
                                             ctx.seed)
        out.update({f"effect.{k}": float(v) for k, v in EffectStats.from_arrays(tau_hat, tau).to_dict().items()})
        sup = anchor_regime_support(sub.T, sub.M > 0, data.anchors, oracle.anchor_step, oracle.horizon)
        out["effect.regime_off"] = float(sup["a_off"]["whole"])
        out["effect.regime_on"] = float(sup["a_on"]["whole"])
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        from fcd_secure.evaluation.metrics import EffectStats  # noqa: PLC0415

        answer["sites_evaluated"] = totals.sites
        answer["n_test"] = totals.get("n_test")
        if not totals.get("effect.n"):
            return
        es = EffectStats.from_sums(totals)
        answer["pehe"] = es.pehe()
        answer["effect_skill"] = es.skill_figures()
        answer["ate_error"] = es.ate_error()
        answer["ate_hat"] = es.sum_hat / es.n
        answer["ate_true"] = es.sum_true / es.n
        if "effect.regime_on" in totals:
            answer["effect_support"] = effect_support(totals)


class FactualAUC(Query):
    """The factual AUC from the sites' class histograms (module docstring): lists ``auc.pos`` / ``auc.neg``."""

    name = "auc"
    quick = True

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return []

    def lists(self) -> dict[str, int]:
        return {"auc.pos": AUC_BINS, "auc.neg": AUC_BINS}

    def applies(self, ctx: SiteContext) -> bool:
        return ctx.cfg.model.outcome == "binary"

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.evaluation.metrics import AUCStats  # noqa: PLC0415
        sub = ctx.sub
        p_fact = ctx.model.factual_probs(sub)
        try:
            auc = AUCStats.from_scores(sub.Y, np.clip(p_fact, 0.0, 1.0), sub.M, bins=AUC_BINS)
        except ValueError:
            return {}  # a site whose test outcomes are all one class contributes nothing to the AUC
        return {"auc.pos": [float(v) for v in auc.pos], "auc.neg": [float(v) for v in auc.neg]}

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        from fcd_secure.evaluation.metrics import AUCStats  # noqa: PLC0415

        if "auc.pos" not in totals:
            return
        try:
            answer["factual_auc"] = AUCStats(pos=np.rint(totals["auc.pos"]).astype(np.int64),
                                             neg=np.rint(totals["auc.neg"]).astype(np.int64)).auc()
        except ValueError:
            pass

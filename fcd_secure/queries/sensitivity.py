"""How far an unrecorded confounder could move the identified one-step effect: bounds under the marginal sensitivity
model, from site sums.

Every weighted answer assumes sequential exchangeability given the recorded history: the propensity P_t (logged, or
the site's model of its logging policy) is the probability of the action given everything that drove it. The
**marginal sensitivity model** (Tan 2006, JASA 101:1619; Zhao, Small & Bhattacharya 2019, JRSS-B 81:735) lets an
unrecorded U move each step's odds of the logged action by at most a factor Γ ≥ 1::

    Γ⁻¹ ≤ [e*_t / (1 − e*_t)] / [P_t / (1 − P_t)] ≤ Γ,   e*_t = Pr(T_t = a_t | H_t, U)

so the true inverse weight 1/e*_t lies in [A_t, B_t] = [1 + (1/P_t − 1)/Γ, 1 + (1/P_t − 1)·Γ]. The one-step effect's
augmented estimate (``queries.targeted``, Robins, Rotnitzky & Zhao 1994)::

    θ̂₁ = Σ_t [μ̂_on(H_t) − μ̂_off(H_t) + 1{T_t = a_on} w_t r^on_t − 1{T_t = a_off} w_t r^off_t] / #steps,
    r^a_t = Y_t − μ̂_a(H_t),

with the true weights w_t = 1/e*_t in place of 1/P_t identifies the effect whatever U is (the outcome model enters
only through the residuals). Its largest value over every w_t ∈ [A_t, B_t] takes, step by step, B_t·r where the
term's sign helps and A_t·r where it hurts (and the opposite for the smallest): a **Horvitz–Thompson box bound**,
valid for any Γ-bounded confounder, exact at Γ = 1 (the product's own estimate), and conservative (not sharp: the
sharp bounds of Dorn & Guo 2022, JASA 118:2653, also use that the true weights average to one, which needs sorted
residuals no secure sum carries). The bound's sampling uncertainty is the same cluster-robust linearisation over
entities as θ̂₁'s; the reported interval is [low − z·se, high + z·se] (Imbens & Manski 2004's conservative form).

The answer gives the bounds at :data:`REPORTED` (Γ = 1, 1.25, 1.5, 2, 3) and the **smallest Γ of :data:`GAMMAS` at
which the effect's sign could change** (its interval then contains 0): Γ = 1 means the estimate itself does not
exclude zero; "beyond 10" that no Γ up to 10 could reverse it. A site sends only additive sums per Γ
(``sens.g<k>.hi|lo.s|ss|sm`` and the shared ``sens.n|m|mm``), never a per-step term, weight or propensity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import NormalDist
from typing import Any

import numpy as np

from fcd_secure.evaluation.discrepancy import DEFAULT_CLIP
from fcd_secure.evaluation.intervals import cluster_ratio
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals

__all__ = ["GAMMAS", "REPORTED", "Sensitivity", "box_bound_terms"]

#: the Γ grid the sites compute (the smallest one that reverses the sign is read on it)
GAMMAS = (1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 10.0)
#: the Γ values every answer prints (issue 43 item 3)
REPORTED = (1.0, 1.25, 1.5, 2.0, 3.0)
#: what the bounds rest on, printed with them
MODEL = ("marginal sensitivity model (Tan 2006): an unrecorded confounder moves each step's odds of the logged action "
         "by at most Γ; Horvitz–Thompson box bounds of the one-step AIPW effect (valid, conservative)")


def box_bound_terms(Y, M, T, P, mu_on, mu_off, a_on: int, a_off: int, gamma: float,
                    clip: float = DEFAULT_CLIP) -> tuple[np.ndarray, np.ndarray]:
    """Per step ``[n, L]``: the largest and smallest one-step AIPW term over every weight in [A_t, B_t] (module
    docstring); zero on padding. Each weighted residual is clipped at ±``clip``·Γ, so that at Γ = 1 the bounds are
    the product's own clipped estimate (``queries.targeted``: ±50).

    Raises:
        ValueError: Γ < 1, or a valid step's propensity outside (0, 1].
    """
    if gamma < 1.0:
        raise ValueError(f"the sensitivity parameter Γ must be at least 1, got {gamma}")
    valid = np.asarray(M) > 0
    P = np.where(valid, np.asarray(P, dtype=np.float64), 1.0)
    if not ((P > 0) & (P <= 1)).all():
        raise ValueError("box_bound_terms: a valid step has a propensity outside (0, 1]")
    lo_w, hi_w = 1.0 + (1.0 / P - 1.0) / gamma, 1.0 + (1.0 / P - 1.0) * gamma
    Y = np.asarray(Y, dtype=np.float64)
    on, off = (np.asarray(T) == int(a_on)) & valid, (np.asarray(T) == int(a_off)) & valid
    r_on, r_off = Y - mu_on, Y - mu_off
    # + w r_on on the a_on arm, − w r_off on the a_off arm: the extreme weight is the one that pushes the term
    up_on, dn_on = np.maximum(lo_w * r_on, hi_w * r_on), np.minimum(lo_w * r_on, hi_w * r_on)
    up_off, dn_off = np.maximum(-lo_w * r_off, -hi_w * r_off), np.minimum(-lo_w * r_off, -hi_w * r_off)
    c = clip * gamma
    up_on, dn_on, up_off, dn_off = (np.clip(x, -c, c) for x in (up_on, dn_on, up_off, dn_off))
    contrast = np.where(valid, mu_on - mu_off, 0.0)
    hi = contrast + np.where(on, up_on, 0.0) + np.where(off, up_off, 0.0)
    lo = contrast + np.where(on, dn_on, 0.0) + np.where(off, dn_off, 0.0)
    return hi, lo


class Sensitivity(Query):
    """Γ-bounds of the identified one-step effect (module docstring): ``sens.*``."""

    name = "sens"

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return ["sens.n", "sens.m", "sens.mm"] + [f"sens.g{k}.{side}.{f}" for k in range(len(GAMMAS))
                                                  for side in ("hi", "lo") for f in ("s", "ss", "sm")]

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.queries.targeted import one_step_terms  # noqa: PLC0415 - targeted imports policy values

        sub = ctx.sub
        pair = one_step_terms(ctx)
        if sub.P is None or pair is None or not sub.n:
            return {}
        a_off, a_on = (int(a) for a in ctx.data.anchors)
        mu_on, mu_off = pair[1]
        m = (sub.M > 0).sum(1).astype(np.float64)
        out: SiteSums = {"sens.n": float(sub.n), "sens.m": float(m.sum()), "sens.mm": float((m * m).sum())}
        for k, g in enumerate(GAMMAS):
            for side, terms in zip(("hi", "lo"), box_bound_terms(sub.Y, sub.M, sub.T, sub.P, mu_on, mu_off,
                                                                 a_on, a_off, g)):
                S = terms.sum(1)  # per entity: its steps are one cluster
                out.update({f"sens.g{k}.{side}.s": float(S.sum()), f"sens.g{k}.{side}.ss": float((S * S).sum()),
                            f"sens.g{k}.{side}.sm": float((S * m).sum())})
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if not totals.all_sent("sens.m") or not totals["sens.m"]:
            return
        answer["sensitivity"] = merge_sensitivity(totals, ctx.level, ctx.binary)


def _ratio(s: Totals, key: str, n: float, m: float, mm: float) -> tuple[float, float]:
    """ΣS/Σm of ``key``'s sums and its cluster SE (``evaluation.intervals.cluster_ratio``)."""
    return cluster_ratio(float(s[f"{key}.s"]), float(s[f"{key}.ss"]), float(s[f"{key}.sm"]), n, m, mm)


def merge_sensitivity(s: Totals, level: float, binary: bool, gammas: tuple[float, ...] = GAMMAS) -> dict[str, Any]:
    """The bounds per Γ and the smallest Γ that could reverse the effect's sign (module docstring); ``gammas`` is
    the grid the sites computed (``sens.g<k>`` is its k-th value)."""
    n, m, mm = float(s["sens.n"]), float(s["sens.m"]), float(s["sens.mm"])
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    lim = 1.0 if binary else math.inf
    rows = []
    for k, g in enumerate(gammas):
        hi, hi_se = _ratio(s, f"sens.g{k}.hi", n, m, mm)
        lo, lo_se = _ratio(s, f"sens.g{k}.lo", n, m, mm)
        rows.append({"gamma": g, "low": max(lo, -lim), "high": min(hi, lim),
                     "low_ci": max(lo - z * lo_se, -lim), "high_ci": min(hi + z * hi_se, lim)})
    first = rows[0]
    sign = 1 if first["low_ci"] > 0 else -1 if first["high_ci"] < 0 else 0
    flip = next((r["gamma"] for r in rows if r["low_ci"] <= 0 <= r["high_ci"]), None)
    return {"estimand": "one-step effect of a_on vs a_off at every decision step", "model": MODEL, "level": level,
            "bounds": [r for r in rows if r["gamma"] in REPORTED], "grid": rows,
            "sign_at_1": sign, "gamma_sign_change": flip, "gamma_max": gammas[-1]}

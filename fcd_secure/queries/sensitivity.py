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

**Over the horizon asked** (:class:`HorizonSensitivity`, issue 43 item 3). The policy values over h > 1 steps are the
sequential doubly robust values of ``queries.sequential_dr``, per entity::

    DR_i = c_i Σ_{t<h} [ w_{0:t} (y_t − Q̂_t) + w_{0:t−1} V̂_t ] = c_i [ V̂_0 + Σ_{t<h} w_{0:t} (y_t − Q̂_t + V̂_{t+1}) ],

w_{0:t} = Π_{s≤t} π(a_s | h_s) / e*_s, w_{0:−1} = 1, V̂_h = 0 (the second form groups each weight with the control
variate it cancels against).

Under the marginal sensitivity model at every step (the per-step model of Namkoong, Keramati, Yadlowsky & Brunskill
2020, "Off-policy policy evaluation for sequential decisions under unobserved confounding", NeurIPS, §3, where an
unrecorded U may act at *every* step), each true inverse weight lies in its step's box [A_s, B_s], so the cumulative
weight lies in the product box w_{0:t} ∈ [Π_{s≤t} π_s A_s, Π_{s≤t} π_s B_s] (every factor positive). The largest and
smallest DR_i over the boxes are bounded term by term in the second form, each w_{0:t} taking the end of its box that
pushes its residual — a Horvitz–Thompson box bound as above: valid for any Γ-bounded confounder acting at any step,
not sharp (it lets the w_{0:t} of one entity take ends no single confounder gives together, and ignores that weights
average to one: Bruns-Smith, Dukes, Feller &
Ogburn 2023, "Robust fitted-Q evaluation and iteration under sequentially exogenous unobserved confounders",
arXiv 2302.00662, tighten it with a fitted-Q recursion no secure sum carries). At Γ = 1 both ends are the sequential
DR value itself. A site sends per policy and Γ the n, Σ, Σ² of each end (``hsens.<π>.g<k>.hi|lo.sum|sumsq``) and of
the ends of the contrast with the reference (``hsens.<π>.g<k>.dhi|dlo.sumsq``: the bound of a contrast is the
difference of the bounds, hi(π) − lo(ref) and lo(π) − hi(ref), so only its spread needs a sum); a Γ whose weights
overflow float64 on a site is flagged (``hsens.<π>.g<k>.over``) and read as the outcome's whole range. A value whose
sequential DR is withheld for want of support has no bounds either (their Γ = 1 end is that number), nor its effects,
nor the ranking. The answer
(``sensitivity_horizon``) gives each value's and each effect's bounds at :data:`REPORTED`, each effect's smallest Γ
that could reverse its sign, and the smallest Γ at which **the ranking** at the horizon asked could change: the first
Γ at which the bounds' intervals of some two policies, the lower one ranked above at Γ = 1, meet (the interval of a
contrast of two policies takes z·(se₁ + se₂), which no correlation can exceed, so the Γ is never read too late).
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

__all__ = ["GAMMAS", "REPORTED", "HorizonSensitivity", "Sensitivity", "bound_sums", "box_bound_terms",
           "merge_horizon_sensitivity",
           "sequential_box_terms"]

#: the Γ grid the sites compute (the smallest one that reverses the sign is read on it)
GAMMAS = (1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 10.0)
#: the Γ values every answer prints (issue 43 item 3)
REPORTED = (1.0, 1.25, 1.5, 2.0, 3.0)
#: what the bounds rest on, printed with them
MODEL = ("marginal sensitivity model (Tan 2006): an unrecorded confounder moves each step's odds of the logged action "
         "by at most Γ; Horvitz–Thompson box bounds of the one-step AIPW effect (valid, conservative)")
#: what the horizon bounds rest on
HORIZON_MODEL = ("marginal sensitivity model at every step (Tan 2006; Namkoong et al. 2020): an unrecorded confounder "
                 "moves each step's odds of the logged action by at most Γ; box bounds of the sequential doubly robust "
                 "values over the cumulative weights (valid, conservative)")


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


def bound_sums(Y, M, T, P, mu_on, mu_off, a_on: int, a_off: int, gammas: tuple[float, ...] = GAMMAS) -> SiteSums:
    """One site's ``sens.*`` sums (module docstring) over its rows: per Γ of ``gammas`` (``sens.g<k>``, k its
    index) and side, the per-entity sums S of :func:`box_bound_terms` (an entity's steps are one cluster) as Σ S, Σ S²
    and Σ S·m, with the shared ``sens.n|m|mm`` (m: an entity's valid steps)."""
    m = (M > 0).sum(1).astype(np.float64)
    out: SiteSums = {"sens.n": float(len(Y)), "sens.m": float(m.sum()), "sens.mm": float((m * m).sum())}
    for k, g in enumerate(gammas):
        for side, terms in zip(("hi", "lo"), box_bound_terms(Y, M, T, P, mu_on, mu_off, a_on, a_off, g)):
            S = terms.sum(1)
            out.update({f"sens.g{k}.{side}.s": float(S.sum()), f"sens.g{k}.{side}.ss": float((S * S).sum()),
                        f"sens.g{k}.{side}.sm": float((S * m).sum())})
    return out


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
        return bound_sums(sub.Y, sub.M, sub.T, sub.P, mu_on, mu_off, a_on, a_off)

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


# -- over the horizon asked ----------------------------------------------------------------------------------------
def sequential_box_terms(Y, M, P, pi, q_hat, v_hat, horizon: int, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Per entity ``[n]``: the largest and smallest sequential DR_i (``queries.sequential_dr``) over every cumulative
    weight in its product box at Γ (module docstring, "Over the horizon asked"); non-finite where a box's end
    overflows float64. At Γ = 1 both are DR_i.

    Raises:
        ValueError: Γ < 1, or a valid step's propensity outside (0, 1].
    """
    if gamma < 1.0:
        raise ValueError(f"the sensitivity parameter Γ must be at least 1, got {gamma}")
    H = min(int(horizon), np.asarray(Y).shape[1])
    valid = np.asarray(M)[:, :H] > 0
    P = np.where(valid, np.asarray(P, dtype=np.float64)[:, :H], 1.0)
    if not ((P > 0) & (P <= 1)).all():
        raise ValueError("sequential_box_terms: a valid step has a propensity outside (0, 1]")
    pi = np.where(valid, np.asarray(pi, dtype=np.float64)[:, :H], 1.0)
    # c_i M_{i,t}: the per-step value's scale (``evaluation.ope.PerDecisionDR``, undiscounted, per valid step)
    scale = valid / np.maximum(valid.sum(1, keepdims=True), 1)
    with np.errstate(over="ignore", invalid="ignore"):
        lo_w = np.cumprod(np.where(valid, pi * (1.0 + (1.0 / P - 1.0) / gamma), 1.0), axis=1)
        hi_w = np.cumprod(np.where(valid, pi * (1.0 + (1.0 / P - 1.0) * gamma), 1.0), axis=1)
        v = np.where(valid, np.asarray(v_hat, np.float64)[:, :H], 0.0)
        v_next = np.concatenate([v[:, 1:], np.zeros((len(v), 1))], axis=1)
        # each w_{0:t} once, with its residual y_t − Q̂_t + V̂_{t+1}: the control variates stay paired with the
        # weights they cancel against (bounding w_{0:t} and w_{0:t−1} apart would lose that, and widen to the range)
        x = np.where(valid, np.asarray(Y, np.float64)[:, :H] - np.asarray(q_hat, np.float64)[:, :H] + v_next, 0.0)
        a, b = lo_w * x, hi_w * x  # the term at each end of its box
        hi = (scale * np.maximum(a, b)).sum(1) + scale[:, 0] * v[:, 0]
        lo = (scale * np.minimum(a, b)).sum(1) + scale[:, 0] * v[:, 0]
    return hi, lo


class HorizonSensitivity(Query):
    """Γ-bounds of each policy's sequential DR value and effect at the horizon asked (module docstring):
    ``hsens.*``. It reads the sequential DR's Q̂ and V̂ (computed once, ``queries.sequential_dr.sdr_history_q``) and
    simulates nothing of its own."""

    name = "hsens"

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        out = []
        for p in policy_names:
            out.append(f"hsens.{p}.n")
            for k in range(len(GAMMAS)):
                out += [f"hsens.{p}.g{k}.{side}.{f}" for side in ("hi", "lo") for f in ("sum", "sumsq")]
                out += [f"hsens.{p}.g{k}.{side}.sumsq" for side in ("dhi", "dlo")] + [f"hsens.{p}.g{k}.over"]
        return out

    def applies(self, ctx: SiteContext) -> bool:
        return not ctx.request.quick and ctx.request.whatif is not None

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.queries.policy_terms import rollouts  # noqa: PLC0415 - policy terms import the simulator
        from fcd_secure.queries.sequential_dr import sdr_history_q  # noqa: PLC0415

        sub = ctx.sub
        if sub.P is None or not sub.n:
            return {}
        terms = rollouts(ctx)
        got = sdr_history_q(ctx, terms)
        H, qv = got.horizon, got.qv
        with np.errstate(over="ignore", invalid="ignore"):
            ends = {r.name: [sequential_box_terms(sub.Y, sub.M, sub.P, r.pi, q, v, H, g) for g in GAMMAS]
                    for r, (q, v) in zip(terms.policies, qv)}
        ref = ctx.request.whatif.reference
        out: SiteSums = {}
        for name, per in ends.items():
            out[f"hsens.{name}.n"] = float(sub.n)
            for k, (hi, lo) in enumerate(per):
                sums = {"hi.sum": hi.sum(), "hi.sumsq": (hi * hi).sum(), "lo.sum": lo.sum(), "lo.sumsq": (lo * lo).sum()}
                if ref in ends:
                    r_hi, r_lo = ends[ref][k]
                    # the contrast's ends hi(π) − lo(ref) and lo(π) − hi(ref), per entity: their spread
                    with np.errstate(over="ignore", invalid="ignore"):
                        sums.update({"dhi.sumsq": ((hi - r_lo) ** 2).sum(), "dlo.sumsq": ((lo - r_hi) ** 2).sum()})
                over = not all(math.isfinite(float(x)) for x in sums.values())
                out[f"hsens.{name}.g{k}.over"] = float(over)
                out.update({f"hsens.{name}.g{k}.{f}": 0.0 if over else float(x) for f, x in sums.items()})
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        q = ctx.question
        names = [p for p in (q.names if q is not None else []) if totals.all_sent(f"hsens.{p}.n")]
        if not names:
            return
        # a value the sequential DR withholds (too little support, ``queries.sequential_dr``) has no bounds either:
        # their Γ = 1 end would be the withheld number
        pols = answer.get("policies") or {}
        withheld = {p: (pols.get(p) or {}).get("sequential_dr", {}).get("why") or "withheld"
                    for p in names if (pols.get(p) or {}).get("sequential_dr", {}).get("supported") is False}
        answer["sensitivity_horizon"] = merge_horizon_sensitivity(
            totals, names, q.reference, ctx.level, ctx.binary, horizon=q.horizon, withheld=withheld)


def _mean_se(n: float, total: float, sumsq: float) -> tuple[float, float]:
    mean = total / n
    return mean, (math.sqrt(max(sumsq - n * mean * mean, 0.0) / (n - 1) / n) if n > 1 else float("nan"))


def merge_horizon_sensitivity(s: Totals, names: list[str], reference: str | None, level: float, binary: bool,
                              horizon: int | None = None, gammas: tuple[float, ...] = GAMMAS,
                              withheld: dict[str, str] | None = None) -> dict[str, Any]:
    """Per policy the bounds of its value per Γ, per effect against ``reference`` its bounds and the smallest Γ that
    could reverse its sign, and the smallest Γ that could change the ranking (module docstring). ``withheld``: the
    policies whose sequential DR value is withheld, with why: they, their effects and the ranking get no bounds."""
    withheld = withheld or {}
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    v_lim = (0.0, 1.0) if binary else (-math.inf, math.inf)
    e_lim = (-1.0, 1.0) if binary else (-math.inf, math.inf)

    def cut(lo: float, hi: float, lim: tuple[float, float]) -> tuple[float, float]:
        return max(lo, lim[0]), min(hi, lim[1])

    values: dict[str, list[dict[str, Any]]] = {}
    raw: dict[str, list[tuple[float, float, float, float, bool]]] = {}
    for p in names:
        n = float(s[f"hsens.{p}.n"])
        rows, rr = [], []
        for k, g in enumerate(gammas):
            key = f"hsens.{p}.g{k}"
            over = float(s.get(f"{key}.over", 0.0)) > 0
            if over:
                lo = lo_se = hi = hi_se = math.nan
                low, high = v_lim[0], v_lim[1]
                low_ci, high_ci = low, high
            else:
                hi, hi_se = _mean_se(n, float(s[f"{key}.hi.sum"]), float(s[f"{key}.hi.sumsq"]))
                lo, lo_se = _mean_se(n, float(s[f"{key}.lo.sum"]), float(s[f"{key}.lo.sumsq"]))
                low, high = cut(lo, hi, v_lim)
                low_ci, high_ci = cut(lo - z * lo_se, hi + z * hi_se, v_lim)
            rows.append({"gamma": g, "low": low, "high": high, "low_ci": low_ci, "high_ci": high_ci,
                         "unbounded": over})
            rr.append((lo, lo_se, hi, hi_se, over))
        values[p], raw[p] = rows, rr
    effects: dict[str, dict[str, Any]] = {}
    if reference in raw:
        for p in names:
            if p == reference:
                continue
            if p in withheld or reference in withheld:
                effects[p] = {"reference": reference, "withheld": withheld.get(p) or withheld[reference]}
                continue
            n = float(s[f"hsens.{p}.n"])
            rows = []
            for k, g in enumerate(gammas):
                lo, _, hi, _, over = raw[p][k]
                r_lo, _, r_hi, _, r_over = raw[reference][k]
                key = f"hsens.{p}.g{k}"
                if over or r_over or f"{key}.dhi.sumsq" not in s:
                    rows.append({"gamma": g, "low": e_lim[0], "high": e_lim[1], "low_ci": e_lim[0],
                                 "high_ci": e_lim[1], "unbounded": True})
                    continue
                dhi, dhi_se = _mean_se(n, (hi - r_lo) * n, float(s[f"{key}.dhi.sumsq"]))
                dlo, dlo_se = _mean_se(n, (lo - r_hi) * n, float(s[f"{key}.dlo.sumsq"]))
                low, high = cut(dlo, dhi, e_lim)
                low_ci, high_ci = cut(dlo - z * dlo_se, dhi + z * dhi_se, e_lim)
                rows.append({"gamma": g, "low": low, "high": high, "low_ci": low_ci, "high_ci": high_ci,
                             "unbounded": False})
            first = rows[0]
            sign = 1 if first["low_ci"] > 0 else -1 if first["high_ci"] < 0 else 0
            flip = next((r["gamma"] for r in rows if r["low_ci"] <= 0 <= r["high_ci"]), None)
            effects[p] = {"reference": reference, "bounds": [r for r in rows if r["gamma"] in REPORTED],
                          "grid": rows, "sign_at_1": sign, "gamma_sign_change": flip}
    # the ranking at Γ = 1 (the estimates), and the first Γ at which two policies' bounds could swap them
    order = sorted(names, key=lambda p: -raw[p][0][2] if not raw[p][0][4] else math.inf)
    ranking_flip, tied_at_1 = None, False
    for k, g in enumerate(gammas if not withheld else ()):
        swap = False
        for i, upper in enumerate(order):
            for lower in order[i + 1:]:
                u_lo, u_se, _, _, u_over = raw[upper][k]
                _, _, l_hi, l_se, l_over = raw[lower][k]
                # the contrast upper − lower could be ≤ 0: its lowest end with sampling error reaches 0
                if u_over or l_over or (u_lo - l_hi) - z * (u_se + l_se) <= 0:
                    swap = True
        if swap:
            ranking_flip, tied_at_1 = g, k == 0
            break
    return {"estimand": "sequential doubly robust policy values over the horizon asked", "model": HORIZON_MODEL,
            "level": level, "horizon": horizon,
            "values": {p: {"withheld": withheld[p]} if p in withheld else
                       {"bounds": [r for r in values[p] if r["gamma"] in REPORTED], "grid": values[p]} for p in names},
            "effects": effects, "ranking": [] if withheld else order, "ranking_tied_at_1": tied_at_1,
            "ranking_withheld": sorted(withheld) or None,
            "gamma_ranking_change": ranking_flip, "gamma_max": gammas[-1]}

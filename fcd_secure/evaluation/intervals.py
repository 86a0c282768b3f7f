"""Intervals for policy values and effects that a server computes from consortium sums alone.

The question "what happens under π" is answered by a mean over entities (students, patients) of a per-entity
quantity x_i: a policy value v_i(π) (the per-step average simulated outcome), or a contrast
d_i = v_i(π) − v_i(π_ref). Each v_i is itself a Monte-Carlo mean over S simulated futures of the diffusion model.
The interval must cover the population mean E[x] while no x_i leaves its site, and while the server sees only the
*sum* over sites of what each site sends (secure aggregation adds the sites' vectors before anyone reads them).

Design: each site sends, per quantity, three additive sums — n, Σx_i, Σx_i² — and Σ s²_i / S, the Monte-Carlo
variance of its entities' values (s²_i the sample variance of entity i's S simulated values). From the consortium
totals the server forms the pooled mean m = Σx / n, the between-entity variance s² = (Σx² − n m²) / (n − 1) and the
normal interval m ± z_{1−α/2} · s / √n (the central limit theorem over entities; the default level is 90 %).

What the interval covers:

* the between-entity spread: which population the test entities are a sample of;
* the diffusion-sample spread: each x_i averages S simulated futures, so its Monte-Carlo noise is part of the
  between-entity variance; ``mc_share`` = (Σ s²_i / S / n) / s² says how much of the width more samples per entity
  would remove;
* not the model's own error: a simulator that is biased (e.g. effects attenuated towards zero) gives a tight
  interval around the wrong value. On a dataset with a ground truth ``benchmarks/intervals.py`` measures how often
  the interval covers the truth, which is where such bias shows. ``queries.policy_values`` also reports a *rectified*
  value, the mean of v_i(π) − r_i with r_i the simulator's error on entity i's logged actions (prediction-powered
  inference, Angelopoulos et al. 2023, Science 382), whose interval also covers a bias the simulator shows on the
  factual data — under the stated assumption that the bias is the same under π;
* the model's error under π itself, where sites log propensities: the *doubly robust* value of
  ``queries.doubly_robust`` (per-decision DR, Jiang & Li 2016, ICML; Thomas & Brunskill 2016, ICML) is, per entity, the
  simulated value plus the importance-weighted error of the simulator on the logged steps that π could have taken.
  Its mean is unbiased whatever the simulator's bias (the propensities being right), so the same three sums give an
  interval that covers the truth at its nominal level — on the steps where logged data supports π. Where no logged
  trajectory still follows π every weight is zero and the DR value is the simulator's again (``support`` says how
  much of the window is supported); no interval built from logged data alone can honestly cover a bias there.

Where weights are heavy-tailed the doubly robust interval is too narrow, in a way no sum of the sample can show:
the entities π would reach but the behaviour policy rarely does carry weights of 1/μ (logged propensities down to a
few thousandths), a typical sample holds none of them, and its estimate and variance both leave them out. What the
sample *does* show is how much it missed. For a policy with π(a|h) ∈ {0, 1} and true propensities, the cumulative
weight has E[w_{0:t}] = 1 at every step, so B_t = (1 − mean_i w_{i,0:t})⁺ is the share of π's distribution at step t
that the logged sample did not reach. On that share the doubly robust value kept the model's prediction v̂_t of
entities it cannot name (the sample lacks them), so that fill lies anywhere between B_t · min_i v̂_it and
B_t · max_i v̂_it; the outcome there could be anything in its range, so :func:`unseen_mass_sums` and
:func:`unseen_bounds` widen the interval by B_t times the most the truth could lie below (max v̂_t − 0) or above
(1 − min v̂_t) the model on those steps. (Pricing the share at the model's *average* v̂_t would
assume the missed entities are typical ones: under strong confounding they are not — the model errs most where the
logging policy keeps entities away from π; docs/whatif.md, "Strong confounding", and ``benchmarks/intervals.py
--synthetic`` measure both. B_t comes from the same
weights as the estimate, so the ends move with the sample as well: with ``dr=`` a site also sends n, Σ, Σ² of each
end's per-entity terms and the interval takes their spread at each end.) These are
the worst-case bounds of Manski (1990, "Nonparametric bounds on treatment effects", AER 80(2)) applied to the part
of π that the data did not observe. They need an outcome in [0, 1] (binary outcomes) and the logged propensities
being right; nothing about the model. Each site forms B_t on its own test entities (a positive part per site,
which is more conservative than one consortium-wide B_t and needs no per-step sums): two more sums per policy.
The bounds give a set, not a point: [DR − unseen below, DR + unseen above]. The interval around the set takes the
critical value of Imbens & Manski (2004) on each side (:func:`imbens_manski_critical`): it covers the true value at
the nominal level, where the union of two-sided intervals at both ends would cover the whole set and over-cover the
value. Where the sample reached all of π (B_t = 0) the interval is the doubly robust one; where it reached nothing
it spans the outcome range.

Why no bootstrap over entities: a Poisson bootstrap (Chamandy et al. 2012) is additive too — each site would send
Σ_i w_ib x_i for replicates b = 1..B — but the server could recompute weights drawn from the run's seed and solve
B ≥ n such equations for every x_i, and even with weights secret to the site the replicates disclose higher moments
of the per-entity values. Two sums per quantity disclose exactly what the interval needs, and the known-answer test
(normal data with a known mean) shows the normal interval at its nominal coverage.

Everything here is numpy; sites call :func:`site_sums`, the server :func:`interval_from_sums`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["SUM_FIELDS", "UNSEEN_END_FIELDS", "UNSEEN_FIELDS", "Interval", "cluster_pair_names", "cluster_ratio",
           "cluster_sums",
           "imbens_manski_critical", "interval_from_sums", "linear_cluster_ss", "reached_mass", "site_sums",
           "unseen_bounds", "unseen_mass_sums"]

#: the sums one quantity contributes (``<prefix>.<field>``); ``mc_var`` only where the quantity is a Monte-Carlo mean
SUM_FIELDS = ("n", "sum", "sumsq", "mc_var")
#: the sums of the unseen-mass bounds of a doubly robust quantity (``<prefix>.<field>``): the rooms below and above,
#: and n, Σ, Σ² of each end's per-entity terms (the spread of the ends, which prices B_t's own sampling error)
UNSEEN_FIELDS = ("unseen_lo", "unseen_hi")
UNSEEN_END_FIELDS = ("unseen_lo_n", "unseen_lo_sum", "unseen_lo_sumsq", "unseen_hi_n", "unseen_hi_sum",
                     "unseen_hi_sumsq")


def site_sums(prefix: str, x: np.ndarray, mc_var: np.ndarray | None = None) -> dict[str, float]:
    """The additive sums of one quantity on one site (module docstring).

    Args:
        prefix: the quantity's key prefix (e.g. ``whatif.value.never``).
        x: per-entity values ``[n]``.
        mc_var: per-entity Monte-Carlo variance of ``x`` (within-entity sample variance / S), ``[n]``.

    Returns:
        ``{prefix.n, prefix.sum, prefix.sumsq[, prefix.mc_var]}``.

    Raises:
        ValueError: ``x`` is not one-dimensional, or holds non-finite values.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{prefix}: x must be [n], got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{prefix}: non-finite per-entity values")
    out = {f"{prefix}.n": float(x.size), f"{prefix}.sum": float(x.sum()), f"{prefix}.sumsq": float((x * x).sum())}
    if mc_var is not None:
        out[f"{prefix}.mc_var"] = float(np.asarray(mc_var, dtype=np.float64).sum())
    return out


def cluster_pair_names(fields: tuple[str, ...]) -> list[tuple[str, str]]:
    """The pairs (k, l), k at or before l in ``fields``' order, whose product sums :func:`cluster_sums` sends."""
    return [(k, l) for i, k in enumerate(fields) for l in fields[i:]]


def cluster_sums(prefix: str, X: dict[str, np.ndarray]) -> dict[str, float]:
    """The additive sums of a few per-entity quantities X_k,i (``[n]`` each, in ``X``'s order): Σ_i X_k,i
    (``<prefix>.<k>``) and Σ_i X_k,i X_l,i (``<prefix>.<k>.<l>``, :func:`cluster_pair_names`). They are what the
    linearised (cluster-robust) variance of any statistic linear in the quantities needs (:func:`linear_cluster_ss`):
    an estimator whose steps within one entity are not independent is linearised over entities (the sandwich
    variance for clustered data; Liang & Zeger 1986, Biometrika 73:13-22). Nothing per entity leaves."""
    fields = tuple(X)
    out = {f"{prefix}.{k}": float(np.sum(X[k])) for k in fields}
    out.update({f"{prefix}.{k}.{l}": float(np.sum(np.asarray(X[k]) * np.asarray(X[l])))
                for k, l in cluster_pair_names(fields)})
    return out


def cluster_ratio(s: float, ss: float, sm: float, n: float, m: float, mm: float) -> tuple[float, float]:
    """θ = ΣS_i / Σm_i and its linearised cluster-robust standard error, from the sums over entities i of S_i (an
    entity's summed per-step terms), S_i², S_i m_i, m_i (its steps) and m_i²: the variance of a ratio of cluster sums
    Σ_i (S_i − θ m_i)² / (Σ m_i)² with the n/(n−1) small-sample factor (the sandwich over entities, Liang & Zeger 1986,
    Biometrika 73:13-22; the delta method for a ratio estimator, Cochran 1977, "Sampling Techniques", §6.4).

    Args:
        s, ss, sm: ΣS_i, ΣS_i², ΣS_i m_i.
        n, m, mm: the entities, Σm_i and Σm_i².

    Raises:
        ValueError: no step (m ≤ 0).
    """
    if m <= 0:
        raise ValueError("cluster_ratio: no step to average over")
    theta = s / m
    resid = ss - 2 * theta * sm + theta * theta * mm
    return theta, math.sqrt(max(resid, 0.0) * n / max(n - 1, 1.0)) / m


def linear_cluster_ss(total: dict[str, Any], prefix: str, fields: tuple[str, ...], coef: dict[str, float]) -> float:
    """Σ_i (Σ_k c_k X_k,i)² from the totals of :func:`cluster_sums` (``fields`` in the order they were sent)."""
    ss = 0.0
    for k, l in cluster_pair_names(fields):
        c = coef.get(k, 0.0) * coef.get(l, 0.0) * float(total[f"{prefix}.{k}.{l}"])
        ss += c if k == l else 2 * c
    return ss


@dataclass(frozen=True)
class Interval:
    """A pooled mean with its normal interval.

    Attributes:
        estimate: the pooled mean Σx / n.
        low, high: estimate ∓ z_{1−α/2} · se.
        se: the standard error s / √n.
        sd: the between-entity standard deviation s.
        level: the nominal coverage (e.g. 0.9).
        n: entities.
        mc_share: the share of the between-entity variance that is Monte-Carlo noise of the simulator (None if
            unknown).
    """

    estimate: float
    low: float
    high: float
    se: float
    sd: float
    level: float
    n: int
    mc_share: float | None

    def covers(self, value: float) -> bool:
        """Whether ``value`` lies in the interval."""
        return bool(self.low <= value <= self.high)

    def to_dict(self) -> dict[str, Any]:
        """The fields by name."""
        return asdict(self)


def interval_from_sums(total: dict[str, Any], prefix: str, level: float = 0.9) -> Interval:
    """The interval of quantity ``prefix`` from consortium totals (the sum over sites of :func:`site_sums`).

    Args:
        total: the summed keys.
        prefix: the quantity's key prefix.
        level: nominal coverage in (0, 1).

    Raises:
        KeyError: a sum of the quantity is missing.
        ValueError: ``level`` outside (0, 1), or no entity.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n = float(total[f"{prefix}.n"])
    if n <= 0:
        raise ValueError(f"{prefix}: no entity")
    s1, s2 = float(total[f"{prefix}.sum"]), float(total[f"{prefix}.sumsq"])
    mean = s1 / n
    var = max(s2 - n * mean * mean, 0.0) / (n - 1) if n > 1 else float("nan")
    se = math.sqrt(var / n) if n > 1 else float("nan")
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    mc = total.get(f"{prefix}.mc_var")
    mc_share = float(min(1.0, (float(mc) / n) / var)) if mc is not None and n > 1 and var > 0 else None
    return Interval(estimate=mean, low=mean - z * se, high=mean + z * se, se=se, sd=math.sqrt(var) if n > 1 else float("nan"),
                    level=level, n=int(n), mc_share=mc_share)


def reached_mass(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The mean cumulative weight at each step over the entities valid there (``scale > 0``), ``[H]``: 1 where a
    sample reached all of π in expectation, below 1 by the share it missed (1 at a step no entity reaches)."""
    w, valid = np.asarray(w, dtype=np.float64), np.asarray(scale) > 0
    n_t = valid.sum(axis=0)
    return np.where(n_t > 0, np.where(valid, w, 0.0).sum(axis=0) / np.maximum(n_t, 1), 1.0)


def unseen_mass_sums(prefix: str, w: np.ndarray, scale: np.ndarray, v_hat: np.ndarray,
                     dr: np.ndarray | None = None) -> dict[str, float]:
    """One site's sums of the unseen-mass bounds of a doubly robust value (module docstring).

    Args:
        prefix: the quantity's key prefix (e.g. ``whatif.dr.always``).
        w: cumulative importance weights w_{0:t} of a policy with π(a|h) ∈ {0, 1}, ``[n, H]``.
        scale: each step's share of the entity's value, c_i γ^t M_{i,t} (0 on padding), ``[n, H]``.
        v_hat: the model's expected outcome under π at each step, in [0, 1], ``[n, H]``.
        dr: each entity's doubly robust value ``[n]``: then also the sums of :data:`UNSEEN_END_FIELDS`, the per-entity
            terms of each end of the set, l_i = DR_i − Σ_t s_it (1 − w_it) max v̂_t (and + (1 − min v̂_t) above) over
            the steps with B_t > 0, whose spread tells how much the ends move with the sample (B_t comes from the
            same weights as the estimate); :func:`unseen_bounds` then takes that spread.

    Returns:
        ``{prefix.unseen_lo: Σ_t B_t max_i v̂_it Σ_i scale_it, prefix.unseen_hi: Σ_t B_t (1 − min_i v̂_it) Σ_i
        scale_it}`` with B_t = (1 − mean of w_{0:t} over the entities valid at t)⁺ and the extremes over the entities
        valid at t.

    Raises:
        ValueError: shapes differ, a weight is negative or not finite, or a valid v̂ lies outside [0, 1].
    """
    w, scale, v = (np.asarray(a, dtype=np.float64) for a in (w, scale, v_hat))
    if w.ndim != 2 or w.shape != scale.shape or w.shape != v.shape:
        raise ValueError(f"{prefix}: w, scale and v_hat must share one [n, H] shape, got {w.shape}, {scale.shape}, {v.shape}")
    valid = scale > 0
    if not (np.isfinite(w[valid]).all() and (w[valid] >= 0).all()):
        raise ValueError(f"{prefix}: importance weights must be finite and >= 0")
    if ((v[valid] < 0) | (v[valid] > 1)).any():
        raise ValueError(f"{prefix}: v_hat must lie in [0, 1] (the bounds need an outcome in [0, 1])")
    missed = np.clip(1.0 - reached_mass(w, scale), 0.0, 1.0)  # E[w_{0:t}] = 1: what the sample's weights fall short of
    # Who makes up the missed share is unknown (the sample lacks them), so the model's fill there lies anywhere between
    # its lowest and highest prediction at the step, not at its average: under strong confounding the model errs most
    # on exactly the entities the logging policy keeps away from π (priced at the average, the interval
    # under-covered: docs/whatif.md)
    s = np.where(valid, scale, 0.0).sum(axis=0)
    v_max = np.where(valid, v, 0.0).max(axis=0, initial=0.0)
    v_min = np.where(valid, v, 1.0).min(axis=0, initial=1.0)
    out = {f"{prefix}.unseen_lo": float((missed * v_max * s).sum()),
           f"{prefix}.unseen_hi": float((missed * (1.0 - v_min) * s).sum())}
    if dr is not None:
        d = np.asarray(dr, dtype=np.float64)
        if d.shape != (w.shape[0],) or not np.isfinite(d).all():
            raise ValueError(f"{prefix}: dr must be [n] finite values, one per row of w")
        gap = np.where(valid, scale * (1.0 - w), 0.0) * (missed > 0)  # an entity's share of what its step missed
        for side, end in (("lo", d - (gap * v_max).sum(axis=1)), ("hi", d + (gap * (1.0 - v_min)).sum(axis=1))):
            out.update({f"{prefix}.unseen_{side}_n": float(d.size), f"{prefix}.unseen_{side}_sum": float(end.sum()),
                        f"{prefix}.unseen_{side}_sumsq": float((end * end).sum())})
    return out


def imbens_manski_critical(width_over_se: float, level: float) -> float:
    """The critical value C of Imbens & Manski (2004, "Confidence intervals for partially identified parameters",
    Econometrica 72(6)): Φ(C + Δ/σ) − Φ(−C) = level, with Δ the estimated width of the identified set and σ the
    standard error of its bounds.

    C is z_{1−α/2} when the set is a point (Δ = 0) and falls to z_{1−α} as the set widens: a wide set's true value
    lies near at most one of its ends, so each end needs one-sided coverage only. [lower − Cσ, upper + Cσ] then
    covers the *parameter* at the nominal level, where the union of the two two-sided intervals covers the whole set
    and over-covers the parameter.

    Raises:
        ValueError: ``level`` outside (0, 1), or a negative or non-finite ``width_over_se``.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if not (math.isfinite(width_over_se) and width_over_se >= 0):
        raise ValueError(f"the set's width over its standard error must be finite and >= 0, got {width_over_se}")
    nd = NormalDist()
    lo, hi = nd.inv_cdf(level), nd.inv_cdf(1 - (1 - level) / 2)  # the root lies between z_{1−α} and z_{1−α/2}
    for _ in range(60):  # the left side increases in C: bisection to far below any printed digit
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if nd.cdf(mid + width_over_se) - nd.cdf(-mid) < level else (lo, mid)
    return hi


def unseen_bounds(iv: Interval, total: dict[str, Any], plus: str, minus: str | None = None) -> dict[str, float]:
    """The doubly robust estimate's interval with the unseen-mass bounds (module docstring), from consortium totals.

    The bounds make the target partially identified: the set [estimate − unseen_low, estimate + unseen_high]. The
    interval around it takes :func:`imbens_manski_critical` times the standard error on each side, so it covers the
    true value (not the whole set) at ``iv.level``; it equals ``iv`` where the sample reached all of π and is never
    narrower than ``iv``, except that it is cut to the range the target can take ([0, 1] for a value of an outcome
    in [0, 1], [−1, 1] for a contrast), which loses no coverage.

    Args:
        iv: the doubly robust interval (:func:`interval_from_sums`).
        total: the summed keys, with :data:`UNSEEN_FIELDS` of ``plus`` (and ``minus``).
        plus: the prefix of the policy whose value ``iv`` is (or the first term of a contrast).
        minus: for a contrast v(π) − v(ref), the reference's prefix: its unseen part enters with the opposite sign.

    Returns:
        ``{low, high, unseen_low, unseen_high, critical, se_low, se_high}``: the interval, how far the set reaches
        below and above the estimate, the critical value used and the standard error taken at each end (the spread
        of the ends' per-entity terms where the sums of :data:`UNSEEN_END_FIELDS` are there, never below the
        estimate's; a contrast takes the estimate's).

    Raises:
        KeyError: a sum is missing.
    """
    n = float(iv.n)
    down = float(total[f"{plus}.unseen_lo"]) / n
    up = float(total[f"{plus}.unseen_hi"]) / n
    if minus is not None:
        down += float(total[f"{minus}.unseen_hi"]) / n
        up += float(total[f"{minus}.unseen_lo"]) / n
    lo_range = 0.0 if minus is None else -1.0
    # the ends' own spread where the sites sent it (a value, not a contrast): never below the estimate's
    se_lo = se_hi = iv.se
    if minus is None and all(f"{plus}.{f}" in total for f in UNSEEN_END_FIELDS):
        se_lo = max(iv.se, _se_of(total, f"{plus}.unseen_lo"))
        se_hi = max(iv.se, _se_of(total, f"{plus}.unseen_hi"))
    if not (math.isfinite(iv.se) and iv.se > 0):  # one entity, or no spread: no sampling error to weigh the set by
        low, high, c = iv.low - down, iv.high + up, float("nan")
    else:
        c = imbens_manski_critical((down + up) / max(se_lo, se_hi), iv.level)
        low, high = iv.estimate - down - c * se_lo, iv.estimate + up + c * se_hi
    # a DR estimate of heavy weights can itself lie outside the range; the cut interval then shrinks to the nearest end
    low, high = min(max(low, lo_range), 1.0), max(min(high, 1.0), lo_range)
    return {"low": low, "high": high, "unseen_low": down, "unseen_high": up, "critical": c, "se_low": se_lo,
            "se_high": se_hi}


def _se_of(total: dict[str, Any], prefix: str) -> float:
    """The standard error of the mean of ``prefix``'s per-entity terms from their sums ``_n``, ``_sum``, ``_sumsq``."""
    n = float(total[f"{prefix}_n"])
    if n <= 1:
        return float("nan")
    mean = float(total[f"{prefix}_sum"]) / n
    return math.sqrt(max(float(total[f"{prefix}_sumsq"]) - n * mean * mean, 0.0) / (n - 1) / n)

"""Intervals for policy values and effects that a server computes from consortium sums alone.

The question "what happens under π" is answered by a mean over entities (students, patients) of a per-entity
quantity x_i: a policy value v_i(π) (the per-step average simulated outcome), or a contrast
d_i = v_i(π) − v_i(π_ref). Each v_i is itself a Monte-Carlo mean over S simulated futures of the diffusion model.
The interval must cover the population mean E[x] while no x_i ever leaves its site, and while the server sees only
the *sum* over sites of what each site sends (secure aggregation adds the sites' vectors before anyone reads them).

Design: a **Poisson bootstrap over entities** (Hanley & MacGibbon 2006; Chamandy et al. 2012, "Estimating
uncertainty for massive data streams"). For replicate b = 1..B every entity gets an independent weight
w_ib ~ Poisson(1), drawn on its own site; the site sends, per quantity, Σ_i w_ib x_i and once Σ_i w_ib, besides
n, Σ x_i and Σ x_i². These are additive: the sum over sites of each replicate is exactly the replicate a pooled
Poisson bootstrap would have drawn, so the server's replicate means
    m_b = Σ_sites Σ_i w_ib x_i / Σ_sites Σ_i w_ib
form a bootstrap distribution of the pooled mean without any per-entity value, any per-site value (under secure
aggregation) or any shared random numbers. The reported interval is the percentile interval of the m_b at the
requested level (default 90 %); the normal interval m ± z·se from Σx, Σx² (CLT) is reported beside it.

What the interval covers:

* the between-entity spread (which population the test entities are a sample of);
* the diffusion-sample spread: each x_i is an average of S simulated futures, so its Monte-Carlo noise is part of
  the between-entity variance the bootstrap resamples; ``mc_share`` (from Σ s²_i / S, the within-entity sample
  variance over S) says how much of the interval's width more samples per entity would remove;
* not the model's own error: a simulator that is biased (e.g. effects attenuated towards zero) gives a tight
  interval around the wrong value. On a dataset with a ground truth the benchmark (``benchmarks/intervals.py``)
  measures how often the interval covers the truth, which is where such bias shows.

The same machinery gives the *rectified* value of ``federation.whatif``: the per-entity quantity is then
v_i(π) − r_i with r_i the simulator's error on the entity's logged actions (prediction-powered inference, Angelopoulos
et al. 2023), so the interval also covers a bias the simulator shows on the factual data — under the stated
assumption that the bias is the same under π.

Everything here is numpy; sites call :func:`site_sums`, the server :func:`interval_from_sums`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["BOOT_N_KEY", "Interval", "interval_from_sums", "poisson_weights", "site_sums"]

#: key of the replicate weight totals Σ_i w_ib (one list per site, shared by every quantity of a query)
BOOT_N_KEY = "boot.n"


def poisson_weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    """Replicate weights w_ib ~ Poisson(1), float64 ``[n_boot, n]``, from ``seed`` (one site's own stream).

    Raises:
        ValueError: ``n_boot`` < 1.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0xB007])).poisson(
        1.0, size=(int(n_boot), int(n))).astype(np.float64)


def site_sums(prefix: str, x: np.ndarray, weights: np.ndarray, mc_var: np.ndarray | None = None) -> dict[str, Any]:
    """The additive sums of one quantity on one site (module docstring).

    Args:
        prefix: the quantity's key prefix (e.g. ``whatif.value.never``).
        x: per-entity values ``[n]``.
        weights: the site's replicate weights ``[B, n]`` (:func:`poisson_weights`), the same for every quantity of
            a query so that contrasts and values are resampled jointly.
        mc_var: per-entity Monte-Carlo variance of ``x`` (within-entity sample variance / S), ``[n]``.

    Returns:
        ``{prefix.n, prefix.sum, prefix.sumsq, prefix.boot (list of B), [prefix.mc_var]}``; the caller adds
        ``{BOOT_N_KEY: weights.sum(1)}`` once.

    Raises:
        ValueError: shapes that do not match, or non-finite values.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if x.ndim != 1 or w.ndim != 2 or w.shape[1] != x.shape[0]:
        raise ValueError(f"{prefix}: x must be [n] and weights [B, n], got {x.shape} and {w.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{prefix}: non-finite per-entity values")
    out: dict[str, Any] = {
        f"{prefix}.n": float(x.size),
        f"{prefix}.sum": float(x.sum()),
        f"{prefix}.sumsq": float((x * x).sum()),
        f"{prefix}.boot": [float(v) for v in w @ x],
    }
    if mc_var is not None:
        out[f"{prefix}.mc_var"] = float(np.asarray(mc_var, dtype=np.float64).sum())
    return out


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile-bootstrap and normal intervals.

    Attributes:
        estimate: the pooled mean Σx / n.
        low, high: the percentile-bootstrap interval at ``level``.
        normal_low, normal_high: estimate ∓ z·se with se from Σx, Σx² (the CLT interval).
        se: the standard error √(s² / n).
        boot_se: the standard deviation of the bootstrap replicate means.
        level: the nominal coverage (e.g. 0.9).
        n: entities.
        n_boot: usable replicates.
        mc_share: the share of the per-entity variance that is Monte-Carlo noise of the simulator (None if unknown).
    """

    estimate: float
    low: float
    high: float
    normal_low: float
    normal_high: float
    se: float
    boot_se: float
    level: float
    n: int
    n_boot: int
    mc_share: float | None

    def covers(self, value: float, method: str = "bootstrap") -> bool:
        """Whether ``value`` lies in the interval (``method``: 'bootstrap' or 'normal')."""
        lo, hi = (self.low, self.high) if method == "bootstrap" else (self.normal_low, self.normal_high)
        return bool(lo <= value <= hi)

    def to_dict(self) -> dict[str, Any]:
        """The fields by name."""
        return asdict(self)


def interval_from_sums(total: dict[str, Any], prefix: str, level: float = 0.9) -> Interval:
    """The interval of quantity ``prefix`` from consortium totals (the element-wise sum over sites of
    :func:`site_sums`, plus ``BOOT_N_KEY``).

    Args:
        total: the summed keys.
        prefix: the quantity's key prefix.
        level: nominal coverage in (0, 1).

    Raises:
        KeyError: a key of the quantity (or ``BOOT_N_KEY``) is missing.
        ValueError: ``level`` outside (0, 1), no entity, or replicate lists of different lengths.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n = float(total[f"{prefix}.n"])
    if n <= 0:
        raise ValueError(f"{prefix}: no entity")
    s1, s2 = float(total[f"{prefix}.sum"]), float(total[f"{prefix}.sumsq"])
    boot = np.asarray(total[f"{prefix}.boot"], dtype=np.float64)
    bn = np.asarray(total[BOOT_N_KEY], dtype=np.float64)
    if boot.shape != bn.shape:
        raise ValueError(f"{prefix}: {boot.size} replicate sums but {bn.size} replicate weights")
    mean = s1 / n
    var = max(s2 / n - mean * mean, 0.0) * (n / (n - 1) if n > 1 else float("nan"))
    se = math.sqrt(var / n) if n > 1 else float("nan")
    ok = bn > 0
    reps = boot[ok] / bn[ok]
    alpha = 1.0 - level
    if reps.size >= 2:
        lo, hi = (float(v) for v in np.quantile(reps, [alpha / 2, 1 - alpha / 2]))
        bse = float(reps.std(ddof=1))
    else:
        lo = hi = bse = float("nan")
    z = NormalDist().inv_cdf(1 - alpha / 2)
    mc = total.get(f"{prefix}.mc_var")
    mc_share = None
    if mc is not None and var > 0 and math.isfinite(var):
        mc_share = float(min(1.0, (float(mc) / n) / var))
    return Interval(
        estimate=mean, low=lo, high=hi, normal_low=mean - z * se, normal_high=mean + z * se, se=se, boot_se=bse,
        level=level, n=int(n), n_boot=int(reps.size), mc_share=mc_share,
    )

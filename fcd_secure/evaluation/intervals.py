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
  the interval covers the truth, which is where such bias shows. ``federation.whatif`` also reports a *rectified*
  value, the mean of v_i(π) − r_i with r_i the simulator's error on entity i's logged actions (prediction-powered
  inference, Angelopoulos et al. 2023, Science 382), whose interval also covers a bias the simulator shows on the
  factual data — under the stated assumption that the bias is the same under π;
* the model's error under π itself, where sites log propensities: the *doubly robust* value of
  ``federation.whatif`` (per-decision DR, Jiang & Li 2016, ICML; Thomas & Brunskill 2016, ICML) is, per entity, the
  simulated value plus the importance-weighted error of the simulator on the logged steps that π could have taken.
  Its mean is unbiased whatever the simulator's bias (the propensities being right), so the same three sums give an
  interval that covers the truth at its nominal level — on the steps where logged data supports π. Where no logged
  trajectory still follows π every weight is zero and the DR value is the simulator's again (``support`` says how
  much of the window is supported); no interval built from logged data alone can honestly cover a bias there.

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

__all__ = ["SUM_FIELDS", "Interval", "interval_from_sums", "site_sums"]

#: the sums one quantity contributes (``<prefix>.<field>``); ``mc_var`` only where the quantity is a Monte-Carlo mean
SUM_FIELDS = ("n", "sum", "sumsq", "mc_var")


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

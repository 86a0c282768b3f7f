"""Coverage of intervals over independent trials, with its own uncertainty (one definition for every script here)."""

from __future__ import annotations

import math
from statistics import NormalDist


def wilson(p: float, n: int, level: float) -> tuple[float, float]:
    """Wilson's (1927) score interval of a proportion ``p`` observed over ``n`` independent trials ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def coverage_line(hits: list[bool], level: float = 0.9) -> str:
    """"k of n (p %; Wilson 90 % CI a-b %)" for the intervals that covered the truth in ``hits``."""
    n, k = len(hits), int(sum(hits))
    if n == 0:
        return "0 of 0"
    lo, hi = wilson(k / n, n, level)
    return f"{k} of {n} ({k / n:.0%}; Wilson {level:.0%} CI {lo:.0%}-{hi:.0%})"

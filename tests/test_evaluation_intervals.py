"""Intervals from consortium sums (evaluation/intervals.py): known-answer coverage, additivity over sites."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.evaluation.intervals import BOOT_N_KEY, interval_from_sums, poisson_weights, site_sums


def _totals(parts: list[dict]) -> dict:
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            out[k] = np.asarray(v, dtype=np.float64) + out.get(k, 0.0)
    return out


def _sites(x: np.ndarray, n_sites: int, n_boot: int, seed: int) -> dict:
    """Split x over sites, each with its own Poisson weights, and add their sums (what the server receives)."""
    parts = []
    for s, chunk in enumerate(np.array_split(x, n_sites)):
        w = poisson_weights(len(chunk), n_boot, seed * 100 + s)
        parts.append({**site_sums("q", chunk, w), BOOT_N_KEY: list(w.sum(1))})
    return _totals(parts)


def test_known_answer_coverage_is_close_to_nominal():
    """Normal data with a known mean: over many resamples the 90 % intervals cover it about 90 % of the time."""
    rng = np.random.default_rng(0)
    mu, reps, hits_boot, hits_norm = 0.3, 300, 0, 0
    for r in range(reps):
        x = rng.normal(mu, 1.0, size=120)
        iv = interval_from_sums(_sites(x, 4, 200, r), "q", level=0.9)
        hits_boot += iv.covers(mu)
        hits_norm += iv.covers(mu, "normal")
        assert iv.low < iv.estimate < iv.high
    # binomial sd at p = 0.9 over 300 resamples is 0.017: 0.84-0.96 is ± 3.5 sd
    assert 0.84 <= hits_boot / reps <= 0.96
    assert 0.84 <= hits_norm / reps <= 0.96


def test_a_biased_estimate_is_not_covered():
    """The interval is about the estimator's mean: shifted data (a biased simulator) miss the truth."""
    rng = np.random.default_rng(1)
    misses = sum(not interval_from_sums(_sites(rng.normal(0.5, 1.0, 400), 3, 100, r), "q").covers(0.0)
                 for r in range(50))
    assert misses >= 48


def test_sums_are_additive_and_the_estimate_is_the_pooled_mean():
    rng = np.random.default_rng(2)
    x = rng.uniform(size=90)
    tot = _sites(x, 3, 50, 7)
    iv = interval_from_sums(tot, "q", level=0.8)
    assert iv.n == 90 and iv.n_boot == 50
    assert iv.estimate == pytest.approx(x.mean())
    assert iv.se == pytest.approx(x.std(ddof=1) / np.sqrt(90))
    # same sites, same seeds: same replicates (a site's weights come from its own seed)
    assert interval_from_sums(_sites(x, 3, 50, 7), "q", level=0.8) == iv
    # a wider level gives a wider interval
    wide = interval_from_sums(tot, "q", level=0.95)
    assert wide.low <= iv.low and wide.high >= iv.high


def test_monte_carlo_share_and_bad_input():
    x = np.array([0.1, 0.4, 0.7, 0.2])
    w = poisson_weights(4, 20, 0)
    sums = {**site_sums("q", x, w, mc_var=np.full(4, 0.01)), BOOT_N_KEY: list(w.sum(1))}
    iv = interval_from_sums(sums, "q")
    assert iv.mc_share == pytest.approx(0.01 / x.var(ddof=1))
    with pytest.raises(ValueError, match="level"):
        interval_from_sums(sums, "q", level=1.0)
    with pytest.raises(ValueError, match="non-finite"):
        site_sums("q", np.array([np.nan]), poisson_weights(1, 3, 0))
    with pytest.raises(ValueError, match=r"\[n\]"):
        site_sums("q", x, poisson_weights(3, 3, 0))

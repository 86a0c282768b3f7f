"""Tests of fcd_secure.evaluation.metrics: known answers, invariants and the federated sufficient statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fcd_secure.evaluation.metrics import (
    AUCStats,
    EffectStats,
    ate_error,
    factual_auc,
    mmd,
    pehe,
    rmse,
    summarise,
    value_error,
)

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


def test_known_values():
    assert pehe([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == pytest.approx(math.sqrt(5 / 3))
    assert ate_error([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert rmse([0.0, 1.0], [1.0, 1.0]) == pytest.approx(math.sqrt(0.5))
    assert value_error(0.7, 0.75) == pytest.approx(0.05)
    assert math.isnan(value_error(float("nan"), 0.5))  # NaN (no support) stays visible
    # mask: the padded entry (error 10) is ignored
    assert pehe(np.array([[1.0, 11.0]]), np.array([[0.0, 1.0]]), mask=np.array([[1, 0]])) == pytest.approx(1.0)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="shape"):
        pehe([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="tau_hat holds NaN"):
        pehe([1.0, float("nan")], [1.0, 1.0])
    with pytest.raises(ValueError, match="mask"):
        pehe([1.0, 2.0], [1.0, 1.0], mask=[0, 0])


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(arrays(np.float64, n, elements=finite), arrays(np.float64, n, elements=finite))))
def test_pehe_bounds_ate_error(pair):
    tau_hat, tau = pair
    scale = 1.0 + np.abs(tau_hat).max() + np.abs(tau).max()
    assert pehe(tau_hat, tau) >= ate_error(tau_hat, tau) - 1e-12 * scale


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(0, 2**31 - 1))
def test_effect_stats_merge_equals_pooled(sizes, seed):
    rng = np.random.default_rng(seed)
    sites = [(rng.normal(size=k), rng.normal(size=k)) for k in sizes]
    merged = EffectStats.merge_all(EffectStats.from_arrays(th, t) for th, t in sites)
    all_hat = np.concatenate([s[0] for s in sites])
    all_true = np.concatenate([s[1] for s in sites])
    assert merged.n == all_hat.size
    assert merged.pehe() == pytest.approx(pehe(all_hat, all_true), rel=1e-10, abs=1e-12)
    assert merged.ate_error() == pytest.approx(ate_error(all_hat, all_true), rel=1e-9, abs=1e-12)


def test_effect_stats_empty_is_an_error():
    with pytest.raises(ValueError, match="n = 0"):
        EffectStats.empty().pehe()


def _brute_auc(y, p):
    pos, neg = p[y == 1], p[y == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


@pytest.mark.parametrize("seed", range(5))
def test_factual_auc_matches_pairwise_count(seed):
    rng = np.random.default_rng(seed)
    n, L = 40, 7
    y = (rng.random((n, L)) < 0.4).astype(float)
    p = np.round(rng.random((n, L)) * 0.5 + 0.3 * y, 1)  # rounding makes many ties
    mask = (rng.random((n, L)) < 0.8).astype(float)
    keep = mask > 0
    assert factual_auc(y, p, mask) == pytest.approx(_brute_auc(y[keep], p[keep]), abs=1e-12)
    # padding with an adversarial score must not change anything
    p_pad = np.where(keep, p, 99.0)
    assert factual_auc(y, p_pad, mask) == pytest.approx(factual_auc(y, p, mask), abs=1e-15)


def test_factual_auc_extremes_and_errors():
    assert factual_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert factual_auc([0, 0, 1, 1], [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert factual_auc([0, 1], [0.5, 0.5]) == 0.5
    with pytest.raises(ValueError, match="single class"):
        factual_auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="0/1"):
        factual_auc([0, 2, 1], [0.1, 0.2, 0.3])


def test_auc_stats_merge_equals_pooled_auc_on_grid():
    rng = np.random.default_rng(11)
    bins = 20
    sites = []
    for k in (50, 130, 17):
        y = (rng.random(k) < 0.35).astype(float)
        cell = np.clip((rng.normal(8 + 5 * y, 3)).astype(int), 0, bins - 1)
        sites.append((y, (cell + 0.5) / bins))  # scores at cell centres: the binned AUC is exact
    merged = AUCStats.from_scores(*sites[0], bins=bins)
    for s in sites[1:]:
        merged = merged + AUCStats.from_scores(*s, bins=bins)
    y_all = np.concatenate([s[0] for s in sites])
    p_all = np.concatenate([s[1] for s in sites])
    assert merged.auc() == pytest.approx(factual_auc(y_all, p_all), abs=1e-12)
    with pytest.raises(ValueError, match="bin counts differ"):
        merged.merge(AUCStats.from_scores(*sites[0], bins=10))


def test_mmd_zero_for_identical_and_positive_for_shifted():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    assert mmd(x, x) == 0.0
    assert mmd(x, x, kernel="linear") == 0.0
    assert mmd(x, x, bandwidth=[0.5, 1.0, 2.0]) == 0.0
    assert mmd(x, x[rng.permutation(200)]) == pytest.approx(0.0, abs=1e-6)
    same = rng.normal(size=(200, 3))
    shifted = rng.normal(size=(200, 3)) + 1.0
    d_same, d_shift = mmd(x, same, bandwidth=1.0), mmd(x, shifted, bandwidth=1.0)
    assert d_shift > 0 and d_shift > 3 * d_same
    assert mmd(x, shifted, squared=True) == pytest.approx(mmd(x, shifted) ** 2)
    # linear kernel: MMD = distance between the means
    assert mmd(x, shifted, kernel="linear") == pytest.approx(np.linalg.norm(x.mean(0) - shifted.mean(0)))
    with pytest.raises(ValueError, match="same d"):
        mmd(x, shifted[:, :2])
    with pytest.raises(ValueError, match="kernel"):
        mmd(x, x, kernel="poly")


def test_summarise():
    s = summarise([1.0, 2.0, 3.0])
    assert (s.mean, s.std, s.n, s.n_nan) == (2.0, 1.0, 3, 0)
    assert str(s) == "2.000±1.000"
    d = summarise([{"pehe": 0.05, "ate": 0.04}, {"pehe": 0.07, "ate": float("nan")}])
    assert d["pehe"].mean == pytest.approx(0.06) and d["ate"].n == 1 and d["ate"].n_nan == 1
    assert "1 NaN" in str(d["ate"])
    with pytest.raises(ValueError, match="seed 1"):
        summarise([{"pehe": 1.0}, {"ate": 1.0}])

"""PEHE with what it means beside it (issue "Answers a clinician can act on", item 1): the effect sums gain Σ τ²,
Σ τ̂², Σ τ̂τ, which merge across sites exactly, and give the zero-effect PEHE₀, the constant-effect floor sd τ,
corr(τ̂, τ), the ATE ratio, the skill score and the flags that stand where a rank would mislead."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fcd_secure.evaluation.metrics import NO_EFFECT_LEARNED, NO_PER_ENTITY_SKILL, EffectStats, pehe


def _world(seed: int, n: int = 500):
    rng = np.random.default_rng(seed)
    tau = -0.08 + 0.09 * rng.standard_normal(n)
    return rng, tau


def test_effect_stats_merged_over_sites_equal_the_pooled_numpy_figures():
    rng, tau = _world(0, 700)
    tau_hat = 0.5 * tau + 0.03 * rng.standard_normal(tau.size) - 0.01
    cuts = [0, 90, 230, 231, 500, 700]  # five sites of unequal size, one with a single entity
    merged = EffectStats.merge_all(EffectStats.from_arrays(tau_hat[a:b], tau[a:b]) for a, b in zip(cuts, cuts[1:]))
    fig = merged.skill_figures()
    assert fig["pehe"] == pytest.approx(np.sqrt(np.mean((tau_hat - tau) ** 2)), abs=1e-9)
    assert fig["pehe_zero"] == pytest.approx(np.sqrt(np.mean(tau ** 2)), abs=1e-9)
    assert fig["sd_tau"] == pytest.approx(np.std(tau), abs=1e-9)
    assert fig["sd_tau_hat"] == pytest.approx(np.std(tau_hat), abs=1e-9)
    assert fig["corr"] == pytest.approx(np.corrcoef(tau_hat, tau)[0, 1], abs=1e-9)
    assert fig["ate_ratio"] == pytest.approx(tau_hat.mean() / tau.mean(), abs=1e-9)
    assert fig["skill"] == pytest.approx(1 - np.mean((tau_hat - tau) ** 2) / np.var(tau), abs=1e-9)
    assert merged.ate_error() == pytest.approx(abs(tau_hat.mean() - tau.mean()), abs=1e-12)


def test_a_model_that_predicts_no_effect_has_pehe_equal_to_pehe_zero_and_is_flagged():
    _, tau = _world(1)
    es = EffectStats.from_arrays(np.zeros_like(tau), tau)
    assert es.pehe() == pytest.approx(es.pehe_zero(), abs=1e-12)
    assert es.flags() == [NO_EFFECT_LEARNED, NO_PER_ENTITY_SKILL]
    assert math.isnan(es.corr())  # τ̂ does not vary: no correlation to speak of
    assert es.ate_ratio() == 0.0


def test_predicting_the_true_average_effect_reaches_the_floor_with_zero_skill():
    _, tau = _world(2)
    es = EffectStats.from_arrays(np.full_like(tau, tau.mean()), tau)
    assert es.pehe() == pytest.approx(es.sd_true(), abs=1e-12)
    assert es.skill() == pytest.approx(0.0, abs=1e-9)
    assert NO_PER_ENTITY_SKILL in es.flags() and NO_EFFECT_LEARNED not in es.flags()


def test_a_model_with_per_entity_skill_is_not_flagged_and_a_wrong_sign_shows_in_the_ratio():
    rng, tau = _world(3)
    good = EffectStats.from_arrays(tau + 0.02 * rng.standard_normal(tau.size), tau)
    assert good.skill() > 0.9 and good.flags() == []
    wrong = EffectStats.from_arrays(-tau, tau)
    assert wrong.ate_ratio() == pytest.approx(-1.0) and wrong.corr() == pytest.approx(-1.0)
    assert NO_PER_ENTITY_SKILL in wrong.flags()


def test_sums_round_trip_through_a_reply_dict_and_old_statistics_give_nan_figures():
    rng, tau = _world(4, 50)
    es = EffectStats.from_arrays(tau + 0.01, tau)
    back = EffectStats.from_sums({f"effect.{k}": v for k, v in es.to_dict().items()})
    assert back == es
    old = EffectStats.from_sums({"effect.n": 50.0, "effect.sse": es.sse, "effect.sum_hat": es.sum_hat,
                                 "effect.sum_true": es.sum_true})
    assert old.pehe() == pytest.approx(pehe(tau + 0.01, tau))
    assert math.isnan(old.pehe_zero()) and math.isnan(old.skill())
    assert NO_PER_ENTITY_SKILL in old.flags()  # skill unknown is never reported as skill

"""The carry-over world (issue 42 item 6): its logged columns, the truth's replay of the states, confounding through
the recorded history only, the propensity floor on any history, sites that are a cause, the regimens' order flipping
with the horizon in the truth, and `fcd data describe`. The contract every generated world keeps (layout, replay,
propensities, seeds, batching, config errors, the registered dataset) is in ``test_worlds.py``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError
from policy_cases import policy
from world_cases import Recorder, tiny_world

from fcd_secure.data.carryover import CarryoverConfig, generate
from fcd_secure.data.carryover import truth as truth_mod
from fcd_secure.data.carryover.behaviour import action_probs
from fcd_secure.data.carryover.model import PatientParams, good_step_prob, step
from fcd_secure.data.policy import default_policies


@pytest.fixture(scope="module")
def tiny():
    return tiny_world("carryover")


# -- generator contract --------------------------------------------------------------------------------------
def test_the_logs_record_severity_toxicity_and_the_patients_covariates(tiny):
    """The carry-over world's own columns (the contract every world keeps: ``test_worlds.py``)."""
    cfg = tiny.cfg
    for ds in tiny.train + tiny.test:
        pid = ds.meta["entity"]
        valid = ds.M > 0
        # A is the recorded severity and toxicity of each morning; X the recorded frailty and response marker
        assert np.array_equal(ds.A[..., 0][valid], tiny.S_all[pid, : cfg.max_len][valid].astype(np.float32))
        assert np.array_equal(ds.A[..., 1][valid], tiny.K_all[pid, : cfg.max_len][valid].astype(np.float32))
        assert np.array_equal(ds.X, tiny.X_all[pid].astype(np.float32))
    # anchors: the project's rule picks "none" (most logged) and "treat"
    assert tiny.anchors == (0, 1)


def test_sites_are_a_cause_of_case_mix_and_practice():
    world = generate(CarryoverConfig.from_preset("default", n_rollouts=2, site_spread=3.0))
    sp = world.site_params
    d = world.describe(n_rollouts=2, policy_values=False)
    severity = np.array([s["mean_untreated_severity"] for s in d["sites"]])
    treat = np.array([s["action_share"]["treat"] for s in d["sites"]])
    # a site shifted towards sicker patients sees sicker patients, and its own practice shift moves its treatment
    # share (the case mix moves it too: the clinic treats the sick)
    assert np.corrcoef(sp["casemix_shift"], np.log(severity))[0, 1] > 0.9
    assert np.corrcoef(sp["practice_shift"], treat)[0, 1] > 0.7
    same = generate(CarryoverConfig.from_preset("default", n_rollouts=2, site_spread=0.0))
    assert np.ptp([s["action_share"]["treat"] for s in same.describe(2, False)["sites"]]) < np.ptp(treat) / 2


# -- common random numbers -----------------------------------------------------------------------------------
def test_the_truths_replay_gives_back_the_logged_severity_and_toxicity(tiny):
    """The truth's own replay of the logged actions reproduces the logged states bit for bit, not only the outcomes
    (``test_worlds.py``)."""
    ids = tiny.patient_ids(None, "train")
    Y, S, K = truth_mod.replay(tiny.cfg, tiny.params.take(ids), tiny.S_all[ids, 0], tiny.K_all[ids, 0],
                               tiny.T_all[ids], tiny.U[ids])
    valid = tiny._valid(ids)
    assert np.array_equal(S[:, :-1][valid], tiny.S_all[ids, :-1][valid])
    assert np.array_equal(K[:, :-1][valid], tiny.K_all[ids, :-1][valid])


def test_the_contexts_follow_the_policy(tiny):
    """Under another policy than the logged one the contexts are that policy's: treating every step builds toxicity
    and lowers severity rollout by rollout (same noise), against never treating (rollout 0 under the logged actions
    replays the logs: ``test_worlds.py``)."""
    ids = tiny.patient_ids(None, "test")
    M = tiny._valid(ids)
    A = np.concatenate([d.A for d in tiny.test])
    treat, none = Recorder(1), Recorder(0)
    tiny.policy_values_of(treat, ids, n_rollouts=4)
    tiny.policy_values_of(none, ids, n_rollouts=4)
    assert (treat.ctx[..., 1] >= none.ctx[..., 1]).all() and (treat.ctx[..., 1] > none.ctx[..., 1]).any()
    assert (treat.ctx[..., 0] <= none.ctx[..., 0]).all() and (treat.ctx[..., 0] < none.ctx[..., 0]).any()
    assert not np.array_equal(none.ctx[: len(ids)][M], A[M])  # not the logged contexts


# -- the logging policy: recorded history only, per-step positivity -----------------------------------------
def test_the_logged_propensity_is_a_function_of_the_recorded_history_only(tiny):
    """What the sites record (A_t, the previous T, the site) gives back the logged propensity exactly: nothing hidden
    enters the decision, so sequential exchangeability holds given the record."""
    for s, ds in enumerate(tiny.train):
        valid = ds.M > 0
        prev = np.concatenate([np.zeros((ds.n, 1), dtype=np.int64), ds.T[:, :-1]], axis=1)
        shift = np.full(ds.n, tiny.site_params["practice_shift"][s])
        pi = np.stack([action_probs(tiny.cfg, ds.A[:, t, 0].astype(np.float64), ds.A[:, t, 1].astype(np.float64),
                                    prev[:, t], shift) for t in range(ds.L)], axis=1)
        taken = np.take_along_axis(pi, ds.T[:, :, None], axis=2)[..., 0]
        assert np.allclose(taken[valid], ds.P[valid], rtol=1e-5, atol=1e-6), s


def test_every_action_keeps_two_percent_on_any_history(tiny):
    """The floor holds on the logged histories (``test_worlds.py``) and on any history, however extreme."""
    assert tiny.cfg.epsilon == 0.02
    S, K = np.array([0.0, 10.0, 0.0, 10.0]), np.array([0.0, 0.0, 10.0, 10.0])
    for prev in (0, 1):
        q = action_probs(tiny.cfg.model_copy(update={"gamma": 8.0}), S, K, np.full(4, prev), np.zeros(4))
        assert q.min() >= 0.02 - 1e-15


@pytest.mark.parametrize("seed", [0, 1])
def test_confounding_biases_the_naive_contrast_and_the_logged_propensities_remove_it(seed):
    """The clinic treats the sick (severity lowers the outcome) and stops at toxicity: the naive treated-minus-untreated
    one-step contrast is biased downwards, more so the larger γ (seeds 0-1, naive − true: γ = 0: −0.004..+0.011,
    γ = 1.5: −0.10..−0.12, γ = 3: −0.14..−0.16, the truth +0.06..+0.09); re-weighting by the logged propensities
    removes it (IPW − true within ±0.024)."""
    cfg = CarryoverConfig(preset="test", n_patients=3000, max_len=10, anchor_step=3, horizon=3, n_rollouts=2,
                          seed=seed)
    bias = []
    for gamma in (0.0, 1.5, 3.0):
        c = generate(cfg.model_copy(update={"gamma": gamma})).anchor_contrasts("train")
        assert abs(c["ipw"] - c["true"]) < 0.035, gamma
        bias.append(c["naive"] - c["true"])
    assert abs(bias[0]) < 0.03  # γ = 0: the clinic ignores the history; only the sites' shifts remain
    assert bias[1] < -0.07 and np.all(np.diff(bias) < -0.02)


# -- ground truth -------------------------------------------------------------------------------------------
def test_exact_good_step_probability_matches_the_realised_outcomes(tiny):
    prm = PatientParams(mu=np.array([1.2, 2.0]), r=np.array([0.4, 0.3]), kappa=np.array([0.2, 0.3]),
                        b=np.array([2.0, 1.5]))
    S, K = np.array([1.0, 1.8]), np.array([0.3, 1.2])
    n = 200_000
    rng = np.random.default_rng(0)
    big = PatientParams(*(np.repeat(x, n) for x in (prm.mu, prm.r, prm.kappa, prm.b)))
    for a in (0, 1):
        p = good_step_prob(tiny.cfg, prm, S, K, np.full(2, a))
        y = step(tiny.cfg, big, np.repeat(S, n), np.repeat(K, n), np.full(2 * n, a), rng.random((2 * n, 3)))[3]
        assert np.allclose(y.reshape(2, n).mean(1), p, atol=0.005), a


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_regimens_order_at_one_step_is_not_their_order_over_thirty(seed):
    """The truth of the default preset (30 steps): at h = 1 treating helps (always = early_on > never = late_on, by
    ~0.12); over the whole trajectory the toxicity a held course builds up reverses it: early_on > late_on > never >
    always, each by at least 0.03 (seeds 0-2: 0.035-0.075; the regimens that treat first are first at h = 1, always is
    last at h = 30)."""
    world = generate(CarryoverConfig.from_preset("default", seed=seed, n_rollouts=8))
    v = world.regimen_values((1, 30))
    one, whole = v["h=1"], v["h=30"]
    assert one["always"] == one["early_on"] and one["never"] == one["late_on"]
    assert one["always"] - one["never"] > 0.08
    order = sorted(whole, key=whole.get, reverse=True)
    assert order == ["early_on", "late_on", "never", "always"]
    assert min(whole[a] - whole[b] for a, b in zip(order, order[1:])) > 0.03
    # the values are means over each patient's own steps, from t = 0: h = 30 is the whole trajectory
    assert whole["never"] == pytest.approx(world.true_policy_value(default_policies()[0])[0], abs=1e-12)


def test_policies_by_label_and_on_the_simulated_contexts(tiny):
    treat = tiny.true_policy_value(policy("treat_all", {"kind": "static", "action": "treat"}))[0]
    assert treat == pytest.approx(tiny.true_policy_value(default_policies()[1])[0], abs=1e-12)
    # a rule on the simulated toxicity: treat while toxicity stays below 0.5
    rule = policy("treat_until_toxic", {"kind": "threshold", "signal": "context:toxicity", "when": "below",
                                        "value": 0.5, "then": "treat", "otherwise": "none"})
    never = tiny.true_policy_value(default_policies()[0])[0]
    assert tiny.true_policy_value(rule)[0] > max(never, treat) + 0.02


def test_a_toxicity_that_never_clears_is_refused():
    with pytest.raises(ValidationError, match="toxicity_retention"):
        CarryoverConfig.from_preset("tiny", toxicity_retention=1.0)


# -- describe ------------------------------------------------------------------------------------------------
def test_describe_reports_truth_at_both_horizons_and_confounding(tiny):
    d = tiny.describe()
    assert d["anchors"] == {"a_off": 0, "a_on": 1, "a_off_label": "none", "a_on_label": "treat"}
    assert set(d["true_policy_values_first_step_test"]) == {"never", "always", "early_on", "late_on"}
    assert d["min_logged_propensity"] >= 0.02 and len(d["sites"]) == 10
    c = d["one_step_contrast_train"]
    assert c["naive"] < c["true"] - 0.03 and abs(c["ipw"] - c["true"]) < abs(c["naive"] - c["true"])


def test_fcd_data_describe_carryover():
    from typer.testing import CliRunner

    from fcd_secure.cli.main import app

    res = CliRunner().invoke(app, ["data", "describe", "--dataset", "carryover", "--preset", "tiny", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["data"]["carryover"]
    assert out["n_actions"] == 2 and out["sequences"] == 300 and out["has_propensity"] is True
    assert out["oracle"]["true_policy_values_first_step_test"]["always"] > out["oracle"][
        "true_policy_values_first_step_test"]["never"]
    text = CliRunner().invoke(app, ["data", "describe", "--dataset", "carryover", "--preset", "tiny"])
    assert text.exit_code == 0 and "carryover" in text.output and "severity, toxicity" in text.output



"""Incremental propensity interventions (issue 29 item 5; Kennedy 2019, JASA): the TOML rule, the shifted
probabilities, the importance weights from the logged propensities (a site-local model where the logs do not give
π_k), their multi-step doubly robust values with ESS on a world whose truth is known exactly, and the oracle's truth
on the world's own logging probabilities."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.data.policy import (  # noqa: E402
    DEFAULT_POLICY_NAMES,
    Policy,
    default_policies,
    incremental_probs,
    load_policy,
    load_policy_refs,
)
from fcd_secure.data.schema import SiteDataset  # noqa: E402
from fcd_secure.data.spec import DataError  # noqa: E402
from fcd_secure.evaluation.propensity import HistoryPropensity  # noqa: E402
from fcd_secure.queries.incremental import attach_behaviour, incremental_target_probs  # noqa: E402
from fcd_secure.queries.targeted import MIN_SUPPORT_ESS, horizon_sums, merge_identified  # noqa: E402
from fcd_secure.queries.registry import metric_names  # noqa: E402
from fcd_secure.queries.request import WhatIfRequest  # noqa: E402
from conftest import ask_policies, merge_policies  # noqa: E402
from policy_cases import assert_rule_refused, policy, rule_file  # noqa: E402

K_ON = 1  # the action whose odds the policies of the known-answer world multiply


def incremental(delta: float, action=K_ON, name: str | None = None) -> Policy:
    return policy(name or f"inc_{delta:g}".replace(".", "_"), {"kind": "incremental", "delta": delta, "action": action})


# -- the rule ------------------------------------------------------------------------------------------------------
def test_the_toml_rule_parses_and_the_shipped_example_is_not_a_default(tmp_path):
    p = load_policy("policies/incremental_on_x2.toml")
    assert p.stochastic and p.rule.delta == 2.0 and p.rule.action == "anchor:on" and p.uses_anchors
    assert [q.name for q in default_policies()] == list(DEFAULT_POLICY_NAMES)  # still the paper's four
    assert [q.name for q in load_policy_refs(["incremental_on_x2"])] == ["incremental_on_x2"]
    assert load_policy(rule_file(tmp_path, "incremental", "delta = 0.5")).rule.action == "anchor:on"  # the default


@pytest.mark.parametrize("body, field", [
    ("delta = 0.0", "rule.delta"), ("delta = -1.0", "rule.delta"), ('delta = "two"', "rule.delta"),
    ('delta = 2.0\naction = "anchor:mid"', "unknown anchor 'anchor:mid'"), ("", "rule.delta"),
    ("delta = 2.0\nlookback = 2", "rule.lookback"),
])
def test_a_bad_incremental_rule_is_refused_naming_the_field(tmp_path, body, field):
    assert_rule_refused(tmp_path, "incremental", body, field)


def test_an_action_the_data_does_not_have_is_refused_at_bind():
    pol = incremental(2.0, action="surgery")
    with pytest.raises(DataError, match="rule.action.*'surgery' is not a label"):
        pol.bind(["none", "chemo"])
    with pytest.raises(DataError, match="outside the dataset's 2 actions"):
        incremental(2.0, action=5).bind(None, n_actions=2)


def test_q_sums_to_one_multiplies_the_odds_by_delta_and_delta_one_is_the_logging_policy():
    rng = np.random.default_rng(0)
    b = rng.dirichlet(np.ones(5), size=200)
    for delta in (0.1, 0.5, 1.0, 2.0, 7.0):
        q = incremental_probs(b, 3, delta)
        assert np.allclose(q.sum(1), 1.0) and (q > 0).all()
        odds = lambda p: p / (1 - p)  # noqa: E731
        assert np.allclose(odds(q[:, 3]), delta * odds(b[:, 3]))
        others = np.delete(q, 3, axis=1) / np.delete(b, 3, axis=1)  # every other action scaled alike
        assert np.allclose(others, others[:, :1])
    assert np.allclose(incremental_probs(b, 3, 1.0), b)


def test_actions_are_drawn_from_q_and_each_bind_draws_the_same_way():
    rng = np.random.default_rng(1)
    b = np.tile(rng.dirichlet(np.ones(4)), (40_000, 1))
    pol = incremental(3.0).with_behaviour(lambda t, y, ln, ctx: b, seed=5).bind(None, n_actions=4)
    a = pol.actions(0, np.zeros((len(b), 0)), np.full(len(b), 2), 0, 1)
    assert np.allclose(np.bincount(a, minlength=4) / len(a), incremental_probs(b[:1], 1, 3.0)[0], atol=0.01)
    again = pol.bind(None, n_actions=4).actions(0, np.zeros((len(b), 0)), np.full(len(b), 2), 0, 1)
    assert (a == again).all()
    given = pol.actions(0, np.zeros((3, 0)), np.full(3, 2), 0, 1, behaviour=np.eye(4)[[0, 2, 3]])
    assert given.tolist() == [0, 2, 3]  # the true probabilities win over the bound model
    with pytest.raises(ValueError, match="needs the logging policy's probabilities"):
        incremental(3.0).actions(0, np.zeros((2, 0)), np.full(2, 2), 0, 1)


# -- a world whose value under q is known exactly ------------------------------------------------------------------
#: two steps, three actions; the logging policy at t = 1 depends on Y_0 (time-varying confounding), the outcome on
#: the action and Y_0
PI0 = np.array([0.5, 0.3, 0.2])
PI1 = {0: np.array([0.6, 0.2, 0.2]), 1: np.array([0.2, 0.5, 0.3])}
PY0 = np.array([0.3, 0.6, 0.5])
BASE1 = np.array([0.2, 0.5, 0.4])


def true_value(delta: float) -> float:
    """(E[Y_0] + E[Y_1]) / 2 under q, by enumeration."""
    q0 = incremental_probs(PI0[None], K_ON, delta)[0]
    ey0, ey1 = 0.0, 0.0
    for a0 in range(3):
        for y0 in (0, 1):
            pr = q0[a0] * (PY0[a0] if y0 else 1 - PY0[a0])
            ey0 += pr * y0
            q1 = incremental_probs(PI1[y0][None], K_ON, delta)[0]
            ey1 += pr * (q1 * (BASE1 + 0.2 * y0)).sum()
    return (ey0 + ey1) / 2


def two_step_world(n: int, seed: int, n_actions: int = 3) -> SiteDataset:
    rng = np.random.default_rng(seed)
    T, Y, P = np.zeros((n, 2), np.int64), np.zeros((n, 2), np.float32), np.zeros((n, 2), np.float32)
    pi0 = PI0 if n_actions == 3 else np.array([0.6, 0.4])
    T[:, 0] = rng.choice(n_actions, size=n, p=pi0)
    P[:, 0] = pi0[T[:, 0]]
    Y[:, 0] = rng.random(n) < PY0[T[:, 0]]
    for y0 in (0, 1):
        rows = Y[:, 0] == y0
        pi1 = PI1[y0] if n_actions == 3 else np.array([0.7, 0.3]) if y0 else np.array([0.4, 0.6])
        T[rows, 1] = rng.choice(n_actions, size=int(rows.sum()), p=pi1)
        P[rows, 1] = pi1[T[rows, 1]]
    Y[:, 1] = rng.random(n) < BASE1[T[:, 1]] + 0.2 * Y[:, 0]
    return SiteDataset(X=np.zeros((n, 1), np.float32), A=np.zeros((n, 2, 1), np.float32), T=T, Y=Y,
                       M=np.ones((n, 2), np.float32), n_actions=n_actions, P=P, name=f"two_step_{seed}")


def dr_answer(pol: Policy, test: SiteDataset, level: float = 0.9) -> dict:
    """The identified DR value over both steps, with a deliberately wrong outcome model (0.5 everywhere)."""
    pi, _ = incremental_target_probs(pol, test, (0, K_ON))
    sums, per = horizon_sums(pol.name, test, pi, np.full((test.n, 2), 0.5), [1, 2])
    merged = merge_identified(sums, [pol.name], None, level, binary=True, all_sent=lambda k: k in sums)
    return {**merged[pol.name], "per": per}


def test_delta_one_weighs_every_step_by_one_and_its_dr_value_is_the_observed_mean():
    train, test = two_step_world(1000, 0), two_step_world(1000, 1)
    (pol,) = attach_behaviour([incremental(1.0)], train, seed=0)
    pi, src = incremental_target_probs(pol, test, (0, K_ON))
    assert np.allclose(pi, test.P)  # q / P ≡ 1
    assert src == {"logged": float((test.T == K_ON).sum()), "model": float((test.T != K_ON).sum())}
    ans = dr_answer(pol, test)
    assert np.allclose(ans["per"][2], test.Y.mean(1)) and np.allclose(ans["per"][1], test.Y[:, 0])
    assert ans["answer"]["horizon"] == 2 and ans["answer"]["ess"] == pytest.approx(test.n)


def test_two_action_data_take_every_pi_k_from_the_logs_and_need_no_model():
    test = two_step_world(500, 2, n_actions=2)
    pi, src = incremental_target_probs(incremental(2.0), test, (0, K_ON))  # no model bound: none needed
    assert src["model"] == 0 and src["logged"] == test.n * 2
    pi_k = np.where(test.T == K_ON, test.P, 1 - test.P)
    assert np.allclose(pi / test.P, np.where(test.T == K_ON, 2.0, 1.0) / (2 * pi_k + 1 - pi_k))
    with pytest.raises(ValueError, match="logging-policy model"):
        incremental_target_probs(incremental(2.0), two_step_world(50, 3), (0, K_ON))


@pytest.mark.parametrize("delta", [0.5, 2.0, 4.0])
def test_the_dr_value_of_an_incremental_policy_covers_the_enumerated_truth(delta):
    truth = true_value(delta)
    assert abs(truth - true_value(1.0)) > 0.01  # the intervention changes the value
    est, covered, unreached = [], 0, 0
    for rep in range(40):
        (pol,) = attach_behaviour([incremental(delta)], two_step_world(2000, 3000 + rep), seed=rep)
        a = dr_answer(pol, two_step_world(1000, 1000 + rep))["horizons"][-1]  # h = 2, answered or not
        est.append(a["estimate"])
        covered += a["low"] <= truth <= a["high"]
        unreached += not a["reached"]
    assert covered >= 30, covered  # nominal 90 % over 40 worlds (P(< 30) ≈ 0.3 % at 90 %)
    assert abs(np.mean(est) - truth) < 0.01, (np.mean(est), truth)
    # the model can represent this logging policy, so its weights average about 1: the mean-weight check (a 5 %
    # one-sided test, queries.targeted.reaches_policy) refuses h = 2 only now and then (0 / 4 / 4 of 40 measured)
    assert unreached <= 6, unreached


def test_the_effective_sample_size_grows_as_delta_approaches_one():
    train, test = two_step_world(2000, 7), two_step_world(2000, 8)
    ess = {}
    for delta in (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0):
        (pol,) = attach_behaviour([incremental(delta)], train, seed=0)
        ess[delta] = dr_answer(pol, test)["horizons"][-1]["ess"]
    assert ess[0.1] < ess[0.25] < ess[0.5] < ess[1.0] == pytest.approx(test.n)
    assert ess[10.0] < ess[4.0] < ess[2.0] < ess[1.0]
    assert ess[10.0] >= MIN_SUPPORT_ESS  # never zero: every logged step keeps a weight


def test_the_site_propensity_model_recovers_a_logging_policy_it_can_represent():
    m = HistoryPropensity(3, 1).fit(two_step_world(4000, 9))
    assert np.allclose(m.probs(0, np.zeros((1, 0)), np.array([2]), np.zeros((1, 1, 1)))[0], PI0, atol=0.03)
    for y0 in (0, 1):
        got = m.probs(1, np.full((1, 1), y0), np.array([2]), np.zeros((1, 2, 1)))[0]
        assert np.allclose(got, PI1[y0], atol=0.04)


# -- DKT-Synth: the oracle's truth, the site's rollout and the what-if reply ---------------------------------------
def test_the_oracle_rolls_an_incremental_policy_out_on_its_true_logging_probabilities(tiny_dkt_site):
    _, data, _ = tiny_dkt_site
    world, i = data.oracle, data.site_index
    always = next(p for p in default_policies() if p.name == "always")
    # unbound (no site model): the world passes its own probabilities; a huge δ is "always a_on"
    big = world.true_policy_value(incremental(1e6, action="anchor:on", name="big"), i, "test", n_rollouts=4)[0]
    assert big == pytest.approx(world.true_policy_value(always, i, "test", n_rollouts=4)[0], abs=0.01)
    v1 = world.true_policy_value(incremental(1.0, action="anchor:on", name="one"), i, "test", n_rollouts=4)
    assert v1 == world.true_policy_value(incremental(1.0, action="anchor:on", name="one"), i, "test", n_rollouts=4)


def test_the_tumour_oracle_rolls_it_out_on_its_true_logging_probabilities_too():
    from fcd_secure.data.tumour import TumourConfig, generate  # noqa: PLC0415

    world = generate(TumourConfig.from_preset("tiny"))
    always = next(p for p in default_policies() if p.name == "always")
    big = world.true_policy_value(incremental(1e6, action="anchor:on", name="big"), 0, "test", n_rollouts=2)[0]
    assert big == pytest.approx(world.true_policy_value(always, 0, "test", n_rollouts=2)[0], abs=0.01)
    small = world.true_policy_value(incremental(1e-6, action="anchor:on", name="small"), 0, "test", n_rollouts=2)[0]
    assert small != pytest.approx(big, abs=0.01)


def test_a_what_if_question_answers_an_incremental_policy_on_more_horizons_than_always(tiny_dkt_site):
    cfg, data, model = tiny_dkt_site
    pols = load_policy_refs(["always", "incremental_on_x2"])
    req = WhatIfRequest(policies=pols, reference="always", horizon=5)
    reply = ask_policies(model, data.test, data, cfg, req)
    assert set(reply) <= set(metric_names([p.name for p in pols], cfg.evaluation.ope_horizon))
    assert reply["whatif.pik.incremental_on_x2.logged"] + reply["whatif.pik.incremental_on_x2.model"] == \
        data.test.M.sum()
    again = ask_policies(model, data.test, data, cfg, req)
    assert again == reply  # seeded: the rollout's draws repeat
    res = merge_policies([reply], req)
    inc = res["policies"]["incremental_on_x2"]["identified"]
    alw = res["policies"]["always"]["identified"]
    assert 0 < inc["pi_k"]["logged_share"] < 1
    ok = lambda d: [r["horizon"] for r in d["horizons"] if r["supported"]]  # noqa: E731
    assert ok(inc) == [1, 2, 3, 5] and len(ok(alw)) < len(ok(inc))
    assert all(r["ess"] > 0.5 * data.test.n for r in inc["horizons"])

    blind = ask_policies(model, data.test.without_propensities(), data, cfg, req)
    assert not any(k.startswith(("whatif.pik.", "whatif.id.")) for k in blind)  # no weights without propensities
    assert blind["whatif.support.incremental_on_x2.sum"] == data.test.n


def test_P41_a_rare_action_cannot_single_out_the_one_patient_who_received_it():
    """The differencing budget reads an incremental policy's cohort as the rows whose weights it changes materially:
    "multiply the odds of the action only patient 0 got by 10" against δ = 1 moves one row's weight (by ×3.6) and
    every other row's by 0.2 %, so the pair is a one-patient difference and the site refuses it (the attack of two
    thresholds one patient apart, P41, with odds instead of thresholds)."""
    from fcd_secure.audit import Refusal  # noqa: PLC0415
    from fcd_secure.queries.budget import admit_question  # noqa: PLC0415

    train, test = two_step_world(2000, 11), two_step_world(300, 12)
    for ds in (train, test):  # action 2 exists in the vocabulary, but only patient 0 of the test rows received it
        moved = ds.T == 2
        ds.T[moved], ds.P[moved] = 0, 0.5
    test.T[0, 0], test.P[0, 0] = 2, 0.2
    pair = attach_behaviour([incremental(1.0, action=2, name="as_logged"), incremental(10.0, action=2, name="rare")],
                            train, seed=0)
    with pytest.raises(Refusal) as exc:
        admit_question(pair, test, (0, K_ON), 2, min_difference=10, record=None)
    assert exc.value.key == "policy_difference"
    # a real question about a common action changes the weights of every row: admitted
    common = attach_behaviour([incremental(1.0, name="as_logged"), incremental(2.0, name="twice")], train, seed=0)
    admit_question(common, test, (0, K_ON), 2, min_difference=10, record=None)

"""The share policy (issue 29 item 5): "give action k at a share s of the steps, the logging policy's own choice at
the others", q = (1 − s)·π + s·1{a = k} (Díaz et al. 2023, JASA: a modified treatment policy on the natural value
of treatment). Its weight at a logged step needs only the logged propensity of the logged action, so its doubly
robust value stays right where the logging policy read what the record does not hold; the incremental (odds)
policy's weights need π_k there, and a site's model of it is then wrong."""

from __future__ import annotations

import os
from dataclasses import replace

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
    share_probs,
)
from fcd_secure.data.schema import SiteDataset  # noqa: E402
from fcd_secure.queries.incremental import attach_behaviour, incremental_target_probs  # noqa: E402
from fcd_secure.queries.targeted import horizon_sums, merge_identified  # noqa: E402
from fcd_secure.queries.logged import logged_support  # noqa: E402
from fcd_secure.queries.request import WhatIfRequest  # noqa: E402
from conftest import ask_policies, merge_policies  # noqa: E402
from policy_cases import assert_rule_refused, policy, rule_file  # noqa: E402

K = 1  # the action the policies of the known-answer world shift towards


def share(s: float, action=K, name: str | None = None) -> Policy:
    return policy(name or f"share_{s:g}".replace(".", "_"), {"kind": "share", "share": s, "action": action})


def odds(delta: float, action=K, name: str | None = None) -> Policy:
    return policy(name or f"odds_{delta:g}".replace(".", "_"),
                  {"kind": "incremental", "delta": delta, "action": action})


# -- the rule ------------------------------------------------------------------------------------------------------
def test_the_toml_rule_parses_and_the_shipped_example_is_not_a_default(tmp_path):
    p = load_policy("policies/share_on_20.toml")
    assert p.stochastic and p.rule.share == 0.2 and p.rule.action == "anchor:on" and p.uses_anchors
    assert [q.name for q in load_policy_refs(["share_on_20"])] == ["share_on_20"]
    assert [q.name for q in default_policies()] == list(DEFAULT_POLICY_NAMES)
    # the default action; a share of 1 is allowed
    assert load_policy(rule_file(tmp_path, "share", "share = 1.0")).rule.action == "anchor:on"


@pytest.mark.parametrize("body, field", [
    ("share = 0.0", "rule.share"), ("share = 1.5", "rule.share"), ("share = -0.1", "rule.share"),
    ('share = "half"', "rule.share"), ("", "rule.share"), ("share = 0.2\ndelta = 2.0", "rule.delta"),
    ('share = 0.2\naction = "anchor:mid"', "unknown anchor 'anchor:mid'"),
])
def test_a_bad_share_rule_is_refused_naming_the_field(tmp_path, body, field):
    assert_rule_refused(tmp_path, "share", body, field)


def test_q_is_the_mixture_and_a_share_of_one_is_always_k():
    rng = np.random.default_rng(0)
    b = rng.dirichlet(np.ones(5), size=300)
    for s in (0.05, 0.3, 0.9):
        q = share_probs(b, 3, s)
        assert np.allclose(q.sum(1), 1.0) and (q > 0).all()
        assert np.allclose(q[:, 3], (1 - s) * b[:, 3] + s)
        assert np.allclose(np.delete(q, 3, axis=1), (1 - s) * np.delete(b, 3, axis=1))
    assert np.allclose(share_probs(b, 3, 1.0), np.eye(5)[[3] * len(b)])
    pol = share(0.25).with_behaviour(lambda t, y, ln, ctx: np.tile(b[:1], (40_000, 1)), seed=2).bind(None, n_actions=5)
    a = pol.actions(0, np.zeros((40_000, 0)), np.full(40_000, 2), 0, 1)
    assert np.allclose(np.bincount(a, minlength=5) / len(a), share_probs(b[:1], 1, 0.25)[0], atol=0.01)


# -- a world whose logging policy reads a variable the record does not hold ------------------------------------------
#: two steps, three actions; an unrecorded U (the clinician's judgement, DKT-Synth's readiness) drives both the
#: logging policy and the outcome, so a model of the logging policy on the record cannot give π_k(h, U)
PI0 = {0: np.array([0.7, 0.1, 0.2]), 1: np.array([0.2, 0.7, 0.1])}
PI1 = {(0, 0): np.array([0.6, 0.1, 0.3]), (0, 1): np.array([0.5, 0.2, 0.3]),
       (1, 0): np.array([0.3, 0.5, 0.2]), (1, 1): np.array([0.1, 0.7, 0.2])}
P_Y0 = np.array([0.2, 0.4, 0.3])
BASE1 = np.array([0.1, 0.4, 0.3])


def q_of(pol: Policy, pi: np.ndarray) -> np.ndarray:
    r = pol.rule
    return (share_probs(pi[None], K, r.share) if r.kind == "share" else incremental_probs(pi[None], K, r.delta))[0]


def true_value(pol: Policy) -> float:
    """(E[Y_0] + E[Y_1]) / 2 under the policy acting on the *true* logging probabilities (with U), by enumeration."""
    total = 0.0
    for u in (0, 1):
        q0 = q_of(pol, PI0[u])
        for a0 in range(3):
            p0 = P_Y0[a0] + 0.3 * u
            for y0 in (0, 1):
                pr = 0.5 * q0[a0] * (p0 if y0 else 1 - p0)
                q1 = q_of(pol, PI1[(u, y0)])
                total += pr * (y0 + (q1 * (BASE1 + 0.2 * y0 + 0.2 * u)).sum()) / 2
    return total


def hidden_world(n: int, seed: int) -> tuple[SiteDataset, np.ndarray]:
    """The logged table (U not in it) and U."""
    rng = np.random.default_rng(seed)
    U = (rng.random(n) < 0.5).astype(np.int64)
    T, Y, P = np.zeros((n, 2), np.int64), np.zeros((n, 2), np.float32), np.zeros((n, 2), np.float32)
    for u in (0, 1):
        rows = U == u
        T[rows, 0] = rng.choice(3, size=int(rows.sum()), p=PI0[u])
        P[rows, 0] = PI0[u][T[rows, 0]]
    Y[:, 0] = rng.random(n) < P_Y0[T[:, 0]] + 0.3 * U
    for u in (0, 1):
        for y0 in (0, 1):
            rows = (U == u) & (Y[:, 0] == y0)
            pi = PI1[(u, y0)]
            T[rows, 1] = rng.choice(3, size=int(rows.sum()), p=pi)
            P[rows, 1] = pi[T[rows, 1]]
    Y[:, 1] = rng.random(n) < BASE1[T[:, 1]] + 0.2 * Y[:, 0] + 0.2 * U
    ds = SiteDataset(X=np.zeros((n, 1), np.float32), A=np.zeros((n, 2, 1), np.float32), T=T, Y=Y,
                     M=np.ones((n, 2), np.float32), n_actions=3, P=P, name=f"hidden_{seed}")
    return ds, U


def dr_answer(pol: Policy, test: SiteDataset, level: float = 0.9) -> dict:
    """The identified DR value over both steps, with a deliberately wrong outcome model (0.5 everywhere)."""
    pi, _ = incremental_target_probs(pol, test, (0, K))
    sums, _ = horizon_sums(pol.name, test, pi, np.full((test.n, 2), 0.5), [1, 2])
    return merge_identified(sums, [pol.name], None, level, binary=True, all_sent=lambda k: k in sums)[pol.name]


def test_share_weights_are_the_formula_from_the_logged_p_with_no_model_bound():
    test, _ = hidden_world(400, 1)
    test.M[:7, 1] = 0.0  # padding: weight 0, not counted
    for s in (0.1, 0.5, 1.0):
        pol = share(s)  # no logging-policy model bound: none is needed
        assert pol.behaviour is None
        pi, src = incremental_target_probs(pol, test, (0, K))
        valid = test.M > 0
        want = np.where(test.T == K, 1 - s + s / test.P, 1 - s)
        assert np.allclose((pi / test.P)[valid], want[valid]) and (pi[~valid] == 0).all()
        assert src == {"logged": float(valid.sum()), "model": 0.0}  # every weight from the log
    with pytest.raises(ValueError, match="logging-policy model"):
        incremental_target_probs(odds(2.0), test, (0, K))  # the odds policy cannot do without one here


def test_share_weights_have_mean_one_at_every_step_whatever_the_hidden_variable_and_odds_weights_do_not():
    """E_π[q / π | h_t, U] = Σ_a q(a | h_t, U) = 1: checked on the logged steps of each stratum of the unrecorded U.
    The odds policy's weights, with π_k from the site's model of the record, miss it where U = 0."""
    train, _ = hidden_world(8000, 2)
    test, U = hidden_world(20_000, 3)
    (inc,) = attach_behaviour([odds(4.0)], train, seed=0)
    w_share = incremental_target_probs(share(0.3), test, (0, K))[0] / test.P
    w_odds = incremental_target_probs(inc, test, (0, K))[0] / test.P
    for t in (0, 1):
        for u in (0, 1):
            ws = w_share[U == u, t]
            assert abs(ws.mean() - 1.0) < 4 * ws.std() / np.sqrt(len(ws)), (u, t, ws.mean())
        # where U = 0 the model's π_k (the population's) is far above the patient's: the weights at a_t ≠ k shrink
        assert abs(w_odds[U == 0, t].mean() - 1.0) > 0.15, (t, w_odds[U == 0, t].mean())


def test_the_share_dr_value_covers_the_truth_where_the_odds_policy_with_a_modelled_pi_k_is_biased():
    s_pol, o_pol = share(0.4), odds(4.0)
    truths = {p.name: true_value(p) for p in (s_pol, o_pol)}
    base = true_value(share(1e-9, name="logging"))
    assert abs(truths[s_pol.name] - base) > 0.02 and abs(truths[o_pol.name] - base) > 0.02  # both change the value
    est = {p.name: [] for p in (s_pol, o_pol)}
    covered = {p.name: 0 for p in (s_pol, o_pol)}
    unreached = {p.name: 0 for p in (s_pol, o_pol)}
    for rep in range(40):
        train, _ = hidden_world(2000, 5000 + rep)
        test, _ = hidden_world(1500, 6000 + rep)
        for pol in attach_behaviour([s_pol, o_pol], train, seed=rep):
            d = dr_answer(pol, test)
            h2 = d["horizons"][-1]
            est[pol.name].append(h2["estimate"])
            unreached[pol.name] += not h2["reached"]
            a = d["answer"]
            covered[pol.name] += a is not None and a["horizon"] == 2 and a["low"] <= truths[pol.name] <= a["high"]
    assert covered[s_pol.name] >= 30, covered  # nominal 90 % over 40 worlds (P(< 30) ≈ 0.3 % at 90 %)
    assert unreached[s_pol.name] <= 6, unreached  # exact weights: the mean-weight check is a 5 % one-sided test
    assert abs(np.mean(est[s_pol.name]) - truths[s_pol.name]) < 0.01
    # the odds policy's weights rest on the population's π_k, not the patient's: a bias its interval does not show,
    # but its mean weight product does (queries.targeted.reaches_policy): the horizon is mostly not identified
    assert abs(np.mean(est[o_pol.name]) - truths[o_pol.name]) > 0.03, (np.mean(est[o_pol.name]), truths[o_pol.name])
    assert covered[o_pol.name] <= 20, covered
    assert unreached[o_pol.name] >= 20, unreached


def test_the_mean_weight_product_shows_the_mass_the_sample_did_not_reach():
    """Σw/n of an identified horizon is 1 in expectation for exact weights; where the logging policy almost never
    gives k (DKT-Synth's tutor skips mastered items: π_k = ε there), a share of k puts mass the sample does not reach,
    and Σw/n falls short by about that mass: a truth-free flag of where the DR value leans on the simulator."""
    test, U = hidden_world(4000, 21)
    rows = dr_answer(share(0.3), test)["horizons"]
    assert [r["weight_mean"] for r in rows] == pytest.approx([1.0, 1.0], abs=0.05)
    # the U = 0 half of the patients now never receive k in the log (the weights at a_t ≠ k, 1 − s, need no P)
    blocked = (test.T == K) & (U[:, None] == 0)
    test.T[blocked], test.P[blocked] = 0, 0.7
    rows = dr_answer(share(0.3), test)["horizons"]
    # the U = 0 half loses s = 0.3 of its mass per step: Σw/n ≈ 1 − 0.5·(1 − 0.7^h)
    assert rows[0]["weight_mean"] == pytest.approx(0.85, abs=0.04)
    assert rows[1]["weight_mean"] == pytest.approx(0.745, abs=0.05)


def test_a_share_of_one_is_supported_where_always_k_is_and_a_share_below_one_everywhere():
    test, _ = hidden_world(300, 4)
    always_k = Policy.model_validate({"name": "always_k", "rule": {"kind": "static", "action": K}})
    assert np.array_equal(logged_support(share(1.0), test, 0, K, 2), logged_support(always_k, test, 0, K, 2))
    assert (logged_support(share(0.99), test, 0, K, 2) == 1.0).all()
    assert (logged_support(share(0.5), test.without_propensities(), 0, K, 2) == 1.0).all()  # no P needed


def test_P41_a_share_of_a_rare_action_cannot_single_out_the_one_patient_who_received_it():
    """P41 with shares: "give the action only patient 0 received at 10 % of the steps" against "give an action no
    patient received at 10 %" scales every other row's weights alike (0.9 per step) and moves patient 0's alone, so
    the difference of the two answers is one patient's: the site refuses the pair. A share of a common action against
    the logging policy moves every row's weight: admitted."""
    from fcd_secure.audit import Refusal  # noqa: PLC0415
    from fcd_secure.queries.budget import admit_question  # noqa: PLC0415

    test, _ = hidden_world(300, 12)
    test = replace(test, n_actions=4)  # action 3 is in the vocabulary; no test row received it
    moved = test.T == 2
    test.T[moved], test.P[moved] = 0, 0.5
    test.T[0, 0], test.P[0, 0] = 2, 0.2  # only patient 0 received action 2
    pair = [share(0.1, action=2, name="rare"), share(0.1, action=3, name="none_got_it")]
    with pytest.raises(Refusal) as exc:
        admit_question(pair, test, (0, K), 2, min_difference=10, record=None)
    assert exc.value.key == "policy_difference"
    common = attach_behaviour([odds(1.0, name="as_logged"), share(0.2, name="fifth")], hidden_world(500, 13)[0], 0)
    admit_question(common, test, (0, K), 2, min_difference=10, record=None)


# -- DKT-Synth and the tumour world: the oracle's truth and the what-if reply ------------------------------------------
def test_the_oracle_rolls_the_mixture_out_on_its_true_logging_probabilities(tiny_dkt_site):
    _, data, _ = tiny_dkt_site
    world, i = data.oracle, data.site_index
    always = next(p for p in default_policies() if p.name == "always")
    v_always = world.true_policy_value(always, i, "test", n_rollouts=4)[0]
    assert world.true_policy_value(share(1.0, action="anchor:on", name="all"), i, "test", n_rollouts=4)[0] == \
        pytest.approx(v_always, abs=1e-9)  # a share of 1 is Always, draw for draw
    v_log = world.true_policy_value(odds(1.0, action="anchor:on", name="logging"), i, "test", n_rollouts=4)[0]
    v_tiny = world.true_policy_value(share(1e-9, action="anchor:on", name="tiny"), i, "test", n_rollouts=4)[0]
    assert v_tiny == pytest.approx(v_log, abs=1e-9)  # a vanishing share is the logging policy
    v_half = world.true_policy_value(share(0.5, action="anchor:on", name="half"), i, "test", n_rollouts=4)[0]
    assert min(v_log, v_always) - 0.01 < v_half < max(v_log, v_always) + 0.01 and v_half != v_log


def test_the_tumour_oracle_rolls_it_out_too():
    from fcd_secure.data.tumour import TumourConfig, generate  # noqa: PLC0415

    world = generate(TumourConfig.from_preset("tiny"))
    always = next(p for p in default_policies() if p.name == "always")
    v_always = world.true_policy_value(always, 0, "test", n_rollouts=2)[0]
    assert world.true_policy_value(share(1.0, action="anchor:on", name="all"), 0, "test", n_rollouts=2)[0] == \
        pytest.approx(v_always, abs=1e-9)
    v_log = world.true_policy_value(odds(1.0, action="anchor:on", name="logging"), 0, "test", n_rollouts=2)[0]
    assert world.true_policy_value(share(0.3, action="anchor:on", name="s3"), 0, "test", n_rollouts=2)[0] != \
        pytest.approx(v_log, abs=1e-6)


def test_a_what_if_question_weighs_a_share_policy_from_the_logged_propensities_alone(tiny_dkt_site):
    from fcd_secure.cli.whatif import pi_k_lines  # noqa: PLC0415

    cfg, data, model = tiny_dkt_site
    pols = load_policy_refs(["always", "incremental_on_x2", "share_on_20"])
    req = WhatIfRequest(policies=pols, reference="always", horizon=5)
    reply = ask_policies(model, data.test, data, cfg, req)
    assert reply["whatif.pik.share_on_20.model"] == 0.0
    assert reply["whatif.pik.share_on_20.logged"] == data.test.M.sum()
    res = merge_policies([reply], req)
    sh = res["policies"]["share_on_20"]["identified"]
    assert sh["pi_k"]["logged_share"] == 1.0 and [r["horizon"] for r in sh["horizons"]] == [1, 2, 3, 5]
    assert all(r["ess"] > 0 for r in sh["horizons"])
    lines = {ln.split(":")[0]: ln for ln in pi_k_lines(res)}
    assert "no propensity model" in lines["share_on_20"] and "propensity models at the rest" in lines[
        "incremental_on_x2"]
    blind = ask_policies(model, data.test.without_propensities(), data, cfg, req)
    assert not any(k.startswith(("whatif.pik.", "whatif.id.")) for k in blind)  # no weights without propensities
    assert blind["whatif.support.share_on_20.sum"] == data.test.n

"""Truth-free federated model selection (issue 29 item 2, ``queries.selection``): the one-step DR discrepancy D₁ on the
sites' validation rows, merged exactly, the one-SE rule, a site without propensities, the kept and restored Θs, and
no ``select.*`` sum reaching the server in clear in secure mode."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.evaluation.discrepancy import DiscrepancySums, one_step_dr_terms  # noqa: E402
from fcd_secure.manifest import THETA_C, THETA_S  # noqa: E402
from fcd_secure.queries.base import Totals  # noqa: E402
from fcd_secure.queries.request import KEEP_FIELD, RESTORE_FIELD  # noqa: E402
from fcd_secure.queries.registry import metric_names  # noqa: E402
from fcd_secure.queries.selection import (  # noqa: E402
    KEYS,
    KeptParams,
    RoundScore,
    choose_round,
    site_selection_sums,
)
from conftest import SMALL_SCORED_RUN  # noqa: E402
from site_cases import sites_and_untrained_model  # noqa: E402

#: small DKT-Synth (1,500 students) on 4 even sites: every site has ≥ 20 validation and test students
SCORED = {"seed": 0, "data": {"preset": "small", "n_sites": 4, "alpha": 1000.0},
          "federation": {"clients_per_round": 4, "rounds": 3, "eval_every": 1}}


def _score(rnd, d1, se, fit, sites_scoring=4, sites=4, n=400):
    return RoundScore(round=rnd, d1=d1, se=se, mean=-d1, n=n, clipped_share=0.0, fit=fit, sites_scoring=sites_scoring,
                      sites=sites)


def test_the_gate_allows_every_selection_key():
    assert set(KEYS) <= set(metric_names([], None))


def test_the_rule_never_lets_the_validation_fit_decide_among_the_rounds_within_one_se_of_the_smallest_d1():
    scores = [_score(1, 0.30, 0.02, 0.60), _score(2, 0.05, 0.02, 0.70), _score(3, 0.06, 0.02, 0.65),
              _score(4, 0.10, 0.02, 0.50)]
    got = choose_round(scores, last_round=4)
    # round 4 fits best but its D1 is 2.5 SE above the smallest; round 1 is far off; 2 and 3 are within one SE (no
    # paired sums kept: the marginal SE, and the reason says so); round 3 fits better, the smaller D1 decides
    assert got["rule"] == "d1-paired-one-se" and got["candidates"] == [2, 3] and got["round"] == 2
    assert "marginal SE" in got["reason"] and "fit" not in got["reason"]
    assert got["coverage"] == "full"
    # with a natural-course gap on every candidate, the gap decides (issue 42 item 1)
    nc = [dataclasses.replace(s, nc=g) for s, g in zip(scores, (0.1, 0.09, 0.02, 0.0))]
    assert choose_round(nc, 4)["round"] == 3
    assert scores[0].alarm and not scores[1].alarm  # 0.30 > 3 × 0.02: the learned-confounding alarm


def test_a_round_whose_natural_course_failed_is_left_out_where_another_passed():
    # issue 42 (carry-over seed 1, both defaults): D1's window kept round 5 alone, whose natural course failed
    # (max |z| 3.06) while rounds 10 and 15 passed; its whole-trajectory value error was 0.119 against 0.057
    # (an SE of 0.003 stands for the paired one: D1's window is then one round wide)
    rows = [dataclasses.replace(_score(r, d1, 0.003, 0.6), nc=g, nc_passes=ok)
            for r, d1, g, ok in ((5, 0.0101, 0.040, False), (10, 0.0250, 0.019, True), (15, 0.0141, 0.027, True),
                                 (20, 0.0207, 0.033, False))]
    got = choose_round(rows, 20)
    assert got["round"] == 15 and 5 not in got["candidates"] and 20 not in got["candidates"]
    assert "natural course failed: round 5, round 20" in got["reason"]
    without = choose_round(rows, 20, natural_course_gate=False)
    assert without["round"] == 5 and "natural course failed" not in without["reason"]
    # every checked round failed: none is left out, and the reason says so
    failing = [dataclasses.replace(r, nc_passes=False) for r in rows]
    got = choose_round(failing, 20)
    assert got["round"] == without["round"] and "failed in every round checked: none left out" in got["reason"]
    # a round never checked is not left out with the failed ones
    mixed = [dataclasses.replace(rows[0], nc_passes=None), *rows[1:]]
    assert choose_round(mixed, 20)["round"] == 5
    # no round checked (DKT-Synth's scored rounds before issue 42, a reproduction's learning rates): the rule as before
    unchecked = [dataclasses.replace(r, nc_passes=None) for r in rows]
    assert choose_round(unchecked, 20)["round"] == without["round"]
    # the flag survives rounds.json (as_row / from_row), so `fcd select` applies the same gate across runs
    assert [RoundScore.from_row(r.as_row()).nc_passes for r in rows] == [False, True, True, False]
    # a rounds.json row whose selection predates the flag (a resumed run) takes its round's natural_course verdict
    old = {k: v for k, v in rows[0].as_row().items() if k != "nc_passes"}
    assert RoundScore.from_round({"selection": old, "natural_course": {"passes": False}}).nc_passes is False
    assert RoundScore.from_round({"selection": rows[1].as_row(), "natural_course": {"passes": False}}).nc_passes


def test_without_any_d1_the_last_round_is_kept_and_the_output_says_why():
    got = choose_round([_score(1, math.nan, math.nan, 0.6, sites_scoring=0, n=0)], last_round=7)
    assert got["round"] == 7 and got["rule"] == "last" and got["coverage"] == "unavailable"
    assert "no site could score" in got["reason"]


def test_a_criterion_some_sites_could_not_score_is_partial():
    got = choose_round([_score(1, 0.1, 0.05, 0.6, sites_scoring=3), _score(2, 0.2, 0.05, 0.6, sites_scoring=3)], 2)
    assert got["coverage"] == "partial" and got["round"] == 1


@pytest.fixture(scope="module")
def scored():
    return sites_and_untrained_model(SCORED)


def test_validation_rows_are_whole_entities_apart_from_training_and_test(scored):
    cfg, data, _ = scored
    for d in data:
        assert d.validation is not None and d.validation.n >= 20
        ids = [set(np.asarray(x.meta["entity"]).tolist()) for x in (d.train, d.validation, d.test)]
        assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]
        frac = d.validation.n / (d.validation.n + d.train.n)
        assert abs(frac - cfg.data.validation_fraction) < 0.05


def test_one_step_probs_is_the_factual_prediction_where_the_logged_action_is_the_one_asked(scored):
    _, data, model = scored
    v = data[0].validation
    for a in data[0].anchors:
        p, f = model.one_step_probs(v, a), model.factual_probs(v)
        hit = (v.T == a) & (v.M > 0)
        assert hit.any()
        np.testing.assert_allclose(p[hit], f[hit], atol=1e-6)
        assert not np.allclose(p[~hit & (v.M > 0)], f[~hit & (v.M > 0)])  # elsewhere the action changed the answer


def test_merged_site_sums_give_the_pooled_d1_se_and_fit_exactly(scored):
    _, data, model = scored
    sums = [site_selection_sums(model, d, binary=True, floor=20) for d in data]
    totals = Totals.of_sites(sums)
    score = RoundScore.from_totals(5, totals, 4)
    terms, fits = [], []
    for d in data:
        v = d.validation
        a_off, a_on = d.anchors
        terms.append(one_step_dr_terms(v.Y, v.M, v.T, v.P, model.one_step_probs(v, a_on), model.one_step_probs(v, a_off),
                                       a_on, a_off))
        p = np.clip(model.factual_probs(v)[v.M > 0], 1e-6, 1 - 1e-6)
        y = v.Y[v.M > 0]
        fits.append(-(y * np.log(p) + (1 - y) * np.log(1 - p)))
    pooled = np.clip(np.concatenate(terms), -50, 50)
    assert score.n == pooled.size and score.sites_scoring == 4 and score.coverage == "full"
    assert score.d1 == pytest.approx(abs(pooled.mean()), abs=1e-9)
    assert score.se == pytest.approx(pooled.std(ddof=1) / math.sqrt(pooled.size), abs=1e-9)
    assert score.fit == pytest.approx(np.concatenate(fits).mean(), abs=1e-9)


def test_a_site_without_propensities_or_below_its_floor_sends_no_discrepancy(scored):
    _, data, model = scored
    d = data[0]
    blind = type(d)(**{**d.__dict__, "validation": d.validation.without_propensities()})
    got = site_selection_sums(model, blind, binary=True, floor=20)
    assert got["select.d1.n"] == 0 and got["select.sites"] == 0 and got["select.fit.n"] > 0
    small = site_selection_sums(model, d, binary=True, floor=d.validation.n + 1)
    assert all(v == 0 for v in small.values())


def test_d1_is_near_zero_for_the_true_outcome_model_and_not_for_a_biased_one():
    """Known answer: with the true propensities and μ̂ = the true E[Y | H, do(a)], E[ψ] = 0; a model whose contrast is
    off by δ has E[ψ] = −δ·(share of steps at the two anchors … ) — D₁ moves away from 0 by many SEs."""
    rng = np.random.default_rng(3)
    n, L = 4000, 3
    x = rng.normal(size=(n, L))
    p_on = 1 / (1 + np.exp(-x))  # confounded logging: the same x raises the treatment and the outcome
    T = (rng.random((n, L)) < p_on).astype(np.int64)
    mu_off, mu_on = 1 / (1 + np.exp(-(x - 0.5))), 1 / (1 + np.exp(-(x + 0.5)))
    Y = (rng.random((n, L)) < np.where(T == 1, mu_on, mu_off)).astype(float)
    P = np.where(T == 1, p_on, 1 - p_on)
    M = np.ones((n, L))
    good = DiscrepancySums.from_terms(one_step_dr_terms(Y, M, T, P, mu_on, mu_off, 1, 0))
    bad = DiscrepancySums.from_terms(one_step_dr_terms(Y, M, T, P, mu_on + 0.1, mu_off - 0.1, 1, 0))
    assert good.d1() < 2 * good.se()
    assert bad.mean() == pytest.approx(-0.2, abs=3 * bad.se()) and bad.d1() > 10 * bad.se()


def test_kept_parameters_round_trip(tmp_path):
    kept = KeptParams(tmp_path / "k")
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    kept.keep(3, a)
    kept.keep(4, None)
    np.testing.assert_array_equal(kept.load(3)["w"], a["w"])
    assert kept.load(4) is None
    with pytest.raises(FileNotFoundError):
        kept.load(5)


def test_a_site_answers_with_the_theta_s_it_kept_for_the_chosen_round(tmp_path):
    from fcd_secure.apps.site import SiteRuntime

    cfg = build_config("tiny", {**SCORED, "state_dir": str(tmp_path)})
    rt = SiteRuntime(cfg, "site-00", 0, str(tmp_path))
    theta = rt.model.get_params(THETA_C)
    conf = {"server-round": 1, "part": THETA_C, "local-epochs": 1}
    theta, _, _ = rt.train_round(theta, conf)
    ev = {"quick": True, "part": THETA_C, "n-samples": 1, "max-rows": -1}
    rt.evaluate(theta, {**ev, KEEP_FIELD: 1})
    kept = {k: v.copy() for k, v in rt.state.load().theta_s.items()}
    rt.train_round(theta, {**conf, "server-round": 2})
    later = rt.state.load().theta_s
    assert any(not np.array_equal(kept[k], later[k]) for k in kept)
    fresh = SiteRuntime(cfg, "site-00", 0, str(tmp_path))
    model = fresh.load_for_eval(theta, THETA_C, restore_round=1)
    restored = model.get_params(THETA_S)
    for k in kept:
        np.testing.assert_array_equal(restored[k], kept[k])
    out = fresh.evaluate(theta, {**ev, RESTORE_FIELD: 1})
    assert "select.d1.n" not in out  # only a scored round adds the validation sums


@pytest.mark.slow
@pytest.mark.xdist_group(SMALL_SCORED_RUN)
def test_a_secure_run_scores_every_round_answers_with_the_chosen_one_and_no_select_sum_arrives_in_clear(
        small_scored_run):
    from fcd_secure.audit.ledger import SERVER_LEDGER_FILE

    # the session's secure run of SCORED's data on 2 rounds (conftest.small_scored_run), read, never changed
    _, res, state, out = small_scored_run
    rows = [r for r in res.history if r.get("selection")]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["selection"]["coverage"] == "full" and r["d1"] is not None and r["d1_se"] > 0 for r in rows)
    sel = res.extra["selection"]
    assert sel["rule"] == "d1-paired-one-se" and sel["round"] in sel["candidates"]
    assert "marginal SE" not in sel["reason"]  # every site kept its terms: each comparison is paired
    scores = {r["round"]: RoundScore.from_row(r["selection"]) for r in rows}
    best = min(scores.values(), key=lambda s: s.d1)
    assert all(scores[c].d1 <= best.d1 + scores[c].paired_se(best) + 1e-12 for c in sel["candidates"])
    # the paired SE is the SE of a difference on shared validation steps: far smaller than either round's own
    assert scores[2].paired_se(scores[1]) < scores[2].se
    # the answer's Θc is the chosen round's, kept by the server
    chosen = KeptParams(state / "_server" / "selection").load(sel["round"])
    for k, v in chosen.items():
        np.testing.assert_array_equal(res.theta[k], v)
    received = [json.loads(x) for x in (state / "_server" / "audit" / SERVER_LEDGER_FILE).read_text().splitlines()
                if x.strip()]
    received = [r for r in received if r["kind"] == "received"]
    assert received and not any(r["metrics"] or r["metric_lists"] or r["tensors"] for r in received)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["selection"]["round"] == sel["round"]
    csv = (out / "rounds.csv").read_text().splitlines()
    assert "d1,d1_se,d1_alarm,validation_fit,dh,dh_se,dh_ess,selected" in csv[0]


# -- D_h: the multi-step discrepancy with its support check ----------------------------------------------------------
def _two_step_world(n: int, seed: int):
    """Two steps, a confounder X ∈ {0, 1} that raises both the chance of a_on (0.2 → 0.8) and the outcome; the true
    per-step value of "a_on at every step" is 0.3 + 0.2X + 0.2 at t = 0 and + 0.3 at t = 1 (the action at t − 1 adds
    0.1), of "a_off at every step" 0.3 + 0.2X at both steps. Returns the logs and both regimes' true step values."""
    from fcd_secure.evaluation.discrepancy import horizon_dr_terms  # noqa: F401 - the function under test

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2, n).astype(float)
    p_on = 0.2 + 0.6 * x
    T = (rng.random((n, 2)) < p_on[:, None]).astype(np.int64)  # 1 = a_on, 0 = a_off
    P = np.where(T == 1, p_on[:, None], 1 - p_on[:, None])
    prev = np.concatenate([np.zeros((n, 1)), T[:, :1]], axis=1)
    Y = (rng.random((n, 2)) < 0.3 + 0.2 * x[:, None] + 0.2 * T + 0.1 * prev).astype(float)
    v_on = np.stack([0.5 + 0.2 * x, 0.6 + 0.2 * x], axis=1)
    v_off = np.stack([0.3 + 0.2 * x, 0.3 + 0.2 * x], axis=1)
    return Y, np.ones((n, 2)), T, P, v_on, v_off


def test_dh_of_the_true_model_is_zero_and_of_a_biased_model_its_bias_with_true_propensities():
    from fcd_secure.evaluation.discrepancy import HorizonDiscrepancySums, horizon_dr_terms

    Y, M, T, P, v_on, v_off = _two_step_world(40_000, seed=3)
    psi, w_on, w_off = horizon_dr_terms(Y, M, T, P, v_on, v_off, a_on=1, a_off=0, h=2)
    d = HorizonDiscrepancySums.from_terms(psi, w_on, w_off).discrepancy()
    assert abs(d.mean()) < 4 * d.se()  # the right model: nothing left to correct
    # a model whose "always a_on" is 0.1 too high at both steps: the correction says the true contrast is 0.1 lower
    psi_b, _, _ = horizon_dr_terms(Y, M, T, P, v_on + 0.1, v_off, a_on=1, a_off=0, h=2)
    db = HorizonDiscrepancySums.from_terms(psi_b, w_on, w_off).discrepancy()
    assert abs(db.mean() + 0.1) < 4 * db.se() and db.d1() > 5 * db.se()
    # the naive contrast of the logs is confounded by X: the discrepancy of a model that copies it is far from zero
    naive_on = np.full_like(v_on, Y[T[:, 0] == 1, 0].mean())
    naive_off = np.full_like(v_off, Y[T[:, 0] == 0, 0].mean())
    dn = HorizonDiscrepancySums.from_terms(*horizon_dr_terms(Y, M, T, P, naive_on, naive_off, 1, 0, 2)).discrepancy()
    assert dn.d1() > 5 * dn.se()


def test_dh_sums_merge_to_the_pooled_figures_and_the_ess_is_each_regimes_kish_size():
    from fcd_secure.evaluation.discrepancy import HorizonDiscrepancySums, horizon_dr_terms

    Y, M, T, P, v_on, v_off = _two_step_world(3_000, seed=4)
    psi, w_on, w_off = horizon_dr_terms(Y, M, T, P, v_on, v_off, 1, 0, 2)
    parts = [HorizonDiscrepancySums.from_terms(psi[i::3], w_on[i::3], w_off[i::3]) for i in range(3)]
    merged, pooled = HorizonDiscrepancySums.merge_all(parts), HorizonDiscrepancySums.from_terms(psi, w_on, w_off)
    assert merged.n == pooled.n and math.isclose(merged.s, pooled.s, rel_tol=1e-9, abs_tol=1e-9)
    kish = min(w_on.sum() ** 2 / (w_on ** 2).sum(), w_off.sum() ** 2 / (w_off ** 2).sum())
    assert math.isclose(merged.ess(), kish, rel_tol=1e-9)
    # an entity that left "a_on at every step" at either step carries weight 0 in that regime
    assert (w_on[(T == 0).any(axis=1)] == 0).all() and (w_off[(T == 1).any(axis=1)] == 0).all()


def test_a_supported_dh_narrows_the_candidates_and_an_unsupported_one_is_left_out():
    def sc(rnd, d1, fit, dh, ess):
        return RoundScore(round=rnd, d1=d1, se=0.02, mean=-d1, n=400, clipped_share=0.0, fit=fit, sites_scoring=4,
                          sites=4, dh=dh, dh_se=0.02, dh_ess=ess)

    # rounds 2 and 3 are within one SE on D1; round 3 fits better but its D2 is far off: round 2 is answered with
    scores = [sc(1, 0.30, 0.6, 0.30, 80), sc(2, 0.05, 0.7, 0.04, 80), sc(3, 0.06, 0.65, 0.20, 80)]
    got = choose_round(scores, 3)
    assert got["rule"] == "d1-paired-and-dh-one-se" and got["round"] == 2 and got["candidates"] == [2]
    # the same D2 figures with 5 effective followers of a regime: not supported, D1's rule alone (round 3)
    weak = [sc(1, 0.30, 0.6, 0.30, 5), sc(2, 0.05, 0.7, 0.04, 5), sc(3, 0.06, 0.65, 0.20, 5)]
    got = choose_round(weak, 3)
    assert got["rule"] == "d1-paired-one-se" and got["round"] == 2 and "not supported" in got["reason"]
    assert got["scores"][0]["dh_supported"] is False


def test_candidates_the_fit_cannot_tell_apart_are_told_apart_by_a_supported_dh():
    """One network rolled out two ways (``model.rollout``): the same one-step predictions, hence the same D1 and
    validation fit; only the multi-step discrepancy differs, and it decides, not the candidates' order."""
    def sc(rnd, dh, ess=80, dh_se=0.05):
        return RoundScore(round=rnd, d1=0.01, se=0.005, mean=-0.01, n=400, clipped_share=0.0, fit=0.5,
                          sites_scoring=4, sites=4, dh=dh, dh_se=dh_se, dh_ess=ess)

    for order in ((0.03, 0.01), (0.01, 0.03)):  # within one SE of each other on D2 either way
        got = choose_round([sc(1, order[0]), sc(2, order[1])], 2)
        assert got["candidates"] == [1, 2] and got["round"] == 1 + order.index(0.01)
        assert "the smallest D2" in got["reason"]
    # a better validation fit never decides (issue 42 item 5)
    a, b = sc(1, 0.01), sc(2, 0.03)
    better = dataclasses.replace(b, fit=b.fit * (1 - 1e-1))
    assert choose_round([a, better], 2)["round"] == 1
    # unsupported D2 takes no part: the tie goes to the later candidate
    got = choose_round([sc(1, 0.01, ess=5), sc(2, 0.03, ess=5)], 2)
    assert got["round"] == 2


def test_the_window_is_the_paired_se_of_the_difference_kept_on_the_site(tmp_path):
    """Issue 42 item 5: candidates share their validation noise, so a window of one marginal SE makes rounds whose D1
    differ far beyond chance look tied. The site keeps each round's terms and sends paired sums; the server's window
    is one SE of the difference."""
    from fcd_secure.queries.selection import PAIR_LISTS, KeptTerms

    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1.0, 2_000)  # the validation noise every round shares
    noise -= noise.mean()
    kept = KeptTerms(tmp_path / "terms")
    rows = []
    for rnd, bias in ((1, 0.035), (2, 0.02), (3, 0.03)):
        terms = noise + bias + rng.normal(0, 0.02, noise.size)
        sums = kept.paired_sums(rnd, terms)
        d = DiscrepancySums.from_terms(terms)
        totals = Totals({"select.d1.n": d.n, "select.d1.s": d.s, "select.d1.ss": d.ss, "select.d1.clipped": 0,
                         "select.fit.n": 1.0, "select.fit.s": 0.5, "select.sites": 1.0, **sums}, sites=1)
        rows.append(RoundScore.from_totals(rnd, totals, 1))
    assert set(PAIR_LISTS) <= set(sums) and sorted(rows[2].pairs) == [1, 2]
    marginal = choose_round([dataclasses.replace(r, pairs={}) for r in rows], 3)
    paired = choose_round(rows, 3)
    # one marginal SE (≈ 0.022) spans all three rounds; the paired SE (≈ 0.0006) separates them
    assert marginal["candidates"] == [1, 2, 3] and "marginal SE" in marginal["reason"]
    assert paired["candidates"] == [2] and paired["round"] == 2 and "marginal" not in paired["reason"]
    assert rows[2].paired_se(rows[1]) < rows[2].se / 10
    # a round replayed against another split (different step count) keeps no pair
    assert KeptTerms(tmp_path / "terms").paired_sums(4, noise[:10])["select.pair.n"] == [0.0] * 128

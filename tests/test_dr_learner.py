"""The federated DR-learner of per-entity one-step effects (issue 29 item 4, ``queries.dr_learner``): the merged sums
solve to the pooled ridge, β recovers a known heterogeneous effect, pseudo-outcomes come from the validation rows only,
a site without propensities sends n = 0, and no ``drl.*`` sum reaches the server in clear in secure mode."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.data.schema import SiteDataset  # noqa: E402
from fcd_secure.evaluation.metrics import EffectStats  # noqa: E402
from fcd_secure.queries import dr_learner as drl  # noqa: E402
from fcd_secure.queries.base import Totals  # noqa: E402
from fcd_secure.queries.request import EvaluationRequest  # noqa: E402
from conftest import SMALL_SCORED, SMALL_SCORED_RUN  # noqa: E402
from site_cases import sites_and_untrained_model  # noqa: E402

#: small DKT-Synth (1,500 students) on 4 even sites: every site has ≥ 20 validation and test students
SMALL = SMALL_SCORED


def _pooled_ridge(X, y, w, lam):
    """The weighted ridge in plain numpy on the pooled rows: slopes penalised by λ Σw var_w(x_j), intercept free."""
    sw = w.sum()
    mean = (w[:, None] * X).sum(0) / sw
    var = (w[:, None] * (X - mean) ** 2).sum(0) / sw
    pen = np.maximum(lam * sw * var, 1e-9 * sw)
    pen[0] = 0.0
    lhs = X.T @ (w[:, None] * X) + np.diag(pen)
    beta = np.linalg.solve(lhs, X.T @ (w * y))
    hat_trace = np.trace(np.linalg.solve(lhs, X.T @ (w[:, None] * X)))
    rss = float((w * (y - X @ beta) ** 2).sum())
    return beta, len(y) * rss / (len(y) - hat_trace) ** 2


def test_merged_site_sums_solve_to_the_pooled_weighted_ridge():
    rng = np.random.default_rng(3)
    parts, rows = [], []
    for n in (150, 90, 260):
        scale, shift = rng.uniform(0.1, 5, drl.K - 1), rng.normal(size=drl.K - 1)
        X = np.c_[np.ones(n), rng.normal(size=(n, drl.K - 1)) * scale + shift]
        y = X @ rng.normal(size=drl.K) + rng.normal(size=n) * 2
        w = rng.uniform(0.2, 3.0, n)
        parts.append(drl.ridge_sums(X, y, w))
        rows.append((X, y, w))
    totals = Totals.of_sites(parts)
    X, y, w = (np.concatenate([r[i] for r in rows]) for i in range(3))
    fit = drl.solve(drl.fit_totals(totals), sites=3)
    assert fit["coverage"] == "full" and fit["n"] == 500 and fit["sites_scoring"] == 3
    gcvs = {lam: _pooled_ridge(X, y, w, lam)[1] for lam in drl.LAMBDAS}
    assert fit["lambda"] == min(gcvs, key=gcvs.get)  # GCV from the sums picks the pooled GCV's λ
    beta, gcv = _pooled_ridge(X, y, w, fit["lambda"])
    np.testing.assert_allclose(fit["beta"], beta, rtol=1e-9, atol=1e-9)
    assert fit["gcv"] == pytest.approx(gcv, rel=1e-9)
    for lam in (0.0, 1.0):
        A, b = drl._matrices(drl.fit_totals(totals))
        np.testing.assert_allclose(drl.ridge_solution(A, b, float(w.sum()), lam), _pooled_ridge(X, y, w, lam)[0],
                                   rtol=1e-9, atol=1e-9)


def _known_world(n=3000, L=8, seed=0):
    """Two actions logged at random (P = 0.5); the effect of a_on = 1 over a_off = 0 at step t is 0.1 + 0.3 Y_{t−1}
    (Y_{−1} := 0.5): it depends on the history feature ``last_outcome`` only."""
    rng = np.random.default_rng(seed)
    T = rng.integers(0, 2, size=(n, L))
    Y = np.zeros((n, L))
    tau = np.zeros((n, L))
    prev = np.full(n, 0.5)
    for t in range(L):
        tau[:, t] = 0.1 + 0.3 * prev
        p = 0.3 + T[:, t] * tau[:, t]
        Y[:, t] = (rng.uniform(size=n) < p).astype(float)
        prev = Y[:, t]
    ds = SiteDataset(X=np.zeros((n, 1)), A=np.zeros((n, L, 1)), T=T.astype(np.int64), Y=Y, M=np.ones((n, L)),
                     n_actions=2, P=np.full((n, L), 0.5))
    return ds, tau


def test_on_a_known_answer_world_beta_recovers_the_effect_despite_a_wrong_outcome_model():
    ds, tau = _known_world()
    anchors = (0, 1)
    mu = np.full(ds.Y.shape, 0.5)  # a wrong outcome model: no effect at all; the pseudo-outcomes correct it
    X = drl.effect_features(ds, mu, mu, anchors)[ds.M > 0]
    phi = drl.pseudo_outcomes(ds, mu, mu, anchors)
    assert phi.mean() == pytest.approx(tau.mean(), abs=0.03)
    fit = drl.solve(drl.fit_totals(drl.ridge_sums(X, phi)), sites=1, lambdas=(0.0,))
    beta = np.asarray(fit["beta"])
    tau_hat = X @ beta
    es = EffectStats.from_arrays(tau_hat, tau[ds.M > 0])
    assert es.corr() > 0.9 and es.skill() > 0.7
    assert beta[drl.FEATURES.index("last_outcome")] == pytest.approx(0.3, abs=0.08)


def test_a_shift_of_the_estimates_is_read_off_the_sums_exactly():
    rng = np.random.default_rng(5)
    tau_hat, tau = rng.normal(0.1, 0.2, 400), rng.normal(-0.05, 0.15, 400)
    for delta in (-0.3, 0.0, 0.07):
        got = EffectStats.from_arrays(tau_hat, tau).shifted(delta)
        want = EffectStats.from_arrays(tau_hat + delta, tau)
        for k in EffectStats.SUMS:
            assert getattr(got, k) == pytest.approx(getattr(want, k), rel=1e-9, abs=1e-9)


def test_the_intercept_is_the_least_squares_one_of_the_validation_and_test_rows_with_the_slopes_held(small):
    """β is fitted on the validation rows (GCV's λ); the reported effects are βᵀx + δ with δ the intercept that
    minimises the squared residuals of the validation and the test rows' pseudo-outcomes together, slopes held.
    Their spread and corr stay β's own; β's own figures are kept beside."""
    _, data, model = small
    fit = drl.solve(drl.fit_totals(Totals.of_sites([drl.site_fit_sums(model, d, floor=20) for d in data])), sites=4)
    beta = np.asarray(fit["beta"])
    parts, resid_val, resid_test, taus, hats, ents = [], [], [], [], [], []
    for d in data:
        ents.append(np.nonzero(d.test.M > 0)[0] + 10_000 * d.site_index)
        a_off, a_on = d.anchors
        for rows, into in ((d.validation, resid_val), (d.test, resid_test)):
            mu_on, mu_off = model.one_step_probs(rows, a_on), model.one_step_probs(rows, a_off)
            x = drl.effect_features(rows, mu_on, mu_off, d.anchors)[rows.M > 0]
            into.append(drl.pseudo_outcomes(rows, mu_on, mu_off, d.anchors) - x @ beta)
        truth = np.random.default_rng(d.site_index).normal(-0.05, 0.1, d.test.Y.shape)
        parts.append(drl.site_effect_sums(model, d.test, d.anchors, beta, truth))
        taus.append(truth[d.test.M > 0])
        hats.append(drl.effect_features(d.test, *(model.one_step_probs(d.test, a) for a in (a_on, a_off)),
                                         d.anchors)[d.test.M > 0] @ beta)
    r_val, r_test, tau, hat = (np.concatenate(x) for x in (resid_val, resid_test, taus, hats))
    # what the pooling rests on: the validation residuals sum to 0 at the fitted β (its intercept is not penalised)
    assert abs(r_val.sum()) < 1e-6 * r_val.size and r_val.size == fit["n"]
    delta = np.concatenate([r_val, r_test]).mean()  # the least-squares intercept shift of both sets of rows
    out = drl.merge_effects(Totals.of_sites(parts), fit_steps=fit["n"])
    icpt = out["intercept"]
    assert icpt["shift"] == pytest.approx(delta, rel=1e-6) and icpt["coverage"] == "full"
    assert icpt["test_steps"] == r_test.size and icpt["validation_steps"] == fit["n"]
    assert icpt["beta_mean"] == pytest.approx(hat.mean(), rel=1e-9)
    want, own = EffectStats.from_arrays(hat + icpt["shift"], tau), EffectStats.from_arrays(hat, tau)
    assert out["dr_learner"]["pehe"] == pytest.approx(want.pehe(), rel=1e-9)
    assert out["dr_learner"]["skill"] == pytest.approx(want.skill(), rel=1e-9)
    assert out["dr_learner"]["corr"] == pytest.approx(own.corr(), rel=1e-9)
    assert icpt["unshifted"]["skill"] == pytest.approx(own.skill(), rel=1e-9)
    # the held-out check of the reported effects βᵀx + δ, with δ's share of test steps, in plain numpy
    phi, ent = r_test + hat, np.unique(np.concatenate(ents), return_inverse=True)[1]
    c, a, M = phi.mean(), hat + icpt["shift"], phi.size
    nE = ent.max() + 1
    var_c = nE / (nE - 1) * (np.bincount(ent, weights=phi - c) ** 2).sum() / M ** 2
    gain = ((phi - c) ** 2 - (phi - a) ** 2).mean() + var_c * (1 - 2 * M / (M + fit["n"]))
    chk = out["dr_learner"]["heldout"]
    assert chk["gain"] == pytest.approx(gain, rel=1e-6) and chk["steps"] == M and chk["entities"] == nE
    assert chk["true_gain"] == pytest.approx(want.sd_true() ** 2 - want.pehe() ** 2, rel=1e-9)
    assert out["simulator"]["heldout"]["steps"] == M and "true_gain" in out["simulator"]["heldout"]
    # nothing new leaves a site: its residual sums are its one-step sums minus its Στ̂ (both sent already)
    from fcd_secure.queries.targeted import one_step_sums

    d = data[1]
    sent = one_step_sums(model, d.test, d.anchors)
    assert parts[1]["drl.effect.resid"] == pytest.approx(sent["onestep.s"] - parts[1]["drl.effect.sum_hat"], abs=1e-9)
    assert parts[1]["drl.effect.resid_n"] == sent["onestep.m"]
    # a test split without logged propensities sends no residual sums: alone, its effects are β's own ...
    d = data[0]
    bare = drl.site_effect_sums(model, d.test.without_propensities(), d.anchors, beta, None)
    assert not any(k.startswith("drl.effect.resid") for k in bare) and bare["drl.effect.n"] > 0
    alone = drl.merge_effects(bare, fit_steps=fit["n"])
    assert "intercept" not in alone and alone["dr_learner"]["mean_tau_hat"] == pytest.approx(
        bare["drl.effect.sum_hat"] / bare["drl.effect.n"])
    # ... beside the others, the shift comes from their rows and the output says it is partial
    mixed = drl.merge_effects(Totals.of_sites([bare, *parts[1:]]), fit_steps=fit["n"])
    assert mixed["intercept"]["coverage"] == "partial"
    # the held-out check covers the sites with propensities only: fewer steps, and no truth on other steps
    part = mixed["dr_learner"]["heldout"]
    assert part["steps"] < mixed["steps"] and "true_gain" not in part
    assert mixed["intercept"]["test_steps"] == sum(p["drl.effect.resid_n"] for p in parts[1:])
    # a residual total that is not finite is said, and β's own intercept kept
    broken = drl.merge_effects({**Totals.of_sites(parts), "drl.effect.resid": float("nan")}, fit_steps=fit["n"])
    assert broken["intercept"]["shift"] is None and "not finite" in broken["intercept"]["why"]
    assert broken["dr_learner"]["skill"] == pytest.approx(own.skill(), rel=1e-9)


def _heldout_world(rng, sites=(40, 25, 60), L=12):
    """Per site: flat φ = τ + noise (s.d. 2, as DKT-Synth's pseudo-outcomes), τ (s.d. 0.15), each step's entity."""
    out = []
    for n in sites:
        steps = rng.integers(3, L + 1, n)
        entity = np.repeat(np.arange(n), steps)
        tau = -0.05 + 0.15 * rng.standard_normal(n)[entity] + 0.05 * rng.standard_normal(entity.size)
        out.append((tau + 2.0 * rng.standard_normal(entity.size), tau, entity, n))
    return out


def test_the_heldout_check_merged_over_sites_equals_the_pooled_numpy_figures():
    """The gain Σ(φ − c)² − (φ − τ̂ − δ)² per step with c the mean φ, and its cluster-robust SE over entities."""
    rng = np.random.default_rng(11)
    world = _heldout_world(rng)
    hats = [0.7 * tau + 0.1 * rng.standard_normal(tau.size) for _, tau, _, _ in world]
    sums = Totals.of_sites([drl.check_sums("effect", phi, hat, ent, n) for (phi, _, ent, n), hat in zip(world, hats)])
    phi = np.concatenate([w[0] for w in world])
    hat = np.concatenate(hats)
    ent = np.concatenate([w[2] + 1000 * i for i, w in enumerate(world)])  # entities are per site
    for delta in (0.0, -0.04):
        got = drl.heldout_check(sums, "effect", delta)
        c = phi.mean()
        g = (phi - c) ** 2 - (phi - hat - delta) ** 2
        G = np.unique(ent, return_inverse=True)[1]
        per = np.bincount(G, weights=g)
        n = per.size
        se = np.sqrt(n / (n - 1) * ((per - per.mean()) ** 2).sum()) / g.size
        # the constant's own sampling variance (cluster-robust), added back to the gain
        var_c = n / (n - 1) * ((np.bincount(G, weights=phi - c)) ** 2).sum() / g.size ** 2
        assert got["entities"] == n == sum(w[3] for w in world) and got["steps"] == g.size
        assert got["constant"] == pytest.approx(c, rel=1e-12)
        assert got["constant_se"] == pytest.approx(np.sqrt(var_c), rel=1e-9)
        assert got["gain"] == pytest.approx(g.mean() + var_c, rel=1e-9, abs=1e-12)
        # held fixed, c leaves the SE to first order; its second-order share 2·Var(c)² is added
        assert got["se"] == pytest.approx(np.sqrt(se ** 2 + 2 * var_c ** 2), rel=1e-9)
    share = drl.heldout_check(sums, "effect", -0.04, delta_share=0.6)  # δ fitted 60 % on these steps' φ
    assert share["gain"] == pytest.approx(got["gain"] - 2 * 0.6 * got["constant_se"] ** 2, rel=1e-9)
    assert drl.heldout_check({}, "effect") is None  # no logged propensities: no check


def test_the_heldout_check_shows_effects_that_beat_the_constant_and_not_those_that_do_not():
    """Truth-free: with pseudo-outcomes alone the check tells per-entity effects that order entities (τ̂ = τ) from
    ones that do not (τ̂ = τ of another entity); its true gain is read off the oracle's sums on the same steps."""
    rng = np.random.default_rng(2)
    world = _heldout_world(rng, sites=(400, 300, 500), L=20)
    tau = np.concatenate([w[1] for w in world])
    verdicts = {}
    for name, hat in (("right", tau), ("shuffled", rng.permutation(tau))):
        parts, at = [], 0
        for phi, t, ent, n in world:
            parts.append(drl.check_sums("effect", phi, hat[at:at + t.size], ent, n))
            at += t.size
        truth = EffectStats.from_arrays(hat, tau)
        chk = drl.heldout_check(Totals.of_sites(parts), "effect", truth=truth)
        assert chk["true_gain"] == pytest.approx(tau.var() - ((tau - hat) ** 2).mean(), rel=1e-9)  # skill · sd²τ
        assert chk["true_gain"] == pytest.approx(truth.skill() * truth.sd_true() ** 2, rel=1e-9)
        assert abs(chk["gain"] - chk["true_gain"]) < 3 * chk["se"]
        verdicts[name] = chk
    assert verdicts["right"]["verdict"] == "shown" and verdicts["right"]["z"] > drl.CHECK_Z
    assert verdicts["shuffled"]["verdict"] == "worse than the constant" and verdicts["shuffled"]["z"] < -drl.CHECK_Z
    # effects that vary a little, not with τ: neither shown nor worse (the loss of a spread k is k², its SE ∝ k)
    parts, at = [], 0
    small_hat = tau.mean() + 0.005 * rng.standard_normal(tau.size)
    for phi, t, ent, n in world:
        parts.append(drl.check_sums("effect", phi, small_hat[at:at + t.size], ent, n))
        at += t.size
    assert drl.heldout_check(Totals.of_sites(parts), "effect")["verdict"] == "not shown"


def test_a_constant_is_not_shown_better_than_the_constant_over_many_draws():
    """The gain holds −(c − E c)² (c fitted on the same φ): for a nearly constant τ̂ that is all its spread, and an SE
    holding c fixed calls it "shown" in about a fifth of the draws. Over fresh noise, a constant τ̂ (at the mean or off
    it) must be shown in at most 5 % of draws, a τ̂ with half the true spread in most."""
    rng = np.random.default_rng(4)
    n, L = 300, 20
    tau_i = -0.05 + 0.15 * rng.standard_normal(n)
    tau, ent = np.repeat(tau_i, L), np.repeat(np.arange(n), L)
    cases = {"at the mean": np.full(tau.size, tau.mean()), "off it": np.full(tau.size, tau.mean() + 0.03),
             "half the spread": tau.mean() + 0.5 * (tau - tau.mean())}
    shown = {k: 0 for k in cases}
    draws = 150
    for _ in range(draws):
        phi = tau + 2.5 * rng.standard_normal(tau.size)
        for k, hat in cases.items():
            shown[k] += drl.heldout_check(drl.check_sums("model", phi, hat, ent, n), "model")["verdict"] == "shown"
    assert shown["at the mean"] <= 0.05 * draws and shown["off it"] <= 0.05 * draws
    assert shown["half the spread"] >= 0.7 * draws


@pytest.fixture(scope="module")
def small():
    return sites_and_untrained_model(SMALL)


def test_pseudo_outcomes_come_from_the_validation_rows_only(small):
    _, data, model = small
    d = data[0]
    got = drl.site_fit_sums(model, d, floor=20)
    assert got["drl.fit.sites"] == 1.0 and got["drl.fit.n"] == float((d.validation.M > 0).sum())
    # other training or test rows change nothing: only the validation rows enter
    swapped = dataclasses.replace(d, train=data[1].train, test=data[2].test)
    assert drl.site_fit_sums(model, swapped, floor=20) == got
    # and the sums are exactly those of the validation rows' features and pseudo-outcomes
    a_off, a_on = d.anchors
    mu_on, mu_off = model.one_step_probs(d.validation, a_on), model.one_step_probs(d.validation, a_off)
    X = drl.effect_features(d.validation, mu_on, mu_off, d.anchors)[d.validation.M > 0]
    assert got == drl.ridge_sums(X, drl.pseudo_outcomes(d.validation, mu_on, mu_off, d.anchors))


def test_a_site_without_propensities_or_below_its_floor_sends_n_zero_and_the_fit_says_so(small):
    _, data, model = small
    d = data[0]
    none = dataclasses.replace(d, validation=d.validation.without_propensities())
    assert drl.site_fit_sums(model, none, floor=20) == drl.empty_fit_sums()
    assert drl.site_fit_sums(model, d, floor=10_000)["drl.fit.n"] == 0.0
    parts = [drl.site_fit_sums(model, x, floor=20) for x in data[1:]] + [drl.empty_fit_sums()]
    fit = drl.solve(drl.fit_totals(Totals.of_sites(parts)), sites=4)
    assert fit["coverage"] == "partial" and fit["sites_scoring"] == 3 and fit["beta"] is not None
    nothing = drl.solve(drl.fit_totals(Totals.of_sites([drl.empty_fit_sums()] * 4)), sites=4)
    assert nothing["coverage"] == "unavailable" and nothing["beta"] is None and "no site" in nothing["why"]
    assert "dr-learner" not in EvaluationRequest(dr_learner_beta=nothing["beta"]).to_config()  # no β sent


def test_every_key_a_site_sends_is_allow_listed_and_a_bad_beta_is_ignored(small):
    from fcd_secure.apps.egress import FEDERATION_POLICY

    _, data, model = small
    d = data[0]
    sent = drl.site_fit_sums(model, d, floor=20)
    beta = np.linspace(-0.1, 0.1, drl.K)
    truth = np.zeros(d.test.Y.shape)
    sent.update(drl.site_effect_sums(model, d.test, d.anchors, beta, truth))
    assert set(sent) <= set(drl.FIT_NAMES) | set(drl.EFFECT_NAMES)
    assert {f"eval/{k}" for k in (*drl.FIT_NAMES, *drl.EFFECT_NAMES)} <= FEDERATION_POLICY.allowed_metrics
    sent_beta = EvaluationRequest.from_config(EvaluationRequest(dr_learner_beta=list(beta)).to_config()).dr_learner_beta
    assert sent_beta == beta.tolist()
    for bad in ("{", json.dumps({"beta": [float("nan")] * drl.K}), ""):
        assert EvaluationRequest.from_config({"dr-learner": bad}).dr_learner_beta is None
    # a β of the wrong length reaches the site, which sends no DR-learner sums for it
    assert drl.site_effect_sums(model, d.test, d.anchors, np.ones(2), truth) == {}


@pytest.mark.slow
@pytest.mark.xdist_group(SMALL_SCORED_RUN)
def test_a_secure_run_fits_on_the_chosen_round_and_no_dr_learner_sum_arrives_in_clear(small_scored_run):
    from fcd_secure.audit.ledger import SERVER_LEDGER_FILE

    # the session's run of SMALL (conftest.small_scored_run), also one of `fcd select`'s variants in test_select_runs
    cfg, res, state, _ = small_scored_run
    assert cfg.federation.secure_aggregation
    rows = [r for r in res.history if r.get("dr_learner_fit")]
    assert [r["round"] for r in rows] == [1, 2]
    out = res.final_eval["dr_learner"]
    assert out["round"] == res.extra["selection"]["round"] and out["coverage"] == "full"
    chosen = next(r for r in rows if r["round"] == out["round"])["dr_learner_fit"]
    assert out["beta"] == drl.solve(chosen, sites=4)["beta"]  # β is the chosen round's
    for name in ("dr_learner", "simulator"):
        fig = out[name]
        assert fig["sd_tau"] > 0 and -1 <= fig["corr"] <= 1 and np.isfinite(fig["skill"])
    assert out["steps"] == res.final_eval["one_step_effect"]["steps"]
    # every site logs propensities: the intercept pools the fit's validation steps with every test step, so the
    # effects' mean moves from β's own towards the test rows' mean pseudo-outcome (the AIPW one-step effect)
    icpt = out["intercept"]
    assert icpt["test_steps"] == out["steps"] and icpt["validation_steps"] == out["n"] > 0
    assert icpt["coverage"] == "full"
    theta = res.final_eval["one_step_effect"]["aipw"]["estimate"]
    share = icpt["test_steps"] / (icpt["test_steps"] + out["n"])
    assert out["dr_learner"]["mean_tau_hat"] == pytest.approx(
        icpt["beta_mean"] + share * (theta - icpt["beta_mean"]), abs=1e-6)
    received = [json.loads(x) for x in (state / "_server" / "audit" / SERVER_LEDGER_FILE).read_text().splitlines()
                if x.strip()]
    received = [r for r in received if r["kind"] == "received"]
    assert received and not any(r["metrics"] or r["metric_lists"] or r["tensors"] for r in received)
    summary = json.loads((small_scored_run.out / "summary.json").read_text())
    assert summary["dr_learner"]["dr_learner"]["pehe"] == pytest.approx(out["dr_learner"]["pehe"])


def test_the_run_table_prints_the_dr_learner_beside_the_simulator_within_80_columns():
    from rich.cells import cell_len
    from rich.console import Console

    from fcd_secure.cli.run import summary_table

    base = {"uplink_bytes": 1, "uplink_formula_bytes": 1, "downlink_bytes": 1, "wall_s": 1.0, "rounds": 2}
    fig = {"pehe": 0.15, "corr": 0.41, "skill": 0.05, "sd_tau": 0.151}
    cases = {
        "full": {"beta": [0.0] * drl.K, "coverage": "full", "dr_learner": fig,
                 "simulator": {**fig, "corr": -0.14, "skill": -0.01, "pehe": 0.152}},
        "partial": {"beta": [0.0] * drl.K, "coverage": "partial",
                    "steps": 1000,
                    "dr_learner": {"mean_tau_hat": -0.07, "heldout": {"gain": 0.0123, "se": 0.0041, "z": 3.0,
                                                                      "steps": 1000, "verdict": "shown"}},
                    "simulator": {"mean_tau_hat": -0.03, "heldout": {"gain": -0.0071, "se": 0.0035, "z": -2.03,
                                                                     "steps": 600,
                                                                     "verdict": "worse than the constant"}}},
        "none": {"beta": None, "coverage": "unavailable"},
    }
    text = {}
    for k, d in cases.items():
        con = Console(width=80, record=True, file=open(os.devnull, "w"))
        for t in summary_table({**base, "dr_learner": d}):
            con.print(t)
        text[k] = con.export_text()
        # display cells, not code points: τ̂ is τ and a combining circumflex, one cell
        assert all(cell_len(line) <= 80 for line in text[k].splitlines())
    assert "corr +0.410 · skill +0.050" in text["full"] and "corr -0.140 · skill -0.010" in text["full"]
    assert "0.1500 / 0.1520 / 0.1510" in text["full"]
    assert "mean τ̂ -0.0700 (no truth, partial)" in text["partial"] and "mean τ̂ -0.0300 (no truth)" in text["partial"]
    assert "held-out gain vs a constant" in text["partial"] and "+0.0123 (z +3.0): shown" in text["partial"]
    assert re.search(r"-0\.0071 \(z -2\.0\): worse\s+\(partial\)", text["partial"])  # 600 of 1,000 steps
    assert "held-out" not in text["full"]
    assert "unavailable" in text["none"]

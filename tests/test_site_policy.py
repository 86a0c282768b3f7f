"""The site's own policy, its evaluation cohorts and the exact secure encoding of evaluation sums (fast units).

Real files, real pydantic, real ledgers; the end-to-end attacks on a real ClientApp are in test_site_authority.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fcd_secure.aggregation.secagg import SecAggPolicy
from fcd_secure.audit import Refusal
from fcd_secure.config import build_config
from fcd_secure.queries.cohort import CohortRecord, cohort_rows, cohort_size, select_rows
from fcd_secure.federation.secure.eval_vector import (
    FRAC_BITS,
    EvalLayout,
    EvalVectorError,
    decode_sums,
    encode_sums,
    schema_from_bytes,
    schema_of,
    schema_to_bytes,
    union_schema,
)
from fcd_secure.federation.site_policy import (
    MIN_COHORT_FLOOR,
    EvaluationPolicy,
    SitePolicy,
    SitePolicyError,
    load_site_policy,
)


# -- the policy file ----------------------------------------------------------------------------------------------
def test_shipped_defaults_are_strict():
    p = SitePolicy()
    assert not p.egress.allow_full_sync and p.secure.required
    assert p.secagg == SecAggPolicy() and p.evaluation.min_cohort == 50 and p.dp.noise_seed_from_site_secret
    assert p.app.fab_sha256 == ()


def test_policy_round_trips_and_errors_name_file_and_field(tmp_path):
    p = SitePolicy(dp={"required": True, "epsilon_cap": 3.0, "ledger_dir": "/site/dp"}, evaluation={"min_cohort": 80})
    path = p.write(tmp_path / "site_policy.toml")
    assert SitePolicy.load(path) == p and path.stat().st_mode & 0o077 == 0
    bad = tmp_path / "broken.toml"
    bad.write_text("[dp\nrequired = true\n")
    with pytest.raises(SitePolicyError, match=r"broken\.toml: the site policy is not valid TOML"):
        SitePolicy.load(bad)
    typo = tmp_path / "typo.toml"
    typo.write_text("[evaluation]\nmin_cohort = 5\n")
    with pytest.raises(SitePolicyError, match=r"typo\.toml: field evaluation\.min_cohort"):
        SitePolicy.load(typo)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[egress]\nallow_theta_s = true\n")
    with pytest.raises(SitePolicyError, match=r"unknown\.toml: field egress\.allow_theta_s"):
        SitePolicy.load(unknown)


def test_a_named_policy_file_must_exist_and_an_unnamed_one_means_defaults(tmp_path):
    assert load_site_policy({}, tmp_path, "site-00") == SitePolicy()
    with pytest.raises(SitePolicyError, match="does not exist"):
        load_site_policy({"site-policy": str(tmp_path / "nope.toml")}, tmp_path, "site-00")
    SitePolicy(evaluation={"min_cohort": 64}).write(tmp_path / "site-00" / "site_policy.toml")
    assert load_site_policy({}, tmp_path, "site-00").evaluation.min_cohort == 64


# -- the request may ask for more, never for less ----------------------------------------------------------------
def _site():
    base = build_config("tiny", {"data": {"n_sites": 4}, "federation": {"clients_per_round": 4, "secure_aggregation": True},
                                 "dp": {"enabled": True, "epsilon": 4.0, "ledger_dir": "/site/dp"}})
    return base, SitePolicy.for_run(base)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"federation": {"sync": "full"}}, "federation.sync"),
        ({"federation": {"secure_aggregation": False}}, "federation.secure_aggregation"),
        ({"dp": {"enabled": False}}, "dp.enabled"),
        ({"dp": {"epsilon": 50.0}}, "dp.epsilon"),
        ({"dp": {"ledger_dir": "/tmp/fresh-budget"}}, "dp.ledger_dir"),
        ({"dp": {"noise_seed": "run_seed"}}, "dp.noise_seed"),
        ({"data": {"dataset": "statics2011"}}, "data.dataset"),
        ({"data": {"n_sites": 5}, "federation": {"clients_per_round": 4}}, "data.n_sites"),
    ],
)
def test_a_request_asking_for_less_protection_is_refused_naming_the_field(change, field):
    base, policy = _site()
    raw = base.model_dump(mode="json")
    for section, values in change.items():
        raw[section].update(values)
    request = type(base).model_validate(raw)
    effective, refusal = policy.admit(request)
    assert isinstance(refusal, Refusal) and refusal.rule == "site_policy" and refusal.key == field
    # whatever was asked, the effective settings stay within the policy
    assert effective.federation.sync == "dss" and effective.federation.secure_aggregation
    assert effective.dp.enabled and effective.dp.epsilon <= 4.0 and effective.dp.ledger_dir == "/site/dp"
    assert effective.dp.noise_seed == "site_secret" and effective.data.dataset == base.data.dataset


def test_fewer_secure_aggregation_sites_or_a_weaker_threshold_is_refused():
    base, _ = _site()
    policy = SitePolicy(secagg=SecAggPolicy(min_sites=5), secure={"required": True})
    request = base.model_copy(update={"secagg": SecAggPolicy(min_sites=4)})
    effective, refusal = policy.admit(request)
    assert refusal is not None and refusal.key == "secagg.min_sites" and effective.secagg.min_sites == 5


def test_a_request_for_more_protection_is_admitted_and_kept():
    base, policy = _site()
    stricter = base.model_copy(update={"dp": base.dp.model_copy(update={"epsilon": 1.0, "delta": 1e-7})})
    effective, refusal = policy.admit(stricter)
    assert refusal is None and effective.dp.epsilon == 1.0 and effective.dp.delta == 1e-7
    plain_site = SitePolicy(secure={"required": False}, dp={"ledger_dir": "/site/dp"})
    effective, refusal = plain_site.admit(base)  # the run asks for secure aggregation: more than required
    assert refusal is None and effective.federation.secure_aggregation


def test_a_policy_weaker_than_the_consortium_minimum_names_the_field(tmp_path):
    with pytest.raises(SitePolicyError, match=r"site-02.toml: field secure.required"):
        SitePolicy(secure={"required": False}).check_meets(SitePolicy(), "site-02.toml")
    with pytest.raises(SitePolicyError, match=r"field evaluation.min_cohort"):
        SitePolicy(evaluation={"min_cohort": 20}).check_meets(SitePolicy(), "x")
    with pytest.raises(SitePolicyError, match=r"field egress.allow_full_sync"):
        SitePolicy(egress={"allow_full_sync": True}).check_meets(SitePolicy(), "x")
    SitePolicy(evaluation={"min_cohort": 100}, dp={"required": True}).check_meets(SitePolicy(), "x")  # stricter: fine


# -- evaluation cohorts (P22) -------------------------------------------------------------------------------------
def test_cohort_sizes_are_raised_to_the_minimum_and_stay_a_multiple_of_it_apart():
    pol = EvaluationPolicy(min_cohort=50, max_repeats=100)
    assert [cohort_size(200, r, pol) for r in (1, 2, 3, 50, 51, 99, 100, 120, 150, None)] == [50, 50, 50, 50, 100, 100, 100, 150, 150, 200]
    assert [cohort_size(60, r, pol) for r in (1, 20, 59, None)] == [60, 60, 60, 60]  # one cohort: the whole split
    assert cohort_size(30, 1, pol) == 30  # smaller than the minimum: the whole split
    with pytest.raises(Refusal) as err:
        cohort_size(MIN_COHORT_FLOOR - 1, None, pol)
    assert (err.value.rule, err.value.key) == ("eval_cohort", "min_rows")
    sizes = {cohort_size(237, r, pol) for r in range(1, 400)} | {cohort_size(237, None, pol)}
    assert all(a == b or abs(a - b) >= 50 for a in sizes for b in sizes)


def test_cohort_rows_are_prefixes_of_one_fixed_permutation():
    fp = "ab" * 32
    small, big = cohort_rows(200, 50, fp), cohort_rows(200, 100, fp)
    assert len(set(small)) == 50 and set(small) <= set(big)
    np.testing.assert_array_equal(small, cohort_rows(200, 50, fp))  # deterministic
    assert not np.array_equal(small, cohort_rows(200, 50, "cd" * 32))  # another split, another permutation


def test_the_record_refuses_close_cohorts_and_too_many_repeats(tmp_path):
    record = CohortRecord(tmp_path / "eval_cohorts.json")
    pol = EvaluationPolicy(min_cohort=50, max_repeats=2)
    record.admit("fp", 200, 100, pol)
    record.admit("fp", 200, 100, pol)
    with pytest.raises(Refusal) as err:
        record.admit("fp", 200, 100, pol)
    assert err.value.key == "repeats"
    # a cohort of 101 next to one of 100 would single out one row by subtraction
    with pytest.raises(Refusal) as err:
        record.admit("fp", 200, 101, pol)
    assert err.value.key == "overlap"
    record.admit("fp", 200, 150, pol)
    record.admit("other-split", 200, 101, pol)  # another split has its own record
    assert record.counts("fp") == {100: 2, 150: 1}
    # a policy changed later still keeps every new cohort at least its minimum away from each earlier one
    with pytest.raises(Refusal):
        record.admit("fp", 200, 110, EvaluationPolicy(min_cohort=20, max_repeats=2))
    record.admit("fp", 200, 120, EvaluationPolicy(min_cohort=20, max_repeats=2))


def test_select_rows_answers_requests_of_1_2_3_rows_with_the_same_cohort(tmp_path):
    class Split:  # the arrays a test split has (what the permutation is seeded with)
        n = 120
        X = np.arange(120.0).reshape(120, 1)
        A = np.zeros((120, 3, 1))
        T = np.zeros((120, 3), np.int64)
        Y = np.ones((120, 3))
        M = np.ones((120, 3))
        meta = {"entity": np.arange(120), "entity_names": [f"p{i}" for i in range(120)]}  # who the rows are

    record = CohortRecord(tmp_path / "c.json")
    pol = EvaluationPolicy(min_cohort=50, max_repeats=10)
    rows = [select_rows(Split, "site-00", r, pol, record) for r in (1, 2, 3)]
    # 120 rows, minimum 50: cohorts of 120 or 70 rows only (70 = 120 - 50 covers a request below the minimum)
    assert all(len(r) == 70 for r in rows) and all(np.array_equal(rows[0], r) for r in rows)
    assert record.counts(next(iter(json.loads((tmp_path / "c.json").read_text())))) == {70: 3}


# -- evaluation sums inside secure aggregation ------------------------------------------------------------------
def _sum_vectors(vectors):
    return np.sum([v.view(np.int32).astype(np.int64) for v in vectors], axis=0)[2:]


def test_evaluation_sums_decode_exactly_whatever_their_magnitude():
    pol = SecAggPolicy()
    sites = [
        {"n_test": 50.0, "effect.sse": 1.2345678, "ope.always.ipw.sum_weight_sq": 3.7e15, "auc.pos": [1.0, 0.0, 4.0]},
        {"n_test": 64.0, "effect.sse": 0.5, "ope.always.ipw.sum_weight_sq": 2.0e3, "auc.pos": [0.0, 2.0, 1.0], "x": -7.25},
        {"n_test": 20.0, "effect.sse": 1e-9, "ope.always.ipw.sum_weight_sq": 9.9e17, "auc.pos": [5.0, 5.0, 5.0]},
    ]
    schemas = [schema_from_bytes(schema_to_bytes(schema_of(s))) for s in sites]
    layout = EvalLayout.of(union_schema(schemas), pol)
    vectors = [encode_sums(layout, s, int(s["n_test"]), pol) for s in sites]
    # every word is within what a clipped input of that weight encodes to (the protocol's input rule)
    for s, v in zip(sites, vectors):
        bound = pol.clip * s["n_test"] / pol.max_weight * pol.scale
        assert v[0] == s["n_test"] and v[1] == 0 and np.abs(v.view(np.int32)[2:]).max() <= bound
    got = decode_sums(layout, _sum_vectors(vectors), len(sites))
    assert got["_sites"] == 3 and got["_counts"]["x"] == 1 and got["_counts"]["effect.sse"] == 3
    tol = len(sites) * 2.0 ** -(FRAC_BITS + 1)
    assert got["n_test"] == 134.0
    assert abs(got["effect.sse"] - (1.2345678 + 0.5 + 1e-9)) <= tol
    assert got["ope.always.ipw.sum_weight_sq"] == pytest.approx(3.7e15 + 2.0e3 + 9.9e17, abs=tol, rel=0)
    np.testing.assert_array_equal(got["auc.pos"], [6.0, 7.0, 10.0])
    assert got["x"] == -7.25


def test_a_non_finite_sum_is_reported_never_wrapped():
    pol = SecAggPolicy()
    sites = [{"n_test": 30.0, "v": float("nan"), "w": 1.0}, {"n_test": 30.0, "v": 2.0, "w": 1e30}]
    layout = EvalLayout.of(union_schema([schema_of(s) for s in sites]), pol)
    got = decode_sums(layout, _sum_vectors([encode_sums(layout, s, 30, pol) for s in sites]), 2)
    assert np.isnan(got["v"]) and np.isnan(got["w"]) and got["n_test"] == 60.0


def test_a_site_key_outside_the_agreed_layout_or_a_tiny_cohort_is_refused():
    pol = SecAggPolicy()
    layout = EvalLayout.of([("n_test", 0)], pol)
    with pytest.raises(EvalVectorError, match="not in the agreed layout"):
        encode_sums(layout, {"n_test": 30.0, "extra": 1.0}, 30, pol)
    with pytest.raises(EvalVectorError, match="outside"):
        encode_sums(layout, {"n_test": 5.0}, 5, pol)
    with pytest.raises(EvalVectorError, match="lengths"):
        union_schema([[("auc.pos", 100)], [("auc.pos", 50)]])


# -- the site decides whether its propensities weight its training ----------------------------------------------
def test_a_site_that_withholds_its_propensities_refuses_a_request_that_needs_them():
    base, allowing = _site()
    withholding = SitePolicy.model_validate({**allowing.model_dump(), "training": {"use_propensities": False}})
    assert allowing.training.use_propensities and not withholding.training.use_propensities
    for ipw in ("step", "cumulative"):
        request = base.model_copy(update={"model": base.model.model_copy(update={"ipw": ipw})})
        assert allowing.admit(request)[1] is None
        _, refusal = withholding.admit(request)
        assert refusal is not None and refusal.rule == "site_policy" and refusal.key == "model.ipw"
    # 'auto' (the default) weights only where training data carry propensities: the site is within the request
    assert base.model.ipw == "auto" and withholding.admit(base)[1] is None
    with pytest.raises(SitePolicyError, match=r"field training\.use_propensities"):
        allowing.check_meets(withholding, "site-01.toml")


def test_a_withholding_site_trains_on_the_papers_objective(tmp_path, one_torch_thread):
    """A real site runtime on DKT-Synth (which logs propensities): with [training] use_propensities = false its Θc
    update is exactly that of a consortium that asked for ipw = 'off'; with the default policy it differs."""
    import torch

    from fcd_secure.federation import learner
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.manifest import THETA_C

    cfg = build_config("tiny", {"data": {"n_sites": 3}, "federation": {"secure_aggregation": False,
                                                                         "clients_per_round": 2}})
    paper = cfg.model_copy(update={"model": cfg.model.model_copy(update={"ipw": "off"})})
    theta = learner.build_model(paper, SiteRuntime(paper, "site-00", 0, str(tmp_path / "p")).dims).get_params(THETA_C)
    round_config = {"server-round": 1, "part": THETA_C, "local-epochs": 1}

    def update(run_cfg, policy, name):
        torch.manual_seed(0)
        site = SiteRuntime(run_cfg, "site-00", 0, str(tmp_path / name), policy=policy)
        assert site.refusal is None and site.data.train.P is not None  # DKT-Synth logs its propensities
        return site.train_round({k: v.copy() for k, v in theta.items()}, round_config)[0]

    open_policy = SitePolicy.for_run(cfg)
    closed = SitePolicy.model_validate({**open_policy.model_dump(), "training": {"use_propensities": False}})
    withheld, weighted = update(cfg, closed, "closed"), update(cfg, open_policy, "open")
    reference = update(paper, SitePolicy.for_run(paper), "paper")
    assert set(withheld) == set(reference) == set(theta)
    assert all(np.array_equal(withheld[k], reference[k]) for k in theta)
    assert any(not np.array_equal(weighted[k], reference[k]) for k in theta)

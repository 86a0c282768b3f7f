"""The behaviour model in a run (issue 43 item 1): each site fits its own model once per run, and, through the real
ServerApp and ClientApps on the in-process engine (``engines.inprocess``), a consortium that chooses one shared model
(``evaluation.behaviour_model = "shared"``) fits it by the secure Newton rounds of ``federation.secure
.secure_behaviour``, whose coefficients are the pooled centralised fit's; a site whose policy does not allow it
declines the run at hello; no site's sums reach the server in clear (docs/threats.md P67, P68). A consortium that
shares the slopes only (``"shared_slopes"``) fits them by the same rounds on each site's objective profiled over its
own intercepts, which stay on the site.

A small table of 4 hospitals (``conftest.make_long_table``) with secure standardisation, so that every site loads its
rows unscaled at hello and z-scored after round 0; its logged propensity column is set aside
(``evaluation.propensities = "estimated"``) so that every site needs a behaviour model.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from conftest import GOOD_SPEC, make_long_table

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.config import ConfigError, build_config  # noqa: E402
from fcd_secure.evaluation.propensity import (  # noqa: E402
    SharedFitError,
    SharedFitStep,
    check_shared_size,
    fit_shared,
    shared_fit_sums,
)
from fcd_secure.federation import learner  # noqa: E402
from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_MODEL_KEY  # noqa: E402

SITES = 4


def _config(tmp_path, behaviour_model: str = "site", **evaluation):
    df = make_long_table(320, seed=5)
    df["hospital"] = [f"h{int(p[1:]) % SITES}" for p in df["pid"]]
    spec, table = tmp_path / "spec.toml", tmp_path / "table.csv"
    spec.write_text(GOOD_SPEC)
    df.to_csv(table, index=False)
    return build_config("tiny", {
        "data": {"dataset": "spec", "spec": str(spec), "table": str(table), "n_sites": SITES, "standardize": "secure",
                 "test_fraction": 0.5},
        "federation": {"rounds": 1, "clients_per_round": SITES, "eval_every": 0},
        "evaluation": {"propensities": "estimated", "behaviour_model": behaviour_model, **evaluation},
        "out": str(tmp_path / "run"), "state_dir": str(tmp_path / "state"),
    })


def test_each_site_fits_its_own_behaviour_model_once_per_run(tmp_path):
    """A site loads its rows unscaled at hello and z-scored with round 0's statistics on every later request
    (``apps.site.SiteRuntime.data``): the model is fitted on the rows as loaded (it z-scores its own features), so
    each site fits once per run (``federation.learner._behaviour_model``'s cache holds one entry per fit; it held
    two per site before), and the z-scored rows carry the same estimates."""
    from fcd_secure.data.moments import moment_sums, moments_to_statistics

    cfg = _config(tmp_path)
    learner._BEHAVIOUR_FITS.clear()
    hello = [learner.load_site_data(cfg, i) for i in range(SITES)]
    totals: dict = {}
    for d in hello:
        for k, v in moment_sums(d.train).items():
            totals[k] = np.asarray(totals.get(k, 0.0)) + np.asarray(v)
    stats = moments_to_statistics(totals)
    later = [learner.load_site_data(cfg, i, stats) for i in range(SITES)]
    assert len(learner._BEHAVIOUR_FITS) == SITES
    for a, b in zip(hello, later):
        assert b.test.meta.get("standardization") is not None and a.test.meta.get("standardization") is None
        assert a.propensities == b.propensities == "estimated"
        np.testing.assert_array_equal(a.test.P, b.test.P)


def _run(tmp_path_factory, behaviour_model: str):
    """One tiny in-process run of the 4-hospital table with ``behaviour_model``: ``(cfg, result, folder)``."""
    from fcd_secure.engines.inprocess import run_inprocess

    tmp = tmp_path_factory.mktemp(behaviour_model)
    cfg = _config(tmp, behaviour_model)
    learner._BEHAVIOUR_FITS.clear()
    return cfg, run_inprocess(cfg), tmp


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory, one_torch_thread_module):
    return _run(tmp_path_factory, "shared")


@pytest.fixture(scope="module")
def one_torch_thread_module():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _designs(cfg):
    """Each site's training design as the site computes its sums (its rows as loaded, the run's split)."""
    out = []
    for i in range(SITES):
        train = learner.load_site_data(cfg, i).train
        out.append(learner.shared_behaviour_model(learner.dims_of(train, SITES)).training_design(train))
    return out


def test_the_runs_shared_model_is_the_pooled_centralised_fit_and_the_answers_say_so(shared_run):
    """docs/threats.md P68: the coefficients the run sent its sites equal the centralised fit on every site's
    training rows in one place; no site fitted a model of its own; the answers name the source."""
    from fcd_secure.queries.answers import SHARED_SOURCE, EvaluationAnswer

    cfg, res, tmp = shared_run
    assert not learner._BEHAVIOUR_FITS  # every site used the consortium's model, none its own
    got = SharedFitStep.from_json(json.loads(res.extra[BEHAVIOUR_MODEL_KEY]), 3)
    designs = _designs(cfg)
    F, a = np.concatenate([d[0] for d in designs]), np.concatenate([d[1] for d in designs])
    central = learner.shared_behaviour_model(learner.dims_of(learner.load_site_data(cfg, 0).train, SITES))
    fit_shared(central, F.shape[1], lambda step: shared_fit_sums(F, a, 3, step))
    np.testing.assert_allclose(got.mean, central.mean, atol=1e-9)
    np.testing.assert_allclose(got.scale, central.scale, atol=1e-9)
    np.testing.assert_allclose(got.coef, central.coef, atol=1e-6, rtol=0)
    props = res.final_eval["propensities"]
    assert props["source"] == "estimated" and props["model"] == "shared" and props["sites"]["estimated"] == SITES
    assert SHARED_SOURCE in EvaluationAnswer.from_json(res.final_eval).propensities.line()
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    assert summary["propensities"]["model"] == "shared"
    assert summary["behaviour_model"] == json.loads(res.extra[BEHAVIOUR_MODEL_KEY])


def test_a_question_about_the_run_is_answered_with_its_shared_model(shared_run):
    """``fcd whatif`` re-sends the run's shared model (its summary.json) to the sites: each answers with the model the
    run used, never one of its own, and the answer says so."""
    from fcd_secure.engines.whatif_run import run_whatif
    from fcd_secure.queries.request import request_from_config

    cfg, _, tmp = shared_run
    learner._BEHAVIOUR_FITS.clear()
    answer = run_whatif(tmp / "run", request_from_config(cfg))
    assert answer["propensities"]["model"] == "shared" and answer["propensities"]["sites"]["estimated"] == SITES
    assert not learner._BEHAVIOUR_FITS


def test_no_behaviour_fit_sum_reaches_the_server_in_clear(shared_run):
    """docs/threats.md P68: the server received the fit's rounds as the protocol's opaque fields only, and no site's
    own sums (its step count, its features' sums) appear in anything the server wrote."""
    cfg, _, tmp = shared_run
    _assert_the_server_received_masked_bytes_only(tmp)
    site_values = []
    for F, _ in _designs(cfg):
        site_values += [float(len(F)), *F.sum(0)[:4], *(F * F).sum(0)[:4]]
    text = _server_text(tmp)
    for v in site_values:
        if abs(v) < 1e-6 or float(v).is_integer() and abs(v) < 1000:
            continue  # a zero column, or a small count: digits that occur anywhere
        for form in (f"{v:.6g}", f"{v:.9g}", repr(float(v))):
            assert not re.search(rf"(?<![0-9.]){re.escape(form)}(?![0-9])", text), (form, "a site's sum at the server")


def _assert_the_server_received_masked_bytes_only(tmp) -> None:
    """The server's ledger: the fit's rounds arrived as the protocol's opaque fields only (no tensor, metric or list
    in clear)."""
    from fcd_secure.audit.ledger import SERVER_LEDGER_FILE

    ledger = tmp / "state" / "_server" / "audit" / SERVER_LEDGER_FILE
    received = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    received = [x for x in received if x["kind"] == "received"]
    assert {x["action"] for x in received} >= {"train.secagg_evaluate", "train.secagg_masked_input"}
    assert not any(x["tensors"] or x["metrics"] or x["metric_lists"] for x in received)


def _server_text(tmp) -> str:
    """Everything the server wrote: the run folder and the server's state."""
    return "\n".join(f.read_text("utf-8", "replace") for root in (tmp / "run", tmp / "state" / "_server")
                     for f in root.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl", ".csv", ".txt", ""))


@pytest.fixture(scope="module")
def slopes_run(tmp_path_factory, one_torch_thread_module):
    return _run(tmp_path_factory, "shared_slopes")


def test_the_runs_shared_slopes_are_the_pooled_profiled_fit_and_each_site_keeps_its_intercepts(slopes_run):
    """``evaluation.behaviour_model = "shared_slopes"`` (docs/threats.md P68): the slopes the run sent its sites
    equal the centralised fit of the objective profiled over each site's own intercepts (every site's sums taken in
    one place); the model the server holds has no intercepts; each site weighted its rows by the slopes completed
    with its own intercepts (``federation.learner.with_propensities``), and the answers name that source."""
    from fcd_secure.evaluation.propensity import RecordPropensity, own_intercepts
    from fcd_secure.queries.answers import SHARED_SLOPES_SOURCE, EvaluationAnswer

    cfg, res, tmp = slopes_run
    assert not learner._BEHAVIOUR_FITS  # no site fitted a model of its own
    doc = json.loads(res.extra[BEHAVIOUR_MODEL_KEY])
    got = SharedFitStep.from_json(doc, 3)
    assert got.own_intercepts and got.l2 > 0 and not np.any(got.coef[0])
    assert SharedFitStep.from_json(got.to_json(), 3).to_json() == doc  # the record keeps what the sites need
    designs = _designs(cfg)
    dims = learner.dims_of(learner.load_site_data(cfg, 0).train, SITES)
    central = learner.shared_behaviour_model(dims)

    def ask(step):
        parts = [shared_fit_sums(F, a, 3, step) for F, a in designs]
        return {k: np.sum([np.asarray(p[k], np.float64) for p in parts], axis=0) for k in parts[0]}

    fit_shared(central, designs[0][0].shape[1], ask, own_intercepts=True)
    np.testing.assert_allclose(got.mean, central.mean, atol=1e-9)
    np.testing.assert_allclose(got.coef, central.coef, atol=1e-6, rtol=0)
    props = res.final_eval["propensities"]
    assert props["model"] == "shared_slopes" and props["sites"]["estimated"] == SITES
    assert SHARED_SLOPES_SOURCE in EvaluationAnswer.from_json(res.final_eval).propensities.line()
    # a site's rows are weighted by its own completion of the slopes, not by the zero intercepts the server holds
    model = learner.shared_behaviour_model(dims, got)
    site = learner.load_site_data(cfg, 0, behaviour=model)
    F, a = designs[0]
    b = own_intercepts(((F - got.mean) / got.scale) @ got.coef[1:], a, 3, got.l2)
    mine = RecordPropensity.from_shared(3, dims["da"], dims["dx"], SharedFitStep(got.mean, got.scale, np.concatenate(
        [b[None, :], got.coef[1:]])))
    np.testing.assert_allclose(site.test.P, np.where(site.test.M > 0, np.maximum(
        mine.logged_probs(site.test), 0.005), 1.0), atol=1e-12)
    assert np.abs(b).max() > 1e-3  # the site's intercepts are not the server's zeros


def test_no_sites_intercepts_reach_the_server(slopes_run):
    """docs/threats.md P68: in a shared-slopes run the server received the protocol's opaque fields only, and no
    site's own intercepts (fitted on it to the run's slopes) appear in anything the server wrote."""
    from fcd_secure.evaluation.propensity import own_intercepts

    cfg, res, tmp = slopes_run
    _assert_the_server_received_masked_bytes_only(tmp)
    got = SharedFitStep.from_json(json.loads(res.extra[BEHAVIOUR_MODEL_KEY]), 3)
    text = _server_text(tmp)
    for F, a in _designs(cfg):
        for v in own_intercepts(((F - got.mean) / got.scale) @ got.coef[1:], a, 3, got.l2):
            for form in (f"{v:.6g}", f"{v:.9g}", repr(float(v))):
                assert not re.search(rf"(?<![0-9.]){re.escape(form)}(?![0-9])", text), (form, "an intercept")


def test_a_site_whose_policy_does_not_allow_the_shared_model_declines_at_hello(tmp_path):
    """The site is the authority (its policy file's ``[behaviour] shared_fit``, default false): it refuses the run at
    hello, before any sum is taken, the server names it, and its ledger names the field."""
    from fcd_secure.apps.server_loop import FederationError
    from fcd_secure.audit.ledger import SITE_LEDGER_FILE
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.engines.simulation import write_simulated_policies
    from fcd_secure.federation.site_policy import POLICY_FILE, BehaviourPolicy, SitePolicy

    cfg = _config(tmp_path, "shared")
    state = tmp_path / "state"
    own = SitePolicy.for_run(cfg)
    assert own.behaviour.shared_fit
    (state / "site-02").mkdir(parents=True)
    own.model_copy(update={"behaviour": BehaviourPolicy()}).write(state / "site-02" / POLICY_FILE)
    write_simulated_policies(cfg)  # the other hospitals choose what the run asks
    with pytest.raises(FederationError, match=r"site-02: refused by the site.s policy \(at hello") as err:
        run_inprocess(cfg)
    assert "site-00" not in str(err.value)
    path = state / "site-02" / "slots" / SITE_LEDGER_FILE  # the site's own ledger (apps.egress)
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    refused = [x for x in lines if x.get("status") == "refused"]
    assert refused and {r["refusal"]["key"] for r in refused} == {"evaluation.behaviour_model"}


def test_a_shared_model_that_cannot_work_is_refused_before_any_work(tmp_path):
    """Exit 2 material: the configuration names the setting (secure aggregation off, logged propensities only), and
    a model with more coefficients than the cap is refused by the size check the preflight and the server use."""
    for value in ("shared", "shared_slopes"):
        with pytest.raises(ConfigError, match=f"behaviour_model = '{value}' needs secure aggregation"):
            build_config("tiny", {"evaluation": {"behaviour_model": value},
                                  "federation": {"secure_aggregation": False}})
    with pytest.raises(ConfigError, match="propensities = 'logged'"):
        build_config("tiny", {"evaluation": {"behaviour_model": "shared", "propensities": "logged"}})
    assert check_shared_size(3, 2, 3) == (5 + 2 + 3 + 3 + 1) * 3
    with pytest.raises(SharedFitError, match="at most 200"):
        check_shared_size(50, 1, 2)  # DKT-Synth's 50 actions


def test_a_deployed_question_about_a_shared_run_uses_the_model_the_site_recorded(tmp_path, one_torch_thread):
    """Issue 43 item 2, at the site without Flower: a site answering a deployed shared-slopes run's final evaluation
    records the shared model beside its statistics (``federation.asked_runs.AnsweredRuns``); a question about the run
    weights by that model (completed with the site's own intercepts), never by one the question's request carries;
    a record without a model (kept before records had one) is refused; a model whose intercept setting differs from
    the run's is refused."""
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.audit import Refusal
    from fcd_secure.data.policy import load_policy_refs
    from fcd_secure.federation.asked_runs import ANSWERED_SLOT, AnsweredRuns, QuestionStart, theta_digest
    from fcd_secure.federation.site_policy import SitePolicy
    from fcd_secure.federation.state import StateError
    from fcd_secure.manifest import THETA_C
    from fcd_secure.queries.request import WHATIF_FIELD, WhatIfRequest

    cfg = _config(tmp_path, "shared_slopes")
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"standardize": "pooled"})})  # no round 0
    policy, state = SitePolicy.for_run(cfg), str(tmp_path / "state")
    rt = SiteRuntime(cfg, "site-00", 0, state, policy=policy)
    model = learner.shared_behaviour_model(rt.dims)  # a one-site consortium's slopes: the site's own sums
    fit_shared(model, model.n_features(model.n_actions, model.da, model.dx),
               lambda step: learner.behaviour_fit_sums(rt.data, step), own_intercepts=True)
    step = SharedFitStep(model.mean, model.scale, model.coef, True, model.l2)
    recorded = json.dumps(step.to_json())
    K = rt.dims["n_actions"]
    pols = load_policy_refs(["never", "always"])
    question = WhatIfRequest(policies=pols, reference=pols[0].name)
    ev = {"quick": False, "part": THETA_C, "n-samples": 1, "max-rows": -1, WHATIF_FIELD: question.to_json(),
          BEHAVIOUR_MODEL_KEY: recorded}
    theta = rt.model.get_params(THETA_C)
    rt.run_session = "ab" * 16  # as from_context sets it from the run's verified ticket
    try:
        rt.evaluate(theta, ev)
    except Refusal as exc:  # the tiny world may decline under its cohort rules: the run is recorded before that
        assert exc.rule == "eval_cohort"
    assert AnsweredRuns(rt.state.slot(ANSWERED_SLOT)).load(rt.run_session).behaviour == recorded
    with pytest.raises(StateError, match="per-site intercepts"):  # the site's setting decides, not the server's
        rt.adopt_behaviour({BEHAVIOUR_MODEL_KEY: json.dumps(SharedFitStep(model.mean, model.scale, model.coef)
                                                            .to_json())})

    def asking(session: str) -> SiteRuntime:
        asked = SiteRuntime(cfg, "site-00", 0, state, policy=policy)
        asked.run_session = "cd" * 16
        asked.question = QuestionStart(session, question.to_json())
        return asked

    other = SharedFitStep(model.mean, model.scale, 2 * model.coef, True, model.l2)  # the question's own: not read
    asked = asking(rt.run_session)
    try:
        asked.evaluate(theta, {**ev, BEHAVIOUR_MODEL_KEY: json.dumps(other.to_json())})
    except Refusal as exc:
        assert exc.rule == "eval_cohort"
    np.testing.assert_array_equal(asked.behaviour.coef, SharedFitStep.from_json(json.loads(recorded), K).coef)
    np.testing.assert_array_equal(asked.data.test.P, rt.data.test.P)  # the run's propensities, own intercepts
    # a record of a shared run without its model: refused rather than answered with propensities the run did not use
    AnsweredRuns(rt.state.slot(ANSWERED_SLOT)).record("ef" * 16, None, theta_digest(theta), None)
    with pytest.raises(StateError, match="keeps no shared model"):
        asking("ef" * 16).evaluate(theta, ev)

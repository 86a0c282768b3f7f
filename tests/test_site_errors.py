"""A site that fails says why in a fixed, non-secret category (the audit's closed vocabulary ``SITE_ERRORS``), and the
server and the command line turn it into a message naming the site: "site-03: data does not match the spec", not
"a site did not answer hello"; "site-02 stopped: DP budget exhausted (ε 8.00 of 8)" with exit 5.

The category travels as the error code of the gate's own error reply; the reason is the vocabulary's fixed text. A
handler's own code outside the vocabulary (a 64-bit covert channel) and every exception text stay on the site.
"""

from __future__ import annotations


import pytest
from conftest import GOOD_SPEC, make_long_table
from flwr.app import Context, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from test_audit_support import Site, instruction

from fcd_secure.audit import GATE_ERROR_CODE, GENERIC_ERROR_REASON, SITE_ERRORS, SiteFailure, make_egress_gate
from fcd_secure.audit.rules import site_error_name
from fcd_secure.cli.run import outcome, site_error_message
from fcd_secure.config import build_config
from fcd_secure.data.spec import DataError
from fcd_secure.apps.guard import guard_mod, site_error_of
from fcd_secure.apps.server_loop import _hello_failures, describe_site_error
from fcd_secure.privacy.errors import BudgetExceeded



@pytest.fixture()
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
    yield


def test_the_vocabulary_is_closed_and_fixed():
    assert set(SITE_ERRORS) == {"internal", "data_mismatch", "budget_exhausted", "policy_refusal"}
    assert SITE_ERRORS["internal"] == (GATE_ERROR_CODE, GENERIC_ERROR_REASON)
    assert len({code for code, _ in SITE_ERRORS.values()}) == len(SITE_ERRORS)
    assert site_error_name(SITE_ERRORS["data_mismatch"][0]) == "data_mismatch"
    assert site_error_name(0x1234_5678_9ABC_DEF0) == "internal" and site_error_name("x") == "internal"
    with pytest.raises(ValueError, match="closed"):
        SiteFailure("disk_full")


@pytest.mark.parametrize(
    "exc, error",
    [(DataError("bad", file="t.csv", column="y", row=5), "data_mismatch"),
     (BudgetExceeded("ε 8.1 > 8"), "budget_exhausted"),
     (SiteFailure("policy_refusal"), "policy_refusal"),
     (KeyError("patient_id=12345"), "internal")],
)
def test_guard_reports_the_category_and_never_the_text(exc, error, task_identity):
    assert site_error_of(exc) == error
    msg = instruction("train", 1)

    def handler(m, c):
        raise exc

    reply = guard_mod(msg, Context(run_id=7, node_id=11, node_config={}, state=RecordDict(), run_config={}), handler)
    assert (reply.error.code, reply.error.reason) == SITE_ERRORS[error]
    assert "12345" not in reply.error.reason and "t.csv" not in reply.error.reason


def test_the_gate_passes_a_category_and_replaces_anything_else(tmp_path):
    site = Site(tmp_path)
    code, reason = SITE_ERRORS["budget_exhausted"]
    reply = site.send(instruction("train", 1), lambda m, c: Message(Error(code=code, reason="ε=7.93 row 17"), reply_to=m))
    assert (reply.error.code, reply.error.reason) == (code, reason)  # the category passes, the text does not
    covert = 0x1234_5678_9ABC_DEF0
    reply = site.send(instruction("train", 2), lambda m, c: Message(Error(code=covert, reason="x"), reply_to=m))
    assert (reply.error.code, reply.error.reason) == (GATE_ERROR_CODE, GENERIC_ERROR_REASON)
    entries = [e for e in site.ledger.lines() if e["kind"] == "upload"]
    assert [e["handler_error_code"] for e in entries] == [code, covert]  # the handler's own code stays local

    def failing(context):
        raise SiteFailure("data_mismatch")

    reply = make_egress_gate(failing)(instruction("query.hello", 0), None, site.train_handler())
    assert (reply.error.code, reply.error.reason) == SITE_ERRORS["data_mismatch"]


def test_a_site_whose_data_fails_its_spec_answers_hello_with_that_category(tmp_path, task_identity):
    """A real ClientApp (gate, guard, site runtime): its table breaks the spec, so hello says so, and no more."""
    from fcd_secure.apps.client_app import make_client_app

    df = make_long_table(n_entities=30)
    df.loc[5, "y"] = 7
    table = tmp_path / "bad.csv"
    df.to_csv(table, index=False)
    spec = tmp_path / "spec.toml"
    spec.write_text(GOOD_SPEC)
    cfg = build_config("tiny", {"data": {"dataset": "spec", "spec": str(spec), "table": str(table), "n_sites": 3},
                                "state_dir": str(tmp_path / "state"),
                                "federation": {"secure_aggregation": False, "clients_per_round": 1}})
    app = make_client_app(cfg)
    msg = instruction("query.hello", 0)
    ctx = Context(run_id=7, node_id=11, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    reply = app(msg, ctx)
    assert reply.has_error() and not reply.has_content()
    assert (reply.error.code, reply.error.reason) == SITE_ERRORS["data_mismatch"]
    assert "bad.csv" not in reply.error.reason and "row" not in reply.error.reason


def test_the_server_names_the_sites_that_failed_hello():
    code = "data_mismatch"
    # the simulation's sites have default ids: the one that did not answer is named
    msg = _hello_failures([(4711, code)], ["site-00", "site-01", "site-02"], 4)
    assert msg == "site-03: data does not match the spec"
    msg = _hello_failures([(1, code), (2, code), (3, code)], [], 3)
    assert msg == "site-00, site-01, site-02: data does not match the spec"
    # ambiguous (two reasons for two missing sites): the Flower node ids, each with its reason
    msg = _hello_failures([(1, code), (2, "timeout")], ["site-00"], 3)
    assert "node 1: data does not match the spec" in msg and "node 2: did not answer in time" in msg
    assert describe_site_error("site-02", "budget_exhausted") == "site-02: DP budget exhausted"


def test_the_exit_code_of_a_finished_run_says_why():
    cfg = build_config("tiny", {"dp": {"enabled": True, "epsilon": 8.0}})
    summary = {
        "site_errors": [{"round": 3, "action": "train", "site_id": "site-02", "error": "budget_exhausted"}],
        "failed_sites_final_eval": [],
        "dp": {"epsilon_cap": 8.0, "epsilon_spent": {"site-02": 7.996, "site-01": 3.0}},
    }
    bad = outcome(summary, cfg)
    assert bad.exit_code == 5 and bad.error_code == "DP_BUDGET_EXHAUSTED"
    assert bad.message == "site-02 stopped: DP budget exhausted (ε 8.00 of 8)"
    summary = {"site_errors": [{"round": 4, "action": "query.evaluate", "site_id": "site-01", "error": "internal"}],
               "failed_sites_final_eval": ["site-01"], "dp": {}}
    bad = outcome(summary, cfg)
    assert bad.exit_code == 1 and bad.error_code == "SITE_FAILED"
    assert "site-01: site error" in bad.message and "final evaluation" in bad.message
    clean = {"site_errors": [], "failed_sites_final_eval": [], "dp": {}, "pehe": 0.1, "policies": {"never": {}}}
    assert outcome(clean, cfg) is None
    nothing = outcome({"site_errors": [], "failed_sites_final_eval": [], "dp": {},
                       "declined_sites_final_eval": ["site-01", "site-02"]}, cfg)
    assert nothing.exit_code == 1 and nothing.error_code == "RUN_FAILED"
    assert "site-01, site-02 declined" in nothing.message and "could not evaluate" in nothing.message
    assert site_error_message("site-03", "data_mismatch", cfg) == "site-03: data does not match the spec"


def test_sites_left_without_a_quorum_by_the_others_declines_did_not_fail(tmp_path):
    """A real run (in-process engine, secure aggregation, tiny: 9-22 test rows per site): three sites decline the
    final evaluation under their cohort rules, which leaves the fourth without the 4 sites a secure sum needs. That
    site did not fail; the run could not evaluate, and says why."""
    import json

    from fcd_secure.engines.inprocess import run_inprocess

    cfg = build_config("tiny", {"data": {"n_sites": 4, "test_fraction": 0.2},
                                "federation": {"rounds": 1, "clients_per_round": 4}})
    cfg = cfg.model_copy(update={"out": str(tmp_path / "run")})
    run_inprocess(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failed_sites_final_eval"] == [] and len(summary["declined_sites_final_eval"]) == 3
    assert "secure aggregation needs 4" in summary["final_eval_aborted"]
    bad = outcome(summary, cfg)
    assert bad.exit_code == 1 and bad.error_code == "RUN_FAILED" and "site error" not in bad.message
    declined = ", ".join(summary["declined_sites_final_eval"])
    assert f"{declined} declined" in bad.message and "secure sum of the others did not run" in bad.message

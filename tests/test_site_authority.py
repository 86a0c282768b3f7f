"""The site decides what leaves it (docs/threats.md P20, P21, P22): attacks by the server, against the real ClientApp.

Each attack is driven the way a (malicious) server would: a run config of its choosing, or a message of its choosing,
delivered to the real ClientApp (egress gate, guard, handlers, real model, data, ledgers and policy files on disk),
and, for the whole path, the real ServerApp and ClientApp on the in-process engine (``engines.inprocess``: Flower's
Message API and Grid without Ray, pinned to the simulation engine bit for bit in ``test_federation_inprocess.py``; a
secure run with secure evaluation on the simulation engine itself is ``test_privacy_run.py``). Before the site-policy
layer each of these succeeded: the server's run config set Θs sharing, DP, the ε cap and the ledger folder; a secure
site answered a plain ``train``; ``max-rows`` of 1, 2, 3 singled out a patient; and evaluation sums reached the server
per site.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from test_audit_support import Server, Site, instruction  # noqa: E402

from fcd_secure.audit import GATE_ERROR_CODE, POLICY_ERROR_CODE, POLICY_REASON_PREFIX, RECEIPTS_MESSAGE_TYPE, GatePolicy, Refusal  # noqa: E402
from fcd_secure.audit.ledger import SITE_LEDGER_FILE  # noqa: E402
from fcd_secure.audit.signing import public_key_bytes  # noqa: E402
from fcd_secure.fingerprints import fingerprint  # noqa: E402
from fcd_secure.audit.verify import verify_path  # noqa: E402
from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.federation.records import REC_CONFIG, REC_GLOBAL, RUN_CONFIG_KEY, global_to_record  # noqa: E402
from fcd_secure.federation.site_policy import SitePolicy  # noqa: E402
from fcd_secure.federation.state import STATE_FILE, SiteState  # noqa: E402


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _refusals(ledger_path):
    return [l for l in _lines(ledger_path) if l["kind"] == "upload" and l["status"] == "refused"]


def _close(site, server, round: int = 1) -> None:
    """The server's closing receipts message, as the ServerApp sends it after the last round."""
    ack = site.send(server.downlink(RECEIPTS_MESSAGE_TYPE, round, 11), handler=lambda m, c: None)
    server.receive(ack, site.site_id)
    server.audit.close()


# -- the gate records a refusal a handler raises, and refuses clear text in secure mode ----------------------------
def test_a_policy_refusal_is_recorded_under_its_rule_and_verify_lists_it(tmp_path):
    site, server = Site(tmp_path), Server(tmp_path)

    def refusing(msg, ctx):
        raise Refusal("site_policy", "config", "federation.sync")

    reply = site.send(server.downlink("train", 1, 11), refusing)
    assert reply.has_error() and reply.error.code == POLICY_ERROR_CODE
    assert reply.error.reason == POLICY_REASON_PREFIX + "site_policy" == "refused by the site's policy: site_policy"
    server.receive(reply, site.site_id)
    line = _refusals(site.ledger.path)[-1]
    assert line["refusal"] == {"rule": "site_policy", "record": "config", "key": "federation.sync"}
    assert line["payload_bytes"] == 0
    _close(site, server)
    res = verify_path(tmp_path, site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    assert res.status == "compliant", [f.message for f in res.findings]  # a refusal is not a violation
    assert [(r.rule, r.key, r.action) for r in res.refusals] == [("site_policy", "federation.sync", "train")]
    assert res.to_json()["refusals"][0]["site_id"] == "site-00"


def test_a_refused_foreign_run_is_a_note_for_verify_but_content_sent_there_is_not_compliant(tmp_path):
    """A site that refuses an app of another run (P27) records the refusal; the consortium's server ledger never saw
    that run, so verify notes it instead of calling the server ledger truncated. Content sent in such a run is never
    compliant."""
    from flwr.app import Metadata

    from fcd_secure.audit import record_site_refusal

    site, server = Site(tmp_path), Server(tmp_path)
    reply = site.send(server.downlink("train", 1, 11))
    server.receive(reply, site.site_id)
    foreign = Message(metadata=Metadata(run_id=999, message_id="foreign-1", src_node_id=0, dst_node_id=11,
                                        reply_to_message_id="", group_id="0", created_at=0.0, ttl=60.0,
                                        message_type="train"), content=RecordDict())
    record_site_refusal(site.ledger, foreign, Refusal("app_not_pinned", "fab", "0123456789abcdef"),
                        privacy_ledger_hash="ab" * 32)  # the privacy heads, as the site records them in every line
    _close(site, server)
    pins = {"site_keys": [site.ledger.fingerprint], "server_keys": [server.ledger.fingerprint]}
    res = verify_path(tmp_path, **pins)
    assert res.status == "compliant" and any(f.severity == "note" and "run 999" in f.message for f in res.findings)
    assert [(r.rule, r.action) for r in res.refusals] == [("app_not_pinned", "train")]
    other = Message(metadata=Metadata(run_id=999, message_id="foreign-2", src_node_id=0, dst_node_id=11,
                                      reply_to_message_id="", group_id="0", created_at=0.0, ttl=60.0,
                                      message_type="train"), content=RecordDict())
    site.send(other)
    assert verify_path(tmp_path, **pins).status == "partial"


def test_a_secure_site_gate_refuses_any_clear_text_theta_c_or_count(tmp_path):
    """Belt and braces (P20): even if a handler built a plain update, a site in secure mode lets no tensor and no
    number leave outside the masked protocol."""
    site = Site(tmp_path, policy=GatePolicy(allowed_metrics=frozenset({"num/n", "metrics/loss"}), secure_only=True))
    server = Server(tmp_path)
    reply = site.send(server.downlink("train", 1, 11))
    assert reply.has_error() and reply.error.code == GATE_ERROR_CODE
    assert _refusals(site.ledger.path)[-1]["refusal"]["rule"] == "clear_in_secure_mode"

    def count_only(msg, ctx):
        return Message(RecordDict({"num": MetricRecord({"n": 20})}), reply_to=msg)

    assert site.send(server.downlink("train", 1, 11), count_only).has_error()

    def protocol(msg, ctx):
        return Message(RecordDict({"secagg": ConfigRecord({"msg": b"\x01" * 64})}), reply_to=msg)

    ok = site.send(server.downlink("train.secagg_advertise_keys", 1, 11), protocol)
    assert ok.has_content() and not ok.has_error()


# -- the real ClientApp under a server's run config ------------------------------------------------------------
SITE_CFG = {
    "seed": 0,
    "data": {"n_sites": 4, "alpha": 1000.0, "test_fraction": 0.35},
    "federation": {"clients_per_round": 4, "rounds": 1, "secure_aggregation": True},
}


def _hospital(tmp_path, **over):
    """A site's folder with the policy a hospital wrote for the consortium's run (DP required, its own ledger)."""
    root = tmp_path / "state"
    cfg = build_config("tiny", {**SITE_CFG, "dp": {"enabled": True, "epsilon": 4.0, "ledger_dir": str(tmp_path / "dp")}, **over})
    cfg = cfg.model_copy(update={"state_dir": str(root)})
    SitePolicy.for_run(cfg).write(root / "site-00" / "site_policy.toml")
    return cfg, root


def _deliver(app, root, request_cfg, message_type: str, content: RecordDict, round: int = 1) -> Message:
    """One message as the SuperNode hands it to the ClientApp: the run config is the server's."""
    ctx = Context(run_id=7, node_id=11, node_config={"partition-id": 0, "state-dir": str(root)}, state=RecordDict(),
                  run_config={RUN_CONFIG_KEY: request_cfg.to_json()})
    return app(instruction(message_type, round, 11, content=content), ctx)


def _train_content(cfg, round: int = 1) -> RecordDict:
    from fcd_secure.federation import learner

    data = learner.load_site_data(cfg, 0)
    model = learner.build_model(cfg, learner.dims_of(data.train, data.n_sites))
    theta = model.get_params("theta_c")
    return RecordDict({REC_GLOBAL: global_to_record(theta), REC_CONFIG: ConfigRecord({"server-round": round, "part": "theta_c"})})


WEAKER = [
    ({"federation": {"sync": "full", "secure_aggregation": False}}, "federation.sync"),
    ({"dp": {"enabled": False}}, "dp.enabled"),
    ({"dp": {"epsilon": 64.0}}, "dp.epsilon"),
    ({"dp": {"ledger_dir": "OTHER"}}, "dp.ledger_dir"),
    ({"secagg": {"min_sites": 4}}, "secagg.min_sites"),
]


def test_a_server_config_asking_for_less_is_refused_recorded_and_nothing_of_theta_s_leaves(tmp_path, one_torch_thread):
    from fcd_secure.apps.client_app import make_client_app

    cfg, root = _hospital(tmp_path, secagg={"min_sites": 5})  # this hospital wants at least 5 sites per sum
    app = make_client_app(None)  # deployment-style: the config of every message is the server's
    content = _train_content(cfg)
    for i, (change, field) in enumerate(WEAKER):
        raw = cfg.model_dump(mode="json")
        for section, values in change.items():
            raw[section].update({k: (str(tmp_path / "fresh") if v == "OTHER" else v) for k, v in values.items()})
        request = type(cfg).model_validate(raw)
        for mtype in ("query.hello", "train", "train.secagg_train_advertise"):
            reply = _deliver(app, root, request, mtype, content, round=i + 1)
            assert reply.has_error() and reply.error.code == POLICY_ERROR_CODE, (field, mtype)
            assert reply.error.reason == POLICY_REASON_PREFIX + "site_policy" == "refused by the site's policy: site_policy"
    ledger = root / "site-00" / "slots" / SITE_LEDGER_FILE
    refused = _refusals(ledger)
    assert [r["refusal"]["key"] for r in refused] == [f for _, f in WEAKER for _ in range(3)]
    assert all(r["refusal"]["rule"] == "site_policy" and r["payload_bytes"] == 0 for r in refused)
    # nothing trained, so no Θs ever existed to leave; no upload line carries a tensor
    assert not (root / "site-00" / STATE_FILE).exists()
    assert not any(l.get("tensors") for l in _lines(ledger) if l["kind"] == "upload")
    assert not (tmp_path / "fresh").exists()  # the server's ledger folder was never created
    key = SiteState(root, "site-00").identity_private_key()
    res = verify_path(root / "site-00", site_keys=[fingerprint(public_key_bytes(key))])
    # the site folder alone (no server ledger) is partial evidence; refusals are never violations
    assert res.status == "partial" and not any(f.severity in ("violation", "tampered") for f in res.findings)
    assert sorted({r.key for r in res.refusals}) == sorted(f for _, f in WEAKER)


def test_a_secure_site_refuses_the_plain_training_and_evaluation_actions(tmp_path, one_torch_thread):
    from fcd_secure.apps.client_app import make_client_app

    cfg, root = _hospital(tmp_path)
    app = make_client_app(None)
    for mtype in ("train", "query.evaluate"):
        content = _train_content(cfg)
        if mtype == "query.evaluate":
            content[REC_CONFIG] = ConfigRecord({"quick": True, "max-rows": -1, "n-samples": 1, "part": "theta_c"})
        reply = _deliver(app, root, cfg, mtype, content)
        assert reply.has_error() and reply.error.code == POLICY_ERROR_CODE
        assert reply.error.reason == POLICY_REASON_PREFIX + "downgrade"
    refused = _refusals(root / "site-00" / "slots" / SITE_LEDGER_FILE)
    assert [(r["refusal"]["rule"], r["refusal"]["key"]) for r in refused] == [("downgrade", "train"), ("downgrade", "query.evaluate")]
    assert not (root / "site-00" / STATE_FILE).exists()  # the refused round never trained


def test_differencing_evaluation_cohorts_of_1_2_3_rows_gets_nothing_and_is_refused(tmp_path, one_torch_thread):
    from fcd_secure.federation import learner
    from fcd_secure.apps.client_app import make_client_app

    plain = {"federation": {"clients_per_round": 4, "rounds": 1, "secure_aggregation": False}}
    cfg, root = _hospital(tmp_path, dp={"enabled": False}, **plain)
    policy = SitePolicy.load(root / "site-00" / "site_policy.toml")
    policy.model_copy(update={"evaluation": policy.evaluation.model_copy(update={"max_repeats": 2})}).write(
        root / "site-00" / "site_policy.toml"
    )
    n_test = learner.load_site_data(cfg, 0).test.n
    assert 20 <= n_test < 50  # a split smaller than the minimum cohort is evaluated whole
    app = make_client_app(None)
    replies = []
    for rows in (1, 2, 3):
        content = _train_content(cfg)
        content[REC_CONFIG] = ConfigRecord({"quick": True, "max-rows": rows, "n-samples": 1, "part": "theta_c"})
        replies.append(_deliver(app, root, cfg, "query.evaluate", content))
    first, second, third = replies
    assert not first.has_error() and not second.has_error()
    sums = [dict(r.content["eval"]) for r in (first, second)]
    assert sums[0]["n_test"] == sums[1]["n_test"] == n_test  # never 1, 2 or 3 rows
    assert sums[0] == sums[1]  # the same cohort twice: the difference is zero, no patient singled out
    assert third.has_error() and third.error.code == POLICY_ERROR_CODE  # beyond the policy's repeats
    refused = _refusals(root / "site-00" / "slots" / SITE_LEDGER_FILE)
    assert [(r["refusal"]["rule"], r["refusal"]["key"]) for r in refused] == [("eval_cohort", "repeats")]


# -- the whole path: the real ServerApp and ClientApp (in-process engine) ----------------------------------------------
@pytest.mark.slow
def test_simulated_sites_refuse_a_run_weaker_than_their_policies_and_verify_lists_it(tmp_path):
    from typer.testing import CliRunner

    from fcd_secure.cli.main import app as fcd_app
    from fcd_secure.apps.server_loop import FederationError
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.engines.simulation import write_simulated_policies

    state = tmp_path / "state"
    own = build_config("tiny", {**SITE_CFG, "federation": {**SITE_CFG["federation"], "secure_aggregation": False},
                                "state_dir": str(state), "out": str(tmp_path / "run")})
    write_simulated_policies(own)  # the hospitals' choice: DSS only
    weak = own.model_copy(update={"federation": own.federation.model_copy(update={"sync": "full"})})
    # the server names every site and the category (the closed vocabulary), never the field
    with pytest.raises(FederationError, match=r"site-00, site-01, site-02, site-03: refused by the site.s policy \(at hello"):
        run_inprocess(weak)
    for i in range(4):
        assert not (state / f"site-{i:02d}" / STATE_FILE).exists()
    res = CliRunner().invoke(fcd_app, ["audit", "verify", str(state), "--json", "--allow-unpinned"])
    env = json.loads(res.stdout)
    # the run stopped at hello, so its refusals were never receipted; the server's ledger records each of them with
    # every fact equal, and they carried nothing, so that is a note, not partial evidence (P28); none is a violation
    assert env["status"] == "unverified" and res.exit_code == 0
    assert any("never sent its receipt" in f["message"] for f in env["data"]["findings"] if f["severity"] == "note")
    assert not [f for f in env["data"]["findings"] if f["severity"] in ("violation", "tampered")]
    keys = {(r["site_id"], r["rule"], r["key"]) for r in env["data"]["refusals"]}
    assert {("site-00", "site_policy", "federation.sync")} <= keys and len({k[0] for k in keys}) == 4


@pytest.mark.slow
def test_secure_evaluation_leaves_no_per_site_sums_at_the_server(tmp_path):
    from fcd_secure.audit.ledger import SERVER_LEDGER_FILE
    from fcd_secure.engines.inprocess import run_inprocess

    state = tmp_path / "state"
    cfg = build_config("tiny", {**SITE_CFG, "federation": {**SITE_CFG["federation"], "eval_every": 0},
                                "state_dir": str(state), "out": str(tmp_path / "run")})
    res = run_inprocess(cfg)
    ev = res.final_eval
    assert ev["secure"] is True and ev["sites_evaluated"] == 4 and ev["failed_sites"] == []
    assert np.isfinite(ev["pehe"]) and np.isfinite(ev["factual_auc"]) and set(ev["policies"]) == {"never", "always", "early_on", "late_on"}
    received = [l for l in _lines(state / "_server" / "audit" / SERVER_LEDGER_FILE) if l["kind"] == "received"]
    assert received and not any(l["action"] in ("query.evaluate", "train") for l in received)
    # nothing numeric arrived in clear: no tensor, no metric; only the protocol's opaque fields
    assert not any(l["tensors"] or l["metrics"] or l["metric_lists"] for l in received)
    assert {l["action"] for l in received} >= {"train.secagg_evaluate", "train.secagg_masked_input"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["pehe"] == pytest.approx(ev["pehe"])
    server_key = (state / "_server" / "identity_ed25519.key").read_bytes()
    site_keys = [fingerprint(public_key_bytes(SiteState(state, f"site-{i:02d}").identity_private_key())) for i in range(4)]
    verdict = verify_path(state, site_keys=site_keys, server_keys=[fingerprint(public_key_bytes(server_key))])
    assert verdict.exit_code == 0, [f.message for f in verdict.findings if f.severity != "note"]


def test_an_evaluation_declined_under_the_cohort_rules_is_not_a_site_error():
    from flwr.app import Error

    from fcd_secure.audit import SITE_ERRORS
    from fcd_secure.federation.messaging import declined_evaluation

    msg = instruction("query.evaluate", 1)

    def reply(code, reason):
        return Message(Error(code=code, reason=reason), reply_to=msg)

    assert declined_evaluation(reply(POLICY_ERROR_CODE, POLICY_REASON_PREFIX + "eval_cohort"))
    # any other refusal (a weaker request, a downgrade) and any failure stays an error the operator must see
    assert not declined_evaluation(reply(POLICY_ERROR_CODE, POLICY_REASON_PREFIX + "site_policy"))
    assert not declined_evaluation(reply(POLICY_ERROR_CODE, POLICY_REASON_PREFIX + "downgrade"))
    assert not declined_evaluation(reply(SITE_ERRORS["internal"][0], POLICY_REASON_PREFIX + "eval_cohort"))
    assert not declined_evaluation(Message(RecordDict(), reply_to=msg))

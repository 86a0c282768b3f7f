"""P28: a server cannot make an honest site's evidence verify as tampered by sending it a message type it does not
handle.

The site is the product's own ClientApp (``apps.client_app.make_client_app``: egress gate, guard, site runtime, real
ledger on disk); the server is the product's own :class:`~fcd_secure.audit.ServerAudit`; the carrier between them does
what Flower 1.42's SuperNode runtime does with a ClientApp that raises (``flwr.supernode.runtime.run_clientapp``: an
error reply whose reason is ``str(type(ex)) + ":<'" + str(ex) + "'>"``). ``fcd audit verify`` then reads both ledgers.
"""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from test_audit_support import instruction

from fcd_secure._flower.internals import ErrorCode, TaskIdentity
from fcd_secure.audit import POLICY_ERROR_CODE, POLICY_REASON_PREFIX, RECEIPTS_MESSAGE_TYPE, ServerAudit
from fcd_secure.audit import load_or_create_identity_key
from fcd_secure.audit.verify import verify_path
from fcd_secure.config import build_config

NODE = 11
#: types a server may send that the site's app registers no handler for: a retired secure action, a bare category
#: (Flower's default action) and a made-up query
UNKNOWN = ("train.secagg_train", "evaluate", "query.dump_state")


@pytest.fixture()
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
    yield


def _flower_runtime(app, msg: Message, ctx: Context) -> Message:
    """What the SuperNode's runtime sends back for ``msg`` (flwr 1.42 ``run_clientapp``): the ClientApp's reply, or
    an error reply with the exception's text when the ClientApp raises."""
    try:
        return app(msg, ctx)
    except Exception as ex:  # noqa: BLE001 - exactly what Flower's runtime catches
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(type(ex)) + ":<'" + str(ex) + "'>"),
                       reply_to=msg)


class Pair:
    """The product's site ClientApp and the product's server audit, with Flower's runtime between them."""

    def __init__(self, tmp_path) -> None:
        from fcd_secure.apps.client_app import make_client_app
        from fcd_secure.apps.site import SiteRuntime

        self.state = tmp_path / "state"
        cfg = build_config("tiny", {"state_dir": str(self.state)})
        from fcd_secure.engines.simulation import write_simulated_policies

        write_simulated_policies(cfg)  # the policy a simulated site takes for this run (no DP required)
        self.app = make_client_app(cfg)
        self.ctx = Context(run_id=7, node_id=NODE, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
        self.site = SiteRuntime.from_context(self.ctx, cfg)
        key = load_or_create_identity_key(self.state / "_server" / "identity_ed25519.key")
        self.audit = ServerAudit(self.state / "_server" / "audit", key)
        self.audit.record_manifest(self.site.manifest)

    def call(self, message_type: str, rnd: int, content: RecordDict | None = None) -> Message:
        if content is None:
            content = self.audit.attach(NODE, RecordDict({"config": ConfigRecord({"server-round": rnd})}))
        reply = _flower_runtime(self.app, instruction(message_type, rnd, NODE, content=content), self.ctx)
        self.audit.on_reply(reply, self.site.site_id)
        return reply

    def verify(self):
        from fcd_secure.audit.ledger import fingerprint, public_key_bytes

        site_key = fingerprint(public_key_bytes(self.site.identity_private_key()))
        return verify_path(self.state, site_keys=[site_key], server_keys=[self.audit.ledger.fingerprint])


def test_a_message_type_the_site_does_not_handle_is_refused_by_its_gate_and_verify_says_so(tmp_path, task_identity):
    """P28. The server sends an honest site message types its app does not register. Each is answered by the site's
    own gate with the closed-vocabulary refusal ``unknown_message_type`` (no Flower text), recorded in the site
    ledger, receipted by the server; verify reconciles both ledgers (not tampered) and names each refused type."""
    pair = Pair(tmp_path)
    assert pair.call("query.hello", 0).has_content()
    replies = [pair.call(mtype, rnd) for rnd, mtype in enumerate(UNKNOWN, start=1)]
    ack = pair.call(RECEIPTS_MESSAGE_TYPE, len(UNKNOWN), pair.audit.final_contents()[NODE])
    assert ack.has_content()
    pair.audit.close()

    res = pair.verify()
    bad = [f.message for f in res.findings if f.severity != "note"]
    assert res.status == "compliant" and res.exit_code == 0, bad  # today: tampered (exit 6)
    for reply in replies:
        assert reply.has_error() and not reply.has_content()
        # the site's own refusal, from the closed vocabulary: never Flower's "No train function registered …"
        assert (reply.error.code, reply.error.reason) == (POLICY_ERROR_CODE, POLICY_REASON_PREFIX + "unknown_message_type")
    assert [(r.action, r.rule) for r in res.refusals] == [(t, "unknown_message_type") for t in UNKNOWN]
    notes = [f.message for f in res.findings if f.severity == "note"]
    for mtype in UNKNOWN:
        assert any(mtype in n and "does not handle" in n for n in notes), notes


def test_a_refusal_the_server_recorded_but_never_receipted_does_not_make_the_evidence_partial(tmp_path, task_identity):
    """P28. The server records the site's refusal in its own ledger and then withholds the receipt (the run stops at
    the refusal). Both ledgers agree on every fact of the refusal, which carried nothing: verify says the receipt
    never came back, in a note, instead of calling the honest site's evidence partial (exit 4)."""
    pair = Pair(tmp_path)
    assert pair.call("query.hello", 0).has_content()
    # a clear-text training request to a site in secure mode (refused: downgrade, P20); the hello's receipt rides on
    # this downlink, the refusal's never comes
    assert pair.call("train", 1).error.reason == POLICY_REASON_PREFIX + "downgrade"
    pair.audit.close()
    res = pair.verify()
    bad = [f.message for f in res.findings if f.severity != "note"]
    assert res.status == "compliant" and res.exit_code == 0, bad
    notes = [f.message for f in res.findings if f.severity == "note"]
    assert any("never sent its receipt" in n for n in notes), notes



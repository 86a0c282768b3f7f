"""P29: the opaque protocol field of a secure-aggregation reply is no covert channel.

The gate used to bound a stage's ``secagg/msg`` bytes only by a size formula (``1024 + 96·max_sites`` for a key
advertisement, ``512 + 4·words`` for a masked input): zlib of a site's propensities fits in either. Here the site's
real gate binding (``apps.egress.make_egress_gate_mod`` with the site runtime of a real tiny config, its roster and
its ledger) checks the reply of a compromised handler; only the handler is the attacker's.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from test_audit_support import instruction

from fcd_secure._flower.internals import TaskIdentity
from fcd_secure.aggregation.secagg import SecAggClient, SecAggServer
from fcd_secure.aggregation.secagg.messages import (
    HASH_BYTES,
    HEADER,
    MAGIC,
    VERSION,
    Advertise,
    Ciphertexts,
    MaskedInput,
    MsgType,
    peek_header,
)
from fcd_secure.config import build_config
from fcd_secure.federation.records import REC_CONFIG, REC_SECAGG, SECAGG_FIELD, secagg_round_id
from fcd_secure.federation.secure.setup import provision_roster, vector_layout

SITES = [f"site-{i:02d}" for i in range(4)]
REFUSED = "egress refused by the site gate: protocol_shape"


@pytest.fixture()
def site(tmp_path):
    from fcd_secure.apps.egress import make_egress_gate_mod
    from fcd_secure.apps.site import SiteRuntime

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
    state = tmp_path / "state"
    cfg = build_config("tiny", {"state_dir": str(state)})
    roster = provision_roster(state, SITES)
    ctx = Context(run_id=7, node_id=11, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    rt = SiteRuntime.from_context(ctx, cfg)
    gate = make_egress_gate_mod(lambda msg, context: SiteRuntime.from_context(context, cfg))
    return rt, roster, ctx, gate


def _send(gate, ctx, stage: str, request: bytes, reply: bytes) -> Message:
    """The gate's answer when a handler replies ``reply`` to the ``stage`` request ``request``."""
    msg = instruction(f"train.secagg_{stage}", 1, content=RecordDict({
        REC_CONFIG: ConfigRecord({"server-round": 1}), REC_SECAGG: ConfigRecord({SECAGG_FIELD: request})}))

    def handler(m: Message, c: Context) -> Message:
        return Message(RecordDict({REC_SECAGG: ConfigRecord({SECAGG_FIELD: reply})}), reply_to=m)

    return gate(msg, ctx, handler)


def _private(rt, limit: int) -> bytes:
    """zlib of the site's leading propensity rows, as many as fit in ``limit`` bytes."""
    P = np.asarray(rt.dataset_train.P, np.float32)
    rows = len(P)
    while len(blob := zlib.compress(P[:rows].tobytes(), 9)) > limit:
        rows //= 2
    assert rows >= 1
    return blob


def test_an_honest_advertisement_passes_and_covert_ones_are_refused(site):
    """P29. A key advertisement is exactly its fields for the round's selected sites: an honest one passes; zlib of
    the site's propensities as the whole field, behind a well-formed header, or as extra share commitments does not
    (each fit the old ``1024 + 96·max_sites`` bound)."""
    rt, roster, ctx, gate = site
    layout = vector_layout(rt.manifest)
    server = SecAggServer(rt.secagg_policy, layout, SITES, round_id=secagg_round_id(1, pipelined=False), roster=roster)
    request = server.start()[rt.site_id]
    client = SecAggClient(rt.site_id, rt.identity_private_key(), roster, rt.secagg_policy, layout, input_later=True)
    honest = client.handle(request)
    ok = _send(gate, ctx, "train_advertise", request, honest)
    assert not ok.has_error() and ok.content[REC_SECAGG][SECAGG_FIELD] == honest

    h = peek_header(request)
    adv = Advertise.parse(honest)
    padded = Advertise(adv.session_id, adv.round_id, adv.site_id, adv.c_pk, adv.s_pk, adv.commit_s, adv.commit_b,
                       adv.share_commits + tuple((c[:HASH_BYTES], c[HASH_BYTES:]) for c in _chunks(_private(rt, 3000))),
                       adv.signature).to_bytes()
    covert = {
        "opaque": _private(rt, 6000),
        "behind-a-header": HEADER.pack(MAGIC, VERSION, int(MsgType.ADVERTISE), h.session_id, h.round_id) + _private(rt, 6000),
        "extra-commitments": padded,
    }
    for name, reply in covert.items():
        assert len(reply) <= 1024 + 96 * 64, name  # within the old bound
        out = _send(gate, ctx, "train_advertise", request, reply)
        assert out.has_error() and out.error.reason == REFUSED, name
    refused = [e for e in rt.state.dir.rglob("site_ledger.jsonl")][0].read_text().count('"protocol_shape"')
    assert refused == len(covert)


def test_a_masked_input_is_exactly_the_layout_words(site):
    """P29. The masked input of a training round is exactly the layout's words × 4 behind its header: a vector
    with 100 more words (zlib of propensity rows in them) is refused, though it fit the old ``512 + 4·words``."""
    rt, roster, ctx, gate = site
    layout = vector_layout(rt.manifest)
    session = b"S" * 16
    request = Ciphertexts(MsgType.SHARES_RELAY, session, 3, rt.site_id, ()).to_bytes()
    blob = _private(rt, 400)
    extra = np.frombuffer(blob + b"\0" * (-len(blob) % 4), dtype="<u4")
    words = np.concatenate([np.zeros(layout.length, "<u4"), extra, np.zeros(100 - len(extra), "<u4")])
    long_reply = MaskedInput(session, 3, rt.site_id, words).to_bytes()
    assert len(long_reply) <= 512 + 4 * layout.length  # within the old bound
    assert _send(gate, ctx, "train_masked", request, long_reply).error.reason == REFUSED
    exact = MaskedInput(session, 3, rt.site_id, np.zeros(layout.length, "<u4")).to_bytes()
    assert not _send(gate, ctx, "train_masked", request, exact).has_error()
    # the header must answer the request: another round or session, or another site's id, is refused
    for reply in (MaskedInput(session, 4, rt.site_id, np.zeros(layout.length, "<u4")).to_bytes(),
                  MaskedInput(b"T" * 16, 3, rt.site_id, np.zeros(layout.length, "<u4")).to_bytes(),
                  MaskedInput(session, 3, "site-01", np.zeros(layout.length, "<u4")).to_bytes()):
        assert _send(gate, ctx, "train_masked", request, reply).error.reason == REFUSED


def _chunks(blob: bytes) -> list[bytes]:
    blob = blob + b"\0" * (-len(blob) % (2 * HASH_BYTES))
    return [blob[i:i + 2 * HASH_BYTES] for i in range(0, len(blob), 2 * HASH_BYTES)]


def test_every_honest_reply_of_a_round_is_exactly_its_request_s_reply_and_one_byte_more_is_not():
    """P29, at the protocol level: in a five-stage round with a site dropping after key sharing (so the unmask
    requests name a dropped site), every reply a client sends passes :func:`check_reply` against its request, and
    the same reply one byte longer or shorter, or answered to another request, does not."""
    from secagg_harness import RoundLog, run_round, toy_round

    from fcd_secure.aggregation.secagg import ProtocolError
    from fcd_secure.aggregation.secagg.client import check_reply

    t = toy_round(n_sites=5, d=40, seed=3)
    log = RoundLog()
    run_round(t.server, t.clients, drop={"masked_input": {"site04"}}, log=log)
    checked = 0
    for site, replies in log.uplink.items():
        for request, reply in zip(log.downlink[site], replies):
            check_reply(request, reply, site, t.layout.length, t.roster)
            checked += 1
            for bad in (reply + b"\0", reply[:-1]):
                with pytest.raises(ProtocolError):
                    check_reply(request, bad, site, t.layout.length, t.roster)
        with pytest.raises(ProtocolError):  # the key advertisement answers the round parameters, nothing else
            check_reply(log.downlink[site][1], replies[0], site, t.layout.length, t.roster)
    assert checked == 4 * 5 + 2  # four sites through five stages, the dropped one through two
    with pytest.raises(ProtocolError, match="roster"):  # a request naming a site outside the roster has no reply
        check_reply(log.downlink["site00"][0], log.uplink["site00"][0], "site00", t.layout.length,
                    [s for s in t.roster if s != "site03"])

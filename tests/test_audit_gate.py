"""The egress gate on real Flower messages: what passes, what is refused and recorded, what never leaves."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from test_audit_support import MANIFEST, POLICY, Site, instruction

from fcd_secure.audit.accounting import describe_message
from fcd_secure.audit import GATE_ERROR_CODE, GENERIC_ERROR_REASON, GatePolicy, make_egress_gate
from fcd_secure.audit.verify import verify_path
from fcd_secure.manifest import Manifest, ManifestEntry


def _uploads(site: Site) -> list[dict]:
    return [l for l in site.ledger.lines() if l["kind"] == "upload"]


def test_clean_reply_passes_and_is_recorded_with_exact_bytes(tmp_path):
    site = Site(tmp_path)
    reply = site.send(instruction("train", 1))
    assert reply.has_content() and not reply.has_error()
    (entry,) = _uploads(site)
    facts = describe_message(reply)
    assert entry["status"] == "sent"
    assert entry["payload_bytes"] == facts.payload_bytes > 0
    assert entry["message_bytes"] == facts.message_bytes
    assert entry["message_id"] == reply.object_id
    assert entry["payload_sha256"] == reply.content.object_id
    assert entry["round"] == 1 and entry["action"] == "train"
    assert entry["layout_hash"] == MANIFEST.layout_hash
    assert entry["privacy_ledger_hash"] == "ab" * 32
    assert {(t["name"], tuple(t["shape"])) for t in entry["tensors"]} == {
        ("trunk.weight", (6, 4)), ("trunk.bias", (6,)), ("decoder.weight", (3, 6))
    }
    assert sorted(entry["metrics"]) == ["metrics/loss", "num/n"]


def _plant_theta_s_by_name(site):
    def m(content):
        content["update"]["eps_s.weight"] = Array(site.theta_s["eps_s.weight"])
    return m


def _plant_renamed_copy(site):
    # a Θs tensor of the same shape as a Θc tensor, sent under the Θc name
    def m(content):
        content["update"]["trunk.weight"] = Array(site.theta_s["eps_s.weight"].copy())
    return m


def _plant_renamed_unlisted(site):
    def m(content):
        content["extra"] = ArrayRecord({"aux": Array(site.theta_s["ks_head.bias"].copy())})
    return m


def _plant_embedded(site):
    # Θs bytes hidden inside a larger tensor of a legitimate Θc name and shape
    def m(content):
        w = np.random.default_rng(5).standard_normal((3, 6)).astype(np.float32)
        w.reshape(-1)[2:7] = site.theta_s["ks_head.bias"]
        content["update"]["decoder.weight"] = Array(w)
    return m


def _plant_propensity_named(site):
    def m(content):
        content["extra"] = ArrayRecord({"propensity": Array(site.P.copy())})
    return m


def _plant_propensity_disguised(site):
    # the propensity array under an innocent name: caught by its bytes
    def m(content):
        content["extra"] = ArrayRecord({"trunk.bias": Array(site.P.copy())})
    return m


def _plant_propensity_in_protocol_bytes(site):
    def m(content):
        content["cfg"] = ConfigRecord({"blob": b"hdr" + site.P.tobytes()})
    return m


LEAKS = [
    (_plant_theta_s_by_name, "theta_s_name"),
    (_plant_renamed_copy, "theta_s_bytes"),
    (_plant_renamed_unlisted, "theta_s_bytes"),
    (_plant_embedded, "theta_s_bytes"),
    (_plant_propensity_named, "propensity"),
    (_plant_propensity_disguised, "propensity"),
    (_plant_propensity_in_protocol_bytes, "propensity"),
]


@pytest.mark.parametrize("plant,rule", LEAKS, ids=[p.__name__[7:] for p, _ in LEAKS])
def test_planted_leak_is_refused_and_recorded(tmp_path, plant, rule):
    from test_audit_support import Server, close_run

    site, server = Site(tmp_path), Server(tmp_path)
    reply = site.send(server.downlink("train", 1, 11), site.train_handler(plant(site)))
    # nothing of the content leaves: an error reply the gate built, with a reason from its closed vocabulary
    assert reply.has_error() and not reply.has_content()
    assert reply.error.code == GATE_ERROR_CODE
    assert reply.error.reason == f"egress refused by the site gate: {rule}"
    (entry,) = _uploads(site)
    assert entry["status"] == "refused" and entry["refusal"]["rule"] == rule
    assert entry["payload_bytes"] == 0 and entry["is_error"]
    assert entry["message_bytes"] == describe_message(reply).message_bytes
    assert entry["withheld"]["payload_bytes"] > 0  # what was refused, by size and names only
    # the refusal held, so the evidence is clean (exit 0) and lists the refusal
    server.receive(reply, site.site_id)
    close_run([site], server, 1, [11])
    res = verify_path(tmp_path, site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    assert res.exit_code == 0, [f.message for f in res.findings]
    assert next(s for s in res.ledgers if s.role == "site").uploads_refused == 1
    # the site's folder alone is partial evidence: nothing there can show a cut or re-signed ledger
    alone = verify_path(tmp_path / site.site_id, site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    assert alone.status == "partial" and alone.exit_code == 4


def test_exception_text_never_leaves(tmp_path):
    site = Site(tmp_path)

    def handler(msg, ctx):
        raise KeyError("patient_id=12345 age=71")

    reply = site.send(instruction("train", 1), handler)
    assert reply.has_error() and reply.error.reason == GENERIC_ERROR_REASON
    assert "12345" not in repr(reply.error) and "KeyError" not in reply.error.reason
    (entry,) = _uploads(site)
    assert entry["status"] == "error"
    assert "12345" not in (tmp_path / site.site_id / "audit" / "site_ledger.jsonl").read_text()


def test_inner_error_reason_and_code_are_replaced(tmp_path):
    """An inner error's reason may quote an exception and its code is a 64-bit value the handler picks (a covert
    channel): both are replaced; the original code stays in the site's own ledger entry."""
    site = Site(tmp_path)
    covert = 0x1234_5678_9ABC_DEF0  # e.g. eight bytes of a Θs tensor
    reply = site.send(instruction("train", 1), lambda m, c: Message(Error(code=covert, reason="ValueError: row 17 of /data/x.csv"), reply_to=m))
    assert reply.has_error() and reply.error.reason == GENERIC_ERROR_REASON
    assert reply.error.code == GATE_ERROR_CODE
    (entry,) = _uploads(site)
    assert entry["status"] == "error" and entry["handler_error_code"] == covert
    assert entry["message_bytes"] == describe_message(reply).message_bytes


def _relabel_as_secagg(msg, reply):
    reply.metadata.message_type = "train.secagg_masked"  # flwr 1.42: Metadata.message_type has a setter


def _relabel_round(msg, reply):
    reply.metadata.group_id = "99"


def _answer_another_message(msg, reply):
    return Message(reply.content, reply_to=instruction("train.secagg_masked", 1))


@pytest.mark.parametrize(
    "forge,field",
    [(_relabel_as_secagg, "message_type"), (_relabel_round, "group_id"), (_answer_another_message, "message_type")],
    ids=["relabelled-type", "relabelled-round", "reply-to-another-message"],
)
def test_a_reply_that_does_not_answer_its_instruction_is_refused(tmp_path, forge, field):
    """A handler relabels its ``train`` reply so the gate would treat it as a secure-aggregation message, whose
    ConfigRecord bytes pass: the gate checks that the reply answers the instruction and classifies by the latter."""
    site = Site(tmp_path)
    hidden = np.random.default_rng(3).integers(0, 255, size=64, dtype=np.uint8).tobytes()  # arbitrary bytes

    def handler(msg, ctx):
        reply = Message(RecordDict({"secagg": ConfigRecord({"masked": hidden, "stage": 1})}), reply_to=msg)
        return forge(msg, reply) or reply

    reply = site.send(instruction("train", 1), handler)
    assert reply.has_error() and not reply.has_content()
    assert reply.error.code == GATE_ERROR_CODE and reply.error.reason.endswith("not_a_reply")
    (entry,) = _uploads(site)
    assert entry["status"] == "refused" and entry["refusal"] == {"rule": "not_a_reply", "record": "metadata", "key": field}
    assert entry["action"] == "train" and entry["payload_bytes"] == 0
    assert entry["withheld"]["config_fields"][0]["key"] == "masked"


def test_config_bytes_in_a_plain_train_reply_are_refused_even_if_labelled_correctly(tmp_path):
    """Classification follows the instruction: the same protocol-looking bytes in an answer to ``train`` are refused."""
    site = Site(tmp_path)
    reply = site.send(instruction("train", 1), lambda m, c: Message(RecordDict({"secagg": ConfigRecord({"masked": b"x" * 32})}), reply_to=m))
    assert reply.has_error() and reply.error.reason.endswith("config_not_allowed")


@pytest.mark.parametrize(
    "mutate,rule",
    [
        (lambda c: c.__setitem__("metrics", MetricRecord({"loss": 0.2, "grad_norm_site": 3.0})), "metric_not_allowed"),
        (lambda c: c.__setitem__("metrics", MetricRecord({"loss": [0.1, 0.2, 0.3]})), "metric_not_allowed"),
        (lambda c: c.__setitem__("note", ConfigRecord({"text": "hello"})), "config_not_allowed"),
        (lambda c: c["update"].__setitem__("trunk.bias", Array(np.zeros(7, np.float32) + 0.5)), "layout_mismatch"),
        (lambda c: c["update"].__setitem__("trunk.bias", Array(np.arange(6, dtype=np.float64))), "layout_mismatch"),
        (lambda c: c["update"].__setitem__("brand_new.weight", Array(np.arange(4, dtype=np.float32))), "unlisted_tensor"),
    ],
    ids=["unlisted-metric", "list-metric", "config-outside-protocol", "wrong-shape", "wrong-dtype", "unlisted-tensor"],
)
def test_allow_list_refuses_everything_else(tmp_path, mutate, rule):
    site = Site(tmp_path)
    reply = site.send(instruction("train", 1), site.train_handler(mutate))
    assert reply.has_error() and reply.error.reason.endswith(rule)


def test_secure_aggregation_fields_pass_but_not_floats_or_private_bytes(tmp_path):
    """A protocol reply is exactly its stage's one field, ``msg`` bytes, for the protocol's stages and the combined
    training ones alike; the retired ``train.secagg_train`` acknowledgement (``ready = 1``) no longer passes."""
    site = Site(tmp_path)
    masked = np.random.default_rng(1).integers(0, 2**32, size=40, dtype=np.uint64).astype(np.uint32).tobytes()

    def reply_with(fields):
        return lambda m, c: Message(RecordDict({"secagg": ConfigRecord(fields)}), reply_to=m)

    ok = site.send(instruction("train.secagg_masked_input", 1), reply_with({"msg": masked}))
    assert ok.has_content()
    combined = site.send(instruction("train.secagg_train_masked", 1), reply_with({"msg": masked}))
    assert combined.has_content()
    retired = site.send(instruction("train.secagg_train", 1), reply_with({"ready": 1}))
    assert retired.has_error() and retired.error.reason.endswith("protocol_shape")
    bad_float = site.send(instruction("train.secagg_masked_input", 1), reply_with({"msg": masked, "weight": 20.0}))
    assert bad_float.has_error() and bad_float.error.reason.endswith("protocol_shape")
    leak = site.send(instruction("train.secagg_masked_input", 1), reply_with({"msg": masked + site.theta_s["eps_s.weight"].tobytes()}))
    assert leak.has_error() and leak.error.reason.endswith("theta_s_bytes")
    statuses = [l["status"] for l in site.ledger.lines() if l["kind"] == "upload"]
    assert statuses == ["sent", "sent", "refused", "refused", "refused"]


def test_constant_private_tensor_does_not_block_a_constant_shared_one(tmp_path):
    # a zero Θs bias and a zero Θc bias have equal bytes; they carry no data, so the bytes rule must not fire
    site = Site(tmp_path)
    site.theta_s["ks_head.bias"] = np.zeros(5, np.float32)
    site.theta_s["eps_s.weight"] = np.zeros((6, 4), np.float32)
    reply = site.send(instruction("train", 1), site.train_handler(lambda c: c["update"].__setitem__("trunk.weight", Array(np.zeros((6, 4), np.float32)))))
    assert reply.has_content()


def test_gate_fails_closed_when_the_site_cannot_be_resolved(tmp_path):
    def get_site(ctx):
        raise RuntimeError("no state dir /secret/path")

    gate = make_egress_gate(get_site)
    site = Site(tmp_path)
    msg = instruction("train", 1)
    reply = gate(msg, None, site.train_handler())
    assert reply.has_error() and reply.error.reason == GENERIC_ERROR_REASON


def test_receipts_are_taken_from_the_downlink_and_rounds_are_checkpointed(tmp_path):
    from test_audit_support import Server

    site, server = Site(tmp_path), Server(tmp_path)
    seen = []

    def handler(msg, ctx):
        seen.append(sorted(msg.content.keys()))
        return site.train_handler()(msg, ctx)

    r1 = site.send(server.downlink("train", 1, 11), handler)
    server.receive(r1, site.site_id)
    site.send(server.downlink("train", 2, 11), handler)
    assert seen == [["config"], ["config"]]  # the handler never sees the receipts record
    kinds = [(l["kind"], l.get("round")) for l in site.ledger.lines()]
    assert ("checkpoint", 1) in kinds
    receipt = next(l for l in site.ledger.lines() if l["kind"] == "receipt")
    first_upload = next(l for l in site.ledger.lines() if l["kind"] == "upload")
    assert receipt["for_seq"] == first_upload["seq"]
    assert receipt["receipt"]["payload_bytes"] == first_upload["payload_bytes"]
    assert receipt["receipt"]["message_id"] == first_upload["message_id"]


def test_theta_s_upload_passes_only_under_the_ablation_policy_and_verify_flags_it(tmp_path):
    policy = GatePolicy(allowed_metrics=POLICY.allowed_metrics, allow_theta_s_upload=True)
    site = Site(tmp_path, policy=policy)
    reply = site.send(instruction("train", 1), site.train_handler(_plant_theta_s_by_name(site)))
    assert reply.has_content()
    res = verify_path(tmp_path / site.site_id)
    assert res.exit_code == 1
    assert any("eps_s.weight" in f.message and "Θs" in f.message for f in res.findings)


#: MANIFEST plus a site-bound Θs tensor (as Fed-CausalDiff's behaviour head of inverse-propensity weighting)
BOUND = Manifest.from_entries([
    *MANIFEST.entries,
    ManifestEntry(name="behaviour.weight", shape=(3, 6), dtype="float32", part="theta_s", site_bound=True),
])


def _full_update(site, bound_as=None, into=None):
    """A full-sync update (Θc and the sendable Θs), with the site-bound tensor planted under another name or into a
    Θc tensor."""

    def mutate(content):
        arrays = {k: Array(v) for k, v in sorted(site.theta_c().items())}
        arrays.update({k: Array(v) for k, v in site.theta_s.items() if k in BOUND.names("full")})
        secret = site.theta_s["behaviour.weight"]
        if bound_as is not None:
            arrays[bound_as] = Array(secret.copy())
        if into is not None:
            w = arrays[into].numpy().copy()
            w.reshape(-1)[: secret.size] = secret.reshape(-1)
            arrays[into] = Array(w)
        content["update"] = ArrayRecord(arrays)

    return mutate


@pytest.mark.parametrize(("plant", "rule"), [
    ({"bound_as": "behaviour.weight"}, "theta_s_name"),   # by its own name
    ({"bound_as": "decoder.weight"}, "theta_s_bytes"),    # its bytes under a Θc name of the same shape
    ({"into": "trunk.weight"}, "theta_s_bytes"),          # its rows inside a Θc tensor
])
def test_full_sync_never_lets_a_site_bound_tensor_out(tmp_path, plant, rule):
    policy = GatePolicy(allowed_metrics=POLICY.allowed_metrics, allow_theta_s_upload=True)
    site = Site(tmp_path, policy=policy, manifest=BOUND)
    assert "behaviour.weight" not in BOUND.names("full") and "eps_s.weight" in BOUND.names("full")
    clean = site.send(instruction("train", 1), site.train_handler(_full_update(site)))
    assert clean.has_content()  # the ablation's Θs upload itself passes
    leak = site.send(instruction("train", 2), site.train_handler(_full_update(site, **plant)))
    assert leak.has_error() and leak.error.reason.endswith(rule)
    # the ledger keeps the flag: the layout hash is recomputable from the line, and verify names the breach class
    line = next(l for l in site.ledger.lines() if l["kind"] == "manifest")
    assert line["site_bound"] == ["behaviour.weight"]


def test_the_ledgers_manifest_line_keeps_the_site_bound_flag():
    from fcd_secure.audit.entries import ManifestLine
    from fcd_secure.manifest import layout_hash

    m = ManifestLine.model_validate({**ManifestLine.fields_of(BOUND), "kind": "manifest", "seq": 1, "prev_hash": "0",
                                     "time": "t", "hash": "h", "sig": "s"}).to_manifest()
    assert layout_hash(m.entries) == BOUND.layout_hash == m.layout_hash
    assert [e.name for e in m.entries if e.site_bound] == ["behaviour.weight"]
    # a ledger line of a layout without site-bound entries is written as before (no new field, same hash)
    assert "site_bound" not in ManifestLine.model_validate({**ManifestLine.fields_of(MANIFEST), "kind": "manifest", "seq": 1,
                                                          "prev_hash": "0", "time": "t", "hash": "h", "sig": "s"}).to_json()


def test_privacy_ledger_hash_binds_the_dp_ledger_state(tmp_path):
    from fcd_secure.privacy.ledger import privacy_ledger_hash

    assert privacy_ledger_hash(tmp_path) is None
    (tmp_path / "privacy").mkdir()
    (tmp_path / "privacy" / "ledger-abc.json").write_text('{"eps": 0.5}')
    h1 = privacy_ledger_hash(tmp_path)
    (tmp_path / "privacy" / "ledger-abc.json").write_text('{"eps": 0.7}')
    h2 = privacy_ledger_hash(tmp_path)
    assert h1 and h2 and h1 != h2
    shared = tmp_path / "dp-ledgers"
    shared.mkdir()
    (shared / "ledger-def.json").write_text("{}")
    assert privacy_ledger_hash(tmp_path, shared) not in (None, h2)


def test_each_chain_head_goes_to_the_server_and_its_countersignature_comes_back(tmp_path):
    """The gate sends the site's newest checkpoint with the next reply; the server countersigns it in its ledger and
    returns the countersignature with the receipts; the closing message's ack carries the last round's head."""
    from test_audit_support import Server

    from fcd_secure.audit import RECEIPTS_MESSAGE_TYPE

    site, server = Site(tmp_path), Server(tmp_path)
    server.receive(site.send(server.downlink("train", 1, 11)), site.site_id)
    r2 = site.send(server.downlink("train", 2, 11))  # round 1 is closed first, its head rides on this reply
    checkpoint_1 = next(l for l in site.ledger.lines() if l["kind"] == "checkpoint")
    assert "fcd.audit.head" in r2.content
    server.receive(r2, site.site_id)
    signed = [l for l in server.ledger.lines() if l["kind"] == "countersign"]
    assert [l["checkpoint"]["hash"] for l in signed] == [checkpoint_1["hash"]]
    assert signed[0]["writer_id"] == site.site_id and signed[0]["site_key_fingerprint"] == site.ledger.fingerprint
    site.send(server.downlink("query.evaluate", 2, 11))  # the countersignature comes back with the receipts
    stored = [l for l in site.ledger.lines() if l["kind"] == "countersignature"]
    assert [l["countersign"]["hash"] for l in stored] == [signed[0]["hash"]]
    assert stored[0]["signature_checked_on_arrival"] is True
    assert site.ledger.pending_head() is None  # countersigned: nothing more to send until the next checkpoint
    ack = site.send(server.downlink(RECEIPTS_MESSAGE_TYPE, 2, 11), handler=lambda m, c: None)
    kinds = [l["kind"] for l in site.ledger.lines()]
    # the last round is closed before the ack, which carries that checkpoint for the server to countersign
    assert kinds[-2:] == ["checkpoint", "upload"] and "fcd.audit.head" in ack.content
    server.receive(ack, site.site_id)
    last = server.ledger.lines()[-1]
    assert last["kind"] == "countersign" and last["checkpoint"]["round"] == 2


def _plant_propensity_rows(site):
    # three trajectories' propensities, not the whole array, inside a legitimate Θc tensor
    def m(content):
        w = np.random.default_rng(9).standard_normal((6, 4)).astype(np.float32)
        w.reshape(-1)[1:9] = site.P[7]
        content["update"]["trunk.weight"] = Array(w)
    return m


def _plant_theta_s_row_in_protocol(site):
    def m(content):
        content["cfg"] = ConfigRecord({"blob": b"\x01\x02\x03" + site.theta_s["eps_s.weight"][2].tobytes() + b"tail"})
    return m


@pytest.mark.parametrize(
    "plant,rule,mtype",
    [(_plant_propensity_rows, "propensity", "train"), (_plant_theta_s_row_in_protocol, "theta_s_bytes", "train.secagg_masked")],
    ids=["propensity-row-in-theta-c", "theta-s-row-at-odd-offset"],
)
def test_a_single_private_row_is_found_anywhere(tmp_path, plant, rule, mtype):
    site = Site(tmp_path)
    reply = site.send(instruction(mtype, 1), site.train_handler(plant(site)))
    assert reply.has_error() and reply.error.reason.endswith(rule)


def test_row_scan_has_no_false_positive_on_fresh_parameters(tmp_path):
    site = Site(tmp_path)
    for r in range(1, 6):
        assert site.send(instruction("train", r)).has_content()


# -- P23: private values in every channel a reply has ----------------------------------------------------------------
import struct  # noqa: E402

from fcd_secure.audit.allowlist import HELLO_DIMS, federation_gate_policy  # noqa: E402
from fcd_secure.queries.registry import metric_lists, metric_names  # noqa: E402
from fcd_secure.audit.rules import GatePolicy as _Policy  # noqa: E402
from fcd_secure.data.policy import DEFAULT_POLICY_NAMES  # noqa: E402
from test_audit_support import MANIFEST as _M  # noqa: E402

FED = federation_gate_policy(eval_names=metric_names(DEFAULT_POLICY_NAMES, 2), eval_lists=metric_lists())
FED_WITH_LOSS = FED.model_copy(update={"allowed_metrics": FED.allowed_metrics | {"metrics/loss"}})
EVAL_NAMES = metric_names(DEFAULT_POLICY_NAMES, 2)


def _informative(values: np.ndarray) -> float:
    """A value with a full float32 mantissa (what a trained parameter has)."""
    bits = values.astype(np.float32).reshape(-1).view(np.uint32)
    return float(values.reshape(-1)[int(np.flatnonzero(bits & 0xFFF)[0])])


def _site_after_a_round(tmp_path):
    """A site that answered round 1 with Θs v1 and now holds v2: v1 is last round's Θs."""
    site = Site(tmp_path, policy=FED_WITH_LOSS)
    assert site.send(instruction("train", 1)).has_content()
    previous = {k: v.copy() for k, v in site.theta_s.items()}
    site.theta_s = {k: site.rng.standard_normal(v.shape).astype(np.float32) for k, v in site.theta_s.items()}
    return site, previous


SECRETS = {
    "theta_s_now": lambda site, prev: site.theta_s["eps_s.weight"],
    "theta_s_previous_round": lambda site, prev: prev["eps_s.weight"],
    "propensity_row": lambda site, prev: site.P[7],
    "propensity_column": lambda site, prev: site.P[:, 0],  # every patient's first-step propensity
}
RULES = {
    "theta_s_now": {"theta_s_value", "theta_s_bytes"},
    "theta_s_previous_round": {"theta_s_value", "theta_s_bytes"},
    "propensity_row": {"propensity"},
    "propensity_column": {"propensity"},
}


def _metric_scalar(site, secret, msg):
    if secret.size == 24:  # a Θs tensor: one of its values in an allow-listed scalar
        return Message(_train_content(site, metrics={"loss": 0.25, "total": _informative(secret)}), reply_to=msg)
    # a vector: one value per allow-listed scalar of the evaluation reply
    values = {name: float(v) for name, v in zip(EVAL_NAMES, secret.astype(np.float64))}
    return Message(RecordDict({"eval": MetricRecord(values)}), reply_to=msg)


def _metric_list(site, secret, msg):
    return Message(RecordDict({"eval": MetricRecord({"auc.pos": [float(v) for v in secret.reshape(-1)]})}), reply_to=msg)


def _hello_extra_key(site, secret, msg):
    fields = {"site-id": site.site_id, "site-index": 0, "layout-hash": "ab" * 32, **{f"dim-{d}": 4 for d in HELLO_DIMS}}
    fields["dim-extra"] = np.ascontiguousarray(secret).tobytes()
    return Message(RecordDict({"hello": ConfigRecord(fields)}), reply_to=msg)


def _secagg_extra_field(site, secret, msg):
    masked = np.random.default_rng(1).integers(0, 2**32, size=48, dtype=np.uint64).astype(np.uint32).tobytes()
    return Message(RecordDict({"secagg": ConfigRecord({"msg": masked, "pad": np.ascontiguousarray(secret).tobytes()})}), reply_to=msg)


def _train_content(site, metrics):
    return RecordDict({
        "update": ArrayRecord({k: Array(v) for k, v in sorted(site.theta_c().items())}),
        "num": MetricRecord({"n": 20}),
        "metrics": MetricRecord(metrics),
    })


CHANNELS = {
    "metric_scalar": ("train", _metric_scalar),
    "metric_list": ("query.evaluate", _metric_list),
    "hello_extra_key": ("query.hello", _hello_extra_key),
    "secagg_extra_bytes_field": ("train.secagg_masked_input", _secagg_extra_field),
}


@pytest.mark.parametrize("secret", sorted(SECRETS))
@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_exact_private_values_are_refused_in_every_channel(tmp_path, channel, secret):
    """Exact Θs (this round's and last round's) and propensities (a patient's row, a step's column over all patients)
    in a metric scalar, a metric list, an extra hello config key and an extra field of a secure-aggregation reply."""
    site, previous = _site_after_a_round(tmp_path)
    mtype, build = CHANNELS[channel]
    value = np.asarray(SECRETS[secret](site, previous))
    reply = site.send(instruction(mtype, 2), lambda m, c: build(site, value, m))
    assert reply.has_error() and not reply.has_content(), f"{secret} left through {channel}"
    rule = reply.error.reason.rsplit(": ", 1)[-1]
    assert rule in RULES[secret], rule
    assert _uploads(site)[-1]["refusal"]["rule"] == rule


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_reply_metadata_carries_nothing_the_handler_set(tmp_path, secret):
    """``ttl`` and ``created_at`` have setters in flwr 1.42: the low bits of a float carry a float32 exactly. The
    gate rebuilds the reply, so what leaves has the metadata Flower derives from the instruction and the gate clock."""
    site, previous = _site_after_a_round(tmp_path)
    pattern = int(np.asarray(SECRETS[secret](site, previous), np.float32).reshape(-1).view(np.uint32)[1])
    msg = instruction("train", 2)

    def handler(m, c):
        reply = Message(_train_content(site, {"loss": 0.25}), reply_to=m)
        for field in ("ttl", "created_at"):
            base = struct.unpack("<Q", struct.pack("<d", getattr(reply.metadata, field)))[0]
            setattr(reply.metadata, field, struct.unpack("<d", struct.pack("<Q", (base & ~0xFFFFFFFF) | pattern))[0])
        reply.metadata.src_task_id = pattern
        return reply

    out = site.send(msg, handler)
    assert out.has_content()
    for field in ("ttl", "created_at"):
        low = struct.unpack("<Q", struct.pack("<d", getattr(out.metadata, field)))[0] & 0xFFFFFFFF
        assert low != pattern, field
    assert out.metadata.src_task_id == msg.metadata.dst_task_id
    # flwr's own rule for a reply: it lives no longer than the instruction it answers
    assert out.metadata.ttl == pytest.approx(msg.metadata.created_at + msg.metadata.ttl - out.metadata.created_at)
    assert _uploads(site)[-1]["message_id"] == out.object_id


def test_allow_lists_are_exact_names_with_caps(tmp_path):
    """No glob passes: a fresh name under an allowed prefix, a list past its cap, a config key of the wrong type."""
    with pytest.raises(ValueError, match="exact"):
        _Policy(allowed_metrics=frozenset({"eval/*"}))
    with pytest.raises(ValueError, match="exact"):
        _Policy(allowed_config_keys={"hello/dim-*": {"type": "int"}})
    site = Site(tmp_path, policy=FED_WITH_LOSS)
    rng = np.random.default_rng(4)
    ok_eval = {n: float(rng.normal()) for n in EVAL_NAMES} | {"auc.pos": [float(x) for x in rng.integers(0, 9, 100)]}
    assert site.send(instruction("query.evaluate", 1), lambda m, c: Message(RecordDict({"eval": MetricRecord(ok_eval)}), reply_to=m)).has_content()
    hello = {"site-id": "site-00", "site-index": 0, "layout-hash": "ab" * 32, **{f"dim-{d}": 5 for d in HELLO_DIMS}}
    assert site.send(instruction("query.hello", 1), lambda m, c: Message(RecordDict({"hello": ConfigRecord(hello)}), reply_to=m)).has_content()
    refused = [
        ("query.evaluate", RecordDict({"eval": MetricRecord({"policy.never.leak": 0.5})}), "metric_not_allowed"),
        ("query.evaluate", RecordDict({"eval": MetricRecord({"auc.pos": [1.0] * 101})}), "metric_not_allowed"),
        ("query.hello", RecordDict({"hello": ConfigRecord({**hello, "dim-extra": 3})}), "config_not_allowed"),
        ("query.hello", RecordDict({"hello": ConfigRecord({**hello, "dim-dx": b"\x01\x02"})}), "config_not_allowed"),
        ("query.hello", RecordDict({"hello": ConfigRecord({**hello, "site-id": "x" * 65})}), "config_not_allowed"),
        ("query.hello", RecordDict({"hello": ConfigRecord({**hello, "dim-L": 2**40})}), "config_not_allowed"),
        # the retired training acknowledgement is an unknown stage now, in its old shape or as protocol bytes
        ("train.secagg_train", RecordDict({"secagg": ConfigRecord({"ready": 1})}), "protocol_shape"),
        ("train.secagg_train", RecordDict({"secagg": ConfigRecord({"msg": b"x"})}), "protocol_shape"),
        # the combined training stages answer with protocol bytes only, never an acknowledgement or a count
        ("train.secagg_train_advertise", RecordDict({"secagg": ConfigRecord({"ready": 1})}), "protocol_shape"),
        ("train.secagg_train_masked", RecordDict({"secagg": ConfigRecord({"msg": b"x", "n": 20})}), "protocol_shape"),
        ("train.secagg_unknown_stage", RecordDict({"secagg": ConfigRecord({"msg": b"x"})}), "protocol_shape"),
        ("train.secagg_consistency", RecordDict({"secagg": ConfigRecord({"msg": b"x" * 513})}), "protocol_shape"),
        ("train.secagg_masked_input", RecordDict({"secagg": ConfigRecord({"msg": b"x" * (4 * _M.size("theta_c") + 513)})}), "protocol_shape"),
        ("train.secagg_masked_input", RecordDict({"secagg": ConfigRecord({"msg": b"x"}), "other": ConfigRecord({"msg": b"y"})}), "protocol_shape"),
    ]
    for mtype, content, rule in refused:
        reply = site.send(instruction(mtype, 1), lambda m, c, content=content: Message(content, reply_to=m))
        assert reply.has_error() and reply.error.reason.endswith(rule), (mtype, reply.error.reason)


def test_single_theta_s_values_are_found_in_every_number_encoding_and_fresh_values_are_not():
    """Property of the value scanner: every informative Θs value is found as a float64, a float32, an int holding its
    bit pattern, or two of them packed in one double; values drawn elsewhere are not (no false refusal)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from fcd_secure.audit.scanner import PrivateValues

    @settings(max_examples=40, deadline=None)
    @given(st.integers(0, 2**31), st.integers(1, 64))
    def run(seed, n):
        rng = np.random.default_rng(seed)
        theta = {"w": rng.standard_normal(n).astype(np.float32)}
        values = PrivateValues.of([theta])
        bits = theta["w"].view(np.uint32)
        for i in np.flatnonzero(bits & 0xFFF):  # informative values (a full mantissa)
            v = float(theta["w"][i])
            assert values.found_in([v]) and values.found_in([int(bits[i])])
            packed = struct.unpack("<d", np.array([theta["w"][i], theta["w"][i]], np.float32).tobytes())[0]
            assert values.found_in([packed])
        fresh = np.random.default_rng(seed + 1).standard_normal(256)
        assert not values.found_in([float(x) for x in fresh])  # float64 aggregates
        assert not values.found_in([0.0, 1.0, 0.5, 20, 100, True])  # counts, flags, simple fractions

    run()


def test_a_declined_part_is_written_into_the_replys_line_and_cannot_be_struck_out(tmp_path):
    """A handler that refuses part of a request and answers the rest (``note_declined``, P70) leaves its reply as
    built, and the gate writes the refusal into that reply's signed line; a reply with nothing declined has no such
    field, and a call outside any gate records nothing. An insider who strikes the field out to hide the probe
    breaks the line's hash chain."""
    import json

    from fcd_secure.audit import Refusal, note_declined

    note_declined(Refusal("eval_cohort", "config", "answered_cohort"))  # no gate: nowhere to write, nothing fails
    site = Site(tmp_path)
    inner = site.train_handler()

    def declining_handler(msg, ctx):
        note_declined(Refusal("eval_cohort", "config", "answered_cohort"))
        return inner(msg, ctx)

    def declining_then_failing(msg, ctx):
        note_declined(Refusal("eval_cohort", "config", "policy_difference"))
        raise RuntimeError("the handler fails after declining a part")

    plain = site.send(instruction("train", 1))
    probed = site.send(instruction("train", 2), declining_handler)
    after = site.send(instruction("train", 3))  # the next reply starts with nothing declined
    failed = site.send(instruction("train", 4), declining_then_failing)
    assert plain.has_content() and probed.has_content() and after.has_content() and failed.has_error()
    first, second, third, fourth = _uploads(site)
    assert "declined" not in first and "declined" not in third and second["status"] == "sent"
    assert second["declined"] == [{"rule": "eval_cohort", "record": "config", "key": "answered_cohort"}]
    assert fourth["status"] == "error" and fourth["declined"] == [
        {"rule": "eval_cohort", "record": "config", "key": "policy_difference"}]
    ledger = tmp_path / site.site_id / "audit" / "site_ledger.jsonl"
    listed = [(r.round, r.key) for r in verify_path(tmp_path / site.site_id).refusals if r.part]
    assert listed == [(2, "answered_cohort"), (4, "policy_difference")]
    lines = ledger.read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if "declined" in json.loads(x))
    line = json.loads(lines[i])
    del line["declined"]
    lines[i] = json.dumps(line, separators=(",", ":"), sort_keys=True)
    ledger.write_text("\n".join(lines) + "\n")
    res = verify_path(tmp_path / site.site_id)
    assert res.status == "tampered"

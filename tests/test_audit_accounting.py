"""The site and the server measure one message identically, after the transports Flower really uses."""

from __future__ import annotations

from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from test_audit_support import Site, instruction

from fcd_secure.audit.accounting import describe_message


def _reply(tmp_path):
    site = Site(tmp_path)
    return site.send(instruction("train", 2))


def test_receiver_recomputes_the_senders_figures_after_deployment_transport(tmp_path):
    reply = _reply(tmp_path)
    sent = describe_message(reply)
    # deployment: the SuperNode pushes every object's deflate() bytes; the SuperLink inflates them and, when the
    # ServerApp pulls the reply, stamps delivered_at and a message id
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(reply).items()}
    assert sum(len(c) for c in contents.values()) == sent.message_bytes
    received = inflate_object_from_contents(reply.object_id, contents)
    received.metadata.__dict__["_message_id"] = reply.object_id
    received.metadata.delivered_at = "2026-11-29T10:00:00.000000+00:00"
    got = describe_message(received)
    for k in ("message_id", "payload_sha256", "payload_bytes", "message_bytes", "reply_to", "round", "node_id", "run_id"):
        assert getattr(got, k) == getattr(sent, k), k
    assert [t.to_json() for t in got.tensors] == [t.to_json() for t in sent.tensors]
    # the engine's message id and the delivery stamp are not part of what is hashed and counted
    assert received.object_id == reply.object_id


def test_a_changed_payload_changes_hash_and_bytes(tmp_path):
    import numpy as np
    from flwr.app import Array

    reply = _reply(tmp_path)
    before = describe_message(reply)
    arr = reply.content["update"]["trunk.bias"].numpy().copy()
    arr[0] = np.nextafter(arr[0], np.float32(np.inf))  # one ulp
    reply.content["update"]["trunk.bias"] = Array(arr)
    after = describe_message(reply)
    assert after.payload_sha256 != before.payload_sha256
    assert after.message_id != before.message_id

"""What a Flower message weighs and what it carries, computed the same way on the site and at the server.

The audit reconciles two independent records of every uplink (the site's ledger and the server's), so both sides
must measure a message by one definition, and the federation's traffic accounting
(``fcd_secure.federation.messaging``) counts with the same functions. We use Flower's own content addressing (the pinned
Flower's ``flwr.supercore.inflatable``): a message is a Merkle DAG
``Message -> RecordDict -> records -> Array -> ArrayChunk``, every node serialised by ``deflate()`` and named by
``object_id = sha256(deflate())``.

* ``payload_bytes``: ``sum(len(o.deflate()))`` over the content tree (the ``RecordDict`` and everything below it).
  Deterministic and identical on both ends.
* ``payload_sha256``: the ``RecordDict``'s ``object_id``. Because each object's header lists its children's ids,
  this one hash commits to every byte of the content.
* ``message_bytes`` / ``message_id``: the whole tree including the message header (metadata). Neither the
  ``message_id`` the engine assigns nor the ``delivered_at`` stamp the SuperLink adds is serialised by
  ``deflate()``, so the server recomputes exactly what the site measured (``tests/test_audit_accounting.py``);
  in deployment Flower itself sets ``message_id = object_id``.

This is the object bytes Flower uploads (minus objects the SuperLink already holds); HTTP framing and heartbeats
are outside it and must be corroborated by network counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fcd_secure._flower.internals import serialized_bytes

#: Element sizes are taken from numpy so that verify can recompute tensor bytes from a manifest alone.
__all__ = [
    "MessageFacts",
    "TensorFact",
    "describe_message",
    "message_bytes",
    "payload_bytes",
    "tree_bytes",
]


def tree_bytes(obj) -> int:
    """Serialized bytes of every Flower object under ``obj`` (``sum(len(o.deflate()))``, deduplicated by id)."""
    if obj is None:
        return 0
    return serialized_bytes(obj)


def payload_bytes(msg: Message) -> int:
    """Bytes of the message content tree; 0 for an error reply."""
    return tree_bytes(msg.content) if msg.has_content() else 0


def message_bytes(msg: Message) -> int:
    """Bytes of the whole message tree (header with metadata, plus content)."""
    return tree_bytes(msg)


@dataclass(frozen=True)
class TensorFact:
    """One array in a message: where it sits, its manifest-facing description and its data bytes."""

    record: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def to_json(self) -> dict:
        return {"record": self.record, "name": self.name, "shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes}


@dataclass
class MessageFacts:
    """Everything the ledgers record about one message: sizes, hashes and the names (never the values) inside."""

    message_type: str
    round: int | None
    reply_to: str
    node_id: int
    run_id: int
    message_id: str
    payload_sha256: str | None
    payload_bytes: int
    message_bytes: int
    is_error: bool
    tensors: list[TensorFact] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    #: numbers carried by list-valued metrics (aggregate histograms), ``record/key -> count``; scalars are omitted
    metric_lists: dict[str, int] = field(default_factory=dict)
    #: ``record/key -> (type, length)`` for ConfigRecord values: protocol fields are recorded by size only.
    config_fields: list[dict] = field(default_factory=list)
    records: list[str] = field(default_factory=list)


def round_of(msg: Message) -> int | None:
    """The federated round a message belongs to: Flower's ``group_id`` (the federation sets ``str(round)``)."""
    gid = msg.metadata.group_id
    try:
        return int(gid)
    except (TypeError, ValueError):
        return None


def _array_dtype(arr: Array) -> str:
    return str(np.dtype(arr.dtype).name) if arr.dtype else "unknown"


def _config_value_fact(value) -> tuple[str, int]:
    if isinstance(value, bytes):
        return "bytes", len(value)
    if isinstance(value, str):
        return "str", len(value.encode("utf-8"))
    if isinstance(value, bool):
        return "bool", 1
    if isinstance(value, int):
        return "int", 8
    if isinstance(value, float):
        return "float", 8
    if isinstance(value, list):
        inner = {type(v).__name__ for v in value}
        kind = f"list[{'|'.join(sorted(inner)) or 'empty'}]"
        size = sum(_config_value_fact(v)[1] for v in value)
        return kind, size
    return type(value).__name__, 0


def describe_message(msg: Message) -> MessageFacts:
    """Measure and describe ``msg`` (the same figures on the sending site and the receiving server)."""
    measured = msg
    tensors: list[TensorFact] = []
    metrics: list[str] = []
    metric_lists: dict[str, int] = {}
    config_fields: list[dict] = []
    records: list[str] = []
    digest = None
    if measured.has_content():
        content: RecordDict = measured.content
        digest = content.object_id
        for rname, record in content.items():
            records.append(str(rname))
            if isinstance(record, ArrayRecord):
                for key, arr in record.items():
                    shape = tuple(int(s) for s in arr.shape)
                    dtype = _array_dtype(arr)
                    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
                    try:
                        item = np.dtype(dtype).itemsize
                    except TypeError:
                        item = 0
                    tensors.append(TensorFact(str(rname), str(key), shape, dtype, n * item))
            elif isinstance(record, MetricRecord):
                for k, v in record.items():
                    metrics.append(f"{rname}/{k}")
                    if isinstance(v, list):
                        metric_lists[f"{rname}/{k}"] = len(v)
            elif isinstance(record, ConfigRecord):
                for key, value in record.items():
                    kind, size = _config_value_fact(value)
                    config_fields.append({"record": str(rname), "key": str(key), "type": kind, "len": size})
    return MessageFacts(
        message_type=str(measured.metadata.message_type),
        round=round_of(measured),
        reply_to=str(measured.metadata.reply_to_message_id),
        node_id=int(measured.metadata.src_node_id),
        run_id=int(measured.metadata.run_id),
        message_id=measured.object_id,
        payload_sha256=digest,
        payload_bytes=payload_bytes(measured),
        message_bytes=message_bytes(measured),
        is_error=measured.has_error(),
        tensors=tensors,
        metrics=metrics,
        metric_lists=metric_lists,
        config_fields=config_fields,
        records=records,
    )

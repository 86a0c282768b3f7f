"""Server receipts: signed by the server for every reply it receives, returned to the site on the next downlink.

The server, whose incentive is the opposite of the site's, countersigns each upload (the receipt pattern of
transparency logs, cf. RFC 6962 §3 signed certificate timestamps): a site cannot hide an upload (the server holds
its own ledger line and the site a receipt) and the server cannot invent one (the site has no upload line).

Transport: receipts ride in ``content[RECEIPTS_RECORD]`` of a downlink message (:func:`receipts_to_record`); after
the last round the ServerApp sends one :data:`RECEIPTS_MESSAGE_TYPE` message to every node still owed receipts.

The site's chain head travels the other way: the egress gate adds the site's latest checkpoint that the server has
not countersigned yet to a reply (``content[HEAD_RECORD]``, :func:`head_to_record`); the server countersigns it in
its own ledger (:class:`~fcd_secure.audit.entries.CountersignLine`) and returns that line with the receipts
(``countersignatures``), and the site stores it. A head rewritten afterwards no longer matches either copy.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord

from fcd_secure.audit.entries import CheckpointLine, CountersignLine, Receipt
from fcd_secure.audit.signing import canonical, line_hash, private_key, public_key_bytes, sign_hash, signature_ok
from fcd_secure.fingerprints import fingerprint

#: ConfigRecord key under which the server returns receipts to a site in a downlink message.
RECEIPTS_RECORD = "fcd.audit.receipts"
#: Message type of the dedicated receipts downlink the ServerApp sends after the last round.
RECEIPTS_MESSAGE_TYPE = "query.audit_receipts"
#: ConfigRecord key under which the egress gate sends the site's chain head with a reply, for the server to countersign.
HEAD_RECORD = "fcd.audit.head"


def sign_receipt(server_key: bytes | Ed25519PrivateKey, **fields: Any) -> Receipt:
    """A receipt over ``fields`` signed by ``server_key`` (the key's fingerprint and public key are filled in).

    Args:
        server_key: the server's raw 32-byte Ed25519 private key (or the key).
        **fields: run_id, node_id, round, message_type, reply_to, message_id, payload_bytes, message_bytes,
            payload_sha256, server_seq, server_entry_hash, time.

    Returns:
        The signed :class:`~fcd_secure.audit.entries.Receipt`.
    """
    key = private_key(server_key)
    pub = public_key_bytes(key)
    body = Receipt(**fields, server_key=fingerprint(pub), server_public_key=pub.hex(), sig="").to_json()
    return Receipt(**{**body, "sig": sign_hash(key, line_hash(body))})


def receipt_signature_ok(receipt: Receipt, server_public_key: bytes) -> bool:
    """True if ``receipt`` is signed by ``server_public_key`` and names that key."""
    if receipt.server_key != fingerprint(server_public_key) or receipt.server_public_key != bytes(server_public_key).hex():
        return False
    return signature_ok(server_public_key, line_hash(receipt.to_json()), receipt.sig)


def receipts_to_record(
    receipts: list[Receipt], countersigns: list[CountersignLine] = (), server_public_key: bytes | None = None
) -> ConfigRecord:
    """Pack receipts (and the server's countersignatures of the site's heads) into a ConfigRecord for a downlink
    message (``content[RECEIPTS_RECORD]``)."""
    fields: dict = {"receipts": [canonical(r.to_json()) for r in receipts]}
    if countersigns:
        if server_public_key is None:
            raise ValueError("countersignatures travel with the server's public key")
        fields["countersignatures"] = [canonical(c.to_json()) for c in countersigns]
        fields["server_public_key"] = bytes(server_public_key)
    return ConfigRecord(fields)


def receipts_from_record(record: ConfigRecord | None) -> list[Receipt]:
    """The receipts in a downlink's ``content[RECEIPTS_RECORD]``.

    Raises:
        pydantic.ValidationError: a value is not a receipt (the gate then fails closed for that message).
    """
    raw = record.get("receipts", []) if record is not None else []
    if isinstance(raw, bytes):
        raw = [raw]
    return [Receipt.model_validate_json(bytes(r), strict=True) for r in raw]


def countersigns_from_record(record: ConfigRecord | None) -> tuple[list[CountersignLine], bytes | None]:
    """The server's countersignatures in a downlink's ``content[RECEIPTS_RECORD]``, and the key that signed them.

    Raises:
        pydantic.ValidationError: a value is not a countersign line (the gate then fails closed for that message).
        ValueError: countersignatures without a 32-byte server public key.
    """
    raw = record.get("countersignatures", []) if record is not None else []
    if isinstance(raw, bytes):
        raw = [raw]
    if not raw:
        return [], None
    pub = record.get("server_public_key")  # type: ignore[union-attr]
    if not isinstance(pub, bytes) or len(pub) != 32:
        raise ValueError("countersignatures without the server's 32-byte public key")
    return [CountersignLine.model_validate_json(bytes(r), strict=True) for r in raw], pub


def head_to_record(checkpoint: CheckpointLine, writer_id: str, public_key: bytes) -> ConfigRecord:
    """The site's chain head as the gate adds it to a reply (``content[HEAD_RECORD]``): its signed checkpoint line,
    the ledger's writer id and public key (hashes and sizes only: nothing of the site's data)."""
    return ConfigRecord(
        {"checkpoint": canonical(checkpoint.to_json()), "writer_id": writer_id, "public_key": bytes(public_key)}
    )


def head_from_record(record: ConfigRecord) -> tuple[CheckpointLine, str, bytes] | None:
    """``(checkpoint, writer_id, public_key)`` of a reply's ``content[HEAD_RECORD]`` if its checkpoint line is
    intact and signed by that key, else ``None`` (a head the server cannot check is not countersigned)."""
    try:
        raw, writer, pub = record["checkpoint"], record["writer_id"], record["public_key"]
        if not (isinstance(raw, bytes) and isinstance(writer, str) and isinstance(pub, bytes) and len(pub) == 32):
            return None
        checkpoint = CheckpointLine.model_validate_json(raw, strict=True)
    except (KeyError, ValueError):
        return None
    obj = checkpoint.to_json()
    if line_hash(obj) != checkpoint.hash or not signature_ok(pub, checkpoint.hash, checkpoint.sig):
        return None
    return checkpoint, writer, pub

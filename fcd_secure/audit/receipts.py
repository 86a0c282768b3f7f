"""Server receipts: signed by the server for every reply it receives, returned to the site on the next downlink.

The server, whose incentive is the opposite of the site's, countersigns each upload (the receipt pattern of
transparency logs, cf. RFC 6962 §3 signed certificate timestamps): a site cannot hide an upload (the server holds
its own ledger line and the site a receipt) and the server cannot invent one (the site has no upload line).

Transport: receipts ride in ``content[RECEIPTS_RECORD]`` of a downlink message (:func:`receipts_to_record`); after
the last round the ServerApp sends one :data:`RECEIPTS_MESSAGE_TYPE` message to every node still owed receipts.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord

from fcd_secure.audit.entries import Receipt
from fcd_secure.audit.signing import canonical, fingerprint, line_hash, private_key, public_key_bytes, sign_hash, signature_ok

#: ConfigRecord key under which the server returns receipts to a site in a downlink message.
RECEIPTS_RECORD = "fcd.audit.receipts"
#: Message type of the dedicated receipts downlink the ServerApp sends after the last round.
RECEIPTS_MESSAGE_TYPE = "query.audit_receipts"


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


def receipts_to_record(receipts: list[Receipt]) -> ConfigRecord:
    """Pack receipts into a ConfigRecord for a downlink message (``content[RECEIPTS_RECORD]``)."""
    return ConfigRecord({"receipts": [canonical(r.to_json()) for r in receipts]})


def receipts_from_record(record: ConfigRecord | None) -> list[Receipt]:
    """The receipts in a downlink's ``content[RECEIPTS_RECORD]``.

    Raises:
        pydantic.ValidationError: a value is not a receipt (the gate then fails closed for that message).
    """
    raw = record.get("receipts", []) if record is not None else []
    if isinstance(raw, bytes):
        raw = [raw]
    return [Receipt.model_validate_json(bytes(r), strict=True) for r in raw]

"""Signed, hash-chained, append-only ledgers of what left each site and what the server received.

Why a ledger written by the site can be trusted (ops-anchors §2.6): (a) every line carries ``prev_hash``, the hash of
the line before, so no line can be edited, removed, inserted or moved without breaking the chain; (b) every line is
signed with the writer's Ed25519 identity key, whose fingerprint the auditor pins out of band, so the chain cannot be
rebuilt by anyone else; (c) a signed checkpoint at the end of each round commits to the chain head and a Merkle
root, like CloudTrail's digests; (d) the server, the party with the opposite incentive, signs a receipt for every
upload it receives and keeps its own ledger, so neither side can hide or invent an upload: the two records must
reconcile byte for byte (``payload_bytes``, ``payload_sha256``, ``message_id``).

What the ledgers guard is the paper's decoupled synchronisation (§III-A: Θ = Θc ∪ {Θs_i}; §III-B: "clients ...
only transmit Θc to the server"): a ledger entry names the tensors of every upload, so "no Θs parameter and no
propensity ever left" becomes a fact an auditor checks offline (:mod:`fcd_secure.audit.verify`).

File format: one JSON object per line (``site_ledger.jsonl`` / ``server_ledger.jsonl``), canonical JSON (sorted
keys, no spaces, ASCII). ``hash = sha256(canonical(line without hash and sig))``; ``sig = Ed25519(hash bytes)``.
Line kinds: ``open`` (writer identity, public key), ``manifest`` (the Θc/Θs layout in force), ``upload`` (site:
one reply that left, or was refused, at the gate), ``receipt`` (site: the server's signed receipt, stored beside the
entry it acknowledges), ``received`` (server: one reply received), ``checkpoint`` (end of a round). Only public
keys and fingerprints are ever written; private keys never touch a ledger or a log.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fcd_secure.audit.accounting import MessageFacts

SCHEMA = 1
GENESIS = "0" * 64
SITE_LEDGER_FILE = "site_ledger.jsonl"
SERVER_LEDGER_FILE = "server_ledger.jsonl"
#: ConfigRecord key under which the server returns receipts to a site in a downlink message.
RECEIPTS_RECORD = "fcd.audit.receipts"
RECEIPT_VERSION = 1


class LedgerError(RuntimeError):
    """A ledger cannot be written (wrong key for an existing ledger, unreadable file, ...)."""


# -- keys ----------------------------------------------------------------------------------------------------------
def _private_key(raw: bytes | Ed25519PrivateKey) -> Ed25519PrivateKey:
    if isinstance(raw, Ed25519PrivateKey):
        return raw
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 32:
        raise LedgerError("an Ed25519 identity key must be 32 raw bytes")
    return Ed25519PrivateKey.from_private_bytes(bytes(raw))


def public_key_bytes(key: bytes | Ed25519PrivateKey) -> bytes:
    """Raw 32-byte public key of a raw private key."""
    return _private_key(key).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def fingerprint(public_key: bytes) -> str:
    """``SHA256:<hex>`` of the raw public key: what an auditor pins out of band (NVFLARE ``--fingerprint`` style)."""
    return "SHA256:" + hashlib.sha256(bytes(public_key)).hexdigest()


def normalise_fingerprint(text: str) -> str:
    """Accept ``SHA256:<hex>`` or bare hex (any case); raise ``ValueError`` otherwise."""
    t = text.strip()
    if t.upper().startswith("SHA256:"):
        t = t[7:]
    t = t.lower()
    if len(t) != 64 or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"not a key fingerprint: {text!r} (expected SHA256:<64 hex digits>)")
    return "SHA256:" + t


# -- canonical form, hashing, signing ------------------------------------------------------------------------------
def canonical(obj: Any) -> bytes:
    """The one byte form that is hashed and signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def line_hash(line: dict) -> str:
    body = {k: v for k, v in line.items() if k not in ("hash", "sig")}
    return hashlib.sha256(canonical(body)).hexdigest()


def sign_hash(key: Ed25519PrivateKey, digest_hex: str) -> str:
    return base64.b64encode(key.sign(bytes.fromhex(digest_hex))).decode("ascii")


def signature_ok(public_key: bytes, digest_hex: str, sig_b64: str) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public_key)).verify(base64.b64decode(sig_b64, validate=True), bytes.fromhex(digest_hex))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def merkle_root(hashes: list[str]) -> str:
    """RFC 6962 Merkle tree hash over entry hashes (leaf = sha256(0x00||h), node = sha256(0x01||l||r))."""
    if not hashes:
        return hashlib.sha256(b"").hexdigest()
    level = [hashlib.sha256(b"\x00" + bytes.fromhex(h)).digest() for h in hashes]
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            nxt.append(hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest())
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


# -- receipts ------------------------------------------------------------------------------------------------------
def receipt_body(
    *,
    run_id: int,
    node_id: int,
    round: int | None,
    message_type: str,
    reply_to: str,
    message_id: str,
    payload_bytes: int,
    message_bytes: int,
    payload_sha256: str | None,
    server_seq: int,
    server_entry_hash: str,
    server_key_fingerprint: str,
    server_public_key: str,
    time: str,
) -> dict:
    return {
        "v": RECEIPT_VERSION,
        "run_id": int(run_id),
        "node_id": int(node_id),
        "round": round,
        "message_type": message_type,
        "reply_to": reply_to,
        "message_id": message_id,
        "payload_bytes": int(payload_bytes),
        "message_bytes": int(message_bytes),
        "payload_sha256": payload_sha256,
        "server_seq": int(server_seq),
        "server_entry_hash": server_entry_hash,
        "server_key": server_key_fingerprint,
        "server_public_key": server_public_key,
        "time": time,
    }


def sign_receipt(server_key: bytes | Ed25519PrivateKey, **fields: Any) -> dict:
    """A receipt signed by the server: ``receipt_body(**fields)`` plus ``sig`` over its canonical sha256.

    ``fields``: run_id, node_id, round, message_type, reply_to, message_id, payload_bytes, message_bytes,
    payload_sha256, server_seq, server_entry_hash, time (the fingerprint is filled in from ``server_key``).
    """
    key = _private_key(server_key)
    fields = dict(fields)
    fields["server_key_fingerprint"] = fingerprint(public_key_bytes(key))
    fields["server_public_key"] = public_key_bytes(key).hex()
    body = receipt_body(**fields)
    digest = hashlib.sha256(canonical(body)).hexdigest()
    return {**body, "sig": sign_hash(key, digest)}


def receipt_signature_ok(receipt: dict, server_public_key: bytes) -> bool:
    """True if ``receipt`` is signed by ``server_public_key`` and names that key."""
    body = {k: v for k, v in receipt.items() if k != "sig"}
    if body.get("server_key") != fingerprint(server_public_key) or body.get("server_public_key") != bytes(server_public_key).hex():
        return False
    return signature_ok(server_public_key, hashlib.sha256(canonical(body)).hexdigest(), str(receipt.get("sig", "")))


def receipts_to_record(receipts: list[dict]):
    """Pack receipts into a ConfigRecord for a downlink message (``content[RECEIPTS_RECORD]``)."""
    from flwr.app import ConfigRecord

    return ConfigRecord({"receipts": [canonical(r) for r in receipts]})


def receipts_from_record(record) -> list[dict]:
    raw = record.get("receipts", []) if record is not None else []
    if isinstance(raw, bytes):
        raw = [raw]
    return [json.loads(bytes(r).decode("ascii")) for r in raw]


# -- the append-only file ------------------------------------------------------------------------------------------
def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of every non-empty line, 1-based."""
    with open(path, "r", encoding="utf-8", errors="surrogateescape") as fh:
        for i, text in enumerate(fh, start=1):
            if text.strip():
                yield i, text.rstrip("\n")


def _last_line(path: Path) -> dict | None:
    """The last JSON line of ``path`` without reading the whole file."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        block = 4096
        buf = b""
        pos = end
        while pos > 0:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            buf = fh.read(step) + buf
            stripped = buf.rstrip(b"\n")
            if b"\n" in stripped:
                return json.loads(stripped.rsplit(b"\n", 1)[1])
        return json.loads(buf.strip()) if buf.strip() else None


class _FileLock:
    """Exclusive ``flock`` on ``<ledger>.lock`` for one read-tail-then-append step."""

    def __init__(self, path: Path) -> None:
        self.lock_path = path.with_suffix(path.suffix + ".lock")

    def __enter__(self) -> "_FileLock":
        self.fh = open(self.lock_path, "a+")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


class _ChainedLog:
    """One writer's append-only, hash-chained, signed JSONL file.

    Every append re-reads the tail under an exclusive ``flock`` so that a ledger shared by processes (the ClientApp
    runs in a Ray actor or a fresh subprocess per message) never forks.
    """

    role = "log"

    def __init__(self, path: str | Path, signing_key: bytes | Ed25519PrivateKey, *, writer_id: str) -> None:
        self.path = Path(path)
        self._key = _private_key(signing_key)
        self.public_key = public_key_bytes(self._key)
        self.fingerprint = fingerprint(self.public_key)
        self.writer_id = str(writer_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            last = _last_line(self.path)
            if last is None:
                self._append_locked(
                    {
                        "kind": "open",
                        "schema": SCHEMA,
                        "role": self.role,
                        "writer_id": self.writer_id,
                        "public_key": self.public_key.hex(),
                        "key_fingerprint": self.fingerprint,
                    },
                    None,
                )
            else:
                first = next(iter(self._iter_raw()), None)
                if first is None or first.get("public_key") != self.public_key.hex():
                    raise LedgerError(f"{self.path}: ledger was opened with a different identity key; refusing to append")

    # -- low level
    def _locked(self) -> "_FileLock":
        return _FileLock(self.path)

    def _iter_raw(self) -> Iterator[dict]:
        if not self.path.exists():
            return
        for _, text in read_lines(self.path):
            yield json.loads(text)

    def _append_locked(self, body: dict, last: dict | None) -> dict:
        line = dict(body)
        line["seq"] = 0 if last is None else int(last["seq"]) + 1
        line["prev_hash"] = GENESIS if last is None else last["hash"]
        line.setdefault("time", utc_now())
        line["hash"] = line_hash(line)
        line["sig"] = sign_hash(self._key, line["hash"])
        data = canonical(line) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return line

    def append(self, body: dict) -> dict:
        """Append one line (``seq``, ``prev_hash``, ``time``, ``hash``, ``sig`` are filled in) and return it."""
        with self._locked():
            return self._append_locked(body, _last_line(self.path))

    def lines(self) -> list[dict]:
        return list(self._iter_raw())

    # -- shared line kinds
    def record_manifest(self, manifest_json: dict) -> dict | None:
        """Write a ``manifest`` line unless the same layout is already the one in force."""
        with self._locked():
            current = None
            for line in self._iter_raw():
                if line.get("kind") == "manifest":
                    current = line.get("layout_hash")
            if current == manifest_json.get("layout_hash"):
                return None
            return self._append_locked({"kind": "manifest", **manifest_json}, _last_line(self.path))

    def checkpoint(self, round: int) -> dict | None:
        """Signed checkpoint closing ``round``: chain size, head, Merkle root, uploads and bytes of the round.

        Idempotent: a second call for a round already closed writes nothing and returns ``None``.
        """
        with self._locked():
            lines = list(self._iter_raw())
            if any(l.get("kind") == "checkpoint" and l.get("round") == round for l in lines):
                return None
            in_round = [l for l in lines if l.get("kind") in ("upload", "received") and l.get("round") == round]
            body = {
                "kind": "checkpoint",
                "round": round,
                "size": len(lines),
                "head": lines[-1]["hash"] if lines else GENESIS,
                "merkle_root": merkle_root([l["hash"] for l in lines]),
                "messages": len(in_round),
                "payload_bytes": int(sum(int(l.get("payload_bytes", 0)) for l in in_round)),
                "message_bytes": int(sum(int(l.get("message_bytes", 0)) for l in in_round)),
            }
            return self._append_locked(body, lines[-1] if lines else None)


def facts_json(facts: MessageFacts) -> dict:
    return {
        "run_id": facts.run_id,
        "node_id": facts.node_id,
        "round": facts.round,
        "action": facts.message_type,
        "reply_to": facts.reply_to,
        "message_id": facts.message_id,
        "payload_sha256": facts.payload_sha256,
        "payload_bytes": facts.payload_bytes,
        "message_bytes": facts.message_bytes,
        "records": facts.records,
        "tensors": [t.to_json() for t in facts.tensors],
        "metrics": facts.metrics,
        "metric_lists": facts.metric_lists,
        "config_fields": facts.config_fields,
        "is_error": facts.is_error,
    }


class SiteLedger(_ChainedLog):
    """The site's uplink ledger (``<state_dir>/audit/site_ledger.jsonl``), signed with the site identity key."""

    role = "site"

    @classmethod
    def open(cls, state_dir: str | Path, identity_key: bytes, site_id: str) -> "SiteLedger":
        return cls(Path(state_dir) / "audit" / SITE_LEDGER_FILE, identity_key, writer_id=site_id)

    def record_upload(
        self,
        facts: MessageFacts,
        *,
        status: str,
        layout_hash: str | None,
        privacy_ledger_hash: str | None,
        refusal: dict | None = None,
        withheld: MessageFacts | None = None,
        handler_error_code: int | None = None,
    ) -> dict:
        """One reply at the gate. ``status``: ``sent`` (left as built), ``refused`` (content withheld, an error
        reply left instead; ``withheld`` describes the refused content by names and sizes), ``error`` (the handler
        failed; a generic error reply left; ``handler_error_code`` is the code the handler chose, kept here only,
        since the reply that left carries the gate's fixed code)."""
        body = {"kind": "upload", "site_id": self.writer_id, "status": status, **facts_json(facts)}
        body["layout_hash"] = layout_hash
        body["privacy_ledger_hash"] = privacy_ledger_hash
        if refusal is not None:
            body["refusal"] = refusal
        if withheld is not None:
            w = facts_json(withheld)
            body["withheld"] = {k: w[k] for k in ("payload_sha256", "payload_bytes", "records", "tensors", "metrics", "metric_lists", "config_fields")}
        if handler_error_code is not None:
            body["handler_error_code"] = int(handler_error_code)
        return self.append(body)

    def store_receipt(self, receipt: dict, *, server_public_key: bytes | None) -> dict:
        """Store a server receipt beside the upload entry it acknowledges (matched by ``message_id``).

        The receipt is kept verbatim (the auditor re-checks the server's signature); ``for_seq`` names the entry, or
        is ``None`` when the site has no such upload (itself evidence of an inconsistency, kept, never dropped).
        """
        with self._locked():
            lines = list(self._iter_raw())
            for_seq = None
            for l in lines:
                if l.get("kind") == "upload" and l.get("message_id") == receipt.get("message_id"):
                    for_seq = l["seq"]
            if any(l.get("kind") == "receipt" and l.get("receipt", {}).get("sig") == receipt.get("sig") for l in lines):
                return {}
            sig_ok = None if server_public_key is None else receipt_signature_ok(receipt, server_public_key)
            body = {"kind": "receipt", "for_seq": for_seq, "receipt": receipt, "signature_checked_on_arrival": sig_ok}
            return self._append_locked(body, lines[-1] if lines else None)

    def rounds_open(self) -> list[int]:
        """Rounds with uploads but no checkpoint yet."""
        seen, closed = set(), set()
        for l in self._iter_raw():
            if l.get("kind") == "upload" and l.get("round") is not None:
                seen.add(int(l["round"]))
            if l.get("kind") == "checkpoint":
                closed.add(int(l["round"]))
        return sorted(seen - closed)


class ServerLedger(_ChainedLog):
    """The server's ledger of every reply it received, signed with the server identity key.

    ``accept(reply, site_id)`` records the reply and returns the signed receipt the ServerApp hands back to the site
    in its next downlink (``content[RECEIPTS_RECORD] = receipts_to_record([...])``).
    """

    role = "server"

    @classmethod
    def open(cls, run_dir: str | Path, identity_key: bytes, server_id: str = "server") -> "ServerLedger":
        return cls(Path(run_dir) / "audit" / SERVER_LEDGER_FILE, identity_key, writer_id=server_id)

    def accept(self, reply, site_id: str | None = None, *, facts: MessageFacts | None = None) -> dict:
        from fcd_secure.audit.accounting import describe_message

        f = facts if facts is not None else describe_message(reply)
        body = {"kind": "received", "site_id": site_id, **facts_json(f)}
        line = self.append(body)
        return sign_receipt(
            self._key,
            run_id=f.run_id,
            node_id=f.node_id,
            round=f.round,
            message_type=f.message_type,
            reply_to=f.reply_to,
            message_id=f.message_id,
            payload_bytes=f.payload_bytes,
            message_bytes=f.message_bytes,
            payload_sha256=f.payload_sha256,
            server_seq=line["seq"],
            server_entry_hash=line["hash"],
            time=line["time"],
        )

"""The server's half of the audit: record every reply received, sign a receipt for it, hand receipts back.

ops-anchors §2.6 item 4: the server, whose incentive is the opposite of the site's, countersigns each upload, so a
site cannot hide an upload (the server holds a receipt and its own ledger entry) and the server cannot invent one
(the site has no entry). The ServerApp wires :class:`ServerAudit` into its message loop:

* ``content = audit.attach(node_id, content)`` on every downlink: pending receipts for that node ride along in
  ``content["fcd.audit.receipts"]``; the site's gate strips and stores them before any handler sees the message;
* ``audit.on_reply(reply, site_id)`` on every reply pulled (content, refusals and errors alike);
* after the last round, one ``query.audit_receipts`` message per node with pending receipts
  (:meth:`ServerAudit.final_contents`); the gate answers it itself and signs the site's last checkpoint; then
  :meth:`ServerAudit.close` signs the server's last checkpoint (earlier rounds are closed automatically when a
  reply of a later round arrives).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Message, RecordDict

from fcd_secure.audit.accounting import round_of
from fcd_secure.audit.gate import RECEIPTS_MESSAGE_TYPE
from fcd_secure.audit.ledger import RECEIPTS_RECORD, SERVER_LEDGER_FILE, ServerLedger, receipts_to_record

__all__ = ["RECEIPTS_MESSAGE_TYPE", "ServerAudit", "load_or_create_identity_key"]


def load_or_create_identity_key(path: str | Path) -> bytes:
    """Raw 32-byte Ed25519 key at ``path`` (mode 0600), created from the OS CSPRNG on first use."""
    p = Path(path)
    if p.exists():
        raw = p.read_bytes()
        if len(raw) != 32:
            raise ValueError(f"{p}: an identity key must be 32 raw bytes, found {len(raw)}")
        return raw
    p.parent.mkdir(parents=True, exist_ok=True)
    raw = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    return raw


class ServerAudit:
    """Server ledger plus the receipts still owed to each node."""

    def __init__(self, ledger_dir: str | Path, identity_key: bytes, server_id: str = "server") -> None:
        """``ledger_dir``: the folder that holds ``server_ledger.jsonl`` (e.g. ``<state_dir>/_server/audit``)."""
        self.ledger = ServerLedger(Path(ledger_dir) / SERVER_LEDGER_FILE, identity_key, writer_id=server_id)
        self._pending: dict[int, list[dict]] = {}
        self._open_rounds: set[int] = set()

    @property
    def fingerprint(self) -> str:
        return self.ledger.fingerprint

    def on_reply(self, reply: Message, site_id: str | None = None) -> dict:
        """Record one received reply in the server ledger; queue and return its signed receipt."""
        rnd = round_of(reply)
        if rnd is not None:
            # a reply of a later round means every earlier round is over: sign its checkpoint (as the site gate does)
            for r in sorted(x for x in self._open_rounds if x < rnd):
                self.checkpoint(r)
            self._open_rounds.add(rnd)
        receipt = self.ledger.accept(reply, site_id)
        self._pending.setdefault(int(reply.metadata.src_node_id), []).append(receipt)
        return receipt

    def attach(self, node_id: int, content: RecordDict) -> RecordDict:
        """``content`` plus the receipts owed to ``node_id`` (a new RecordDict; records are shared, not copied)."""
        owed = self._pending.pop(int(node_id), None)
        if not owed:
            return content
        out = RecordDict(dict(content.items()))
        out[RECEIPTS_RECORD] = receipts_to_record(owed)
        return out

    def owed_nodes(self) -> list[int]:
        return sorted(n for n, r in self._pending.items() if r)

    def final_contents(self) -> dict[int, RecordDict]:
        """Per node, the content of the closing ``query.audit_receipts`` message (receipts owed so far)."""
        return {n: self.attach(n, RecordDict({"config": ConfigRecord({"final": True})})) for n in self.owed_nodes()}

    def record_manifest(self, manifest) -> dict | None:
        """Record the Θc/Θs layout the server runs with, so an auditor can check each site declared the same one
        (a site cannot hide a Θs name by recording a manifest of its own making)."""
        from fcd_secure.audit.gate import ManifestView  # noqa: PLC0415

        return self.ledger.record_manifest(ManifestView.of(manifest).to_json())

    def checkpoint(self, round: int) -> dict | None:
        """Sign the checkpoint closing ``round`` (idempotent)."""
        self._open_rounds.discard(round)
        return self.ledger.checkpoint(round)

    def close(self) -> None:
        """Sign the checkpoints of every round still open. Call once the closing receipts message is answered."""
        for r in sorted(self._open_rounds):
            self.checkpoint(r)

"""The server's half of the audit: record every reply received, sign a receipt for it, hand receipts back.

The server, whose incentive is the opposite of the site's, countersigns each upload
(:mod:`~fcd_secure.audit.receipts`), so a site cannot hide an upload (the server holds a receipt and its own ledger
line) and the server cannot invent one (the site has no line). The ServerApp wires :class:`ServerAudit` into its
message loop:

* ``content = audit.attach(node_id, content)`` on every downlink: pending receipts for that node ride along in
  ``content["fcd.audit.receipts"]``; the site's gate strips and stores them before any handler sees the message;
* ``audit.on_reply(reply, site_id)`` on every reply pulled (content, refusals and errors alike); a site's chain head
  riding on the reply (``content["fcd.audit.head"]``, added by the site's gate) is countersigned in the server
  ledger (:meth:`ServerAudit.countersign_head`) and the countersignature returned with the receipts;
* after the last round, one ``query.audit_receipts`` message per node with pending receipts
  (:meth:`ServerAudit.final_contents`); the gate answers it itself and signs the site's last checkpoint; then
  :meth:`ServerAudit.close` signs the server's last checkpoint (earlier rounds are closed automatically when a
  reply of a later round arrives).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict

import logging

from fcd_secure.audit.accounting import round_of
from fcd_secure.audit.entries import CheckpointLine, CountersignLine, ExclusionLine, ManifestLine, Receipt
from fcd_secure.audit.ledger import SERVER_LEDGER_FILE, ServerLedger
from fcd_secure.audit.receipts import (
    HEAD_RECORD,
    RECEIPTS_MESSAGE_TYPE,
    RECEIPTS_RECORD,
    head_from_record,
    receipts_to_record,
)
from fcd_secure.audit.signing import load_or_create_identity_key
from fcd_secure.manifest import Manifest

__all__ = ["RECEIPTS_MESSAGE_TYPE", "ServerAudit", "load_or_create_identity_key"]

log = logging.getLogger("fcd_secure.audit.server")


class ServerAudit:
    """Server ledger plus the receipts still owed to each node."""

    def __init__(self, ledger_dir: str | Path, identity_key: bytes, server_id: str = "server") -> None:
        """Open the server ledger.

        Args:
            ledger_dir: the folder that holds ``server_ledger.jsonl`` (e.g. ``<state_dir>/_server/audit``).
            identity_key: the server's raw 32-byte Ed25519 key (:func:`load_or_create_identity_key`).
            server_id: the writer id recorded in the ledger's ``open`` line.
        """
        self.ledger = ServerLedger(Path(ledger_dir) / SERVER_LEDGER_FILE, identity_key, writer_id=server_id)
        self._pending: dict[int, list[Receipt]] = {}
        self._countersigned: dict[int, list[CountersignLine]] = {}
        self._open_rounds: set[int] = set()

    @property
    def fingerprint(self) -> str:
        return self.ledger.fingerprint

    def on_reply(self, reply: Message, site_id: str | None = None) -> Receipt:
        """Record one received reply in the server ledger; queue and return its signed receipt."""
        rnd = round_of(reply)
        if rnd is not None:
            # a reply of a later round means every earlier round is over: sign its checkpoint (as the site gate does)
            for r in sorted(x for x in self._open_rounds if x < rnd):
                self.checkpoint(r)
            self._open_rounds.add(rnd)
        receipt = self.ledger.accept(reply, site_id)
        self._pending.setdefault(int(reply.metadata.src_node_id), []).append(receipt)
        if reply.has_content() and HEAD_RECORD in reply.content:
            self.countersign_head(reply, site_id)
        return receipt

    def countersign_head(self, reply: Message, site_id: str | None = None) -> CountersignLine | None:
        """Countersign the site chain head a reply carries and queue the countersignature for its node.

        The head is the site's signed checkpoint line, which the site's gate sends until a countersignature comes
        back; it is countersigned once. A head whose line does not check against the key sent with it is not.

        Returns:
            The server ledger's new countersign line, or ``None`` (no head, an invalid one, or already countersigned).
        """
        record = reply.content[HEAD_RECORD]
        head = head_from_record(record) if isinstance(record, ConfigRecord) else None
        if head is None:
            log.warning("a reply from node %s carried a chain head that does not check; not countersigned", reply.metadata.src_node_id)
            return None
        checkpoint, writer_id, public_key = head
        line = self.ledger.countersign(
            checkpoint,
            writer_id=writer_id,
            site_public_key=public_key,
            site_id=site_id,
            node_id=int(reply.metadata.src_node_id),
            run_id=int(reply.metadata.run_id),
        )
        if line is not None:
            self._countersigned.setdefault(int(reply.metadata.src_node_id), []).append(line)
        return line

    def deferred_sync(self) -> AbstractContextManager[None]:
        """The server ledger's :meth:`~fcd_secure.audit.ledger.ServerLedger.deferred_sync`: the lines recorded inside
        the block (a batch of replies pulled at once: their received lines, checkpoints and countersignatures) reach
        the disk by one ``fsync`` when it ends. Their receipts leave only with a later downlink (:meth:`attach`), so
        none leaves before its line is durable."""
        return self.ledger.deferred_sync()

    def attach(self, node_id: int, content: RecordDict) -> RecordDict:
        """``content`` plus the receipts and countersignatures owed to ``node_id`` (a new RecordDict; records are
        shared, not copied)."""
        owed = self._pending.pop(int(node_id), [])
        signed = self._countersigned.pop(int(node_id), [])
        if not owed and not signed:
            return content
        out = RecordDict(dict(content.items()))
        out[RECEIPTS_RECORD] = receipts_to_record(owed, signed, self.ledger.public_key)
        return out

    def owed_nodes(self) -> list[int]:
        """Nodes the server still owes receipts or countersignatures (the addressees of the closing message)."""
        return sorted({n for n, r in self._pending.items() if r} | {n for n, c in self._countersigned.items() if c})

    def final_contents(self) -> dict[int, RecordDict]:
        """Per node, the content of the closing ``query.audit_receipts`` message (receipts owed so far)."""
        return {n: self.attach(n, RecordDict({"config": ConfigRecord({"final": True})})) for n in self.owed_nodes()}

    def record_manifest(self, manifest: Manifest) -> ManifestLine | None:
        """Record the Θc/Θs layout the server runs with, so an auditor can check each site declared the same one
        (a site cannot hide a Θs name by recording a manifest of its own making)."""
        return self.ledger.record_manifest(manifest)

    def record_exclusion(self, round: int, site_id: str, reason: str) -> ExclusionLine:
        """Record, signed, that ``site_id`` is left out of every round from ``round`` on, and why (P33)."""
        return self.ledger.append(ExclusionLine, {"round": int(round), "site_id": str(site_id), "reason": str(reason)})

    def checkpoint(self, round: int) -> CheckpointLine | None:
        """Sign the checkpoint closing ``round`` (idempotent)."""
        self._open_rounds.discard(round)
        return self.ledger.checkpoint(round)

    def close(self) -> None:
        """Sign the checkpoints of every round still open. Call once the closing receipts message is answered."""
        for r in sorted(self._open_rounds):
            self.checkpoint(r)

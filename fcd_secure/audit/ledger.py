"""Signed, hash-chained, append-only ledgers of what left each site and what the server received.

Why a ledger written by the site can be trusted: (a) every line carries ``prev_hash``, the hash of the line before,
so no line can be edited, removed, inserted or moved without breaking the chain (Schneier & Kelsey 1999, "Secure
audit logs to support computer forensics"); (b) every line is signed with the writer's Ed25519 identity key, whose
fingerprint the auditor pins out of band, so nobody else can rebuild the chain; (c) a signed checkpoint at the end
of each round commits to the chain head and an RFC 6962 Merkle root, like AWS CloudTrail's signed digest files;
(d) the server, the party with the opposite incentive, signs a receipt for every upload it receives
(:mod:`~fcd_secure.audit.receipts`) and keeps its own ledger, so neither side can hide or invent an upload: the two
records must reconcile byte for byte (``payload_bytes``, ``payload_sha256``, ``message_id``).

What the ledgers guard is the paper's decoupled synchronisation (§III-A: Θ = Θc ∪ {Θs_i}; §III-B: "clients ...
only transmit Θc to the server"): an upload line names the tensors of every reply, so "no Θs parameter and no
propensity ever left" becomes a fact an auditor checks offline (:mod:`fcd_secure.audit.verify`).

File format: one JSON line per entry (``site_ledger.jsonl`` / ``server_ledger.jsonl``), the typed lines of
:mod:`~fcd_secure.audit.entries` in the canonical form of :func:`~fcd_secure.audit.signing.canonical`. Only public
keys and fingerprints are ever written; private keys never touch a ledger or a log.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Message
from pydantic import ValidationError

from fcd_secure._io import file_lock
from fcd_secure.audit.accounting import MessageFacts, describe_message
from fcd_secure.audit.entries import (
    CheckpointLine,
    CountersignatureLine,
    CountersignLine,
    LedgerLine,
    ManifestLine,
    MessageLine,
    OpenLine,
    PrivacyAnchor,
    Receipt,
    ReceiptLine,
    ReceivedLine,
    RefusalRecord,
    UploadLine,
    Withheld,
    parse_line,
)
from fcd_secure.audit.receipts import receipt_signature_ok, sign_receipt
from fcd_secure.audit.signing import (
    GENESIS,
    AuditLedgerError,
    canonical,
    line_hash,
    merkle_root,
    private_key,
    public_key_bytes,
    sign_hash,
    signature_ok,
    utc_now,
)
from fcd_secure.fingerprints import fingerprint
from fcd_secure.manifest import Manifest

__all__ = [
    "GENESIS",
    "SERVER_LEDGER_FILE",
    "SITE_LEDGER_FILE",
    "AuditLedgerError",
    "ServerLedger",
    "SiteLedger",
    "fingerprint",
    "public_key_bytes",
    "read_lines",
]

SITE_LEDGER_FILE = "site_ledger.jsonl"
SERVER_LEDGER_FILE = "server_ledger.jsonl"

L = TypeVar("L", bound=LedgerLine)


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of every non-empty line of a ledger file, 1-based."""
    with open(path, "r", encoding="utf-8", errors="surrogateescape") as fh:
        for i, text in enumerate(fh, start=1):
            if text.strip():
                yield i, text.rstrip("\n")


#: each ledger file's bytes (up to its last complete line) and their typed lines as this process last parsed them,
#: with the number of text lines they span: ``_ChainedLog.entries`` parses only what follows a byte-identical prefix
#: (an append adds bytes; any other change makes the prefix differ and the whole file is parsed again). A gate parses
#: the site ledger several times per message (the manifest in force, the pending head, the receipts, the open rounds),
#: 10 ms a message on a 100-line ledger and growing with the ledger (cProfile of a 4-site in-process run)
_PARSED: dict[str, tuple[bytes, tuple[LedgerLine, ...], int]] = {}
#: ledgers whose parse a process keeps at once (the sites of a simulation, the server; the oldest dropped first)
_PARSED_FILES = 64


def _last_text(path: Path) -> bytes | None:
    """The last non-empty line of ``path``, read from the end (ledgers grow; appends must not re-read them)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as fh:
        pos = fh.seek(0, os.SEEK_END)
        buf = b""
        while pos > 0:
            step = min(4096, pos)
            pos -= step
            fh.seek(pos)
            buf = fh.read(step) + buf
            stripped = buf.rstrip(b"\n")
            if b"\n" in stripped:
                return stripped.rsplit(b"\n", 1)[1]
        return buf.strip() or None


class _ChainedLog:
    """One writer's append-only, hash-chained, signed JSONL file.

    Every append re-reads the tail under an exclusive inter-process lock (:func:`fcd_secure._io.file_lock`), so that
    a ledger shared by processes (Flower runs the ClientApp in a Ray actor or a fresh process per message) never
    forks.
    """

    role = "log"
    #: open :meth:`deferred_sync` blocks, and whether a line was written in one since the file's last fsync
    _deferring = 0
    _unsynced = False

    def __init__(self, path: str | Path, signing_key: bytes | Ed25519PrivateKey, *, writer_id: str) -> None:
        """Open (or start) the ledger at ``path`` for the holder of ``signing_key``.

        Raises:
            AuditLedgerError: the ledger exists and was opened with another key, or cannot be read.
        """
        self.path = Path(path)
        self._key = private_key(signing_key)
        self.public_key = public_key_bytes(self._key)
        self.fingerprint = fingerprint(self.public_key)
        self.writer_id = str(writer_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path):
            first = next(iter(self._entries()), None)
            if first is None:
                opened = {"role": self.role, "writer_id": self.writer_id, "public_key": self.public_key.hex()}
                self._append_locked(OpenLine, {**opened, "key_fingerprint": self.fingerprint}, None)
            elif not isinstance(first, OpenLine) or first.public_key != self.public_key.hex():
                raise AuditLedgerError(f"{self.path}: ledger was opened with a different identity key; refusing to append")

    # -- reading
    def lines(self) -> list[dict[str, Any]]:
        """Every line as the JSON object on disk."""
        if not self.path.exists():
            return []
        return [json.loads(text) for _, text in read_lines(self.path)]

    def entries(self) -> list[LedgerLine]:
        """Every line, typed. Every byte of the file is read each time; the lines of a prefix this process parsed
        before, byte for byte, are not parsed again (:data:`_PARSED`).

        Raises:
            AuditLedgerError: a line is not a ledger line (the file was edited or is corrupt).
        """
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        key = str(self.path)
        prefix, lines, spanned = _PARSED.get(key, (b"", (), 0))
        if not data.startswith(prefix):
            prefix, lines, spanned = b"", (), 0
        new: list[LedgerLine] = []
        # decoded and split as ``read_lines`` does (text mode: UTF-8, surrogateescape, universal newlines)
        tail = io.TextIOWrapper(io.BytesIO(data[len(prefix):]), encoding="utf-8", errors="surrogateescape")
        for spanned, text in enumerate(tail, start=spanned + 1):  # noqa: B020 - the count goes on from the prefix
            if text.strip():
                new.append(self._parse(text.rstrip("\n"), spanned))
        lines += tuple(new)
        if data.endswith(b"\n"):  # a line being written is parsed again next time
            _PARSED.pop(key, None)
            if len(_PARSED) >= _PARSED_FILES:
                _PARSED.pop(next(iter(_PARSED)))
            _PARSED[key] = (data, lines, spanned)
        return list(lines)

    def _entries(self) -> Iterator[LedgerLine]:
        if not self.path.exists():
            return
        for ln, text in read_lines(self.path):
            yield self._parse(text, ln)

    def _parse(self, text: str | bytes, ln: int | None) -> LedgerLine:
        try:
            return parse_line(text)
        except ValidationError:
            where = f"line {ln}" if ln is not None else "the last line"
            raise AuditLedgerError(f"{self.path}: {where} is not a ledger line (edited or corrupt); refusing to append") from None

    def _last(self) -> LedgerLine | None:
        text = _last_text(self.path)
        return None if text is None else self._parse(text, None)

    # -- writing
    def _append_locked(self, cls: type[L], fields: dict[str, Any], last: LedgerLine | None) -> L:
        """Seal ``fields`` as the next line of kind ``cls`` (seq, prev_hash, time, hash, sig) and append it."""
        draft = cls(
            **fields,
            seq=0 if last is None else last.seq + 1,
            prev_hash=GENESIS if last is None else last.hash,
            time=utc_now(),
            hash="",
            sig="",
        )
        obj = draft.to_json()
        digest = line_hash(obj)
        obj["hash"], obj["sig"] = digest, sign_hash(self._key, digest)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, canonical(obj) + b"\n")
            if self._deferring:
                self._unsynced = True
            else:
                os.fsync(fd)
        finally:
            os.close(fd)
        return draft.model_copy(update={"hash": obj["hash"], "sig": obj["sig"]})

    @contextmanager
    def deferred_sync(self) -> Iterator[None]:
        """Lines appended inside the block are written at once (every reader sees them) and made durable together
        when it ends: one ``fsync`` of the file flushes every byte written to it before (fsync(2), POSIX.1-2008), so
        a gate that records several lines for one message (receipts, a checkpoint, the upload line) pays one disk
        flush instead of one each. The caller lets nothing that depends on a line leave before the block ends
        (``audit.gate``: the reply leaves after it); a failing flush raises from the block's end.

        Raises:
            OSError: the closing fsync failed.
        """
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            if not self._deferring and self._unsynced:
                self.sync()

    def sync(self) -> None:
        """Flush the ledger file to disk (``fsync``)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced = False

    def append(self, cls: type[L], fields: dict[str, Any]) -> L:
        """Append one line of kind ``cls`` with ``fields`` (the chain fields are filled in) and return it."""
        with file_lock(self.path):
            return self._append_locked(cls, fields, self._last())

    # -- line kinds both roles write
    def record_manifest(self, manifest: Manifest) -> ManifestLine | None:
        """Write a ``manifest`` line unless ``manifest``'s layout is already the one in force."""
        with file_lock(self.path):
            entries = self.entries()
            current = next((e.layout_hash for e in reversed(entries) if isinstance(e, ManifestLine)), None)
            if current == manifest.layout_hash:
                return None
            return self._append_locked(ManifestLine, ManifestLine.fields_of(manifest), entries[-1] if entries else None)

    def checkpoint(self, round: int) -> CheckpointLine | None:
        """Signed checkpoint closing ``round``: chain size, head, Merkle root, messages and bytes of the round.

        Idempotent: a second call for a round already closed writes nothing and returns ``None``.
        """
        with file_lock(self.path):
            entries = self.entries()
            if any(isinstance(e, CheckpointLine) and e.round == round for e in entries):
                return None
            fields = checkpoint_fields([e.hash for e in entries], entries, round)
            return self._append_locked(CheckpointLine, fields, entries[-1] if entries else None)


def checkpoint_fields(hashes: list[str], entries: list[LedgerLine], round: int) -> dict[str, Any]:
    """What a checkpoint of ``round`` must say: the one rule the writer and verify share.

    Args:
        hashes: the hash of every line before the checkpoint, in order.
        entries: the lines before it (their messages of ``round`` are counted).
        round: the round the checkpoint closes.
    """
    in_round = [e for e in entries if isinstance(e, MessageLine) and e.round == round]
    return {
        "round": round,
        "size": len(hashes),
        "head": hashes[-1] if hashes else GENESIS,
        "merkle_root": merkle_root(hashes),
        "messages": len(in_round),
        "payload_bytes": sum(e.payload_bytes for e in in_round),
        "message_bytes": sum(e.message_bytes for e in in_round),
    }


class SiteLedger(_ChainedLog):
    """The site's uplink ledger (``<state_dir>/audit/site_ledger.jsonl``), signed with the site identity key."""

    role = "site"

    @classmethod
    def open(cls, state_dir: str | Path, identity_key: bytes, site_id: str) -> "SiteLedger":
        """The ledger of ``site_id`` under ``<state_dir>/audit/``."""
        return cls(Path(state_dir) / "audit" / SITE_LEDGER_FILE, identity_key, writer_id=site_id)

    def record_upload(
        self,
        facts: MessageFacts,
        *,
        status: str,
        layout_hash: str | None,
        privacy_ledger_hash: str | None,
        refusal: RefusalRecord | None = None,
        withheld: MessageFacts | None = None,
        handler_error_code: int | None = None,
        declined: Sequence[RefusalRecord] = (),
        privacy_anchors: tuple[PrivacyAnchor, ...] | None = None,
    ) -> UploadLine:
        """Record one reply at the gate.

        Args:
            facts: :func:`~fcd_secure.audit.accounting.describe_message` of the reply that left.
            status: ``sent`` (left as built), ``refused`` (content withheld, an error reply left instead) or
                ``error`` (the handler failed; a generic error reply left).
            layout_hash: the manifest in force.
            privacy_ledger_hash: :func:`fcd_secure.privacy.ledger.privacy_ledger_hash` of the site, or ``None``.
            refusal: the rule that refused the reply.
            withheld: the refused content, recorded by names and sizes only.
            handler_error_code: the code the handler chose for its error reply, kept here only (the reply that
                left carries the gate's fixed code).
            declined: the parts of the request the handler refused while it answered the rest
                (:func:`~fcd_secure.audit.rules.note_declined`), recorded only where there are some.
            privacy_anchors: the heads of the site's privacy ledgers
                (:func:`fcd_secure.privacy.anchor.read_anchors`), or ``None``.

        Returns:
            The line written.
        """
        fields = {"site_id": self.writer_id, "status": status, **MessageLine.fields_of(facts)}
        fields |= {"layout_hash": layout_hash, "privacy_ledger_hash": privacy_ledger_hash, "refusal": refusal}
        if withheld is not None:
            w = MessageLine.fields_of(withheld)
            fields["withheld"] = {k: w[k] for k in Withheld.model_fields}
        if handler_error_code is not None:
            fields["handler_error_code"] = int(handler_error_code)
        if declined:
            fields["declined"] = tuple(declined)
        if privacy_anchors is not None:
            fields["privacy_anchors"] = tuple(privacy_anchors)
        return self.append(UploadLine, fields)

    def pending_head(self) -> CheckpointLine | None:
        """The latest checkpoint the server has not countersigned yet (what the gate sends with the next reply)."""
        entries = self.entries()
        signed = {e.countersign.checkpoint.hash for e in entries if isinstance(e, CountersignatureLine)}
        last = next((e for e in reversed(entries) if isinstance(e, CheckpointLine)), None)
        return last if last is not None and last.hash not in signed else None

    def store_countersignature(self, line: CountersignLine, *, server_public_key: bytes) -> CountersignatureLine | None:
        """Store a server countersignature of one of this ledger's checkpoints, verbatim.

        Returns:
            The line written, or ``None`` when it is already stored.
        """
        with file_lock(self.path):
            entries = self.entries()
            if any(isinstance(e, CountersignatureLine) and e.countersign.hash == line.hash for e in entries):
                return None
            pub = bytes(server_public_key)
            ok = line_hash(line.to_json()) == line.hash and signature_ok(pub, line.hash, line.sig)
            fields = {"countersign": line, "server_public_key": pub.hex(), "signature_checked_on_arrival": ok}
            return self._append_locked(CountersignatureLine, fields, entries[-1] if entries else None)

    def store_receipt(self, receipt: Receipt, *, server_public_key: bytes | None) -> ReceiptLine | None:
        """Store a server receipt beside the upload line it acknowledges (matched by ``message_id``).

        The receipt is kept verbatim (the auditor re-checks the server's signature); ``for_seq`` names the upload
        line, or is ``None`` when the site has no such upload (itself evidence of an inconsistency, kept, never
        dropped).

        Returns:
            The line written, or ``None`` when this receipt is already stored.
        """
        with file_lock(self.path):
            entries = self.entries()
            if any(isinstance(e, ReceiptLine) and e.receipt.sig == receipt.sig for e in entries):
                return None
            uploads = [e.seq for e in entries if isinstance(e, UploadLine) and e.message_id == receipt.message_id]
            sig_ok = None if server_public_key is None else receipt_signature_ok(receipt, server_public_key)
            fields = {"for_seq": uploads[-1] if uploads else None, "receipt": receipt, "signature_checked_on_arrival": sig_ok}
            return self._append_locked(ReceiptLine, fields, entries[-1] if entries else None)

    def rounds_open(self) -> list[int]:
        """Rounds with uploads but no checkpoint yet."""
        entries = self.entries()
        seen = {e.round for e in entries if isinstance(e, UploadLine) and e.round is not None}
        closed = {e.round for e in entries if isinstance(e, CheckpointLine)}
        return sorted(seen - closed)


class ServerLedger(_ChainedLog):
    """The server's ledger of every reply it received, signed with the server identity key.

    :meth:`accept` records a reply and returns the signed receipt the ServerApp hands back to the site in its next
    downlink.
    """

    role = "server"

    @classmethod
    def open(cls, run_dir: str | Path, identity_key: bytes, server_id: str = "server") -> "ServerLedger":
        """The server ledger under ``<run_dir>/audit/``."""
        return cls(Path(run_dir) / "audit" / SERVER_LEDGER_FILE, identity_key, writer_id=server_id)

    def countersign(
        self, checkpoint: CheckpointLine, *, writer_id: str, site_public_key: bytes, site_id: str | None, node_id: int, run_id: int
    ) -> CountersignLine | None:
        """Countersign a site's checkpoint (already checked against ``site_public_key``) in this ledger.

        Returns:
            The server's line (what the site gets back), or ``None`` when this checkpoint is already countersigned.
        """
        key_fp = fingerprint(site_public_key)
        with file_lock(self.path):
            entries = self.entries()
            if any(
                isinstance(e, CountersignLine) and e.checkpoint.hash == checkpoint.hash and e.site_key_fingerprint == key_fp
                for e in entries
            ):
                return None
            fields = {
                "site_id": site_id,
                "writer_id": writer_id,
                "site_key_fingerprint": key_fp,
                "node_id": int(node_id),
                "run_id": int(run_id),
                "checkpoint": checkpoint,
            }
            return self._append_locked(CountersignLine, fields, entries[-1] if entries else None)

    def accept(self, reply: Message, site_id: str | None = None, *, facts: MessageFacts | None = None) -> Receipt:
        """Record ``reply`` (measured unless ``facts`` are given) and return its signed receipt."""
        f = facts if facts is not None else describe_message(reply)
        line = self.append(ReceivedLine, {"site_id": site_id, **MessageLine.fields_of(f)})
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
            server_seq=line.seq,
            server_entry_hash=line.hash,
            time=line.time,
        )

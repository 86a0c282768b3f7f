"""Scanning one site ledger: every upload against the egress policy and the manifest in force, every stored receipt
against the upload it acknowledges, every stored countersignature against the checkpoint it signs, the privacy
ledger heads over time, and the uplink bytes per round.

A ``sent`` upload is checked by :func:`~fcd_secure.audit.verify.message_rules.check_message` (a **violation** when
it breaks the policy); a ``refused`` or ``error`` upload must have left without content. An upload the server never
acknowledged with a receipt (other than the acknowledgement of the closing receipts message, which nothing follows)
makes the evidence **partial** (decided in :mod:`~fcd_secure.audit.verify.reconcile`, which knows the server's
runs: a refusal in a run no server ledger covers, such as an app the site refused to run, owes no receipt). The privacy heads are checked by
:func:`~fcd_secure.audit.verify.privacy_history.check_privacy_history`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fcd_secure.audit.entries import (
    CheckpointLine,
    CountersignatureLine,
    InstallLine,
    ManifestLine,
    ReceiptLine,
    UploadLine,
)
from fcd_secure.audit.ledger import SITE_LEDGER_FILE
from fcd_secure.audit.receipts import RECEIPTS_MESSAGE_TYPE, receipt_signature_ok
from fcd_secure.audit.rules import UNKNOWN_TYPE_RULE
from fcd_secure.audit.signing import line_hash, signature_ok
from fcd_secure.audit.verify.chain import EXPECTED_ROLE, Chain, Located, read_chain
from fcd_secure.audit.verify.message_rules import check_message, overhead_bound
from fcd_secure.audit.verify.privacy_history import check_privacy_history
from fcd_secure.audit.verify.result import LedgerSummary, RefusalSummary, VerifyResult
from fcd_secure.manifest import Manifest

__all__ = ["RECONCILED_FIELDS", "CheckedReceipt", "SiteScan", "check_upload", "overhead_bound", "scan_site"]

#: Fields a receipt must agree on with the site's upload line: the byte-for-byte reconciliation.
RECONCILED_FIELDS = ("run_id", "node_id", "round", "reply_to", "message_id", "payload_bytes", "message_bytes", "payload_sha256")


@dataclass(frozen=True)
class CheckedReceipt:
    """A stored receipt after the site-side checks: whether the signature inside it verifies and whether it matches
    the upload it names (only those are reconciled with the server's side)."""

    at: Located[ReceiptLine]
    signed: bool
    matched: bool


@dataclass
class SiteScan:
    """One site ledger, checked on its own: what :mod:`~fcd_secure.audit.verify.reconcile` compares with the server."""

    chain: Chain
    summary: LedgerSummary
    manifests: list[Located[ManifestLine]] = field(default_factory=list)
    uploads: list[Located[UploadLine]] = field(default_factory=list)
    receipts: list[CheckedReceipt] = field(default_factory=list)
    #: stored server countersignatures whose signature checks and whose checkpoint is this chain's own
    countersignatures: list[Located[CountersignatureLine]] = field(default_factory=list)
    #: uploads no stored receipt acknowledges (other than the closing ack); :mod:`.reconcile` decides what each means
    unreceipted: list[Located[UploadLine]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.chain.label


def scan_site(path: Path, label: str, pinned: set[str] | None, res: VerifyResult) -> SiteScan:
    """Check one site ledger: its chain, every upload, every receipt; count its uplink per round.

    Args:
        path: the ``site_ledger.jsonl`` file.
        label: how findings name it.
        pinned: the pinned site fingerprints, or ``None``.
        res: where findings, the ledger summary and the per-round uplink go.
    """
    chain = read_chain(path, label, pinned, EXPECTED_ROLE[SITE_LEDGER_FILE], res)
    summary = LedgerSummary(label, chain.role or "site", chain.writer_id, chain.key_fingerprint, pinned is not None, chain.size)
    scan = SiteScan(chain, summary)
    in_force: tuple[ManifestLine, Manifest] | None = None
    uploads: dict[int, UploadLine] = {}
    for loc in chain.entries:
        e = loc.entry
        if isinstance(e, ManifestLine):
            scan.manifests.append(loc)  # type: ignore[arg-type]
            in_force = (e, e.to_manifest())
            for problem in e.inconsistencies():
                res.add("tampered", label, e.seq, loc.line, f"{loc.where}: the manifest line is inconsistent: {problem}")
        elif isinstance(e, UploadLine):
            scan.uploads.append(loc)  # type: ignore[arg-type]
            uploads[e.seq] = e
            check_upload(loc, in_force, label, res)  # type: ignore[arg-type]
            summary.uploads_sent += e.status == "sent"
            summary.uploads_refused += e.status == "refused"
            summary.uploads_error += e.status == "error"
            if e.status == "refused":
                r = e.refusal
                res.refusals.append(RefusalSummary(
                    label, e.site_id or chain.writer_id, e.seq, e.round, e.action,
                    r.rule if r else None, r.record if r else None, r.key if r else None,
                ))
                if r is not None and r.rule == UNKNOWN_TYPE_RULE:
                    res.add("note", label, e.seq, loc.line,
                            f"{loc.where}: the server sent message type {e.action!r} (round {e.round}), which the site's "
                            "app does not handle: its gate refused it before any handler ran (rule "
                            f"{UNKNOWN_TYPE_RULE}, P28) and recorded the refusal; nothing was computed or sent")
            for d in e.declined or ():
                res.refusals.append(RefusalSummary(label, e.site_id or chain.writer_id, e.seq, e.round, e.action,
                                                   d.rule, d.record, d.key, part=True))
            summary.payload_bytes += e.payload_bytes
            summary.message_bytes += e.message_bytes
            res.count_uplink(e.site_id or chain.writer_id, e.round, e.payload_bytes, e.message_bytes)
        elif isinstance(e, ReceiptLine):
            summary.receipts += 1
            scan.receipts.append(_check_receipt(loc, uploads, label, res))  # type: ignore[arg-type]
        elif isinstance(e, CheckpointLine):
            summary.checkpoints += 1
        elif isinstance(e, InstallLine):
            res.installations.append({"site": chain.writer_id, "ledger": label, "seq": e.seq, "time": e.time,
                                      "event": e.event, "facts": dict(e.facts)})
        elif isinstance(e, CountersignatureLine):
            if _check_countersignature(loc, chain, label, res):  # type: ignore[arg-type]
                scan.countersignatures.append(loc)  # type: ignore[arg-type]
    receipted = {r.at.entry.for_seq for r in scan.receipts if r.at.entry.for_seq is not None}
    summary.unreceipted = len(set(uploads) - receipted)
    scan.unreceipted = [loc for loc in scan.uploads if loc.entry.seq not in receipted and loc.entry.action != RECEIPTS_MESSAGE_TYPE]
    check_privacy_history(scan.uploads, label, res)
    rounds = {u.round for u in uploads.values() if u.round is not None}
    closed = {loc.entry.round for loc in chain.of_kind(CheckpointLine)}
    for r in sorted(rounds - closed):
        res.add("note", label, None, None, f"round {r} has no signed checkpoint yet (the run ended before its closing message)")
    res.ledgers.append(summary)
    return scan


def check_upload(loc: Located[UploadLine], in_force: tuple[ManifestLine, Manifest] | None, label: str, res: VerifyResult) -> None:
    """Violations of one upload line against the egress policy and the manifest in force."""
    e = loc.entry

    def viol(msg: str) -> None:
        res.add("violation", label, e.seq, loc.line, f"{loc.where}: {msg}")

    if e.status in ("refused", "error"):
        if not e.is_error or e.payload_bytes != 0 or e.tensors:
            viol(f"a {e.status} upload still carried content")
        return
    if e.status != "sent":
        viol(f"unknown upload status {e.status!r}")
        return
    check_message(e, in_force, viol, layout_hash=True)


def _check_countersignature(loc: Located[CountersignatureLine], chain: Chain, label: str, res: VerifyResult) -> bool:
    """A stored countersignature must be the server's signed line over one of this chain's own checkpoints."""
    cs = loc.entry.countersign
    where = f"countersignature entry seq {loc.entry.seq} (line {loc.line})"
    try:
        pub = bytes.fromhex(loc.entry.server_public_key)
    except ValueError:
        pub = b""
    if len(pub) != 32 or line_hash(cs.to_json()) != cs.hash or not signature_ok(pub, cs.hash, cs.sig):
        res.add("tampered", label, loc.entry.seq, loc.line, f"{where}: the server's signature on the countersignature does not verify")
        return False
    own = next((x.entry for x in chain.entries if x.entry.seq == cs.checkpoint.seq), None)
    if own is None or own.hash != cs.checkpoint.hash:
        res.add("tampered", label, loc.entry.seq, loc.line,
                f"{where}: the server countersigned checkpoint seq {cs.checkpoint.seq} (round {cs.checkpoint.round}) "
                "as a line this ledger no longer holds (the ledger was rewritten after the server signed its head)")
        return False
    return True


def _check_receipt(loc: Located[ReceiptLine], uploads: dict[int, UploadLine], label: str, res: VerifyResult) -> CheckedReceipt:
    """The server's signature inside a stored receipt, and its agreement with the upload line it names."""
    rec = loc.entry.receipt
    where = f"receipt entry seq {loc.entry.seq} (line {loc.line})"

    def bad(msg: str) -> None:
        res.add("tampered", label, loc.entry.seq, loc.line, f"{where}: {msg}")

    try:
        pub = bytes.fromhex(rec.server_public_key)
    except ValueError:
        pub = b""
    if len(pub) != 32 or not receipt_signature_ok(rec, pub):
        bad("the server's signature on the receipt does not verify")
        return CheckedReceipt(loc, signed=False, matched=False)
    for_seq = loc.entry.for_seq
    upload = uploads.get(for_seq) if for_seq is not None else None
    if upload is None:
        bad(f"acknowledges message {rec.message_id[:16]} for which the site has no upload entry")
        return CheckedReceipt(loc, signed=True, matched=False)
    for k in RECONCILED_FIELDS:
        if getattr(rec, k) != getattr(upload, k):
            bad(f"does not match upload entry seq {for_seq}: {k} is {getattr(rec, k)!r} in the receipt, "
                f"{getattr(upload, k)!r} in the ledger")
            return CheckedReceipt(loc, signed=True, matched=False)
    if rec.message_type != upload.action:
        bad(f"does not match upload entry seq {for_seq}: message type")
        return CheckedReceipt(loc, signed=True, matched=False)
    return CheckedReceipt(loc, signed=True, matched=True)

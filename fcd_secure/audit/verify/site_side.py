"""Scanning one site ledger: every upload against the egress policy and the manifest in force, every stored receipt
against the upload it acknowledges, and the uplink bytes per round.

A ``sent`` upload breaks the policy (a **violation**: the evidence is intact and records a breach) if it names a Θs
parameter or a propensity, carries a tensor that is not a Θc tensor of the manifest in force (or has another
shape/dtype), or weighs more than its Θc layout and declared protocol fields plus a bounded serialisation overhead
(undeclared content). A ``refused`` or ``error`` upload must have left without content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fcd_secure.audit.entries import CheckpointLine, ManifestLine, ReceiptLine, UploadLine
from fcd_secure.audit.ledger import SITE_LEDGER_FILE
from fcd_secure.audit.receipts import receipt_signature_ok
from fcd_secure.audit.rules import PROPENSITY_NAME, SECAGG_PREFIX
from fcd_secure.audit.verify.chain import EXPECTED_ROLE, Chain, Located, read_chain
from fcd_secure.audit.verify.result import LedgerSummary, VerifyResult
from fcd_secure.manifest import THETA_C, THETA_S, Manifest

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
        elif isinstance(e, UploadLine):
            scan.uploads.append(loc)  # type: ignore[arg-type]
            uploads[e.seq] = e
            check_upload(loc, in_force, label, res)  # type: ignore[arg-type]
            summary.uploads_sent += e.status == "sent"
            summary.uploads_refused += e.status == "refused"
            summary.uploads_error += e.status == "error"
            summary.payload_bytes += e.payload_bytes
            summary.message_bytes += e.message_bytes
            res.count_uplink(e.site_id or chain.writer_id, e.round, e.payload_bytes, e.message_bytes)
        elif isinstance(e, ReceiptLine):
            summary.receipts += 1
            scan.receipts.append(_check_receipt(loc, uploads, label, res))  # type: ignore[arg-type]
        elif isinstance(e, CheckpointLine):
            summary.checkpoints += 1
    receipted = {r.at.entry.for_seq for r in scan.receipts if r.at.entry.for_seq is not None}
    summary.unreceipted = len(set(uploads) - receipted)
    rounds = {u.round for u in uploads.values() if u.round is not None}
    closed = {loc.entry.round for loc in chain.of_kind(CheckpointLine)}
    for r in sorted(rounds - closed):
        res.add("note", label, None, None, f"round {r} has no signed checkpoint yet (the run ended before its closing message)")
    res.ledgers.append(summary)
    return scan


def overhead_bound(e: UploadLine) -> int:
    """Upper bound on the serialisation overhead of a payload (headers, names, ids), from what the line names.

    Measured in flwr 1.42: ~16 B for an empty RecordDict, ~170 B per record, ~480-650 B per array (npy header
    128 B plus object headers and the name twice), ~100 B extra per 5 MiB chunk. The bound is generous by a
    factor of ~1.5 and linear in what the line declares, so a hidden payload of any size breaks it.
    """
    b = 256 + 256 * len(e.records)
    for t in e.tensors:
        chunks = max(1, -(-t.nbytes // (5 * 1024 * 1024)))
        b += 512 + 2 * len(t.name) + 16 * len(t.shape) + 256 * chunks
    for m in e.metrics:
        b += 64 + len(m)
    for n in e.metric_lists.values():
        b += 8 * n  # list metrics: up to 8 bytes per number
    for c in e.config_fields:
        b += 64 + len(c.key) + 2 * c.len
    return b


def _names_in(e: UploadLine) -> list[tuple[str, str]]:
    """(where, name) of every key an upload names: records, tensors, metrics, config fields."""
    out = [("record", r) for r in e.records]
    out += [("tensor", f"{t.record}/{t.name}") for t in e.tensors]
    out += [("metric", m) for m in e.metrics]
    out += [("config field", f"{c.record}/{c.key}") for c in e.config_fields]
    return out


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
    manifest = in_force[1] if in_force is not None else None
    theta_c = {m.name: m for m in manifest.select(THETA_C)} if manifest is not None else {}
    theta_s = set(manifest.names(THETA_S)) if manifest is not None else set()
    if in_force is None and e.tensors:
        viol("tensors left before any manifest was recorded")
    if in_force is not None and e.layout_hash != in_force[0].layout_hash:
        viol(f"layout hash {str(e.layout_hash)[:12]} is not the manifest in force")
    for kind, name in _names_in(e):
        leaf = name.split("/")[-1]
        if leaf in theta_s or name in theta_s:
            viol(f"{kind} {name!r} names a Θs parameter")
        if PROPENSITY_NAME.search(leaf):
            viol(f"{kind} {name!r} names a propensity")
    data = 0
    for t in e.tensors:
        spec = theta_c.get(t.name)
        if spec is None:
            if t.name not in theta_s:
                viol(f"tensor {t.name!r} is not a Θc tensor of the manifest")
            continue
        if t.shape != spec.shape or t.dtype != spec.dtype:
            viol(f"tensor {t.name!r} has shape {list(t.shape)} {t.dtype}, the manifest says {list(spec.shape)} {spec.dtype}")
            continue
        if t.nbytes != spec.nbytes:
            viol(f"tensor {t.name!r} declares {t.nbytes} bytes, its layout is {spec.nbytes}")
        data += spec.nbytes
    declared = data + sum(c.len for c in e.config_fields)
    if e.payload_bytes < data:
        viol(f"payload of {e.payload_bytes} bytes is smaller than its declared tensors ({data} bytes)")
    elif e.payload_bytes - declared > overhead_bound(e):
        viol(
            f"payload of {e.payload_bytes} bytes exceeds the Θc layout ({data} bytes) and declared protocol fields plus "
            f"the overhead bound ({overhead_bound(e)} bytes): undeclared content"
        )
    if e.action.startswith(SECAGG_PREFIX) and theta_c:
        n_c = manifest.size(THETA_C)  # type: ignore[union-attr]
        # a masked vector is one word per Θc element plus the weight; 8 bytes per element bounds every encoding used
        largest = max((c.len for c in e.config_fields), default=0)
        if largest > 8 * (n_c + 64) + 4096:
            viol(f"a secure-aggregation field of {largest} bytes is larger than any encoding of the Θc vector ({n_c} elements)")


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

"""Offline verification of site and server ledgers, for auditors (``fcd audit verify``).

Given a run directory (or one site's directory) and the key fingerprints the auditor pinned out of band, decide
(first match wins; the exit code is what ``fcd audit verify`` returns):

* **tampered** (exit 6, evidence tampered or inconsistent): a line that does not parse, a hash, ``prev_hash``,
  ``seq`` or signature that does not check, a ledger signed by a key that is not pinned, a ledger whose ``open``
  entry names the other role (``site_ledger.jsonl`` must be written by a site, ``server_ledger.jsonl`` by the
  server), a checkpoint that disagrees with the chain before it, a receipt whose signature or fields do not match the
  entry it acknowledges (or that acknowledges an upload the site never recorded, or is signed by a key that is neither
  the server ledger's nor a pinned server key), a server ledger entry with no matching site upload, a site upload
  the server ledger present has no record of (a deleted server ledger tail), or a site upload and the server's
  record of it that differ in bytes or hash;
* **violation** (exit 1): an upload that left the site naming a Θs parameter or a propensity, a tensor that is not a
  Θc tensor of the manifest in force (or has another shape/dtype), or whose bytes exceed the Θc layout plus the
  protocol overhead bound, or a refusal whose error reply still carried content;
* **unverified** (exit 3, identity not pinned): every check above passed, but some ledger's key (or the key that
  signed a site's receipts) was not pinned with ``--site-key`` / ``--server-key``. Unpinned signatures prove only
  that one key wrote a whole chain: a chain rebuilt and re-signed with a fresh key checks just as well, so this is
  never "compliant". ``allow_unpinned=True`` (``--allow-unpinned``) turns the exit code to 0; the verdict stays
  "unverified";
* **compliant** (exit 0) otherwise: intact, consistent, within policy, and tied to pinned identities.

Exit 2 (usage error: missing path, malformed fingerprint, no ledger found) is raised as :class:`UsageError`.

It also totals uplink bytes per site and per round (paper Table II "uplink = selected clients × synchronised
parameter size", here measured). The negative proof "Θs never left" is over what passed through the gate: network
counters must corroborate that there was no other path (ops-anchors §2.6 item 7).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fcd_secure.audit.gate import PROPENSITY_NAME, SECAGG_PREFIX
from fcd_secure.audit.ledger import (
    GENESIS,
    SERVER_LEDGER_FILE,
    SITE_LEDGER_FILE,
    canonical,
    fingerprint,
    line_hash,
    merkle_root,
    normalise_fingerprint,
    read_lines,
    receipt_signature_ok,
    signature_ok,
)

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_UNPINNED, EXIT_TAMPERED = 0, 1, 2, 3, 6
#: verdict -> exit code (``unverified`` exits 0 only under ``allow_unpinned``)
EXIT_CODES = {"compliant": EXIT_OK, "violation": EXIT_VIOLATION, "unverified": EXIT_UNPINNED, "tampered": EXIT_TAMPERED}
#: which file must hold which writer's ledger
EXPECTED_ROLE = {SITE_LEDGER_FILE: "site", SERVER_LEDGER_FILE: "server"}

#: Fields a receipt must agree on with the site's upload entry: the byte-for-byte reconciliation.
RECONCILED_FIELDS = ("run_id", "node_id", "round", "reply_to", "message_id", "payload_bytes", "message_bytes", "payload_sha256")
RECEIPT_TO_ENTRY = {"message_type": "action"}


class UsageError(ValueError):
    """Bad input to verify (path, fingerprint): exit 2."""


@dataclass
class Finding:
    severity: str  # "tampered" | "violation" | "unverified" | "note"
    ledger: str
    seq: int | None
    line: int | None
    message: str

    def to_json(self) -> dict:
        return {"severity": self.severity, "ledger": self.ledger, "seq": self.seq, "line": self.line, "message": self.message}


@dataclass
class LedgerSummary:
    path: str
    role: str
    writer_id: str | None
    key_fingerprint: str | None
    key_pinned: bool
    lines: int
    uploads_sent: int = 0
    uploads_refused: int = 0
    uploads_error: int = 0
    receipts: int = 0
    unreceipted: int = 0
    checkpoints: int = 0
    payload_bytes: int = 0
    message_bytes: int = 0


@dataclass
class VerifyResult:
    root: str
    findings: list[Finding] = field(default_factory=list)
    ledgers: list[LedgerSummary] = field(default_factory=list)
    #: (site_id, round) -> {"messages", "payload_bytes", "message_bytes"}; uplink that left the sites
    per_round: dict = field(default_factory=dict)
    server_totals: dict = field(default_factory=dict)
    #: exit 0 instead of 3 when the only shortfall is unpinned identities (the verdict stays "unverified")
    allow_unpinned: bool = False

    @property
    def status(self) -> str:
        for severity in ("tampered", "violation", "unverified"):
            if any(f.severity == severity for f in self.findings):
                return severity
        return "compliant"

    @property
    def exit_code(self) -> int:
        if self.status == "unverified" and self.allow_unpinned:
            return EXIT_OK
        return EXIT_CODES[self.status]

    def totals(self) -> dict:
        return {
            "messages": int(sum(v["messages"] for v in self.per_round.values())),
            "payload_bytes": int(sum(v["payload_bytes"] for v in self.per_round.values())),
            "message_bytes": int(sum(v["message_bytes"] for v in self.per_round.values())),
        }

    def per_site(self) -> dict:
        out: dict = defaultdict(lambda: {"messages": 0, "payload_bytes": 0, "message_bytes": 0})
        for (site, _), v in self.per_round.items():
            for k in v:
                out[site][k] += v[k]
        return dict(out)

    def to_json(self) -> dict:
        return {
            "root": self.root,
            "verdict": self.status,
            "ledgers": [vars(s) for s in self.ledgers],
            "findings": [f.to_json() for f in self.findings],
            "per_round": [
                {"site_id": s, "round": r, **v} for (s, r), v in sorted(self.per_round.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] if kv[0][1] is not None else -1))
            ],
            "per_site": self.per_site(),
            "totals": self.totals(),
            "server_totals": self.server_totals,
        }


# -- one chain -----------------------------------------------------------------------------------------------------
@dataclass
class _Chain:
    path: Path
    label: str
    lines: list[dict]
    line_no: list[int]
    role: str | None
    writer_id: str | None
    public_key: bytes | None
    ok: bool


def _check_chain(path: Path, label: str, pinned: set[str] | None, findings: list[Finding], expected_role: str) -> _Chain:
    """Parse and check one ledger file: JSON, writer role, seq, prev_hash, hash, signatures, pinned key, checkpoints."""

    def bad(seq, line, msg):
        findings.append(Finding("tampered", label, seq, line, msg))

    lines: list[dict] = []
    line_no: list[int] = []
    ok = True
    public_key = None
    role = writer = None
    prev = GENESIS
    for idx, (ln, text) in enumerate(read_lines(path)):
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            bad(None, ln, f"line {ln} is not a valid ledger entry (edited or corrupted)")
            ok = False
            prev = None
            continue
        seq = obj.get("seq")
        where = f"entry seq {seq} (line {ln})"
        if idx == 0:
            if obj.get("kind") != "open" or "public_key" not in obj:
                bad(seq, ln, f"{where}: the ledger does not start with its 'open' entry (entries deleted at the start?)")
                ok = False
            else:
                try:
                    public_key = bytes.fromhex(obj["public_key"])
                except ValueError:
                    public_key = None
                role, writer = obj.get("role"), obj.get("writer_id")
                if role != expected_role:
                    # a site ledger passed off as the server's (or the reverse) would reconcile with itself
                    bad(seq, ln, f"{where}: the ledger opens with role {role!r}, but {path.name} must be written by the "
                                 f"{expected_role} (ledgers swapped or renamed?)")
                    ok = False
                if public_key is None or obj.get("key_fingerprint") != fingerprint(public_key):
                    bad(seq, ln, f"{where}: the key fingerprint does not match the public key")
                    ok = False
                elif pinned is not None and fingerprint(public_key) not in pinned:
                    bad(seq, ln, f"{where}: signed by key {fingerprint(public_key)}, which is not among the pinned fingerprints")
                    ok = False
        if seq != idx:
            bad(seq, ln, f"{where}: expected seq {idx} (an entry was deleted, inserted or moved before it)")
            ok = False
        if prev is not None and obj.get("prev_hash") != prev:
            bad(seq, ln, f"{where}: prev_hash does not match the entry before it (deleted, inserted or reordered entries)")
            ok = False
        try:
            computed = line_hash(obj)
        except (TypeError, ValueError):
            computed = None
        if computed != obj.get("hash"):
            bad(seq, ln, f"{where}: content does not match its hash (the entry was edited)")
            ok = False
        elif public_key is None or not signature_ok(public_key, obj["hash"], str(obj.get("sig", ""))):
            bad(seq, ln, f"{where}: signature does not verify against the ledger's key")
            ok = False
        if obj.get("kind") == "checkpoint":
            n = len(lines)
            hashes = [l.get("hash", "") for l in lines]
            in_round = [l for l in lines if l.get("kind") in ("upload", "received") and l.get("round") == obj.get("round")]
            expect = {
                "size": n,
                "head": hashes[-1] if hashes else GENESIS,
                "merkle_root": merkle_root(hashes) if all(isinstance(h, str) and len(h) == 64 for h in hashes) else None,
                "messages": len(in_round),
                "payload_bytes": int(sum(int(l.get("payload_bytes", 0)) for l in in_round)),
                "message_bytes": int(sum(int(l.get("message_bytes", 0)) for l in in_round)),
            }
            for k, v in expect.items():
                if obj.get(k) != v:
                    bad(seq, ln, f"{where}: checkpoint of round {obj.get('round')} disagrees with the chain ({k})")
                    ok = False
                    break
        lines.append(obj)
        line_no.append(ln)
        prev = obj.get("hash")
    if not lines:
        bad(None, None, "the ledger is empty")
        ok = False
    return _Chain(path, label, lines, line_no, role, writer, public_key, ok)


# -- compliance of one site upload ---------------------------------------------------------------------------------
def _overhead_bound(entry: dict) -> int:
    """Upper bound on the serialisation overhead of a payload (headers, names, ids), from what the entry names.

    Measured in flwr 1.42: ~16 B for an empty RecordDict, ~170 B per record, ~480-650 B per array (npy header
    128 B plus object headers and the name twice), ~100 B extra per 5 MiB chunk. The bound is generous by a
    factor of ~1.5 and linear in what the entry declares, so a hidden payload of any size breaks it.
    """
    b = 256 + 256 * len(entry.get("records", []))
    for t in entry.get("tensors", []):
        chunks = max(1, -(-int(t.get("nbytes", 0)) // (5 * 1024 * 1024)))
        b += 512 + 2 * len(str(t.get("name", ""))) + 16 * len(t.get("shape", [])) + 256 * chunks
    for m in entry.get("metrics", []):
        b += 64 + len(str(m))
    for n in (entry.get("metric_lists") or {}).values():
        b += 8 * int(n)  # list metrics: up to 8 bytes per number
    for c in entry.get("config_fields", []):
        b += 64 + len(str(c.get("key", ""))) + 2 * int(c.get("len", 0))
    return b


def _manifest_specs(manifest: dict | None) -> tuple[dict, set[str]]:
    if not manifest:
        return {}, set()
    c = {e["name"]: (tuple(e["shape"]), e["dtype"]) for e in manifest.get("theta_c", [])}
    s = {e["name"] for e in manifest.get("theta_s", [])}
    return c, s


def _names_in(entry: dict) -> list[tuple[str, str]]:
    """(where, name) of every key an upload names: records, tensors, metrics, config fields."""
    out = [("record", r) for r in entry.get("records", [])]
    out += [("tensor", f"{t.get('record')}/{t.get('name')}") for t in entry.get("tensors", [])]
    out += [("metric", m) for m in entry.get("metrics", [])]
    out += [("config field", f"{c.get('record')}/{c.get('key')}") for c in entry.get("config_fields", [])]
    return out


def _check_upload(entry: dict, manifest: dict | None, label: str, ln: int, findings: list[Finding]) -> None:
    seq = entry.get("seq")
    where = f"entry seq {seq} (line {ln})"

    def viol(msg):
        findings.append(Finding("violation", label, seq, ln, f"{where}: {msg}"))

    status = entry.get("status")
    if status in ("refused", "error"):
        if not entry.get("is_error") or int(entry.get("payload_bytes", 0)) != 0 or entry.get("tensors"):
            viol(f"a {status} upload still carried content")
        return
    if status != "sent":
        viol(f"unknown upload status {status!r}")
        return
    theta_c, theta_s = _manifest_specs(manifest)
    if manifest is None and entry.get("tensors"):
        viol("tensors left before any manifest was recorded")
    if manifest is not None and entry.get("layout_hash") != manifest.get("layout_hash"):
        viol(f"layout hash {str(entry.get('layout_hash'))[:12]} is not the manifest in force")
    for kind, name in _names_in(entry):
        leaf = name.split("/")[-1]
        if leaf in theta_s or name in theta_s:
            viol(f"{kind} {name!r} names a Θs parameter")
        if PROPENSITY_NAME.search(leaf):
            viol(f"{kind} {name!r} names a propensity")
    data = 0
    for t in entry.get("tensors", []):
        name = t.get("name")
        spec = theta_c.get(name)
        if spec is None:
            if name not in theta_s:
                viol(f"tensor {name!r} is not a Θc tensor of the manifest")
            continue
        shape, dtype = spec
        if tuple(t.get("shape", [])) != shape or t.get("dtype") != dtype:
            viol(f"tensor {name!r} has shape {t.get('shape')} {t.get('dtype')}, the manifest says {list(shape)} {dtype}")
            continue
        expect = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize if shape else np.dtype(dtype).itemsize
        if int(t.get("nbytes", -1)) != expect:
            viol(f"tensor {name!r} declares {t.get('nbytes')} bytes, its layout is {expect}")
        data += expect
    declared = data + sum(int(c.get("len", 0)) for c in entry.get("config_fields", []))
    payload = int(entry.get("payload_bytes", 0))
    if payload < data:
        viol(f"payload of {payload} bytes is smaller than its declared tensors ({data} bytes)")
    elif payload - declared > _overhead_bound(entry):
        viol(
            f"payload of {payload} bytes exceeds the Θc layout ({data} bytes) and declared protocol fields plus the "
            f"overhead bound ({_overhead_bound(entry)} bytes): undeclared content"
        )
    if str(entry.get("action", "")).startswith(SECAGG_PREFIX) and theta_c:
        n_c = sum(int(np.prod(s, dtype=np.int64)) for s, _ in theta_c.values())
        # a masked vector is one word per Θc element plus the weight; 8 bytes per element bounds every encoding used
        largest = max((int(c.get("len", 0)) for c in entry.get("config_fields", [])), default=0)
        if largest > 8 * (n_c + 64) + 4096:
            viol(f"a secure-aggregation field of {largest} bytes is larger than any encoding of the Θc vector ({n_c} elements)")


# -- receipts and reconciliation -----------------------------------------------------------------------------------
def _check_receipt(rec_line: dict, ln: int, uploads: dict[int, dict], label: str, server_keys: set[str] | None,
                   server_lines: dict[str, dict], server_ledger_keys: set[str] | None, findings: list[Finding]) -> bool:
    """Check one stored receipt; return whether its signing key is anchored (pinned, or the server ledger's key).

    The key written inside the receipt proves nothing by itself (a site could sign receipts with a key of its own):
    it must be a pinned server key when pins are given, and the key of a server ledger under the path when one is.
    """
    seq = rec_line.get("seq")
    receipt = rec_line.get("receipt") or {}
    where = f"receipt entry seq {seq} (line {ln})"

    def bad(msg):
        findings.append(Finding("tampered", label, seq, ln, f"{where}: {msg}"))

    try:
        pub = bytes.fromhex(str(receipt.get("server_public_key", "")))
    except ValueError:
        pub = b""
    if len(pub) != 32 or not receipt_signature_ok(receipt, pub):
        bad("the server's signature on the receipt does not verify")
        return True
    anchored = False
    if server_keys is not None:
        anchored = True
        if fingerprint(pub) not in server_keys:
            bad(f"receipt signed by server key {fingerprint(pub)}, which is not pinned")
    if server_ledger_keys is not None:
        anchored = True
        if fingerprint(pub) not in server_ledger_keys:
            bad(f"receipt signed by key {fingerprint(pub)}, which is not the key of the server ledger "
                f"({', '.join(sorted(server_ledger_keys)) or 'no valid key'}): a receipt the server did not issue")
    for_seq = rec_line.get("for_seq")
    entry = uploads.get(for_seq) if for_seq is not None else None
    if entry is None:
        bad(f"acknowledges message {str(receipt.get('message_id'))[:16]} for which the site has no upload entry")
        return anchored
    for k in RECONCILED_FIELDS:
        if receipt.get(k) != entry.get(k):
            bad(f"does not match upload entry seq {for_seq}: {k} is {receipt.get(k)!r} in the receipt, {entry.get(k)!r} in the ledger")
            return anchored
    if receipt.get("message_type") != entry.get("action"):
        bad(f"does not match upload entry seq {for_seq}: message type")
        return anchored
    if server_ledger_keys is not None:
        srv = server_lines.get(receipt.get("message_id"))
        if srv is None or srv.get("hash") != receipt.get("server_entry_hash") or srv.get("seq") != receipt.get("server_seq"):
            bad(f"names server ledger entry {receipt.get('server_seq')}, which the server ledger does not hold")
    return anchored


def _discover(root: Path) -> tuple[list[Path], list[Path]]:
    if root.is_file():
        if root.name == SERVER_LEDGER_FILE:
            return [], [root]
        return [root], []
    sites = sorted(root.rglob(SITE_LEDGER_FILE))
    servers = sorted(root.rglob(SERVER_LEDGER_FILE))
    return sites, servers


def verify_path(
    path: str | Path,
    *,
    site_keys: list[str] | None = None,
    server_keys: list[str] | None = None,
    allow_unpinned: bool = False,
) -> VerifyResult:
    """Verify every ledger under ``path`` (a run directory, a site directory or one ledger file).

    ``site_keys`` / ``server_keys``: pinned fingerprints (``SHA256:<hex>``); ``None`` or empty means not pinned:
    signatures then prove only that one key wrote the whole chain, so the verdict is at best "unverified" (exit 3,
    or 0 with ``allow_unpinned``), never "compliant".
    Raises :class:`UsageError` for a missing path, a malformed fingerprint or a directory without ledgers.
    """
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such file or directory")
    try:
        pin_site = {normalise_fingerprint(k) for k in site_keys} if site_keys else None
        pin_server = {normalise_fingerprint(k) for k in server_keys} if server_keys else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    site_paths, server_paths = _discover(root)
    if not site_paths and not server_paths:
        raise UsageError(f"{root}: no {SITE_LEDGER_FILE} or {SERVER_LEDGER_FILE} found")

    res = VerifyResult(root=str(root), allow_unpinned=allow_unpinned)
    base = root if root.is_dir() else root.parent

    def label(p: Path) -> str:
        try:
            return str(p.relative_to(base))
        except ValueError:
            return str(p)

    # server first: its entries are the other side of every reconciliation
    server_by_mid: dict[str, dict] = {}
    server_seen: dict[str, tuple[str, int, int]] = {}
    server_manifests: dict[str, dict] = {}
    server_ledger_keys: set[str] | None = set() if server_paths else None
    for sp in server_paths:
        ch = _check_chain(sp, label(sp), pin_server, res.findings, EXPECTED_ROLE[SERVER_LEDGER_FILE])
        if ch.public_key is not None:
            server_ledger_keys.add(fingerprint(ch.public_key))
        summ = LedgerSummary(label(sp), ch.role or "server", ch.writer_id, fingerprint(ch.public_key) if ch.public_key else None,
                             pin_server is not None, len(ch.lines))
        for l, ln in zip(ch.lines, ch.line_no):
            if l.get("kind") == "received":
                server_by_mid[l.get("message_id")] = l
                server_seen[l.get("message_id")] = (label(sp), l.get("seq"), ln)
                summ.payload_bytes += int(l.get("payload_bytes", 0))
                summ.message_bytes += int(l.get("message_bytes", 0))
            elif l.get("kind") == "checkpoint":
                summ.checkpoints += 1
            elif l.get("kind") == "manifest":
                server_manifests[l.get("layout_hash")] = l
        rounds = {l.get("round") for l in ch.lines if l.get("kind") == "received" and l.get("round") is not None}
        closed = {l.get("round") for l in ch.lines if l.get("kind") == "checkpoint"}
        for r in sorted(rounds - closed):
            res.findings.append(Finding("note", label(sp), None, None, f"round {r} has no signed checkpoint yet"))
        res.ledgers.append(summ)
    res.server_totals = {
        "messages": len(server_by_mid),
        "payload_bytes": int(sum(int(l.get("payload_bytes", 0)) for l in server_by_mid.values())),
        "message_bytes": int(sum(int(l.get("message_bytes", 0)) for l in server_by_mid.values())),
    }

    site_mids: set[str] = set()
    for p in site_paths:
        lab = label(p)
        ch = _check_chain(p, lab, pin_site, res.findings, EXPECTED_ROLE[SITE_LEDGER_FILE])
        summ = LedgerSummary(lab, ch.role or "site", ch.writer_id, fingerprint(ch.public_key) if ch.public_key else None,
                             pin_site is not None, len(ch.lines))
        manifest = None
        uploads: dict[int, dict] = {}
        receipted: set[int] = set()
        unanchored_receipts = 0
        for l, ln in zip(ch.lines, ch.line_no):
            kind = l.get("kind")
            if kind == "manifest":
                manifest = l
                if server_manifests:
                    srv_m = server_manifests.get(l.get("layout_hash"))
                    if srv_m is None or any(srv_m.get(k) != l.get(k) for k in ("theta_c", "theta_s")):
                        res.findings.append(Finding("tampered", lab, l.get("seq"), ln,
                            f"entry seq {l.get('seq')} (line {ln}): the site's manifest (layout {str(l.get('layout_hash'))[:12]}) "
                            "is not the one the server ran with"))
            elif kind == "upload":
                uploads[l.get("seq")] = l
                _check_upload(l, manifest, lab, ln, res.findings)
                st = l.get("status")
                summ.uploads_sent += st == "sent"
                summ.uploads_refused += st == "refused"
                summ.uploads_error += st == "error"
                summ.payload_bytes += int(l.get("payload_bytes", 0))
                summ.message_bytes += int(l.get("message_bytes", 0))
                key = (l.get("site_id") or ch.writer_id, l.get("round"))
                agg = res.per_round.setdefault(key, {"messages": 0, "payload_bytes": 0, "message_bytes": 0})
                agg["messages"] += 1
                agg["payload_bytes"] += int(l.get("payload_bytes", 0))
                agg["message_bytes"] += int(l.get("message_bytes", 0))
                mid = l.get("message_id")
                site_mids.add(mid)
                srv = server_by_mid.get(mid)
                if srv is None and server_paths:
                    # every reply that leaves the gate (content, refusal or error) reaches the server's ledger; one
                    # missing means that ledger lost its record (e.g. its tail was cut to hide an upload)
                    res.findings.append(Finding("tampered", lab, l.get("seq"), ln,
                        f"entry seq {l.get('seq')} (line {ln}): the site sent message {str(mid)[:16]} ({st}, "
                        f"{int(l.get('payload_bytes', 0))} payload bytes) in round {l.get('round')}, which no server ledger "
                        "records (server ledger entries deleted, or a reply the server never pulled)"))
                elif srv is not None:
                    for k in RECONCILED_FIELDS:
                        if srv.get(k) != l.get(k):
                            res.findings.append(Finding("tampered", lab, l.get("seq"), ln,
                                f"entry seq {l.get('seq')} (line {ln}): the server ledger records {k} = {srv.get(k)!r}, the site {l.get(k)!r}"))
                            break
            elif kind == "receipt":
                summ.receipts += 1
                if l.get("for_seq") is not None:
                    receipted.add(l.get("for_seq"))
                if not _check_receipt(l, ln, uploads, lab, pin_server, server_by_mid, server_ledger_keys, res.findings):
                    unanchored_receipts += 1
            elif kind == "checkpoint":
                summ.checkpoints += 1
        summ.unreceipted = len(set(uploads) - receipted)
        if unanchored_receipts:
            res.findings.append(Finding("unverified", lab, None, None,
                f"{unanchored_receipts} receipt(s) are signed by a key that is neither pinned (--server-key) nor the key "
                "of a server ledger under this path: they could have been signed by anyone"))
        rounds = {u.get("round") for u in uploads.values() if u.get("round") is not None}
        closed = {l.get("round") for l in ch.lines if l.get("kind") == "checkpoint"}
        for r in sorted(rounds - closed):
            res.findings.append(Finding("note", lab, None, None, f"round {r} has no signed checkpoint yet (the run ended before its closing message)"))
        res.ledgers.append(summ)

    if site_paths and server_paths:
        for mid, (lab, seq, ln) in server_seen.items():
            if mid not in site_mids:
                why = "(an upload was hidden or a site entry deleted)"
                if server_by_mid[mid].get("is_error"):
                    why = ("(an error reply the site's gate never saw: the Flower runtime builds these before dispatch, "
                           "e.g. for an unregistered message type, and they carry exception text)")
                res.findings.append(Finding("tampered", lab, seq, ln,
                    f"entry seq {seq} (line {ln}): the server received message {str(mid)[:16]} from node "
                    f"{server_by_mid[mid].get('node_id')} which no site ledger records {why}"))
    for s in res.ledgers:
        if not s.key_pinned:
            flag = "--server-key" if s.role == "server" else "--site-key"
            res.findings.append(Finding("unverified", s.path, None, None,
                f"{s.role} key {s.key_fingerprint} was not pinned ({flag}): the signatures prove one writer, not which; "
                "a ledger rebuilt and re-signed with a fresh key would verify the same"))
    return res


def ledger_identities(path: str | Path) -> list[dict]:
    """``{ledger, role, writer_id, key_fingerprint}`` of every ledger under ``path``, from each ``open`` entry.

    For the operator's provisioning step (export the fingerprint to the auditor out of band), not for auditing:
    a fingerprint read from the evidence itself proves nothing about who wrote it.
    """
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such file or directory")
    sites, servers = _discover(root)
    if not sites and not servers:
        raise UsageError(f"{root}: no {SITE_LEDGER_FILE} or {SERVER_LEDGER_FILE} found")
    out = []
    for p in servers + sites:
        first = next(iter(read_lines(p)), None)
        try:
            head = json.loads(first[1]) if first else {}
        except ValueError:
            head = {}
        out.append({"ledger": str(p), "role": head.get("role"), "writer_id": head.get("writer_id"), "key_fingerprint": head.get("key_fingerprint")})
    return out


def dumps(obj) -> str:
    return canonical(obj).decode("ascii")

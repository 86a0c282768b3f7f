"""Render a verification result for people (Markdown) and for tools (one JSON envelope).

The envelope follows the NVFLARE 2.9 CLI output contract (``nvflare/tool/cli_output.py``), adopted for ``fcd``:
``{schema_version, status, exit_code, error_code, message, hint, data}``, with exit codes 0 compliant, 1 violation,
2 usage error, 3 unverified (identity not pinned), 4 partial (evidence incomplete: no server ledger to reconcile
with, or uploads without a receipt), 6 evidence tampered or inconsistent, so a pipeline can tell "failed" from
"forged" from "incomplete" from "not tied to a known identity".
"""

from __future__ import annotations

from fcd_secure.audit.verify import EXIT_USAGE, VerifyResult

SCHEMA_VERSION = "1"

_ERROR = {
    "compliant": (None, "ledgers verified: chain, signatures and receipts intact; nothing but Θc and allow-listed aggregates left", None),
    "violation": (
        "EGRESS_VIOLATION",
        "the evidence is intact but records an upload that breaks the egress policy",
        "see data.findings (severity 'violation'): the entry seq names the upload",
    ),
    "tampered": (
        "EVIDENCE_TAMPERED",
        "the evidence is tampered with or inconsistent",
        "see data.findings (severity 'tampered'): each names the ledger file, entry seq and line",
    ),
    "partial": (
        "EVIDENCE_PARTIAL",
        "PARTIAL: the evidence is incomplete (no server ledger to reconcile with, or uploads the server never "
        "acknowledged); a truncated or re-signed ledger cannot be ruled out, so this is not a compliance verdict",
        "verify the run directory that holds the server ledger and every site ledger; see data.findings "
        "(severity 'partial')",
    ),
    "unverified": (
        "IDENTITY_NOT_PINNED",
        "UNVERIFIED: chains, receipts and policy check, but no pinned key ties the ledgers to their writers "
        "(a chain re-signed with a fresh key would pass the same); this is not a compliance verdict",
        "pin every writer: --site-key/--server-key with the fingerprints exported out of band at provisioning "
        "(`fcd audit fingerprints` on the operator's side); see data.findings (severity 'unverified')",
    ),
}


def envelope(result: VerifyResult) -> dict:
    """The one JSON document ``fcd audit verify --json`` prints: verdict, exit code, error code, message, hint, data."""
    code = result.exit_code
    error_code, message, hint = _ERROR[result.status]
    first = next((f for f in result.findings if f.severity == result.status), None)
    if first is not None:
        message = f"{message}: {first.ledger}: {first.message}"
    if result.status == "unverified" and code == 0:
        message = f"{message} [exit 0 only because --allow-unpinned was given]"
    return {
        "schema_version": SCHEMA_VERSION,
        "status": result.status,
        "exit_code": code,
        "error_code": error_code,
        "message": message,
        "hint": hint,
        "data": result.to_json(),
    }


def usage_envelope(message: str, hint: str | None = None) -> dict:
    """The JSON envelope of a usage error (exit 2)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "error",
        "exit_code": EXIT_USAGE,
        "error_code": "USAGE",
        "message": message,
        "hint": hint,
        "data": None,
    }


def _fmt(n: int) -> str:
    return f"{int(n):,}"


def markdown(result: VerifyResult) -> str:
    """The auditor's report: verdict, findings, ledgers, uplink bytes per site and round, totals."""
    env = envelope(result)
    out = [f"# Audit verification: {result.root}", ""]
    out.append(f"**Verdict: {result.status.upper()}** (exit {result.exit_code}). {env['message']}")
    out.append("")
    serious = [f for f in result.findings if f.severity != "note"]
    notes = [f for f in result.findings if f.severity == "note"]
    out += ["## Findings", ""]
    if not serious:
        out.append("None.")
    else:
        out += ["| severity | ledger | seq | line | finding |", "|---|---|---|---|---|"]
        for f in serious:
            out.append(f"| {f.severity} | {f.ledger} | {'' if f.seq is None else f.seq} | {'' if f.line is None else f.line} | {f.message} |")
    for f in notes:
        out.append(f"- note: {f.ledger}: {f.message}")
    out += ["", "## Ledgers", "", "| ledger | role | writer | key | pinned | entries | sent | refused | errors | receipts | unreceipted | checkpoints |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in result.ledgers:
        key = (s.key_fingerprint or "?")[:23]
        out.append(
            f"| {s.path} | {s.role} | {s.writer_id} | {key}… | {'yes' if s.key_pinned else 'no'} | {s.lines} | {s.uploads_sent} | "
            f"{s.uploads_refused} | {s.uploads_error} | {s.receipts} | {s.unreceipted} | {s.checkpoints} |"
        )
    out += ["", "## Uplink bytes per site and round", "", "| site | round | messages | payload bytes | message bytes |", "|---|---|---|---|---|"]
    data = result.to_json()
    for row in data["per_round"]:
        rnd = "-" if row["round"] is None else row["round"]
        out.append(f"| {row['site_id']} | {rnd} | {row['messages']} | {_fmt(row['payload_bytes'])} | {_fmt(row['message_bytes'])} |")
    out += ["", "## Totals", "", "| site | messages | payload bytes | message bytes |", "|---|---|---|---|"]
    for site, v in sorted(data["per_site"].items(), key=lambda kv: str(kv[0])):
        out.append(f"| {site} | {v['messages']} | {_fmt(v['payload_bytes'])} | {_fmt(v['message_bytes'])} |")
    t = data["totals"]
    out.append(f"| **all sites** | {t['messages']} | {_fmt(t['payload_bytes'])} | {_fmt(t['message_bytes'])} |")
    if data["server_totals"].get("messages"):
        st = data["server_totals"]
        out.append(f"| server received | {st['messages']} | {_fmt(st['payload_bytes'])} | {_fmt(st['message_bytes'])} |")
    out += [
        "",
        "Payload bytes: Flower's serialized content objects (identical at both ends). Message bytes add the message "
        "header. HTTP framing, TLS and heartbeats are outside the ledger; corroborate with network counters.",
        "",
    ]
    return "\n".join(out)

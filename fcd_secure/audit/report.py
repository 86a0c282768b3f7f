"""Render a verification result for people (Markdown) and for tools (the fields of one JSON envelope).

The command line wraps :func:`verdict` in its one JSON envelope (``fcd_secure.cli.envelope``, after the NVFLARE 2.9
CLI output contract ``nvflare/tool/cli_output.py``): ``{schema_version, status, exit_code, error_code, message,
hint, data}``, with exit codes 0 compliant, 1 violation, 2 usage error, 3 unverified (identity not pinned),
4 partial (evidence incomplete: no server ledger to reconcile with, or uploads without a receipt), 6 evidence
tampered or inconsistent, so a pipeline can tell "failed" from "forged" from "incomplete" from "not tied to a known
identity".
"""

from __future__ import annotations

from fcd_secure._format import fmt
from fcd_secure.audit.verify import VerifyResult

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
        "pin every writer: --pins with the pin file the operator exported out of band at provisioning "
        "(`fcd audit fingerprints --out pins.toml`), or --site-key/--server-key; see data.findings (severity "
        "'unverified')",
    ),
}


def verdict(result: VerifyResult) -> dict:
    """The envelope fields of a verification: ``status`` (the verdict), ``exit_code``, ``error_code``, ``message``,
    ``hint`` and ``data`` (the findings, ledgers and byte totals)."""
    code = result.exit_code
    error_code, message, hint = _ERROR[result.status]
    first = next((f for f in result.findings if f.severity == result.status), None)
    if first is not None:
        message = f"{message}: {first.ledger}: {first.message}"
    if result.status == "unverified" and code == 0:
        message = f"{message} [exit 0 only because --allow-unpinned was given]"
    return {
        "status": result.status,
        "exit_code": code,
        "error_code": error_code,
        "message": message,
        "hint": hint,
        "data": result.to_json(),
    }


def markdown(result: VerifyResult) -> str:
    """The auditor's report: verdict, findings, ledgers, uplink bytes per site and round, totals."""
    env = verdict(result)
    out = [f"# Audit verification: {result.root}", ""]
    out.append(f"**Verdict: {result.status.upper()}** (exit {result.exit_code}). {env['message']}")
    out.append("")
    serious = [f for f in result.findings if f.severity != "note"]
    notes = [f for f in result.findings if f.severity == "note"]
    out += ["## Findings", ""]
    if not serious:
        out.append("None.")
    else:
        # a list, not a table: findings name ledgers and keys, which must read whole at any terminal width
        for f in serious:
            where = "".join(
                [f" seq {f.seq}" if f.seq is not None else "", f" line {f.line}" if f.line is not None else ""]
            )
            out.append(f"- **{f.severity}** `{f.ledger}`{where}: {f.message}")
    for f in notes:
        out.append(f"- note: {f.ledger}: {f.message}")
    out += ["", "## Refusals", "", "What the sites refused to send or to do (not violations: the site's gate or policy at work).", ""]
    if not result.refusals:
        out.append("None.")
    else:
        # a list, like the findings: site ids and rule names read whole at any terminal width
        for r in result.refusals:
            where = "/".join(x for x in (r.record, r.key) if x)
            rnd = "" if r.round is None else f" round {r.round}"
            said = [where] if where else []
            if r.part:
                said.append("part of the request declined, the rest answered")
            out.append(f"- `{r.site_id}`{rnd} {r.action}: rule `{r.rule}`" + (f" ({'; '.join(said)})" if said else ""))
    out += ["", "## Installation", ""]
    if not result.installations:
        out.append("No installation records (sites provisioned by fcd deploy or the simulation).")
    else:
        for i in result.installations:
            facts = ", ".join(f"{k}={v}" for k, v in sorted(i["facts"].items()))
            out.append(f"- `{i['site']}` {i['time']} {i['event']}" + (f": {facts}" if facts else ""))
    out += ["", "## Ledgers", ""]
    for s in result.ledgers:
        key = s.key_fingerprint or "?"  # whole: the auditor compares it with the pinned one
        out.append(
            f"- `{s.path}`: {s.role} `{s.writer_id}`, key `{key}` (pinned: {'yes' if s.key_pinned else 'no'}); "
            f"{s.lines} entries, {s.uploads_sent} sent, {s.uploads_refused} refused, {s.uploads_error} errors, "
            f"{s.receipts} receipts, {s.unreceipted} unreceipted, {s.checkpoints} checkpoints"
        )
    out += ["", "## Uplink bytes per site and round", "", "| site | round | messages | payload bytes | message bytes |", "|---|---|---|---|---|"]
    data = result.to_json()
    for row in data["per_round"]:
        rnd = "-" if row["round"] is None else row["round"]
        out.append(f"| {row['site_id']} | {rnd} | {row['messages']} | {fmt(row['payload_bytes'], ',')} | "
                   f"{fmt(row['message_bytes'], ',')} |")
    out += ["", "## Totals", "", "| site | messages | payload bytes | message bytes |", "|---|---|---|---|"]
    for site, v in sorted(data["per_site"].items(), key=lambda kv: str(kv[0])):
        out.append(f"| {site} | {v['messages']} | {fmt(v['payload_bytes'], ',')} | {fmt(v['message_bytes'], ',')} |")
    t = data["totals"]
    out.append(f"| **all sites** | {t['messages']} | {fmt(t['payload_bytes'], ',')} | {fmt(t['message_bytes'], ',')} |")
    if data["server_totals"].get("messages"):
        st = data["server_totals"]
        out.append(f"| server received | {st['messages']} | {fmt(st['payload_bytes'], ',')} | "
                   f"{fmt(st['message_bytes'], ',')} |")
    out += [
        "",
        "Payload bytes: Flower's serialized content objects (identical at both ends). Message bytes add the message "
        "header. HTTP framing, TLS and heartbeats are outside the ledger; corroborate with network counters.",
        "",
    ]
    return "\n".join(out)

"""`fcd audit` sub-commands: offline verification of site and server uplink ledgers (for auditors).

``fcd audit verify`` exit codes (the verdicts are defined in :mod:`fcd_secure.audit.verify`):

====  =============  ==========================================================================================
code  status         meaning
====  =============  ==========================================================================================
0     compliant      chains, signatures, receipts and policy check, and every writer's key is pinned
1     violation      the evidence is intact but records an upload that breaks the egress policy
2     error          usage error: missing path, malformed fingerprint, no ledger found
3     unverified     every check passed but some writer's key (or the receipts' key) was not pinned with
                     --site-key/--server-key: not a compliance verdict (``--allow-unpinned`` exits 0 instead)
4     partial        the evidence is incomplete: site ledgers without the server ledger (or the reverse), or
                     uploads the server never acknowledged; never compliant, whatever the flags
6     tampered       evidence tampered with or inconsistent (each finding names the ledger, entry seq and line)
====  =============  ==========================================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markdown import Markdown

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("verify")
def verify(
    path: Path = typer.Argument(
        ...,
        metavar="RUN_OR_SITE_DIR",
        help="A run directory (all site and server ledgers under it), one site's directory, or one ledger file.",
    ),
    site_key: Optional[list[str]] = typer.Option(
        None,
        "--site-key",
        metavar="FINGERPRINT",
        help="Pinned site key fingerprint (SHA256:<hex>), obtained out of band; repeat once per site.",
    ),
    server_key: Optional[list[str]] = typer.Option(
        None, "--server-key", metavar="FINGERPRINT", help="Pinned server key fingerprint (SHA256:<hex>); repeatable."
    ),
    allow_unpinned: bool = typer.Option(
        False,
        "--allow-unpinned",
        help="Exit 0 instead of 3 when the only shortfall is unpinned keys (the verdict stays UNVERIFIED; for "
        "smoke tests, never for an audit).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope on stdout instead of the Markdown report."),
    plain: bool = typer.Option(False, "--plain", help="Print the Markdown source instead of rendering it."),
) -> None:
    """Check ledgers offline: hash chain, signatures against the pinned keys, server receipts, that no upload named
    a Θs parameter or a propensity, and that bytes match the Θc layout plus protocol overhead. Prints uplink bytes
    per site and round.

    A compliant verdict needs every writer pinned: --site-key for each site ledger, --server-key for the server
    ledger and the receipts. Without pins the signatures only show that one key wrote each chain (a chain re-signed
    with a fresh key passes the same), so the verdict is UNVERIFIED.

    Verifying one site's folder without the server ledger is PARTIAL (exit 4), never compliant: only the server's
    records (received messages, receipts, countersigned chain heads) can show a site ledger that was cut or
    rewritten and re-signed with the site's own key.

    \b
    Exit codes:
      0  compliant   intact, consistent, complete, within policy, all keys pinned
      1  violation   intact evidence of an upload that breaks the egress policy, or a privacy
                     ledger that disappeared or went back without an acknowledged reset
      2  usage       missing path, malformed fingerprint, no ledger found
      3  unverified  checks pass, a key is not pinned (0: --allow-unpinned)
      4  partial     evidence incomplete: no server ledger (or no site ledger), or uploads
                     without a server receipt
      6  tampered    evidence tampered with or inconsistent
    """
    from fcd_secure.audit.report import envelope, markdown, usage_envelope  # noqa: PLC0415 (keep --help fast)
    from fcd_secure.audit.verify import EXIT_USAGE, UsageError, verify_path  # noqa: PLC0415

    err = Console(stderr=True)
    try:
        result = verify_path(path, site_keys=site_key, server_keys=server_key, allow_unpinned=allow_unpinned)
    except UsageError as exc:
        hint = "give a run directory, a site directory or a *_ledger.jsonl file; fingerprints look like SHA256:<64 hex>"
        if as_json:
            typer.echo(json.dumps(usage_envelope(str(exc), hint)))
        else:
            err.print(f"[red]error:[/red] {exc}\n[dim]hint: {hint}[/dim]")
        raise typer.Exit(EXIT_USAGE) from None
    if as_json:
        typer.echo(json.dumps(envelope(result), ensure_ascii=False))
    else:
        text = markdown(result)
        if plain:
            typer.echo(text)
        else:
            Console().print(Markdown(text))
    raise typer.Exit(result.exit_code)


@app.command("fingerprints")
def fingerprints(
    path: Path = typer.Argument(..., metavar="RUN_OR_SITE_DIR", help="A run directory, a site directory or one ledger file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope on stdout."),
) -> None:
    """List the key fingerprint of every site and server ledger, for the operator to hand to the auditor out of
    band at installation (the auditor then pins them with ``verify --site-key/--server-key``). Never prints keys."""
    from fcd_secure.audit.report import SCHEMA_VERSION, usage_envelope  # noqa: PLC0415
    from fcd_secure.audit.verify import EXIT_USAGE, UsageError, ledger_identities  # noqa: PLC0415

    try:
        rows = ledger_identities(path)
    except UsageError as exc:
        if as_json:
            typer.echo(json.dumps(usage_envelope(str(exc))))
        else:
            Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    if as_json:
        env = {"schema_version": SCHEMA_VERSION, "status": "ok", "exit_code": 0, "error_code": None,
               "message": f"{len(rows)} ledger(s)", "hint": None, "data": rows}
        typer.echo(json.dumps(env))
        return
    from rich.table import Table  # noqa: PLC0415

    table = Table("role", "writer", "key fingerprint", "ledger")
    for r in rows:
        table.add_row(str(r["role"]), str(r["writer_id"]), str(r["key_fingerprint"]), r["ledger"])
    Console().print(table)

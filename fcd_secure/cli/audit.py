"""`fcd audit` sub-commands: offline verification of site and server uplink ledgers (for auditors)."""

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
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope on stdout instead of the Markdown report."),
    plain: bool = typer.Option(False, "--plain", help="Print the Markdown source instead of rendering it."),
) -> None:
    """Check ledgers offline: hash chain, signatures against the pinned keys, server receipts, that no upload named
    a Θs parameter or a propensity, and that bytes match the Θc layout plus protocol overhead. Prints uplink bytes
    per site and round.

    Exit codes: 0 compliant, 1 violation found, 2 usage error, 6 evidence tampered or inconsistent.
    """
    from fcd_secure.audit.report import envelope, markdown, usage_envelope  # noqa: PLC0415 (keep --help fast)
    from fcd_secure.audit.verify import EXIT_USAGE, UsageError, verify_path  # noqa: PLC0415

    err = Console(stderr=True)
    try:
        result = verify_path(path, site_keys=site_key, server_keys=server_key)
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

"""`fcd audit` sub-commands: key fingerprints for provisioning, offline verification of ledgers (for auditors).

``fcd audit verify`` exit codes (the verdicts are defined in :mod:`fcd_secure.audit.verify`):

====  =============  ==========================================================================================
code  status         meaning
====  =============  ==========================================================================================
0     compliant      chains, signatures, receipts and policy check, and every writer's key is pinned
1     violation      the evidence is intact but records an upload that breaks the egress policy
2     error          usage error: missing path, a file that is not a ledger, malformed fingerprint or pin file,
                     no ledger found
3     unverified     every check passed but some writer's key (or the receipts' key) was not pinned with
                     --pins/--site-key/--server-key: not a compliance verdict (``--allow-unpinned`` exits 0 instead)
4     partial        the evidence is incomplete: site ledgers without the server ledger (or the reverse), or
                     uploads the server never acknowledged; never compliant, whatever the flags
6     tampered       evidence tampered with or inconsistent (each finding names the ledger, entry seq and line)
====  =============  ==========================================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fcd_secure.cli.app import emit, new_app, say_identifier, stdout
from fcd_secure.cli.envelope import EXIT_USAGE, CliError, Envelope, ok

app = new_app(help="Export key fingerprints; verify site and server ledgers offline.")

_USAGE_HINT = (
    "give a run directory, a site directory or a *_ledger.jsonl file; fingerprints look like SHA256:<64 hex>; "
    "a pin file is what `fcd audit fingerprints --out pins.toml` writes"
)


def pinned_keys(site_key: list[str] | None, server_key: list[str] | None, pins: Path | None) -> tuple[list[str], list[str]]:
    """The site and server key fingerprints given on the command line plus those of the pin file ``pins``.

    Raises:
        PinFileError: the pin file cannot be read.
    """
    from fcd_secure.audit.pins import read_pins  # noqa: PLC0415 (keep --help fast)

    sites, servers = list(site_key or []), list(server_key or [])
    if pins is not None:
        pin_sites, pin_servers = read_pins(pins)
        sites += pin_sites
        servers += pin_servers
    return sites, servers


@app.command("verify", short_help="Verify ledgers offline against pinned keys (exit code = verdict).")
def verify(
    path: Path = typer.Argument(
        ...,
        metavar="RUN_OR_SITE_DIR",
        help="A run directory (all site and server ledgers under it), one site's directory, or one ledger file.",
    ),
    pins: Optional[Path] = typer.Option(
        None, "--pins", metavar="PINS_TOML",
        help="Pin file of every writer's fingerprint (written by `fcd audit fingerprints --out`), obtained out of band.",
    ),
    site_key: Optional[list[str]] = typer.Option(
        None,
        "--site-key",
        metavar="FINGERPRINT",
        help="Pinned site key fingerprint (SHA256:<hex>), obtained out of band; repeatable (or use --pins).",
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

    A compliant verdict needs every writer pinned: --pins with the operator's pin file, or --site-key for each site
    ledger and --server-key for the server ledger and the receipts. Without pins the signatures only show that one
    key wrote each chain (a chain re-signed with a fresh key passes the same), so the verdict is UNVERIFIED.

    Verifying one site's folder without the server ledger is PARTIAL (exit 4), never compliant: only the server's
    records (received messages, receipts, countersigned chain heads) can show a site ledger that was cut or
    rewritten and re-signed with the site's own key.

    \b
    Exit codes:
      0  compliant   intact, consistent, complete, within policy, all keys
                     pinned
      1  violation   intact evidence of an upload that breaks the egress
                     policy, or a privacy ledger that disappeared or went back
                     without an acknowledged reset
      2  usage       missing path, not a ledger, malformed fingerprint or pin
                     file, no ledger found
      3  unverified  checks pass, a key is not pinned (0: --allow-unpinned)
      4  partial     evidence incomplete: no server ledger (or no site
                     ledger), or uploads without a server receipt
      6  tampered    evidence tampered with or inconsistent
    """
    from fcd_secure.audit.pins import PinFileError  # noqa: PLC0415 (keep --help fast)
    from fcd_secure.audit.report import markdown, verdict  # noqa: PLC0415
    from fcd_secure.audit.verify import UsageError, verify_path  # noqa: PLC0415

    from fcd_secure.audit.pins import read_pin_table  # noqa: PLC0415

    try:
        sites, servers = pinned_keys(site_key, server_key, pins)
        by_writer = read_pin_table(pins)["sites"] if pins is not None else None
        result = verify_path(path, site_keys=sites or None, server_keys=servers or None, allow_unpinned=allow_unpinned,
                             site_pins_by_writer=by_writer)
    except (UsageError, PinFileError) as exc:
        raise CliError(str(exc), "USAGE", hint=_USAGE_HINT, exit_code=EXIT_USAGE) from None
    if as_json:
        emit(Envelope(**verdict(result)))
    elif plain:
        typer.echo(markdown(result))
    else:
        from rich.markdown import Markdown  # noqa: PLC0415

        stdout().print(Markdown(markdown(result)))
    raise typer.Exit(result.exit_code)


@app.command("fingerprints", short_help="Every ledger writer's key fingerprint; --out writes a pin file.")
def fingerprints(
    path: Path = typer.Argument(..., metavar="RUN_OR_SITE_DIR", help="A run directory, a site directory or one ledger file."),
    pins_out: Optional[Path] = typer.Option(
        None, "--out", metavar="PINS_TOML", help="Also write a pin file for the auditor (`fcd audit verify --pins`)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope on stdout."),
) -> None:
    """List the key fingerprint of every site and server ledger, for the operator to hand to the auditor out of
    band at installation (the auditor then pins them with ``verify --pins`` or ``--site-key/--server-key``). Each
    fingerprint is printed whole on its own line. Never prints keys."""
    from fcd_secure.audit.pins import PinFileError, write_pins  # noqa: PLC0415
    from fcd_secure.audit.verify import UsageError, ledger_identities  # noqa: PLC0415

    try:
        rows = ledger_identities(path)
        written = write_pins(pins_out, rows) if pins_out is not None else None
    except UsageError as exc:
        raise CliError(str(exc), "USAGE", hint=_USAGE_HINT, exit_code=EXIT_USAGE) from None
    except PinFileError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{pins_out}: cannot write the pin file ({exc.strerror})") from None
    if as_json:
        emit(ok(rows, f"{len(rows)} ledger(s)" + (f"; pins written to {written}" if written else "")))
        return
    con = stdout()
    # one block per ledger, identifiers whole on their own lines (never a table cell cut to the terminal width)
    for r in rows:
        con.print(f"[bold]{r['role'] or '?'}[/] {r['writer_id'] or '?'}", soft_wrap=True)
        say_identifier(con, "key", str(r["key_fingerprint"]))
        say_identifier(con, "ledger", str(r["ledger"]))
    if written is not None:
        say_identifier(con, "pins written to", str(written), indent=0)


@app.command("collect", short_help="Gather each site's current ledger and DP records into a run's evidence folder.")
def collect(
    evidence: Path = typer.Argument(..., metavar="EVIDENCE_DIR", help="The run's evidence folder (<run>/evidence)."),
    site_home: list[Path] = typer.Option(
        ..., "--site-home", metavar="SITE_HOME", help="A site's home folder (fcd site init --home); repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope on stdout."),
) -> None:
    """Copy each site's current site ledger, DP ledgers and privacy anchor into EVIDENCE_DIR/sites/<site-id>/,
    replacing an earlier copy, and record the copies' SHA-256 in EVIDENCE_DIR/collected.json. Run it after every
    run, before `fcd audit verify`: a ledger copied before the last run is stale (verify reads it as partial)."""
    from fcd_secure.cli._provisioning import bad_input  # noqa: PLC0415
    from fcd_secure.cli.app import done  # noqa: PLC0415
    from fcd_secure.provisioning.evidence import collect_site_evidence  # noqa: PLC0415

    with bad_input("EVIDENCE_DIR is <run>/evidence as fcd server run wrote it; --site-home is each site's home"):
        rows = collect_site_evidence(evidence, site_home)
    done(as_json, {"evidence": str(evidence), "sites": rows},
         f"collected {len(rows)} site(s): {', '.join(r['site_id'] for r in rows)}", [("evidence", str(evidence))])

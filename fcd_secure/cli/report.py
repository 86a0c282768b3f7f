"""`fcd report RUN_DIR`: one self-contained HTML report of a run for a privacy officer and an auditor
(``fcd_secure.experiments.report_html``: who took part, what left each site, ε per site against its cap with the
plot, the audit verdict and what could not be checked, the answers with their support)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fcd_secure.cli.app import emit, say_identifier, stdout
from fcd_secure.cli.envelope import EXIT_USAGE, CliError, ok


def register(app: typer.Typer) -> None:
    """Attach ``fcd report`` to the root app."""

    @app.command("report", short_help="One self-contained HTML report of a run (privacy officer, auditor).")
    def report(
        run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A finished run folder of `fcd run` (summary.json, state/ with the ledgers)."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", dir_okay=False, help="The HTML file to write (default RUN_DIR/report.html)."),
        pins: Optional[Path] = typer.Option(None, "--pins", metavar="PINS_TOML", help="Pin file of every writer's key fingerprint (`fcd audit fingerprints --out`), obtained out of band: without pins the verdict is at best UNVERIFIED."),
        site_key: Optional[list[str]] = typer.Option(None, "--site-key", metavar="FINGERPRINT", help="A pinned site key fingerprint (SHA256:<hex>); repeatable."),
        server_key: Optional[list[str]] = typer.Option(None, "--server-key", metavar="FINGERPRINT", help="A pinned server key fingerprint (SHA256:<hex>); repeatable."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (the report's facts and its path) on stdout."),
    ) -> None:
        """Write one HTML file a privacy officer and an auditor can open, read on a phone and file: who took part,
        what left each site (bytes and kinds, from each site's signed ledger), ε per site and per record against the
        caps with the plot embedded, the audit verdict of `fcd audit verify` with what could not be checked, and the
        answers with their support. It loads nothing from the network (the plot is embedded).

        Every value from the run folder is escaped and the page forbids scripts (its Content-Security-Policy): the
        folder is written by the server being audited. For a deployment, whose privacy ledgers stay on the sites, ε
        comes from the sites' signed privacy records in RUN_DIR/evidence/; a site without one is 'unverified'.

        Exit codes: 0 written (whatever the verdict: `fcd audit verify` exits with it), 2 bad input (not a finished
        run folder, a summary.json field of the wrong type, a malformed pin file or fingerprint).
        """
        from fcd_secure.audit.pins import PinFileError  # noqa: PLC0415
        from fcd_secure.cli.audit import pinned_keys  # noqa: PLC0415
        from fcd_secure.audit.verify import UsageError  # noqa: PLC0415
        from fcd_secure.experiments.report_html import ReportError, write_report_html  # noqa: PLC0415

        try:
            sites, servers = pinned_keys(site_key, server_key, pins)
            path, facts = write_report_html(run_dir, out, site_keys=sites or None, server_keys=servers or None)
        except (ReportError, PinFileError, UsageError) as exc:
            raise CliError(str(exc), "USAGE", exit_code=EXIT_USAGE,
                           hint="give a finished run folder of `fcd run`; pins come from `fcd audit fingerprints --out`") from None
        except OSError as exc:
            raise CliError(f"{out or run_dir}: cannot write the report ({exc.strerror or exc})") from None
        if as_json:
            emit(ok(facts, f"report written: {path}"))
            return
        con = stdout()
        dp = ("ε plot embedded" if facts["plot"] else
              "DP on, ε unverified (no signed privacy record)" if facts["dp"] else "no DP in this run (said so in the report)")
        if facts["dp_unverified"] and facts["plot"]:
            dp += f"; unverified: {', '.join(facts['dp_unverified'])}"
        con.print(f"audit verdict: {facts['verdict'].upper()}; {dp}", soft_wrap=True)
        say_identifier(con, "report:", str(path), indent=0)

"""``fcd site``: the hospital's installer: init, join, preflight, service.

``init`` checks the site's table against the spec and makes the site's keys (they never leave its folder), its
strict policy and the enrolment request; ``join`` verifies the coordinator's bundle against the fingerprint the
operator types and pins what it carries; ``preflight`` says whether the site is ready (exit 0 ready, 1 not ready,
2 usage); ``service`` writes a systemd unit. Each of init, join and preflight appends a signed line to the site
ledger, which ``fcd audit verify`` reports (``fcd_secure.provisioning.site_install``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from fcd_secure.cli._provisioning import bad_input
from fcd_secure.cli.app import done, emit, new_app, say_identifier, say_status, say_stopped, stderr, stdout
from fcd_secure.cli.envelope import EXIT_FAILED, CliError, Envelope, ok

app = new_app(help="Install and run a hospital site: init, join, preflight, start, stop, status, service.")

_HOME = typer.Option(..., "--home", help="The site's folder.")


@app.command("init", short_help="Install the site: check its table, make its keys and enrolment request.")
def init(
    spec: Path = typer.Option(..., "--spec", exists=True, dir_okay=False,
                              help="The consortium's data spec (or OMOP cohort spec, docs/omop.md)."),
    table: str = typer.Option(..., "--table", help="The site's own long-format table, or its OMOP CDM database "
                              "(a .duckdb file or postgresql://[user@]host[:port]/db; the password from PGPASSWORD "
                              "or ~/.pgpass)."),
    home: Path = _HOME,
    site_id: str = typer.Option(..., "--site-id", help="The site's id in the consortium ([A-Za-z0-9._-])."),
    min_trajectories: Optional[int] = typer.Option(
        None, "--min-trajectories", min=1, help="The consortium's floor of trajectories per site (its "
        "`fcd consortium init --min-trajectories`; ask the coordinator). Default: the default there."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Install a site in HOME. Send the enrolment request to the coordinator and read the identity fingerprint to
    them out of band (they type it into `fcd consortium add-site`).

    A table with fewer trajectories than the consortium's floor is refused here (exit 2), before any key is made:
    the coordinator's add-site and the site's preflight would refuse it too."""
    from fcd_secure.provisioning.consortium import DEFAULT_MIN_TRAJECTORIES  # noqa: PLC0415
    from fcd_secure.provisioning.site_install.home import init_site  # noqa: PLC0415

    from fcd_secure.cli.tables import spec_and_table  # noqa: PLC0415

    spec, table = spec_and_table(spec, table, required=True)
    floor = DEFAULT_MIN_TRAJECTORIES if min_trajectories is None else min_trajectories
    with bad_input("fcd data validate --spec SPEC --table TABLE shows what the table lacks; a consortium with a "
                   "lower floor: pass it as --min-trajectories"):
        res = init_site(home, spec, table, site_id, min_trajectories=floor)
    done(as_json, res, f"site {site_id} installed" + (f" in {home}" if as_json else ""),
         [("enrolment request (send to the coordinator)", res["request"]),
          ("identity fingerprint (read to the coordinator out of band)", res["identity_fingerprint"]),
          ("SuperNode key fingerprint", res["node_fingerprint"])])


@app.command("join", short_help="Verify the coordinator's bundle and pin its CA, terms and roster.")
def join(
    bundle: Path = typer.Argument(..., exists=True, dir_okay=False, help="The signed bundle from the coordinator."),
    home: Path = _HOME,
    coordinator_fingerprint: str = typer.Option(
        ..., "--coordinator-fingerprint", help="The coordinator's key fingerprint, as given to you out of band."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Join the consortium of BUNDLE: refused (exit 2) unless it verifies against the fingerprint you typed."""
    from fcd_secure.provisioning.site_install.home import join_site  # noqa: PLC0415

    with bad_input("ask the coordinator for a fresh bundle and check the fingerprint with them"):
        res = join_site(home, bundle, coordinator_fingerprint)
    done(as_json, res, f"site {res['site_id']} joined " + ("" if as_json else "consortium ") + res["consortium_id"],
         [("CA pinned", res["ca_fingerprint"]), ("app pinned", res["app_fab_sha256"])])


@app.command("preflight", short_help="Is this site ready? (exit 0 ready, 1 not ready, 2 usage)")
def preflight(
    home: Path = _HOME,
    timeout: float = typer.Option(5.0, "--timeout", min=0.1, help="Seconds to wait for the SuperLink."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Check the site's data against the consortium's spec, its keys, certificates, clock, telemetry, disk,
    versions and the SuperLink over TLS. Exit 0 when ready, 1 when not (each failed check says what to do)."""
    from fcd_secure.provisioning.site_install.preflight import run_preflight  # noqa: PLC0415

    with bad_input("--home must be a site's folder (fcd site init)"):
        res = run_preflight(home, timeout_s=timeout)
    code = 0 if res.ready else EXIT_FAILED
    verdict = "ready" if res.ready else "not_ready"
    msg = f"site {res.site_id}: " + ("ready" if res.ready else f"not ready ({', '.join(res.failed)})")
    if as_json:
        emit(Envelope(status=verdict, exit_code=code, error_code=None, message=msg, data=res.to_json(),
                      hint=None if res.ready else "fix each failed check and run fcd site preflight again"))
    else:
        from rich.table import Table  # noqa: PLC0415

        t = Table(title=f"preflight: site {res.site_id}", show_lines=False)
        t.add_column("check")
        t.add_column("status")
        t.add_column("detail", overflow="fold")
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in res.checks:
            t.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.message)
        con = stdout()
        con.print(t)
        con.print(("[green]" if res.ready else "[red]") + msg + "[/]", soft_wrap=True)
    raise typer.Exit(code)


@app.command("service", short_help="Write a systemd unit that runs this site.")
def service(
    home: Path = _HOME,
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write the unit (default: HOME/fcd-site-<id>.service)."),
    user: str = typer.Option("fcd-site", "--user", help="The service user the unit runs as (a dedicated system user; "
                             "create it and give it the site's home). 'root' is refused."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Write the site's systemd unit (install it with `systemctl enable --now` as root).

    The unit runs as --user (default fcd-site, never the user who wrote it), sandboxed: a private /tmp, the system
    read-only, write access to the site's home only. A site home or table under /tmp or /var/tmp would be hidden from
    the service by that private /tmp: it is named in a warning.
    """
    from fcd_secure._io import atomic_write_text  # noqa: PLC0415
    from fcd_secure.provisioning.site_install.home import SiteHome  # noqa: PLC0415
    from fcd_secure.provisioning.site_install.service import hidden_paths, systemd_unit  # noqa: PLC0415

    if user.strip() in ("", "root", "0"):
        raise CliError(f"--user {user!r}: the site's service must not run as root", "USAGE",
                       hint="create a system user for it, e.g. useradd --system fcd-site, and pass --user fcd-site")
    with bad_input("--home must be a site's folder (fcd site init)"):
        h = SiteHome.at(home)
        path = out or h.root / f"fcd-site-{h.site_id}.service"
        warnings = hidden_paths(h)
        atomic_write_text(path, systemd_unit(h, user=user))
    if as_json:
        emit(ok({"unit": str(path), "user": user, "warnings": warnings}, f"wrote {path}"))
        return
    say_identifier(stdout(), "wrote", str(path), indent=0)
    stdout().print(f"runs as the user {escape(user)} (create it and let it read the site's home and table)",
                   soft_wrap=True)
    for w in warnings:
        stderr().print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)


@app.command("start", short_help="Start the site's SuperNode and executor (TLS, node key, own table).")
def start(
    home: Path = _HOME,
    cold: bool = typer.Option(False, "--cold", help="A fresh ClientApp process per message instead of one warm one."),
    foreground: bool = typer.Option(False, "--foreground", help="Stay attached until the processes end (systemd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Start the site: its SuperNode (pinned CA, its key, its own table) and the executor that runs only the pinned
    app."""
    from fcd_secure.provisioning.site_install.home import SiteHome  # noqa: PLC0415
    from fcd_secure.provisioning.site_install.runner import start_site  # noqa: PLC0415

    with bad_input("fcd site join first"):
        res = start_site(SiteHome.at(home), warm=not cold)
    if as_json:
        emit(ok(res, f"site {res['site_id']} started"))
    else:
        stdout().print(f"[green]ok[/] site {res['site_id']} started (SuperNode PID {res['supernode_pid']}, executor PID "
                       f"{res['executor_pid']}) -> {res['superlink']}", soft_wrap=True)
    if foreground:
        import time  # noqa: PLC0415

        from fcd_secure.provisioning.processes import alive  # noqa: PLC0415

        while alive(res["supernode_pid"]) and alive(res["executor_pid"]):
            time.sleep(2)
        raise typer.Exit(1)


@app.command("stop", short_help="Stop the site's processes (by PID).")
def stop(home: Path = _HOME, as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope.")) -> None:
    """Stop the processes this site started (by their recorded PIDs)."""
    from fcd_secure.provisioning.site_install.home import SiteHome  # noqa: PLC0415
    from fcd_secure.provisioning.site_install.runner import stop_site  # noqa: PLC0415

    with bad_input("--home must be a site's folder"):
        res = stop_site(SiteHome.at(home))
    say_stopped(as_json, res)


@app.command("status", short_help="Is the site running?")
def status(home: Path = _HOME, as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope.")) -> None:
    """The site's processes and whether they run."""
    from fcd_secure.provisioning.site_install.home import SiteHome  # noqa: PLC0415
    from fcd_secure.provisioning.site_install.runner import site_status  # noqa: PLC0415

    with bad_input("--home must be a site's folder"):
        res = site_status(SiteHome.at(home))
    say_status(as_json, res)


@app.command("migrate", short_help="Give DP ledgers older than the record secret one, keeping every record's ε.")
def migrate(home: Path = _HOME, as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope.")) -> None:
    """A site whose DP ledgers were written before `record_secret.key` existed refuses to train. This makes the
    secret and charges every record of the site's table every old ledger (each record keeps at least what it spent;
    a note beside the ledgers says what was done). Run it with the site stopped."""
    from fcd_secure.provisioning.site_install.home import SiteHome, migrate_privacy  # noqa: PLC0415

    with bad_input("--home must be a site's folder whose ledgers predate its record secret"):
        res = migrate_privacy(SiteHome.at(home))
    done(as_json, res, f"migrated {len(res['ledgers'])} ledger(s) in {res['folder']}: {res['records_charged']} "
         "records each charged every one of them", [("note", str(Path(res["folder"]) / "record_secret.migration.json"))])

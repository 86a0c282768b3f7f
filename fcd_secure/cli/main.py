"""The ``fcd`` command. Thin: each sub-command lives in its own module beside this one.

Start-up is kept short (``fcd --help`` in well under a second): the command modules import only Typer at module
level; torch, Flower, pandas, matplotlib, Opacus and the data loaders are imported inside the commands that use
them (``benchmarks/cli_startup.py`` measures it).
"""

from __future__ import annotations

import os
import sys

# Flower telemetry is on by default and posts events off-machine; the project never lets it.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import typer  # noqa: E402

import fcd_secure  # noqa: E402
from fcd_secure.cli import ablate as ablate_cli  # noqa: E402
from fcd_secure.cli import audit as audit_cli  # noqa: E402
from fcd_secure.cli import config as config_cli  # noqa: E402
from fcd_secure.cli import consortium as consortium_cli  # noqa: E402
from fcd_secure.cli import data as data_cli  # noqa: E402
from fcd_secure.cli import deploy as deploy_cli  # noqa: E402
from fcd_secure.cli import privacy as privacy_cli  # noqa: E402
from fcd_secure.cli import report as report_cli  # noqa: E402
from fcd_secure.cli import reproduce as reproduce_cli  # noqa: E402
from fcd_secure.cli import run as run_cli  # noqa: E402
from fcd_secure.cli import select as select_cli  # noqa: E402
from fcd_secure.cli import server as server_cli  # noqa: E402
from fcd_secure.cli import site as site_cli  # noqa: E402
from fcd_secure.cli import train as train_cli  # noqa: E402
from fcd_secure.cli import whatif as whatif_cli  # noqa: E402
from fcd_secure.cli.app import new_app  # noqa: E402
from fcd_secure.cli.envelope import EXIT_INTERRUPTED  # noqa: E402

app = new_app(
    help=(
        "fcd_secure: train one causal simulator across sites (Fed-CausalDiff with decoupled synchronisation), "
        "ask it what happens under a policy, and prove afterwards what left each site."
    ),
    name="fcd",
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fcd {fcd_secure.__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """fcd_secure: train one causal simulator across sites (Fed-CausalDiff with decoupled synchronisation), ask it
    what happens under a policy, and prove afterwards what left each site.

    Every command takes --help; commands with --json print one JSON envelope on stdout (errors included).
    """


app.add_typer(data_cli.app, name="data", help="Validate and describe datasets.")
app.add_typer(privacy_cli.app, name="privacy", help="Privacy budget ledgers and reports (DP-SGD).")
app.add_typer(audit_cli.app, name="audit", help="Key fingerprints; verify ledgers offline (auditors).")
app.add_typer(config_cli.app, name="config", help="The run configuration: every key, its default and description.")
app.add_typer(consortium_cli.app, name="consortium", help="Provision a consortium (coordinator): init, add-site.")
app.add_typer(site_cli.app, name="site", help="A hospital site: init, join, preflight, start, stop, service.")
app.add_typer(server_cli.app, name="server", help="The coordinator's SuperLink: start, stop, status, run.")
train_cli.register(app)
run_cli.register(app)
deploy_cli.register(app)
ablate_cli.register(app)
whatif_cli.register(app)
select_cli.register(app)
report_cli.register(app)
reproduce_cli.register(app)


def main() -> None:
    """Console-script entry point (``fcd``).

    A run stopped by Ctrl-C or SIGTERM has already printed why and saved its state; its process then leaves at once
    (``os._exit``): the simulation engine's native threads can abort the interpreter's finalisation (exit 134 instead
    of 130) once Ray has been shut down under them.
    """
    try:
        app()
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()

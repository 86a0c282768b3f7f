"""The ``fcd`` command. Thin: each sub-command lives in its own module beside this one."""

from __future__ import annotations

import os

# Flower telemetry is on by default and posts events off-machine; the project never lets it.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import typer  # noqa: E402

from fcd_secure.cli import ablate as ablate_cli  # noqa: E402
from fcd_secure.cli import audit as audit_cli  # noqa: E402
from fcd_secure.cli import data as data_cli  # noqa: E402
from fcd_secure.cli import privacy as privacy_cli  # noqa: E402
from fcd_secure.cli import run as run_cli  # noqa: E402
from fcd_secure.cli import train as train_cli  # noqa: E402
from fcd_secure.cli import whatif as whatif_cli  # noqa: E402

app = typer.Typer(
    name="fcd",
    help=(
        "fcd_secure: train one causal simulator across sites (Fed-CausalDiff with decoupled synchronisation), "
        "ask it what happens under a policy, and prove afterwards what left each site."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_cli.app, name="data", help="Validate and describe datasets (schema, DKT-Synth, real datasets).")
app.add_typer(privacy_cli.app, name="privacy", help="Privacy budget ledgers and reports (DP-SGD).")
app.add_typer(audit_cli.app, name="audit", help="Verify site and server uplink ledgers offline.")
train_cli.register(app)
run_cli.register(app)
ablate_cli.register(app)
whatif_cli.register(app)


if __name__ == "__main__":  # pragma: no cover
    app()

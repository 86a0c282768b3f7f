"""``fcd server``: the coordinator's SuperLink (start, stop, status) and the federated run on it (run).

Thin: the work is in ``fcd_secure.provisioning.server``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from fcd_secure.cli._provisioning import bad_input
from fcd_secure.cli.app import done, emit, new_app, say_status, say_stopped, stdout
from fcd_secure.cli.envelope import CliError, ok

app = new_app(help="The coordinator's SuperLink: start, stop, status, run.")

_HOME = typer.Option(..., "--home", help="The coordinator's folder (fcd consortium init).")


def _co(home: Path):
    from fcd_secure.provisioning.consortium import Coordinator  # noqa: PLC0415

    co = Coordinator(home)
    co.config()
    return co


@app.command("start", short_help="Start the SuperLink (TLS, SuperNode auth) and register the enrolled sites.")
def start(
    home: Path = _HOME,
    control_api_address: str = typer.Option(
        "127.0.0.1", "--control-api-address",
        help="The coordinator host's IP: with the SuperLink's own address, the only client the Control API answers "
        "(it shares the sites' port).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Start the SuperLink on the consortium's address with its certificate; register every enrolled site's key.
    Control API requests (flwr run, supernode register) from any address but --control-api-address get HTTP 403."""
    from fcd_secure.provisioning.server import start_server  # noqa: PLC0415

    with bad_input("fcd consortium init / add-site first"):
        co = _co(home)
        try:
            res = start_server(co, control_api_address=control_api_address)
        except RuntimeError as exc:
            raise CliError(str(exc), "RUN_FAILED") from None
    if as_json:
        emit(ok(res, f"SuperLink on {res['superlink']} (PID {res['pid']})"))
        return
    stdout().print(f"[green]ok[/] SuperLink on {res['superlink']} (PID {res['pid']}); sites registered: "
                   f"{', '.join(res['registered'])}", soft_wrap=True)


@app.command("stop", short_help="Stop the SuperLink (by PID).")
def stop(home: Path = _HOME, as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope.")) -> None:
    """Stop the processes this coordinator started (by their recorded PIDs)."""
    from fcd_secure.provisioning.server import stop_server  # noqa: PLC0415

    with bad_input("--home must be a consortium folder"):
        res = stop_server(_co(home))
    say_stopped(as_json, res)


@app.command("status", short_help="Is the SuperLink running?")
def status(home: Path = _HOME, as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope.")) -> None:
    """The coordinator's processes and whether they run."""
    from fcd_secure.provisioning.server import server_status  # noqa: PLC0415

    with bad_input("--home must be a consortium folder"):
        res = server_status(_co(home))
    say_status(as_json, res)


@app.command("run", short_help="Run the federation on the started SuperLink (run folder as fcd run writes it).")
def run(
    home: Path = _HOME,
    out: Path = typer.Option(..., "--out", help="The run folder."),
    rounds: int = typer.Option(1, "--rounds", min=1, help="Training rounds."),
    dp: bool = typer.Option(True, "--dp/--no-dp", help="DP-SGD on the sites (their policies cap ε)."),
    preset: str = typer.Option("tiny", "--preset", help="Model size preset: tiny | default | paper."),
    seed: int = typer.Option(0, "--seed", help="The run's seed."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1.0, help="Seconds to wait for the run."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Submit the consortium's pinned app: every enrolled site, secure aggregation, statistics from the secure
    round 0, each site on its own table. Writes the run folder and <out>/evidence/ (server ledger, roster, CA,
    fingerprints)."""
    from fcd_secure.provisioning.server import run_federation  # noqa: PLC0415

    if preset not in ("tiny", "default", "paper"):
        raise CliError(f"--preset {preset!r}: expected tiny, default or paper", "USAGE")
    with bad_input("fcd server start --home HOME first"):
        co = _co(home)
        try:
            summary = run_federation(co, out, rounds=rounds, dp=dp, preset=preset, seed=seed, timeout_s=timeout)
        except RuntimeError as exc:
            raise CliError(str(exc), "RUN_FAILED") from None
    data = {k: summary.get(k) for k in ("rounds", "pehe", "ate_error", "factual_auc", "wall_s", "evidence",
                                        "secure_aggregation", "standardization")}
    done(as_json, data, f"run finished; evidence in {summary['evidence']}" if as_json
         else f"run finished in {summary.get('wall_s', 0):.1f} s", [("evidence", summary["evidence"])])

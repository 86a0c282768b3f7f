"""``fcd server``: the coordinator's SuperLink (start, stop, status) and the federated run on it (run).

Thin: the work is in ``fcd_secure.provisioning.server``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from fcd_secure.cli._provisioning import bad_input
from fcd_secure.cli.app import done, emit, new_app, say_status, say_stopped, stderr, stdout
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.cli.options import SETTINGS

app = new_app(help="The coordinator's SuperLink: start, stop, status, run.")

_HOME = typer.Option(..., "--home", help="The coordinator's folder (fcd consortium init).")


def _co(home: Path):
    from fcd_secure.provisioning.consortium import Coordinator  # noqa: PLC0415

    co = Coordinator(home)
    co.config()
    return co


def missed_steps(summary: dict) -> dict[str, list[str]]:
    """Per site (by name), the steps of the run it failed or did not answer in, in words: ``round(s) 2, 3``, ``the
    setup (round 0)``, ``the final evaluation``. Protocol round ``rounds + 1`` is the final evaluation and its closing
    receipts (``apps.server_app.TrainingLoop.closing_round``), never a training round."""
    last = int(summary.get("rounds") or 0)
    by_site: dict[str, set[int]] = {}
    for e in summary.get("site_errors") or []:
        by_site.setdefault(str(e.get("site_id")), set()).add(int(e.get("round", 0)))
    out: dict[str, list[str]] = {}
    for site, rounds in by_site.items():
        trained = sorted(r for r in rounds if 0 < r <= last or not last)
        steps = ["the setup (round 0)"] if 0 in rounds and last else []
        if trained:
            steps.append(f"round(s) {', '.join(map(str, trained))}")
        if last and any(r > last for r in rounds):
            steps.append("the final evaluation")
        out[site] = steps
    return out


def run_warnings(summary: dict, home: Path) -> list[str]:
    """What a finished deployment run's summary says that its one-line "run finished" would hide: a run resumed
    from the coordinator's checkpoint instead of trained, sites that failed during training, a final evaluation that
    was aborted or that some sites did not answer (the answers then cover the other sites only, or none)."""
    out: list[str] = []
    k = summary.get("resumed_from_round") or 0
    if k:
        out.append(f"resumed from round {k} of the checkpoint in {home / 'server' / 'state'} (a run with the same "
                   "training settings continues it; rounds beyond it trained now)")
    aborted = summary.get("rounds_aborted") or 0
    if aborted:
        out.append(f"{aborted} of {summary.get('rounds')} round(s) aborted (Θc unchanged in them): rounds.csv "
                   "(aborted_reason) says why")
    for site, steps in sorted(missed_steps(summary).items()):
        out.append(f"site {site} failed in {', '.join(steps)}; rounds.csv and summary.json (site_errors) say what "
                   "it missed")
    if summary.get("final_eval_aborted"):
        out.append(f"final evaluation aborted: {summary['final_eval_aborted']}; no answer is reported. Restart the "
                   "missing site(s) (fcd site start) and run the same command again: it resumes from the checkpoint "
                   "and evaluates")
    else:
        for key, what in (("failed_sites_final_eval", "failed"), ("declined_sites_final_eval", "declined")):
            if summary.get(key):
                out.append(f"the answers leave out site(s) {', '.join(map(str, summary[key]))}: they {what} the "
                           "final evaluation")
    return out


#: what to change when the consortium's minimum site policy refuses a run, by the refused config field
_POLICY_HINTS = {
    "dp.enabled": "leave out --no-dp: the consortium's sites train only with DP-SGD (their policy's [dp] required)",
}


def _refuse_below_minimum(co, out: Path, **settings) -> None:
    """Exit 2 before anything is submitted when the run asks for less than the consortium's minimum site policy.

    Every enrolled site holds at least that policy (``fcd site join`` refuses a weaker one) and refuses such a run
    at its first message; the ServerApp then fails, and the coordinator would only learn it from ``flwr log``. A
    site may be stricter than the minimum: that refusal still comes from the site, mid-run.
    """
    from fcd_secure.provisioning.server import run_config_for  # noqa: PLC0415

    if not co.enrolled():
        raise CliError(f"{co.home}: no site enrolled yet", "USAGE", hint="fcd consortium add-site, then fcd server start")
    from fcd_secure.federation.state import ServerCheckpoint  # noqa: PLC0415

    from fcd_secure.config import ConfigError  # noqa: PLC0415

    try:
        cfg = run_config_for(co, out, **settings)
    except ConfigError as exc:
        raise CliError(str(exc), "USAGE", hint="fcd config show lists every key; the consortium fixes the data, "
                       "the sites, secure aggregation and the folders") from None
    minimum = co.config().site_policy
    share = cfg.dp.run_epsilon
    if share is not None and share > minimum.dp.epsilon_cap:
        raise CliError(f"--dp-epsilon {share:g}: above every site's lifetime cap under the consortium's minimum "
                       f"policy (ε {minimum.dp.epsilon_cap:g}); no site can have that much left", "USAGE",
                       hint="ask for a share of the cap; each site refuses a share above what it has left "
                       "(fcd privacy report at the site says how much)")
    _, refusal = minimum.admit(cfg)
    if refusal is not None:
        raise CliError(
            f"{refusal.key}: the consortium's minimum site policy ({co.config_path}, [site_policy]) refuses this run; "
            "every site would refuse it before any training", "USAGE",
            hint=_POLICY_HINTS.get(refusal.key, f"change the run's {refusal.key} to what [site_policy] allows"))
    # every `fcd server run` of a consortium shares one server state folder: a checkpoint there continues a run with
    # the same training settings (rounds may grow) and makes the ServerApp fail at once on any other
    ckpt = ServerCheckpoint(cfg.state_dir)
    if ckpt.exists():
        last, _, _, trained, _ = ckpt.load()
        if trained != cfg.training_hash():
            raise CliError(
                f"{ckpt.path}: the checkpoint (round {last}) is of a run with other training settings (--seed, "
                "--preset or --dp); a run on it would fail at once", "USAGE",
                hint="repeat that run's settings to continue it, or move the checkpoint aside to train anew (the "
                "earlier run folder keeps its results; the sites' DP budgets are what they are)")


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

    with bad_input("the message says what to do (fcd consortium init, add-site, ca.key offline: docs/hospital.md)"):
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
    dp_epsilon: Optional[float] = typer.Option(
        None, "--dp-epsilon", min=1e-6,
        help="The ε this run may add to each site's spend: a share of each site's lifetime cap. A site with less "
        "left refuses the run (exit 5). Default: up to each site's cap (one run may spend it all).",
    ),
    settings: Optional[list[str]] = SETTINGS,
    timeout: float = typer.Option(1800.0, "--timeout", min=1.0, help="Seconds to wait for the run."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Submit the consortium's pinned app: every enrolled site, secure aggregation, statistics from the secure
    round 0, each site on its own table. Writes the run folder and <out>/evidence/ (server ledger, roster, CA,
    fingerprints). Exits as `fcd run` does when the run has no answer: 5 when a site's DP budget stopped it, 1 when
    the final evaluation failed or did not run."""
    from fcd_secure.provisioning.server import run_config_for, submit_run  # noqa: PLC0415

    if preset not in ("tiny", "default", "paper"):
        raise CliError(f"--preset {preset!r}: expected tiny, default or paper", "USAGE")
    run_settings = dict(rounds=rounds, dp=dp, preset=preset, seed=seed, dp_epsilon=dp_epsilon,
                        settings=list(settings or []))
    with bad_input("fcd server start --home HOME first"):
        co = _co(home)
        _refuse_below_minimum(co, out, **run_settings)
        try:
            summary = submit_run(co, out, timeout_s=timeout, **run_settings)
        except RuntimeError as exc:
            raise CliError(str(exc), "RUN_FAILED") from None
    data = {k: summary.get(k) for k in ("rounds", "pehe", "ate_error", "factual_auc", "wall_s", "evidence",
                                        "secure_aggregation", "standardization", "resumed_from_round")}
    data["warnings"] = run_warnings(summary, co.home)
    if not as_json:
        for w in data["warnings"]:
            stderr().print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    from fcd_secure.cli.run import outcome  # noqa: PLC0415

    failed = outcome(summary, run_config_for(co, out, **run_settings))
    if failed is not None:  # no answer (or none from some sites): the exit code says so, as fcd run's does
        failed.data = {**summary, **data}
        raise failed
    done(as_json, data, f"run finished; evidence in {summary['evidence']}" if as_json
         else f"run finished in {summary.get('wall_s', 0):.1f} s", [("evidence", summary["evidence"])])

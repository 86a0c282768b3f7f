"""`fcd privacy` sub-commands: the privacy budget report, a σ planner, and the operator's acknowledgement of a lost or
rolled-back ledger (thin: parse, call, print)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fcd_secure.cli.app import emit, new_app, say_identifier, stdout
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.cli.resolve import PRESET_HELP, RunOptions, resolve_config

app = new_app(help="Privacy budget ledgers and reports (DP-SGD).")


_REPORT_HELP = (
    "Per-site and consortium privacy report: ε spent / cap / remaining at δ, σ, C, q, steps, rounds, the ledger's "
    "segments, the accountant and library versions, what is covered and what is not (stated once for all sites); "
    "with a plot of ε against rounds per site and for the consortium. ε is per record: a site's ε spent is that of "
    "its most-spent record over every run on the site (any split or seed) plus what acknowledged resets carried "
    "forward, and the per-record spend across runs (records, max, median) is listed.\n\n"
    "PATH is a run folder (every site of the run is listed; a site never sampled for a DP round has ε = 0), a sites' "
    "state root, one site's state directory, a ledger folder, or one ledger file. ε is recomputed from each site's "
    "write-ahead ledger, never taken from a cached number. A run trained without DP gets a report saying it has no "
    "DP guarantee (exit 0). A run folder without ledgers whose settings say DP was on (a deployment: each ledger "
    "stays on its site) is reported from the sites' signed privacy records in its evidence (the ledger heads each "
    "site's audit chain carries, chain and signatures checked); a site without one is 'unverified'. Exit code 2 "
    "when PATH does not exist or holds neither a ledger nor a site's signed record."
)


@app.command("report", help=_REPORT_HELP, short_help="ε per site and for the consortium, with a plot over rounds.")
def report(
    path: Annotated[
        Path,
        typer.Argument(
            help="A run folder (its summary.json may name the state root), a sites' state root, one site's state "
            "directory, or a ledger file (<site>/privacy/ledger-<fingerprint>.json).",
        ),
    ],
    out_dir: Annotated[
        Optional[Path],
        typer.Option("--out", help="Folder for privacy_report.{json,md} and privacy_epsilon.png (default: PATH)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON envelope on stdout.")] = False,
    no_files: Annotated[bool, typer.Option("--no-files", help="Print only; write no report files.")] = False,
    site_key: Annotated[Optional[list[str]], typer.Option("--site-key", metavar="FINGERPRINT", help="A pinned site key fingerprint (SHA256:<hex>) for the signed records; repeatable.")] = None,
) -> None:
    """The privacy budget report (help text: ``_REPORT_HELP``)."""
    from fcd_secure.experiments.privacy_evidence import run_privacy_report  # noqa: PLC0415
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415
    from fcd_secure.privacy.report import write_report  # noqa: PLC0415

    try:
        rep = run_privacy_report(path, site_keys=site_key or None)
    except (FileNotFoundError, PrivacyLedgerError, ValueError) as exc:
        raise CliError(str(exc), hint="give a run folder, a state folder or a privacy ledger file") from None
    written = {}
    if not no_files:
        target = out_dir if out_dir is not None else (path if path.is_dir() else path.parent)
        written = write_report(rep, target)
    if as_json:
        emit(ok(rep, rep.get("message") or f"privacy report of {len(rep['sites'])} site(s)"))
        return
    con = stdout()
    if not rep.get("dp", True):
        con.print(f"[bold]No DP guarantee.[/] {rep['message']}.")
        con.print("sites: " + ", ".join(s["site"] for s in rep["sites"]))
    elif rep.get("basis"):
        _print_signed(con, rep)
    else:
        _print_sites(con, rep)
    for kind, p in written.items():
        say_identifier(con, f"{kind}:", str(p), indent=0)


def _print_sites(con, rep: dict) -> None:
    from rich.table import Table  # noqa: PLC0415

    table = Table(title="Privacy budget (record level: one trajectory, add/remove adjacency)")
    for col in ("site", "ε spent", "cap", "left", "δ", "σ", "q", "rounds"):
        table.add_column(col, justify="left" if col == "site" else "right", no_wrap=col == "site")
    for s in rep["sites"]:
        if s.get("ledger") is None:
            cap = "" if s.get("epsilon_cap") is None else f"{s['epsilon_cap']:g}"
            table.add_row(s["site"], "0", cap, cap, "", "", "", "0")
            continue
        m = s["mechanism"]
        table.add_row(
            s["site"], f"{s['epsilon_spent']:.3f}", f"{s['epsilon_cap']:g}", f"{s['epsilon_remaining']:.3f}",
            f"{s['delta']:.3g}", ", ".join(f"{x:.3g}" for x in m["noise_multipliers"]),
            ", ".join(f"{x:.3g}" for x in m["sample_rate_q"]), str(m["rounds"]),
        )
    con.print(table)
    c = rep["consortium"]
    con.print(
        f"Consortium: ε = {c['epsilon']:.3f}, δ = {c['delta']:.3g} (parallel composition over {c['sites']} sites; "
        f"worst site {c.get('worst_site')})",
    )
    r = rep.get("records") or {}
    if r.get("records"):
        carried = f", {r['carried_from_resets']:.3f} of it carried by acknowledged resets" if r["carried_from_resets"] else ""
        con.print(f"Per record, across runs: {r['records']} records; ε max {r['max']:.3f}, median {r['median']:.3f}"
                  f"{carried}")
    common = rep["common"]
    con.print("Accountant: " + "; ".join(common["accountants"]))
    never = [s["site"] for s in rep["sites"] if s.get("ledger") is None]
    if never:
        con.print(f"Never trained under DP (ε = 0): {', '.join(never)}")


def _print_signed(con, rep: dict) -> None:
    """The report of a run whose ledgers stay on the sites: ε per site as each site signed it."""
    from rich.table import Table  # noqa: PLC0415

    table = Table(title="Privacy budget from the sites' signed records (record level: one trajectory)")
    for col in ("site", "ε spent", "any record ≤", "cap", "left", "record"):
        table.add_column(col, justify="left" if col in ("site", "record") else "right", no_wrap=col == "site")
    for s in rep["sites"]:
        known = s["epsilon_spent"] is not None
        table.add_row(s["site"], f"{s['epsilon_spent']:.3f}" if known else "–",
                      f"{s['epsilon_any_record']:.3f}" if known else "–",
                      "" if s["epsilon_cap"] is None else f"{s['epsilon_cap']:g}",
                      f"{s['epsilon_remaining']:.3f}" if known and s["epsilon_remaining"] is not None else "–",
                      s["status"])
    con.print(table)
    con.print(f"Basis: {rep['basis_note']}.", soft_wrap=True)
    if rep["unverified"]:
        con.print(f"[bold]unverified[/]: {', '.join(rep['unverified'])}: DP was on, but no intact signed privacy "
                  "record of theirs is here (run `fcd privacy report SITE_STATE` at each)", soft_wrap=True)


_PLAN_HELP = (
    "The noise multiplier σ a site would use for a planned use of its data: rounds × a round's passes × ⌈N/B⌉ "
    "Poisson steps, the passes being those `federation.learner.round_epochs` makes of the local epochs and "
    "`federation.min_local_steps`, as the site counts them; planned once for the whole use, as the sites do (never "
    "per round).\n\n"
    "The use is the run's: with --dataset, --preset or --config the rounds, local epochs, minimum local steps and "
    "batch size are those `fcd run` would train with (the preset, the world's own defaults, the file), so a plan for "
    "`fcd run --dataset tumour` counts the 32 optimiser steps a round that world trains by default, and ε, δ and the "
    "accountant are the run's `[dp]` ones. An option given here overrides only what it names. Without any of the "
    "three: 20 rounds, 1 local epoch, no minimum, batch 64, ε 8, prv. The plan is the whole cap's; a run that asks "
    "for a share of it (`dp.run_epsilon`) plans that share."
)
#: the planned use when the command names no run (the plan's own defaults, kept from before runs could be named)
_PLAN_DEFAULTS = {"rounds": 20, "local_epochs": 1, "min_local_steps": 0, "batch_size": 64}


@app.command("plan", help=_PLAN_HELP, short_help="The noise multiplier σ for a planned use of a site's data.")
def plan(
    trajectories: Annotated[int, typer.Option("--trajectories", min=1, help="Trajectories at the site (its dataset's N).")],
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", min=1,
        help="Expected Poisson batch size (default: the run's model.batch_size, else 64).")] = None,
    rounds: Annotated[Optional[int], typer.Option(
        "--rounds", min=1, help="Planned federated rounds (default: the run's, else 20).")] = None,
    local_epochs: Annotated[Optional[int], typer.Option(
        "--local-epochs", min=1, help="Local epochs per round (default: the run's, else 1).")] = None,
    min_local_steps: Annotated[
        Optional[int],
        typer.Option("--min-local-steps", min=0, help="The run's federation.min_local_steps: a round makes whole "
                     "passes until it has made this many steps, so the plan counts those passes (default: the "
                     "run's, e.g. 32 for the tumour and carry-over worlds; else 0: off)."),
    ] = None,
    dataset: Annotated[Optional[str], typer.Option(
        "--dataset", help="Plan the use `fcd run --dataset D` makes (its preset's and world's defaults).")] = None,
    preset: Annotated[Optional[str], typer.Option(
        "--preset", help=f"Plan a run of this preset: {PRESET_HELP}.")] = None,
    config_file: Annotated[Optional[Path], typer.Option(
        "--config", exists=True, dir_okay=False,
        help="Plan the use of this run config (e.g. a run's config.toml).")] = None,
    epsilon: Annotated[Optional[float], typer.Option(
        "--dp-epsilon", min=0.01, help="Lifetime ε cap of the site's dataset (default: the named run's dp.epsilon, "
        "else 8).")] = None,
    delta: Annotated[Optional[float], typer.Option(
        "--dp-delta", help="DP δ (default: the named run's dp.delta, else a power of ten ≤ 1/(10·N)).")] = None,
    accountant: Annotated[Optional[str], typer.Option(
        "--accountant", help="prv or rdp (default: the named run's dp.accountant, else prv).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON envelope on stdout.")] = False,
) -> None:
    from pydantic import ValidationError  # noqa: PLC0415

    from fcd_secure.federation.learner import round_epochs  # noqa: PLC0415

    from fcd_secure.privacy.config import DPConfig  # noqa: PLC0415
    from fcd_secure.privacy.planner import plan_noise_multiplier, sample_rate, steps_per_epoch  # noqa: PLC0415

    use = dict(_PLAN_DEFAULTS)
    source = "the plan's defaults"
    dp_eps, dp_delta, dp_acc = 8.0, None, "prv"
    if dataset is not None or preset is not None or config_file is not None:
        if dataset == "spec":
            raise CliError("a table of one's own needs its spec and table: name the run with --config "
                           "(a run's config.toml)", "USAGE")
        cfg = resolve_config(RunOptions(preset=preset, dataset=dataset, config_file=config_file))
        use = {"rounds": cfg.federation.rounds, "local_epochs": cfg.federation.local_epochs,
               "min_local_steps": cfg.federation.min_local_steps, "batch_size": cfg.model.batch_size}
        dp_eps, dp_delta, dp_acc = cfg.dp.epsilon, cfg.dp.delta, cfg.dp.accountant
        source = f"the run's: {cfg.data.dataset}, preset {cfg.preset}" + (
            f", {config_file}" if config_file is not None else "")
    epsilon = dp_eps if epsilon is None else epsilon
    delta = dp_delta if delta is None else delta
    accountant = dp_acc if accountant is None else accountant
    given = {"rounds": rounds, "local_epochs": local_epochs, "min_local_steps": min_local_steps,
             "batch_size": batch_size}
    use.update({k: v for k, v in given.items() if v is not None})
    try:
        cfg_dp = DPConfig(enabled=True, epsilon=epsilon, delta=delta, accountant=accountant)  # type: ignore[arg-type]
        d = cfg_dp.resolve_delta(trajectories)
        q = sample_rate(trajectories, use["batch_size"])
        passes = round_epochs(use["local_epochs"], use["min_local_steps"], trajectories, use["batch_size"])
        per_pass = steps_per_epoch(trajectories, use["batch_size"])
        steps = use["rounds"] * passes * per_pass
        sigma = plan_noise_multiplier(epsilon_cap=epsilon, delta=d, q=q, planned_steps=steps, accountant=accountant)
    except (ValidationError, ValueError) as exc:
        raise CliError(str(exc)) from None
    result = {"sigma": sigma, "q": q, "steps": steps, "passes_per_round": passes, "delta": d, "epsilon_cap": epsilon,
              "accountant": accountant, "use": use}
    text = (f"σ = {sigma:.4f} for ε ≤ {epsilon:g} at δ = {d:.3g} over {steps} Poisson steps "
            f"({use['rounds']} rounds × {passes} pass(es) × {per_pass}; q = {q:.4g}, {accountant}); "
            f"local epochs {use['local_epochs']}, min local steps {use['min_local_steps']}, "
            f"batch {use['batch_size']} ({source}, options given win)")
    if as_json:
        emit(ok(result, text))
    else:
        stdout().print(text, soft_wrap=True)


_ACK_HELP = (
    "Acknowledge that a site's privacy ledger was deleted or restored from an older copy, so the site may train "
    "again.\n\n"
    "A site refuses to train while a ledger holds less than its anchor (<state>/privacy_anchor.json) records: the "
    "same records would otherwise get a fresh ε budget without trace. This command records, for every such ledger, "
    "a reset (reason, operator, time and the head that was lost: segments, steps, ε) in the anchor and re-anchors "
    "the ledger as it now is. The reset is not forgotten: `fcd privacy report` lists it, and the site's next upload "
    "carries it into its signed audit chain, where `fcd audit verify` reports it. The ε the lost ledger held is "
    "carried forward: it is charged to every record the site trains afterwards, so a reset never raises what is "
    "left of a budget. A ledger deleted together with the anchor is found in the site's own audit chain "
    "(<state>/slots/site_ledger.jsonl), which recorded its head with every upload.\n\n"
    "Exit 0: resets recorded. Exit 2: no anchor in SITE_STATE_DIR, no ledger behind its anchor, or an empty reason."
)


@app.command("acknowledge-reset", help=_ACK_HELP, short_help="Record why a lost or rolled-back ledger was reset.")
def acknowledge_reset(
    state_dir: Annotated[Path, typer.Argument(metavar="SITE_STATE_DIR", help="The site's state directory.")],
    reason: Annotated[str, typer.Option("--reason", help="Why the ledger was lost or rolled back (recorded).")],
    operator: Annotated[
        Optional[str], typer.Option("--operator", help="Who acknowledges (recorded; default: the login name).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON envelope (the recorded resets in data).")] = False,
) -> None:
    """Record an operator's acknowledgement of a lost or rolled-back privacy ledger (help text: ``_ACK_HELP``)."""
    from fcd_secure.federation.learner import privacy_witness  # noqa: PLC0415
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415
    from fcd_secure.privacy.ledger import acknowledge_reset as _acknowledge  # noqa: PLC0415

    if not state_dir.is_dir():
        raise CliError(f"{state_dir}: no such site state directory")
    try:
        records = _acknowledge(state_dir, reason, operator, witnessed=privacy_witness(state_dir))
    except (FileNotFoundError, PrivacyLedgerError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if not records:
        raise CliError(f"{state_dir}: every anchored privacy ledger is intact; nothing to acknowledge")
    if as_json:
        emit(ok([r.model_dump(mode="json") for r in records], f"{len(records)} reset(s) recorded"))
        return
    con = stdout()
    for r in records:
        now = "missing" if r.current is None else f"{r.current.segments} segment(s)"
        con.print(
            f"reset of ledger {r.previous.key}: it held {r.previous.segments} segment(s), {r.previous.steps} steps, "
            f"ε ≈ {r.previous.epsilon:.3f}; now {now}. Recorded by {r.operator}: {r.reason}", soft_wrap=True,
        )

"""`fcd run` (the main federated job) and `fcd deploy` (local deployment)."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

PRESET_HELP = "tiny (tests, seconds) | default (README run, ≤ 5 min on 2 cores) | paper (Table II length)"


def _fail(console: Console, msg: str, code: int = 2) -> None:
    console.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


def resolve_config(
    *,
    preset: str,
    config_file: Optional[Path],
    rounds: Optional[int],
    sites: Optional[int],
    clients_per_round: Optional[int],
    seed: Optional[int],
    dataset: Optional[str],
    spec: Optional[tuple[Path, Path]],
    data_dir: Optional[Path],
    secure: Optional[bool],
    sync: Optional[str],
    eval_every: Optional[int],
    state_dir: Optional[Path],
    out: Optional[Path],
    dp_epsilon: Optional[float] = None,
    dp_delta: Optional[float] = None,
    dp_clip: Optional[float] = None,
    dp_ledger_dir: Optional[Path] = None,
    policies: Optional[list[str]] = None,
    reference: Optional[str] = None,
):
    """Preset (or config file) + command-line overrides -> a validated ``RunConfig``.

    Secure aggregation is on unless ``secure`` is ``False`` or the config file turns it off.
    """
    from fcd_secure.config import RunConfig, build_config  # noqa: PLC0415

    base = RunConfig.load(config_file) if config_file else None
    over: dict[str, Any] = {"data": {}, "federation": {}}
    if rounds is not None:
        over["federation"]["rounds"] = rounds
    if sites is not None:
        over["data"]["n_sites"] = sites
        if clients_per_round is None:
            over["federation"]["clients_per_round"] = max(1, sites // 2)  # Table II: half the sites per round
    if clients_per_round is not None:
        over["federation"]["clients_per_round"] = clients_per_round
    if seed is not None:
        over["seed"] = seed
    if dataset is not None:
        over["data"]["dataset"] = dataset
    if spec is not None:
        over["data"].update(dataset="spec", spec=str(spec[0]), table=str(spec[1]))
    if data_dir is not None:
        over["data"]["data_dir"] = str(data_dir)
    if secure is None:
        secure = True if base is None else base.federation.secure_aggregation
    over["federation"]["secure_aggregation"] = bool(secure)
    if sync is not None:
        over["federation"]["sync"] = sync
    if eval_every is not None:
        over["federation"]["eval_every"] = eval_every
    if state_dir is not None:
        over["state_dir"] = str(state_dir)
    dp: dict[str, Any] = {}
    if dp_epsilon is not None:  # DP-SGD on every site with this lifetime cap
        dp.update(enabled=True, epsilon=dp_epsilon)
    if dp_delta is not None:
        dp["delta"] = dp_delta
    if dp_clip is not None:
        dp["clip"] = dp_clip
    if dp_ledger_dir is not None:
        dp["ledger_dir"] = str(dp_ledger_dir)
    if dp:
        over["dp"] = dp
    if policies:
        over["evaluation"] = {"policies": [str(p) for p in policies]}
    if reference is not None:
        over.setdefault("evaluation", {})["reference"] = reference
    cfg = build_config(preset, over, base=base)
    if out is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{stamp}-{cfg.data.dataset}-seed{cfg.seed}"
    return cfg.model_copy(update={"out": str(out)})


def summary_table(summary: dict, title: str = "Fed-CausalDiff") -> Table:
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")

    def fmt(v: Any) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:.4f}"
        return str(v)

    for key, label in (
        ("pehe", "PEHE (oracle)"),
        ("ate_error", "|ATE error| (oracle)"),
        ("value_error_mean", "|value error| mean over policies"),
        ("factual_auc", "factual AUC"),
    ):
        if summary.get(key) is not None:
            t.add_row(label, fmt(summary[key]))
    for name, d in (summary.get("policies") or {}).items():
        parts = [f"sim {fmt(d.get('value_sim'))}"]
        if d.get("value_true") is not None:
            parts.append(f"true {fmt(d['value_true'])}")
        for est in sorted((e for e in d if e.startswith("dr")), key=len):  # dr (full horizon), dr_h<H> (truncated)
            dr = d[est]
            label = "DR" if est == "dr" else f"DR first {est.split('_h')[1]} steps"
            parts.append(f"{label} {fmt(dr.get('value'))} (ESS {fmt(dr.get('ess'))})")
        t.add_row(escape(f"value[{name}]"), ", ".join(parts))
    t.add_row("rounds", fmt(summary.get("rounds")))
    t.add_row("uplink MB (measured, serialized messages)", f"{summary['uplink_bytes'] / 1e6:.3f}")
    t.add_row("uplink MB (paper formula: sites × sync params)", f"{summary['uplink_formula_bytes'] / 1e6:.3f}")
    t.add_row("downlink MB (measured)", f"{summary['downlink_bytes'] / 1e6:.3f}")
    t.add_row("wall time s", f"{summary['wall_s']:.1f}")
    return t


class _Progress:
    """Rich progress bar driven by the ServerApp's progress events (one tick per finished round)."""

    def __init__(self, console: Console, rounds: int, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            disable=not enabled,
        )
        self.task = self.progress.add_task("starting sites", total=rounds, info="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def __call__(self, event: str, info: dict) -> None:
        if event == "connected":
            self.progress.update(self.task, description="rounds", info=f"{len(info['sites'])} sites")
        elif event == "resumed":
            self.progress.update(self.task, completed=info["round"], info=f"resumed after round {info['round']}")
        elif event == "round":
            bits = [f"up {info['cum_uplink_bytes'] / 1e6:.2f} MB"]
            if info.get("train_loss") is not None:
                bits.append(f"loss {info['train_loss']:.3f}")
            if info.get("pehe") is not None:
                bits.append(f"PEHE {info['pehe']:.4f}")
            self.progress.update(self.task, completed=info["round"], info=" · ".join(bits))
        elif event == "evaluating":
            self.progress.update(self.task, description="federated evaluation", info="")


def _common_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean bad input (exit 2): config, data, state, or a flow that refuses the configuration."""
    from pydantic import ValidationError  # noqa: PLC0415

    from fcd_secure.config import ConfigError  # noqa: PLC0415
    from fcd_secure.data.schema import SchemaError  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415
    from fcd_secure.federation.secure_setup import SecureAggregationConfigError  # noqa: PLC0415
    from fcd_secure.federation.state import StateError  # noqa: PLC0415

    return (ConfigError, SchemaError, DataError, StateError, SecureAggregationConfigError, ValidationError, FileNotFoundError)


def register(app: typer.Typer) -> None:
    """Attach ``fcd run`` and ``fcd deploy`` to the root app."""

    @app.command("run")
    def run(
        preset: str = typer.Option("default", "--preset", help=PRESET_HELP),
        rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Global communication rounds (preset default)."),
        sites: Optional[int] = typer.Option(None, "--sites", min=1, help="Number of sites N (paper: 10)."),
        clients_per_round: Optional[int] = typer.Option(None, "--clients-per-round", min=1, help="Sites sampled per round (default N/2)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Seed of split, initialisation, sampling and training."),
        dataset: Optional[str] = typer.Option(None, "--dataset", help="dkt-synth (default; oracle metrics) | statics2011 | assistments2009 | diabetes130 | obd (OPE estimates, factual AUC)."),
        spec: Optional[tuple[Path, Path]] = typer.Option(None, "--spec", metavar="SPEC TABLE", help="Your own data: a dataset spec file and the table it describes."),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Real datasets root (default ../shared/data)."),
        secure: Optional[bool] = typer.Option(None, "--secure-aggregation/--no-secure-aggregation", help="Pairwise-masked secure aggregation of Θc (default: on) or plain FedAvg.", show_default=False),
        sync: Optional[str] = typer.Option(None, "--sync", help="dss (only Θc leaves a site; the paper's method) | full (every parameter; w/o-DSS ablation)."),
        eval_every: Optional[int] = typer.Option(None, "--eval-every", min=0, help="Cheap federated PEHE every N rounds (0: only at the end)."),
        config_file: Optional[Path] = typer.Option(None, "--config", exists=True, dir_okay=False, help="A run config (TOML/JSON, e.g. a run folder's config.toml); options override it."),
        state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Per-site state, server checkpoint, audit ledgers (default <out>/state). Reuse it to resume a killed run."),
        out: Optional[Path] = typer.Option(None, "--out", help="Run folder (default runs/<timestamp>-<dataset>-seed<seed>/)."),
        as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout instead of the table."),
        dp_epsilon: Optional[float] = typer.Option(None, "--dp-epsilon", min=0.01, help="DP-SGD (Opacus) on every site, with this lifetime ε cap per site dataset; a round that would exceed it is refused."),
        dp_delta: Optional[float] = typer.Option(None, "--dp-delta", help="DP δ (default: a power of ten ≤ 1/(10·n_site))."),
        dp_clip: Optional[float] = typer.Option(None, "--dp-clip", min=1e-6, help="DP-SGD per-sample clipping norm C (default 1.0)."),
        dp_ledger_dir: Optional[Path] = typer.Option(None, "--dp-ledger-dir", help="Persistent privacy-ledger folder, so a new run on the same data cannot reset the budget (default: inside --state-dir)."),
        policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="A policy to simulate at the end (a .toml file or a shipped name: never, always, early_on, late_on); repeat for several. Default: [evaluation] policies, else the paper's four."),
        reference: Optional[str] = typer.Option(None, "--reference", help="The name of the policy the others are contrasted with (default: the first)."),
    ) -> None:
        """Train Fed-CausalDiff across N sites with decoupled synchronisation (only Θc leaves a site) on Flower's
        simulation engine, evaluate it federatedly, and write a run folder (config, theta_c.npz, per-round metrics,
        summary.json, Figs. 3–4).

        Exit codes: 0 done, 2 bad input (config, data, state), 1 the run failed.
        """
        import torch  # noqa: PLC0415

        from fcd_secure.cli.whatif import anchors_line, whatif_table  # noqa: PLC0415
        from fcd_secure.federation.flows import check_flow  # noqa: PLC0415
        from fcd_secure.federation.whatif import check_policies, request_from_config  # noqa: PLC0415

        console = Console(stderr=as_json)
        try:
            cfg = resolve_config(
                preset=preset, config_file=config_file, rounds=rounds, sites=sites, clients_per_round=clients_per_round,
                seed=seed, dataset=dataset, spec=spec, data_dir=data_dir, secure=secure, sync=sync,
                eval_every=eval_every, state_dir=state_dir, out=out,
                dp_epsilon=dp_epsilon, dp_delta=dp_delta, dp_clip=dp_clip, dp_ledger_dir=dp_ledger_dir,
                policies=policy, reference=reference,
            )
            check_flow(cfg)  # a secure-mode misconfiguration is a clear error before any engine starts
            # the policy files parse, the reference is one of them and their labels are the data's, before any engine
            check_policies(cfg, request_from_config(cfg).policies)
        except _common_errors() as exc:
            _fail(console, str(exc))
        torch.set_num_threads(1)  # the sites share the machine's cores through one Ray actor
        from fcd_secure.federation.simulation import run_simulated  # noqa: PLC0415

        mode = "secure aggregation" if cfg.federation.secure_aggregation else "plain FedAvg"
        console.print(
            f"[bold]fcd run[/bold] {cfg.data.dataset} ({cfg.data.preset}), {cfg.data.n_sites} sites, "
            f"{cfg.federation.clients_per_round}/round, {cfg.federation.rounds} rounds, sync={cfg.federation.sync}, {mode}, seed {cfg.seed}"
        )
        try:
            with _Progress(console, cfg.federation.rounds, enabled=sys.stderr.isatty() or not as_json) as prog:
                run_simulated(cfg, progress=prog)
        except _common_errors() as exc:
            _fail(console, str(exc))
        summary = json.loads((Path(cfg.out) / "summary.json").read_text())
        if as_json:
            typer.echo(json.dumps(summary))
        else:
            console.print(summary_table(summary, title=f"Fed-CausalDiff on {cfg.data.dataset}"))
            if anchors_line(summary.get("anchors")):
                console.print(f"anchors: {escape(anchors_line(summary['anchors']))}")
            if summary.get("policies"):
                console.print(whatif_table(summary))
            console.print(f"run folder: {cfg.out}")

    @app.command("deploy")
    def deploy(
        preset: str = typer.Option("tiny", "--preset", help=PRESET_HELP),
        sites: int = typer.Option(3, "--sites", min=1, help="SuperNodes (one per site) to start on 127.0.0.1."),
        rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Rounds (preset default)."),
        clients_per_round: Optional[int] = typer.Option(None, "--clients-per-round", min=1, help="Sites per round (default all)."),
        seed: int = typer.Option(0, "--seed", help="Seed."),
        port: int = typer.Option(0, "--port", help="SuperLink port (Fleet + Control APIs; keep it private); 0 picks a free one."),
        workdir: Optional[Path] = typer.Option(None, "--workdir", help="Folder for FLWR_HOMEs, logs, app project, site states (default: a temp dir)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Run folder."),
        secure: Optional[bool] = typer.Option(False, "--secure-aggregation/--no-secure-aggregation", help="Secure aggregation of Θc."),
        tls_dir: Optional[Path] = typer.Option(None, "--tls-dir", help="ca.crt, server.pem, server.key: run the SuperLink with TLS (default --insecure)."),
        keep: bool = typer.Option(False, "--keep", help="Leave the SuperLink and SuperNodes running after the run."),
        timeout_s: float = typer.Option(1800, "--timeout", help="Give up after this many seconds."),
        as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout."),
    ) -> None:
        """Run the same app under Flower's Deployment Engine on this machine: one SuperLink and one SuperNode
        process per site on 127.0.0.1 (each with its own FLWR_HOME and node config carrying its site id and
        state directory), then `flwr run`. Every process is stopped by PID at the end (unless --keep).
        """
        from fcd_secure.federation.deployment import LocalDeployment  # noqa: PLC0415
        from fcd_secure.federation.flows import check_flow  # noqa: PLC0415

        console = Console(stderr=as_json)
        try:
            cfg = resolve_config(
                preset=preset, config_file=None, rounds=rounds, sites=sites,
                clients_per_round=clients_per_round or sites, seed=seed, dataset=None, spec=None, data_dir=None,
                secure=secure, sync=None, eval_every=0, state_dir=None, out=out,
            )
        except _common_errors() as exc:
            _fail(console, str(exc))
        try:
            check_flow(cfg)
        except _common_errors() as exc:
            _fail(console, str(exc))
        cfg = cfg.model_copy(update={"out": str(Path(cfg.out).resolve())})
        with LocalDeployment(cfg, workdir=workdir, port=port, tls_dir=tls_dir, keep=keep, log=console.print) as dep:
            dep.start()
            summary = dep.run(timeout_s=timeout_s)
        if as_json:
            typer.echo(json.dumps(summary))
        else:
            console.print(summary_table(summary, title="Fed-CausalDiff (deployment engine)"))
            console.print(f"run folder: {cfg.out}")

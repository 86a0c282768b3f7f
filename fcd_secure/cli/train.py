"""`fcd train` (centralised reference training): Fed-CausalDiff and two baselines on pooled DKT-Synth, scored
against the oracle's ground truth. Thin: parse, call ``fcd_secure.model.reference.run_centralised``, print."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

_out = Console()
_err = Console(stderr=True)

PRESETS = ("tiny", "default", "paper")


def _tables(res: dict) -> list[Table]:
    truth = res["truth"]
    names = list(truth["values"])
    t = Table(
        title=(
            f"Centralised reference, DKT-Synth '{res['preset']}' (seed {res['seed']}, {res['epochs']} epochs, "
            f"{res['n_train']} train / {res['n_test']} test)"
        ),
        caption="PEHE = √mean(τ̂−τ)²; errors are absolute, lower is better.",
    )
    for col, just in (("method", "left"), ("PEHE", "right"), ("|ATE err|", "right"), ("ATE est.", "right"),
                      ("mean |V err|", "right"), ("AUC", "right"), ("train s", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for name, m in res["methods"].items():
        t.add_row(name, f"{m['pehe']:.4f}", f"{m['ate_error']:.4f}", f"{m['ate_hat']:+.4f}",
                  f"{m['mean_value_error']:.4f}", f"{m['factual_auc']:.3f}", f"{m['train_seconds']:.0f}")
    t.add_row("oracle", "", "", f"{truth['ate']:+.4f}", "", "", "")
    v = Table(title="Policy values from t = 0 (estimate / |error|)")
    v.add_column("method")
    for n in names:
        v.add_column(n, justify="right")
    v.add_row("oracle", *[f"{truth['values'][n]:.3f}" for n in names])
    for name, m in res["methods"].items():
        v.add_row(name, *[f"{m['values'][n]:.3f} / {m['value_error'][n]:.3f}" for n in names])
    return [t, v]


def train(
    centralised: bool = typer.Option(
        False, "--centralised", help="Pool every site's training data in one process (the reference path)."
    ),
    preset: str = typer.Option("default", "--preset", "-p", help=f"DKT-Synth preset: {', '.join(PRESETS)}."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed of the data, the initialisation and training."),
    epochs: Optional[int] = typer.Option(None, "--epochs", "-e", min=1, help="Passes over the pooled data (default per preset)."),
    sites: int = typer.Option(10, "--sites", min=1, help="Number of DKT-Synth sites (pooled here)."),
    samples: int = typer.Option(16, "--samples", min=1, help="Simulated futures per test trajectory for effects."),
    sampler: str = typer.Option("ddim", "--sampler", help="Reverse sampler for do-simulation: ddim or ddpm."),
    steps: int = typer.Option(25, "--steps", min=1, help="DDIM steps per transition (DDPM uses all N)."),
    methods: str = typer.Option(
        "fed_causaldiff,gformula,naive", "--methods", help="Comma-separated subset of fed_causaldiff,gformula,naive."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as one JSON object (progress to stderr)."),
) -> None:
    """Train Fed-CausalDiff with all sites pooled and report PEHE, |ATE error| and |policy value error| for the
    four default policies against DKT-Synth ground truth, next to a deterministic GRU g-formula and a naive
    observational model trained on the same split with the same seed.

    Federated training is `fcd run`; this command is its centralised yardstick.
    """
    import torch

    from fcd_secure.model.config import ModelConfig
    from fcd_secure.model.reference import METHODS, run_centralised

    def fail(msg: str) -> None:
        if as_json:
            print(json.dumps({"ok": False, "error": msg}))
        else:
            _err.print(f"[bold red]error:[/] {msg}", highlight=False)
        raise typer.Exit(code=1)

    if not centralised:
        fail("only --centralised is available here; federated training is `fcd run`")
    if preset not in PRESETS:
        fail(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
    bad = [m for m in chosen if m not in METHODS]
    if bad or not chosen:
        fail(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    if sampler not in ("ddim", "ddpm"):
        fail(f"unknown sampler {sampler!r}; choose ddim or ddpm")
    torch.set_num_threads(1)
    try:
        cfg = ModelConfig(sampler=sampler, sampler_steps=steps)  # type: ignore[arg-type]
    except ValueError as exc:
        fail(str(exc))
        return

    def progress(msg: str) -> None:
        (_err if as_json else _out).print(f"[dim]{msg}[/]", highlight=False)

    try:
        res = run_centralised(preset, seed, epochs, cfg, n_sites=sites, n_samples=samples, methods=chosen,
                              progress=progress)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
        return
    if as_json:
        json.dump({"ok": True, **res}, sys.stdout, default=float)
        sys.stdout.write("\n")
    else:
        for tab in _tables(res):
            _out.print(tab)


def register(app: typer.Typer) -> None:
    """Attach ``fcd train`` to the root app."""
    app.command("train")(train)

"""`fcd reproduce`: the paper's Tables III–IV and Figs. 2–4 for every method and dataset. Thin: parse, call
``fcd_secure.experiments.reproduction``, draw the progress bar, print where the report is."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fcd_secure.cli.app import emit, say_identifier, stderr, stdout
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.cli.run import bad_input_errors

PRESETS_HELP = "tiny (tests) | quick (docs/reproduction; cost per cell measured there) | default | paper (Table I/II sizes)"


def reproduce(
    out: Path = typer.Option(..., "--out", help="Output folder (tables, figures, REPORT.md, cached cells)."),
    preset: str = typer.Option("quick", "--preset", help=PRESETS_HELP),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Number of seeds from --seed on (preset default)."),
    seed: int = typer.Option(0, "--seed", min=0, help="First seed of every cell (split, initialisation, sampling, "
                             "training); the cells run seeds --seed .. --seed + --seeds - 1."),
    datasets: Optional[list[str]] = typer.Option(None, "--dataset", help="A dataset of the paper; repeat for several (default: all four)."),
    methods: Optional[list[str]] = typer.Option(None, "--method", help="A method of the paper; repeat for several (default: all five)."),
    ablations: bool = typer.Option(True, "--ablations/--no-ablations", help="Table III's ablations on DKT-Synth."),
    secure: bool = typer.Option(False, "--secure-aggregation/--no-secure-aggregation", help="Secure aggregation."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Real datasets root."),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes for the cells (same numbers)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (the result summary in data) on stdout."),
) -> None:
    """Reproduce the paper: Fed-CausalDiff, CRN, RCGAN, TimeGAN and FedCM federated under Table II on DKT-Synth,
    Diabetes-130, OpenBandit and Statics2011; Tables III–IV and Figs. 2–4 as CSV + JSON + PNG and a REPORT.md beside
    the paper's numbers. Every cell is cached in OUT: run the same command again to resume.

    Exit codes: 0 done, 2 bad input.
    """
    from fcd_secure.experiments.reproduction.presets import DATASETS, METHODS, get_preset  # noqa: PLC0415

    try:
        p = get_preset(preset)
    except ValueError as exc:
        raise CliError(str(exc), "USAGE") from None
    ds = list(dict.fromkeys(datasets)) if datasets else list(DATASETS)
    ms = list(dict.fromkeys(methods)) if methods else list(METHODS)
    bad = [d for d in ds if d not in DATASETS] + [m for m in ms if m not in METHODS]
    if bad:
        raise CliError(f"unknown dataset(s) or method(s) {bad}; datasets: {list(DATASETS)}, methods: {list(METHODS)}",
                       "USAGE", hint="one value per --dataset or --method, repeated for several")
    import torch  # noqa: PLC0415 (after the arguments are checked: a typo is refused before torch loads)

    from fcd_secure.experiments.reproduction import run_reproduction  # noqa: PLC0415

    torch.set_num_threads(1)
    with Progress(TextColumn("[bold]reproduce[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=stderr(), transient=False) as bar:
        task = bar.add_task("", total=None)

        def on_progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        try:
            res = run_reproduction(p, list(range(seed, seed + (seeds or p.seeds))), ds, ms, out, str(data_dir) if data_dir else None,
                                   secure, ablations, on_progress, workers)
        except (*bad_input_errors(), FileNotFoundError, ValueError) as exc:
            raise CliError(str(exc), hint="the message names the dataset, file or field") from None
    meta = res["meta"]
    summary = {"report": res["report"], "out": str(out), "figures": res["tables"]["figures"],
               "wall_s": meta["wall_s"], "cpu_s": meta["cpu_s"], "cells": meta["cells"], "cached": meta["cached"]}
    if as_json:
        emit(ok(summary, f"reproduced: {res['report']}"))
        return
    con = stdout()
    con.print(f"{meta['cells']} cells ({meta['cached']} from the cache) in {meta['wall_s'] / 60:.1f} min wall, "
              f"{meta['cpu_s'] / 60:.1f} min CPU")
    say_identifier(con, "report:", str(res["report"]), indent=0)


def register(app: typer.Typer) -> None:
    """Attach ``fcd reproduce`` to the root app."""
    app.command("reproduce", short_help="Paper Tables III-IV and Figs. 2-4 for every method and dataset.")(reproduce)

"""`fcd ablate`: the ablations of paper Table III. Thin: parse, call ``fcd_secure.experiments.ablation``, print."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from fcd_secure.cli.run import PRESET_HELP, _common_errors, _fail, resolve_config


def ablate(
    preset: str = typer.Option("default", "--preset", help=PRESET_HELP),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Number of seeds (0..seeds-1); mean ± sd is reported."),
    first_seed: int = typer.Option(0, "--first-seed", help="First seed."),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Rounds (preset default)."),
    sites: Optional[int] = typer.Option(None, "--sites", min=1, help="Number of sites N."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma list of: dss, full_sync, no_ldis, local_only, centralised (default all)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Real datasets root."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default runs/<timestamp>-ablation/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON on stdout."),
) -> None:
    """Table III of the paper on DKT-Synth: Fed-CausalDiff (DSS), w/o DSS (full sync), w/o L_dis, local only and
    centralised, on the same data, split and seeds; PEHE, |ATE error|, |value error| and uplink MB.

    The centralised row is the reference of `fcd train --centralised` (same epochs and seeds, same numbers).
    Exit codes: 0 done, 2 bad input.
    """
    import torch  # noqa: PLC0415

    from fcd_secure.experiments.ablation import ALL_VARIANTS, run_ablation  # noqa: PLC0415

    console = Console(stderr=as_json)
    chosen = [v.strip() for v in variants.split(",")] if variants else list(ALL_VARIANTS)
    bad = [v for v in chosen if v not in ALL_VARIANTS]
    if bad:
        _fail(console, f"unknown variant(s) {bad}; choose from {list(ALL_VARIANTS)}")
    try:
        base = resolve_config(
            preset=preset, config_file=None, rounds=rounds, sites=sites, clients_per_round=None, seed=None,
            dataset=None, spec=None, data_dir=data_dir, secure=False, sync=None, eval_every=0, state_dir=None,
            out=out or Path("runs") / f"{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-ablation",
        )
    except _common_errors() as exc:
        _fail(console, str(exc))
    torch.set_num_threads(1)
    seeds_list = list(range(first_seed, first_seed + seeds))
    table = run_ablation(base, chosen, seeds_list, Path(base.out), log=lambda s: console.print(s))
    if as_json:
        typer.echo(json.dumps(table))
        return
    t = Table(title=f"Interventional fidelity on DKT-Synth ({preset}, seeds {seeds_list}) — paper Table III")
    for col in ("variant", "PEHE↓", "ATE↓", "Value↓", "uplink MB"):
        t.add_column(col, justify="right" if col != "variant" else "left")
    for row in table["rows"]:
        t.add_row(row["variant"], row["pehe_fmt"], row["ate_fmt"], row["value_fmt"], row["uplink_mb_fmt"])
    console.print(t)
    console.print(f"saved: {Path(base.out) / 'ablation.csv'}, ablation.json and utility_vs_uplink.png")


def register(app: typer.Typer) -> None:
    """Attach ``fcd ablate`` to the root app."""
    app.command("ablate")(ablate)

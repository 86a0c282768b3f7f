"""`fcd ablate`: the ablations of paper Table III. Thin: parse, call ``fcd_secure.experiments.ablation``, print."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from fcd_secure.cli.app import emit, say_identifier, stderr, stdout
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.cli import options
from fcd_secure.cli.resolve import PRESET_HELP, RunOptions, resolve_config


def ablate(
    preset: str = typer.Option("default", "--preset", help=PRESET_HELP),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Number of seeds from --seed on; mean ± sd is reported."),
    first_seed: int = typer.Option(0, "--seed", help="First seed (of the split, initialisation, "
                                   "sampling and training; seeds --seed .. --seed + --seeds - 1)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Rounds (preset default)."),
    sites: Optional[int] = typer.Option(None, "--sites", min=1, help="Number of sites N."),
    variants: Optional[list[str]] = typer.Option(None, "--variant", help="A variant: dss, full_sync, no_ldis, local_only or centralised; repeat for several (default all)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Real datasets root."),
    settings: Optional[list[str]] = options.SETTINGS,
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Output folder (default runs/<timestamp>-ablation/)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (the table in data) on stdout."),
) -> None:
    """Table III of the paper on DKT-Synth: Fed-CausalDiff (DSS), w/o DSS (full sync), w/o L_dis, local only and
    centralised, on the same data, split and seeds; PEHE, |ATE error|, |value error| and uplink MB.

    The centralised row is the reference of `fcd train` (same epochs and seeds, same numbers).
    Exit codes: 0 done, 2 bad input.
    """
    from rich.table import Table  # noqa: PLC0415

    from fcd_secure.experiments.variants import ALL_VARIANTS  # noqa: PLC0415

    chosen = list(dict.fromkeys(variants)) if variants else list(ALL_VARIANTS)
    bad = [v for v in chosen if v not in ALL_VARIANTS]
    if bad:
        raise CliError(f"unknown variant(s) {bad}; choose from {list(ALL_VARIANTS)}", "USAGE",
                       hint="one variant per --variant, repeated for several")
    base = resolve_config(RunOptions(
        preset=preset, rounds=rounds, sites=sites, data_dir=data_dir, secure=False, eval_every=0,
        settings=settings or [],
        out=out_dir or Path("runs") / f"{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-ablation",
    ))
    import torch  # noqa: PLC0415 (after the arguments are checked: a typo is refused before torch loads)

    from fcd_secure.experiments.ablation import run_ablation  # noqa: PLC0415

    torch.set_num_threads(1)
    seeds_list = list(range(first_seed, first_seed + seeds))
    console = stderr() if as_json else stdout()
    table = run_ablation(base, chosen, seeds_list, Path(str(base.out)), log=lambda s: console.print(escape(s), soft_wrap=True))
    if as_json:
        emit(ok(table, f"ablation of {len(chosen)} variant(s) over seeds {seeds_list}"))
        return
    t = Table(title=f"Interventional fidelity on DKT-Synth ({preset}, seeds {seeds_list}) — paper Table III")
    for col in ("variant", "PEHE↓", "PEHE₀", "sd τ", "skill↑", "ATE↓", "Value↓", "uplink MB", "flags"):
        t.add_column(col, justify="left" if col in ("variant", "flags") else "right")
    for row in table["rows"]:  # flags stand where a rank would mislead (a model that learns nothing must not win)
        t.add_row(row["variant"], row["pehe_fmt"], row["pehe0_fmt"], row["sd_tau_fmt"], row["skill_fmt"],
                  row["ate_fmt"], row["value_fmt"], row["uplink_mb_fmt"], "; ".join(row["flags"]) or "—")
    con = stdout()
    con.print(t)
    say_identifier(con, "saved:", f"{Path(str(base.out)) / 'ablation.csv'}, ablation.json and utility_vs_uplink.png",
                   indent=0)


def register(app: typer.Typer) -> None:
    """Attach ``fcd ablate`` to the root app."""
    app.command("ablate", short_help="Paper Table III: DSS, full sync, w/o L_dis, local, centralised.")(ablate)

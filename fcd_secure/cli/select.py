"""`fcd select RUN_DIR RUN_DIR ...`: which finished run to answer with, chosen by the truth-free causal criterion.

Outcome-model variants (the diffusion transition of Fed-CausalDiff, the same network rolled out through its encoder
(``model.rollout = "encoder"``), the deterministic g-formula transition, another simulator or recipe) are trained as
separate runs on the same data and seed, hence on the same validation rows (``data.cohorts``: the cut is fixed by
the sites). Each run already scored its rounds on those rows and answered with the round
``queries.selection.choose_round`` picked; this command applies the same rule across the runs
(``queries.selection.choose_run``): where some run's chosen round passed its natural course, the runs whose chosen
round failed it are left out; then the runs whose D₁ at their chosen round is within one SE of the smallest (and D₂
where every run's is supported), then the smallest natural-course gap, supported D₂ or D₁ (never the validation fit). It reads only the runs' own files (no site is asked,
nothing is trained) and never uses a test split or an oracle's truth.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from fcd_secure.cli.app import emit, say_identifier, stdout
from fcd_secure.cli.envelope import EXIT_USAGE, CliError, ok
from fcd_secure._format import fmt

#: the model settings a run's label shows (what makes two runs on the same data different outcome models)
VARIANT_KEYS = ("simulator", "transition", "rollout", "ipw", "lr")


def _load(run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """(config, the selected round's selection row) of a finished run folder."""
    from fcd_secure.config import RunConfig  # noqa: PLC0415

    for name in ("config.toml", "summary.json", "rounds.json"):
        if not (run_dir / name).is_file():
            raise CliError(f"{run_dir}: no {name} (not a finished run folder of `fcd run`)", "BAD_INPUT")
    try:
        cfg = RunConfig.load(run_dir / "config.toml")
        summary = json.loads((run_dir / "summary.json").read_text())
        rounds = json.loads((run_dir / "rounds.json").read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"{run_dir}: cannot read its run files ({exc})", "BAD_INPUT") from None
    chosen = (summary.get("selection") or {}).get("round")
    row = next((r for r in rounds if r.get("round") == chosen and r.get("selection")), None)
    if row is None:  # a run that scored no round (federation.eval_every = 0, or an older run folder)
        row = {"selection": {"round": chosen, "sites": 0, "sites_scoring": 0, "coverage": "unavailable"}}
    return cfg, {**row["selection"], "round": chosen}


def _differences(cfgs: list[Any]) -> list[str]:
    """The data settings (and the seed) in which the runs differ: their validation rows differ, so their D₁ are
    estimates on different entities and the comparison is refused."""
    first = {"seed": cfgs[0].seed, **{f"data.{k}": v for k, v in cfgs[0].data.model_dump().items()}}
    out = []
    for cfg in cfgs[1:]:
        other = {"seed": cfg.seed, **{f"data.{k}": v for k, v in cfg.data.model_dump().items()}}
        out += [k for k in first if first[k] != other.get(k) and k not in out]
    return out


def _variant(cfg: Any, keys: tuple[str, ...] = VARIANT_KEYS) -> str:
    m = cfg.model.model_dump()
    return ", ".join(f"{k} {m[k]}" for k in keys if k in m)


def _differing(cfgs: list[Any]) -> tuple[str, ...]:
    """The model settings of :data:`VARIANT_KEYS` in which the runs differ (all of them when none differs)."""
    dumps = [c.model.model_dump() for c in cfgs]
    keys = tuple(k for k in VARIANT_KEYS if len({repr(d.get(k)) for d in dumps}) > 1)
    return keys or VARIANT_KEYS


def choose_among(run_dirs: list[Path]) -> tuple[dict[str, Any], list[tuple[Any, dict[str, Any]]]]:
    """The rule of ``fcd select`` over finished run folders (``queries.selection.choose_run`` on each run's selected
    round), and each run's (config, selection row); benchmarks call this to choose as the command does.

    Raises:
        CliError: A folder is not a finished run, or the runs differ in their data settings or seed.
    """
    from fcd_secure.queries.selection import choose_run  # noqa: PLC0415

    loaded = [_load(d) for d in run_dirs]
    diff = _differences([c for c, _ in loaded])
    if diff:
        raise CliError(f"the runs differ in {', '.join(diff)}: their validation rows differ, so their D1 cannot be "
                       "compared", "BAD_INPUT", hint="train every variant with the same data settings and --seed")
    return choose_run([row for _, row in loaded]), loaded


#: the cell of a figure a run does not have (no D_h at all, no validation fit)
NO_FIGURE = "—"


def register(app: typer.Typer) -> None:
    """Attach ``fcd select`` to the root app."""

    @app.command("select", short_help="Choose among finished runs (outcome-model variants) by the causal criterion.")
    def select(
        run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR...", help="Two or more finished run folders of `fcd run` on the same data and seed (e.g. one with [model] transition = \"diffusion\", one with \"deterministic\")."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (every run's figures and the choice) on stdout."),
    ) -> None:
        """Say which run to answer with: the truth-free rule that chose each run's round (D1 = the one-step doubly
        robust discrepancy on the sites' validation rows, within one SE of the smallest; D2 too where every run's is
        supported; then the smallest natural-course gap, D₂ or D₁, never the fit), applied across the runs. Fit alone never chooses: on confounded
        logs the best-fitting model is the most confounded one.

        The runs must share the data settings and the seed (the same validation rows); otherwise the command
        refuses and names the setting. Nothing is trained and no site is asked.

        Exit codes: 0 a run was chosen, 2 bad input (fewer than two runs, not a run folder, runs on different data),
        7 no run has a D1 (no site could score: no logged propensities): the criterion cannot choose.
        """
        from fcd_secure.queries.selection import DH_HORIZON  # noqa: PLC0415

        if len(run_dirs) < 2:
            raise CliError("give at least two run folders to choose between", "USAGE", exit_code=EXIT_USAGE,
                           hint="train each variant with `fcd run --config variant.toml` on the same data and seed")
        choice, loaded = choose_among([Path(d) for d in run_dirs])
        runs = [{"run": str(d), "model": _variant(cfg), "round": row.get("round"), "d1": row.get("d1"),
                 "d1_se": row.get("d1_se"), "alarm": row.get("alarm"), "dh": row.get("dh"), "dh_se": row.get("dh_se"),
                 "dh_ess": row.get("dh_ess"), "dh_supported": row.get("dh_supported"),
                 "validation_fit": row.get("validation_fit"), "coverage": row.get("coverage"),
                 "chosen": choice["run"] == i}
                for i, (d, (cfg, row)) in enumerate(zip(run_dirs, loaded))]
        data = {**{k: v for k, v in choice.items() if k != "run"},
                "chosen": None if choice["run"] is None else str(run_dirs[choice["run"]]), "runs": runs}
        if choice["run"] is None:
            raise CliError(choice["reason"], "INCOMPLETE_ANSWER", data=data,
                           hint="the criterion needs logged propensities and ≥ 20 validation entities per site")
        if as_json:
            emit(ok(data, f"chosen: {data['chosen']}"))
            return
        from rich.table import Table  # noqa: PLC0415

        t = Table(title="Outcome models, chosen by the causal criterion (not by fit)")
        shown = _differing([c for c, _ in loaded])
        for col in ("#", "model", "round", "D1 ± SE", f"D{DH_HORIZON} (ESS)", "val. fit", ""):
            t.add_column(col, overflow="fold")
        for i, (r, (cfg, _)) in enumerate(zip(runs, loaded), start=1):
            dh = (f"{fmt(r['dh'], missing=NO_FIGURE)} ({fmt(r['dh_ess'], '.0f', NO_FIGURE)})"
                  + ("" if r["dh_supported"] else " unsupported") if r["dh"] is not None else NO_FIGURE)
            d1 = f"{fmt(r['d1'], missing=NO_FIGURE)} ± {fmt(r['d1_se'], missing=NO_FIGURE)}"
            t.add_row(str(i), _variant(cfg, shown), str(r["round"]), d1 + (" ALARM" if r["alarm"] else ""), dh,
                      fmt(r["validation_fit"], missing=NO_FIGURE), "chosen" if r["chosen"] else "")
        con = stdout()
        con.print(t)
        for i, r in enumerate(runs, start=1):
            say_identifier(con, f"#{i}", r["run"])
        con.print(f"chosen: {data['chosen']} ({choice['rule']}, coverage {choice['coverage']}): {choice['reason']}",
                  soft_wrap=True)

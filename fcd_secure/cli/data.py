"""`fcd data` sub-commands: validate a user's table against a spec; describe the built-in datasets."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fcd_secure.data.spec import DataError

app = typer.Typer(no_args_is_help=True, add_completion=False)

_out = Console()
_err = Console(stderr=True)


def _fail(exc: DataError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"ok": False, **exc.to_dict(), "message": str(exc)}))
    else:
        _err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1)


@app.command("validate")
def validate(
    table: Path = typer.Argument(..., exists=True, dir_okay=False, help="Long-format table: .csv, .csv.gz or .parquet."),
    spec: Path = typer.Option(..., "--spec", "-s", exists=True, dir_okay=False, help="DatasetSpec file (.toml/.yaml)."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Also write the encoded dataset here (.npz); written only if every check passes."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Check TABLE against SPEC and build the unified (X, A, T, Y, M[, P]) dataset.

    Exit 0 with a short summary when the table is valid; exit 1 with a message naming the file, column and row
    (or the spec field) when it is not, writing nothing; exit 2 on a usage error.
    """
    from fcd_secure.data.npz import save_npz
    from fcd_secure.data.preprocess import dataset_from_files

    try:
        sp, ds = dataset_from_files(spec, table)
        if out is not None:
            if out.suffix != ".npz":
                raise DataError("output must end in .npz", file=out)
            try:
                save_npz(ds, out)  # atomic: a temporary file renamed into place, removed on failure
            except OSError as exc:  # e.g. the --out folder does not exist, or is not writable
                raise DataError(f"cannot write the dataset: {exc.strerror or exc}", file=out) from None
    except DataError as exc:
        _fail(exc, as_json)
        return
    summary: dict[str, Any] = {
        "ok": True,
        "table": str(table),
        "spec": str(spec),
        "name": sp.name,
        "entities": ds.meta["entities"],
        "sequences": ds.n,
        "steps": int(ds.M.sum()),
        "Lmax": ds.L,
        "dx": ds.dx,
        "da": ds.da,
        "n_actions": ds.n_actions,
        "action_names": ds.meta["action_names"],
        "outcome_rate": float((ds.Y * ds.M).sum() / ds.M.sum()),
        "has_propensity": ds.P is not None,
        "truncated_entities": ds.meta["truncated_entities"],
        "dropped_steps": ds.meta["dropped_steps"],
        "sites": ds.meta.get("site_names"),
        "written": None if out is None else str(out),
    }
    if as_json:
        print(json.dumps(summary))
        return
    _out.print(f"[green]ok[/] {table} matches {spec}", highlight=False)
    t = Table(show_header=False, box=None)
    for k in ("name", "entities", "sequences", "steps", "Lmax", "dx", "da", "n_actions", "outcome_rate",
              "has_propensity", "truncated_entities", "dropped_steps", "sites", "written"):
        v = summary[k]
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    _out.print(t)


def _fmt_pair(ours: Any, paper: Any) -> str:
    if paper is None:
        return str(ours)
    return f"{ours} [dim]/ {paper}[/]" if ours == paper else f"[yellow]{ours}[/] [dim]/ {paper}[/]"


@app.command("describe")
def describe(
    dataset: list[str] = typer.Option(
        ["all"], "--dataset", "-d",
        help="dkt-synth, statics2011, assistments2009, diabetes130, obd, or all (repeat the option for several).",
    ),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Folder holding the datasets "
                                            "(default: $FCD_DATA_DIR, then ../shared/data next to the project)."),
    n_sites: int = typer.Option(10, "--n-sites", min=1, help="Sites of the Dirichlet split (paper: 10)."),
    alpha: float = typer.Option(10.0, "--alpha", min=1e-6, help="Dirichlet concentration (paper: 10)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the split (same seed, same sites)."),
    preset: str = typer.Option(
        "default", "--preset",
        help="Size: tiny (300 trajectories per real dataset) | small (2,000) | default | paper (both: all). "
        "DKT-Synth: tiny | default | paper.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {dataset: description}."),
    spec: Optional[tuple[Path, Path]] = typer.Option(
        None, "--spec", metavar="SPEC TABLE", help="Describe your own table (a dataset spec and the table it describes) "
        "instead of the built-in datasets: the same sites, anchors and contexts `fcd run --spec` would use."),
) -> None:
    """Per dataset and per site: sequences, Lmax, dx, da, |T|, action support and anchors, outcome rate.

    The anchors are the two actions with the most logged support, which the paper's four policies (never, always,
    early_on, late_on) use: a_off and a_on, by id and label. For the paper's four datasets Table I's numbers are
    shown beside ours (ours / paper; yellow where they differ). A dataset that cannot be loaded (missing files, a DKT
    oracle whose checksum does not match) gets its error in its entry and the others are still described; the exit
    code is then 1.
    """
    from fcd_secure.data.registry import DATASETS, load_federated, load_spec_federated

    if spec is not None:
        try:
            fd = load_spec_federated(spec[0], spec[1], n_sites=n_sites, alpha=alpha, seed=seed)
        except DataError as exc:
            _fail(exc, as_json)
            return
        results = {fd.name: fd.description}
        if as_json:
            print(json.dumps(results, default=float))
        else:
            _print_tables(results)
        return
    wanted = [d.lower() for d in dataset]
    names = list(DATASETS) if "all" in wanted else list(dict.fromkeys(wanted))
    for name in names:
        if name not in DATASETS:
            _err.print(f"[bold red]error:[/] unknown dataset {name!r}; choose one of all, {', '.join(DATASETS)}")
            raise typer.Exit(code=2)
    results: dict[str, Any] = {}
    failed = False
    with _err.status("loading datasets") if not as_json else nullcontext():
        for name in names:
            try:
                fd = load_federated(name, n_sites=n_sites, alpha=alpha, seed=seed, preset=preset, data_dir=data_dir)
                results[name] = fd.description
            # one dataset's failure (bad data dir, a corrupt or missing DKT oracle: OracleChecksumError is a
            # RuntimeError, a missing weights file an OSError) is reported in its entry; the others still load
            except (DataError, ValueError, RuntimeError, OSError) as exc:
                failed = True
                msg = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
                results[name] = {"name": name, "error": msg}
    if as_json:
        print(json.dumps(results, default=float))
    else:
        _print_tables(results)
    if failed:
        raise typer.Exit(code=1)


def _print_tables(results: dict[str, Any]) -> None:
    t = Table(title="Datasets (ours / paper Table I)")
    for col in ("dataset", "sequences", "Lmax", "dx", "da", "|T|", "used", "Y rate", "anchors", "anchor share",
                "top-5"):
        t.add_column(col, justify="left" if col == "dataset" else "right")
    for name, d in results.items():
        if "error" in d:
            t.add_row(name, "[red]failed[/]", *[""] * 9)  # the message is printed in full below the table
            continue
        p = d.get("table_i") or {}
        an = d["anchors"]
        t.add_row(
            name,
            _fmt_pair(d["sequences"], p.get("sequences")),
            _fmt_pair(d["Lmax"], p.get("Lmax")),
            _fmt_pair(d["dx"], p.get("dx")),
            _fmt_pair(d["da"], p.get("da")),
            _fmt_pair(d["n_actions"], p.get("n_actions")),
            str(d["actions_used"]),
            f"{d['outcome_rate']:.3f}",
            escape(f"{an['a_off']} ({an.get('a_off_name', an['a_off'])}) / {an['a_on']} ({an.get('a_on_name', an['a_on'])})"),
            f"{an['share_off']:.1%} / {an['share_on']:.1%}",
            f"{sum(a['share'] for a in d['top_actions']):.1%}",
        )
    _out.print(t)
    for name, d in results.items():
        if "error" in d:
            # escape: messages such as "[Errno 2] ..." must not be read as rich markup
            _out.print(f"[bold red]{name} failed:[/] {escape(d['error'])}", soft_wrap=True, highlight=False)
    for name, d in results.items():
        if "error" in d:
            continue
        s = Table(title=f"{name}: {d['n_sites']} sites (alpha={d.get('alpha')}, seed={d.get('seed')})")
        for col in ("site", "train", "test", "steps", "outcome rate", "top action", "a_off share", "a_on share"):
            s.add_column(col, justify="right")
        for row in d["sites"]:
            s.add_row(str(row["site"]), str(row["train"]), str(row["test"]), str(row["steps"]),
                      f"{row['outcome_rate']:.3f}", f"{row['top_action_share']:.1%}", f"{row['share_off']:.1%}",
                      f"{row['share_on']:.1%}")
        _out.print(s)
        an = d["anchors"]
        _out.print(f"  anchors of the paper's policies (never/always/early_on/late_on): a_off = {an['a_off']} "
                   f"({escape(str(an.get('a_off_name')))}), a_on = {an['a_on']} ({escape(str(an.get('a_on_name')))})",
                   highlight=False)
        if d.get("contexts"):
            c = d["contexts"]
            _out.print(f"  contexts: generated under an intervention (endogenous): {escape(', '.join(c['endogenous']) or '-')}; "
                       f"replayed (exogenous): {escape(', '.join(c['exogenous']) or '-')}", highlight=False)
        for note in d.get("notes", []):
            _out.print(f"  [dim]- {note}[/]", highlight=False)

"""`fcd data` sub-commands: validate a user's table against a spec; describe the built-in datasets."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import typer

from fcd_secure.cli.app import done, emit, new_app, stderr, stdout
from fcd_secure.data import names
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.cli import options
from fcd_secure.cli.tables import LEFTOVER_WORDS, SPEC_HELP, spec_and_table
from fcd_secure._format import fmt

app = new_app(help="Validate and describe datasets (schema, DKT-Synth, real datasets).")


def absent_actions(ds) -> dict[str, list[str]]:
    """The actions a table never logs, over the whole table (``"all sites"``) and per site where it has a site
    column: a policy that takes such an action has no logged support there, so no answer about it is identified by
    that site's data (``queries.budget``). Empty lists are left out."""
    import numpy as np  # noqa: PLC0415

    labels = list(ds.meta.get("action_names") or range(ds.n_actions))
    valid = ds.M > 0

    def missing(rows) -> list[str]:
        seen = np.unique(ds.T[rows][valid[rows]])
        return [str(labels[a]) for a in range(ds.n_actions) if a not in set(seen.tolist())]

    out: dict[str, list[str]] = {}
    whole = missing(np.arange(ds.n))
    if whole:
        out["all sites"] = whole
    site, names_ = ds.meta.get("site"), ds.meta.get("site_names")
    if site is not None and names_:
        for i, name in enumerate(names_):
            rows = np.flatnonzero(np.asarray(site) == i)
            if rows.size and (gone := missing(rows)):
                out[str(name)] = gone
    return out


def trajectories_per_site(ds) -> dict[str, int]:
    """The trajectories (sequences) of each site of a table, by site name; a table without a site column is one
    site, named ``"table"``. The count ``fcd site preflight`` checks against the consortium's floor."""
    import numpy as np  # noqa: PLC0415

    site, names_ = ds.meta.get("site"), ds.meta.get("site_names")
    if site is None or not names_:
        return {"table": int(ds.n)}
    counts = np.bincount(np.asarray(site, dtype=np.int64), minlength=len(names_))
    return {str(name): int(counts[i]) for i, name in enumerate(names_)}


def _invalid(exc) -> CliError:
    """A ``DataError`` as the command line reports it: exit 1, the file/column/row/field in ``data``."""
    return CliError(str(exc), "DATA_INVALID", data=exc.to_dict(),
                    hint="the message names the file and the column, row or spec field; see fcd_secure/data/spec.py")


@app.command("validate", short_help="Check a table against its spec (file, column, row named).",
             context_settings=LEFTOVER_WORDS)
def validate(
    ctx: typer.Context,
    spec: Optional[Path] = options.SPEC,
    table: Optional[list[str]] = options.TABLE,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Also write the encoded dataset here (.npz); written only if every check passes."
    ),
    min_trajectories: Optional[int] = typer.Option(
        None, "--min-trajectories", min=1, help="A consortium's floor of trajectories per site: a site below it "
        "makes the table invalid (exit 1). Without it, a site below the consortium default is a warning."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Check TABLE against SPEC and build the unified (X, A, T, Y, M[, P]) dataset.

    Exit 0 with a short summary when the table is valid; exit 1 with a message naming the file, column and row
    (or the spec field) when it is not, writing nothing; exit 2 on a usage error. `fcd run --spec SPEC --table
    TABLE` runs the same checks before it starts (and exits 2 there: bad input of a run). Each site's trajectories
    are counted against a consortium's floor (--min-trajectories; `fcd site init` and `fcd consortium add-site`
    refuse a site below it).
    """
    spec, table = spec_and_table(spec, table, ctx.args, required=True)
    from fcd_secure.data.npz import save_npz  # noqa: PLC0415 - pandas and the loaders only when used
    from fcd_secure.data.inputs import dataset_from_input  # noqa: PLC0415
    from fcd_secure.data.preprocess import propensity_balance_warnings  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415

    from fcd_secure.provisioning.consortium import DEFAULT_MIN_TRAJECTORIES, below_floor  # noqa: PLC0415

    try:
        sp, ds = dataset_from_input(spec, table)
        per_site = trajectories_per_site(ds)
        short = {site: why for site, n in per_site.items()
                 if (why := below_floor(n, min_trajectories or DEFAULT_MIN_TRAJECTORIES))}
        if short and min_trajectories is not None:
            raise DataError("; ".join(f"site {site}: {why}" for site, why in short.items()), file=table)
        if out is not None:
            if out.suffix != ".npz":
                raise DataError("output must end in .npz", file=out)
            try:
                save_npz(ds, out)  # atomic: a temporary file renamed into place, removed on failure
            except OSError as exc:  # e.g. the --out folder does not exist, or is not writable
                raise DataError(f"cannot write the dataset: {exc.strerror or exc}", file=out) from None
    except DataError as exc:
        raise _invalid(exc) from None
    summary: dict[str, Any] = {
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
        # what the default model.ipw = 'auto' makes of this table on its site (model.training.training_view)
        "local_objective": "propensity-weighted (ipw step)" if ds.P is not None else "unweighted (no propensities)",
        "truncated_entities": ds.meta["truncated_entities"],
        "dropped_steps": ds.meta["dropped_steps"],
        "sites": ds.meta.get("site_names"),
        # actions never logged (whole table, per site): answers about policies that take them are not identified
        # a propensity column that cannot be the probability of the logged action (data.preprocess)
        "propensity_warnings": ([] if ds.P is None else propensity_balance_warnings(
            ds.T, ds.P, ds.M, list(ds.meta["action_names"]), str(getattr(sp, "propensity", None) or "propensity"))),
        "actions_absent": absent_actions(ds),
        "trajectories": per_site,
        "below_floor": short,
        "written": None if out is None else str(out),
    }
    if as_json:
        emit(ok(summary, f"{table} matches {spec}"))
        return
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    con = stdout()
    con.print(f"[green]ok[/] {escape(str(table))} matches {escape(str(spec))}", soft_wrap=True)
    t = Table(show_header=False, box=None)
    for k in ("name", "entities", "sequences", "steps", "Lmax", "dx", "da", "n_actions", "outcome_rate",
              "has_propensity", "local_objective", "truncated_entities", "dropped_steps", "sites", "written"):
        v = summary[k]
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else escape(str(v)))
    con.print(t)
    for site, why in short.items():
        con.print(f"[yellow]warning[/] site {escape(site)}: {escape(why)}; `fcd site init` refuses it unless the "
                  "consortium's floor is lower (--min-trajectories)", soft_wrap=True)
    for line in summary["propensity_warnings"]:
        con.print(f"[yellow]warning[/] {escape(line)}", soft_wrap=True)
    for where, acts in summary["actions_absent"].items():
        who = "no site logs" if where == "all sites" else f"site {escape(where)} never logs"
        con.print(f"[yellow]warning[/] {who} {escape(', '.join(acts))}: a policy taking "
                  f"{'it' if len(acts) == 1 else 'them'} has no logged support there (its value is not identified)",
                  soft_wrap=True)


def _fmt_pair(ours: Any, paper: Any) -> str:
    mine = fmt(ours, "")  # a figure as Python prints it, so that ours and the paper's read alike
    if paper is None:
        return mine
    theirs = fmt(paper, "")
    return f"{mine} [dim]/ {theirs}[/]" if ours == paper else f"[yellow]{mine}[/] [dim]/ {theirs}[/]"


@app.command("describe", short_help="Sizes, actions and sites of each dataset, beside paper Table I.",
             context_settings=LEFTOVER_WORDS)
def describe(
    ctx: typer.Context,
    dataset: list[str] = typer.Option(
        ["all"], "--dataset", "-d",
        help=f"{names.choices(', ')}, or all (repeat the option for several).",
    ),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Folder holding the datasets "
                                            "(default: $FCD_DATA_DIR, then ../shared/data next to the project)."),
    n_sites: int = typer.Option(10, "--sites", min=1, help="Sites of the Dirichlet split (paper: 10)."),
    alpha: float = typer.Option(10.0, "--alpha", min=1e-6, help="Dirichlet concentration (paper: 10)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the split (same seed, same sites)."),
    preset: str = typer.Option(
        "default", "--preset",
        help="Size: tiny (300 trajectories per real dataset) | small (2,000) | default | paper (both: all). "
        "DKT-Synth: tiny | small | default | paper.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {dataset: description}."),
    spec: Optional[Path] = typer.Option(
        None, "--spec", metavar="SPEC", dir_okay=False, help=SPEC_HELP + " Describes your own table instead of the "
        "built-in datasets: the same sites, anchors and contexts `fcd run --spec SPEC --table TABLE` would use."),
    table: Optional[list[str]] = options.TABLE,
) -> None:
    """Per dataset and per site: sequences, Lmax, dx, da, |T|, action support and anchors, outcome rate.

    The anchors are the two actions with the most logged support, which the paper's four policies (never, always,
    early_on, late_on) use: a_off and a_on, by id and label. For the paper's four datasets Table I's numbers are
    shown beside ours (ours / paper; yellow where they differ). A dataset that cannot be loaded (missing files, a DKT
    oracle whose checksum does not match) gets its error in its entry and the others are still described; the exit
    code is then 1.
    """
    from fcd_secure.data.registry import DATASETS, load_federated, load_spec_federated  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415

    own = spec_and_table(spec, table, ctx.args)
    if own is not None:
        spec, table = own
        try:
            fd = load_spec_federated(spec, table, n_sites=n_sites, alpha=alpha, seed=seed)
        except DataError as exc:
            raise _invalid(exc) from None
        results = {fd.name: fd.description}
        if as_json:
            emit(ok(results, f"{table} described with {spec}"))
        else:
            _print_tables(results)
        return
    wanted = [d.lower() for d in dataset]
    names = list(DATASETS) if "all" in wanted else list(dict.fromkeys(wanted))
    for name in names:
        if name not in DATASETS:
            raise CliError(f"unknown dataset {name!r}; choose one of all, {', '.join(DATASETS)}", "USAGE")
    results: dict[str, Any] = {}
    failed = False
    console = stderr()
    with console.status("loading datasets") if not as_json and console.is_terminal else nullcontext():
        for name in names:
            try:
                fd = load_federated(name, n_sites=n_sites, alpha=alpha, seed=seed, preset=preset, data_dir=data_dir)
                results[name] = dict(fd.description)
                if as_json and fd.oracle is not None and "oracle" not in results[name]:
                    # a generated world's truth figures (regime support included); computed here, not at every load
                    results[name]["oracle"] = fd.oracle.describe()
            # one dataset's failure (bad data dir, a corrupt or missing DKT oracle: OracleChecksumError is a
            # RuntimeError, a missing weights file an OSError) is reported in its entry; the others still load
            except (DataError, ValueError, RuntimeError, OSError) as exc:
                failed = True
                msg = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
                results[name] = {"name": name, "error": msg}
    bad = [n for n, d in results.items() if "error" in d]
    if as_json:
        if failed:
            raise CliError(f"could not load: {', '.join(bad)}", "DATA_INVALID", data=results,
                           hint="each failed dataset's entry has its error")
        emit(ok(results, f"{len(results)} dataset(s)"))
        return
    _print_tables(results)
    if failed:
        raise typer.Exit(code=1)


def _print_tables(results: dict[str, Any]) -> None:
    """Narrow tables (each fits 80 columns): the sizes beside paper Table I, the actions, then one table per site."""
    from rich import box  # noqa: PLC0415
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    con = stdout()

    def table(title: str, cols: tuple[str, ...]) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        for col in cols:
            t.add_column(col, justify="left" if col in ("dataset", "site") else "right", no_wrap=True)
        return t

    sizes = table("Datasets (ours / paper Table I)", ("dataset", "sequences", "Lmax", "dx", "da", "|T|"))
    actions = table("Actions and outcomes", ("dataset", "used", "Y rate", "anchors", "anchor share", "top-5"))
    for name, d in results.items():
        if "error" in d:
            sizes.add_row(name, "[red]failed[/]", "", "", "", "")  # the message is printed in full below
            continue
        p = d.get("table_i") or {}
        an = d["anchors"]
        sizes.add_row(
            name,
            _fmt_pair(d["sequences"], p.get("sequences")),
            _fmt_pair(d["Lmax"], p.get("Lmax")),
            _fmt_pair(d["dx"], p.get("dx")),
            _fmt_pair(d["da"], p.get("da")),
            _fmt_pair(d["n_actions"], p.get("n_actions")),
        )
        actions.add_row(
            name,
            str(d["actions_used"]),
            f"{d['outcome_rate']:.3f}",
            escape(f"{an['a_off']} ({an.get('a_off_name', an['a_off'])}) / {an['a_on']} ({an.get('a_on_name', an['a_on'])})"),
            f"{an['share_off']:.1%} / {an['share_on']:.1%}",
            f"{sum(a['share'] for a in d['top_actions']):.1%}",
        )
    con.print(sizes)
    if actions.row_count:
        con.print(actions)
    for name, d in results.items():
        if "error" in d:
            # escape: messages such as "[Errno 2] ..." must not be read as rich markup
            con.print(f"[bold red]{name} failed:[/] {escape(d['error'])}", soft_wrap=True)
    for name, d in results.items():
        if "error" in d:
            continue
        s = table(f"{name}: {d['n_sites']} sites (alpha={d.get('alpha')}, seed={d.get('seed')})",
                  ("site", "train", "test", "steps", "Y rate", "top action", "a_off", "a_on"))
        for row in d["sites"]:
            s.add_row(str(row["site"]), str(row["train"]), str(row["test"]), str(row["steps"]),
                      f"{row['outcome_rate']:.3f}", f"{row['top_action_share']:.1%}", f"{row['share_off']:.1%}",
                      f"{row['share_on']:.1%}")
        con.print(s)
        an = d["anchors"]
        con.print(f"  anchors of the paper's policies (never/always/early_on/late_on): a_off = {an['a_off']} "
                  f"({escape(str(an.get('a_off_name')))}), a_on = {an['a_on']} ({escape(str(an.get('a_on_name')))})",
                  highlight=False, soft_wrap=True)
        if d.get("contexts"):
            c = d["contexts"]
            con.print(f"  contexts: generated under an intervention (endogenous): "
                      f"{escape(', '.join(c['endogenous']) or '-')}; replayed (exogenous): "
                      f"{escape(', '.join(c['exogenous']) or '-')}", highlight=False, soft_wrap=True)
        for note in d.get("notes", []):
            con.print(f"  [dim]- {escape(note)}[/]")


@app.command("export", short_help="Write a dataset as one long table per site plus its spec (a hospital's input).")
def export(
    out: Path = typer.Option(..., "--out", "-o", file_okay=False,
                             help="Folder for spec.toml and site0.csv, site1.csv and so on (created; files are replaced)."),
    dataset: str = typer.Option(names.DEFAULT, "--dataset", "-d", help=f"{names.choices(', ')}."),
    n_sites: int = typer.Option(4, "--sites", min=1, help="Sites of the Dirichlet split: one table each."),
    alpha: float = typer.Option(10.0, "--alpha", min=1e-6, help="Dirichlet concentration (paper: 10)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the world and the split (same seed, same tables)."),
    preset: str = typer.Option(
        "small", "--preset", help="Size, as for `fcd data describe`. DKT-Synth: tiny | small | default | paper "
        "(tiny gives sites below the consortium's default 50 trajectories)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Folder holding the real datasets "
                                            "(default: $FCD_DATA_DIR, then ../shared/data next to the project)."),
    fmt_: str = typer.Option("csv", "--format", help="csv: spec.toml and site<i>.csv | omop: cohort.toml and "
                             "site<i>.duckdb, one OMOP CDM v5.4 database per site (docs/omop.md)."),
    postgres: Optional[str] = typer.Option(
        None, "--postgres", metavar="URL", help="With --format omop: also load site i into schema site<i> of this "
        "PostgreSQL database (postgresql://[user@]host[:port]/db; the password from PGPASSWORD or ~/.pgpass)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Write DATASET's sites as what a hospital holds: one long-format table per site (one row per step, values
    in the dataset's own units, each site's train and test rows together) and the spec that reads them. This is
    how to try the hospital path without tables of your own: OUT/spec.toml is the consortium's spec (`fcd
    consortium init`), OUT/site<i>.csv the table of hospital i (`fcd site init`); `fcd data validate` checks one."""
    from fcd_secure.data.long_tables import long_table, spec_text  # noqa: PLC0415
    from fcd_secure.data.registry import DATASETS, load_federated  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415

    if dataset not in DATASETS:
        raise CliError(f"--dataset {dataset!r}: choose one of {', '.join(DATASETS)}", "USAGE")
    if fmt_ not in ("csv", "omop"):
        raise CliError(f"--format {fmt_!r}: choose csv or omop", "USAGE")
    if postgres is not None and fmt_ != "omop":
        raise CliError("--postgres loads an OMOP instance: give --format omop too", "USAGE")
    try:
        fd = load_federated(dataset, n_sites=n_sites, alpha=alpha, seed=seed, preset=preset, data_dir=data_dir,
                            standardize=False)
    except (DataError, ValueError, RuntimeError, OSError) as exc:
        raise CliError(f"{dataset}: {exc}", "DATA_INVALID", hint="see `fcd data describe --dataset "
                       f"{dataset}`") from None
    if fmt_ == "omop":
        _export_omop(fd, out, dataset, postgres, as_json)
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        spec = out / "spec.toml"
        spec.write_text(spec_text(fd.train[0], f"{dataset}-long"))
        tables = []
        for i, (tr, te) in enumerate(zip(fd.train, fd.test)):
            path = out / f"site{i}.csv"
            long_table([tr, te], f"site{i}").to_csv(path, index=False)
            tables.append({"table": str(path), "trajectories": int(tr.n + te.n)})
    except OSError as exc:
        raise CliError(f"{out}: cannot write: {exc.strerror or exc}", "USAGE") from None
    done(as_json, {"spec": str(spec), "sites": tables},
         f"{len(tables)} site table(s) of {dataset} ({', '.join(str(t['trajectories']) for t in tables)} "
         "trajectories)", [("spec", str(spec))] + [(f"site{i}", t["table"]) for i, t in enumerate(tables)])


def _export_omop(fd, out: Path, dataset: str, postgres: str | None, as_json: bool) -> None:
    """``fcd data export --format omop``: each site's long table (its values exactly as the CSV export writes them)
    as an OMOP CDM instance, and the cohort spec that reads them all (``fcd_secure.data.omop.synth``)."""
    import io  # noqa: PLC0415

    import pandas as pd  # noqa: PLC0415

    from fcd_secure.data.long_tables import long_table, spec_text  # noqa: PLC0415
    from fcd_secure.data.omop.synth import Vocabulary, cdm_instance, cohort_text, write_duckdb, write_postgres  # noqa: PLC0415
    from fcd_secure.data.spec import DataError, DatasetSpec  # noqa: PLC0415
    import tomllib  # noqa: PLC0415

    spec = DatasetSpec.model_validate(tomllib.loads(spec_text(fd.train[0], f"{dataset}-long")))
    labels = [str(a) for a in fd.train[0].meta.get("action_names") or range(fd.train[0].n_actions)]
    voc = Vocabulary()
    # the CSV's text read back: the CDM holds the very values a hospital's CSV would
    instances = [cdm_instance(pd.read_csv(io.StringIO(long_table([tr, te], f"site{i}").to_csv(index=False))),
                              spec, labels, voc) for i, (tr, te) in enumerate(zip(fd.train, fd.test))]
    sites = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for i, (inst, tr, te) in enumerate(zip(instances, fd.train, fd.test)):
            inst.frames["concept"] = voc.frame()  # every site's vocabulary holds every concept of the export
            path = write_duckdb(inst, out / f"site{i}.duckdb")
            entry = {"table": str(path), "trajectories": int(tr.n + te.n)}
            if postgres is not None:
                write_postgres(inst, postgres, f"site{i}")
                entry["postgres_schema"] = f"site{i}"
            sites.append(entry)
        cohort = out / "cohort.toml"
        cohort.write_text(cohort_text(spec, labels, voc.ids, f"{dataset}-omop"))
    except OSError as exc:
        raise CliError(f"{out}: cannot write: {exc.strerror or exc}", "USAGE") from None
    except DataError as exc:
        raise CliError(str(exc), "BAD_INPUT", data=exc.to_dict()) from None
    done(as_json, {"cohort": str(cohort), "sites": sites},
         f"{len(sites)} OMOP CDM site database(s) of {dataset} "
         f"({', '.join(str(t['trajectories']) for t in sites)} trajectories)",
         [("cohort", str(cohort))] + [(f"site{i}", t["table"]) for i, t in enumerate(sites)])

"""The one way a user's table is named on the command line: ``--spec SPEC --table TABLE``, in every command.

``fcd run``, ``fcd deploy``, ``fcd data validate``, ``fcd data describe`` and ``fcd site init`` read a long-format table
(one row per step) described by a dataset spec (``fcd_secure/data/spec.py``). Each takes the two files as two options,
with the same names and help, checked here: both or neither; the earlier spellings (``--spec SPEC TABLE``, a table as
a positional argument) are refused with the new one named.
"""

from __future__ import annotations

from pathlib import Path

from fcd_secure.cli.envelope import CliError

__all__ = ["LEFTOVER_WORDS", "SPEC_HELP", "TABLE_HELP", "spec_and_table"]

SPEC_HELP = "Your own data: the dataset spec (.toml/.yaml) that describes --table."
TABLE_HELP = ("Your own data: the long-format table (.csv, .csv.gz or .parquet; one row per step) described by "
              "--spec, or an OMOP CDM database (a .duckdb file or postgresql://[user@]host[:port]/db; no password "
              "in it) read with a cohort spec (docs/omop.md).")

#: the context setting of a command with --spec/--table: positional words left over (the old ``--spec SPEC TABLE``
#: leaves TABLE there) reach :func:`spec_and_table` as ``ctx.args``, which names the new form; click alone would say
#: only "unexpected extra argument", and a hidden argument would still show as ``[EXTRA]...`` in the usage line
LEFTOVER_WORDS = {"allow_extra_args": True}


def spec_and_table(spec: Path | None, table: str | Path | list[str] | list[Path] | None,
                   extra: list[str] | None = None, *, required: bool = False) -> tuple[Path, Path | str] | None:
    """``(spec, table)`` when both are given, ``None`` when neither is (unless ``required``).

    Args:
        spec: ``--spec``.
        table: ``--table`` (declared repeatable so that a repeat is refused here, not silently reduced to its last):
            a file, or a ``postgresql://`` URL, returned as text.
        extra: positional words left on the command line (the old ``--spec SPEC TABLE`` form leaves the table there).
        required: the command needs a table.

    Raises:
        CliError: one without the other, ``--table`` given more than once, or a leftover positional word (exit 2,
            naming the form to use).
    """
    if isinstance(table, (list, tuple)):
        if len(table) > 1:
            # click would keep only the last: one site's table, then a misleading "1 site" error downstream
            raise CliError(f"--table given {len(table)} times: one table holds every site's rows, told apart by "
                           "the spec's site column", "USAGE",
                           hint="join the tables first (their header once), or enrol each hospital's own table "
                                "with `fcd site init --table`", data={"tables": [str(t) for t in table]})
        table = table[0] if table else None
    if extra:
        raise CliError(f"unexpected argument {extra[0]!r}: a table is named with --table", "USAGE",
                       hint="use --spec SPEC --table TABLE (two options)")
    if (spec is None) != (table is None) or (required and spec is None):
        missing = "--spec and --table are" if spec is None and table is None else (
            "--table is" if table is None else "--spec is")
        raise CliError(f"{missing} missing: your own data takes both --spec SPEC and --table TABLE", "USAGE",
                       hint="e.g. --spec my_spec.toml --table my_table.csv")
    if spec is None or table is None:
        return None
    from fcd_secure.data.omop.connect import is_server_url  # noqa: PLC0415 - SQLAlchemy only when a table is named

    if is_server_url(table):  # a server, kept as text (a path would fold its //): reached when the data are read
        if not Path(spec).is_file():
            raise CliError(f"--spec {spec}: no such file", "BAD_INPUT", data={"file": str(spec)})
        return Path(spec), str(table)
    for flag, path in (("--spec", spec), ("--table", table)):
        if not Path(path).is_file():
            raise CliError(f"{flag} {path}: no such file", "BAD_INPUT", data={"file": str(path)})
    return Path(spec), Path(table)

"""A site's input as the command line names it (``--spec SPEC --table TABLE``): a dataset spec and a long-format
table file, or a cohort spec and an OMOP CDM database (issue 46).

Every reader of a site's data goes through here, so that the two forms are accepted wherever one is:

- :func:`load_dataset_spec`: the ``DatasetSpec`` of either spec (a cohort spec implies one:
  :meth:`fcd_secure.data.omop.cohort.CohortSpec.dataset_spec`);
- :func:`read_input`: the spec and the long table (read from the file, or checked and extracted from the
  database);
- :func:`dataset_from_input`: the pooled ``SiteDataset``;
- :func:`input_digest`: what a site's install record keeps of its table (the file's SHA-256; nothing for a server).

A cohort spec is told from a dataset spec by its ``cdm`` key; a database by its name (``.duckdb`` / ``.ddb``, or a
``postgresql://`` URL; :func:`fcd_secure.data.omop.connect.is_database`). A cohort spec with a table file, or a
dataset spec with a database, is an error naming both.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fcd_secure._io import file_sha256
from fcd_secure.data.omop.cohort import is_cohort_text, load_cohort
from fcd_secure.data.omop.connect import is_database, is_server_url, open_database
from fcd_secure.data.preprocess import build_dataset, dataset_from_files, read_table
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError, DatasetSpec, load_spec

__all__ = ["TableRef", "check_input", "dataset_from_input", "input_digest", "is_cohort_spec", "load_dataset_spec", "read_input",
           "table_ref"]

#: a table file, or a database (a DuckDB file, or a PostgreSQL URL kept as text: a path would fold its ``//``)
TableRef = Path | str


def table_ref(text: str | os.PathLike[str]) -> TableRef:
    """``--table`` as given: a URL stays text, anything else is a path."""
    return str(text) if is_server_url(text) else Path(text)


def is_cohort_spec(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an OMOP cohort spec (a TOML file with a ``cdm`` key)."""
    p = Path(path)
    return p.suffix.lower() == ".toml" and p.is_file() and is_cohort_text(p.read_text(encoding="utf-8"))


def load_dataset_spec(path: str | os.PathLike[str]) -> DatasetSpec:
    """The ``DatasetSpec`` of a dataset spec or of a cohort spec.

    Raises:
        DataError: the file is missing, does not parse or does not validate (the field named).
    """
    return load_cohort(path).dataset_spec() if is_cohort_spec(path) else load_spec(path)


def _pair(spec_path: str | os.PathLike[str], table: TableRef) -> bool:
    cohort, database = is_cohort_spec(spec_path), is_database(table)
    if cohort != database:
        what = ("a cohort spec reads an OMOP database (a .duckdb file or a postgresql:// URL)" if cohort else
                "a database is read with an OMOP cohort spec (cdm = \"OMOP 5.4\")")
        raise DataError(f"{what}, but --spec is {spec_path} and --table is {table}", file=spec_path, field="cdm")
    return cohort


def read_input(spec_path: str | os.PathLike[str], table: TableRef) -> tuple[DatasetSpec, pd.DataFrame]:
    """The spec and the long table of a site's input (module docstring).

    Raises:
        DataError: as :func:`fcd_secure.data.preprocess.read_table`, or as the database checks and extraction
            (:func:`fcd_secure.data.omop.extract.check_database`, :func:`~fcd_secure.data.omop.extract.extract`).
    """
    if not _pair(spec_path, table):
        return load_spec(spec_path), read_table(table)
    from fcd_secure.data.omop.extract import check_database, extract  # noqa: PLC0415 - SQLAlchemy only when used

    cohort = load_cohort(spec_path)
    db = open_database(table)
    try:
        check_database(db, cohort)
        return cohort.dataset_spec(), extract(db, cohort)
    finally:
        db.close()


def dataset_from_input(spec_path: str | os.PathLike[str], table: TableRef) -> tuple[DatasetSpec, SiteDataset]:
    """The spec and the pooled dataset of a site's input (:func:`read_input`, then
    :func:`fcd_secure.data.preprocess.build_dataset`).

    Raises:
        DataError: any problem with either input, the file, table, column, concept id or spec field named.
    """
    if not _pair(spec_path, table):
        return dataset_from_files(spec_path, table)
    spec, df = read_input(spec_path, table)
    return spec, build_dataset(spec, df, str(table))


def input_digest(table: TableRef) -> str | None:
    """The SHA-256 of a table or DuckDB file; None for a database server (its content is the server's)."""
    return None if isinstance(table, str) and not Path(table).is_file() else file_sha256(Path(table))


def check_input(spec_path: str | os.PathLike[str], table: TableRef) -> str | None:
    """For a CDM database, what ``fcd site preflight`` checks before anything starts: the connection, the CDM
    tables and columns the cohort reads, its concept ids (each with rows) and units. None for a table file.

    Returns:
        A one-line account (the database, how many concept ids were found with how many rows).

    Raises:
        DataError: the failed check, naming the host and port or file, the table, concept id or spec field.
    """
    if not _pair(spec_path, table):
        return None
    from fcd_secure.data.omop.extract import check_database  # noqa: PLC0415 - SQLAlchemy only when used

    cohort = load_cohort(spec_path)
    db = open_database(table)
    try:
        counts = check_database(db, cohort)
    finally:
        db.close()
    return (f"{db.label}: the CDM tables and columns the cohort reads are there; {len(counts)} concept id(s), "
            f"{sum(counts.values())} row(s)")

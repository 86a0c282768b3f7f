"""A CDM database named on the command line, opened read-only; the password never comes from a file we write.

``--table`` names the database in one of two ways:

- a DuckDB file (``.duckdb`` / ``.ddb``): opened with ``read_only`` (https://duckdb.org/docs/api/python/dbapi);
  the default, and what the tests and ``fcd data export --format omop`` use;
- ``postgresql://[user@]host[:port]/dbname[?sslmode=...]``: a PostgreSQL server through psycopg 3
  (https://www.psycopg.org/psycopg3/docs/). The URL carries no password: libpq takes it from ``PGPASSWORD`` or the
  password file (``~/.pgpass``, ``$PGPASSFILE``; https://www.postgresql.org/docs/current/libpq-pgpass.html), and the
  user from the URL or ``PGUSER``. A URL with a password is refused, because the URL is written into the run's
  config, the site's install record and the logs. Every transaction is read-only
  (``default_transaction_read_only``), so a read-only role is enough and nothing is ever written to the CDM.

Errors name the file or the host, port and database, never a password.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from fcd_secure.data.spec import DataError

__all__ = ["DUCKDB_SUFFIXES", "Database", "is_database", "is_server_url", "open_database", "server_label"]

DUCKDB_SUFFIXES = (".duckdb", ".ddb")
_PG_SCHEMES = ("postgresql://", "postgres://")


def is_server_url(table: str | os.PathLike[str]) -> bool:
    """Whether ``--table`` names a database server (a ``postgresql://`` URL), which is kept as text, not a path."""
    return str(table).startswith(_PG_SCHEMES)


def is_database(table: str | os.PathLike[str]) -> bool:
    """Whether ``--table`` names a CDM database (a DuckDB file or a PostgreSQL URL) rather than a table file."""
    return is_server_url(table) or str(table).lower().endswith(DUCKDB_SUFFIXES)


@dataclass(frozen=True)
class Database:
    """An open, read-only CDM database: its engine, and how messages name it (never with a password)."""

    engine: sa.engine.Engine
    label: str
    dialect: str

    def close(self) -> None:
        self.engine.dispose()


def server_label(url_text: str) -> str:
    """How messages name a PostgreSQL database: ``postgresql://host:port/dbname``, never user or password.

    Raises:
        DataError: not a URL, a URL with a password, or one without a database.
    """
    try:
        url = sa.engine.make_url(url_text)
    except sa.exc.ArgumentError:
        raise DataError("not a PostgreSQL URL; use postgresql://[user@]host[:port]/dbname") from None
    label = f"postgresql://{url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"
    if url.password is not None:
        raise DataError("the database URL carries a password; put it in PGPASSWORD or the PostgreSQL password file "
                        "(~/.pgpass, $PGPASSFILE) and leave it out of the URL, which is written into the run's "
                        "config and logs", file=label)
    if not url.database:
        raise DataError("the database URL names no database (postgresql://host:port/DBNAME)", file=label)
    return label


def _postgres(url_text: str) -> Database:
    label = server_label(url_text)
    url = sa.engine.make_url(url_text)
    # every transaction read-only: a read-only role suffices and a slip can never write to the CDM. The URL's own
    # libpq options (e.g. ?options=-csearch_path%3Dcdm, the site's CDM schema) are kept
    options = " ".join(filter(None, [url.query.get("options"), "-c default_transaction_read_only=on"]))
    engine = sa.create_engine(
        url.set(drivername="postgresql+psycopg").difference_update_query(["options"]),
        connect_args={"options": options, "connect_timeout": 10},
        poolclass=sa.pool.NullPool,
    )
    return Database(engine, label, "postgresql")


def _duckdb(path: Path) -> Database:
    if not path.is_file():
        # duckdb.connect would create an empty database here: an absent file is an error, not an empty cohort
        raise DataError("DuckDB database file not found", file=path)
    engine = sa.create_engine(f"duckdb:///{path.resolve()}", connect_args={"read_only": True},
                              poolclass=sa.pool.NullPool)
    return Database(engine, str(path), "duckdb")


def open_database(table: str | os.PathLike[str]) -> Database:
    """Open the database ``table`` names and check that it answers.

    Raises:
        DataError: a URL with a password or without a database, a missing DuckDB file, or a server that cannot be
            reached (host, port and database named, with the driver's reason).
    """
    text = str(table)
    db = _postgres(text) if text.startswith(_PG_SCHEMES) else _duckdb(Path(text))
    try:
        with db.engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except sa.exc.DBAPIError as exc:
        db.close()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
        raise DataError(f"cannot reach the database: {reason}", file=db.label) from None
    return db

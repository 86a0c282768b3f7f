"""Issue 46 against a real PostgreSQL server the test starts (``tests/pg_server.py``): the same cohort read from
PostgreSQL and DuckDB, a read-only role granted as docs/omop.md tells a DBA, the password only from ``PGPASSWORD``
or a password file and in no file a run writes, unreachable servers and bad passwords named by host and port, and a
federated run over the CDM that answers as the run over the CSV export. The ``fcd`` commands run in the test's process
(``cli_cases.fcd_here``, the password in ``os.environ`` for the command's duration only), but the run over the CDM:
a fresh process, whose whole output is checked for the password.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import tomli_w

from fcd_secure.data.inputs import check_input, read_input
from fcd_secure.data.omop.connect import open_database
from fcd_secure.data.omop.synth import Vocabulary, cdm_instance, cohort_text, write_duckdb, write_postgres
from fcd_secure.data.spec import DataError, DatasetSpec
from cli_cases import fcd_here
from pg_server import READER, postgres_bin, start, stop
from test_omop import LABELS, csv_as_extracted, fcd

BIN = postgres_bin()
pytestmark = [
    pytest.mark.skipif(BIN is None, reason="PostgreSQL server binaries (initdb, pg_ctl) are not installed; "
                                           ".ci/run installs them"),
    pytest.mark.xdist_group("omop-postgres"),
]


def grant_reader(srv, schema: str) -> None:
    """What docs/omop.md asks of a site's DBA: a login role that may read the CDM schema and nothing else."""
    srv.psql(f"grant connect on database cdm to {READER}; grant usage on schema {schema} to {READER}; "
             f"grant select on all tables in schema {schema} to {READER}")


@pytest.fixture(scope="module")
def pg():
    srv = start(BIN)
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def exported(pg, tmp_path_factory):
    """The tumour world as CSV and as OMOP (DuckDB files, and site i in schema site<i> of the server), one seed."""
    base = tmp_path_factory.mktemp("omop-pg")
    admin = {"PGPASSWORD": pg.admin_password}
    res = fcd_here("data", "export", "--dataset", "tumour", "--preset", "tiny", "--sites", "4", "--seed", "5",
                   "--format", "csv", "--out", base / "csv", columns=120)
    assert res.returncode == 0, res.stderr[-3000:]
    res = fcd_here("data", "export", "--dataset", "tumour", "--preset", "tiny", "--sites", "4", "--seed", "5",
                   "--format", "omop", "--out", base / "omop", "--postgres", pg.url("fcd_admin"), columns=120,
                   env=admin)
    assert res.returncode == 0, res.stderr[-3000:]
    for i in range(4):
        grant_reader(pg, f"site{i}")
    return base


def test_postgres_and_duckdb_give_the_csv_table(pg, exported, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", pg.reader_password)
    cohort = exported / "omop" / "cohort.toml"
    for i in range(4):
        want = csv_as_extracted(exported / "csv" / f"site{i}.csv")
        _, from_pg = read_input(cohort, pg.url(READER, schema=f"site{i}"))
        _, from_duckdb = read_input(cohort, exported / "omop" / f"site{i}.duckdb")
        pd.testing.assert_frame_equal(from_pg, want, check_dtype=False)
        pd.testing.assert_frame_equal(from_duckdb, want, check_dtype=False)


def test_the_password_file_is_read_and_nothing_can_be_written(pg, exported, tmp_path, monkeypatch):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{pg.port}:cdm:{READER}:{pg.reader_password}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    found = check_input(exported / "omop" / "cohort.toml", pg.url(READER, schema="site0"))
    assert f"postgresql://127.0.0.1:{pg.port}/cdm" in found and "concept id(s)" in found
    # even the superuser's connection is read-only: the extraction can never write to the CDM
    monkeypatch.setenv("PGPASSWORD", pg.admin_password)
    db = open_database(pg.url("fcd_admin", schema="site0"))
    try:
        with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"), db.engine.connect() as conn:
            conn.execute(sa.text("create table written (a int)"))
    finally:
        db.close()


def test_unreachable_servers_and_bad_passwords_are_named_without_the_password(pg, exported, monkeypatch):
    cohort = exported / "omop" / "cohort.toml"
    monkeypatch.setenv("PGPASSWORD", pg.reader_password)
    closed = pg.port + 1 if pg.port < 65535 else pg.port - 1
    with pytest.raises(DataError) as err:
        read_input(cohort, f"postgresql://{READER}@127.0.0.1:{closed}/cdm")
    assert f"postgresql://127.0.0.1:{closed}/cdm" in str(err.value) and "cannot reach the database" in str(err.value)
    monkeypatch.setenv("PGPASSWORD", "not-" + pg.reader_password)
    with pytest.raises(DataError, match="password authentication failed") as err:
        read_input(cohort, pg.url(READER, schema="site0"))
    assert pg.reader_password not in str(err.value) and f"127.0.0.1:{pg.port}" in str(err.value)
    with pytest.raises(DataError, match="carries a password") as err:
        read_input(cohort, f"postgresql://{READER}:{pg.reader_password}@127.0.0.1:{pg.port}/cdm")
    assert pg.reader_password not in str(err.value)


def test_a_role_without_grants_gets_a_named_error(pg, exported, monkeypatch):
    pg.psql("create schema if not exists hidden")
    monkeypatch.setenv("PGPASSWORD", pg.reader_password)
    with pytest.raises(DataError, match="CDM table 'person' is missing from the default schema"):
        read_input(exported / "omop" / "cohort.toml", pg.url(READER, schema="hidden"))


def _files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.slow
def test_a_run_over_the_cdm_answers_as_the_csv_run_and_writes_no_password(pg, exported, tmp_path, monkeypatch,
                                                                           one_torch_thread):
    """The four sites in one CDM (one care site each) and in one CSV table: the same federated run over both (on the
    in-process engine: the claim is the data path, not the engine)."""
    csvs = [pd.read_csv(exported / "csv" / f"site{i}.csv") for i in range(4)]
    pooled = pd.concat(csvs, ignore_index=True)
    spec_doc = tomllib.loads((exported / "csv" / "spec.toml").read_text())
    for key in ("propensity", "n_actions"):
        spec_doc.pop(key)
    spec_doc.update(actions=LABELS, name="tumour-omop")
    spec = DatasetSpec.model_validate(spec_doc)
    voc = Vocabulary()
    inst = cdm_instance(pooled, spec, LABELS, voc)
    monkeypatch.setenv("PGPASSWORD", pg.admin_password)
    write_postgres(inst, pg.url("fcd_admin"), "pooled")
    write_duckdb(inst, tmp_path / "pooled.duckdb")
    grant_reader(pg, "pooled")
    table = pooled.drop(columns=["propensity"])
    table["action"] = np.asarray(LABELS, dtype=object)[table["action"].to_numpy()]
    table.to_csv(tmp_path / "pooled.csv", index=False)
    (tmp_path / "spec.toml").write_text(tomli_w.dumps(spec_doc))
    cohort = tmp_path / "cohort.toml"
    cohort.write_text(cohort_text(spec, LABELS, voc.ids, "tumour-omop"))
    args = ("--preset", "tiny", "--rounds", "1", "--seed", "0", "--no-secure-aggregation", "-p", "never", "-p",
            "always", "--engine", "inprocess")
    env = {"PGPASSWORD": pg.reader_password}
    omop = fcd("run", *args, "--spec", cohort, "--table", pg.url(READER, schema="pooled"), "--out", "omop-run",
               cwd=tmp_path, env=env)
    assert omop.returncode == 0, omop.stdout[-3000:] + omop.stderr[-3000:]
    # the CSV run reads no password: in this process (cli_cases), sparing a fresh interpreter
    plain = fcd_here("run", *args, "--spec", tmp_path / "spec.toml", "--table", tmp_path / "pooled.csv", "--out",
                     tmp_path / "csv-run", columns=120)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    a = json.loads((tmp_path / "omop-run" / "summary.json").read_text())
    b = json.loads((tmp_path / "csv-run" / "summary.json").read_text())
    assert a["policies"] == b["policies"] and a["policies"]["never"]["n"] > 0
    # the password is in no file the run wrote, nor in what it printed
    assert _files_holding(tmp_path / "omop-run", pg.reader_password) == []
    assert pg.reader_password not in omop.stdout + omop.stderr
    config = (tmp_path / "omop-run" / "config.toml").read_text()
    assert f"127.0.0.1:{pg.port}/cdm" in config


def test_site_init_records_the_database_without_its_password(pg, exported, tmp_path):
    home = tmp_path / "home"
    res = fcd_here("site", "init", "--spec", exported / "omop" / "cohort.toml", "--table",
                   pg.url(READER, schema="site0"), "--home", home, "--site-id", "site-0", "--json", columns=120,
                   env={"PGPASSWORD": pg.reader_password})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _files_holding(home, pg.reader_password) == []
    assert pg.url(READER, schema="site0") in (home / "site.toml").read_text()
    bad = fcd_here("site", "init", "--spec", exported / "omop" / "cohort.toml", "--table",
                   f"postgresql://{READER}@127.0.0.1:{pg.port}/nodb", "--home", tmp_path / "h2", "--site-id",
                   "site-0", columns=120, env={"PGPASSWORD": pg.reader_password})
    assert bad.returncode == 2 and f"127.0.0.1:{pg.port}/nodb" in bad.stdout + bad.stderr
    assert not (tmp_path / "h2" / "site.toml").exists()

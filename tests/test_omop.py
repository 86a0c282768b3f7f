"""Issue 46 against DuckDB: a site's cohort read from an OMOP CDM database.

The tumour world exported twice with one seed, as CSV tables and as OMOP CDM instances (``fcd data export --format
omop``), reads back as the same trajectories; each bad input is refused before any work, naming the table, concept
id or setting; a hand-made CDM checks the time grid (visits, carried values, exposures over several days, measured
and death outcomes, person statics). The ``fcd`` commands run in the test's process (``cli_cases.fcd_here``: the same
command group, exit codes and streams, without a fresh interpreter's imports).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
import tomli_w
from cli_cases import fcd_here

from fcd_secure.data.inputs import dataset_from_input, read_input
from fcd_secure.data.omop.cdm import TABLES
from fcd_secure.data.omop.synth import CdmInstance, write_duckdb
from fcd_secure.data.paths import PROJECT_ROOT
from fcd_secure.data.spec import DataError

LABELS = ["none", "chemo", "radio", "both"]


def fcd(*args, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``fcd`` in a fresh process with ``env`` added (test_omop_postgres.py: a password only in the environment of
    the process that reads the database); the commands here run in the test's process (``cli_cases.fcd_here``)."""
    full = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(PROJECT_ROOT), "COLUMNS": "120",
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "fcd_secure.cli.main", *map(str, args)], capture_output=True,
                          text=True, env=full, timeout=timeout, cwd=cwd)


def csv_as_extracted(path: Path) -> pd.DataFrame:
    """The CSV export's table as the OMOP path gives it: no logged propensity (a CDM holds none), action labels."""
    df = pd.read_csv(path).drop(columns=["propensity"])
    df["action"] = np.asarray(LABELS, dtype=object)[df["action"].to_numpy()]
    return df


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("omop")
    for fmt in ("csv", "omop"):
        res = fcd_here("data", "export", "--dataset", "tumour", "--preset", "tiny", "--sites", "2", "--seed", "3",
                       "--format", fmt, "--out", base / fmt, "--json", columns=120)
        assert res.returncode == 0, res.stderr[-3000:]
    return base


def test_omop_export_reads_back_as_the_csv_export(exported):
    cohort = exported / "omop" / "cohort.toml"
    for i in range(2):
        spec, got = read_input(cohort, exported / "omop" / f"site{i}.duckdb")
        want = csv_as_extracted(exported / "csv" / f"site{i}.csv")
        pd.testing.assert_frame_equal(got, want, check_dtype=False)
        assert spec.actions == LABELS and spec.propensity is None
    # the encoded trajectories a run trains on are the same arrays
    csv_spec = tomllib.loads((exported / "csv" / "spec.toml").read_text())
    for key in ("propensity", "n_actions"):
        csv_spec.pop(key)
    csv_spec["actions"] = LABELS
    (exported / "np.toml").write_text(tomli_w.dumps(csv_spec))
    csv_as_extracted(exported / "csv" / "site1.csv").to_csv(exported / "np.csv", index=False)
    _, a = dataset_from_input(exported / "np.toml", exported / "np.csv")
    _, b = dataset_from_input(cohort, exported / "omop" / "site1.duckdb")
    for k in "XATYM":
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert list(a.meta["entity"]) == list(b.meta["entity"]) and a.meta["a_names"] == b.meta["a_names"]


def test_fcd_data_validate_reads_a_duckdb_cdm(exported):
    res = fcd_here("data", "validate", "--spec", exported / "omop" / "cohort.toml", "--table",
                   exported / "omop" / "site0.duckdb", "--json", columns=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"action_names": [\n' in res.stdout or '"action_names": ["none"' in res.stdout.replace("\n", "")


# ---------------------------------------------------------------------------------------------------------------
# bad input: a clear error before any work, naming the table, concept id or setting
# ---------------------------------------------------------------------------------------------------------------


def _variant(exported: Path, tmp_path: Path, sql: str | None = None, edit=None) -> tuple[Path, Path]:
    db = tmp_path / "site.duckdb"
    shutil.copy(exported / "omop" / "site0.duckdb", db)
    if sql:
        con = duckdb.connect(str(db))
        con.execute(sql)
        con.close()
    cohort = tomllib.loads((exported / "omop" / "cohort.toml").read_text())
    if edit:
        edit(cohort)
    path = tmp_path / "cohort.toml"
    path.write_text(tomli_w.dumps(cohort))
    return path, db


def _concept(exported: Path, what: str) -> int:
    cohort = tomllib.loads((exported / "omop" / "cohort.toml").read_text())
    return {c["name"]: c["concept_ids"][0] for c in cohort["context"]}[what]


def test_a_missing_cdm_table_is_named(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, "drop table procedure_occurrence")
    with pytest.raises(DataError, match="CDM table 'procedure_occurrence' is missing"):
        read_input(cohort, db)


def test_a_missing_cdm_column_is_named(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, "alter table measurement drop column unit_concept_id")
    with pytest.raises(DataError, match="CDM table 'measurement' has no column 'unit_concept_id'") as err:
        read_input(cohort, db)
    assert err.value.column == "measurement.unit_concept_id"


def test_a_concept_id_without_rows_is_named(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, edit=lambda c: c["treatment"][0]["concept_ids"].append(2099999999))
    with pytest.raises(DataError, match="concept id 2099999999 has no rows in CDM table 'drug_exposure'") as err:
        read_input(cohort, db)
    assert err.value.field == "treatment[0].concept_ids"


def test_a_unit_mismatch_is_named(exported, tmp_path):
    vol = _concept(exported, "tumour_volume")
    cohort, db = _variant(exported, tmp_path, f"update measurement set unit_concept_id = 8587 "
                                              f"where measurement_id = (select min(measurement_id) from measurement "
                                              f"where measurement_concept_id = {vol})")
    with pytest.raises(DataError, match=f"concept id {vol} have unit_concept_id 8587") as err:
        read_input(cohort, db)
    assert err.value.field == "context[0].unit_concept_ids"


def test_an_empty_cohort_is_refused(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, "delete from observation_period")
    with pytest.raises(DataError, match="the cohort is empty: no person with an observation period") as err:
        read_input(cohort, db)
    assert err.value.field == "entity"


def test_a_grid_below_the_floor_for_every_entity_is_refused(exported, tmp_path):
    def coarse(c):
        c["grid"].update(step_days=30, min_steps=2)

    cohort, db = _variant(exported, tmp_path, edit=coarse)
    with pytest.raises(DataError, match="fewer than min_steps = 2 steps of 30 day") as err:
        read_input(cohort, db)
    assert err.value.field == "grid.min_steps"


def test_a_step_whose_treatments_match_no_action_is_named(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, edit=lambda c: c["action"].pop())
    with pytest.raises(DataError, match=r"give \['chemo', 'radio'\], which no \[\[action\]\] lists") as err:
        read_input(cohort, db)
    assert err.value.field == "action"


def test_a_missing_database_file_is_named_and_not_created(tmp_path, exported):
    gone = tmp_path / "nowhere.duckdb"
    with pytest.raises(DataError, match="DuckDB database file not found"):
        read_input(exported / "omop" / "cohort.toml", gone)
    assert not gone.exists()


def test_a_cohort_spec_with_a_table_file_is_refused(exported):
    with pytest.raises(DataError, match="a cohort spec reads an OMOP database"):
        read_input(exported / "omop" / "cohort.toml", exported / "csv" / "site0.csv")


def test_a_bad_cohort_spec_names_its_field(exported, tmp_path):
    cohort, _ = _variant(exported, tmp_path, edit=lambda c: c["action"][1].update(given=["chemotherapy"]))
    with pytest.raises(DataError, match="'chemotherapy', which no \\[\\[treatment\\]\\] names"):
        read_input(cohort, exported / "omop" / "site0.duckdb")


def test_fcd_run_refuses_a_bad_cohort_with_exit_2_before_it_starts(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, edit=lambda c: c["context"][1]["concept_ids"].append(2099999998))
    res = fcd_here("run", "--preset", "tiny", "--spec", cohort, "--table", db, "--out", tmp_path / "run", "--json",
                   columns=120)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "concept id 2099999998 has no rows in CDM table 'measurement'" in res.stdout + res.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# the time grid on a hand-made CDM
# ---------------------------------------------------------------------------------------------------------------


def _frame(table: str, rows: list[tuple]) -> pd.DataFrame:
    cols = [c for c, _, _ in TABLES[table]]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)


D = dt.date(2021, 3, 1)


def _day(k: int) -> dt.date:
    return D + dt.timedelta(days=k)


def test_visits_carried_values_spanning_exposures_and_measured_outcomes(tmp_path):
    """Two stays (9201) of person 1 and one of person 2, 2-day steps: a drug given over days 1-4 marks steps 0-2;
    a lab value carries 2 days; the outcome is the step's last lab value at most 5; age is taken at the index."""
    lab, unit, drug, kidney = 3000001, 8840, 1503297, 201826
    inst = CdmInstance({
        "concept": _frame("concept", []),
        "care_site": _frame("care_site", [(1, "ward-7")]),
        "person": _frame("person", [(1, 8507, 1950, 0, 0, 1, "p1"), (2, 8532, 1980, 0, 0, 1, "p2")]),
        "observation_period": _frame("observation_period", [(1, 1, _day(-400), _day(400), 32817),
                                                            (2, 2, _day(-400), _day(400), 32817)]),
        "visit_occurrence": _frame("visit_occurrence", [
            (10, 1, 9201, _day(0), _day(5), 32817, 1, "v10"),      # 3 steps
            (11, 1, 9202, _day(20), _day(21), 32817, 1, "v11"),    # an outpatient visit: not a stay
            (12, 2, 9201, _day(30), _day(31), 32817, 1, "v12"),    # 1 step
        ]),
        "drug_exposure": _frame("drug_exposure", [(1, 1, drug, _day(1), _day(4), 32817)]),
        "procedure_occurrence": _frame("procedure_occurrence", []),
        "condition_occurrence": _frame("condition_occurrence", [(1, 2, kidney, _day(10), 32817)]),
        "measurement": _frame("measurement", [
            (1, 1, lab, _day(0), 32817, 4.0, unit), (2, 1, lab, _day(1), 32817, 6.0, unit),  # step 0: last is 6
            (3, 1, lab, _day(3), 32817, 5.0, unit),                                           # step 1: 5
            (4, 1, lab, _day(4), 32817, 7.0, unit),                                           # step 2: 7
            (5, 2, lab, _day(30), 32817, 2.0, unit),
        ]),
        "observation": _frame("observation", []),
        "death": _frame("death", []),
    })
    db = write_duckdb(inst, tmp_path / "cdm.duckdb")
    cohort = {
        "cdm": "OMOP 5.4", "name": "stays",
        "entity": {"kind": "visit", "id": "visit_source_value", "visit_concept_ids": [9201]},
        "grid": {"step_days": 2, "max_steps": 5, "min_steps": 1},
        "site": {"name": "hospital-a"},
        "treatment": [{"name": "drug", "table": "drug_exposure", "concept_ids": [drug]}],
        "action": [{"label": "off", "given": []}, {"label": "on", "given": ["drug"]}],
        "context": [{"name": "lab", "concept_ids": [lab], "unit_concept_ids": [unit], "carry_days": 2}],
        "static": [{"name": "age", "source": "person", "field": "age"},
                   {"name": "ckd", "kind": "binary", "source": "condition", "concept_ids": [kidney]}],
        "outcome": {"kind": "measurement", "concept_ids": [lab], "unit_concept_ids": [unit], "threshold": 5.0},
    }
    path = tmp_path / "cohort.toml"
    path.write_text(tomli_w.dumps(cohort))
    _, got = read_input(path, db)
    assert got["entity"].tolist() == ["v10", "v10", "v10", "v12"]
    assert got["t"].tolist() == [0, 1, 2, 0] and set(got["site"]) == {"hospital-a"}
    assert got["action"].tolist() == ["on", "on", "on", "off"]
    assert got["lab"].tolist() == [6.0, 5.0, 7.0, 2.0]
    assert got["outcome"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert got["age"].tolist() == [71.0, 71.0, 71.0, 41.0]
    assert got["ckd"].tolist() == [0.0, 0.0, 0.0, 1.0]  # person 2's condition precedes the stay

    # the death outcome ends the trajectory on the day of death and marks that step
    inst.frames["death"] = _frame("death", [(1, _day(3))])
    db = write_duckdb(inst, tmp_path / "cdm.duckdb")
    cohort["outcome"] = {"kind": "death"}
    path.write_text(tomli_w.dumps(cohort))
    _, got = read_input(path, db)
    assert got["entity"].tolist() == ["v10", "v10", "v12"] and got["outcome"].tolist() == [0.0, 1.0, 0.0]


def test_dkt_synth_exports_as_omop_and_reads_back(tmp_path):
    """DKT-Synth's items are one drug concept each (every step gives exactly one), its clock an exogenous
    measurement: the CDM reads back as the CSV export of the same seed."""
    for fmt in ("csv", "omop"):
        res = fcd_here("data", "export", "--dataset", "dkt-synth", "--preset", "tiny", "--sites", "2", "--format",
                       fmt, "--out", tmp_path / fmt, columns=120)
        assert res.returncode == 0, res.stderr[-3000:]
    spec, got = read_input(tmp_path / "omop" / "cohort.toml", tmp_path / "omop" / "site0.duckdb")
    want = pd.read_csv(tmp_path / "csv" / "site0.csv").drop(columns=["propensity"])
    want["action"] = np.asarray(spec.actions, dtype=object)[want["action"].to_numpy()]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert [c.dynamics for c in spec.context] == ["exogenous"] and len(spec.actions) > 4


def test_an_entity_id_that_is_not_unique_is_refused(exported, tmp_path):
    cohort, db = _variant(exported, tmp_path, "update person set person_source_value = 'twin' where person_id <= 2")
    with pytest.raises(DataError, match="person_source_value 'twin' names 2 entities") as err:
        read_input(cohort, db)
    assert err.value.field == "entity.id"


def test_a_run_over_a_cohort_spec_reads_its_declaration_of_unrecorded_confounding_from_the_spec_it_implies(exported):
    """``queries.declared`` reads a run's spec the way the run does (``data.inputs.load_dataset_spec``): an OMOP
    cohort spec is not a table spec, and the evaluation must not refuse it as one (the CI failure of this stop:
    "field 'static[0].source': unknown key 'source'" after the run had trained)."""
    from fcd_secure.config import build_config
    from fcd_secure.queries.declared import declared_confounding

    cfg = build_config("tiny", {"data": {"dataset": "spec", "spec": str(exported / "omop" / "cohort.toml"),
                                         "table": str(exported / "omop" / "site0.duckdb")}})
    assert declared_confounding(cfg) is None  # the cohort declares none; reading it raises nothing

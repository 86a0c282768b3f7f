"""A generated world's sites written as OMOP CDM v5.4 instances, with the cohort spec that reads them back.

``fcd data export --format omop`` writes what an OHDSI site holds: one CDM database per site (a DuckDB file, and
optionally a schema per site in a PostgreSQL database), the ``concept`` rows of every concept it uses, and one cohort
spec for all sites. Reading a site's database with the cohort spec (:func:`fcd_secure.data.omop.extract.extract`)
gives the site's long table back, row for row, as the CSV export writes it (without the logged propensity, which a
CDM does not hold).

How a long table becomes CDM rows (every concept is a site-local one, in the OMOP 2-billion range, vocabulary
``FCD-Synth``; a real site maps its own standard concepts in its cohort spec):

- an entity is a ``person`` (``person_source_value`` = its entity id) with one ``observation_period`` from its index
  date over its steps (one day each), at the ``care_site`` named after the site;
- a binary static is a ``condition_occurrence`` 30 days before the index when it is 1; a continuous static an
  ``observation`` value on the index day;
- a context is one ``measurement`` per step, in its own unit concept;
- an action is the set of treatments it gives (the tumour world: chemotherapy a ``drug_exposure``, radiotherapy a
  ``procedure_occurrence``, both both; any other world, DKT-Synth's items, one ``drug_exposure`` concept per
  action), one row per step it is given;
- a binary outcome is a ``condition_occurrence`` on each day it is 1.
"""

from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa
import tomli_w

from fcd_secure.data.omop.cdm import TABLES, cdm_tables
from fcd_secure.data.omop.connect import server_label
from fcd_secure.data.spec import DataError, DatasetSpec

__all__ = ["CdmInstance", "Vocabulary", "cdm_instance", "cohort_text", "write_duckdb", "write_postgres"]

#: the first concept id of the generated vocabulary (OMOP keeps ids above 2,000,000,000 for a site's own concepts)
LOCAL_CONCEPT_BASE = 2_000_000_000
VOCABULARY = "FCD-Synth"
#: the day every index date counts from (entity k starts k mod 365 days later)
EPOCH = dt.date(2020, 1, 1)
#: the tumour world's actions as treatments (``fcd_secure.data.tumour.pkpd.ACTION_LABELS``)
TUMOUR_TREATMENTS = {"chemo": "drug_exposure", "radio": "procedure_occurrence"}
TUMOUR_ACTIONS = {"none": [], "chemo": ["chemo"], "radio": ["radio"], "both": ["chemo", "radio"]}
_TYPE = 32817  # "EHR" type concept of every row (OMOP type concepts)


@dataclass
class CdmInstance:
    """The CDM rows of one site (table -> frame, columns as declared in :mod:`.cdm`) and the concept ids used."""

    frames: dict[str, pd.DataFrame]
    concepts: dict[str, int] = field(default_factory=dict)


@dataclass
class Vocabulary:
    """The site-local concepts of an export: the same name always gets the same id, on every site."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)

    def id(self, name: str, domain: str, klass: str) -> int:
        if name not in self.ids:
            cid = LOCAL_CONCEPT_BASE + 1 + len(self.ids)
            self.ids[name] = cid
            self.rows.append({"concept_id": cid, "concept_name": name, "domain_id": domain,
                              "vocabulary_id": VOCABULARY, "concept_class_id": klass, "standard_concept": "S",
                              "concept_code": name, "valid_start_date": dt.date(1970, 1, 1),
                              "valid_end_date": dt.date(2099, 12, 31)})
        return self.ids[name]

    def frame(self) -> pd.DataFrame:
        """The ``concept`` rows of every concept named so far."""
        return pd.DataFrame(self.rows)


def _plan(spec: DatasetSpec, labels: list[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Treatments and the treatments each action gives: the tumour world's when its labels are, else one
    ``drug_exposure`` concept per action (DKT-Synth's items: every step gives exactly one)."""
    if labels == list(TUMOUR_ACTIONS):
        return dict(TUMOUR_TREATMENTS), {k: list(v) for k, v in TUMOUR_ACTIONS.items()}
    return {f"action {a}": "drug_exposure" for a in labels}, {a: [f"action {a}"] for a in labels}


def _static_kinds(spec: DatasetSpec) -> dict[str, str]:
    return {c.name: c.kind for c in spec.static}


def cdm_instance(table: pd.DataFrame, spec: DatasetSpec, labels: list[str], vocabulary: "Vocabulary | None" = None,
                 ) -> CdmInstance:
    """One site's long table (``fcd_secure.data.long_tables.long_table``: entity, t, site, statics, contexts,
    integer action, binary outcome) as CDM rows."""
    voc = vocabulary or Vocabulary()
    treatments, given = _plan(spec, labels)
    ents, first = np.unique(table[spec.entity].to_numpy(), return_index=True)
    order = np.argsort(first)
    ents, first = ents[order], first[order]
    e_of = pd.Index(ents).get_indexer(table[spec.entity].to_numpy())
    n = len(ents)
    pid = np.arange(1, n + 1)
    start = np.array([EPOCH + dt.timedelta(days=int(k % 365)) for k in range(n)], dtype="datetime64[D]")
    steps = np.bincount(e_of, minlength=n)
    t = table[spec.time].to_numpy(np.int64)
    day = start[e_of] + t.astype("timedelta64[D]")
    site_names = table[spec.site].to_numpy()[first]
    sites = {name: i + 1 for i, name in enumerate(dict.fromkeys(site_names))}
    frames: dict[str, pd.DataFrame] = {
        "care_site": pd.DataFrame({"care_site_id": list(sites.values()), "care_site_name": list(sites)}),
        "person": pd.DataFrame({"person_id": pid, "gender_concept_id": 0, "year_of_birth": 1960,
                                "race_concept_id": 0, "ethnicity_concept_id": 0,
                                "care_site_id": [sites[s] for s in site_names], "person_source_value": ents}),
        "observation_period": pd.DataFrame({
            "observation_period_id": pid, "person_id": pid, "observation_period_start_date": start,
            "observation_period_end_date": start + (steps - 1).astype("timedelta64[D]"),
            "period_type_concept_id": _TYPE}),
        "death": pd.DataFrame({"person_id": pd.Series(dtype=np.int64), "death_date": pd.Series(dtype="datetime64[s]")}),
        "visit_occurrence": pd.DataFrame({c: [] for c, _, _ in TABLES["visit_occurrence"]}),
    }
    cond: list[pd.DataFrame] = []
    obs: list[pd.DataFrame] = []
    meas: list[pd.DataFrame] = []
    for name, kind in _static_kinds(spec).items():
        v = table[name].to_numpy(np.float64)[first]
        if kind == "binary":
            on = v == 1.0
            cond.append(pd.DataFrame({"person_id": pid[on], "condition_concept_id": voc.id(name, "Condition", "Clinical Finding"),
                                      "condition_start_date": start[on] - np.timedelta64(30, "D")}))
        else:
            obs.append(pd.DataFrame({"person_id": pid, "observation_concept_id": voc.id(name, "Observation", "Observable Entity"),
                                     "observation_date": start, "value_as_number": v, "unit_concept_id": 0}))
    for c in spec.context:
        unit = voc.id(f"{c.name} unit", "Unit", "Unit")
        meas.append(pd.DataFrame({"person_id": pid[e_of], "measurement_concept_id": voc.id(c.name, "Measurement", "Lab Test"),
                                  "measurement_date": day, "value_as_number": table[c.name].to_numpy(np.float64),
                                  "unit_concept_id": unit}))
    y = table[spec.outcome].to_numpy(np.float64) == 1.0
    cond.append(pd.DataFrame({"person_id": pid[e_of][y], "condition_concept_id": voc.id(f"{spec.outcome} (response)", "Condition", "Clinical Finding"),
                              "condition_start_date": day[y]}))
    action = np.asarray(labels, dtype=object)[table[spec.action].to_numpy(np.int64)]
    drugs: list[pd.DataFrame] = []
    procs: list[pd.DataFrame] = []
    for tr, where in treatments.items():
        on = np.isin(action, [a for a, g in given.items() if tr in g])
        if where == "drug_exposure":
            drugs.append(pd.DataFrame({"person_id": pid[e_of][on], "drug_concept_id": voc.id(tr, "Drug", "Ingredient"),
                                       "drug_exposure_start_date": day[on], "drug_exposure_end_date": day[on]}))
        else:
            procs.append(pd.DataFrame({"person_id": pid[e_of][on], "procedure_concept_id": voc.id(tr, "Procedure", "Procedure"),
                                       "procedure_date": day[on]}))

    def numbered(parts: list[pd.DataFrame], rid: str, type_col: str) -> pd.DataFrame:
        cols = [c for c, _, _ in TABLES[rid.removesuffix("_id")]]
        df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in cols})
        df[rid] = np.arange(1, len(df) + 1)
        df[type_col] = _TYPE
        return df[[c for c in cols if c in df]]

    frames["condition_occurrence"] = numbered(cond, "condition_occurrence_id", "condition_type_concept_id")
    frames["observation"] = numbered(obs, "observation_id", "observation_type_concept_id")
    frames["measurement"] = numbered(meas, "measurement_id", "measurement_type_concept_id")
    frames["drug_exposure"] = numbered(drugs, "drug_exposure_id", "drug_type_concept_id")
    frames["procedure_occurrence"] = numbered(procs, "procedure_occurrence_id", "procedure_type_concept_id")
    frames["concept"] = voc.frame()
    return CdmInstance(frames, dict(voc.ids))


def cohort_text(spec: DatasetSpec, labels: list[str], concepts: dict[str, int], name: str) -> str:
    """The cohort spec that reads an instance of :func:`cdm_instance` back into the long table (TOML)."""
    treatments, given = _plan(spec, labels)
    doc: dict[str, Any] = {
        "cdm": "OMOP 5.4", "name": name,
        "entity": {"kind": "person", "id": "person_source_value"},
        "grid": {"step_days": 1, "max_steps": spec.max_len, "min_steps": 1},
        "site": {"from": "care_site"},
        "treatment": [{"name": tr, "table": where, "concept_ids": [concepts[tr]]} for tr, where in treatments.items()],
        "action": [{"label": a, "given": given[a]} for a in labels],
        "context": [{"name": c.name, "kind": c.kind, "dynamics": c.dynamics, "table": "measurement",
                     "concept_ids": [concepts[c.name]], "unit_concept_ids": [concepts[f"{c.name} unit"]]}
                    for c in spec.context],
        "static": [({"name": c.name, "kind": "binary", "source": "condition", "concept_ids": [concepts[c.name]]}
                    if c.kind == "binary" else
                    {"name": c.name, "kind": c.kind, "source": "observation", "concept_ids": [concepts[c.name]],
                     "lookback_days": 0}) for c in spec.static],
        "outcome": {"kind": "condition", "concept_ids": [concepts[f"{spec.outcome} (response)"]]},
    }
    return tomli_w.dumps(doc)


def _ddl(schema: str | None) -> list[str]:
    from sqlalchemy.dialects import postgresql  # noqa: PLC0415 - the DDL both engines accept

    return [str(sa.schema.CreateTable(t).compile(dialect=postgresql.dialect())).strip()
            for t in cdm_tables(schema).values()]


def write_duckdb(instance: CdmInstance, path: str | Path) -> Path:
    """Write ``instance`` as a new DuckDB database file (replacing one there)."""
    import duckdb  # noqa: PLC0415 - only the writer needs the driver itself (bulk load from pandas)

    path = Path(path)
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    try:
        for stmt in _ddl(None):
            con.execute(stmt)
        for name, df in instance.frames.items():
            cols = [c for c, _, _ in TABLES[name] if c in df]
            con.register("frame", df[cols])
            con.execute(f"insert into {name} ({', '.join(cols)}) select {', '.join(cols)} from frame")
            con.unregister("frame")
    finally:
        con.close()
    return path


def write_postgres(instance: CdmInstance, url: str, schema: str) -> None:
    """Load ``instance`` into ``schema`` of the PostgreSQL database ``url`` (created; an existing schema of that
    name is replaced). The password comes from the environment or the password file, as for reading
    (:mod:`.connect`); this writer needs a role that may create the schema."""
    import psycopg  # noqa: PLC0415 - COPY is the driver's (https://www.psycopg.org/psycopg3/docs/basic/copy.html)

    label = server_label(url)  # refuses a URL with a password
    try:
        _load(psycopg.connect(sa.engine.make_url(url).set(drivername="postgresql").render_as_string()), instance,
              schema)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"cannot load the CDM instance: {reason}", file=label) from None


def _load(connection, instance: CdmInstance, schema: str) -> None:
    with connection as con:
        with con.cursor() as cur:
            cur.execute(f'drop schema if exists "{schema}" cascade')
            cur.execute(f'create schema "{schema}"')
            for stmt in _ddl(schema):
                cur.execute(stmt)
            for name, df in instance.frames.items():
                cols = [c for c, _, _ in TABLES[name] if c in df]
                buf = io.StringIO()
                df[cols].to_csv(buf, index=False, header=False, na_rep="\\N")
                with cur.copy(f'copy "{schema}".{name} ({", ".join(cols)}) from stdin with (format csv, null \'\\N\')') as cp:
                    cp.write(buf.getvalue())

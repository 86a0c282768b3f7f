"""From an OMOP CDM database to the long-format table of a site's trajectories (one row per entity and step).

The work is split the way a database does it well: SQL (SQLAlchemy Core, one statement per concept set, rendered
for DuckDB or PostgreSQL) filters the rows of the cohort's concepts and turns every date into a day offset from the
entity's index date; numpy places those rows on the time grid (a step's action, its last context value, its
outcome). Nothing but ``SELECT`` is sent, inside read-only transactions (:mod:`.connect`).

Before any row is read, :func:`check_database` checks what the cohort spec names against the database: the CDM
tables and columns it reads, that every concept id has rows in its table, and that every value row of a
unit-checked concept is in a declared unit. Each failure is a :class:`~fcd_secure.data.spec.DataError` naming the
table, the concept id or the spec field. The extracted table is then read by
:func:`fcd_secure.data.preprocess.build_dataset` with :meth:`CohortSpec.dataset_spec`, as any other site's table.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import sqlalchemy as sa

from fcd_secure.data.omop.cdm import EVENT_COLUMNS, cdm_tables
from fcd_secure.data.omop.cohort import ACTION, ENTITY, OUTCOME, SITE, TIME, CohortSpec
from fcd_secure.data.omop.connect import Database
from fcd_secure.data.spec import DataError

__all__ = ["check_database", "extract", "required_columns"]

#: the person fields a static may read, and the column behind each (``age`` is computed from year_of_birth)
_PERSON_FIELD = {"age": "year_of_birth", "year_of_birth": "year_of_birth", "gender_concept_id": "gender_concept_id",
                 "race_concept_id": "race_concept_id", "ethnicity_concept_id": "ethnicity_concept_id"}


def _uses(cohort: CohortSpec) -> list[tuple[str, list[int], list[int], str]]:
    """Every concept set the cohort reads: ``(table, concept ids, accepted units, spec field)``."""
    out: list[tuple[str, list[int], list[int], str]] = []
    for i, t in enumerate(cohort.treatment):
        out.append((t.table, t.concept_ids, [], f"treatment[{i}].concept_ids"))
    for i, c in enumerate(cohort.context):
        out.append((c.table, c.concept_ids, c.unit_concept_ids, f"context[{i}].concept_ids"))
    for i, s in enumerate(cohort.static):
        if s.source != "person":
            table = "condition_occurrence" if s.source == "condition" else s.source
            out.append((table, s.concept_ids, s.unit_concept_ids, f"static[{i}].concept_ids"))
    o = cohort.outcome
    if o.kind != "death":
        table = "condition_occurrence" if o.kind == "condition" else "measurement"
        out.append((table, o.concept_ids, o.unit_concept_ids, "outcome.concept_ids"))
    return out


def required_columns(cohort: CohortSpec) -> dict[str, list[str]]:
    """The CDM tables and columns the extraction of ``cohort`` reads."""
    need: dict[str, list[str]] = {"person": ["person_id", "care_site_id", "person_source_value", "year_of_birth"],
                                  "death": ["person_id", "death_date"]}
    if cohort.entity.kind == "person":
        need["observation_period"] = ["person_id", "observation_period_start_date", "observation_period_end_date"]
    else:
        need["visit_occurrence"] = ["visit_occurrence_id", "person_id", "visit_concept_id", "visit_start_date",
                                    "visit_end_date", "care_site_id", "visit_source_value"]
    if cohort.site.from_ == "care_site":
        need["care_site"] = ["care_site_id", "care_site_name"]
    for s in cohort.static:
        if s.source == "person":
            need["person"].append(_PERSON_FIELD[s.field or "age"])
    for table, _, units, _ in _uses(cohort):
        concept, day, end, rid = EVENT_COLUMNS[table]
        cols = need.setdefault(table, ["person_id"])
        cols += [c for c in (concept, day, end, rid) if c]
        if table in ("measurement", "observation"):
            cols += ["value_as_number"] + (["unit_concept_id"] if units else [])
    return {t: list(dict.fromkeys(cols)) for t, cols in need.items()}


def _schema_filter(cohort: CohortSpec) -> sa.ColumnElement:
    col = sa.column("table_schema")
    return col == (cohort.schema_ if cohort.schema_ else sa.func.current_schema())


def check_database(db: Database, cohort: CohortSpec) -> dict[str, int]:
    """Check ``db`` against ``cohort`` before anything is read: tables, columns, concept ids and units.

    Returns:
        The number of rows of each concept id the cohort names (``"table:concept_id" -> rows``), for preflight.

    Raises:
        DataError: a missing CDM table or column, a concept id with no rows in its table, or a value row of a
            unit-checked concept in another unit; the message names the table, concept id and spec field.
    """
    where = f"schema '{cohort.schema_}'" if cohort.schema_ else "the default schema"
    info = sa.table("columns", sa.column("table_schema"), sa.column("table_name"), sa.column("column_name"),
                    schema="information_schema")
    need = required_columns(cohort)
    with db.engine.connect() as conn:
        rows = conn.execute(sa.select(info.c.table_name, info.c.column_name).where(
            _schema_filter(cohort), info.c.table_name.in_(list(need)))).fetchall()
        have: dict[str, set[str]] = {}
        for table, column in rows:
            have.setdefault(str(table).lower(), set()).add(str(column).lower())
        for table, cols in need.items():
            if table not in have:
                raise DataError(f"CDM table '{table}' is missing from {where} (or this role may not read it: "
                                "docs/omop.md has the grants)", file=db.label, field="schema")
            missing = [c for c in cols if c not in have[table]]
            if missing:
                raise DataError(f"CDM table '{table}' has no column '{missing[0]}'", file=db.label,
                                column=f"{table}.{missing[0]}")
        t = cdm_tables(cohort.schema_)
        counts: dict[str, int] = {}
        if cohort.entity.kind == "visit":
            uses = [("visit_occurrence", cohort.entity.visit_concept_ids, [], "entity.visit_concept_ids")]
        else:
            uses = []
        for table, ids, units, field in uses + _uses(cohort):
            ccol = t[table].c["visit_concept_id" if table == "visit_occurrence" else EVENT_COLUMNS[table][0]]
            found = dict(conn.execute(sa.select(ccol, sa.func.count()).where(ccol.in_(ids)).group_by(ccol)).fetchall())
            for cid in ids:
                if not found.get(cid):
                    raise DataError(f"concept id {cid} has no rows in CDM table '{table}'", file=db.label,
                                    field=field)
                counts[f"{table}:{cid}"] = int(found[cid])
            if units:
                unit = t[table].c.unit_concept_id
                bad = conn.execute(sa.select(ccol, unit, sa.func.count()).where(
                    ccol.in_(ids), sa.or_(unit.is_(None), unit.not_in(units))).group_by(ccol, unit)).fetchall()
                if bad:
                    cid, got, n = bad[0]
                    raise DataError(f"CDM table '{table}': {n} row(s) of concept id {cid} have unit_concept_id "
                                    f"{got} but the spec accepts {units} (values are not converted)",
                                    file=db.label, field=field.replace("concept_ids", "unit_concept_ids"))
    return counts


# ---------------------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------------------


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Nullable integer columns as numpy columns: int64 without a NULL, else float64 with NaN."""
    for c in df.columns:
        if isinstance(df[c].dtype, pd.api.extensions.ExtensionDtype) and pd.api.types.is_numeric_dtype(df[c]):
            has_na = bool(df[c].isna().any())
            df[c] = df[c].to_numpy(np.float64, na_value=np.nan) if has_na else df[c].to_numpy(np.int64)
    return df


def _frame(conn: sa.Connection, stmt: sa.Select, text: tuple[str, ...] = ()) -> pd.DataFrame:
    """The result of ``stmt`` as columns, moved by each driver's bulk path rather than row by row (SQLAlchemy
    rows turned into columns cost twenty times the query at 10,000 persons): DuckDB hands over numpy columns
    (``.df()``, https://duckdb.org/docs/api/python/conversion); PostgreSQL sends the rows as CSV through ``COPY
    (query) TO STDOUT`` (https://www.psycopg.org/psycopg3/docs/basic/copy.html), parsed by pandas (values
    converted from their text exactly). The statement is rendered with its parameters inline: they are integers (concept ids, day bounds),
    and names are quoted identifiers. ``text``: columns kept as text (entity ids such as ``"00123"``)."""
    sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    raw = conn.connection.driver_connection
    if conn.dialect.name != "postgresql":
        return _plain(raw.execute(sql).df())
    buf = io.BytesIO()
    with raw.cursor() as cur, cur.copy(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv, HEADER)") as copy:
        for block in copy:
            buf.write(block)
    buf.seek(0)
    df = pd.read_csv(buf, keep_default_na=False, na_values=[""], dtype={c: str for c in (*text, "value")})
    if "value" in df:  # PostgreSQL writes the shortest exact text of a double; read as text, converted exactly
        df["value"] = df["value"].astype(np.float64)
    return df


def _entities_subquery(cohort: CohortSpec, t: dict[str, sa.Table]) -> sa.Subquery:
    """One row per entity: key, person, entity id, index date, end date, care site."""
    if cohort.entity.kind == "person":
        op = t["observation_period"]
        per = sa.select(op.c.person_id, sa.func.min(op.c.observation_period_start_date).label("index_date"),
                        sa.func.max(op.c.observation_period_end_date).label("end_date")
                        ).group_by(op.c.person_id).subquery("op")
        p = t["person"]
        return sa.select(p.c.person_id.label("key"), p.c.person_id, p.c[cohort.entity.id].label("ident"),
                         per.c.index_date, per.c.end_date, p.c.care_site_id
                         ).join_from(p, per, p.c.person_id == per.c.person_id).subquery("e")
    v = t["visit_occurrence"]
    return sa.select(v.c.visit_occurrence_id.label("key"), v.c.person_id, v.c[cohort.entity.id].label("ident"),
                     v.c.visit_start_date.label("index_date"), v.c.visit_end_date.label("end_date"), v.c.care_site_id
                     ).where(v.c.visit_concept_id.in_(cohort.entity.visit_concept_ids)).subquery("e")


def _days(a: sa.ColumnElement, b: sa.ColumnElement) -> sa.ColumnElement:
    """``a - b`` in days (a date minus a date is an integer in DuckDB and PostgreSQL)."""
    return sa.cast(a - b, sa.Integer)


def _events(conn: sa.Connection, t: dict[str, sa.Table], e: sa.Subquery, table: str, ids: list[int], lo: int | None,
            hi: int | None, *, value: bool = False) -> pd.DataFrame:
    """The rows of concept set ``ids`` in ``table`` whose day offset from the entity's index lies in [lo, hi]."""
    src = t[table]
    ccol, dcol, ecol, rid = EVENT_COLUMNS[table]
    day = _days(src.c[dcol], e.c.index_date)
    cols = [e.c.key, day.label("day"), src.c[rid].label("rid")]
    conds = [src.c[ccol].in_(ids)]
    last = day
    if ecol is not None:  # an exposure spans days: it marks every step it overlaps
        last = _days(src.c[ecol], e.c.index_date)
        cols.append(last.label("end_day"))
    if value:
        cols.append(sa.cast(src.c.value_as_number, sa.Double).label("value"))  # NUMERIC in the v5.4 DDL
    if lo is not None:
        conds.append(last >= lo)
    if hi is not None:
        conds.append(day <= hi)
    return _frame(conn, sa.select(*cols).join_from(src, e, src.c.person_id == e.c.person_id).where(*conds))


def _rows(keys: pd.Series, index: pd.Index) -> np.ndarray:
    return index.get_indexer(keys.to_numpy())


def _last_value(ev: pd.DataFrame, pos: np.ndarray, n_steps: np.ndarray, step: int, carry: int, length: int
                ) -> np.ndarray:
    """Per entity and step, the last value (by day, then row id) taken in the step or up to ``carry`` days before
    it; NaN where none."""
    out = np.full((len(n_steps), length), np.nan)
    if ev.empty:
        return out
    day = ev["day"].to_numpy(np.int64)
    first = np.maximum(np.floor_divide(day, step), 0)
    last = np.minimum(np.floor_divide(day + carry, step), n_steps[pos] - 1)
    keep = last >= first
    day, first, last = day[keep], first[keep], last[keep]
    p, rid, val = pos[keep], ev["rid"].to_numpy(np.int64)[keep], ev["value"].to_numpy(np.float64)[keep]
    reps = last - first + 1
    rows = np.repeat(np.arange(len(day)), reps)
    steps = np.repeat(first, reps) + (np.arange(len(rows)) - np.repeat(np.cumsum(reps) - reps, reps))
    order = np.lexsort((rid[rows], day[rows], steps, p[rows]))  # the last of each (entity, step) wins
    out[p[rows][order], steps[order]] = val[rows][order]
    return out


def _marked(ev: pd.DataFrame, pos: np.ndarray, n_steps: np.ndarray, step: int, length: int) -> np.ndarray:
    """Per entity and step, whether a row of ``ev`` falls in (or, with ``end_day``, overlaps) the step."""
    out = np.zeros((len(n_steps), length), dtype=bool)
    if ev.empty:
        return out
    start = ev["day"].to_numpy(np.int64)
    end = ev["end_day"].to_numpy(np.int64) if "end_day" in ev else start
    first = np.maximum(np.floor_divide(start, step), 0)
    last = np.minimum(np.floor_divide(end, step), n_steps[pos] - 1)
    keep = last >= first
    first, last, p = first[keep], last[keep], pos[keep]
    reps = last - first + 1
    rows = np.repeat(np.arange(len(first)), reps)
    steps = np.repeat(first, reps) + (np.arange(len(rows)) - np.repeat(np.cumsum(reps) - reps, reps))
    out[p[rows], steps] = True
    return out


def _static_value(ev: pd.DataFrame, pos: np.ndarray, n: int) -> np.ndarray:
    """Per entity, the last value (by day, then row id) of ``ev``; NaN where none."""
    out = np.full(n, np.nan)
    if not ev.empty:
        order = np.lexsort((ev["rid"].to_numpy(), ev["day"].to_numpy(), pos))
        out[pos[order]] = ev["value"].to_numpy(np.float64)[order]
    return out


def extract(db: Database, cohort: CohortSpec) -> pd.DataFrame:
    """The long-format table of ``cohort`` in ``db`` (columns: entity, t, site, statics, contexts, action, outcome).

    Call :func:`check_database` first (``read_cohort`` does): this function assumes the tables and concepts exist.

    Raises:
        DataError: an empty cohort, a time grid that leaves every entity below ``grid.min_steps``, a step whose
            treatments match no action, a missing value where the spec allows none, or an entity without a site.
    """
    t = cdm_tables(cohort.schema_)
    e = _entities_subquery(cohort, t)
    g = cohort.grid
    horizon = g.max_steps * g.step_days - 1
    p, d = t["person"], t["death"]
    dead = sa.select(d.c.person_id, sa.func.min(d.c.death_date).label("death_date")).group_by(d.c.person_id
                                                                                                ).subquery("d")
    cols = [e.c.key, e.c.ident, _days(e.c.end_date, e.c.index_date).label("span"),
            _days(dead.c.death_date, e.c.index_date).label("death_day"),
            sa.cast(sa.extract("year", e.c.index_date), sa.Integer).label("index_year")]
    cols += [p.c[c] for c in dict.fromkeys(_PERSON_FIELD[s.field] for s in cohort.static if s.source == "person")]
    stmt = sa.select(*cols).join_from(e, p, e.c.person_id == p.c.person_id).outerjoin(
        dead, e.c.person_id == dead.c.person_id)
    if cohort.site.from_ == "care_site":
        cs = t["care_site"]
        stmt = stmt.add_columns(cs.c.care_site_name).outerjoin(cs, e.c.care_site_id == cs.c.care_site_id)
    with db.engine.connect() as conn:
        ents = _frame(conn, stmt, text=("care_site_name",) + (("ident",) if cohort.entity.id.endswith("source_value")
                                                                else ()))
        what = "person with an observation period" if cohort.entity.kind == "person" else (
            f"visit of concept ids {cohort.entity.visit_concept_ids}")
        if ents.empty:
            raise DataError(f"the cohort is empty: no {what}", file=db.label, field="entity")
        if ents["ident"].isna().any():
            raise DataError(f"{int(ents['ident'].isna().sum())} entities have no {cohort.entity.id}", file=db.label,
                            field="entity.id")
        twice = ents["ident"][ents["ident"].duplicated()]
        if len(twice):  # two trajectories under one id would be read as one entity's
            raise DataError(f"{cohort.entity.id} {twice.iloc[0]!r} names {int((ents['ident'] == twice.iloc[0]).sum())} "
                            f"entities; the entity id must be unique", file=db.label, field="entity.id")
        end = ents["span"].to_numpy(np.float64)
        death = ents["death_day"].to_numpy(np.float64)
        end = np.where(np.isnan(death), end, np.minimum(end, death))
        n_steps = np.minimum(np.floor_divide(end, g.step_days) + 1, g.max_steps)
        n_steps = np.where(end < 0, 0, n_steps).astype(np.int64)
        keep = n_steps >= g.min_steps
        if not keep.any():
            raise DataError(f"the time grid leaves every entity ({len(ents)}) with fewer than min_steps = "
                            f"{g.min_steps} steps of {g.step_days} day(s) (the longest has {int(n_steps.max())})",
                            file=db.label, field="grid.min_steps")
        ents = ents.assign(n_steps=n_steps)[keep].sort_values("ident", kind="stable").reset_index(drop=True)
        ents_n = ents["n_steps"].to_numpy(np.int64)
        index = pd.Index(ents["key"].to_numpy())

        def located(ev: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
            pos = _rows(ev["key"], index) if not ev.empty else np.zeros(0, dtype=np.int64)
            ok = pos >= 0  # rows of entities left out by the floor
            return ev[ok], pos[ok]

        n, length = len(ents), g.max_steps
        columns: dict[str, np.ndarray] = {}
        for s in cohort.static:
            if s.source == "person":
                raw = ents[_PERSON_FIELD[s.field]].to_numpy(np.float64)
                values = ents["index_year"].to_numpy(np.float64) - raw if s.field == "age" else raw
            elif s.source == "condition":
                lo = None if s.lookback_days is None else -s.lookback_days
                ev, pos = located(_events(conn, t, e, "condition_occurrence", s.concept_ids, lo, -1))
                values = np.zeros(n)
                values[pos] = 1.0
            else:
                lo = None if s.lookback_days is None else -s.lookback_days
                ev, pos = located(_events(conn, t, e, s.source, s.concept_ids, lo, 0, value=True))
                values = _static_value(ev, pos, n)
            columns[s.name] = values
        contexts: dict[str, np.ndarray] = {}
        for c in cohort.context:
            ev, pos = located(_events(conn, t, e, c.table, c.concept_ids, -c.carry_days, horizon, value=True))
            contexts[c.name] = _last_value(ev, pos, ents_n, g.step_days, c.carry_days, length)
        code = np.zeros((n, length), dtype=np.int64)
        for i, tr in enumerate(cohort.treatment):
            ev, pos = located(_events(conn, t, e, tr.table, tr.concept_ids, 0, horizon))
            code |= _marked(ev, pos, ents_n, g.step_days, length).astype(np.int64) << i
        o = cohort.outcome
        if o.kind == "death":
            y = np.zeros((n, length))
            dd = ents["death_day"].to_numpy(np.float64)
            has = ~np.isnan(dd)
            step = np.floor_divide(dd[has], g.step_days).astype(np.int64)
            inside = step < ents_n[has]
            y[np.flatnonzero(has)[inside], step[inside]] = 1.0
        elif o.kind == "condition":
            ev, pos = located(_events(conn, t, e, "condition_occurrence", o.concept_ids, 0, horizon))
            y = _marked(ev, pos, ents_n, g.step_days, length).astype(np.float64)
        else:
            ev, pos = located(_events(conn, t, e, "measurement", o.concept_ids, 0, horizon, value=True))
            y = _last_value(ev, pos, ents_n, g.step_days, 0, length)
    valid = np.arange(length)[None, :] < ents_n[:, None]
    ei, ti = np.nonzero(valid)
    idents = ents["ident"].to_numpy()
    if o.kind == "measurement":
        gap = np.isnan(y[ei, ti])
        if gap.any():
            k = int(np.flatnonzero(gap)[0])
            raise DataError(f"{int(gap.sum())} step(s) have no outcome measurement (concept ids {o.concept_ids}); "
                            f"first: entity {idents[ei[k]]} step {ti[k]}; a missing outcome is not a negative one",
                            file=db.label, field="outcome.concept_ids")
        if o.threshold is not None:
            cmp = {"below": np.less, "at_most": np.less_equal, "above": np.greater, "at_least": np.greater_equal}
            y = np.where(np.isnan(y), np.nan, cmp[o.direction](y, o.threshold).astype(np.float64))
    labels = {sum(1 << [tr.name for tr in cohort.treatment].index(g_) for g_ in a.given): a.label
              for a in cohort.action}
    codes = code[ei, ti]
    unknown = ~np.isin(codes, list(labels))
    if unknown.any():
        k = int(np.flatnonzero(unknown)[0])
        given = [tr.name for i, tr in enumerate(cohort.treatment) if codes[k] >> i & 1]
        raise DataError(f"{int(unknown.sum())} step(s) give {given}, which no [[action]] lists (first: entity "
                        f"{idents[ei[k]]} step {ti[k]}); add an action with given = {given}", file=db.label,
                        field="action")
    out = pd.DataFrame({ENTITY: idents[ei], TIME: ti})
    if cohort.site.from_ == "care_site":
        names = ents["care_site_name"]
        if names.isna().any():
            raise DataError(f"{int(names.isna().sum())} entities have no care_site_name (site.from = 'care_site')",
                            file=db.label, field="site")
        out[SITE] = names.to_numpy()[ei]
    else:
        out[SITE] = cohort.site.name
    for s in cohort.static:
        v = columns[s.name]
        if s.missing == "error" and np.isnan(v).any():
            k = int(np.flatnonzero(np.isnan(v))[0])
            raise DataError(f"static '{s.name}': {int(np.isnan(v).sum())} entities have no value (first: "
                            f"{idents[k]}); set missing = 'indicator' or widen lookback_days", file=db.label,
                            field=f"static[{cohort.static.index(s)}]")
        out[s.name] = _as_kind(v[ei], s.kind)
    for i, c in enumerate(cohort.context):
        v = contexts[c.name][ei, ti]
        if c.missing == "error" and np.isnan(v).any():
            k = int(np.flatnonzero(np.isnan(v))[0])
            raise DataError(f"context '{c.name}': {int(np.isnan(v).sum())} step(s) have no value within carry_days = "
                            f"{c.carry_days} (first: entity {idents[ei[k]]} step {ti[k]}); set missing = "
                            "'indicator' or a longer carry_days", file=db.label, field=f"context[{i}]")
        out[c.name] = _as_kind(v, c.kind)
    out[ACTION] = np.array([labels[c] for c in codes.tolist()], dtype=object)
    out[OUTCOME] = y[ei, ti]
    return out


def _as_kind(values: np.ndarray, kind: str) -> np.ndarray | pd.Series:
    """A categorical static read from a concept column is its level as text (``"8507"``), as levels are declared."""
    if kind != "categorical":
        return values
    return pd.Series(values).map(lambda v: None if np.isnan(v) else str(int(v))).to_numpy(dtype=object)

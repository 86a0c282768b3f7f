"""The OMOP CDM v5.4 tables the extraction reads, declared once as SQLAlchemy Core tables.

Only the columns the extraction reads or a CDM instance must fill (``NOT NULL`` in the v5.4 DDL) are declared; a
site's tables have more, which are never read. Names and types follow the CDM v5.4 specification
(https://ohdsi.github.io/CommonDataModel/cdm54.html) and its PostgreSQL DDL
(https://github.com/OHDSI/CommonDataModel/tree/main/inst/ddl/5.4/postgresql).

One declaration serves DuckDB and PostgreSQL: SQLAlchemy Core renders it in each dialect
(https://docs.sqlalchemy.org/en/20/core/). The tables are not reflected from the database (DuckDB's SQLAlchemy
dialect cannot reflect under SQLAlchemy 2.1); which columns exist is read from ``information_schema.columns``,
which both engines provide (:func:`fcd_secure.data.omop.extract.check_schema`).
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["TABLES", "cdm_tables"]

_I, _D, _F, _S = sa.Integer, sa.Date, sa.Double, sa.String


def _cols(*spec: tuple[str, type, bool]) -> list[sa.Column]:
    return [sa.Column(name, typ(), nullable=not required) for name, typ, required in spec]


#: table -> (column, type, NOT NULL in the v5.4 DDL)
TABLES: dict[str, tuple[tuple[str, type, bool], ...]] = {
    "concept": (("concept_id", _I, True), ("concept_name", _S, True), ("domain_id", _S, True),
                ("vocabulary_id", _S, True), ("concept_class_id", _S, True), ("standard_concept", _S, False),
                ("concept_code", _S, True), ("valid_start_date", _D, True), ("valid_end_date", _D, True)),
    "care_site": (("care_site_id", _I, True), ("care_site_name", _S, False)),
    "person": (("person_id", _I, True), ("gender_concept_id", _I, True), ("year_of_birth", _I, True),
               ("race_concept_id", _I, True), ("ethnicity_concept_id", _I, True), ("care_site_id", _I, False),
               ("person_source_value", _S, False)),
    "observation_period": (("observation_period_id", _I, True), ("person_id", _I, True),
                           ("observation_period_start_date", _D, True), ("observation_period_end_date", _D, True),
                           ("period_type_concept_id", _I, True)),
    "visit_occurrence": (("visit_occurrence_id", _I, True), ("person_id", _I, True), ("visit_concept_id", _I, True),
                         ("visit_start_date", _D, True), ("visit_end_date", _D, True),
                         ("visit_type_concept_id", _I, True), ("care_site_id", _I, False),
                         ("visit_source_value", _S, False)),
    "drug_exposure": (("drug_exposure_id", _I, True), ("person_id", _I, True), ("drug_concept_id", _I, True),
                      ("drug_exposure_start_date", _D, True), ("drug_exposure_end_date", _D, True),
                      ("drug_type_concept_id", _I, True)),
    "procedure_occurrence": (("procedure_occurrence_id", _I, True), ("person_id", _I, True),
                             ("procedure_concept_id", _I, True), ("procedure_date", _D, True),
                             ("procedure_type_concept_id", _I, True)),
    "condition_occurrence": (("condition_occurrence_id", _I, True), ("person_id", _I, True),
                             ("condition_concept_id", _I, True), ("condition_start_date", _D, True),
                             ("condition_type_concept_id", _I, True)),
    "measurement": (("measurement_id", _I, True), ("person_id", _I, True), ("measurement_concept_id", _I, True),
                    ("measurement_date", _D, True), ("measurement_type_concept_id", _I, True),
                    ("value_as_number", _F, False), ("unit_concept_id", _I, False)),
    "observation": (("observation_id", _I, True), ("person_id", _I, True), ("observation_concept_id", _I, True),
                    ("observation_date", _D, True), ("observation_type_concept_id", _I, True),
                    ("value_as_number", _F, False), ("unit_concept_id", _I, False)),
    "death": (("person_id", _I, True), ("death_date", _D, True)),
}

#: per event table: (concept column, date column, end-date column or None, row id column)
EVENT_COLUMNS: dict[str, tuple[str, str, str | None, str]] = {
    "drug_exposure": ("drug_concept_id", "drug_exposure_start_date", "drug_exposure_end_date", "drug_exposure_id"),
    "procedure_occurrence": ("procedure_concept_id", "procedure_date", None, "procedure_occurrence_id"),
    "condition_occurrence": ("condition_concept_id", "condition_start_date", None, "condition_occurrence_id"),
    "measurement": ("measurement_concept_id", "measurement_date", None, "measurement_id"),
    "observation": ("observation_concept_id", "observation_date", None, "observation_id"),
}


def cdm_tables(schema: str | None) -> dict[str, sa.Table]:
    """The declared CDM tables in ``schema`` (None: the connection's default schema)."""
    md = sa.MetaData(schema=schema)
    return {name: sa.Table(name, md, *_cols(*cols)) for name, cols in TABLES.items()}

"""``CohortSpec``: how an OMOP CDM v5.4 database becomes a site's trajectories (issue 46).

A cohort spec is a TOML file with ``cdm = "OMOP 5.4"`` at its top (that key tells it from a
:class:`~fcd_secure.data.spec.DatasetSpec`), e.g. (abridged, shaped like the tumour instance ``fcd data export
--format omop`` writes; docs/omop.md has that one)::

    cdm = "OMOP 5.4"
    name = "tumour-omop"
    schema = "main"                      # the CDM schema ("cdm" on most PostgreSQL servers)

    [entity]
    kind = "person"                      # or "visit": one trajectory per visit_occurrence (visit_concept_ids)
    id = "person_source_value"           # the entity id the site's cohorts are drawn from

    [grid]
    step_days = 1                        # step t covers days [index + t*step_days, index + (t+1)*step_days)
    max_steps = 12
    min_steps = 2                        # an entity with fewer steps is left out (the floor)

    [site]
    from = "care_site"                   # the person's (visit's) care_site_name; or name = "hospital-a"

    [[treatment]]                        # a concept set: any exposure overlapping a step marks it
    name = "chemo"
    table = "drug_exposure"
    concept_ids = [2000000101]

    [[action]]                           # action ids in order; a step's action is the one whose `given` is
    label = "none"                       # exactly the set of treatments marked in it
    given = []

    [[context]]
    name = "tumour_volume"
    table = "measurement"
    concept_ids = [2000000201]
    unit_concept_ids = [2000000901]      # a row in another unit is an error (values are not converted)
    carry_days = 0                       # a value stays valid this many days after the day it was taken

    [[static]]
    name = "stage"
    source = "observation"               # person | condition | measurement | observation
    concept_ids = [2000000302]

    [outcome]
    kind = "condition"                   # measurement (with threshold), condition, or death
    concept_ids = [2000000401]

The index date is the start of the person's observation (``observation_period``) or of the visit; an entity's
steps end at the end of that period (or visit) or at death, whichever comes first, and at most ``max_steps``.
Dates are days (``*_date`` columns); the times of day are not read.

Statics are taken at the index: a ``person`` field (``age`` at the index year, ``year_of_birth``,
``gender_concept_id``, ``race_concept_id``, ``ethnicity_concept_id``); ``condition``: 1 when a condition of the set
starts before the index (within ``lookback_days``), else 0; ``measurement`` / ``observation``: the last
``value_as_number`` on or before the index within ``lookback_days``.

The outcome ``Y_t`` of step ``t``: ``condition`` 1 when a condition of the set starts in the step; ``death`` 1 when
the person dies in it; ``measurement`` the last value in the step compared with ``threshold`` (``direction``), or
the value itself when no threshold is given (a continuous outcome). A measured outcome missing in a step is an
error: a missing outcome is not a negative one.

Concept ids are OMOP concept ids (standard concepts of the OHDSI vocabularies, or a site's own in the
2-billion range; https://ohdsi.github.io/CommonDataModel/cdm54.html#concept).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fcd_secure.data.spec import ColumnSpec, ContextSpec, DataError, DatasetSpec, field_path

__all__ = ["CDM_MARKER", "CohortSpec", "is_cohort_text", "load_cohort"]

#: the top-level key and value that mark a cohort spec
CDM_MARKER = ("cdm", "OMOP 5.4")
#: the columns of the long table an extraction writes (the derived ``DatasetSpec`` names them)
ENTITY, TIME, SITE, ACTION, OUTCOME = "entity", "t", "site", "action", "outcome"

EventTable = Literal["drug_exposure", "procedure_occurrence"]
ValueTable = Literal["measurement", "observation"]
PersonField = Literal["age", "year_of_birth", "gender_concept_id", "race_concept_id", "ethnicity_concept_id"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _concepts() -> list[int]:
    return Field(min_length=1, description="OMOP concept ids (a concept set)")


class EntitySpec(_Strict):
    """What one trajectory is: a person (from its observation period) or one visit of the listed kinds."""

    kind: Literal["person", "visit"] = "person"
    #: the entity id: for a person ``person_id`` or ``person_source_value``; for a visit ``visit_occurrence_id`` or
    #: ``visit_source_value``
    id: Literal["person_id", "person_source_value", "visit_occurrence_id", "visit_source_value"] = "person_id"
    #: the visit kinds that make an entity (e.g. 9201 inpatient visit, 262 emergency room and inpatient visit)
    visit_concept_ids: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "EntitySpec":
        if self.kind == "person":
            if self.id.startswith("visit"):
                raise ValueError(f"id = {self.id!r} names a visit column; a person entity has person_id or "
                                 "person_source_value")
            if self.visit_concept_ids:
                raise ValueError("visit_concept_ids is for kind = 'visit'")
        else:
            if not self.visit_concept_ids:
                raise ValueError("kind = 'visit' needs visit_concept_ids (which visits are stays)")
            if self.id.startswith("person"):
                raise ValueError(f"id = {self.id!r}: a visit entity has visit_occurrence_id or visit_source_value")
        return self


class GridSpec(_Strict):
    """The time grid from the index date."""

    step_days: int = Field(1, ge=1, le=3650, description="days per step")
    max_steps: int = Field(50, ge=1, description="Lmax: an entity's steps after this are not read")
    min_steps: int = Field(1, ge=1, description="the floor: an entity with fewer steps is left out")

    @model_validator(mode="after")
    def _floor(self) -> "GridSpec":
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) is above max_steps ({self.max_steps})")
        return self


class SiteSpec(_Strict):
    """The site's name in the site column: its care site's name, or one name for every entity."""

    from_: Literal["care_site", "name"] = Field("name", alias="from")
    name: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _named(self) -> "SiteSpec":
        if self.from_ == "name" and self.name is None:
            raise ValueError("give the site's name (name = \"...\") or from = \"care_site\"")
        if self.from_ == "care_site" and self.name is not None:
            raise ValueError("from = 'care_site' reads the name from the database; leave out name")
        return self


class TreatmentSpec(_Strict):
    """A treatment concept set: a step where an exposure of it overlaps (drugs) or a procedure falls is marked."""

    name: str = Field(min_length=1)
    table: EventTable
    concept_ids: list[int] = _concepts()


class ActionSpec(_Strict):
    """One action: its label and the exact set of treatments a step has when this action is taken."""

    label: str = Field(min_length=1)
    given: list[str] = Field(default_factory=list, description="treatment names; [] is no treatment")


class ContextValueSpec(ContextSpec):
    """A time-varying context from ``measurement`` / ``observation``: the last ``value_as_number`` in the step, or
    within ``carry_days`` before it."""

    table: ValueTable = "measurement"
    concept_ids: list[int] = _concepts()
    #: accepted unit concepts (``unit_concept_id``); empty: units are not checked
    unit_concept_ids: list[int] = Field(default_factory=list)
    carry_days: int = Field(0, ge=0, description="how many days a value is carried forward")


class StaticValueSpec(ColumnSpec):
    """A static covariate taken at the index (module docstring)."""

    source: Literal["person", "condition", "measurement", "observation"]
    field: PersonField | None = Field(None, description="the person field (source = 'person')")
    concept_ids: list[int] = Field(default_factory=list)
    unit_concept_ids: list[int] = Field(default_factory=list)
    lookback_days: int | None = Field(None, ge=0, description="how far before the index a row counts (None: any)")

    @model_validator(mode="after")
    def _source_fields(self) -> "StaticValueSpec":
        if self.source == "person":
            if self.field is None:
                raise ValueError("source = 'person' needs field (age, year_of_birth, gender_concept_id, ...)")
            if self.concept_ids:
                raise ValueError("source = 'person' reads a person field; leave out concept_ids")
        else:
            if self.field is not None:
                raise ValueError(f"field is for source = 'person', not {self.source!r}")
            if not self.concept_ids:
                raise ValueError(f"source = {self.source!r} needs concept_ids")
        if self.unit_concept_ids and self.source not in ("measurement", "observation"):
            raise ValueError("unit_concept_ids applies to measurement and observation values")
        return self


class OutcomeSpec(_Strict):
    """The outcome of each step (module docstring)."""

    kind: Literal["measurement", "condition", "death"]
    concept_ids: list[int] = Field(default_factory=list)
    unit_concept_ids: list[int] = Field(default_factory=list)
    threshold: float | None = None
    #: with a threshold: Y = 1 when the value is ``below`` / ``at_most`` / ``above`` / ``at_least`` it
    direction: Literal["below", "at_most", "above", "at_least"] = "at_most"

    @model_validator(mode="after")
    def _kind_fields(self) -> "OutcomeSpec":
        if self.kind == "death":
            if self.concept_ids:
                raise ValueError("kind = 'death' reads the death table; leave out concept_ids")
        elif not self.concept_ids:
            raise ValueError(f"kind = {self.kind!r} needs concept_ids")
        if self.kind != "measurement" and (self.threshold is not None or self.unit_concept_ids):
            raise ValueError("threshold and unit_concept_ids apply to a measured outcome")
        return self

    @property
    def continuous(self) -> bool:
        return self.kind == "measurement" and self.threshold is None


class CohortSpec(_Strict):
    """An OMOP cohort (the module docstring shows the file)."""

    cdm: Literal["OMOP 5.4"]
    name: str = Field("omop-cohort", min_length=1)
    #: the schema holding the CDM tables; None: the connection's default (DuckDB ``main``, PostgreSQL's search path)
    schema_: str | None = Field(None, alias="schema", min_length=1)
    entity: EntitySpec = Field(default_factory=EntitySpec)
    grid: GridSpec = Field(default_factory=GridSpec)
    site: SiteSpec
    treatment: list[TreatmentSpec] = Field(default_factory=list)
    action: list[ActionSpec] = Field(min_length=1)
    context: list[ContextValueSpec] = Field(default_factory=list)
    static: list[StaticValueSpec] = Field(default_factory=list)
    outcome: OutcomeSpec

    @model_validator(mode="after")
    def _consistent(self) -> "CohortSpec":
        names = [t.name for t in self.treatment]
        if len(set(names)) != len(names):
            raise ValueError("treatment names must be unique")
        labels = [a.label for a in self.action]
        if len(set(labels)) != len(labels):
            raise ValueError("action labels must be unique")
        seen: dict[frozenset[str], str] = {}
        for a in self.action:
            unknown = [g for g in a.given if g not in names]
            if unknown:
                raise ValueError(f"action {a.label!r} gives {unknown[0]!r}, which no [[treatment]] names")
            key = frozenset(a.given)
            if key in seen:
                raise ValueError(f"actions {seen[key]!r} and {a.label!r} give the same treatments")
            seen[key] = a.label
        reserved = {ENTITY, TIME, SITE, ACTION, OUTCOME}
        cols = [c.name for c in self.static] + [c.name for c in self.context]
        for c in cols:
            if c in reserved:
                raise ValueError(f"column name {c!r} is reserved for the {c} column of the trajectories")
        if len(set(cols)) != len(cols):
            raise ValueError("static and context names must be unique")
        return self

    def dataset_spec(self) -> DatasetSpec:
        """The ``DatasetSpec`` of the long table :func:`fcd_secure.data.omop.extract.extract` writes."""
        return DatasetSpec(
            name=self.name, entity=ENTITY, time=TIME, action=ACTION, outcome=OUTCOME, site=SITE,
            actions=[a.label for a in self.action],
            outcome_kind="continuous" if self.outcome.continuous else "binary",
            max_len=self.grid.max_steps,
            static=[ColumnSpec(**c.model_dump(include=set(ColumnSpec.model_fields))) for c in self.static],
            context=[ContextSpec(**c.model_dump(include=set(ContextSpec.model_fields))) for c in self.context],
        )


def is_cohort_text(text: str) -> bool:
    """Whether a spec file's TOML text is a cohort spec (its top level has ``cdm = ...``); False when it does not
    parse as TOML (a YAML dataset spec)."""
    try:
        return CDM_MARKER[0] in tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False


def load_cohort(path: str | Path) -> CohortSpec:
    """Read and validate a cohort spec.

    Raises:
        DataError: the file is missing, does not parse, or does not validate (the field named, e.g.
            ``context[1].carry_days``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("cohort spec file not found", file=path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"does not parse as TOML: {exc}", file=path) from None
    try:
        return CohortSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DataError(f"{first['msg']}{more}", file=path, field=field_path(tuple(first["loc"]))) from None

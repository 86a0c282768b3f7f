"""``DatasetSpec``: how a user's long-format table maps onto ``SiteDataset`` (paper §IV-A "Feature engineering").

A long-format table has one row per step: an entity id (student, patient, user), a time order, static columns
(X, taken at the first step of each trajectory), context columns (A_t), one action column (T_t), one outcome
column (Y_t), and optionally a logged propensity column (P_t) and a site column. The spec names those columns
and says how to encode each covariate; :func:`fcd_secure.data.preprocess.build_dataset` applies it.

A spec is a TOML or YAML file, e.g.::

    name = "clinic-readmission"
    entity = "patient_id"
    time = "visit"
    action = "treatment"
    actions = ["none", "insulin"]        # optional: fixes the id of each action value (id = position)
                                         # and names it: policies may name actions by these labels
    outcome = "readmitted"
    propensity = "p_logged"              # optional
    site = "hospital"                    # optional: sites come from this column instead of a Dirichlet split
    max_len = 20

    [[static]]
    name = "age"
    kind = "continuous"

    [[context]]
    name = "ward"
    kind = "categorical"
    levels = ["icu", "medical", "surgical"]  # optional: the encoding no longer depends on the table's values
    missing = "indicator"                # a 0 fill plus a ward__missing column (always written)
    dynamics = "exogenous"               # replayed from the log under an intervention

    [[context]]
    name = "hba1c"                       # a lab value that depends on past treatment
    kind = "continuous"                  # dynamics = "endogenous" (the default): simulated under an intervention

Time-varying contexts under intervention (g-computation; Robins 1986): a context the past treatment can change (a
tumour's diameter, a lab value) is ``endogenous`` and must be *simulated* when a policy is rolled out, not replayed
from the log; one that no treatment touches (the calendar, the ward's bed count) is ``exogenous`` and is replayed.
Endogenous is the default, because replaying a treatment-dependent context under a new policy silently keeps the
logged treatment's consequences. The encoded context columns are ordered endogenous first
(:func:`context_dynamics` reads the marker back from a dataset).

Several sites reading their own tables with one spec must encode them identically (the model's parameter shapes
follow the encoding): declare the ``levels`` of every categorical column, and the encoded layout is known from the
spec alone (:func:`fcd_secure.data.preprocess.spec_layout`; a consortium pins its digest and each site's preflight
compares). Without ``levels`` a categorical column takes the sorted values of the table at hand.

Actions have labels: ``actions`` (the raw values, in id order) or, for a table whose action column already holds
integer ids, ``action_labels`` (one name per id). A policy file may name an action by its label, by its id or by an
anchor (``fcd_secure.data.policy``).

Every error raised while reading a spec or a table is a :class:`DataError` that names the file, and the
column, row or spec field where it applies, so that the CLI can print it and exit non-zero.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from fcd_secure.errors import FcdError, invalid_field


class DataError(FcdError, ValueError):
    """Bad input data or spec. ``str(err)`` names the file and, where known, the column, row and spec field."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        column: str | None = None,
        row: int | None = None,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        self.message = message
        self.file = None if file is None else str(file)
        self.column = column
        self.row = row
        self.field = field
        self.line = line
        where: list[str] = []
        if column is not None:
            where.append(f"column '{column}'")
        if row is not None:
            where.append(f"row {row}" + (f" (line {line})" if line is not None else ""))
        if field is not None:
            where.append(f"field '{field}'")
        prefix = self.file or "<data>"
        super().__init__(f"{prefix}: " + (", ".join(where) + ": " if where else "") + message)

    def to_dict(self) -> dict:
        return {
            "error": self.message,
            "file": self.file,
            "column": self.column,
            "row": self.row,
            "line": self.line,
            "field": self.field,
        }


class ColumnSpec(BaseModel):
    """One covariate column and its encoding (paper §IV-A: z-score / one-hot / integer id / missing indicator)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="column name in the table")
    kind: Literal["continuous", "categorical", "binary"] = "continuous"
    #: what a missing value (empty cell, NaN) means: an error, or a 0 fill plus an explicit ``<name>__missing`` column
    #: (the column is written whether or not this table has a missing value, so every site's layout is the same)
    missing: Literal["error", "indicator"] = "error"
    #: a categorical column's levels, in encoding order. Declared levels make the encoding the same on every site
    #: whatever values its own table happens to hold (a value outside them is an error); without them the levels are
    #: the sorted values of the table at hand, which is fine for one table and not for a consortium
    levels: list[str] | None = None

    @model_validator(mode="after")
    def _levels_only_categorical(self) -> "ColumnSpec":
        if self.levels is not None:
            if self.kind != "categorical":
                raise ValueError(f"levels are declared for a {self.kind} column; only categorical columns have levels")
            if not self.levels:
                raise ValueError("levels: list at least one level")
            if len(set(self.levels)) != len(self.levels):
                raise ValueError("levels must be unique")
        return self


class ContextSpec(ColumnSpec):
    """A time-varying context column A_t: its encoding, and whether a treatment can change it (module docstring)."""

    #: ``endogenous``: depends on the past (treatment, outcomes); generated by the model during a rollout.
    #: ``exogenous``: no treatment changes it; replayed from the logged trajectory during a rollout.
    dynamics: Literal["endogenous", "exogenous"] = "endogenous"


#: The marker of each encoded context column, in ``SiteDataset.meta`` (one entry per column of A).
DYNAMICS_META_KEY = "a_dynamics"
#: The reserved prefix of a policy's anchor references; no action label may start with it.
ANCHOR_PREFIX = "anchor:"


def context_dynamics(meta: dict, da: int) -> list[str]:
    """The marker of each of the ``da`` context columns of a dataset: ``"endogenous"`` or ``"exogenous"``.

    Read from ``meta['a_dynamics']`` (written by the data layer, endogenous columns first). A dataset without the
    marker (built by hand, or an older file) replays every context: that is what the rollout did before contexts
    could be simulated.

    Raises:
        DataError: the marker does not have one valid entry per column, or an endogenous column follows an
            exogenous one.
    """
    marks = meta.get(DYNAMICS_META_KEY)
    if marks is None:
        return ["exogenous"] * da
    marks = [str(m) for m in marks]
    if len(marks) != da or any(m not in ("endogenous", "exogenous") for m in marks):
        raise DataError(f"meta['{DYNAMICS_META_KEY}'] must hold 'endogenous'/'exogenous' for each of {da} columns, "
                        f"got {marks}")
    n_endo = marks.count("endogenous")
    if marks[:n_endo] != ["endogenous"] * n_endo:
        raise DataError(f"meta['{DYNAMICS_META_KEY}']: endogenous context columns must come first, got {marks}")
    return marks


def n_endogenous(meta: dict, da: int) -> int:
    """How many leading context columns are endogenous (:func:`context_dynamics`)."""
    return context_dynamics(meta, da).count("endogenous")


class DatasetSpec(BaseModel):
    """Mapping from a long-format table to ``SiteDataset`` (see the module docstring for the file format)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="dataset", min_length=1)
    entity: str = Field(min_length=1, description="entity id column (one trajectory per entity)")
    time: str = Field(min_length=1, description="time-order column; must increase within an entity")
    action: str = Field(min_length=1, description="action column T_t")
    outcome: str = Field(min_length=1, description="outcome column Y_t")
    propensity: str | None = Field(default=None, description="logged propensity of the taken action, in (0, 1]")
    site: str | None = Field(default=None, description="site column; when set, sites come from it")
    static: list[ColumnSpec] = Field(default_factory=list, description="static covariates X")
    context: list[ContextSpec] = Field(default_factory=list, description="time-varying context A_t")
    #: explicit action vocabulary: value ``actions[i]`` gets id ``i`` and label ``actions[i]``; any other value in the
    #: table is an error
    actions: list[str] | None = None
    #: alternatively, actions are already integer ids in ``[0, n_actions)``
    n_actions: int | None = Field(default=None, ge=1)
    #: labels of integer-id actions (with ``n_actions``): ``action_labels[i]`` names id ``i``
    action_labels: list[str] | None = None
    outcome_kind: Literal["binary", "continuous"] = "binary"
    max_len: int = Field(default=50, ge=1, description="Lmax: trajectories are padded/truncated to this length")
    #: ``truncate`` keeps the first max_len steps; ``chunk`` cuts a long entity into consecutive trajectories
    overflow: Literal["truncate", "chunk"] = "truncate"
    #: rows must already be in time order within an entity unless this is true (then they are sorted; ties are errors)
    sort_by_time: bool = False
    #: categoricals with at most this many levels are one-hot encoded, larger ones become one integer-id column
    one_hot_max: int = Field(default=10, ge=1)
    #: optional declared site names; a declared site without rows is an error ("empty site")
    sites: list[str] | None = None
    #: a confounder the table does not record, declared in words: the weighted answers are then not identified
    #: (``queries.declared``); the run's ``[evaluation] unrecorded_confounding`` overrides it
    unrecorded_confounding: str | None = Field(default=None, min_length=1)

    @field_validator("actions", "action_labels")
    @classmethod
    def _unique_actions(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("must list at least one action")
            if len(set(v)) != len(v):
                raise ValueError("action names must be unique")
            reserved = [a for a in v if a.startswith(ANCHOR_PREFIX)]
            if reserved:
                raise ValueError(f"action label {reserved[0]!r}: the prefix '{ANCHOR_PREFIX}' names a policy anchor")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetSpec":
        if self.actions is not None and self.n_actions is not None and len(self.actions) != self.n_actions:
            raise ValueError(f"actions lists {len(self.actions)} values but n_actions is {self.n_actions}")
        if self.action_labels is not None:
            if self.n_actions is None:
                raise ValueError("action_labels names integer-id actions: set n_actions too (or list 'actions')")
            if len(self.action_labels) != self.n_actions:
                raise ValueError(f"action_labels lists {len(self.action_labels)} labels but n_actions is {self.n_actions}")
        if self.sites is not None and self.site is None:
            raise ValueError("'sites' is given but no 'site' column is named")
        names = [self.entity, self.time, self.action, self.outcome]
        names += [c for c in (self.propensity, self.site) if c]
        names += [c.name for c in self.static] + [c.name for c in self.context]
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise ValueError(f"column '{n}' is used for two roles")
            seen.add(n)
        return self

    def required_columns(self) -> list[tuple[str, str]]:
        """``(column, spec field)`` pairs for every column the table must have, in spec order."""
        out = [(self.entity, "entity"), (self.time, "time"), (self.action, "action"), (self.outcome, "outcome")]
        if self.propensity:
            out.append((self.propensity, "propensity"))
        if self.site:
            out.append((self.site, "site"))
        out += [(c.name, f"static[{i}].name") for i, c in enumerate(self.static)]
        out += [(c.name, f"context[{i}].name") for i, c in enumerate(self.context)]
        return out


def field_path(loc: tuple) -> str:
    """A pydantic error location as the user writes it in the file: ``static[1].kind``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def load_spec(path: str | Path) -> DatasetSpec:
    """Read a ``DatasetSpec`` from a ``.toml``, ``.yaml`` or ``.yml`` file.

    Args:
        path: The spec file.

    Returns:
        The validated spec.

    Raises:
        DataError: The file is missing, does not parse or does not validate; the message names the file and the
            offending field (e.g. ``static[1].kind``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("spec file not found", file=path)
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            raw = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text)
        else:
            raise DataError(f"unknown spec format '{suffix}' (use .toml, .yaml or .yml)", file=path)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise DataError(f"does not parse as {suffix[1:].upper()}: {exc}", file=path) from None
    if not isinstance(raw, dict):
        raise DataError("the spec must be a mapping of fields", file=path)
    try:
        return DatasetSpec.model_validate(raw)
    except ValidationError as exc:
        loc, msg = invalid_field(exc, DatasetSpec)
        raise DataError(msg, file=path, field=field_path(loc)) from None

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
    missing = "indicator"

Every error raised while reading a spec or a table is a :class:`DataError` that names the file, and the
column, row or spec field where it applies, so that the CLI can print it and exit non-zero.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class DataError(ValueError):
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
    missing: Literal["error", "indicator"] = "error"


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
    context: list[ColumnSpec] = Field(default_factory=list, description="time-varying context A_t")
    #: explicit action vocabulary: value ``actions[i]`` gets id ``i``; any other value in the table is an error
    actions: list[str] | None = None
    #: alternatively, actions are already integer ids in ``[0, n_actions)``
    n_actions: int | None = Field(default=None, ge=1)
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

    @field_validator("actions")
    @classmethod
    def _unique_actions(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("must list at least one action")
            if len(set(v)) != len(v):
                raise ValueError("action names must be unique")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetSpec":
        if self.actions is not None and self.n_actions is not None and len(self.actions) != self.n_actions:
            raise ValueError(f"actions lists {len(self.actions)} values but n_actions is {self.n_actions}")
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
        first = exc.errors()[0]
        field = field_path(tuple(first["loc"]))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DataError(f"{first['msg']}{more}", file=path, field=field) from None

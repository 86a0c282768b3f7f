"""The common preprocessing pipeline of paper §IV-A "Feature engineering and sequence construction".

Raw logs become ``(X, A_1:L, T_1:L, Y_1:L, M_1:L[, P_1:L])``:

1. rows are grouped by an entity id and ordered by time (:func:`pack`);
2. each entity is truncated (or cut into consecutive chunks) and padded to ``Lmax``; truncations are counted in meta;
3. actions become integer ids (the id → name mapping is kept in ``meta['action_names']``);
4. covariates are encoded: small categoricals one-hot, large ones one integer-id column (0 = missing), missing
   values as an explicit ``<name>__missing`` indicator;
5. continuous covariates are z-scored with *training-split* statistics (:class:`Standardizer`): the statistics
   are fitted on the training sites only and returned, so that the test split reuses them.

Metadata every builder in this package writes into ``SiteDataset.meta`` (JSON-friendly except ``entity``):

=====================  ====================================================================================
key                    meaning
=====================  ====================================================================================
dataset                dataset name
x_names / a_names      one name per column of X / A
x_continuous           indices of X columns to z-score (likewise ``a_continuous``)
x_categorical          ``{column index: cardinality}`` of integer-id columns of X (likewise ``a_categorical``)
action_names           ``action_names[i]`` is the label of action id ``i`` (the raw value, or the spec's label)
a_dynamics             per column of A: "endogenous" (simulated under an intervention) or "exogenous" (replayed);
                       endogenous columns come first (``fcd_secure.data.spec.context_dynamics``)
outcome_name           what Y is
max_len / overflow     Lmax and the rule for longer entities ("truncate" or "chunk")
truncated_entities     entities longer than Lmax; ``dropped_steps``: steps cut off by "truncate"
notes                  list of modelling choices, in words
entity                 int64 [n]: entity index of each trajectory (chunks of one entity share it)
standardization        set by :meth:`Standardizer.apply`: the statistics used
raw_record             S32 [n], set by :meth:`Standardizer.apply`: each row's raw-content digest (``data.records``)
=====================  ====================================================================================
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from fcd_secure.data.records import RAW_RECORD_KEY, raw_records
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DYNAMICS_META_KEY, ColumnSpec, DataError, DatasetSpec, load_spec

# ---------------------------------------------------------------------------------------------------------------
# sequence construction
# ---------------------------------------------------------------------------------------------------------------


def pack(
    entity: np.ndarray,
    max_len: int,
    *,
    overflow: str,
    A: np.ndarray,
    T: np.ndarray,
    Y: np.ndarray,
    X: np.ndarray,
    P: np.ndarray | None = None,
    file: str | Path | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Turn step rows into padded trajectories.

    ``entity`` is an int array [N] with the rows of one entity contiguous and in time order (the caller sorts).
    ``A`` [N, da], ``T`` [N], ``Y`` [N], ``P`` [N] are per step; ``X`` [N, dx] is per step too and the value at the
    first step of each trajectory becomes the trajectory's static covariates (so a chunk can carry a baseline
    computed from the history before it). ``overflow="truncate"`` keeps the first ``max_len`` steps of an entity;
    ``"chunk"`` cuts it into consecutive trajectories of at most ``max_len`` steps.

    Returns the arrays (X, A, T, Y, M, P, entity per trajectory) and counts for meta.

    Raises:
        DataError: no rows, or padded arrays that would not fit in memory (field ``max_len``; ``file`` is named).
    """
    N = len(entity)
    if N == 0:
        raise DataError("no rows to build trajectories from")
    starts = np.r_[True, entity[1:] != entity[:-1]]
    first_of = np.maximum.accumulate(np.where(starts, np.arange(N), 0))
    rank = np.arange(N) - first_of
    ent_len = np.bincount(np.cumsum(starts) - 1)
    if overflow == "chunk":
        chunk = rank // max_len
        keep = np.ones(N, dtype=bool)
    elif overflow == "truncate":
        chunk = np.zeros(N, dtype=np.int64)
        keep = rank < max_len
    else:  # pragma: no cover - guarded by the pydantic Literal
        raise DataError(f"unknown overflow rule '{overflow}'")
    pos = rank % max_len
    new_traj = keep & ((rank % max_len == 0) | starts)
    traj = np.cumsum(new_traj) - 1
    n = int(new_traj.sum())
    L = max_len
    da = A.shape[1]
    check_padded_size(n, L, da, P is not None, int(ent_len.max()), file)
    rows = np.flatnonzero(keep)
    ti, pi = traj[rows], pos[rows]
    out = {
        "X": X[new_traj].astype(np.float32),
        "A": np.zeros((n, L, da), dtype=np.float32),
        "T": np.zeros((n, L), dtype=np.int64),
        "Y": np.zeros((n, L), dtype=np.float32),
        "M": np.zeros((n, L), dtype=np.float32),
        "P": None if P is None else np.ones((n, L), dtype=np.float32),
        "entity": entity[new_traj].astype(np.int64),
    }
    out["A"][ti, pi] = A[rows]
    out["T"][ti, pi] = T[rows]
    out["Y"][ti, pi] = Y[rows]
    out["M"][ti, pi] = 1.0
    if P is not None:
        out["P"][ti, pi] = P[rows]
    info = {
        "max_len": int(max_len),
        "overflow": overflow,
        "truncated_entities": int((ent_len > max_len).sum()),
        "dropped_steps": int((~keep).sum()),
        "entities": int(len(ent_len)),
    }
    return out, info


#: |mean of 1{T = a}/P − 1| beyond this many standard errors *and* this share refuses a propensity column
BALANCE_Z, BALANCE_SHARE = 8.0, 0.5


def propensity_balance_warnings(actions: np.ndarray, p: np.ndarray, M: np.ndarray, action_names: list[str],
                                column: str) -> list[str]:
    """Why a propensity column may not be the probability of the logged action (``fcd data validate`` prints it).

    If P_t = Pr(T_t = a_t | H_t) is the logging probability of the action taken, then for every action a,
    E[1{T_t = a} / P_t] = Σ_h Pr(h) Pr(a | h) / Pr(a | h) = 1 (the Horvitz–Thompson balancing identity; Horvitz &
    Thompson 1952; the "weights average to one" check of Cole & Hernán 2008). A column holding the probability of
    one fixed action, or of "treated", or a score on another scale, breaks it for some action by far more than
    chance: the mean's deviation from 1 must exceed both :data:`BALANCE_Z` standard errors and
    :data:`BALANCE_SHARE` of 1 (a logging policy with rare actions has noisy means). A warning, not a refusal: a
    table's column may be the probability of a coarser action than the spec's (OBD's item at a position), and the
    sites' answers then say what they assume.

    Returns:
        One line per action whose mean weight is off, naming the action, its mean and the column.
    """
    valid = np.asarray(M) > 0
    actions = np.asarray(actions)[valid]
    w_all = 1.0 / np.asarray(p, dtype=np.float64)[valid]
    n = actions.size
    out = []
    for a, name in enumerate(action_names):
        w = np.where(actions == a, w_all, 0.0)
        mean = float(w.mean())
        se = float(w.std(ddof=1) / np.sqrt(n)) if n > 1 else math.inf
        if abs(mean - 1.0) > max(BALANCE_Z * se, BALANCE_SHARE):
            out.append(
                f"column {column!r}: the propensities do not sum sensibly per step: over the {n} steps, the mean of "
                f"1{{action = {name!r}}}/propensity is {mean:.3f} ± {se:.3f}, where the probability of the logged "
                "action gives 1 for every action; the column must hold the probability of the action each row took "
                "(not of one fixed action, nor a score)")
    return out


def padded_bytes(n: int, max_len: int, da: int, has_propensity: bool) -> int:
    """Bytes of the padded per-step arrays of ``n`` trajectories: A (float32 × da), T (int64), Y, M (and P) float32."""
    return int(n) * int(max_len) * (4 * int(da) + 8 + 4 + 4 + (4 if has_propensity else 0))


def memory_budget() -> int:
    """Half of this machine's physical memory: the most the padded arrays of one dataset may take."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def check_padded_size(
    n: int, max_len: int, da: int, has_propensity: bool, longest: int, file: str | Path | None = None
) -> None:
    """Refuse, before anything is allocated, padded arrays larger than :func:`memory_budget`.

    Raises:
        DataError: naming the spec field ``max_len``, the size it would take and the longest entity.
    """
    need, budget = padded_bytes(n, max_len, da, has_propensity), memory_budget()
    if need > budget:
        raise DataError(
            f"max_len = {max_len} would allocate {_human_bytes(need)} for {n:,} trajectories (the longest entity has "
            f"{longest:,} steps; half of this machine's memory is {_human_bytes(budget)}); lower max_len, or use "
            'overflow = "chunk"',
            file=file, field="max_len",
        )


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.2f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.2f} PiB"  # pragma: no cover


def make_dataset(arrays: dict[str, np.ndarray], n_actions: int, name: str, meta: dict[str, Any]) -> SiteDataset:
    """Wrap :func:`pack` output as a ``SiteDataset`` (meta gets the per-trajectory ``entity``)."""
    meta = dict(meta)
    meta["entity"] = arrays["entity"]
    return SiteDataset(
        X=arrays["X"], A=arrays["A"], T=arrays["T"], Y=arrays["Y"], M=arrays["M"], P=arrays["P"],
        n_actions=int(n_actions), name=name, meta=meta,
    )


# ---------------------------------------------------------------------------------------------------------------
# covariate encoding
# ---------------------------------------------------------------------------------------------------------------


class EncodedColumns:
    """Accumulates encoded covariate columns with their names and roles (continuous / categorical id / 0-1)."""

    def __init__(self) -> None:
        self.cols: list[np.ndarray] = []
        self.names: list[str] = []
        self.continuous: list[int] = []
        self.categorical: dict[int, int] = {}
        self.levels: dict[str, list[str]] = {}

    def add(self, values: np.ndarray, name: str, role: str = "binary", cardinality: int | None = None) -> None:
        idx = len(self.cols)
        self.cols.append(np.asarray(values, dtype=np.float32))
        self.names.append(name)
        if role == "continuous":
            self.continuous.append(idx)
        elif role == "categorical":
            self.categorical[idx] = int(cardinality or 0)

    def add_one_hot(self, codes: np.ndarray, levels: list[str], name: str) -> None:
        """``codes`` in [0, len(levels)), -1 for missing (all-zero row)."""
        for k, lev in enumerate(levels):
            self.add(codes == k, f"{name}={lev}")

    def matrix(self, n: int) -> np.ndarray:
        if not self.cols:
            return np.zeros((n, 0), dtype=np.float32)
        return np.stack(self.cols, axis=1).astype(np.float32)


def integer_ids(s: pd.Series, missing_value: str | None = "?") -> tuple[np.ndarray, int, list[str]]:
    """Integer ids 1..K for the sorted levels of ``s``, 0 for ``missing_value``.

    Returns:
        ``(ids, cardinality K + 1, levels)``; levels are sorted by length, then text.
    """
    sv = s.astype(str)
    miss = (sv == missing_value).to_numpy() if missing_value is not None else np.zeros(len(sv), bool)
    levels = sorted(sv[~miss].unique(), key=lambda v: (len(v), v))
    lookup = {v: i + 1 for i, v in enumerate(levels)}
    ids = np.where(miss, 0, sv.map(lookup).fillna(0).to_numpy()).astype(np.int64)
    return ids, len(levels) + 1, levels


def encoded_meta(
    dataset: str,
    xe: EncodedColumns,
    ae: EncodedColumns,
    *,
    action_names: list[str],
    outcome_name: str,
    info: dict,
    notes: list[str],
    **extra: object,
) -> dict:
    """``meta`` of a dataset whose X and A were encoded with :class:`EncodedColumns`, in the layout of
    :func:`build_dataset` (module docstring): names, roles and the levels of X *and* A (keyed by column)."""
    return {
        "dataset": dataset,
        "x_names": xe.names,
        "a_names": ae.names,
        "x_continuous": xe.continuous,
        "a_continuous": ae.continuous,
        "x_categorical": xe.categorical,
        "a_categorical": ae.categorical,
        "levels": {**xe.levels, **ae.levels},
        "action_names": action_names,
        "outcome_name": outcome_name,
        **extra,
        **info,
        "notes": notes,
    }


def _line(row: int, is_csv: bool) -> int | None:
    return row + 2 if is_csv else None


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _encode_column(
    df: pd.DataFrame, col: ColumnSpec, field: str, enc: EncodedColumns, spec: DatasetSpec, file: str, is_csv: bool
) -> None:
    s = df[col.name]
    missing = s.isna().to_numpy()
    if col.kind in ("continuous", "binary"):
        num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64)
        nonnum = np.isnan(num) & ~missing
        if nonnum.any():
            r = _first_bad(nonnum)
            raise DataError(
                f"value {s.iloc[r]!r} is not a number ({field} is {col.kind})",
                file=file, column=col.name, row=r, line=_line(r, is_csv),
            )
        inf = np.isinf(num)
        if inf.any():
            r = _first_bad(inf)
            raise DataError("value is inf", file=file, column=col.name, row=r, line=_line(r, is_csv))
        if missing.any() and col.missing == "error":
            r = _first_bad(missing)
            raise DataError(
                f"missing value (NaN/empty) not allowed: set {field.replace('.name', '.missing')} = \"indicator\"",
                file=file, column=col.name, row=r, line=_line(r, is_csv),
            )
        if col.kind == "binary":
            bad = ~missing & ~np.isin(num, (0.0, 1.0))
            if bad.any():
                r = _first_bad(bad)
                raise DataError(
                    f"binary column holds {num[r]!r}, expected 0 or 1", file=file, column=col.name, row=r,
                    line=_line(r, is_csv),
                )
        enc.add(np.where(missing, 0.0, num), col.name, "continuous" if col.kind == "continuous" else "binary")
    else:
        if missing.any() and col.missing == "error":
            r = _first_bad(missing)
            raise DataError(
                f"missing value (NaN/empty) not allowed: set {field.replace('.name', '.missing')} = \"indicator\"",
                file=file, column=col.name, row=r, line=_line(r, is_csv),
            )
        as_str = s.astype("string")
        levels = list(col.levels) if col.levels is not None else sorted(str(v) for v in as_str.dropna().unique())
        codes = pd.Categorical(as_str, categories=levels).codes.astype(np.int64)  # -1 where missing
        unknown = (codes < 0) & ~missing
        if unknown.any():
            r = _first_bad(unknown)
            raise DataError(
                f"value {str(as_str.iloc[r])!r} is not one of the declared levels {field.replace('.name', '.levels')} "
                f"= {levels}", file=file, column=col.name, row=r, line=_line(r, is_csv),
            )
        enc.levels[col.name] = levels
        if len(levels) <= spec.one_hot_max:
            enc.add_one_hot(codes, levels, col.name)
        else:
            # integer id 1..K, 0 reserved for "missing" so an embedding table of K+1 rows covers every value
            enc.add(codes + 1, col.name, "categorical", cardinality=len(levels) + 1)
    if col.missing == "indicator":
        enc.add(missing, f"{col.name}__missing")


# ---------------------------------------------------------------------------------------------------------------
# tables described by a DatasetSpec
# ---------------------------------------------------------------------------------------------------------------


def _encode_covariates(
    df: pd.DataFrame, spec: DatasetSpec, file: str, is_csv: bool
) -> tuple[EncodedColumns, EncodedColumns, list[str]]:
    """X and A of ``df`` encoded by ``spec``, with the dynamics marker of each column of A."""
    xenc, aenc = EncodedColumns(), EncodedColumns()
    for i, c in enumerate(spec.static):
        _encode_column(df, c, f"static[{i}].name", xenc, spec, file, is_csv)
    # endogenous contexts first, so that a model's context head generates the leading columns (spec.context_dynamics)
    a_dynamics: list[str] = []
    for dyn in ("endogenous", "exogenous"):
        for i, c in enumerate(spec.context):
            if c.dynamics == dyn:
                before = len(aenc.names)
                _encode_column(df, c, f"context[{i}].name", aenc, spec, file, is_csv)
                a_dynamics += [dyn] * (len(aenc.names) - before)
    return xenc, aenc, a_dynamics


#: the keys of ``SiteDataset.meta`` that fix the shape of the encoded data a model is built for
_LAYOUT_KEYS = ("x_names", "a_names", "x_continuous", "a_continuous", "x_categorical", "a_categorical", DYNAMICS_META_KEY,
                "action_names", "max_len")


def encoded_layout(meta: dict) -> dict[str, Any]:
    """The encoded layout of a dataset: column names, roles and cardinalities of X and A, context dynamics, action
    labels and Lmax — everything of the data a model's parameter shapes depend on, and nothing of its values."""
    out = {k: meta.get(k) for k in _LAYOUT_KEYS}
    for k in ("x_categorical", "a_categorical"):
        out[k] = {str(i): int(c) for i, c in sorted((int(i), c) for i, c in (out[k] or {}).items())}
    return out


def layout_digest(layout: dict[str, Any]) -> str:
    """SHA-256 of :func:`encoded_layout` in canonical JSON."""
    return hashlib.sha256(json.dumps(layout, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def undeclared_levels(spec: DatasetSpec) -> list[str]:
    """The spec fields of categorical columns that declare no ``levels`` (their encoding depends on each table)."""
    return [f"{part}[{i}].levels" for part, cols in (("static", spec.static), ("context", spec.context))
            for i, c in enumerate(cols) if c.kind == "categorical" and c.levels is None]


def spec_layout(spec: DatasetSpec) -> dict[str, Any] | None:
    """The encoded layout every table read with ``spec`` has, known from the spec alone; ``None`` when a categorical
    column declares no levels (:func:`undeclared_levels`).

    The covariates are encoded by the same code as :func:`build_dataset`, on a table with no rows.
    """
    if undeclared_levels(spec):
        return None
    empty = pd.DataFrame({c.name: pd.Series([], dtype="object" if c.kind == "categorical" else "float64")
                          for c in (*spec.static, *spec.context)})
    xenc, aenc, a_dynamics = _encode_covariates(empty, spec, "<spec>", False)
    n_actions = len(spec.actions) if spec.actions is not None else spec.n_actions
    if n_actions is None:
        return None  # actions named by the table's values: the vocabulary is the table's
    labels = list(spec.actions or spec.action_labels or [str(i) for i in range(n_actions)])
    meta = {"x_names": xenc.names, "a_names": aenc.names, "x_continuous": xenc.continuous,
            "a_continuous": aenc.continuous, "x_categorical": xenc.categorical, "a_categorical": aenc.categorical,
            DYNAMICS_META_KEY: a_dynamics, "action_names": labels, "max_len": spec.max_len}
    return encoded_layout(meta)


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV (optionally .gz) or Parquet table; :class:`DataError` names the file if it can't be read."""
    path = Path(path)
    if not path.is_file():
        raise DataError("table file not found", file=path)
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            df = pd.read_parquet(path)
        elif name.endswith((".csv", ".csv.gz", ".tsv", ".txt")):
            df = pd.read_csv(path, sep="\t" if name.endswith(".tsv") else ",")
        else:
            raise DataError("unknown table format (use .csv, .csv.gz or .parquet)", file=path)
    except DataError:
        raise
    except Exception as exc:  # pandas/pyarrow raise many types; all mean "this file is not a readable table"
        raise DataError(f"cannot read the table: {exc}", file=path) from None
    if len(df) == 0:
        raise DataError("the table has no rows", file=path)
    return df


def _check_columns(df: pd.DataFrame, spec: DatasetSpec, file: str) -> None:
    import difflib

    for column, field in spec.required_columns():
        if column not in df.columns:
            close = difflib.get_close_matches(column, [str(c) for c in df.columns], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; the table has {list(map(str, df.columns))[:12]}"
            raise DataError(f"column named in spec field '{field}' is not in the table{hint}", file=file, column=column)


def build_dataset(spec: DatasetSpec, df: pd.DataFrame, file: str | Path = "<table>") -> SiteDataset:
    """Apply ``spec`` to a long-format table and return one pooled ``SiteDataset`` (continuous columns unscaled).

    Args:
        spec: The dataset spec.
        df: The long-format table, one row per step.
        file: The table's file name, for error messages.

    Returns:
        The pooled dataset; ``meta['site']`` holds the per-trajectory site index (into ``meta['site_names']``)
        when the spec names a site column.

    Raises:
        DataError: Names the file, column and row (0-based data row; for CSV also the file line): missing or
            misnamed columns, NaN or inf where not allowed, action values outside the declared vocabulary or id
            range, time not strictly increasing within an entity, propensities outside (0, 1], binary outcomes
            not 0/1, a site that changes within an entity or is not declared, a declared site without rows.
    """
    file = str(file)
    is_csv = ".csv" in file.lower()
    if len(df) == 0:
        raise DataError("the table has no rows", file=file)
    _check_columns(df, spec, file)
    df = df.reset_index(drop=True)

    def fail(msg: str, column: str, row: int) -> DataError:
        return DataError(msg, file=file, column=column, row=int(row), line=_line(int(row), is_csv))

    # entity and time
    ent_s = df[spec.entity]
    if ent_s.isna().any():
        raise fail("entity id is missing", spec.entity, _first_bad(ent_s.isna().to_numpy()))
    # trajectories come out in entity-id order, whatever the row order of the file
    ent_codes, ent_names = pd.factorize(ent_s, sort=True)
    time = pd.to_numeric(df[spec.time], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(time)
    if bad.any():
        r = _first_bad(bad)
        raise fail(f"time value {df[spec.time].iloc[r]!r} is not a finite number", spec.time, r)
    if spec.sort_by_time:
        order = np.lexsort((time, ent_codes))
    else:
        # rows must already be in time order within an entity: check against the entity's previous row
        prev = pd.Series(time).groupby(ent_codes).shift(1).to_numpy()
        bad = ~np.isnan(prev) & (time <= prev)
        if bad.any():
            r = _first_bad(bad)
            raise fail(
                f"time does not increase within entity {ent_s.iloc[r]!r} ({prev[r]:g} then {time[r]:g}); "
                "sort the table or set sort_by_time = true",
                spec.time, r,
            )
        order = np.argsort(ent_codes, kind="stable")
    ent_sorted, time_sorted = ent_codes[order], time[order]
    tie = np.r_[False, (ent_sorted[1:] == ent_sorted[:-1]) & (time_sorted[1:] == time_sorted[:-1])]
    if tie.any():
        r = int(order[_first_bad(tie)])
        raise fail(f"two rows of entity {ent_s.iloc[r]!r} share time {time[r]:g}", spec.time, r)

    # actions
    act = df[spec.action]
    if act.isna().any():
        raise fail("action is missing", spec.action, _first_bad(act.isna().to_numpy()))
    if spec.actions is not None:
        lookup = {a: i for i, a in enumerate(spec.actions)}
        raw = act.astype(str).to_numpy()
        ids = np.array([lookup.get(v, -1) for v in raw], dtype=np.int64)
        if (ids < 0).any():
            r = _first_bad(ids < 0)
            raise fail(f"action value {raw[r]!r} is not in spec field 'actions' {spec.actions}", spec.action, r)
        action_names = list(spec.actions)
    elif spec.n_actions is not None:
        num = pd.to_numeric(act, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(num) | (num != np.round(num)) | (num < 0) | (num >= spec.n_actions)
        if bad.any():
            r = _first_bad(bad)
            raise fail(f"action id {act.iloc[r]!r} out of range [0, {spec.n_actions}) (spec field 'n_actions')", spec.action, r)
        ids = num.astype(np.int64)
        action_names = list(spec.action_labels) if spec.action_labels else [str(i) for i in range(spec.n_actions)]
    else:
        codes, uniques = pd.factorize(act, sort=True)
        ids = codes.astype(np.int64)
        action_names = [str(u) for u in uniques]
    n_actions = len(action_names)

    # outcome
    y = pd.to_numeric(df[spec.outcome], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(y)
    if bad.any():
        r = _first_bad(bad)
        raise fail(f"outcome value {df[spec.outcome].iloc[r]!r} is NaN, inf or not a number", spec.outcome, r)
    if spec.outcome_kind == "binary" and not np.isin(y, (0.0, 1.0)).all():
        r = _first_bad(~np.isin(y, (0.0, 1.0)))
        raise fail(f"binary outcome holds {y[r]:g}, expected 0 or 1 (or set outcome_kind = \"continuous\")", spec.outcome, r)

    # propensity
    p = None
    if spec.propensity:
        p = pd.to_numeric(df[spec.propensity], errors="coerce").to_numpy(dtype=np.float64)
        missing = df[spec.propensity].isna().to_numpy()
        if missing.any():
            r = _first_bad(missing)
            raise fail(f"propensity is missing on {int(missing.sum())} row(s) (first shown; a logged propensity "
                       "must be on every row, or drop the column and let the sites estimate it)", spec.propensity, r)
        bad = ~np.isfinite(p) | (p <= 0) | (p > 1)
        if bad.any():
            r = _first_bad(bad)
            raise fail(f"propensity {df[spec.propensity].iloc[r]!r} is outside (0, 1] ({int(bad.sum())} such "
                       "row(s), first shown)", spec.propensity, r)

    # site
    site_idx = None
    site_names: list[str] | None = None
    if spec.site:
        ss = df[spec.site]
        if ss.isna().any():
            raise fail("site is missing", spec.site, _first_bad(ss.isna().to_numpy()))
        sv = ss.astype(str).to_numpy()
        if spec.sites is not None:
            unknown = ~np.isin(sv, spec.sites)
            if unknown.any():
                r = _first_bad(unknown)
                raise fail(f"site {sv[r]!r} is not in spec field 'sites' {spec.sites}", spec.site, r)
            present = set(sv)
            for s_name in spec.sites:
                if s_name not in present:
                    raise DataError(f"site '{s_name}' declared in spec field 'sites' has no rows (empty site)",
                                    file=file, column=spec.site, field="sites")
            site_names = list(spec.sites)
        else:
            site_names = sorted(set(sv))
        site_code = np.searchsorted(np.array(site_names), sv) if spec.sites is None else np.array(
            [site_names.index(v) for v in sv], dtype=np.int64)
        first_site = pd.Series(site_code).groupby(ent_codes).transform("first").to_numpy()
        bad = site_code != first_site
        if bad.any():
            r = _first_bad(bad)
            raise fail(f"entity {ent_s.iloc[r]!r} changes site (an entity belongs to one site)", spec.site, r)
        site_idx = site_code.astype(np.int64)

    xenc, aenc, a_dynamics = _encode_covariates(df, spec, file, is_csv)
    N = len(df)
    Xr, Ar = xenc.matrix(N), aenc.matrix(N)

    arrays, info = pack(
        ent_sorted, spec.max_len, overflow=spec.overflow,
        A=Ar[order], T=ids[order], Y=y[order].astype(np.float32), X=Xr[order],
        P=None if p is None else p[order].astype(np.float32), file=file,
    )
    meta: dict[str, Any] = {
        "dataset": spec.name,
        "source": file,
        "x_names": xenc.names,
        "a_names": aenc.names,
        "x_continuous": xenc.continuous,
        "a_continuous": aenc.continuous,
        "x_categorical": xenc.categorical,
        "a_categorical": aenc.categorical,
        "levels": {**xenc.levels, **aenc.levels},
        "action_names": action_names,
        DYNAMICS_META_KEY: a_dynamics,
        "outcome_name": spec.outcome,
        "entity_names": [str(v) for v in ent_names],
        **info,
        "notes": [
            "static covariates X are the values at the first step of each trajectory",
            f"entities longer than {spec.max_len} steps: {spec.overflow}",
        ],
    }
    if site_idx is not None:
        # trajectories start at a row of their entity; every row of an entity has the same site (checked above)
        first_row_site = pd.Series(site_idx[order]).groupby(ent_sorted).first().to_numpy()
        meta["site"] = first_row_site[arrays["entity"]].astype(np.int64)
        meta["site_names"] = site_names
    return make_dataset(arrays, n_actions, spec.name, meta)


def dataset_from_files(spec_path: str | Path, table_path: str | Path) -> tuple[DatasetSpec, SiteDataset]:
    """Load a spec and a table and build the pooled dataset.

    Args:
        spec_path: The ``DatasetSpec`` file (TOML/YAML).
        table_path: The long-format table (CSV, CSV.gz, Parquet).

    Returns:
        ``(spec, pooled dataset)``.

    Raises:
        DataError: Any problem with either file (see :func:`build_dataset`).
    """
    spec = load_spec(spec_path)
    df = read_table(table_path)
    try:
        return spec, build_dataset(spec, df, table_path)
    except DataError as exc:
        if exc.field == "max_len":  # a size the spec asked for: name the spec file, where the field is
            raise DataError(exc.message, file=spec_path, field="max_len") from None
        raise


# ---------------------------------------------------------------------------------------------------------------
# z-scoring with training-split statistics
# ---------------------------------------------------------------------------------------------------------------


class Standardizer(BaseModel):
    """Per-column mean/std of the continuous columns of X and A, fitted on training data only (paper §IV-A).

    ``A`` statistics use valid steps only (``M = 1``); padding stays 0 after :meth:`apply`. A column with zero
    spread gets std 1 so that it maps to 0 rather than NaN.
    """

    x_cols: list[int]
    x_mean: list[float]
    x_std: list[float]
    a_cols: list[int]
    a_mean: list[float]
    a_std: list[float]

    @classmethod
    def fit(cls, data: SiteDataset | list[SiteDataset]) -> "Standardizer":
        sets = data if isinstance(data, list) else [data]
        first = sets[0]
        xc = [int(i) for i in first.meta.get("x_continuous", [])]
        ac = [int(i) for i in first.meta.get("a_continuous", [])]
        X = np.concatenate([d.X[:, xc] for d in sets]).astype(np.float64) if xc else np.zeros((1, 0))
        if ac:
            A = np.concatenate([d.A[d.M > 0][:, ac] for d in sets]).astype(np.float64)
        else:
            A = np.zeros((1, 0))

        def stats(v: np.ndarray) -> tuple[list[float], list[float]]:
            mu = v.mean(axis=0) if len(v) else np.zeros(v.shape[1])
            sd = v.std(axis=0) if len(v) else np.ones(v.shape[1])
            sd = np.where(sd > 1e-12, sd, 1.0)
            return [float(m) for m in mu], [float(s) for s in sd]

        xm, xs = stats(X)
        am, as_ = stats(A)
        return cls(x_cols=xc, x_mean=xm, x_std=xs, a_cols=ac, a_mean=am, a_std=as_)

    def apply(self, ds: SiteDataset, copy: bool = True) -> SiteDataset:
        """``ds`` with continuous columns z-scored. ``copy=False`` overwrites ``ds.X``/``ds.A`` in place (for callers
        that own the arrays: it spares a copy of A, which is hundreds of MB for Diabetes-130)."""
        if ds.meta.get("standardization") is not None:
            raise DataError(f"{ds.name}: dataset is already standardised")
        # each row's raw-content digest, before the raw values are overwritten: a record's identity for the ε
        # account must not move with the statistics (data.records, docs/threats.md P45)
        digests = raw_records(ds)
        X, A = (ds.X.copy(), ds.A.copy()) if copy else (ds.X, ds.A)
        if self.x_cols:
            X[:, self.x_cols] = (X[:, self.x_cols] - np.float32(self.x_mean)) / np.float32(self.x_std)
        if self.a_cols:
            z = (A[:, :, self.a_cols] - np.asarray(self.a_mean, np.float32)) / np.asarray(self.a_std, np.float32)
            A[:, :, self.a_cols] = z * ds.M[:, :, None]
        meta = dict(ds.meta)
        meta["standardization"] = self.model_dump()
        meta[RAW_RECORD_KEY] = digests
        return replace(ds, X=X, A=A, meta=meta)


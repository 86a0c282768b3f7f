"""A federated dataset written back as long-format tables, one per site, with the spec that reads them.

This is how a generated world (DKT-Synth) becomes what a hospital has: its own table of one row per step, read
through the consortium's :class:`~fcd_secure.data.spec.DatasetSpec`. Reading a written table with the written spec
gives the site's trajectories back (static columns, contexts, actions, outcomes, propensities), unscaled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import tomli_w

from fcd_secure.data.schema import SiteDataset


def _column_kind(ds: SiteDataset, part: str, j: int) -> str:
    values = (ds.X[:, j] if part == "x" else ds.A[ds.M > 0][:, j]).astype(np.float64)
    return "binary" if np.isin(values, (0.0, 1.0)).all() else "continuous"


def spec_text(ds: SiteDataset, name: str, site_column: str = "site") -> str:
    """The TOML spec of tables written by :func:`long_table` for data shaped like ``ds``."""
    x_names = list(ds.meta.get("x_names") or [f"x{j}" for j in range(ds.dx)])
    a_names = list(ds.meta.get("a_names") or [f"a{j}" for j in range(ds.da)])
    dynamics = list(ds.meta.get("a_dynamics") or ["endogenous"] * ds.da)
    doc = {
        "name": name, "entity": "entity", "time": "t", "action": "action", "outcome": "outcome",
        "n_actions": int(ds.n_actions), "site": site_column, "max_len": int(ds.L),
        "static": [{"name": n, "kind": _column_kind(ds, "x", j)} for j, n in enumerate(x_names)],
        "context": [{"name": n, "kind": _column_kind(ds, "a", j), "dynamics": dynamics[j]} for j, n in enumerate(a_names)],
    }
    if ds.P is not None:
        doc["propensity"] = "propensity"
    return tomli_w.dumps(doc)


def long_table(parts: list[SiteDataset], site_name: str) -> pd.DataFrame:
    """One site's rows: every valid step of every trajectory of ``parts`` (e.g. its train and test sets)."""
    rows: list[pd.DataFrame] = []
    offset = 0
    for ds in parts:
        x_names = list(ds.meta.get("x_names") or [f"x{j}" for j in range(ds.dx)])
        a_names = list(ds.meta.get("a_names") or [f"a{j}" for j in range(ds.da)])
        i, t = np.nonzero(ds.M > 0)
        df = pd.DataFrame({"entity": [f"{site_name}-{offset + k:06d}" for k in i], "t": t, "site": site_name})
        for j, n in enumerate(x_names):
            df[n] = ds.X[i, j]
        for j, n in enumerate(a_names):
            df[n] = ds.A[i, t, j]
        df["action"] = ds.T[i, t].astype(np.int64)
        df["outcome"] = ds.Y[i, t]
        if ds.P is not None:
            df["propensity"] = np.clip(ds.P[i, t], 1e-6, 1.0)
        rows.append(df)
        offset += ds.n
    return pd.concat(rows, ignore_index=True)


def write_site_tables(train: list[SiteDataset], test: list[SiteDataset], folder: str | Path, name: str) -> tuple[Path, list[Path]]:
    """Write ``spec.toml`` and ``site<i>.csv`` (site ``i``'s train and test rows) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.toml"
    spec.write_text(spec_text(train[0], name))
    tables = []
    for i, (tr, te) in enumerate(zip(train, test)):
        path = folder / f"site{i}.csv"
        long_table([tr, te], f"site{i}").to_csv(path, index=False)
        tables.append(path)
    return spec, tables

"""Open Bandit Dataset (paper Table I, "OBD"): ZOZOTOWN fashion recommendations with logged propensities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fcd_secure.data.paths import dataset_folder, need_file
from fcd_secure.data.preprocess import EncodedColumns, encoded_meta, integer_ids, make_dataset, pack
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.sources.base import REAL_PRESETS, PooledSource
from fcd_secure.data.spec import DataError

#: The dataset's folder inside the data folder (:func:`~fcd_secure.data.paths.default_data_dir`).
FOLDER = "open_bandit_dataset"


def load_open_bandit(
    data_dir: str | Path | None = None, max_len: int = 50, behavior: str = "both"
) -> SiteDataset:
    """Open Bandit Dataset sample, "all" campaign (ZOZOTOWN; 10,000 impressions per logging policy, 80 items).

    OBD has **no user id**. Trajectories here are *pseudo-users*, an assumption of ours, not a fact of the data:
    rows are grouped by (logging policy, the 4 user-feature hashes), sorted by timestamp, and cut into chunks of
    ``max_len`` (default 50, Table I's Lmax). A group is a coarse user segment, not an individual.

    - ``behavior``: "random" (uniform logging, propensity 1/80), "bts" (Bernoulli Thompson sampling) or "both"
      (pooled; a trajectory never mixes the two);
    - X (dx = 5): the 4 user features as integer ids (categorical, 0 unused) and a flag for the BTS log;
    - A_t (da = 8): position one-hot (3), hour of day as sin/cos, log1p seconds since the segment's previous
      impression (0 at a trajectory start), log1p of the summed user-item affinities and their non-zero count
      (summaries over all 80 items, so they do not depend on the item shown);
    - T_t = item id (0..79, |T| = 80; Table I's 8089 is not reproducible from the sample); Y_t = click;
    - P_t = the logged ``propensity_score`` of the shown item (site-private; in (0, 1]).
    """
    d = dataset_folder(data_dir, FOLDER)
    logs = {"random": ["random"], "bts": ["bts"], "both": ["random", "bts"]}.get(behavior)
    if logs is None:
        raise DataError(f"behavior must be 'random', 'bts' or 'both', got {behavior!r}")
    frames = []
    for k, pol in enumerate(logs):
        f = need_file(d / f"{pol}_all" / "all.csv.gz")
        df = pd.read_csv(f, index_col=0)
        df["_bts"] = 1.0 if pol == "bts" else 0.0
        df["_log"] = k
        df["_file"] = str(f)
        df["_row"] = np.arange(len(df))
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    p = df["propensity_score"].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(p) | (p <= 0) | (p > 1)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError("propensity outside (0, 1]", file=df["_file"].iloc[r], column="propensity_score",
                        row=int(df["_row"].iloc[r]))
    ufeat = [f"user_feature_{i}" for i in range(4)]
    xe = EncodedColumns()
    codes = []
    for c in ufeat:
        ids, card, levels = integer_ids(df[c], missing_value=None)
        xe.add(ids, c, "categorical", cardinality=card)
        xe.levels[c] = levels
        codes.append(ids)
    xe.add(df["_bts"].to_numpy(), "bts_log")
    ts = pd.to_datetime(df["timestamp"], utc=True)
    df["_ts"] = ts.astype("int64").to_numpy() / 1e9
    group = pd.factorize(pd.MultiIndex.from_arrays([df["_log"], *[df[c] for c in ufeat]]))[0]
    order = np.lexsort((df["_ts"].to_numpy(), group))
    df = df.iloc[order].reset_index(drop=True)
    group = group[order]
    Xr = xe.matrix(len(df))[order]
    N = len(df)
    ae = EncodedColumns()
    pos = df["position"].to_numpy()
    for k in (1, 2, 3):
        ae.add(pos == k, f"position={k}")
    ae.levels["position"] = ["1", "2", "3"]
    hour = (ts.iloc[order].dt.hour.to_numpy() + ts.iloc[order].dt.minute.to_numpy() / 60.0) / 24.0
    ae.add(np.sin(2 * np.pi * hour), "hour_sin")
    ae.add(np.cos(2 * np.pi * hour), "hour_cos")
    t = df["_ts"].to_numpy()
    gap = np.r_[0.0, np.diff(t)]
    gap[np.r_[True, group[1:] != group[:-1]]] = 0.0
    ae.add(np.log1p(np.maximum(gap, 0.0)), "log1p_gap_seconds", "continuous")
    aff = df[[c for c in df.columns if c.startswith("user-item_affinity_")]].to_numpy(dtype=np.float64)
    ae.add(np.log1p(aff.sum(axis=1)), "log1p_affinity_sum", "continuous")
    ae.add((aff != 0).sum(axis=1), "affinity_nonzero", "continuous")
    arrays, info = pack(
        group.astype(np.int64), max_len, overflow="chunk", A=ae.matrix(N),
        T=df["item_id"].to_numpy(dtype=np.int64), Y=df["click"].to_numpy(dtype=np.float32), X=Xr,
        P=df["propensity_score"].to_numpy(dtype=np.float32),
    )
    meta = encoded_meta(
        "obd", xe, ae, action_names=[f"item {i}" for i in range(80)], outcome_name="click", info=info,
        behavior=behavior, a_dynamics=["exogenous"] * len(ae.names),
        notes=[
            "A_t (position, hour, time since the previous impression, affinities over all items) does not depend on "
            "the items shown before: exogenous, replayed under an intervention",
            "OBD has no user id: trajectories are pseudo-users = (logging policy, 4 user-feature hashes), sorted by "
            f"timestamp, cut into chunks of {max_len}",
            "P = logged propensity of the shown item (random: 1/80; bts: varies)",
            "T = item id (80 items); Table I reports |T| = 8089",
        ],
    )
    return make_dataset(arrays, 80, "obd", meta)


SOURCE = PooledSource(
    name="obd",
    load=load_open_bandit,
    folder=FOLDER,
    # "small": chunks of <= 20 steps (~2,000 of them, all kept) instead of Table I's 50, so that every site of 10
    # holds a test split above the evaluation's cohort floor (with Lmax 50 there are only ~800 trajectories)
    presets=REAL_PRESETS,
    chunk_len={"small": 20},
    table_i={"sequences": 10000, "Lmax": 50, "dx": 4, "da": 18, "n_actions": 8089},
)

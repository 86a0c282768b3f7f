"""Loaders of the real datasets in ``../shared/data`` into one pooled ``SiteDataset`` each (paper §IV-A).

Sites are not made here: :mod:`fcd_secure.data.partition` splits the pooled dataset (none of these files carries a
site id). Continuous columns are returned *unscaled* and listed in ``meta['x_continuous']`` / ``meta['a_continuous']``;
:class:`fcd_secure.data.preprocess.Standardizer` z-scores them with training-split statistics once the split exists.

Every modelling choice is stated in the loader's docstring and repeated in ``meta['notes']``; where the result
differs from the paper's Table I, ``fcd data describe`` prints both.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

import fcd_secure
from fcd_secure.data.formats import read_three_line
from fcd_secure.data.preprocess import EncodedColumns, make_dataset, pack
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError

PROJECT_ROOT = Path(fcd_secure.__file__).resolve().parents[1]


def default_data_dir() -> Path:
    """``$FCD_DATA_DIR`` if set, else ``../shared/data`` relative to the project root; error if it doesn't exist."""
    env = os.environ.get("FCD_DATA_DIR")
    path = Path(env) if env else PROJECT_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise DataError(
            "data directory not found; pass --data-dir DIR (or data_dir=...) or set FCD_DATA_DIR", file=path
        )
    return path


def _dir(data_dir: str | Path | None, sub: str) -> Path:
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    path = base / sub
    if not path.is_dir():
        raise DataError(f"dataset folder '{sub}' not found under {base}; pass the right --data-dir", file=path)
    return path


def _need(path: Path) -> Path:
    if not path.is_file():
        raise DataError("expected data file is missing", file=path)
    return path


def _encoded_meta(
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
    """``meta`` of a loader that encodes X and A with :class:`EncodedColumns`, in the layout of
    :func:`~fcd_secure.data.preprocess.build_dataset`: names, roles and the levels of X *and* A (keyed by column)."""
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


# ---------------------------------------------------------------------------------------------------------------
# knowledge tracing (Statics2011, ASSISTments 2009)
# ---------------------------------------------------------------------------------------------------------------

KT_X_NAMES = [
    "log1p_prior_steps",
    "prior_correct_rate",
    "recent_correct_rate",
    "log1p_prior_tags",
    "no_prior_history",
]
_RECENT = 20


def _kt_dataset(
    seqs: list[tuple[np.ndarray, np.ndarray]],
    tag_of_item: np.ndarray,
    *,
    name: str,
    n_actions: int,
    tag_cardinality: int,
    max_len: int,
    action_label: str,
    tag_label: str,
    notes: list[str],
) -> SiteDataset:
    lens = np.array([len(q) for q, _ in seqs], dtype=np.int64)
    keep = lens > 0
    seqs = [s for s, k in zip(seqs, keep) if k]
    lens = lens[keep]
    q = np.concatenate([s[0] for s in seqs]).astype(np.int64)
    r = np.concatenate([s[1] for s in seqs]).astype(np.float64)
    student = np.repeat(np.arange(len(seqs)), lens)
    N = len(q)
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    rank = np.arange(N) - np.repeat(starts, lens)
    # baseline profile of a trajectory = the student's record *before* its first step, so a chunk's X never sees
    # the outcomes inside the chunk (no leakage of Y into X)
    cum = np.cumsum(r)
    cum_before = cum - r - np.repeat(cum[starts] - r[starts], lens)
    prior_rate = np.divide(cum_before, rank, out=np.zeros(N), where=rank > 0)
    w = np.minimum(rank, _RECENT)
    lag = np.arange(N) - w
    cum_at_lag = np.where(w > 0, cum[np.maximum(lag, 0)] - r[np.maximum(lag, 0)], 0.0)
    recent = np.divide(cum - r - cum_at_lag, w, out=np.zeros(N), where=w > 0)
    tags = tag_of_item[q]
    first_seen = ~pd.DataFrame({"s": student, "t": tags}).duplicated().to_numpy()
    cum_tags = np.cumsum(first_seen)
    prior_tags = cum_tags - first_seen - np.repeat(cum_tags[starts] - first_seen[starts], lens)
    X = np.stack(
        [np.log1p(rank), prior_rate, recent, np.log1p(prior_tags), (rank == 0).astype(np.float64)], axis=1
    )
    A = tags[:, None].astype(np.float32)
    arrays, info = pack(student, max_len, overflow="chunk", A=A, T=q, Y=r.astype(np.float32), X=X)
    meta = {
        "dataset": name,
        "x_names": KT_X_NAMES,
        "a_names": [tag_label],
        "x_continuous": [0, 1, 2, 3],
        "a_continuous": [],
        "x_categorical": {},
        "a_categorical": {0: int(tag_cardinality)},
        "action_names": [f"{action_label} {i}" for i in range(n_actions)],
        "outcome_name": "correct",
        # A_t is a function of T_t here; a do-simulation that changes T_t should recompute A_t with this map
        "context_of_action": tag_of_item.astype(int).tolist(),
        **info,
        "notes": notes
        + [
            f"entities longer than {max_len} steps are cut into consecutive chunks (this reproduces Table I's "
            "sequence count closely)",
            "X = baseline profile from the student's history before the chunk: log1p(prior steps), prior correct "
            f"rate, correct rate over the last {_RECENT} prior steps, log1p(distinct prior tags), no-history flag",
            "students have no ids in the files; a student is a record's position; train and test files are pooled",
        ],
    }
    return make_dataset(arrays, n_actions, name, meta)


def load_statics2011(data_dir: str | Path | None = None, max_len: int = 200) -> SiteDataset:
    """Statics2011 (DKVMN 3-line files, train and test pooled: 333 students, 189,297 answers).

    Modelling choices:

    - entity = student (record position); order = the file order (chronological, no timestamps);
      students longer than ``max_len`` (Table I: 200) are cut into consecutive chunks;
    - T_t = the exercise tag id (qid, 1..1223; id 0 unused, so |T| = 1224 as in Table I): the item presented is
      the intervenable decision;
    - A_t (da = 1) = the skill of that tag (integer id 1..98, ``STATICS_qid_sid_sname``) — the paper's
      "item/step identifier and optional concept tags"; categorical, listed in ``meta['a_categorical']``;
    - Y_t = correctness (0/1); no propensities (P = None);
    - X (dx = 5, Table I has 6) = baseline profile from the history before the chunk (see ``meta['notes']``).
    """
    d = _dir(data_dir, "statics2011")
    seqs = read_three_line(_need(d / "STATICS_train.csv.gz")) + read_three_line(_need(d / "STATICS_test.csv.gz"))
    qmap = pd.read_csv(_need(d / "STATICS_qid_sid_sname"), sep="\t")
    tag = np.zeros(1224, dtype=np.int64)
    tag[qmap["qid"].to_numpy()] = qmap["skillid"].to_numpy()
    return _kt_dataset(
        seqs, tag, name="statics2011", n_actions=1224, tag_cardinality=int(tag.max()) + 1, max_len=max_len,
        action_label="tag", tag_label="skill_id",
        notes=["T = exercise tag id (1..1223, 0 unused); A = its skill id (1..98)"],
    )


def load_assistments2009(data_dir: str | Path | None = None, max_len: int = 50) -> SiteDataset:
    """ASSISTments 2009 skill-builder, DKVMN "assist2009_updated" (de-duplicated; 4,151 students, 325,637 answers).

    Not in the paper's Table I (the paper uses it only to build DKT-Synth); included because it is cheap.

    - entity = student (record position), train and test pooled; chunks of ``max_len`` (default 50, DKT-Synth's Lmax);
    - T_t = the skill id (1..110; in this version a question id *is* a skill id), |T| = 111 with 0 unused;
    - A_t (da = 1) = DKVMN's concept cluster of that skill (``clustered_skill_name.txt``, id = cluster + 1,
      0 = not clustered); categorical;
    - Y_t = correctness; no propensities; X as for Statics2011.
    """
    d = _dir(data_dir, "assistments2009") / "dkvmn_assist2009_updated"
    seqs = read_three_line(_need(d / "assist2009_updated_train.csv.gz")) + read_three_line(
        _need(d / "assist2009_updated_test.csv.gz")
    )
    cl = pd.read_csv(_need(d / "clustered_skill_name.txt"), sep="\t", header=None, names=["cluster", "sid", "name"])
    tag = np.zeros(111, dtype=np.int64)
    tag[cl["sid"].to_numpy()] = cl["cluster"].to_numpy() + 1
    return _kt_dataset(
        seqs, tag, name="assistments2009", n_actions=111, tag_cardinality=int(tag.max()) + 1, max_len=max_len,
        action_label="skill", tag_label="concept_cluster",
        notes=["T = skill id (1..110, 0 unused); A = DKVMN concept cluster of the skill"],
    )


# ---------------------------------------------------------------------------------------------------------------
# Diabetes-130
# ---------------------------------------------------------------------------------------------------------------

_MED_STATES = ["No", "Steady", "Up", "Down"]
_SULFONYLUREAS = [
    "chlorpropamide", "glimepiride", "acetohexamide", "glipizide", "glyburide", "tolbutamide", "tolazamide",
    "glyburide-metformin", "glipizide-metformin", "glimepiride-pioglitazone",
]
_CO_MEDS = {
    "thiazolidinedione": ["pioglitazone", "rosiglitazone", "troglitazone", "metformin-rosiglitazone",
                          "metformin-pioglitazone"],
    "meglitinide": ["repaglinide", "nateglinide"],
    "alpha_glucosidase_inhibitor": ["acarbose", "miglitol"],
}
_DIAG_GROUPS = ["circulatory", "respiratory", "digestive", "diabetes", "injury", "musculoskeletal",
                "genitourinary", "neoplasms", "other"]
_COUNTS = ["time_in_hospital", "num_lab_procedures", "num_procedures", "num_medications", "number_outpatient",
           "number_emergency", "number_inpatient", "number_diagnoses"]


def _icd9_group(codes: pd.Series) -> np.ndarray:
    """ICD-9 chapter groups of Strack et al. (2014), Table 2; -1 for a missing code ('?')."""
    s = codes.astype(str)
    missing = (s == "?").to_numpy()
    vcode = s.str[0].isin(["V", "E"]).to_numpy()
    num = pd.to_numeric(s.where(~(missing | vcode)), errors="coerce").to_numpy()
    g = np.full(len(s), _DIAG_GROUPS.index("other"), dtype=np.int64)
    rules = [
        ("circulatory", ((num >= 390) & (num < 460)) | (np.floor(num) == 785)),
        ("respiratory", ((num >= 460) & (num < 520)) | (np.floor(num) == 786)),
        ("digestive", ((num >= 520) & (num < 580)) | (np.floor(num) == 787)),
        ("diabetes", np.floor(num) == 250),
        ("injury", (num >= 800) & (num < 1000)),
        ("musculoskeletal", (num >= 710) & (num < 740)),
        ("genitourinary", ((num >= 580) & (num < 630)) | (np.floor(num) == 788)),
        ("neoplasms", (num >= 140) & (num < 240)),
    ]
    for name, mask in rules:
        g[np.nan_to_num(mask, nan=False).astype(bool)] = _DIAG_GROUPS.index(name)
    g[missing] = -1
    return g


def _int_id(s: pd.Series, missing_value: str | None = "?") -> tuple[np.ndarray, int, list[str]]:
    """Integer ids 1..K for the sorted levels, 0 for ``missing_value``; returns (ids, cardinality K+1, levels)."""
    sv = s.astype(str)
    miss = (sv == missing_value).to_numpy() if missing_value is not None else np.zeros(len(sv), bool)
    levels = sorted(sv[~miss].unique(), key=lambda v: (len(v), v))
    lookup = {v: i + 1 for i, v in enumerate(levels)}
    ids = np.where(miss, 0, sv.map(lookup).fillna(0).to_numpy()).astype(np.int64)
    return ids, len(levels) + 1, levels


def load_diabetes130(data_dir: str | Path | None = None, max_len: int = 20) -> SiteDataset:
    """Diabetes-130 US hospitals 1999-2008 (UCI; 101,766 encounters, 71,518 patients).

    Modelling choices (the release has no dates and no hospital id):

    - entity = ``patient_nbr``; encounters ordered by ``encounter_id`` (an assumption: the release documents no
      order); patients with more than ``max_len`` (Table I: 20) encounters are cut into consecutive chunks
      (8 patients; this gives 71,526 trajectories against Table I's 71,523);
    - X (static, from the first encounter of the trajectory; dx = 9): race one-hot (5) + race-missing indicator,
      female, gender unknown/invalid, age (midpoint of the 10-year bucket, continuous);
    - A_t (encounter context; da = 61): admission type one-hot (8); integer ids for discharge disposition,
      admission source, payer code and medical specialty (0 = missing); the eight utilisation counts
      (continuous); max_glu_serum and A1Cresult one-hot (4 each, "None" = not measured is a level); ICD-9
      groups of diag_1..3 (Strack et al. 2014: 9 groups one-hot + missing indicator, each); co-medication
      indicators for thiazolidinediones, meglitinides and alpha-glucosidase inhibitors;
    - T_t = the glycaemic management state: insulin (No/Steady/Up/Down) × metformin (No/Steady/Up/Down) ×
      any sulfonylurea prescribed (no/yes) → 32 ids, ``id = 8·insulin + 2·metformin + sulfonylurea``
      (Table I's |T| = 145 is a finer, unspecified discretisation);
    - Y_t = readmitted within 30 days (``readmitted == "<30"``); no propensities (P = None).

    Weight (97 % missing) is not used.
    """
    d = _dir(data_dir, "diabetes_130")
    # keep_default_na=False: "None" is a real level of max_glu_serum/A1Cresult ("not measured"), not a missing value
    df = pd.read_csv(_need(d / "diabetic_data.csv.gz"), keep_default_na=False)
    need = ["encounter_id", "patient_nbr", "race", "gender", "age", "readmitted", "insulin", "metformin",
            *_COUNTS, "diag_1", "diag_2", "diag_3"]
    for c in need:
        if c not in df.columns:
            raise DataError("column missing from the Diabetes-130 file", file=d / "diabetic_data.csv.gz", column=c)
    df["encounter_id"] = df["encounter_id"].astype(np.int64)
    df["patient_nbr"] = df["patient_nbr"].astype(np.int64)
    df = df.sort_values(["patient_nbr", "encounter_id"], kind="stable").reset_index(drop=True)
    N = len(df)
    entity = pd.factorize(df["patient_nbr"], sort=False)[0].astype(np.int64)

    # X
    xe = EncodedColumns()
    races = ["Caucasian", "AfricanAmerican", "Hispanic", "Asian", "Other"]
    race = df["race"].to_numpy()
    for r in races:
        xe.add(race == r, f"race={r}")
    xe.add(race == "?", "race__missing")
    xe.levels["race"] = races
    xe.add(df["gender"].to_numpy() == "Female", "female")
    xe.add(~np.isin(df["gender"].to_numpy(), ["Female", "Male"]), "gender_unknown")
    buckets = {f"[{10 * i}-{10 * (i + 1)})": 10.0 * i + 5.0 for i in range(10)}
    age = df["age"].map(buckets).to_numpy(dtype=np.float64)
    if np.isnan(age).any():
        r = int(np.flatnonzero(np.isnan(age))[0])
        raise DataError(f"age bucket {df['age'].iloc[r]!r} does not parse", file=d / "diabetic_data.csv.gz",
                        column="age", row=r)
    xe.add(age, "age_years", "continuous")

    # A
    ae = EncodedColumns()
    adm = pd.to_numeric(df["admission_type_id"], errors="coerce").fillna(0).astype(int).to_numpy()
    for k in range(1, 9):
        ae.add(adm == k, f"admission_type={k}")
    ae.levels["admission_type_id"] = [str(k) for k in range(1, 9)]
    for col in ["discharge_disposition_id", "admission_source_id", "payer_code", "medical_specialty"]:
        ids, card, levels = _int_id(df[col])
        ae.add(ids, col, "categorical", cardinality=card)
        ae.levels[col] = levels
    for col in _COUNTS:
        ae.add(df[col].to_numpy(dtype=np.float64), col, "continuous")
    for col, levels in (("max_glu_serum", ["None", "Norm", ">200", ">300"]), ("A1Cresult", ["None", "Norm", ">7", ">8"])):
        v = df[col].to_numpy()
        for lev in levels:
            ae.add(v == lev, f"{col}={lev}")
        ae.levels[col] = levels
    for col in ["diag_1", "diag_2", "diag_3"]:
        g = _icd9_group(df[col])
        ae.add_one_hot(g, _DIAG_GROUPS, col)
        ae.levels[col] = _DIAG_GROUPS
        ae.add(g < 0, f"{col}__missing")
    for group, meds in _CO_MEDS.items():
        on = np.zeros(N, dtype=bool)
        for m in meds:
            if m in df.columns:
                on |= df[m].to_numpy() != "No"
        ae.add(on, f"comed_{group}")

    # T
    def state(col: str) -> np.ndarray:
        v = df[col].to_numpy()
        ids = np.full(N, -1, dtype=np.int64)
        for i, s in enumerate(_MED_STATES):
            ids[v == s] = i
        if (ids < 0).any():
            r = int(np.flatnonzero(ids < 0)[0])
            raise DataError(f"unexpected value {v[r]!r}", file=d / "diabetic_data.csv.gz", column=col, row=r)
        return ids

    su = np.zeros(N, dtype=np.int64)
    for m in _SULFONYLUREAS:
        if m in df.columns:
            su |= (df[m].to_numpy() != "No").astype(np.int64)
    T = 8 * state("insulin") + 2 * state("metformin") + su
    action_names = [
        f"insulin={a}|metformin={b}|sulfonylurea={c}" for a in _MED_STATES for b in _MED_STATES for c in ("no", "yes")
    ]
    Y = (df["readmitted"].to_numpy() == "<30").astype(np.float32)

    arrays, info = pack(entity, max_len, overflow="chunk", A=ae.matrix(N), T=T, Y=Y, X=xe.matrix(N))
    meta = _encoded_meta(
        "diabetes130", xe, ae, action_names=action_names, outcome_name="readmitted within 30 days", info=info,
        notes=[
            "entity = patient_nbr; encounters ordered by encounter_id (assumed chronological; the release has no dates)",
            f"patients with more than {max_len} encounters are cut into consecutive chunks",
            "T = insulin state x metformin state x any sulfonylurea (32 ids); Table I reports |T| = 145",
            "Y = readmitted '<30'; no hospital id, so sites come from the Dirichlet split",
            "weight (97% missing) is not used",
        ],
    )
    return make_dataset(arrays, len(action_names), "diabetes130", meta)


# ---------------------------------------------------------------------------------------------------------------
# Open Bandit Dataset
# ---------------------------------------------------------------------------------------------------------------


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
    d = _dir(data_dir, "open_bandit_dataset")
    logs = {"random": ["random"], "bts": ["bts"], "both": ["random", "bts"]}.get(behavior)
    if logs is None:
        raise DataError(f"behavior must be 'random', 'bts' or 'both', got {behavior!r}")
    frames = []
    for k, pol in enumerate(logs):
        f = _need(d / f"{pol}_all" / "all.csv.gz")
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
        ids, card, levels = _int_id(df[c], missing_value=None)
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
    meta = _encoded_meta(
        "obd", xe, ae, action_names=[f"item {i}" for i in range(80)], outcome_name="click", info=info,
        behavior=behavior,
        notes=[
            "OBD has no user id: trajectories are pseudo-users = (logging policy, 4 user-feature hashes), sorted by "
            f"timestamp, cut into chunks of {max_len}",
            "P = logged propensity of the shown item (random: 1/80; bts: varies)",
            "T = item id (80 items); Table I reports |T| = 8089",
        ],
    )
    return make_dataset(arrays, 80, "obd", meta)


# ---------------------------------------------------------------------------------------------------------------
# saving a built dataset (``fcd data validate --out``)
# ---------------------------------------------------------------------------------------------------------------


def save_npz(ds: SiteDataset, path: str | Path) -> Path:
    """Write ``ds`` to ``path`` (.npz) atomically: a temporary file renamed into place, so a failure leaves nothing."""
    import json

    path = Path(path)
    arrays = {"X": ds.X, "A": ds.A, "T": ds.T, "Y": ds.Y, "M": ds.M}
    if ds.P is not None:
        arrays["P"] = ds.P
    meta = {}
    for k, v in ds.meta.items():
        if isinstance(v, np.ndarray):
            arrays[f"meta__{k}"] = v
        else:
            meta[k] = v
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez_compressed(
                fh, **arrays, _meta=np.array(json.dumps({"name": ds.name, "n_actions": ds.n_actions, "meta": meta},
                                                        default=str))
            )
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_npz(path: str | Path) -> SiteDataset:
    """Read a dataset written by :func:`save_npz`."""
    import json

    with np.load(Path(path), allow_pickle=False) as z:
        head = json.loads(str(z["_meta"]))
        meta = head["meta"]
        for k in z.files:
            if k.startswith("meta__"):
                meta[k[6:]] = z[k]
        return SiteDataset(
            X=z["X"], A=z["A"], T=z["T"], Y=z["Y"], M=z["M"], P=z["P"] if "P" in z.files else None,
            n_actions=int(head["n_actions"]), name=head["name"], meta=meta,
        )

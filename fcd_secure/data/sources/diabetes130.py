"""Diabetes-130 US hospitals 1999-2008 (paper Table I; UCI): encounters of diabetic patients, readmission."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fcd_secure.data.paths import dataset_folder, need_file
from fcd_secure.data.preprocess import EncodedColumns, encoded_meta, integer_ids, make_dataset, pack
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.sources.base import REAL_PRESETS, PooledSource
from fcd_secure.data.spec import DataError

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

#: The dataset's folder inside the data folder (:func:`~fcd_secure.data.paths.default_data_dir`).
FOLDER = "diabetes_130"


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
    d = dataset_folder(data_dir, FOLDER)
    # keep_default_na=False: "None" is a real level of max_glu_serum/A1Cresult ("not measured"), not a missing value
    df = pd.read_csv(need_file(d / "diabetic_data.csv.gz"), keep_default_na=False)
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
        ids, card, levels = integer_ids(df[col])
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
    meta = encoded_meta(
        "diabetes130", xe, ae, action_names=action_names, outcome_name="readmitted within 30 days", info=info,
        a_dynamics=["endogenous"] * len(ae.names),
        notes=[
            "every encounter context (lab results, utilisation, diagnoses, disposition) can follow earlier treatment: "
            "all of A_t is endogenous, simulated under an intervention",
            "entity = patient_nbr; encounters ordered by encounter_id (assumed chronological; the release has no dates)",
            f"patients with more than {max_len} encounters are cut into consecutive chunks",
            "T = insulin state x metformin state x any sulfonylurea (32 ids); Table I reports |T| = 145",
            "Y = readmitted '<30'; no hospital id, so sites come from the Dirichlet split",
            "weight (97% missing) is not used",
        ],
    )
    return make_dataset(arrays, len(action_names), "diabetes130", meta)


SOURCE = PooledSource(
    name="diabetes130",
    load=load_diabetes130,
    folder=FOLDER,
    presets=REAL_PRESETS,
    table_i={"sequences": 71523, "Lmax": 20, "dx": 11, "da": 74, "n_actions": 145},
)

"""ASSISTments 2009 skill-builder: the data behind the DKT-Synth oracle, also usable as a dataset of its own."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fcd_secure.data.paths import dataset_folder, need_file
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.sources.base import REAL_PRESETS, PooledSource
from fcd_secure.data.sources.knowledge_tracing import build_kt_dataset, read_records, tag_map

#: The dataset's folder inside the data folder (:func:`~fcd_secure.data.paths.default_data_dir`).
FOLDER = "assistments2009"


def load_assistments2009(data_dir: str | Path | None = None, max_len: int = 50) -> SiteDataset:
    """ASSISTments 2009 skill-builder, DKVMN "assist2009_updated" (de-duplicated; 4,151 students, 325,637 answers).

    Not in the paper's Table I (the paper uses it only to build DKT-Synth); included because it is cheap.

    - entity = student (record position), train and test pooled; chunks of ``max_len`` (default 50, DKT-Synth's Lmax);
    - T_t = the skill id (1..110; in this version a question id *is* a skill id), |T| = 111 with 0 unused;
    - A_t (da = 1) = DKVMN's concept cluster of that skill (``clustered_skill_name.txt``, id = cluster + 1,
      0 = not clustered); categorical;
    - Y_t = correctness; no propensities; X as for Statics2011.
    """
    d = dataset_folder(data_dir, FOLDER) / "dkvmn_assist2009_updated"
    seqs = read_records(d, "assist2009_updated_train.csv.gz", "assist2009_updated_test.csv.gz")
    cl = pd.read_csv(need_file(d / "clustered_skill_name.txt"), sep="\t", header=None, names=["cluster", "sid", "name"])
    tag = tag_map(111, cl["sid"].to_numpy(), cl["cluster"].to_numpy() + 1)
    return build_kt_dataset(
        seqs, tag, name="assistments2009", max_len=max_len, action_label="skill", tag_label="concept_cluster",
        notes=["T = skill id (1..110, 0 unused); A = DKVMN concept cluster of the skill"],
    )


#: Not a row of paper Table I (the paper uses ASSISTments 2009 only to build DKT-Synth).
SOURCE = PooledSource(
    name="assistments2009",
    load=load_assistments2009,
    folder=FOLDER,
    presets=REAL_PRESETS,
    table_i=None,
)

"""Statics2011 (paper Table I): an engineering-statics course's answer logs, DKVMN 3-line files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fcd_secure.data.paths import dataset_folder, need_file
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.sources.base import REAL_PRESETS, PooledSource
from fcd_secure.data.sources.knowledge_tracing import build_kt_dataset, read_records, tag_map

#: The dataset's folder inside the data folder (:func:`~fcd_secure.data.paths.default_data_dir`).
FOLDER = "statics2011"


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
    d = dataset_folder(data_dir, FOLDER)
    seqs = read_records(d, "STATICS_train.csv.gz", "STATICS_test.csv.gz")
    qmap = pd.read_csv(need_file(d / "STATICS_qid_sid_sname"), sep="\t")
    tag = tag_map(1224, qmap["qid"].to_numpy(), qmap["skillid"].to_numpy())
    return build_kt_dataset(
        seqs, tag, name="statics2011", max_len=max_len, action_label="tag", tag_label="skill_id",
        notes=["T = exercise tag id (1..1223, 0 unused); A = its skill id (1..98)"],
    )


SOURCE = PooledSource(
    name="statics2011",
    load=load_statics2011,
    folder=FOLDER,
    # "small": 1,500 chunks of <= 50 steps (of ~3,800), about 30 test trajectories per site of 10; the other presets
    # keep Table I's Lmax = 200
    presets={**REAL_PRESETS, "small": 1500},
    chunk_len={"small": 50},
    table_i={"sequences": 1134, "Lmax": 200, "dx": 6, "da": 1, "n_actions": 1224},
)

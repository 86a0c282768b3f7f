"""The per-entity what-if file of a site names that site's own entities, whatever cohort of rows it evaluated.

``SiteDataset.subset`` once copied the per-row meta unsliced, so a cohort of rows ``[5, 2, 0]`` was labelled with the
ids of rows 0, 1, 2: per-entity answers were attached to the wrong patients (issue "One room per concern", item 4).
These tests run the real query (``queries.evaluation.site_metrics`` → ``queries.policy_values``) on a real tiny DKT-Synth
site and a real, untrained Fed-CausalDiff model, and read the file the site writes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fcd_secure.config import build_config
from fcd_secure.data.schema import SiteDataset
from fcd_secure.federation import learner
from fcd_secure.queries.evaluation import site_metrics
from fcd_secure.queries.per_entity import WHATIF_DIR
from fcd_secure.queries.request import EvaluationRequest


def test_subset_slices_per_row_meta_with_the_rows():
    n, L = 4, 3
    ds = SiteDataset(X=np.arange(n, dtype=np.float32)[:, None], A=np.zeros((n, L, 1), np.float32),
                     T=np.zeros((n, L), np.int64), Y=np.zeros((n, L), np.float32), M=np.ones((n, L), np.float32),
                     n_actions=2, name="s",
                     meta={"entity": np.array([10, 11, 12, 13]), "site": np.array([1, 0, 1, 0]),
                           "entity_names": ["a", "b", "c", "d"], "x_names": ["x"]})
    sub = ds.subset([3, 1])
    assert sub.meta["entity"].tolist() == [13, 11]
    assert sub.meta["site"].tolist() == [0, 0]
    assert sub.meta["entity_names"] == ["a", "b", "c", "d"]  # a lookup table, not a per-row array: shared
    assert sub.X[:, 0].tolist() == [3.0, 1.0]
    assert ds.meta["entity"].tolist() == [10, 11, 12, 13]  # the original is untouched


@pytest.mark.parametrize("site_index", [0, 1])
def test_the_per_entity_file_of_a_site_carries_that_sites_own_entity_ids(tmp_path, site_index):
    import torch

    torch.set_num_threads(1)
    cfg = build_config("tiny", {"data": {"n_sites": 2}, "federation": {"clients_per_round": 2, "secure_aggregation": False},
                                  "evaluation": {"n_samples": 1}})
    data = learner.load_site_data(cfg, site_index)
    model = learner.build_model(cfg, learner.dims_of(data.train, data.n_sites))
    ids = np.asarray(data.test.meta["entity"])
    assert len(set(ids.tolist())) == data.test.n  # the site's students, one per test row
    rows = np.arange(data.test.n)[::-2][:5]  # a cohort that starts nowhere near row 0, in reverse order
    assert rows[0] != 0 and len(rows) < data.test.n
    site_metrics(model, data, cfg, EvaluationRequest(n_samples=1), rows=rows, site_dir=tmp_path)
    files = list((tmp_path / WHATIF_DIR).glob("*.csv"))
    assert len(files) == 1
    written = pd.read_csv(files[0], dtype={"entity": str})["entity"].tolist()
    assert written == [str(int(v)) for v in ids[rows]]
    # and never another site's students
    other = learner.load_site_data(cfg, 1 - site_index)
    assert not set(written) & {str(int(v)) for v in other.test.meta["entity"]}

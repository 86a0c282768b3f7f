"""Shared, generic fixtures: small long-format tables and specs written to tmp_path, and the real data folder."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

# every Flower engine the tests start (in process or as a child) inherits this: tests never send telemetry
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"



def pytest_collection_modifyitems(config, items):
    """Tests that start real Flower SuperLink/SuperNode processes run one after another on one xdist worker: two at
    once on two cores starve each other's start-up deadlines."""
    for item in items:
        if item.get_closest_marker("deployment") is not None:
            item.add_marker(pytest.mark.xdist_group("flower-processes"))


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

GOOD_SPEC = """\
name = "toy"
entity = "pid"
time = "visit"
action = "drug"
actions = ["none", "insulin", "metformin"]
outcome = "y"
propensity = "p"
site = "hospital"
max_len = 4

[[static]]
name = "age"
kind = "continuous"

[[static]]
name = "female"
kind = "binary"

[[context]]
name = "lab"
kind = "continuous"
missing = "indicator"

[[context]]
name = "ward"
kind = "categorical"
"""


def make_long_table(n_entities: int = 12, seed: int = 0) -> pd.DataFrame:
    """A valid long-format table: entities with 1..6 steps over 3 hospitals, one missing lab value."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n_entities):
        steps = 1 + (e % 6)
        for t in range(steps):
            rows.append(
                {
                    "pid": f"p{e:03d}",
                    "visit": 10 * t + 1,
                    "age": 40.0 + e,
                    "female": e % 2,
                    "lab": float(rng.normal(5, 2)),
                    "ward": ["a", "b", "c"][(e + t) % 3],
                    "drug": ["none", "insulin", "metformin"][(e * t) % 3],
                    "y": int(rng.random() < 0.4),
                    "p": float(rng.uniform(0.2, 1.0)),
                    "hospital": f"h{e % 3}",
                }
            )
    df = pd.DataFrame(rows)
    df.loc[3, "lab"] = np.nan
    return df


@pytest.fixture
def long_case(tmp_path):
    """Factory: ``long_case(df=None, spec=None, suffix='.csv') -> (spec_path, table_path)`` in tmp_path."""

    def write(df: pd.DataFrame | None = None, spec: str | None = None, suffix: str = ".csv"):
        df = make_long_table() if df is None else df
        table = tmp_path / f"table{suffix}"
        if suffix == ".parquet":
            df.to_parquet(table, index=False)
        else:
            df.to_csv(table, index=False)
        spec_path = tmp_path / "spec.toml"
        spec_path.write_text(GOOD_SPEC if spec is None else spec)
        return spec_path, table

    return write


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def one_torch_thread():
    """One torch thread for tiny-model tests: they gain nothing from two, and CI has two cores to share."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""fcd_secure.data: the data layer (paper §IV-A).

- :mod:`.schema`: ``SiteDataset``, the one contract every layer stands on;
- :mod:`.spec` / :mod:`.preprocess`: ``DatasetSpec`` for a user's long-format table, the preprocessing pipeline,
  ``DataError``;
- :mod:`.loaders`: Statics2011, ASSISTments 2009, Diabetes-130, Open Bandit into the schema;
- :mod:`.partition`: the Dirichlet non-IID split and the per-site train/test split;
- :mod:`.policy`: the declarative policies of ``policies/`` and the anchor actions;
- :mod:`.registry`: ``load_federated(name, ...)``, the one entry point from a dataset name to sites;
- :mod:`.dkt_synth`: the DKT-Synth oracle world with ground truth.

The names below are importable from here; they are loaded on first use so that ``import fcd_secure.data.schema``
stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SiteDataset": "schema",
    "SchemaError": "schema",
    "concat": "schema",
    "DataError": "spec",
    "DatasetSpec": "spec",
    "load_spec": "spec",
    "Standardizer": "preprocess",
    "build_dataset": "preprocess",
    "dataset_from_files": "preprocess",
    "read_table": "preprocess",
    "take": "preprocess",
    "load_statics2011": "loaders",
    "load_assistments2009": "loaders",
    "load_diabetes130": "loaders",
    "load_open_bandit": "loaders",
    "save_npz": "loaders",
    "load_npz": "loaders",
    "dirichlet_partition": "partition",
    "train_test_split": "partition",
    "Policy": "policy",
    "anchor_actions": "policy",
    "default_policies": "policy",
    "load_policy": "policy",
    "load_policies": "policy",
    "DATASETS": "registry",
    "FederatedData": "registry",
    "default_data_dir": "registry",
    "load_federated": "registry",
    "load_spec_federated": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fcd_secure.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fcd_secure.data.{module}"), name)

"""One entry point from a dataset name to federated sites: ``load_federated`` (paper §IV-A and Table II).

For the real datasets: load the pooled dataset (:mod:`fcd_secure.data.loaders`), split it into ``n_sites`` sites with
the Dirichlet(α) rule drawn per entity, so all chunks of one student/patient share a site
(:func:`~fcd_secure.data.partition.site_assignment`), split each site into train/test (entities kept whole),
z-score continuous columns with statistics of the *training* sites only (:class:`~fcd_secure.data.preprocess.Standardizer`;
the same statistics are applied to test), and choose the anchor actions on the training sites
(:func:`~fcd_secure.data.policy.anchor_actions`).

In this simulation the z-score statistics are pooled over the raw training rows of all sites; a deployment needs
per-site or securely aggregated statistics (agreed beforehand, or per-site sums and sums of squares added under
secure aggregation), since no party may see another site's rows and a site's own mean/std alone would shift every
site's features differently. The statistics are in ``description['standardization']`` and in each dataset's meta.

For ``"dkt-synth"`` the DKT-Synth oracle world (:mod:`fcd_secure.data.dkt_synth`) makes the sites itself and
carries the ground truth (``FederatedData.oracle``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fcd_secure.data.loaders import (
    default_data_dir,
    load_assistments2009,
    load_diabetes130,
    load_open_bandit,
    load_statics2011,
)
from fcd_secure.data.partition import site_assignment, split_indices
from fcd_secure.data.policy import anchor_actions
from fcd_secure.data.preprocess import Standardizer, dataset_from_files, take
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError

__all__ = [
    "DATASETS",
    "PAPER_TABLE_I",
    "FederatedData",
    "default_data_dir",
    "describe_federated",
    "load_federated",
    "load_pooled",
    "load_spec_federated",
]

DATASETS = ("dkt-synth", "statics2011", "assistments2009", "diabetes130", "obd")

#: Paper Table I, "Datasets after preprocessing into the unified (X, A, T, Y)".
PAPER_TABLE_I: dict[str, dict[str, int]] = {
    "dkt-synth": {"sequences": 20000, "Lmax": 50, "dx": 4, "da": 1, "n_actions": 50},
    "statics2011": {"sequences": 1134, "Lmax": 200, "dx": 6, "da": 1, "n_actions": 1224},
    "diabetes130": {"sequences": 71523, "Lmax": 20, "dx": 11, "da": 74, "n_actions": 145},
    "obd": {"sequences": 10000, "Lmax": 50, "dx": 4, "da": 18, "n_actions": 8089},
}

_LOADERS: dict[str, Callable[..., SiteDataset]] = {
    "statics2011": load_statics2011,
    "assistments2009": load_assistments2009,
    "diabetes130": load_diabetes130,
    "obd": load_open_bandit,
}

#: trajectories kept (a seeded subsample of the pooled data) per preset, for real datasets; None = all
REAL_PRESETS: dict[str, int | None] = {"tiny": 300, "small": 2000, "default": None, "paper": None}


@dataclass
class FederatedData:
    """Sites of one dataset: ``train[i]`` and ``test[i]`` belong to site i."""

    name: str
    train: list[SiteDataset]
    test: list[SiteDataset]
    anchors: tuple[int, int]
    #: DKT-Synth world with ground truth (true effects, policy values); None for real data
    oracle: Any = None
    description: dict[str, Any] = field(default_factory=dict)

    @property
    def n_sites(self) -> int:
        return len(self.train)


def _check_name(name: str) -> str:
    key = name.lower()
    if key not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}", field="dataset")
    return key


def load_pooled(name: str, data_dir: str | Path | None = None) -> SiteDataset:
    """The pooled (unsplit, unscaled) dataset of a real dataset name."""
    key = _check_name(name)
    if key == "dkt-synth":
        raise DataError("dkt-synth has no pooled file: it is generated per site (use load_federated)", field="dataset")
    return _LOADERS[key](data_dir)


def _subsample(ds: SiteDataset, preset: str, seed: int) -> SiteDataset:
    if preset not in REAL_PRESETS:
        raise DataError(f"unknown preset {preset!r}; choose one of {sorted(REAL_PRESETS)}", field="preset")
    keep = REAL_PRESETS[preset]
    if keep is None or ds.n <= keep:
        return ds
    rng = np.random.default_rng([0x5EED_0003, int(seed)])
    idx = np.sort(rng.choice(ds.n, size=keep, replace=False))
    out = take(ds, idx)
    out.meta["subsample"] = {"preset": preset, "kept": keep, "of": ds.n}
    return out


_STANDARDIZATION_NOTE = (
    "z-score statistics are pooled over the raw training rows of all sites (simulation only); a deployment needs "
    "per-site or securely aggregated statistics"
)


def _sites_to_federated(
    name: str,
    pooled: SiteDataset,
    site_of: np.ndarray,
    n_sites: int,
    test_fraction: float,
    seed: int,
    extra: dict[str, Any],
    site_names: list[str] | None = None,
) -> FederatedData:
    """Cut ``pooled`` into per-site train/test sets (one copy of the arrays each), z-score with training stats.

    The z-score statistics are fitted on the raw training rows of *all* sites pooled (``Standardizer.fit(train)``).
    That is only possible in this simulation, where one process holds every site: a deployment must use
    statistics agreed per site beforehand or aggregated securely (per-site sums and sums of squares added under
    secure aggregation), never raw rows sent to one place. ``description['notes']`` says so as well.
    """
    entity = pooled.meta.get("entity")
    train, test = [], []
    for i in range(n_sites):
        idx = np.flatnonzero(site_of == i)
        # same rule and seeds as partition.train_test_split(site, test_fraction, seed * 1_000_003 + i)
        tr, te = split_indices(len(idx), test_fraction, int(seed) * 1_000_003 + i,
                               None if entity is None else entity[idx])
        site_meta = {"site_index": i, "n_sites": n_sites}
        if site_names is not None:
            site_meta["site_name"] = site_names[i]
        for rows, out, split in ((idx[tr], train, "train"), (idx[te], test, "test")):
            part = take(pooled, rows, name=f"{name}/site{i}/{split}")
            part.meta.update(site_meta, split=split)
            out.append(part)
    std = Standardizer.fit(train)
    train = [std.apply(d, copy=False) for d in train]
    test = [std.apply(d, copy=False) for d in test]
    fd = FederatedData(name=name, train=train, test=test, anchors=anchor_actions(train))
    fd.description = describe_federated(fd, pooled=pooled, **extra)
    fd.description["standardization"] = std.model_dump()
    fd.description["notes"].append(_STANDARDIZATION_NOTE)
    return fd


def load_federated(
    name: str,
    n_sites: int = 10,
    alpha: float = 10.0,
    seed: int = 0,
    preset: str = "default",
    data_dir: str | Path | None = None,
    test_fraction: float = 0.2,
) -> FederatedData:
    """Sites of dataset ``name`` (one of :data:`DATASETS`) as train/test pairs, anchors and a description.

    ``preset`` for real data: "default"/"paper" keep everything, "small" a seeded subsample of 2,000 trajectories,
    "tiny" 300 (for tests). For "dkt-synth" it names the DKT-Synth preset ("tiny", "default", "paper").
    Same arguments → same numbers.

    Every chunk of one student/patient (``meta['entity']``) lands on the same site and on the same side of that
    site's train/test split, so no test entity is seen in training anywhere. Continuous columns are z-scored with
    statistics pooled over all training sites' raw rows: fine in simulation; a deployment needs per-site or securely
    aggregated statistics (see :func:`_sites_to_federated`).
    """
    key = _check_name(name)
    if key == "dkt-synth":
        return _load_dkt_synth(n_sites, alpha, seed, preset, test_fraction)
    pooled = _subsample(_LOADERS[key](data_dir), preset, seed)
    # the rule of partition.dirichlet_partition (one site per entity, chunks follow their entity), applied as
    # indices so the big arrays are copied only once
    site_of = site_assignment(pooled, n_sites, alpha, seed)
    extra = {"alpha": alpha, "seed": seed, "preset": preset, "test_fraction": test_fraction}
    return _sites_to_federated(key, pooled, site_of, n_sites, test_fraction, seed, extra)


def _load_dkt_synth(n_sites: int, alpha: float, seed: int, preset: str, test_fraction: float) -> FederatedData:
    try:
        from fcd_secure.data.dkt_synth import DKTSynthConfig, generate
    except ImportError as exc:  # the oracle package is written by another helper; say so plainly
        raise DataError(f"the DKT-Synth generator is not available: {exc}", field="dataset") from None
    try:
        cfg = DKTSynthConfig.from_preset(
            preset, n_sites=n_sites, dirichlet_alpha=alpha, seed=seed, test_fraction=test_fraction
        )
    except ValueError as exc:  # unknown preset or an impossible size: the config's own message says which
        raise DataError(f"DKT-Synth: {exc}", field="preset") from None
    world = generate(cfg)
    fd = FederatedData(
        name="dkt-synth", train=list(world.train), test=list(world.test), anchors=tuple(world.anchors), oracle=world
    )
    fd.description = describe_federated(fd, alpha=alpha, seed=seed, preset=preset, test_fraction=test_fraction)
    return fd


def load_spec_federated(
    spec_path: str | Path,
    table_path: str | Path,
    n_sites: int = 10,
    alpha: float = 10.0,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> FederatedData:
    """A user's own long-format table as federated sites.

    Sites come from the spec's ``site`` column when it names one (``n_sites`` and ``alpha`` are then ignored; sites
    are in the order of ``spec.sites`` or sorted by name), else from the Dirichlet split. Every error is a
    :class:`DataError` naming the file and the column/row or spec field.
    """
    spec, pooled = dataset_from_files(spec_path, table_path)
    names: list[str] | None = None
    if spec.site:
        site_of = pooled.meta["site"]
        names = list(pooled.meta["site_names"])
        for i, s_name in enumerate(names):
            k = int((site_of == i).sum())
            if k < 2:
                raise DataError(
                    f"site '{s_name}' has {k} trajectory; a site needs at least 2 (train and test)",
                    file=table_path, column=spec.site,
                )
        n_sites = len(names)
    else:
        site_of = site_assignment(pooled, n_sites, alpha, seed)
    extra = {"alpha": None if spec.site else alpha, "seed": seed, "preset": "spec", "test_fraction": test_fraction}
    return _sites_to_federated(spec.name, pooled, site_of, n_sites, test_fraction, seed, extra, site_names=names)


# ---------------------------------------------------------------------------------------------------------------
# description (``fcd data describe``)
# ---------------------------------------------------------------------------------------------------------------


def _counts(sets: list[SiteDataset], n_actions: int) -> np.ndarray:
    c = np.zeros(n_actions, dtype=np.int64)
    for d in sets:
        c += np.bincount(d.T[d.M > 0], minlength=n_actions)[:n_actions]
    return c


def _outcome_rate(sets: list[SiteDataset]) -> float:
    num = sum(float((d.Y * d.M).sum()) for d in sets)
    den = sum(float(d.M.sum()) for d in sets)
    return num / den if den else float("nan")


def describe_federated(fd: FederatedData, top: int = 5, **extra: Any) -> dict[str, Any]:
    """Per-dataset and per-site summary: sequences, Lmax, dx, da, |T|, action support, anchors, outcome rate."""
    pooled = extra.pop("pooled", None)
    sets = fd.train + fd.test
    first = fd.train[0]
    n_actions = first.n_actions
    counts = _counts(sets, n_actions)
    total = max(int(counts.sum()), 1)
    names = first.meta.get("action_names") or [str(i) for i in range(n_actions)]
    a_off, a_on = fd.anchors
    order = np.argsort(-counts, kind="stable")[:top]
    meta = pooled.meta if pooled is not None else first.meta
    ours = {
        "sequences": int(sum(d.n for d in sets)),
        "Lmax": first.L,
        "dx": first.dx,
        "da": first.da,
        "n_actions": n_actions,
    }
    desc: dict[str, Any] = {
        "name": fd.name,
        "n_sites": fd.n_sites,
        **{k: v for k, v in extra.items() if v is not None},
        **ours,
        "actions_used": int((counts > 0).sum()),
        "steps": int(counts.sum()),
        "outcome_rate": _outcome_rate(sets),
        "has_propensity": all(d.P is not None for d in sets),
        "top_actions": [
            {"id": int(a), "name": str(names[a]) if a < len(names) else str(a), "share": counts[a] / total}
            for a in order
        ],
        "anchors": {
            "a_off": a_off, "a_on": a_on,
            "a_off_name": str(names[a_off]) if a_off < len(names) else str(a_off),
            "a_on_name": str(names[a_on]) if a_on < len(names) else str(a_on),
            "share_off": counts[a_off] / total, "share_on": counts[a_on] / total,
        },
        "truncated_entities": meta.get("truncated_entities"),
        "notes": list(meta.get("notes", [])),
        "table_i": PAPER_TABLE_I.get(fd.name),
        "sites": [],
    }
    if desc["table_i"]:
        desc["differs_from_table_i"] = [k for k, v in desc["table_i"].items() if ours[k] != v]
    for i, (tr, te) in enumerate(zip(fd.train, fd.test)):
        c = _counts([tr, te], n_actions)
        t = max(int(c.sum()), 1)
        desc["sites"].append(
            {
                "site": i,
                "train": tr.n,
                "test": te.n,
                "steps": int(c.sum()),
                "outcome_rate": _outcome_rate([tr, te]),
                "top_action_share": float(c.max() / t),
                "share_off": c[a_off] / t,
                "share_on": c[a_on] / t,
            }
        )
    for k in ("outcome_rate",):
        desc[k] = float(desc[k])
    for item in desc["top_actions"]:
        item["share"] = float(item["share"])
    desc["anchors"]["share_off"] = float(desc["anchors"]["share_off"])
    desc["anchors"]["share_on"] = float(desc["anchors"]["share_on"])
    for s in desc["sites"]:
        s["share_off"], s["share_on"] = float(s["share_off"]), float(s["share_on"])
    return desc

"""Federated data: one dataset's sites as train/test pairs, their anchors and a description (paper §IV-A, Table II).

:func:`split_into_sites` is the one path from a pooled dataset and a site per trajectory to ``FederatedData``: every
site is split into train/test with :func:`~fcd_secure.data.partition.site_splits` (entities kept whole; the cut is
the site's own, :mod:`fcd_secure.data.cohorts`), continuous
columns are z-scored with statistics of the *training* sites only (:class:`~fcd_secure.data.preprocess.Standardizer`;
the same statistics are applied to test), and the anchor actions are chosen on the training sites
(:func:`~fcd_secure.data.policy.anchor_actions`).

In this simulation the z-score statistics are pooled over the raw training rows of all sites; a deployment needs
per-site or securely aggregated statistics (agreed beforehand, or per-site sums and sums of squares added under
secure aggregation), since no party may see another site's rows and a site's own mean/std alone would shift every
site's features differently. The statistics are in ``description['standardization']`` and in each dataset's meta.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fcd_secure.data.cohorts import row_ids
from fcd_secure.data.partition import site_splits
from fcd_secure.data.policy import anchor_actions
from fcd_secure.data.preprocess import Standardizer
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import context_dynamics

__all__ = ["STANDARDIZATION_NOTE", "FederatedData", "describe_federated", "split_into_sites"]

STANDARDIZATION_NOTE = (
    "z-score statistics are pooled over the raw training rows of all sites (simulation only); a deployment needs "
    "per-site or securely aggregated statistics"
)
RAW_NOTE = (
    "sites are unscaled here: z-score statistics come from per-site sums added under secure aggregation "
    "(fcd_secure.data.moments, fcd_secure.federation.secure.secure_stats)"
)


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


def split_into_sites(
    name: str,
    pooled: SiteDataset,
    site_of: np.ndarray,
    n_sites: int,
    test_fraction: float,
    seed: int,
    extra: dict[str, Any],
    site_names: list[str] | None = None,
    table_i: Mapping[str, int] | None = None,
    standardize: bool = True,
    secrets: list[bytes] | None = None,
) -> FederatedData:
    """Cut ``pooled`` into per-site train/test sets (one copy of the arrays each), z-scored with training statistics.

    The z-score statistics are fitted on the raw training rows of *all* sites pooled (``Standardizer.fit(train)``).
    That is only possible in this simulation, where one process holds every site: a deployment must use
    statistics agreed per site beforehand or aggregated securely (per-site sums and sums of squares added under
    secure aggregation), never raw rows sent to one place. ``description['notes']`` says so as well.

    Args:
        name: Dataset name (sites are named ``<name>/site<i>/<split>``).
        pooled: The whole dataset, unscaled.
        site_of: Site index per trajectory of ``pooled`` (int [n]).
        n_sites: Number of sites.
        test_fraction: Share of each site's trajectories (entities kept whole) in its test set.
        seed: Seed of the per-site splits (:func:`~fcd_secure.data.partition.site_split_seed`).
        extra: Settings recorded in the description (alpha, seed, preset, test_fraction).
        site_names: Names of the sites when they come from the data (``meta['site_name']``).
        table_i: The dataset's row of paper Table I, shown beside ours by ``fcd data describe``.
        standardize: ``False`` leaves the sites unscaled, for statistics agreed without pooling
            (:mod:`fcd_secure.data.moments`; the description then says so).
        secrets: Each site's split secret (:mod:`fcd_secure.data.cohorts`; a deployed site passes its own); default:
            the simulated sites' secrets derived from ``seed``.

    Returns:
        The federated dataset with its description.
    """
    ids = row_ids(pooled)
    train, test = [], []
    for i, (tr, te) in enumerate(site_splits(site_of, n_sites, test_fraction, seed, ids=ids, secrets=secrets)):
        site_meta: dict[str, Any] = {"site_index": i, "n_sites": n_sites}
        if site_names is not None:
            site_meta["site_name"] = site_names[i]
        for rows, out, split in ((tr, train, "train"), (te, test, "test")):
            part = pooled.subset(rows, name=f"{name}/site{i}/{split}")
            part.meta.update(site_meta, split=split)
            out.append(part)
    if not standardize:
        fd = FederatedData(name=name, train=train, test=test, anchors=anchor_actions(train))
        fd.description = describe_federated(fd, table_i=table_i, pooled=pooled, **extra)
        fd.description["standardization"] = None
        fd.description["notes"].append(RAW_NOTE)
        return fd
    std = Standardizer.fit(train)
    train = [std.apply(d, copy=False) for d in train]
    test = [std.apply(d, copy=False) for d in test]
    fd = FederatedData(name=name, train=train, test=test, anchors=anchor_actions(train))
    fd.description = describe_federated(fd, table_i=table_i, pooled=pooled, **extra)
    fd.description["standardization"] = std.model_dump()
    fd.description["notes"].append(STANDARDIZATION_NOTE)
    return fd


def _counts(sets: list[SiteDataset], n_actions: int) -> np.ndarray:
    c = np.zeros(n_actions, dtype=np.int64)
    for d in sets:
        c += np.bincount(d.T[d.M > 0], minlength=n_actions)[:n_actions]
    return c


def _outcome_rate(sets: list[SiteDataset]) -> float:
    num = sum(float((d.Y * d.M).sum()) for d in sets)
    den = sum(float(d.M.sum()) for d in sets)
    return num / den if den else float("nan")


def _contexts(ds: SiteDataset) -> dict[str, list[str]]:
    """The context columns by their behaviour under an intervention (:func:`~fcd_secure.data.spec.context_dynamics`)."""
    names = [str(a) for a in (ds.meta.get("a_names") or [])]
    names = names if len(names) == ds.da else [f"A[{j}]" for j in range(ds.da)]
    marks = context_dynamics(ds.meta, ds.da)
    return {kind: [n for n, m in zip(names, marks) if m == kind] for kind in ("endogenous", "exogenous")}


def describe_federated(
    fd: FederatedData,
    top: int = 5,
    table_i: Mapping[str, int] | None = None,
    pooled: SiteDataset | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Per-dataset and per-site summary (``fcd data describe``).

    Args:
        fd: The federated dataset.
        top: How many of the most logged actions to list.
        table_i: The dataset's row of paper Table I; the keys where ours differs are listed.
        pooled: The pooled dataset, whose meta (notes, truncation counts) is reported; default the first site's.
        **extra: Settings to record (``None`` values are left out).

    Returns:
        Plain JSON-able numbers: sequences, Lmax, dx, da, |T|, action support, anchors and their shares, outcome
        rate, notes, and one entry per site.
    """
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

    def name_of(a: int) -> str:
        return str(names[a]) if a < len(names) else str(a)

    desc: dict[str, Any] = {
        "name": fd.name,
        "n_sites": fd.n_sites,
        **{k: v for k, v in extra.items() if v is not None},
        **ours,
        "actions_used": int((counts > 0).sum()),
        "steps": int(counts.sum()),
        "outcome_rate": float(_outcome_rate(sets)),
        "has_propensity": all(d.P is not None for d in sets),
        "top_actions": [{"id": int(a), "name": name_of(a), "share": float(counts[a] / total)} for a in order],
        "anchors": {
            "a_off": a_off, "a_on": a_on, "a_off_name": name_of(a_off), "a_on_name": name_of(a_on),
            "share_off": float(counts[a_off] / total), "share_on": float(counts[a_on] / total),
        },
        "contexts": _contexts(first),
        "truncated_entities": meta.get("truncated_entities"),
        "notes": list(meta.get("notes", [])),
        "table_i": None if table_i is None else dict(table_i),
        "sites": [],
    }
    if table_i:
        desc["differs_from_table_i"] = [k for k, v in table_i.items() if ours[k] != v]
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
                "share_off": float(c[a_off] / t),
                "share_on": float(c[a_on] / t),
            }
        )
    return desc

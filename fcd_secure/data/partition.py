"""Sites from a pooled dataset: the Dirichlet non-IID split of paper §IV-A (N = 10 clients, α = 10; Table II),
and the per-site train/test split.

Rule of :func:`dirichlet_partition` (label skew, Hsu et al. 2019 style):

1. every trajectory gets a discrete *key* (:func:`trajectory_key`): by default a bucket of its outcome rate
   (quintile edges of the per-trajectory mean of Y over valid steps; duplicate edges merge, so a rare outcome
   yields fewer buckets); ``key="action"`` uses its dominant action (the 9 most common dominant actions, the rest
   pooled as one class); an int array of length n can be passed directly;
2. for each key class, site shares ``p ~ Dirichlet(α·1_N)`` are drawn and the class's shuffled trajectories are cut
   in those proportions;
3. no site may be small: each site gets at least ``min_size`` trajectories (default
   ``max(2, ⌊0.1·n/N⌋)``, i.e. a tenth of a fair share, and never fewer than the 2 a train/test split needs); a
   short site takes random trajectories from the currently largest site until it has enough.

Sites are drawn **per entity** (:func:`site_assignment`): when ``meta['entity']`` says which trajectories are chunks
of one student/patient (long histories cut with ``overflow="chunk"``), the rule above runs on entities — an entity's
key is the key of its first trajectory, ``n`` and ``min_size`` count entities — and every chunk gets its entity's
site. Drawing chunks independently would put one person in several sites, and then the per-site train/test split
(which keeps an entity on one side *within* a site) would still let a test person's other chunks sit in another
site's training set.

The sites are drawn from ``numpy.random.default_rng`` seeded with ``seed``: the same seed gives the same sites. Each
site's train/test cut is the site's own (:mod:`fcd_secure.data.cohorts`: a keyed hash of each entity id under the
site's secret; a simulated site's secret comes from ``seed`` and its index).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fcd_secure.data.cohorts import row_ids, seeded_secret, split_rows
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError

_SALT_PARTITION = 0x5EED_0001


def outcome_rate(ds: SiteDataset) -> np.ndarray:
    """Per-trajectory mean outcome over valid steps, shape [n]."""
    return (ds.Y * ds.M).sum(axis=1) / np.maximum(ds.M.sum(axis=1), 1.0)


def dominant_action(ds: SiteDataset) -> np.ndarray:
    """Per-trajectory most frequent valid action (ties: the smaller id), shape [n]."""
    rows, steps = np.nonzero(ds.M > 0)
    df = pd.DataFrame({"r": rows, "t": ds.T[rows, steps]})
    counts = df.groupby(["r", "t"]).size().reset_index(name="c")
    counts = counts.sort_values(["r", "c", "t"], ascending=[True, False, True], kind="stable")
    first = counts.drop_duplicates("r")
    out = np.zeros(ds.n, dtype=np.int64)
    out[first["r"].to_numpy()] = first["t"].to_numpy()
    return out


def trajectory_key(ds: SiteDataset, key: str | np.ndarray | None = None) -> np.ndarray:
    """Discrete class per trajectory for the label-skew split (see the module docstring), int64 [n]."""
    if key is None or (isinstance(key, str) and key == "outcome"):
        rate = outcome_rate(ds)
        edges = np.unique(np.quantile(rate, [0.2, 0.4, 0.6, 0.8]))
        # side="left": a rate equal to an edge joins the lower bucket, so a rare binary outcome (most rates 0,
        # every edge 0) still yields two classes, "never" and "at least once"
        return np.searchsorted(edges, rate, side="left").astype(np.int64)
    if isinstance(key, str) and key == "action":
        dom = dominant_action(ds)
        vals, counts = np.unique(dom, return_counts=True)
        top = vals[np.argsort(-counts, kind="stable")[:9]]
        return np.where(np.isin(dom, top), dom, -1).astype(np.int64)
    if isinstance(key, str):
        raise DataError(f"unknown partition key {key!r}: use 'outcome', 'action' or an int array", field="key")
    arr = np.asarray(key)
    if arr.shape != (ds.n,):
        raise DataError(f"partition key has shape {arr.shape}, expected ({ds.n},)", field="key")
    return pd.factorize(arr, sort=True)[0].astype(np.int64)


def dirichlet_assignment(
    key: np.ndarray, n_sites: int, alpha: float, seed: int, min_size: int | None = None, unit: str = "trajectories"
) -> np.ndarray:
    """Site index per item (int64 [n]) under the rule in the module docstring; ``unit`` names the items in errors.

    Callers with chunked entities use :func:`site_assignment`, which calls this once per entity.
    """
    n = len(key)
    if n_sites < 1:
        raise DataError(f"n_sites must be >= 1, got {n_sites}", field="n_sites")
    if not alpha > 0:
        raise DataError(f"alpha must be > 0, got {alpha}", field="alpha")
    if min_size is None:
        min_size = max(2, int(0.1 * n / n_sites))
    if n < n_sites * min_size:
        raise DataError(
            f"{n} {unit} cannot fill {n_sites} sites with at least {min_size} each; use fewer sites",
            field="n_sites",
        )
    rng = np.random.default_rng([_SALT_PARTITION, int(seed)])
    site = np.empty(n, dtype=np.int64)
    for c in np.unique(key):
        idx = rng.permutation(np.flatnonzero(key == c))
        p = rng.dirichlet(np.full(n_sites, float(alpha)))
        cuts = np.floor(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
        for s, part in enumerate(np.split(idx, cuts)):
            site[part] = s
    sizes = np.bincount(site, minlength=n_sites)
    while sizes.min() < min_size:
        short = int(np.argmin(sizes))
        donor = int(np.argmax(sizes))
        k = min(min_size - sizes[short], sizes[donor] - min_size)
        moved = rng.choice(np.flatnonzero(site == donor), size=k, replace=False)
        site[moved] = short
        sizes = np.bincount(site, minlength=n_sites)
    return site


def _entity_codes(ds: SiteDataset) -> np.ndarray | None:
    """Entity index per trajectory (0..E-1, first-appearance order), or None when ``meta['entity']`` is absent."""
    ent = ds.meta.get("entity")
    if ent is None:
        return None
    ent = np.asarray(ent)
    if ent.shape != (ds.n,):
        raise DataError(f"{ds.name}: meta['entity'] has shape {ent.shape}, expected ({ds.n},)", field="entity")
    return pd.factorize(ent, sort=False)[0].astype(np.int64)


def site_assignment(
    ds: SiteDataset,
    n_sites: int,
    alpha: float,
    seed: int,
    key: str | np.ndarray | None = None,
    min_size: int | None = None,
) -> np.ndarray:
    """Site index per trajectory (int64 [n]) with every entity's trajectories on one site (module docstring).

    Without ``meta['entity']`` each trajectory is its own entity. With it, the Dirichlet rule draws one site per
    entity (key = the key of the entity's first trajectory; ``min_size`` counts entities) and each chunk inherits it.
    """
    traj_key = trajectory_key(ds, key)
    codes = _entity_codes(ds)
    if codes is None:
        return dirichlet_assignment(traj_key, n_sites, alpha, seed, min_size)
    key_e = pd.Series(traj_key).groupby(codes, sort=True).first().to_numpy().astype(np.int64)
    return dirichlet_assignment(key_e, n_sites, alpha, seed, min_size, unit="entities")[codes]


def dirichlet_partition(
    ds: SiteDataset,
    n_sites: int,
    alpha: float,
    seed: int,
    key: str | np.ndarray | None = None,
    min_size: int | None = None,
) -> list[SiteDataset]:
    """Split ``ds`` into ``n_sites`` non-empty sites with a seeded Dirichlet(α) label skew (paper: α = 10, N = 10).

    Sizes sum to ``ds.n``; no trajectory is duplicated or lost; all chunks of one entity (``meta['entity']``) are in
    the same site (:func:`site_assignment`).

    Args:
        ds: The pooled dataset.
        n_sites: N.
        alpha: Dirichlet concentration α (smaller: more skewed).
        seed: Seed of the draw; the same seed gives the same split.
        key: The label of the skew: "outcome" (default), "action" or an int array [n] (module docstring).
        min_size: The smallest site (default ``max(2, ⌊0.1·n/N⌋)``).

    Returns:
        The sites in index order, named ``<name>/site<i>``, with ``meta['site_index']`` and ``meta['n_sites']``.

    Raises:
        DataError: Bad ``n_sites``/``alpha``/``key``, or too few trajectories (entities) for ``n_sites`` sites.
    """
    site = site_assignment(ds, n_sites, alpha, seed, key, min_size)
    out = []
    for s in range(n_sites):
        part = ds.subset(np.flatnonzero(site == s), name=f"{ds.name}/site{s}")
        key_name = key if isinstance(key, str) or key is None else "array"
        part.meta.update(site_index=s, n_sites=n_sites, partition={"alpha": alpha, "seed": seed, "key": key_name})
        out.append(part)
    return out


def split_indices(
    n: int, test_fraction: float, seed: int, entity: np.ndarray | None = None, *,
    ids: list[str] | None = None, secret: bytes | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of a site's fixed cut (:func:`fcd_secure.data.cohorts.split_rows`), sorted.

    ``ids`` names each row's entity (chunks of one entity stay on one side; default: ``entity`` codes, else each row
    its own entity); ``secret`` is the site's split secret (default: the simulated site's, :func:`~fcd_secure.data.
    cohorts.seeded_secret` of ``seed``).
    """
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}", field="test_fraction")
    if n < 2:
        raise DataError(f"{n} trajectory cannot be split into train and test")
    if ids is None:
        ids = ([f"entity-{int(e)}" for e in np.asarray(entity)] if entity is not None and len(entity) == n
               else [str(i) for i in range(n)])
    return split_rows(ids, test_fraction, seeded_secret(seed) if secret is None else secret)


def site_split_seed(seed: int, site: int) -> int:
    """The seed of site ``site``'s train/test split in a federated dataset drawn with ``seed`` (the simulated site's
    split secret is :func:`~fcd_secure.data.cohorts.seeded_secret` of it)."""
    return int(seed) * 1_000_003 + int(site)


def site_splits(
    site_of: np.ndarray, n_sites: int, test_fraction: float, seed: int, entity: np.ndarray | None = None, *,
    ids: list[str] | None = None, secrets: list[bytes] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per site ``i``: (train rows, test rows) of the pooled rows with ``site_of == i``, as sorted global indices.

    Each site is cut by :func:`split_indices` under its own secret (``secrets[i]``; default: the simulated site's,
    from :func:`site_split_seed` ``(seed, i)``), so this equals :func:`dirichlet_partition` followed by
    :func:`train_test_split` per site; ``ids`` [n] (else ``entity`` [n], else each pooled row's index: a generated
    world's global id, which its sites' ``row_ids`` repeat) keeps an entity on one side.
    """
    out = []
    if ids is None:  # an entity's code, else the pooled row itself (a generated world's global id)
        ids = ([f"entity-{int(e)}" for e in np.asarray(entity)] if entity is not None
               else [str(j) for j in range(len(site_of))])
    for i in range(n_sites):
        idx = np.flatnonzero(site_of == i)
        site_ids = None if ids is None else [ids[j] for j in idx]
        secret = None if secrets is None else secrets[i]
        tr, te = split_indices(len(idx), test_fraction, site_split_seed(seed, i), ids=site_ids, secret=secret)
        out.append((idx[tr], idx[te]))
    return out


def train_test_split(ds: SiteDataset, test_fraction: float, seed: int) -> tuple[SiteDataset, SiteDataset]:
    """The simulated site's cut into (train, test) with about ``test_fraction`` (on the 5 % grid) of the trajectories
    in test: :func:`~fcd_secure.data.cohorts.split_rows` under the secret :func:`~fcd_secure.data.cohorts.seeded_secret`
    of ``seed``.

    Trajectories of one entity (chunks of one student/patient, ``meta['entity']``) stay on the same side, so the
    test set holds unseen entities. Both sides get at least one trajectory.

    Args:
        ds: The dataset (at least 2 trajectories).
        test_fraction: In (0, 1).
        seed: Seed of the split.

    Returns:
        ``(train, test)``, named ``<name>/train`` and ``<name>/test``.

    Raises:
        DataError: ``test_fraction`` outside (0, 1) or fewer than 2 trajectories.
    """
    try:
        tr, te = split_indices(ds.n, test_fraction, seed, ids=row_ids(ds))
    except DataError as exc:
        raise DataError(f"{ds.name}: {exc.message}", field=exc.field) from None
    return ds.subset(tr, name=f"{ds.name}/train"), ds.subset(te, name=f"{ds.name}/test")

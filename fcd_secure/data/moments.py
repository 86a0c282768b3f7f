"""Standardisation statistics from additive sums: what a site contributes, and the statistics of the total.

The z-scores of :class:`~fcd_secure.data.preprocess.Standardizer` need, per continuous column, the mean and the
(population) variance over the training rows of all sites. Both are functions of three sums that add across sites:
the row count ``n``, ``Σx`` and ``Σx²`` (``mean = Σx / n``, ``var = Σx² / n − mean²``). A site computes its sums with
:func:`moment_sums`; the sums of all sites, added under secure aggregation so that no site's sums are seen alone
(``fcd_secure.federation.secure.secure_stats``), give the statistics with :func:`moments_to_statistics`. The result
is the pooled :meth:`Standardizer.fit` up to floating-point rounding (the columns of X over trajectories, those of A
over valid steps, ``M = 1``).

The same round carries the histogram of logged valid steps per action (``actions.count``): its consortium total fixes
the anchor actions of the paper's policies (:func:`fcd_secure.data.policy.anchors_from_counts`, paper §IV-A) once
for all sites, where each site's own table would otherwise give each site its own pair.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fcd_secure.data.policy import anchors_from_counts
from fcd_secure.data.preprocess import Standardizer
from fcd_secure.data.schema import SiteDataset

#: the keys of one site's sums: trajectories and Σ, Σ² over X's continuous columns; valid steps and Σ, Σ² over A's;
#: valid steps per action
KEYS = ("x.n", "x.sum", "x.sumsq", "a.n", "a.sum", "a.sumsq", "actions.count")
#: the most continuous columns one part (X or A) may have: the cap of the sums' lengths in a schema
MAX_MOMENT_COLUMNS = 4096
#: a consortium's mean may lie at most this many standard deviations (the larger of the site's and the
#: consortium's) from the site's own mean of a column (:func:`check_statistics`)
MEAN_TOLERANCE_SD = 10.0
#: a consortium's standard deviation may be at most this factor smaller or larger than the site's own
SD_TOLERANCE_RATIO = 100.0


def continuous_columns(ds: SiteDataset) -> tuple[list[int], list[int]]:
    """The continuous columns of X and A (``meta['x_continuous']``, ``meta['a_continuous']``)."""
    return [int(i) for i in ds.meta.get("x_continuous", [])], [int(i) for i in ds.meta.get("a_continuous", [])]


def moment_sums(ds: SiteDataset) -> dict[str, float | list[float]]:
    """One site's sums over its (raw, unscaled) training set: ``{key: value}`` for :data:`KEYS`.

    Raises:
        ValueError: ``ds`` is standardised already (its sums would be of z-scores).
    """
    if ds.meta.get("standardization") is not None:
        raise ValueError(f"{ds.name}: moment sums are taken over raw values; this dataset is standardised")
    xc, ac = continuous_columns(ds)
    X = ds.X[:, xc].astype(np.float64)
    A = ds.A[ds.M > 0][:, ac].astype(np.float64)
    return {
        "x.n": float(X.shape[0]), "x.sum": X.sum(axis=0).tolist(), "x.sumsq": (X * X).sum(axis=0).tolist(),
        "a.n": float(A.shape[0]), "a.sum": A.sum(axis=0).tolist(), "a.sumsq": (A * A).sum(axis=0).tolist(),
        "actions.count": np.bincount(ds.T[ds.M > 0], minlength=ds.n_actions)[: ds.n_actions].astype(np.float64).tolist(),
    }


def moments_to_statistics(totals: Mapping[str, object]) -> dict[str, list[float]]:
    """Means and standard deviations from the consortium's total sums (``x_mean``, ``x_std``, ``a_mean``, ``a_std``),
    and the consortium's ``anchors`` ``[a_off, a_on]`` when the totals hold the action histogram.

    A column with zero spread gets std 1, as in :meth:`Standardizer.fit`.

    Raises:
        DataError: the consortium logged fewer than two actions.
    """
    out: dict[str, list[float]] = {}
    counts = totals.get("actions.count")
    if counts is not None:
        out["anchors"] = [float(a) for a in anchors_from_counts(np.atleast_1d(np.asarray(counts)), "consortium")]
    for part in ("x", "a"):
        n = float(totals.get(f"{part}.n", 0.0))  # type: ignore[arg-type]
        s = np.atleast_1d(np.asarray(totals.get(f"{part}.sum", []), dtype=np.float64))
        ss = np.atleast_1d(np.asarray(totals.get(f"{part}.sumsq", []), dtype=np.float64))
        if n <= 0 or s.size == 0:
            out[f"{part}_mean"], out[f"{part}_std"] = [0.0] * s.size, [1.0] * s.size
            continue
        mu = s / n
        sd = np.sqrt(np.maximum(ss / n - mu * mu, 0.0))
        sd = np.where(sd > 1e-12, sd, 1.0)
        out[f"{part}_mean"], out[f"{part}_std"] = mu.tolist(), sd.tolist()
    return out


def check_statistics(ds: SiteDataset, statistics: Mapping[str, list[float]]) -> None:
    """Refuse consortium statistics that the site's own (raw) rows make implausible, column by column: a mean more
    than :data:`MEAN_TOLERANCE_SD` standard deviations from the site's own mean, or a standard deviation more than
    :data:`SD_TOLERANCE_RATIO` times smaller or larger than the site's own (a column constant on the site is checked
    for its mean only). A site contributed its sums to these statistics (:func:`moment_sums`); a coordinator that
    sends others can at most shift and scale the site's z-scores within these bounds, and never its records' ids,
    which are taken over raw values (``data.records``, docs/threats.md P45).

    Raises:
        ValueError: naming the part, the column and the values.
    """
    xc, ac = continuous_columns(ds)
    parts = {"x": ds.X[:, xc].astype(np.float64), "a": ds.A[ds.M > 0][:, ac].astype(np.float64)}
    for part, rows in parts.items():
        if rows.shape[0] == 0:
            continue
        own_mean, own_sd = rows.mean(axis=0), rows.std(axis=0)
        for j, (mu, sd) in enumerate(zip(statistics[f"{part}_mean"], statistics[f"{part}_std"])):
            mu, sd, m_own, spread = float(mu), float(sd), float(own_mean[j]), float(own_sd[j])
            if not (np.isfinite(mu) and np.isfinite(sd) and sd > 0):
                raise ValueError(f"{ds.name}: standardisation statistics {part}[{j}]: mean {mu!r}, sd {sd!r}")
            spread = spread if spread > 1e-12 else 0.0
            if abs(mu - m_own) > MEAN_TOLERANCE_SD * max(sd, spread):
                raise ValueError(f"{ds.name}: the consortium's mean of {part}[{j}] ({mu:.6g}) lies more than "
                                 f"{MEAN_TOLERANCE_SD:g} sd from this site's own ({m_own:.6g}); refused")
            if spread > 0 and not spread / SD_TOLERANCE_RATIO <= sd <= spread * SD_TOLERANCE_RATIO:
                raise ValueError(f"{ds.name}: the consortium's sd of {part}[{j}] ({sd:.6g}) is more than "
                                 f"{SD_TOLERANCE_RATIO:g} times off this site's own ({spread:.6g}); refused")


def standardizer_for(ds: SiteDataset, statistics: Mapping[str, list[float]]) -> Standardizer:
    """The :class:`Standardizer` of ``ds``'s (raw) continuous columns with the consortium's ``statistics``, after
    :func:`check_statistics`.

    Raises:
        ValueError: the statistics have another number of columns than ``ds`` (another spec), or are implausible
            against the site's own rows (:func:`check_statistics`).
    """
    xc, ac = continuous_columns(ds)
    if len(statistics["x_mean"]) != len(xc) or len(statistics["a_mean"]) != len(ac):
        raise ValueError(
            f"{ds.name}: standardisation statistics for {len(statistics['x_mean'])}+{len(statistics['a_mean'])} "
            f"columns, the data has {len(xc)}+{len(ac)} continuous columns"
        )
    check_statistics(ds, statistics)
    return Standardizer(x_cols=xc, x_mean=list(statistics["x_mean"]), x_std=list(statistics["x_std"]),
                        a_cols=ac, a_mean=list(statistics["a_mean"]), a_std=list(statistics["a_std"]))

"""The training batch and the loaders that yield it: the boundary between a site's ``SiteDataset`` and the model.

A batch is :class:`Batch`, a ``NamedTuple`` of seven tensors. Loaders (including Opacus' ``DPDataLoader``, whose
empty-batch collation rebuilds the container with ``type(sample)(list)``) yield plain lists, so a loader keeps the
default collation and the consumer converts with :meth:`Batch.of` — the one place the field order is spelled.

The logged propensities P ride along as the last field, NaN where the dataset carries none — and the
training entry points give the model a dataset without P (``SiteDataset.without_propensities``) unless
``ModelConfig.ipw`` is on. Only the inverse-propensity weights (``losses.ipw_weights``) read P, on the site: no
network input, output, parameter or reported metric carries it, and it never leaves the site (the egress gate refuses it, docs/privacy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from fcd_secure.data.schema import SiteDataset

__all__ = ["Batch", "dataset_tensors", "make_loader", "site_labels"]


class Batch(NamedTuple):
    """One batch of trajectories (paper §III notation).

    Attributes:
        X: static covariates, ``[B, dx]``.
        A: exogenous time-varying context A_t, ``[B, L, da]``.
        T: logged actions T_t (int64), ``[B, L]``.
        Y: outcomes Y_t, ``[B, L]``.
        M: valid-step mask (a prefix of ones), ``[B, L]``.
        site: site label of each row (int64), ``[B]``.
        P: logged propensity of the taken action, ``[B, L]``; NaN where the dataset logs none or it was dropped.
    """

    X: torch.Tensor
    A: torch.Tensor
    T: torch.Tensor
    Y: torch.Tensor
    M: torch.Tensor
    site: torch.Tensor
    P: torch.Tensor

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> "Batch":
        """``tensors`` as a :class:`Batch` (a loader's list or tuple in field order; a Batch is returned as is).

        Raises:
            ValueError: if ``tensors`` does not hold exactly seven tensors.
        """
        if isinstance(tensors, cls):
            return tensors
        if len(tensors) != len(cls._fields):
            raise ValueError(f"a batch has {len(cls._fields)} tensors {cls._fields}, got {len(tensors)}")
        return cls(*tensors)

    @property
    def size(self) -> int:
        """Number of trajectories B (0 for an empty Poisson batch)."""
        return int(self.T.shape[0])


def site_labels(ds: SiteDataset, site_index: int | None) -> np.ndarray:
    """Per-row site ids: ``site_index`` for every row, or ``ds.meta['site']`` for a pooled dataset.

    Raises:
        ValueError: if ``site_index`` is None and ``ds.meta['site']`` is missing or has the wrong shape.
    """
    if site_index is not None:
        return np.full(ds.n, int(site_index), dtype=np.int64)
    site = ds.meta.get("site")
    if site is None:
        raise ValueError(f"{ds.name}: no site_index given and meta['site'] is missing (pool sites with schema.concat)")
    site = np.asarray(site, dtype=np.int64)
    if site.ndim == 0:  # a single site's dataset carries its index as a scalar
        return np.full(ds.n, int(site), dtype=np.int64)
    if site.shape != (ds.n,):
        raise ValueError(f"{ds.name}: meta['site'] has shape {site.shape}, expected ({ds.n},)")
    return site


def dataset_tensors(ds: SiteDataset, site_index: int | None) -> Batch:
    """The whole dataset as one :class:`Batch` (P all NaN when ``ds.P`` is None, e.g. after
    ``without_propensities``)."""
    P = np.full(ds.T.shape, np.nan, dtype=np.float32) if ds.P is None else ds.P
    return Batch(
        X=torch.as_tensor(ds.X, dtype=torch.float32),
        A=torch.as_tensor(ds.A, dtype=torch.float32),
        T=torch.as_tensor(ds.T, dtype=torch.long),
        Y=torch.as_tensor(ds.Y, dtype=torch.float32),
        M=torch.as_tensor(ds.M, dtype=torch.float32),
        site=torch.as_tensor(site_labels(ds, site_index)),
        P=torch.as_tensor(P, dtype=torch.float32),
    )


def make_loader(
    ds: SiteDataset, batch_size: int, seed: int, site_index: int | None, poisson: bool = False
) -> DataLoader:
    """A shuffling loader over the tensors of :func:`dataset_tensors` (convert its items with :meth:`Batch.of`).

    Args:
        ds: one site's (or a pooled) dataset.
        batch_size: rows per batch (capped at ``ds.n``).
        seed: seed of the shuffling generator.
        site_index: the site label of every row, or None to read ``ds.meta['site']``.
        poisson: Opacus' Poisson-sampled loader instead (sample rate batch_size/n, variable and possibly empty
            batches), which DP accounting assumes.

    Raises:
        ValueError: if ``batch_size`` < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    tensors = TensorDataset(*dataset_tensors(ds, site_index))
    g = torch.Generator().manual_seed(int(seed))
    dl = DataLoader(tensors, batch_size=min(batch_size, ds.n), shuffle=True, generator=g)
    if poisson:
        from opacus.data_loader import DPDataLoader

        g2 = torch.Generator().manual_seed(int(seed) + 1)
        dl = DPDataLoader.from_data_loader(dl, generator=g2)
    return dl

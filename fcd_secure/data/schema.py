"""The one data contract every layer stands on: ``SiteDataset``.

A site holds ``n`` trajectories of at most ``L`` steps (paper §IV-A "Feature engineering and sequence
construction"):

=====  ==============  =========  ==========================================================
name   shape           dtype      meaning
=====  ==============  =========  ==========================================================
X      [n, dx]         float32    static covariates (already encoded: z-scored / one-hot / ids)
A      [n, L, da]      float32    time-varying context available at decision time t
T      [n, L]          int64      the intervenable decision: a categorical action id in [0, n_actions)
Y      [n, L]          float32    the outcome at step t (binary outcomes are 0/1)
M      [n, L]          float32    1 for a valid step, 0 for padding; valid steps form a prefix
P      [n, L] or None  float32    logged behaviour propensity of the *taken* action, in (0, 1]
=====  ==============  =========  ==========================================================

Padding steps carry T = 0, Y = 0, A = 0 and P = 1 so that arithmetic over padded arrays never produces NaN;
every consumer must multiply by ``M``.

Propensities are site-private: they are used on the site for off-policy estimates and never
enter a model parameter, a message or a log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from fcd_secure.errors import FcdError


class SchemaError(FcdError, ValueError):
    """A dataset violates the ``SiteDataset`` contract. The message names the field, and the row where known."""


@dataclass(frozen=True)
class SiteDataset:
    """Trajectories of one site in the unified (X, A, T, Y, M[, P]) layout. See the module docstring."""

    X: np.ndarray
    A: np.ndarray
    T: np.ndarray
    Y: np.ndarray
    M: np.ndarray
    n_actions: int
    P: np.ndarray | None = None
    name: str = "site"
    #: Free-form provenance: dataset name, site index, feature names, preprocessing notes, truncation counts.
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    # -- shape helpers -------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return int(self.T.shape[0])

    @property
    def L(self) -> int:
        return int(self.T.shape[1])

    @property
    def dx(self) -> int:
        return int(self.X.shape[1])

    @property
    def da(self) -> int:
        return int(self.A.shape[2])

    @property
    def lengths(self) -> np.ndarray:
        """Number of valid steps per trajectory, shape [n]."""
        return self.M.sum(axis=1).astype(np.int64)

    def __len__(self) -> int:
        return self.n

    def subset(self, idx: np.ndarray | list[int], name: str | None = None) -> "SiteDataset":
        """Rows ``idx`` as a new dataset: the arrays and every per-row meta array (a numpy array whose first axis has
        one entry per row: ``entity``, ``site``) sliced with the rows, other meta shared.

        Per-row meta must follow its rows: a cohort of rows ``[7, 2]`` whose meta still began at row 0 labelled the
        per-entity what-if file of a site with the first entities' ids instead of its own.
        """
        idx = np.asarray(idx, dtype=np.int64)
        meta = {k: (v[idx] if isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == self.n else v)
                for k, v in self.meta.items()}
        return replace(
            self,
            X=self.X[idx].copy(),
            A=self.A[idx].copy(),
            T=self.T[idx].copy(),
            Y=self.Y[idx].copy(),
            M=self.M[idx].copy(),
            P=None if self.P is None else self.P[idx].copy(),
            name=name or self.name,
            meta=meta,
        )

    def without_propensities(self) -> "SiteDataset":
        """The same trajectories with P dropped (what a model may see)."""
        return replace(self, P=None)

    # -- validation ----------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`SchemaError` naming the field (and first bad row) if the contract is broken."""
        n = self.T.shape[0] if self.T.ndim == 2 else -1
        if self.T.ndim != 2:
            raise SchemaError(f"{self.name}: T must be [n, L], got shape {self.T.shape}")
        if n == 0:
            raise SchemaError(f"{self.name}: the site has no trajectories (empty site)")
        L = self.T.shape[1]
        expect = {"X": 2, "A": 3, "Y": 2, "M": 2}
        for key, nd in expect.items():
            arr = getattr(self, key)
            if not isinstance(arr, np.ndarray) or arr.ndim != nd:
                raise SchemaError(f"{self.name}: {key} must be a {nd}-d numpy array, got {getattr(arr, 'shape', type(arr))}")
            if arr.shape[0] != n:
                raise SchemaError(f"{self.name}: {key} has {arr.shape[0]} rows, T has {n}")
        for key in ("A", "Y", "M"):
            if getattr(self, key).shape[1] != L:
                raise SchemaError(f"{self.name}: {key} has {getattr(self, key).shape[1]} steps, T has {L}")
        if self.P is not None and self.P.shape != self.T.shape:
            raise SchemaError(f"{self.name}: P has shape {self.P.shape}, T has {self.T.shape}")
        if not np.issubdtype(self.T.dtype, np.integer):
            raise SchemaError(f"{self.name}: T must hold integer action ids, got dtype {self.T.dtype}")
        if self.n_actions < 1:
            raise SchemaError(f"{self.name}: n_actions must be >= 1, got {self.n_actions}")
        for key in ("X", "A", "Y", "M") + (("P",) if self.P is not None else ()):
            arr = getattr(self, key)
            bad = ~np.isfinite(arr)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise SchemaError(f"{self.name}: {key} holds NaN or inf (first at row {row})")
        if not np.isin(self.M, (0.0, 1.0)).all():
            raise SchemaError(f"{self.name}: M must be 0/1")
        # valid steps form a prefix: once a step is padding, every later step is padding
        if (np.diff(self.M, axis=1) > 0).any():
            row = int(np.argwhere(np.diff(self.M, axis=1) > 0)[0][0])
            raise SchemaError(f"{self.name}: M must be a prefix of valid steps (row {row} has a gap)")
        if (self.M.sum(axis=1) == 0).any():
            row = int(np.argwhere(self.M.sum(axis=1) == 0)[0][0])
            raise SchemaError(f"{self.name}: row {row} has no valid step")
        valid = self.M > 0
        out = valid & ((self.T < 0) | (self.T >= self.n_actions))
        if out.any():
            row, step = (int(v) for v in np.argwhere(out)[0])
            raise SchemaError(
                f"{self.name}: T out of range [0, {self.n_actions}) at row {row}, step {step} (value {int(self.T[row, step])})"
            )
        if self.P is not None:
            badp = valid & ((self.P <= 0) | (self.P > 1))
            if badp.any():
                row, step = (int(v) for v in np.argwhere(badp)[0])
                raise SchemaError(
                    f"{self.name}: propensity P outside (0, 1] at row {row}, step {step} (value {float(self.P[row, step])})"
                )


def concat(datasets: list[SiteDataset], name: str = "pooled") -> SiteDataset:
    """Pool several sites (same L, dx, da, n_actions) into one dataset; ``meta['site']`` gets per-row site ids."""
    if not datasets:
        raise SchemaError("concat: no datasets")
    first = datasets[0]
    for d in datasets[1:]:
        if (d.L, d.dx, d.da, d.n_actions) != (first.L, first.dx, first.da, first.n_actions):
            raise SchemaError(f"concat: {d.name} has a different layout from {first.name}")
    has_p = all(d.P is not None for d in datasets)
    site = np.concatenate([np.full(d.n, i, dtype=np.int64) for i, d in enumerate(datasets)])
    return SiteDataset(
        X=np.concatenate([d.X for d in datasets]),
        A=np.concatenate([d.A for d in datasets]),
        T=np.concatenate([d.T for d in datasets]),
        Y=np.concatenate([d.Y for d in datasets]),
        M=np.concatenate([d.M for d in datasets]),
        P=np.concatenate([d.P for d in datasets]) if has_p else None,  # type: ignore[misc]
        n_actions=first.n_actions,
        name=name,
        meta={**first.meta, "site": site},
    )

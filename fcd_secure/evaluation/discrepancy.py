"""The truth-free one-step doubly robust discrepancy D₁: how far a model's one-step effect is from what the logs say.

A model that predicts μ̂_a(H_t) = E[Y_t | H_t, do(T_t = a)] for the two anchor actions gives, at every decision step t
of every entity, the augmented inverse-propensity (AIPW) correction of its one-step contrast (Robins, Rotnitzky &
Zhao, JASA 1994; Bang & Robins, Biometrics 2005)::

    ψ_t = 1{T_t = a_on} (Y_t − μ̂_on(H_t)) / P_t  −  1{T_t = a_off} (Y_t − μ̂_off(H_t)) / P_t

with P_t the logged propensity of the logged action. When P_t is the true logging probability, E[ψ_t] equals the
true one-step contrast minus the model's (whatever μ̂ is): the model's one-step effect error, estimated without the
truth. **D₁ = |mean ψ|** with its standard error sd(ψ)/√n. A model that fits the confounded logs best need not have
a small D₁; a model whose contrast is right has D₁ ≈ 0 (issue "Answers a clinician can act on", item 2).

Federated: a site sends only the additive sums of :class:`DiscrepancySums` (n, Σψ, Σψ², the clipped count; through
secure aggregation), never a per-step term, a prediction or a propensity. Terms are clipped at ±``clip`` so that one
tiny propensity cannot dominate; the clipped share is reported beside D₁.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fcd_secure.evaluation.metrics import AdditiveSums

__all__ = ["DiscrepancySums", "one_step_dr_terms"]

#: the default bound on one term: |ψ_t| ≤ 1 / 0.02 for a binary outcome (a propensity floor of 2 %)
DEFAULT_CLIP = 50.0


def one_step_dr_terms(
    Y: np.ndarray, M: np.ndarray, T: np.ndarray, P: np.ndarray, mu_on: np.ndarray, mu_off: np.ndarray,
    a_on: int, a_off: int,
) -> np.ndarray:
    """The AIPW correction ψ_t of every valid decision step (module docstring), unclipped, as a flat float64 array.

    Args:
        Y, M, T, P: outcomes, valid-step mask, logged actions and their logged propensities, ``[n, L]``.
        mu_on, mu_off: the model's E[Y_t | H_t, do(T_t = a_on / a_off)], ``[n, L]``.
        a_on, a_off: the two anchor actions (a_on ≠ a_off).

    Raises:
        ValueError: shapes differ, a_on = a_off, or a valid step has a propensity outside (0, 1].
    """
    arrays = [np.asarray(x, dtype=np.float64) for x in (Y, M, P, mu_on, mu_off)]
    T = np.asarray(T)
    if any(a.shape != T.shape for a in arrays) or T.ndim != 2:
        raise ValueError(f"one_step_dr_terms: Y, M, T, P, mu_on, mu_off must share one [n, L] shape, got "
                         f"{[a.shape for a in arrays]} and T {T.shape}")
    if int(a_on) == int(a_off):
        raise ValueError("one_step_dr_terms: a_on and a_off must differ")
    Y, M, P, mu_on, mu_off = arrays
    valid = M > 0
    if not ((P[valid] > 0) & (P[valid] <= 1)).all():
        raise ValueError("one_step_dr_terms: a valid step has a logged propensity outside (0, 1]")
    on, off = (T == int(a_on)) & valid, (T == int(a_off)) & valid
    psi = np.zeros_like(Y)
    psi[on] = (Y[on] - mu_on[on]) / P[on]
    psi[off] = -(Y[off] - mu_off[off]) / P[off]
    return psi[valid]


@dataclass(frozen=True)
class DiscrepancySums(AdditiveSums):
    """Additive sums of the clipped terms ψ_t: ``n`` steps, ``s`` = Σψ, ``ss`` = Σψ², ``clipped`` = how many were cut.

    Merging adds them (:class:`~fcd_secure.evaluation.metrics.AdditiveSums`), so the consortium's D₁ and its
    standard error equal those of the pooled steps exactly; :meth:`empty` (n = 0) is what a site without logged
    propensities sends.
    """

    n: int
    s: float
    ss: float
    clipped: int

    @classmethod
    def from_terms(cls, terms: np.ndarray, clip: float = DEFAULT_CLIP) -> "DiscrepancySums":
        """The sums of ``terms`` clipped to ±``clip``."""
        t = np.asarray(terms, dtype=np.float64).ravel()
        if not np.isfinite(t).all():
            raise ValueError("DiscrepancySums: a term is not finite")
        c = np.clip(t, -clip, clip)
        return cls(n=int(c.size), s=float(c.sum()), ss=float((c * c).sum()), clipped=int((np.abs(t) > clip).sum()))

    def mean(self) -> float:
        """mean ψ: the truth-free estimate of (true one-step contrast − the model's); NaN without steps."""
        return self.s / self.n if self.n else math.nan

    def d1(self) -> float:
        """D₁ = |mean ψ|."""
        return abs(self.mean())

    def se(self) -> float:
        """sd(ψ)/√n (sample s.d.); NaN with fewer than two steps."""
        if self.n < 2:
            return math.nan
        var = max(self.ss - self.s * self.s / self.n, 0.0) / (self.n - 1)
        return math.sqrt(var / self.n)

    def clipped_share(self) -> float:
        return self.clipped / self.n if self.n else math.nan

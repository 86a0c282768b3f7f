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

**Over h ≥ 2 steps** (:func:`horizon_dr_terms`, :class:`HorizonDiscrepancySums`) the same correction of the model's
h-step contrast of the anchor regimes "a_on at every step" and "a_off at every step" from t = 0, per entity i, with the
per-decision weights w^a_{i,0:t} = Π_{s≤t} 1{T_s = a}/P_s (Jiang & Li 2016; the per-decision DR of
``evaluation.ope``)::

    ψ^h_i = c_i Σ_{t<h} M_it [w^on_{i,0:t} (Y_it − v̂^on_it) − w^off_{i,0:t} (Y_it − v̂^off_it)],  c_i = 1 / Σ_{t<h} M_it

where v̂^a_it is the model's expected outcome at t under regime a. With true propensities E[ψ^h] is the true h-step
value contrast minus the model's. Its **support check** is the per-arm effective sample size (Σw)²/Σw² of the final
weight products (Kish 1965): a regime the logs hardly follow gives an estimate no interval can be trusted on, and
D_h then counts for nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fcd_secure.evaluation.metrics import AdditiveSums

__all__ = ["DiscrepancySums", "HorizonDiscrepancySums", "horizon_dr_terms", "one_step_dr_terms"]

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


def horizon_dr_terms(
    Y: np.ndarray, M: np.ndarray, T: np.ndarray, P: np.ndarray, v_on: np.ndarray, v_off: np.ndarray,
    a_on: int, a_off: int, h: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-entity corrections ψ^h_i of the h-step anchor-regime contrast (module docstring), unclipped, and each
    regime's final weight product per entity.

    Args:
        Y, M, T, P: outcomes, valid-step mask, logged actions and their logged propensities, ``[n, L]``.
        v_on, v_off: the model's expected outcome at each of the first h steps under "a_on (a_off) at every step",
            ``[n, ≥h]``.
        a_on, a_off: the two anchor actions (a_on ≠ a_off).
        h: the horizon (steps from t = 0).

    Returns:
        ``(psi [n'], w_on [n'], w_off [n'])`` over the n' entities with a valid step before h.

    Raises:
        ValueError: shapes differ, h < 1, a_on = a_off, or a valid step has a propensity outside (0, 1].
    """
    Y, M, P = (np.asarray(x, dtype=np.float64) for x in (Y, M, P))
    T = np.asarray(T)
    if int(h) < 1:
        raise ValueError(f"horizon_dr_terms: h must be >= 1, got {h}")
    if int(a_on) == int(a_off):
        raise ValueError("horizon_dr_terms: a_on and a_off must differ")
    H = min(int(h), Y.shape[1])
    if any(a.shape != T.shape for a in (Y, M, P)) or T.ndim != 2:
        raise ValueError(f"horizon_dr_terms: Y, M, T, P must share one [n, L] shape, got {Y.shape}, {M.shape}, "
                         f"{P.shape}, T {T.shape}")
    vs = [np.asarray(v, dtype=np.float64) for v in (v_on, v_off)]
    if any(v.ndim != 2 or v.shape[0] != Y.shape[0] or v.shape[1] < H for v in vs):
        raise ValueError(f"horizon_dr_terms: v_on and v_off must be [n, >= {H}], got {[v.shape for v in vs]}")
    Y, M, P, T = Y[:, :H], M[:, :H], P[:, :H], T[:, :H]
    valid = M > 0
    if not ((P[valid] > 0) & (P[valid] <= 1)).all():
        raise ValueError("horizon_dr_terms: a valid step has a logged propensity outside (0, 1]")
    c = 1.0 / np.maximum(M.sum(axis=1), 1.0)
    psi = np.zeros(Y.shape[0])
    finals = []
    for sign, a, v in ((1.0, int(a_on), vs[0][:, :H]), (-1.0, int(a_off), vs[1][:, :H])):
        rho = np.where(valid, (T == a) / np.where(valid, P, 1.0), 1.0)  # padding carries the weight on unchanged
        w = np.cumprod(rho, axis=1)
        psi += sign * c * np.where(valid, w * (Y - v), 0.0).sum(axis=1)
        finals.append(w[:, -1])
    keep = valid.any(axis=1)
    return psi[keep], finals[0][keep], finals[1][keep]


@dataclass(frozen=True)
class HorizonDiscrepancySums(AdditiveSums):
    """Additive sums of the h-step corrections ψ^h_i (clipped like :class:`DiscrepancySums`) and of each regime's
    final weight products, from which the per-arm effective sample sizes follow (module docstring)."""

    n: int
    s: float
    ss: float
    clipped: int
    sw_on: float
    sww_on: float
    sw_off: float
    sww_off: float

    @classmethod
    def from_terms(cls, psi: np.ndarray, w_on: np.ndarray, w_off: np.ndarray,
                   clip: float = DEFAULT_CLIP) -> "HorizonDiscrepancySums":
        """The sums of ``psi`` clipped to ±``clip`` and of the weights."""
        d = DiscrepancySums.from_terms(psi, clip)
        w1, w0 = (np.asarray(w, dtype=np.float64) for w in (w_on, w_off))
        if not (np.isfinite(w1).all() and np.isfinite(w0).all()):
            raise ValueError("HorizonDiscrepancySums: a weight product is not finite")
        return cls(n=d.n, s=d.s, ss=d.ss, clipped=d.clipped, sw_on=float(w1.sum()), sww_on=float((w1 * w1).sum()),
                   sw_off=float(w0.sum()), sww_off=float((w0 * w0).sum()))

    def discrepancy(self) -> DiscrepancySums:
        """The clipped-term sums alone (D_h = its ``d1()``, SE = its ``se()``)."""
        return DiscrepancySums(n=self.n, s=self.s, ss=self.ss, clipped=self.clipped)

    def ess(self) -> float:
        """The smaller of the two regimes' Kish effective sample sizes (0 when a regime has no weight)."""
        return min(self.sw_on ** 2 / self.sww_on if self.sww_on > 0 else 0.0,
                   self.sw_off ** 2 / self.sww_off if self.sww_off > 0 else 0.0)

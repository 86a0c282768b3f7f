"""The carry-over world's structural model: a patient's two recorded contexts, one step under an action, and the
exact probability of a good step.

One step ``t`` of one patient (S: disease severity, K: toxicity; both recorded each morning, before the decision)::

    S⁺_t   = max(S_t + λ (μ_i − S_t) − r_i a_t, 0)       severity after today's dose (benefit accrues with the dose)
    K⁺_t   = ρ K_t + κ_i a_t                             toxicity after today's dose (builds up, decays slowly)
    P(Y_t = 1 | S_t, K_t, a_t) = σ(b_i − w_S S⁺_t − w_K (K⁺_t)²)                   exact, no Monte Carlo
    Y_t    = 1[u_t < P(Y_t = 1 | ...)]
    S_{t+1} = max(S⁺_t + σ_S ℓ(u^S_t), 0),   K_{t+1} = max(K⁺_t + σ_K ℓ(u^K_t), 0)   ℓ: the logistic quantile

with a ∈ {0: none, 1: treat}. A dose lowers severity by r_i and the reduction persists (severity drifts back to the
patient's untreated level μ_i at the slow rate λ), so the benefit of a course grows with its cumulative dose until
severity reaches its floor; toxicity builds up by κ_i per dose and is retained at the rate ρ per step, and it harms
through its square, so its harm grows faster than its dose. Hence the carry-over of the world's name: the first dose
helps (w_S r_i > w_K κ_i² for the typical patient), a course held for the whole 30 steps harms, and the order of
the regimens at one step is not their order over the trajectory (``docs/carryover.md`` has the truth).

Why these pieces: a severity score and a toxicity grade are what a clinic records each visit; the square of the
toxicity is the simplest convex harm (a grade-2 toxicity is worse than twice a grade-1 one); the logistic noise is
drawn from one uniform per step by its quantile, so that every draw is a common random number
(:mod:`fcd_secure.data.worlds.noise`). The patient's μ_i, r_i, κ_i and b_i are hidden; the recorded frailty and
response marker (X) are noisy proxies of κ_i and r_i. Nothing hidden enters the clinic's decision
(:mod:`.behaviour`), so sequential exchangeability holds given the recorded history (Robins 1986).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["ACTION_LABELS", "CONTEXT_NAMES", "FEATURE_NAMES", "Mechanism", "N_ACTIONS", "PatientParams",
           "good_step_prob", "logistic_quantile", "step"]

#: The two actions (ids 0, 1): a policy names them by these labels.
ACTION_LABELS: tuple[str, ...] = ("none", "treat")
N_ACTIONS = len(ACTION_LABELS)
#: The two context columns the clinic records each morning (A_t), both endogenous (treatment changes them).
CONTEXT_NAMES: tuple[str, ...] = ("severity", "toxicity")
#: X: the recorded frailty score (a proxy of the toxicity per dose κ_i) and response marker (of the benefit per dose
#: r_i), both standardised.
FEATURE_NAMES: tuple[str, ...] = ("frailty", "response_marker")


class Mechanism(Protocol):
    """The population-level numbers of the model (:class:`~.config.CarryoverConfig`'s fields of these names)."""

    mean_reversion: float
    toxicity_retention: float
    severity_weight: float
    toxicity_weight: float
    severity_noise: float
    toxicity_noise: float


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x), float64."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def logistic_quantile(u: np.ndarray) -> np.ndarray:
    """ℓ(u) = log(u / (1 − u)), the standard logistic quantile of uniforms in [0, 1) (shifted off 0 so it is
    finite)."""
    u = np.asarray(u, dtype=np.float64) + 2.0**-54
    return np.log(u) - np.log1p(-u)


@dataclass(frozen=True)
class PatientParams:
    """The hidden parameters of n patients (float64 ``[n]`` each): untreated severity level μ, severity reduction per
    dose r, toxicity per dose κ and the baseline logit b."""

    mu: np.ndarray
    r: np.ndarray
    kappa: np.ndarray
    b: np.ndarray

    def take(self, idx: np.ndarray) -> "PatientParams":
        """The parameters of rows ``idx``."""
        return PatientParams(self.mu[idx], self.r[idx], self.kappa[idx], self.b[idx])

    def tile(self, reps: int) -> "PatientParams":
        """Each array repeated ``reps`` times end to end (the rollout-major layout: row ``r * n + i``)."""
        return PatientParams(*(np.tile(x, reps) for x in (self.mu, self.r, self.kappa, self.b)))


def _after_dose(cfg: Mechanism, prm: PatientParams, S: np.ndarray, K: np.ndarray, a: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(S⁺, K⁺, p)``: severity and toxicity after today's dose and the exact probability of a good step."""
    a = np.asarray(a, dtype=np.float64)
    S_plus = np.maximum(S + cfg.mean_reversion * (prm.mu - S) - prm.r * a, 0.0)
    K_plus = cfg.toxicity_retention * K + prm.kappa * a
    p = sigmoid(prm.b - cfg.severity_weight * S_plus - cfg.toxicity_weight * K_plus * K_plus)
    return S_plus, K_plus, p


def good_step_prob(cfg: Mechanism, prm: PatientParams, S: np.ndarray, K: np.ndarray, a: np.ndarray
                   ) -> np.ndarray:
    """``P(Y_t = 1 | S_t, K_t, do(T_t = a))``, exact (module docstring)."""
    return _after_dose(cfg, prm, S, K, a)[2]


def step(cfg: Mechanism, prm: PatientParams, S: np.ndarray, K: np.ndarray, a: np.ndarray,
         u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One step under actions ``a`` (int ``[B]``) with the step's uniforms ``u`` ``[B, 3]`` (severity noise, toxicity
    noise, outcome).

    Returns:
        ``(S_next, K_next, p, y)``: tomorrow's severity and toxicity, ``P(Y_t = 1 | state, a)`` and the realised
        ``Y_t`` (float64 0/1).
    """
    S_plus, K_plus, p = _after_dose(cfg, prm, S, K, a)
    S_next = np.maximum(S_plus + cfg.severity_noise * logistic_quantile(u[:, 0]), 0.0)
    K_next = np.maximum(K_plus + cfg.toxicity_noise * logistic_quantile(u[:, 1]), 0.0)
    return S_next, K_next, p, (u[:, 2] < p).astype(np.float64)

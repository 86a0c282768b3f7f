"""The logging (behaviour) policy π_b of the carry-over world: the clinic's choice to treat.

The clinic treats a patient on step t with probability::

    q_t = σ( γ · (c_S (S_t − S_ref) − c_K (K_t − K_ref) + c_P (T_{t−1} − ½)) + b + b_s ),    T_{−1} = 0

on the **recorded** severity S_t and toxicity K_t of the morning, the previous action and the site's own practice
shift b_s: it treats the sick, stops when toxicity shows, and keeps doing what it did. Nothing hidden enters (the
patient's μ_i, r_i, κ_i, b_i act on the outcome only through what is recorded), so the logged decisions satisfy
sequential exchangeability given the recorded history (Robins 1986) and the g-formula identifies every regimen's
value. γ is the confounding strength (γ = 0: the decision ignores the history; the site's shift remains). With the
floor ε both actions keep probability ≥ ε at every step (per-step positivity): ``π_b = (1 − 2ε) · q + ε``. The
logged ``P`` is the true propensity of the taken action.
"""

from __future__ import annotations

import numpy as np

from fcd_secure.data.carryover.config import CarryoverConfig
from fcd_secure.data.carryover.model import N_ACTIONS, sigmoid

__all__ = ["action_probs"]

#: c_S, S_ref: a severity above the median untreated level speaks for treatment
SEVERITY_COEF, SEVERITY_REF = 1.0, 1.0
#: c_K, K_ref: recorded toxicity speaks against it, twice as loud
TOXICITY_COEF, TOXICITY_REF = 2.0, 0.5
#: c_P: the clinic keeps doing what it did
PERSISTENCE_COEF = 1.0


def action_probs(cfg: CarryoverConfig, S: np.ndarray, K: np.ndarray, prev: np.ndarray, site_shift: np.ndarray
                 ) -> np.ndarray:
    """π_b(· | recorded history) over the two actions (module docstring).

    Args:
        cfg: The world's config (γ, ε, the global shift).
        S: The recorded severity S_t per row ``[B]``.
        K: The recorded toxicity K_t per row ``[B]``.
        prev: The previous action T_{t−1} per row ``[B]`` (0 at t = 0).
        site_shift: ``b_s`` of each row's site ``[B]``.

    Returns:
        float64 ``[B, 2]``; each row sums to 1.
    """
    lin = (SEVERITY_COEF * (S - SEVERITY_REF) - TOXICITY_COEF * (K - TOXICITY_REF)
           + PERSISTENCE_COEF * (np.asarray(prev, dtype=np.float64) - 0.5))
    q = sigmoid(cfg.gamma * lin + cfg.treat_bias + site_shift)
    return (1.0 - N_ACTIONS * cfg.epsilon) * np.stack([1.0 - q, q], axis=1) + cfg.epsilon

"""A one-step world with a hidden confounder of known strength: the check of the Γ-bounds (``queries.sensitivity``).

Each entity has one step: a recorded covariate X ~ N(0, 1) and a hidden U uniform on {−1, +1};
T ~ Bernoulli(σ(X + s·U)) and Y ~ Bernoulli(σ(−0.5 + 0.8 T + 0.5 X + 1.5 U)). The world hands out the recorded
propensity P(T = t | X) with U integrated out and the true outcome model E[Y | X, do(t)], so the only error left in a
doubly robust estimate is the hidden U. Its strength in the marginal sensitivity model (Tan 2006, JASA 101:1619) is
the largest odds ratio between the true assignment probability e*(t | X, U) and P(t | X) over the sample: the Γ at
which the sharp bounds (Dorn & Guo 2022, JASA 118:2518) must include the truth.

Used by ``tests/test_sensitivity.py`` and ``benchmarks/propensity.py`` (the figure docs/whatif.md quotes).
"""

from __future__ import annotations

import numpy as np

__all__ = ["HiddenConfounderArrays", "one_step_hidden_confounder"]

#: ``(Y, M, T, P, mu_on, mu_off)``, each ``[n, 1]`` (one step): the arrays a site's one-step sums read
HiddenConfounderArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _odds(p: np.ndarray) -> np.ndarray:
    return p / (1.0 - p)


def one_step_hidden_confounder(n: int, seed: int, strength: float) -> tuple[HiddenConfounderArrays, float, float]:
    """``(arrays, true effect of T = 1 vs 0, the world's Γ)`` of ``n`` entities drawn with ``seed`` (module
    docstring); ``strength`` is s, U's weight in the assignment (0: no hidden confounding, Γ = 1)."""
    rng = np.random.default_rng(seed)
    X, U = rng.normal(size=n), rng.choice([-1.0, 1.0], size=n)
    e_true = _sigmoid(X + strength * U)
    T = (rng.random(n) < e_true).astype(int)
    Y = (rng.random(n) < _sigmoid(-0.5 + 0.8 * T + 0.5 * X + 1.5 * U)).astype(float)
    e_x = 0.5 * (_sigmoid(X + strength) + _sigmoid(X - strength))
    P = np.where(T == 1, e_x, 1 - e_x)
    e_star = np.where(T == 1, e_true, 1 - e_true)
    gamma = float(np.max(np.maximum(_odds(e_star) / _odds(P), _odds(P) / _odds(e_star))))
    mu = {t: 0.5 * (_sigmoid(-0.5 + 0.8 * t + 0.5 * X + 1.5) + _sigmoid(-0.5 + 0.8 * t + 0.5 * X - 1.5))
          for t in (0, 1)}
    truth = float((mu[1] - mu[0]).mean())

    def col(v: np.ndarray) -> np.ndarray:
        return np.asarray(v, dtype=np.float64)[:, None]

    return (col(Y), np.ones((n, 1)), T[:, None], col(P), col(mu[1]), col(mu[0])), truth, gamma

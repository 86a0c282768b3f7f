"""The DKT-Synth logging (behaviour) policy π_b: which item the tutor assigns, and its true propensities.

``π_b(a | H_t, θ_i, u_i, s) = (1 − K ε) · softmax_a(ℓ_t(a)) + ε`` with
``ℓ_t(a) = base_a + b_{s,a} + γ · d_a · r_it``, where

- ``d_a`` is the item's standardised difficulty on the oracle's own scale (:func:`reference_profile`);
- ``r_it = c · tanh(r̃_it / c)`` with ``r̃_it = u_i + logit(mean_a m_t(a)) − logit(m_ref)`` is the student's bounded
  "readiness": hidden motivation plus current hidden mastery ``m_t(a) = σ(z_t[a] + βθ θ_i)``; the cap ``c`` keeps
  every anchor a few per cent of support, so inverse-propensity weighting stays usable;
- ``base_a`` boosts two designated items (:func:`designated_items`) so that the two anchors carry roughly 15-35 % of
  the logged steps each, and ``b_{s,a}`` is a site-specific logging bias (:func:`item_constants`).

Ready students are given harder items: because the same ``u_i`` and mastery raise ``Y``, the naive contrast between
items is confounded (time-varying confounding, strength γ). The tutor never assigns an item the student already
masters (``m_t(a) ≥ mastery_cutoff``): with ``ε = 0`` this gives true zero-propensity cases (a positivity
violation); with ``ε > 0`` every action keeps propensity ≥ ε (``ε ≤ 1/K``; 0.02 would be the uniform policy at
K = 50). The logged ``P`` is the true propensity of the taken action.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fcd_secure.data.dkt_synth.config import DKTSynthConfig
from fcd_secure.data.dkt_synth.oracle import N_ITEMS, DKTOracle

__all__ = [
    "behaviour_probs",
    "designated_items",
    "item_constants",
    "logging_probs_along",
    "reference_logit",
    "reference_profile",
]


def reference_profile(model: DKTOracle, n: int = 2000, steps: int = 15, seed: int = 0) -> dict[str, np.ndarray]:
    """Mean success per item under uniformly random practice (steps 5..14): the oracle's own difficulty scale.

    Returns:
        ``mean_success`` [K], ``difficulty`` [K] (standardised −logit of it: higher is harder) and ``m_ref`` (the
        mean success over items, a float).
    """
    g = torch.Generator().manual_seed(seed)
    state = model.init_state(n)
    acc = torch.zeros(N_ITEMS, dtype=torch.float64)
    with torch.no_grad():
        for t in range(steps):
            p = torch.sigmoid(model.logits(state))
            if t >= 5:
                acc += p.mean(0)
            a = torch.randint(0, N_ITEMS, (n,), generator=g)
            y = (torch.rand(n, generator=g, dtype=torch.float64) < p.gather(1, a[:, None])[:, 0]).long()
            state = model.step(state, a, y)
    mean = (acc / (steps - 5)).numpy()
    lg = np.log(mean / (1 - mean))
    return {"mean_success": mean, "difficulty": -(lg - lg.mean()) / lg.std(), "m_ref": float(mean.mean())}


def designated_items(profile: dict[str, np.ndarray]) -> tuple[int, int]:
    """(harder item, easier item): the items at the 20th and 80th percentile of difficulty, boosted in ``base_a``."""
    ranking = np.argsort(profile["mean_success"], kind="stable")  # hardest first
    return int(ranking[int(0.2 * N_ITEMS)]), int(ranking[int(0.8 * N_ITEMS)])


def item_constants(
    cfg: DKTSynthConfig, designated: tuple[int, int], item_bias: np.ndarray, anchor_tilt: np.ndarray
) -> np.ndarray:
    """``base_a + b_{s,a}`` per site and item, float64 ``[S, K]``.

    Args:
        cfg: The world's config (``boost_hard``, ``boost_easy``).
        designated: :func:`designated_items`.
        item_bias: Site-specific logging bias per item ``[S, K]``.
        anchor_tilt: Site-specific tilt between the two designated items ``[S]`` (added to the harder one,
            subtracted from the easier one).
    """
    base = np.zeros(N_ITEMS)
    base[designated[0]] = cfg.boost_hard
    base[designated[1]] = cfg.boost_easy
    site_bias = item_bias.copy()
    site_bias[:, designated[0]] += anchor_tilt
    site_bias[:, designated[1]] -= anchor_tilt
    return base[None, :] + site_bias


def reference_logit(profile: dict[str, np.ndarray]) -> float:
    """``logit(m_ref)``: readiness is measured against the reference population's mean success."""
    return math.log(profile["m_ref"] / (1 - profile["m_ref"]))


def behaviour_probs(
    cfg: DKTSynthConfig,
    z: torch.Tensor,
    theta: torch.Tensor,
    u: torch.Tensor,
    item_const: torch.Tensor,
    difficulty: torch.Tensor,
    logit_ref: float,
) -> torch.Tensor:
    """π_b(· | H_t) over the K items (module docstring).

    Args:
        cfg: The world's config (γ, ε, readiness cap, mastery cutoff, βθ).
        z: Oracle logits ``[B, K]`` at the current step.
        theta: Ability per row ``[B]``.
        u: Hidden confounder per row ``[B]``.
        item_const: ``base_a + b_{s,a}`` of each row's site ``[B, K]``.
        difficulty: ``d_a`` ``[K]``.
        logit_ref: :func:`reference_logit`.

    Returns:
        Probabilities ``[B, K]``; each row sums to 1.
    """
    K = z.shape[1]
    mastery = torch.sigmoid(z + cfg.beta_theta * theta[:, None])
    mbar = mastery.mean(1).clamp(1e-6, 1 - 1e-6)
    ready = u + torch.log(mbar / (1 - mbar)) - logit_ref
    # bounded readiness keeps overlap (every anchor keeps a few % of support) while γ sets the confounding
    ready = cfg.readiness_cap * torch.tanh(ready / cfg.readiness_cap)
    logits = item_const + cfg.gamma * difficulty[None, :] * ready[:, None]
    skip = mastery >= cfg.mastery_cutoff
    skip &= ~skip.all(dim=1, keepdim=True)  # never leave the tutor without an item
    logits = logits.masked_fill(skip, float("-inf"))
    return (1.0 - K * cfg.epsilon) * torch.softmax(logits, dim=1) + cfg.epsilon


def logging_probs_along(
    oracle: DKTOracle,
    cfg: DKTSynthConfig,
    T: np.ndarray,
    Y: np.ndarray,
    theta: np.ndarray,
    u: np.ndarray,
    item_const: np.ndarray,
    difficulty: np.ndarray,
    logit_ref: float,
    items: list[int],
) -> np.ndarray:
    """π_b(items | factual history) at every step, recomputed along the logged history.

    Args:
        oracle: The frozen DKT oracle.
        cfg: The world's config.
        T: Logged actions ``[n, L]``.
        Y: Logged outcomes ``[n, L]``.
        theta: Ability ``[n]``.
        u: Hidden confounder ``[n]``.
        item_const: ``base_a + b_{s,a}`` of each student's site ``[n, K]``.
        difficulty: ``d_a`` ``[K]``.
        logit_ref: :func:`reference_logit`.
        items: The items whose probabilities are returned.

    Returns:
        float64 ``[n, L, len(items)]`` (padding steps included; the caller masks them).
    """
    n, L = T.shape
    T_t = torch.from_numpy(T)
    Y_t = torch.from_numpy(Y.astype(np.int64))
    theta_t, u_t = torch.from_numpy(theta), torch.from_numpy(u)
    const = torch.from_numpy(item_const)
    d = torch.from_numpy(difficulty)
    idx = torch.tensor(items)
    out = np.full((n, L, len(items)), np.nan)
    state = oracle.init_state(n)
    with torch.no_grad():
        for t in range(L):
            pi = behaviour_probs(cfg, oracle.logits(state), theta_t, u_t, const, d, logit_ref)
            out[:, t, :] = pi[:, idx].numpy()
            state = oracle.step(state, T_t[:, t], Y_t[:, t])
    return out

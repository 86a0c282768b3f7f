"""Ground truth of the carry-over world: the structural model (:mod:`.model`) run forward under interventions.

The state of a patient on step t is its recorded ``(S_t, K_t)`` and its hidden parameters; from the logged history
it is known exactly (the world stores the logged severities and toxicities). These kernels work on arrays of
patients; :class:`~.world.CarryoverWorld` picks the patients, validates the query and cuts large queries into batches
of at most :data:`MAX_BATCH_ROWS` rows (:class:`~fcd_secure.data.worlds.world.OracleWorld`). Batches of rollouts are
laid out rollout-major: row ``b = r * n + i`` (:func:`~.noise.rollout_uniforms`). Expected outcomes use the exact
``P(Y_t = 1 | state, a)`` of each simulated state, averaged over rollouts; states and outcomes are realised with the
rollout's uniforms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fcd_secure.data.carryover.config import CarryoverConfig
from fcd_secure.data.carryover.model import N_ACTIONS, PatientParams, step
from fcd_secure.data.policy import PolicyLike
from fcd_secure.data.worlds.horizons import HorizonSums

__all__ = ["MAX_BATCH_ROWS", "policy_values", "regime", "replay"]

#: rows (patients x rollouts) per batch: large enough to vectorise, small enough to stay in cache/RAM
MAX_BATCH_ROWS = 65536


def regime(cfg: CarryoverConfig, prm: PatientParams, S0: np.ndarray, K0: np.ndarray, plan: np.ndarray,
           u: np.ndarray) -> np.ndarray:
    """``E[Y_{start+h}]`` ``[n, H]`` under the actions ``plan`` ``[n, H]`` from the state ``(S0, K0)`` of a start
    step, averaged over the R rollouts of the uniforms ``u`` ``[R * n, H, 3]``."""
    n, H = plan.shape
    R = u.shape[0] // max(n, 1)
    pb = prm.tile(R)
    S, K = np.tile(S0, R), np.tile(K0, R)
    plan_b = np.tile(plan, (R, 1))
    probs = np.empty((n, H))
    for h in range(H):
        S, K, p, _ = step(cfg, pb, S, K, plan_b[:, h], u[:, h])
        probs[:, h] = p.reshape(R, n).mean(0)
    return probs


def policy_values(
    cfg: CarryoverConfig,
    prm: PatientParams,
    S0: np.ndarray,
    K0: np.ndarray,
    policy: PolicyLike,
    lengths: np.ndarray,
    u: np.ndarray,
    anchors: tuple[int, int],
    horizons: Sequence[int | None],
    behaviour: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """Per-patient value ``(1/H_i) Σ_{t<H_i} E[Y^π_it]`` of ``policy`` from step 0 (H_i = min(L_i, horizon)), one per
    rollout, at each of ``horizons`` from one rollout (:class:`~fcd_secure.data.worlds.horizons.HorizonSums`),
    float64 ``[len(horizons), R, n]``.

    The policy sees ``(t, y_hist[B, t], lengths[B], a_off, a_on)`` with B = patients × rollouts (rollout-major), and
    ``context=`` the *simulated* severity and toxicity up to and including step t ``[B, t+1, 2]`` when its
    ``needs_context`` is true (both endogenous: under π they are π's, never the logged ones). A policy whose
    ``needs_behaviour`` is true (incremental, share) is passed ``behaviour=behaviour(S_t, K_t, a_{t−1})``, the true
    logging probabilities ``[B, 2]`` on the simulated history.

    Raises:
        ValueError: The policy returned a wrong shape or an action outside ``[0, 2)``.
    """
    n = len(lengths)
    RN, L = u.shape[:2]
    R = RN // max(n, 1)
    pb = prm.tile(R)
    lengths_b = np.tile(lengths, R)
    S, K = np.tile(S0, R), np.tile(K0, R)
    sums = HorizonSums(lengths_b, horizons, L)
    y_hist = np.zeros((RN, L), dtype=np.float32)
    ctx = np.zeros((RN, L, 2), dtype=np.float32) if getattr(policy, "needs_context", False) else None
    wants_behaviour = bool(getattr(policy, "needs_behaviour", False))
    prev = np.zeros(RN, dtype=np.int64)
    a_off, a_on = anchors
    for t in range(sums.steps):
        kw = {}
        if ctx is not None:
            ctx[:, t, 0], ctx[:, t, 1] = S, K
            kw["context"] = ctx[:, : t + 1]
        if wants_behaviour:
            kw["behaviour"] = behaviour(S, K, prev)
        a = np.asarray(policy.actions(t, y_hist[:, :t], lengths_b, a_off, a_on, **kw), dtype=np.int64)
        if a.shape != (RN,) or ((a < 0) | (a >= N_ACTIONS)).any():
            raise ValueError(f"policy {getattr(policy, 'name', policy)!r} returned bad actions at t={t}")
        S, K, p, y = step(cfg, pb, S, K, a, u[:, t])
        sums.add(t, p)
        y_hist[:, t] = y
        prev = a
    return sums.values(R, n)


def replay(cfg: CarryoverConfig, prm: PatientParams, S0: np.ndarray, K0: np.ndarray, T: np.ndarray, u: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Re-simulate the logged actions ``T`` ``[n, L]`` with the stored uniforms ``u`` ``[n, L, 3]``.

    Returns:
        ``(Y, S, K)``: outcomes float64 ``[n, L]`` and the severities and toxicities ``[n, L + 1]`` (padding steps are
        simulated too; the caller masks them).
    """
    n, L = T.shape
    S, K = np.empty((n, L + 1)), np.empty((n, L + 1))
    S[:, 0], K[:, 0] = S0, K0
    Y = np.zeros((n, L))
    for t in range(L):
        S[:, t + 1], K[:, t + 1], _, Y[:, t] = step(cfg, prm, S[:, t], K[:, t], T[:, t], u[:, t])
    return Y, S, K

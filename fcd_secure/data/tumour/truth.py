"""Ground truth of the tumour world: the PK-PD model (:mod:`.pkpd`) run forward under interventions.

The state of a patient on day t is ``(V_t, C_{t-1})`` and its hidden parameters; from the logged history it is
known exactly (the world stores the logged volumes and concentrations). These kernels work on arrays of patients;
:class:`~.world.TumourWorld` picks the patients (site, split, rows), validates the query and cuts large queries
into batches of at most :data:`MAX_BATCH_ROWS` rows (:class:`~fcd_secure.data.worlds.world.OracleWorld`). Batches
of rollouts are laid out rollout-major: row ``b = r * n + i`` (:func:`~.noise.rollout_normals`). Expected outcomes
use the exact ``P(Y_t = 1 | state, a)`` of each simulated state, averaged over rollouts; outcomes and volumes are
realised with the rollout's noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fcd_secure.data.policy import PolicyLike
from fcd_secure.data.tumour.pkpd import N_ACTIONS, PatientParams, day, observed_contexts
from fcd_secure.data.worlds.horizons import HorizonSums

__all__ = ["MAX_BATCH_ROWS", "policy_values", "regime", "replay"]

#: rows (patients x rollouts) per batch: large enough to vectorise, small enough to stay in cache/RAM
MAX_BATCH_ROWS = 65536


def regime(
    params: PatientParams, V0: np.ndarray, C0: np.ndarray, plan: np.ndarray, noise: np.ndarray, noise_sd: float,
    v_response: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Run the actions ``plan`` from a start day, once per rollout.

    Args:
        params: The n patients' parameters.
        V0: Volumes on the start day ``[n]``.
        C0: Chemotherapy concentration of the day before ``[n]``.
        plan: Actions ``[n, H]``.
        noise: Volume noise ``[R * n, H]``, rollout-major.
        noise_sd: σ_e.
        v_response: The response volume V(3 cm).

    Returns:
        ``(probs, volumes)``: ``E[Y_{start+h}]`` averaged over the R rollouts ``[n, H]``, and every rollout's
        volumes from the start day on, ``[R * n, H + 1]`` (column 0 is ``V0``).
    """
    n, H = plan.shape
    R = noise.shape[0] // n
    pb = params.tile(R)
    V, C = np.tile(V0, R), np.tile(C0, R)
    plan_b = np.tile(plan, (R, 1))
    vols = np.empty((R * n, H + 1))
    vols[:, 0] = V
    probs = np.empty((n, H))
    for h in range(H):
        V, C, p, _ = day(pb, V, C, plan_b[:, h], noise[:, h], noise_sd, v_response)
        probs[:, h] = p.reshape(R, n).mean(0)
        vols[:, h + 1] = V
    return probs, vols


def policy_values(
    params: PatientParams,
    V0: np.ndarray,
    policy: PolicyLike,
    lengths: np.ndarray,
    noise: np.ndarray,
    anchors: tuple[int, int],
    noise_sd: float,
    v_response: float,
    horizons: Sequence[int | None] = (None,),
    behaviour=None,
) -> np.ndarray:
    """Per-patient value ``(1/H_i) Σ_{t<H_i} E[Y^π_it]`` of ``policy`` from day 0 (H_i = min(L_i, horizon)), one per
    rollout, at each of ``horizons`` from one rollout (:class:`~fcd_secure.data.worlds.horizons.HorizonSums`).

    The policy sees ``(t, y_hist[B, t], lengths[B], a_off, a_on)`` with B = patients × rollouts (rollout-major), and
    ``context=`` the *simulated* contexts up to and including day t ``[B, t+1, 2]`` when its ``needs_context`` is
    true (the volume and diameter are endogenous: under π they are π's, never the logged ones). A policy whose
    ``needs_behaviour`` is true (an incremental or share intervention) is passed ``behaviour=behaviour(V_hist)``,
    the true logging probabilities ``[B, 4]`` from the simulated volumes up to and including day t ``[B, t+1]``.

    Returns:
        float64 ``[len(horizons), R, n]``.

    Raises:
        ValueError: The policy returned a wrong shape or an action outside ``[0, 4)``.
    """
    n = len(lengths)
    RN, L = noise.shape
    R = RN // n
    pb = params.tile(R)
    lengths_b = np.tile(lengths, R)
    V, C = np.tile(V0, R), np.zeros(RN)
    sums = HorizonSums(lengths_b, horizons, L)
    y_hist = np.zeros((RN, L), dtype=np.float32)
    reads_context = bool(getattr(policy, "needs_context", False))
    ctx = np.zeros((RN, L, 2), dtype=np.float32) if reads_context else None
    a_off, a_on = anchors
    wants_behaviour = behaviour is not None and getattr(policy, "needs_behaviour", False)
    V_hist = np.zeros((RN, L)) if wants_behaviour else None
    for t in range(sums.steps):
        kw = {}
        if ctx is not None:
            ctx[:, t] = observed_contexts(V)
            kw = {"context": ctx[:, : t + 1]}
        if V_hist is not None:
            V_hist[:, t] = V
            kw["behaviour"] = behaviour(V_hist[:, : t + 1])
        a = np.asarray(policy.actions(t, y_hist[:, :t], lengths_b, a_off, a_on, **kw), dtype=np.int64)
        if a.shape != (RN,) or ((a < 0) | (a >= N_ACTIONS)).any():
            raise ValueError(f"policy {getattr(policy, 'name', policy)!r} returned bad actions at t={t}")
        V, C, p, y = day(pb, V, C, a, noise[:, t], noise_sd, v_response)
        sums.add(t, p)
        y_hist[:, t] = y
    return sums.values(R, n)


def replay(
    params: PatientParams, V0: np.ndarray, T: np.ndarray, z: np.ndarray, noise_sd: float, v_response: float
) -> tuple[np.ndarray, np.ndarray]:
    """Re-simulate the logged actions ``T`` [n, L] with the stored noise ``z`` [n, L].

    Returns:
        ``(Y, V)``: outcomes float32 ``[n, L]`` and volumes float64 ``[n, L + 1]`` (padding days are simulated too;
        the caller masks them).
    """
    n, L = T.shape
    V = np.empty((n, L + 1))
    V[:, 0] = V0
    C = np.zeros(n)
    Y = np.zeros((n, L), dtype=np.float32)
    for t in range(L):
        V[:, t + 1], C, _, y = day(params, V[:, t], C, T[:, t], z[:, t], noise_sd, v_response)
        Y[:, t] = y
    return Y, V

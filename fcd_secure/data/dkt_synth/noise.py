"""Common random numbers of DKT-Synth (Glasserman & Yao 1992): every draw is keyed by the student, never the batch.

The plumbing is shared with the tumour world (:mod:`fcd_secure.data.worlds.noise`); what is DKT-Synth's own is what a
student draws and which noise a rollout replays:

- :func:`student_streams`: each student's own stream, drawn once from ``np.random.SeedSequence(seed).spawn(n)``:
  the student's latent normals, covariate and length uniforms, the outcome uniforms ``U[i, t]`` and the logged
  action uniforms ``V[i, t]``.
- :func:`rollout_noise`: rollout 0 re-uses the logged ``U`` (so replaying the logged actions reproduces the logged
  outcomes exactly), rollouts ``r ≥ 1`` use :func:`~fcd_secure.data.worlds.noise.fresh_uniforms` keyed by
  ``(seed, student, rollout, step)``: the same for every policy and every arm, so contrasts are paired.
"""

from __future__ import annotations

import numpy as np

from fcd_secure.data.worlds.noise import entity_generators, fresh_uniforms, rollout_major, splitmix64

__all__ = ["N_NORMALS", "fresh_uniforms", "rollout_noise", "splitmix64", "student_streams"]

#: Standard normals per student: ability, confounder, and the noise of covariates x1, x2, x3.
N_NORMALS = 5


def student_streams(seed: int, n_students: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Each student's random numbers, drawn once (the same for every policy that is ever simulated).

    Returns:
        ``(normals [n, N_NORMALS], uniforms [n, 2 + 2 L])``; uniform column 0 draws the binary covariate, 1 the
        length, ``2 .. 2+L`` the outcome noise ``U`` and the last ``L`` the logged-action noise ``V``.
    """
    normals = np.empty((n_students, N_NORMALS))
    unif = np.empty((n_students, 2 + 2 * max_len))
    for i, g in enumerate(entity_generators(seed, n_students)):
        normals[i] = g.standard_normal(N_NORMALS)
        unif[i] = g.random(2 + 2 * max_len)
    return normals, unif


def rollout_noise(
    seed: int, logged: np.ndarray, student_ids: np.ndarray, n_rollouts: int, steps: np.ndarray
) -> np.ndarray:
    """Outcome noise of ``n_rollouts`` rollouts over ``steps``, rollout-major: row ``r * n + i``.

    Args:
        seed: The world's seed.
        logged: The students' logged outcome noise ``U`` over ``steps``, ``[n, S]`` (used by rollout 0).
        student_ids: Global student ids ``[n]`` (key of the fresh noise).
        n_rollouts: R.
        steps: The absolute step indices ``[S]`` (key of the fresh noise).

    Returns:
        float64 ``[R * n, S]``.
    """
    return rollout_major(logged, n_rollouts, lambda rollouts: fresh_uniforms(seed, student_ids, rollouts, steps))

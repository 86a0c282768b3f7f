"""Common random numbers of DKT-Synth (Glasserman & Yao 1992): every draw is keyed by the student, never the batch.

- :func:`student_streams`: each student's own stream, drawn once from ``np.random.SeedSequence(seed).spawn(n)``:
  the student's latent normals, covariate and length uniforms, the outcome uniforms ``U[i, t]`` and the logged
  action uniforms ``V[i, t]``.
- :func:`fresh_uniforms`: counter-based U(0, 1) keyed by ``(seed, student, rollout, step)`` (SplitMix64,
  Steele et al. 2014), for counterfactual rollouts ``r ≥ 1``: the same for every policy and every arm, so
  contrasts are paired, and independent of batch shape and call order.
- :func:`rollout_noise`: rollout 0 re-uses the logged ``U`` (so replaying the logged actions reproduces the logged
  outcomes exactly), rollouts ``r ≥ 1`` use :func:`fresh_uniforms`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["N_NORMALS", "fresh_uniforms", "rollout_noise", "splitmix64", "student_streams"]

#: Standard normals per student: ability, confounder, and the noise of covariates x1, x2, x3.
N_NORMALS = 5


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser (Steele, Lea & Flood 2014) on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def fresh_uniforms(seed: int, student_ids: np.ndarray, rollouts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Counter-based U(0,1) keyed by (seed, student, rollout, step): independent of batch shape and call order.

    Returns:
        float64 ``[n students, R rollouts, S steps]`` in [0, 1), 53 random bits each.
    """
    sid = np.asarray(student_ids, dtype=np.uint64)[:, None, None]
    r = np.asarray(rollouts, dtype=np.uint64)[None, :, None]
    t = np.asarray(steps, dtype=np.uint64)[None, None, :]
    with np.errstate(over="ignore"):
        key = splitmix64(np.uint64(seed) ^ np.uint64(0xD1B54A32D192ED03))
        x = splitmix64(key ^ splitmix64(sid * np.uint64(0x9E3779B97F4A7C15) + r))
        x = splitmix64(x ^ (t * np.uint64(0xC2B2AE3D27D4EB4F)))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def student_streams(seed: int, n_students: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Each student's random numbers, drawn once (the same for every policy that is ever simulated).

    Returns:
        ``(normals [n, N_NORMALS], uniforms [n, 2 + 2 L])``; uniform column 0 draws the binary covariate, 1 the
        length, ``2 .. 2+L`` the outcome noise ``U`` and the last ``L`` the logged-action noise ``V``.
    """
    kids = np.random.SeedSequence(seed).spawn(n_students)
    normals = np.empty((n_students, N_NORMALS))
    unif = np.empty((n_students, 2 + 2 * max_len))
    for i, kid in enumerate(kids):
        g = np.random.default_rng(kid)
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
    n, S = logged.shape
    noise = np.empty((n, n_rollouts, S))
    noise[:, 0, :] = logged
    if n_rollouts > 1:
        noise[:, 1:, :] = fresh_uniforms(seed, student_ids, np.arange(1, n_rollouts), steps)
    return noise.transpose(1, 0, 2).reshape(n_rollouts * n, S)

"""Common random numbers of the carry-over world (Glasserman & Yao 1992): every draw is keyed by the patient.

- :func:`patient_streams`: each patient's own stream, drawn once from ``np.random.SeedSequence([salt, seed])``
  spawned per patient: the standard normals behind the hidden parameters and the recorded covariates, the uniform of
  the length, the per-step uniforms ``u[i, t]`` of the severity noise, the toxicity noise and the outcome, and the
  logged-action uniforms ``v[i, t]``.
- :func:`rollout_uniforms`: rollout 0 re-uses the logged ``u`` (so replaying the logged actions reproduces the logs
  bit for bit and a counterfactual arm differs from the factual one only by its actions), rollouts ``r ≥ 1`` use
  counter-based uniforms keyed by ``(seed, patient, rollout, step)``, one key salt per channel
  (:func:`~fcd_secure.data.worlds.noise.fresh_uniforms`): the same for every policy and every arm, and independent
  of batch shape and call order.

The plumbing is shared with the other generated worlds (:mod:`fcd_secure.data.worlds.noise`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fcd_secure.data.worlds.noise import entity_generators, fresh_uniforms, rollout_major

__all__ = ["N_CHANNELS", "N_STATIC_NORMALS", "PatientStreams", "patient_streams", "rollout_uniforms"]

#: Normals per patient: log μ, the response marker's signal, r's hidden part, frailty, κ's hidden part, b.
N_STATIC_NORMALS = 6
#: Uniforms per step: severity noise, toxicity noise, outcome (:func:`~.model.step`).
N_CHANNELS = 3
#: Keeps the carry-over world's streams apart from the other worlds' for the same seed.
_SALT = 0x7A3E_0C01
#: One key salt per channel of the fresh rollout uniforms.
_CHANNEL_SALTS = (0x0C0A_0001, 0x0C0A_0002, 0x0C0A_0003)


@dataclass(frozen=True)
class PatientStreams:
    """Each patient's random numbers (module docstring), float64.

    Attributes:
        static: ``[n, N_STATIC_NORMALS]`` standard normals.
        length: ``[n]`` the uniform of the length.
        u: ``[n, L, N_CHANNELS]`` per-step uniforms.
        v: ``[n, L]`` logged-action uniforms.
    """

    static: np.ndarray
    length: np.ndarray
    u: np.ndarray
    v: np.ndarray


def patient_streams(seed: int, n_patients: int, max_len: int) -> PatientStreams:
    """Each patient's random numbers, drawn once (the same for every policy that is ever simulated)."""
    static = np.empty((n_patients, N_STATIC_NORMALS))
    length = np.empty(n_patients)
    u = np.empty((n_patients, max_len, N_CHANNELS))
    v = np.empty((n_patients, max_len))
    for i, g in enumerate(entity_generators([_SALT, int(seed)], n_patients)):
        static[i] = g.standard_normal(N_STATIC_NORMALS)
        length[i] = g.random()
        u[i] = g.random((max_len, N_CHANNELS))
        v[i] = g.random(max_len)
    return PatientStreams(static, length, u, v)


def rollout_uniforms(seed: int, logged: np.ndarray, patient_ids: np.ndarray, n_rollouts: int, steps: np.ndarray
                     ) -> np.ndarray:
    """The per-step uniforms of ``n_rollouts`` rollouts over ``steps``, rollout-major: row ``r * n + i``.

    Args:
        seed: The world's seed.
        logged: The patients' logged uniforms over ``steps``, ``[n, S, N_CHANNELS]`` (used by rollout 0).
        patient_ids: Global patient ids ``[n]`` (key of the fresh uniforms).
        n_rollouts: R.
        steps: The absolute steps ``[S]`` (key of the fresh uniforms).

    Returns:
        float64 ``[R * n, S, N_CHANNELS]``.
    """
    out = []
    for c, salt in enumerate(_CHANNEL_SALTS):
        def fresh(rollouts: np.ndarray, salt: int = salt) -> np.ndarray:
            return fresh_uniforms(int(seed) ^ _SALT ^ salt, patient_ids, rollouts, steps)

        out.append(rollout_major(logged[:, :, c], n_rollouts, fresh))
    return np.stack(out, axis=-1)

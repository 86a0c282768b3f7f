"""Common random numbers of the tumour world (Glasserman & Yao 1992): every draw is keyed by the patient.

- :func:`patient_streams`: each patient's own stream, drawn once from ``np.random.SeedSequence([salt, seed])``
  spawned per patient: the uniforms behind stage, initial diameter, patient type, β_c and length, the daily
  volume noise ``z[i, t]`` (standard normal), the logged-action uniforms ``v[i, t]`` and, last, (α, ρ) by
  rejection (the only draw of variable length, so it cannot shift the others).
- :func:`rollout_normals`: rollout 0 re-uses the logged ``z`` (so replaying the logged actions reproduces the
  logged outcomes exactly and a counterfactual arm differs from the factual one only by its actions, the CRN
  convention of RMSN/CRN/CT), rollouts ``r ≥ 1`` use counter-based normals keyed by ``(seed, patient, rollout,
  day)`` (:func:`~fcd_secure.data.worlds.noise.fresh_uniforms` through Φ⁻¹): the same for every policy and
  every arm, and independent of batch shape and call order.

The plumbing (per-entity streams, counter-based numbers, the rollout-major layout) is shared with DKT-Synth
(:mod:`fcd_secure.data.worlds.noise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fcd_secure.data.tumour.pkpd import ALPHA_MEAN, ALPHA_RHO_CORR, ALPHA_SD, RHO_MEAN, RHO_SD, normal_ppf
from fcd_secure.data.worlds.noise import entity_generators, fresh_uniforms, rollout_major

__all__ = ["N_STATIC_UNIFORMS", "PatientStreams", "patient_streams", "rollout_normals"]

#: Uniforms per patient: stage, initial diameter, patient type, β_c, length.
N_STATIC_UNIFORMS = 5
#: Keeps the tumour world's streams apart from DKT-Synth's for the same seed.
_SALT = 0x7A3E_0001


@dataclass(frozen=True)
class PatientStreams:
    """Each patient's random numbers (module docstring), float64.

    Attributes:
        static: ``[n, N_STATIC_UNIFORMS]`` uniforms.
        z: ``[n, L]`` daily volume noise (standard normal).
        v: ``[n, L]`` logged-action uniforms.
        alpha_rho: ``[n, 2]`` the accepted (α, ρ), before the patient-type adjustment.
    """

    static: np.ndarray
    z: np.ndarray
    v: np.ndarray
    alpha_rho: np.ndarray


def _alpha_rho(g: np.random.Generator) -> tuple[float, float]:
    """(α, ρ) ~ N((0.0398, 7e-5), cov with correlation 0.87) conditioned on α > 0 and ρ > 0, by rejection."""
    c = math.sqrt(1.0 - ALPHA_RHO_CORR**2)
    while True:
        x0, x1 = g.standard_normal(2)
        a = ALPHA_MEAN + ALPHA_SD * x0
        r = RHO_MEAN + RHO_SD * (ALPHA_RHO_CORR * x0 + c * x1)
        if a > 0.0 and r > 0.0:
            return a, r


def patient_streams(seed: int, n_patients: int, max_len: int) -> PatientStreams:
    """Each patient's random numbers, drawn once (the same for every policy that is ever simulated)."""
    static = np.empty((n_patients, N_STATIC_UNIFORMS))
    z = np.empty((n_patients, max_len))
    v = np.empty((n_patients, max_len))
    ar = np.empty((n_patients, 2))
    for i, g in enumerate(entity_generators([_SALT, int(seed)], n_patients)):
        static[i] = g.random(N_STATIC_UNIFORMS)
        z[i] = g.standard_normal(max_len)
        v[i] = g.random(max_len)
        ar[i] = _alpha_rho(g)
    return PatientStreams(static, z, v, ar)


def rollout_normals(
    seed: int, logged: np.ndarray, patient_ids: np.ndarray, n_rollouts: int, steps: np.ndarray
) -> np.ndarray:
    """Volume noise of ``n_rollouts`` rollouts over ``steps``, rollout-major: row ``r * n + i``.

    Args:
        seed: The world's seed.
        logged: The patients' logged noise ``z`` over ``steps``, ``[n, S]`` (used by rollout 0).
        patient_ids: Global patient ids ``[n]`` (key of the fresh noise).
        n_rollouts: R.
        steps: The absolute days ``[S]`` (key of the fresh noise).

    Returns:
        float64 ``[R * n, S]``.
    """

    def fresh(rollouts: np.ndarray) -> np.ndarray:
        u = fresh_uniforms(int(seed) ^ _SALT, patient_ids, rollouts, steps)
        return normal_ppf(u + 2.0**-54)  # the uniforms lie in [0, 1): shift off 0 so Φ⁻¹ stays finite

    return rollout_major(logged, n_rollouts, fresh)

"""The PK-PD tumour-growth model of Geng et al. (2017, Sci. Rep. 7:13542) as RMSN (Lim et al. 2018), CRN (Bica et
al. 2020) and the Causal Transformer (Melnychuk et al. 2022) use it: constants, patient parameters, one day.

One day ``t`` of one patient (V: tumour volume in cm³, spherical; d: diameter in cm)::

    C_t     = C_{t-1} · exp(−ln 2 / half-life) + 5 · chemo_t            (chemotherapy concentration, half-life 1 day)
    d_t     = 2 Gy · radio_t                                            (radiotherapy dose)
    f_t     = 1 + ρ log(K / V_t) − β_c C_t − (α d_t + β d_t²) + e_t,    e_t = σ_e z_t, z_t ~ N(0, 1)
    V_{t+1} = clip(V_t · f_t, V_floor, V_death)

Gompertz growth with carrying capacity K = V(30 cm); the linear-quadratic radiotherapy kill with α/β = 10; an
exponential chemotherapy kill. Patients: (α, ρ) bivariate normal (correlation 0.87) truncated to α, ρ > 0,
``β_c = 0.028 + 0.0007 · N⁺``; three patient types, type 1 responding 10 % more to radiotherapy (α) and type 3 10 %
more to chemotherapy (β_c). Initial diameters come from stage-specific log-normals truncated to [0.3, 13] cm
(stage I: [0.3, 5] cm), stages in the proportions 1432/128/1306/7248/12840 (I/II/IIIA/IIIB/IV; Detterbeck & Gibson
2008).

Deviations from the published simulator, and why:

- **No death or recovery censoring.** RMSN/CRN end a trajectory when V passes V(13 cm) (death) or by a "recovery"
  draw; the valid-step mask then depends on treatment, so the arms of a counterfactual would have different
  lengths. Here lengths are drawn independently of treatment (as in DKT-Synth) and V is clipped to
  [V(1 mm), V(13 cm)]: a tumour at the death size stays there, one killed below 1 mm stays at the floor (from
  where it regrows, fast, by Gompertz). The clip also removes the negative volumes the published recursion
  produces when a radiosensitive patient (α ≳ 0.4) gets radiotherapy (f_t < 0).
- **The outcome.** RMSN/CRN predict the volume itself; Fed-CausalDiff needs a binary outcome, so
  ``Y_t = 1[d_{t+1} ≤ 3 cm]``: after day t's care the tumour is within the size of a T1 primary (TNM 8th ed.,
  lung: ≤ 3 cm in greatest dimension). It is a clinical response size that the whole treatment history moves
  (so multi-day effects differ from one-day effects), it depends on the patient's stage and growth rate (so
  effects are heterogeneous), and it is a function of the endogenous context (the next volume), so a simulator
  that replays the logged volumes under another policy gets it wrong. The volume stays in the data as the
  context A_t.
- Its expected value is exact: ``P(Y_t = 1 | state, a) = Φ((V_T1 / V_t − 1 − ρ log(K/V_t) + kill_t(a)) / σ_e)``
  (the clip does not move the event: V_floor ≤ V_T1 ≤ V_death).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "ACTION_LABELS", "CHEMO", "CONTEXT_NAMES", "D_MAX", "K_CAPACITY", "N_ACTIONS", "PatientParams", "RADIO", "STAGES",
    "V_DEATH", "V_FLOOR", "day", "diameter_of", "normal_cdf", "normal_ppf", "observed_contexts", "response_prob",
    "volume_of",
]


def volume_of(diameter: np.ndarray | float) -> np.ndarray:
    """Volume (cm³) of a sphere of ``diameter`` cm (float64; a numpy scalar for a scalar)."""
    return math.pi / 6.0 * np.asarray(diameter, dtype=np.float64) ** 3


def diameter_of(volume: np.ndarray) -> np.ndarray:
    """Diameter (cm) of a sphere of ``volume`` cm³."""
    return np.cbrt(6.0 / math.pi * np.asarray(volume, dtype=np.float64))


#: The four actions (ids 0..3): a policy names them by these labels.
ACTION_LABELS: tuple[str, ...] = ("none", "chemo", "radio", "both")
N_ACTIONS = len(ACTION_LABELS)
#: Whether action id a gives chemotherapy / radiotherapy.
CHEMO = np.array([0.0, 1.0, 0.0, 1.0])
RADIO = np.array([0.0, 0.0, 1.0, 1.0])

D_MAX = 13.0  # cm: the death size of RMSN/CRN, and the scale of the logging policy's sigmoid
V_DEATH = volume_of(D_MAX)  # 1150.35 cm³: also the normaliser of the published RMSE
K_CAPACITY = volume_of(30.0)  # Gompertz carrying capacity
V_FLOOR = volume_of(0.1)  # 1 mm across: below this the tumour is held at the floor
CHEMO_DOSE = 5.0
RADIO_DOSE = 2.0  # Gy
CHEMO_DECAY = math.exp(-math.log(2.0) / 1.0)  # half-life 1 day
ALPHA_BETA_RATIO = 10.0

STAGES: tuple[str, ...] = ("I", "II", "IIIA", "IIIB", "IV")
STAGE_COUNTS = np.array([1432.0, 128.0, 1306.0, 7248.0, 12840.0])
#: (μ, σ, lower, upper) of each stage's log-normal initial diameter (cm), as in RMSN/CRN
STAGE_DIAMETER = np.array([
    [1.72, 4.70, 0.3, 5.0],
    [1.96, 1.63, 0.3, 13.0],
    [1.91, 9.40, 0.3, 13.0],
    [2.76, 6.87, 0.3, 13.0],
    [3.86, 8.82, 0.3, 13.0],
])
ALPHA_MEAN, ALPHA_SD = 0.0398, 0.168
RHO_MEAN, RHO_SD = 7e-5, 7.23e-3
ALPHA_RHO_CORR = 0.87
BETA_C_MEAN, BETA_C_SD = 0.028, 0.0007
TYPE_BOOST = 0.1  # type 1: α × 1.1 (mean shift), type 3: β_c × 1.1


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Φ(x), float64."""
    return torch.special.ndtr(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()


def normal_ppf(u: np.ndarray) -> np.ndarray:
    """Φ⁻¹(u), float64."""
    return torch.special.ndtri(torch.from_numpy(np.asarray(u, dtype=np.float64))).numpy()


@dataclass(frozen=True)
class PatientParams:
    """The hidden PK-PD parameters of n patients (float64 ``[n]`` each)."""

    rho: np.ndarray
    alpha: np.ndarray
    beta_c: np.ndarray

    @property
    def beta(self) -> np.ndarray:
        """The quadratic radiotherapy coefficient β = α / 10."""
        return self.alpha / ALPHA_BETA_RATIO

    def take(self, idx: np.ndarray) -> "PatientParams":
        """The parameters of rows ``idx``."""
        return PatientParams(self.rho[idx], self.alpha[idx], self.beta_c[idx])

    def tile(self, reps: int) -> "PatientParams":
        """Each array repeated ``reps`` times end to end (the rollout-major layout: row ``r * n + i``)."""
        return PatientParams(np.tile(self.rho, reps), np.tile(self.alpha, reps), np.tile(self.beta_c, reps))


def kill_and_growth(params: PatientParams, V: np.ndarray, C: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(kill, growth)`` of day t: ``β_c C_t + α d_t + β d_t²`` and ``ρ log(K / V_t)`` (module docstring)."""
    d = RADIO_DOSE * RADIO[action]
    kill = params.beta_c * C + params.alpha * d + params.beta * d * d
    growth = params.rho * np.log(K_CAPACITY / V)
    return kill, growth


def day(
    params: PatientParams, V: np.ndarray, C_prev: np.ndarray, action: np.ndarray, z: np.ndarray, noise_sd: float,
    v_response: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One day under ``action`` (ids, int64 ``[B]``) with the standard normal noise ``z``.

    Returns:
        ``(V_next, C_t, p, y)``: next volume, today's chemotherapy concentration, the expected response
        ``P(Y_t = 1 | state, action)`` and the realised response ``Y_t = 1[V_{t+1} <= V_T1]`` (float64 0/1).
    """
    C = C_prev * CHEMO_DECAY + CHEMO_DOSE * CHEMO[action]
    kill, growth = kill_and_growth(params, V, C, action)
    V_next = np.clip(V * (1.0 + growth - kill + noise_sd * z), V_FLOOR, V_DEATH)
    p = normal_cdf((v_response / V - 1.0 - growth + kill) / noise_sd)
    return V_next, C, p, (V_next <= v_response).astype(np.float64)


def response_prob(
    params: PatientParams, V: np.ndarray, C_prev: np.ndarray, action: np.ndarray, noise_sd: float, v_response: float
) -> np.ndarray:
    """``P(Y_t = 1 | V_t, C_{t-1}, do(T_t = action))``, exact (module docstring)."""
    C = C_prev * CHEMO_DECAY + CHEMO_DOSE * CHEMO[action]
    kill, growth = kill_and_growth(params, V, C, action)
    return normal_cdf((v_response / V - 1.0 - growth + kill) / noise_sd)


#: The two context columns a clinic observes each morning (A_t), both endogenous (treatment changes them).
CONTEXT_NAMES: tuple[str, ...] = ("tumour_volume", "tumour_diameter")


def observed_contexts(V: np.ndarray) -> np.ndarray:
    """A_t from volumes ``V`` (any shape): ``[..., 2]`` float32, the volume over V_death (so an RMSE of this column
    × 100 is the published normalised RMSE) and the diameter over D_max = 13 cm."""
    V = np.asarray(V, dtype=np.float64)
    return np.stack([V / V_DEATH, diameter_of(V) / D_MAX], axis=-1).astype(np.float32)

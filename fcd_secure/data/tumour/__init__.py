"""The tumour world: the PK-PD tumour-growth simulator of Geng et al. (2017) as RMSN, CRN and the Causal Transformer
use it, federated over sites, with exact ground truth for any treatment sequence.

A second oracle from another domain beside DKT-Synth (:mod:`fcd_secure.data.dkt_synth`), built the same way: a known
structural model, a logging policy with time-varying confounding of strength γ, sites that differ in who they treat
and how, and common random numbers so that every counterfactual arm of a patient shares the patient's noise.

Structural model (one patient ``i`` at site ``s``; everything but X, A, T, Y, M, P is known to the simulator only)
-------------------------------------------------------------------------------------------------------------
* Site ``s``: a case mix (a tilt of the stage distribution towards earlier or later stages) and a practice (its own
  logit shifts for chemo- and radiotherapy); sizes from the project's Dirichlet rule (:mod:`.generation`).
* ``X_i`` (dx = 4): the patient type one-hot (type 1 responds more to radiotherapy, type 3 to chemotherapy) and the
  stage at diagnosis (I..IV as 0..1).
* Hidden: the PK-PD parameters ρ (growth), α, β (radiotherapy), β_c (chemotherapy) (:mod:`.pkpd`).
* ``A_t`` (da = 2): the tumour's volume (over the death volume V(13 cm) = 1150 cm³) and diameter (over 13 cm) on the
  morning of day t. Both **endogenous**: treatment changes them, so a rollout under a policy must simulate them.
* ``T_t ∈ {0: none, 1: chemo, 2: radio, 3: both}`` (labels: ``none``, ``chemo``, ``radio``, ``both``).
* Dynamics: Gompertz growth with chemo (exponential kill, concentration with a one-day half-life) and radiotherapy
  (linear-quadratic kill) and daily noise ``e_t ~ N(0, 0.01²)`` (:mod:`.pkpd`).
* ``Y_t = 1[d_{t+1} ≤ 3 cm]``: after day t the tumour is within the T1 size (:mod:`.pkpd` says why); its expected
  value given the state is exact.
* Lengths ``L_i ~ Uniform{min_len..L}``, independent of treatment (no death censoring: :mod:`.pkpd`).
* Logging policy: chemo and radio each with ``σ(γ/13 · (D̄_t − 6.5) + b_k + b_{s,k})``, D̄_t the mean diameter over
  the last 15 days (:mod:`.behaviour`); true propensities logged as ``P`` with a floor ε.
* Noise: :mod:`.noise` (replaying the logged actions reproduces the logged outcomes and volumes exactly).

Modules, one job each:

- :mod:`.pkpd`: the PK-PD model (constants, patient parameters, one day, the exact response probability);
- :mod:`.config`: ``TumourConfig`` and ``PRESETS``;
- :mod:`.noise`: the per-patient and counter-based random numbers;
- :mod:`.behaviour`: the logging policy and its propensities;
- :mod:`.truth`: the ground-truth kernels (regimes, policy values, replay);
- :mod:`.generation`: ``generate(cfg) -> TumourWorld``;
- :mod:`.world`: ``TumourWorld``, the object the rest of the code uses.

What the two worlds share (the config's common fields and checks, the common-random-number plumbing, sites, lengths
and splits, and the ground-truth interface with its validation and batching) is written once in
:mod:`fcd_secure.data.worlds`; these modules hold the tumour world's own mechanism.
"""

from fcd_secure.data.tumour.config import PRESETS, TumourConfig
from fcd_secure.data.tumour.generation import generate
from fcd_secure.data.tumour.pkpd import ACTION_LABELS, CONTEXT_NAMES, N_ACTIONS, V_DEATH
from fcd_secure.data.tumour.world import TumourWorld

__all__ = ["ACTION_LABELS", "CONTEXT_NAMES", "N_ACTIONS", "PRESETS", "TumourConfig", "TumourWorld", "V_DEATH",
           "generate"]

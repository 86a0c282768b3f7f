"""Everything that determines a carry-over world: :class:`CarryoverConfig` and its presets.

Same config (seed included) → the same patients, logged data and ground truth (:mod:`.generation`). The fields every
generated world has (sizes, sites, split, the effect window) and their checks are
:class:`~fcd_secure.data.worlds.config.WorldConfig`'s; this module adds the clinic's (:mod:`.behaviour`) and the
structural model's (:mod:`.model`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fcd_secure.data.carryover.model import N_ACTIONS
from fcd_secure.data.worlds.config import Split, WorldConfig, world_presets

__all__ = ["PRESETS", "CarryoverConfig", "Split"]

#: tiny, small and default as every world's (:func:`~fcd_secure.data.worlds.config.world_presets`): patients followed
#: for at most 30 steps (the horizon the regimens' order flips over) and a 10-step effect window from step 5.
#: ``paper``: there is no paper of this world; 10,000 patients, the size of RMSN/CRN/CT's tumour training sets.
PRESETS: dict[str, dict[str, Any]] = world_presets(
    "patient", paper=dict(n_patients=10000, max_len=30, anchor_step=5, horizon=10, n_rollouts=32)
)


class CarryoverConfig(WorldConfig):
    """Everything that determines a carry-over world (the structural model is in :mod:`fcd_secure.data.carryover`).

    Build it from a preset with :meth:`from_preset`; every field can be overridden. Invalid combinations raise
    ``pydantic.ValidationError`` naming the field. ``site_spread`` multiplies the case-mix shift and the practice
    shift. The mechanism's defaults put the first dose's benefit above its harm and a 30-step course's harm above its
    benefit (``docs/carryover.md``: the truth at h = 1 and h = 30).
    """

    WORLD = "carryover"
    ENTITY = "patient"
    N_ACTIONS = N_ACTIONS
    PRESETS = PRESETS

    n_patients: int = Field(3000, ge=2)
    gamma: float = Field(1.5, ge=0, description="confounding strength γ: the weight of the recorded severity, "
                         "toxicity and previous action in the clinic's logit (0: the clinic ignores the history)")
    epsilon: float = Field(0.02, ge=0, description="propensity floor per action, 0 <= eps <= 1/2 (issue 42: >= 2 %)")
    treat_bias: float = Field(-0.6, description="logit shift of treatment in the logging policy (all sites); keeps "
                              "\"none\" the most logged action, so the anchors are none/treat")
    site_practice_sd: float = Field(0.4, ge=0, description="s.d. of each site's own treatment logit shift")
    site_casemix_sd: float = Field(0.1, ge=0, description="s.d. of each site's shift of the log untreated severity")
    severity_level: float = Field(1.5, gt=0, description="median untreated severity μ_i")
    mean_reversion: float = Field(0.02, ge=0, lt=1, description="λ: rate at which severity drifts back to μ_i")
    dose_response: float = Field(0.4, gt=0, description="median severity reduction per dose r_i")
    toxicity_per_dose: float = Field(0.2, gt=0, description="median toxicity per dose κ_i")
    toxicity_retention: float = Field(0.94, ge=0, lt=1, description="ρ: share of toxicity kept from one step to the "
                                      "next")
    severity_weight: float = Field(1.5, gt=0, description="w_S: harm of a unit of severity on the outcome's logit")
    toxicity_weight: float = Field(1.1, gt=0, description="w_K: harm of squared toxicity on the outcome's logit")
    baseline_logit: float = Field(2.0, description="median baseline logit b_i of a good step")
    severity_noise: float = Field(0.05, ge=0, description="scale of the logistic severity noise per step")
    toxicity_noise: float = Field(0.02, ge=0, description="scale of the logistic toxicity noise per step")

"""Everything that determines a tumour world: :class:`TumourConfig` and its presets.

Same config (seed included) → the same patients, logged data and ground truth (:mod:`.generation`). The fields every
generated world has (sizes, sites, split, the effect window) and their checks are
:class:`~fcd_secure.data.worlds.config.WorldConfig`'s; this module adds the clinic's and the PK-PD model's.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fcd_secure.data.tumour.pkpd import D_MAX, N_ACTIONS
from fcd_secure.data.worlds.config import Split, WorldConfig, world_presets

__all__ = ["PRESETS", "Split", "TumourConfig"]

#: tiny, small and default as every world's (:func:`~fcd_secure.data.worlds.config.world_presets`): patients followed
#: for at most 30 days, and a 10-day effect window from day 5, long enough for chemotherapy to bring a 4-7 cm tumour
#: under the response size. ``paper``: the sizes of RMSN/CRN/CT (10,000 training + 1,000 validation + 1,000 test
#: patients, 60 days).
PRESETS: dict[str, dict[str, Any]] = world_presets(
    "patient", paper=dict(n_patients=12000, max_len=60, anchor_step=10, horizon=10, n_rollouts=32)
)


class TumourConfig(WorldConfig):
    """Everything that determines a tumour world (the structural model is in :mod:`fcd_secure.data.tumour`).

    Build it from a preset with :meth:`from_preset`; every field can be overridden. Invalid combinations raise
    ``pydantic.ValidationError`` naming the field. ``site_spread`` multiplies the case-mix tilt and the chemo and
    radio practice shifts.
    """

    WORLD = "tumour"
    ENTITY = "patient"
    N_ACTIONS = N_ACTIONS
    PRESETS = PRESETS

    n_patients: int = Field(3000, ge=2)
    gamma: float = Field(2.0, ge=0, description="confounding strength γ (CRN's chemo_coeff = radio_coeff)")
    window: int = Field(15, ge=1, description="days of diameter history the logging policy averages (CRN: 15)")
    epsilon: float = Field(0.01, ge=0, description="propensity floor per action, 0 <= eps <= 1/4")
    chemo_bias: float = Field(-0.3, description="logit shift of chemotherapy in the logging policy (all sites)")
    radio_bias: float = Field(-1.2, description="logit shift of radiotherapy in the logging policy (all sites); "
                              "1.0 below chemotherapy so that \"chemo\" stays the second anchor whatever the sites' "
                              "own shifts")
    site_practice_sd: float = Field(0.3, ge=0, description="s.d. of each site's own chemo/radio logit shifts")
    site_casemix_sd: float = Field(0.5, ge=0, description="s.d. of each site's tilt of the stage distribution")
    noise_sd: float = Field(0.01, gt=0, description="s.d. of the daily volume noise e_t (Geng et al.: 0.01)")
    response_diameter: float = Field(3.0, gt=0, lt=D_MAX, description="Y_t = 1 when the next diameter is at most "
                                     "this many cm (TNM T1)")

"""Everything that determines a DKT-Synth world: :class:`DKTSynthConfig` and its presets.

Same config (seed included) → the same students, logged data and ground truth (:mod:`.generation`). The fields every
generated world has (sizes, sites, split, the effect window) and their checks are
:class:`~fcd_secure.data.worlds.config.WorldConfig`'s; this module adds the tutor's and the outcome model's.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fcd_secure.data.dkt_synth.oracle import N_ITEMS
from fcd_secure.data.worlds.config import Split, WorldConfig, world_presets

__all__ = ["PRESETS", "DKTSynthConfig", "Split"]

#: tiny, small and default as every world's (:func:`~fcd_secure.data.worlds.config.world_presets`). Their 10-step
#: effect window: practising the harder anchor costs correctness now and pays later, so a 10-step window gives a
#: clearly non-zero ATE whose sign a one-step model gets wrong (seed 0: one-step a_on - a_off contrast -0.08, 10-step
#: ATE +0.07). ``paper``: Table I's 20,000 sequences, L = 50.
PRESETS: dict[str, dict[str, Any]] = world_presets(
    "student", paper=dict(n_students=20000, max_len=50, anchor_step=10, horizon=10, n_rollouts=32)
)


class DKTSynthConfig(WorldConfig):
    """Everything that determines a DKT-Synth world (the structural model is in :mod:`fcd_secure.data.dkt_synth`).

    Build it from a preset with :meth:`from_preset`; every field can be overridden. Invalid combinations raise
    ``pydantic.ValidationError`` naming the field. ``site_spread`` multiplies the sites' means of ability,
    confounder and covariate, the log of the confounder's s.d., the item biases and the anchor tilt.
    """

    WORLD = "DKT-Synth"
    ENTITY = "student"
    N_ACTIONS = N_ITEMS
    PRESETS = PRESETS

    n_students: int = Field(3000, ge=2)
    gamma: float = Field(1.5, ge=0, description="confounding strength of the logging policy")
    epsilon: float = Field(0.002, ge=0, description="propensity floor per action, 0 <= eps <= 1/50")
    readiness_cap: float = Field(1.0, gt=0, description="readiness r is squashed to (-cap, cap) by cap*tanh(r/cap)")
    mastery_cutoff: float = Field(0.97, gt=0, le=1, description="the tutor skips items mastered beyond this")
    beta_theta: float = Field(0.8, description="weight of ability in the outcome logit")
    beta_u: float = Field(1.0, description="weight of the hidden confounder in the outcome logit")
    boost_hard: float = Field(3.5, description="base logit of the designated harder item (an anchor candidate)")
    boost_easy: float = Field(3.9, description="base logit of the designated easier item (an anchor candidate)")
    site_item_bias_sd: float = Field(0.2, ge=0)
    site_anchor_tilt_sd: float = Field(0.4, ge=0, description="site-specific tilt between the two designated items")
    oracle_path: str | None = Field(None, description="weights file (default: the shipped, checksummed oracle)")

"""Everything that determines a DKT-Synth world: :class:`DKTSynthConfig` and its presets.

Same config (seed included) → the same students, logged data and ground truth (:mod:`.generation`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fcd_secure.data.dkt_synth.oracle import N_ITEMS

__all__ = ["PRESETS", "DKTSynthConfig", "Split"]

#: Which side of a site's train/test split.
Split = Literal["train", "test"]

PRESETS: dict[str, dict[str, Any]] = {
    # tests: generation + ground truth in about a second
    "tiny": dict(n_students=300, max_len=12, anchor_step=2, horizon=4, n_rollouts=8),
    # the default world with half the students and rollouts (``fcd reproduce --preset quick``): ~1,200 training
    # sequences, test splits of ~30 students per site (above the evaluation's cohort floor of 20)
    "small": dict(n_students=1500, max_len=30, anchor_step=5, horizon=10, n_rollouts=16),
    # the main federated run (10 sites): ~2,400 training sequences of <= 30 steps. Horizon 10: practising the
    # harder anchor costs correctness now and pays later, so a 10-step window gives a clearly non-zero ATE whose
    # sign a one-step model gets wrong (seed 0: one-step a_on - a_off contrast -0.08, 10-step ATE +0.07)
    "default": dict(n_students=3000, max_len=30, anchor_step=5, horizon=10, n_rollouts=32),
    # paper Table I: 20,000 sequences, L = 50
    "paper": dict(n_students=20000, max_len=50, anchor_step=10, horizon=10, n_rollouts=32),
}


class DKTSynthConfig(BaseModel):
    """Everything that determines a DKT-Synth world (the structural model is in :mod:`fcd_secure.data.dkt_synth`).

    Build it from a preset with :meth:`from_preset`; every field can be overridden. Invalid combinations raise
    ``pydantic.ValidationError`` naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = Field("default", description="name of the preset the config was built from (provenance only)")
    seed: int = Field(0, ge=0)
    n_students: int = Field(3000, ge=2)
    max_len: int = Field(30, ge=2, description="L: steps per sequence at most")
    min_len: int | None = Field(None, ge=1, description="shortest sequence; default ceil(L/2)")
    n_sites: int = Field(10, ge=1)
    dirichlet_alpha: float = Field(10.0, gt=0, description="site-size proportions ~ Dirichlet(alpha) (paper: 10)")
    test_fraction: float = Field(0.2, gt=0, lt=1)
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
    site_spread: float = Field(1.0, ge=0, le=20, description="multiplies every site-level spread (the sites' means of "
                               "ability, confounder and covariate, the log of the confounder's s.d., the item biases "
                               "and the anchor tilt); 0: sites differ in size only")
    anchor_step: int = Field(5, ge=0, description="t0 of true_effects")
    horizon: int = Field(10, ge=1, description="steps averaged by true_effects")
    n_rollouts: int = Field(32, ge=1)
    oracle_path: str | None = Field(None, description="weights file (default: the shipped, checksummed oracle)")

    @model_validator(mode="after")
    def _check(self) -> "DKTSynthConfig":
        if self.epsilon > 1.0 / N_ITEMS:
            raise ValueError(f"epsilon={self.epsilon} exceeds 1/{N_ITEMS}: a per-action floor above that is impossible")
        lo = self.resolved_min_len
        if lo > self.max_len:
            raise ValueError(f"min_len={lo} exceeds max_len={self.max_len}")
        if self.anchor_step >= lo:
            raise ValueError(f"anchor_step={self.anchor_step} must be < min_len={lo} so every student reaches it")
        if self.anchor_step + self.horizon > self.max_len:
            raise ValueError(f"anchor_step + horizon = {self.anchor_step + self.horizon} exceeds max_len={self.max_len}")
        per_site_min = 2
        if self.n_students < per_site_min * self.n_sites:
            raise ValueError(f"n_students={self.n_students} is too few for {self.n_sites} sites (>= 2 each)")
        return self

    @property
    def resolved_min_len(self) -> int:
        """The shortest sequence length: ``min_len``, or ⌈L/2⌉ when it is not set."""
        return self.min_len if self.min_len is not None else math.ceil(self.max_len / 2)

    @classmethod
    def from_preset(cls, name: str = "default", **overrides: Any) -> "DKTSynthConfig":
        """The config of preset ``name`` (:data:`PRESETS`) with ``overrides`` applied.

        Raises:
            ValueError: Unknown preset (``pydantic.ValidationError``, a ``ValueError``, for a bad override).
        """
        if name not in PRESETS:
            raise ValueError(f"unknown DKT-Synth preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(preset=name, **{**PRESETS[name], **overrides})

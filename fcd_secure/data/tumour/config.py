"""Everything that determines a tumour world: :class:`TumourConfig` and its presets.

Same config (seed included) → the same patients, logged data and ground truth (:mod:`.generation`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fcd_secure.data.tumour.pkpd import D_MAX, N_ACTIONS

__all__ = ["PRESETS", "Split", "TumourConfig"]

#: Which side of a site's train/test split.
Split = Literal["train", "test"]

PRESETS: dict[str, dict[str, Any]] = {
    # tests: generation + ground truth in well under a second
    "tiny": dict(n_patients=300, max_len=12, anchor_step=2, horizon=4, n_rollouts=8),
    # the main federated run (10 sites): ~2,400 training patients followed for at most 30 days; the 10-day effect
    # window from day 5 is long enough for chemotherapy to bring a 4-7 cm tumour under the response size
    "default": dict(n_patients=3000, max_len=30, anchor_step=5, horizon=10, n_rollouts=32),
    # the sizes of RMSN/CRN/CT (10,000 training + 1,000 validation + 1,000 test patients, 60 days)
    "paper": dict(n_patients=12000, max_len=60, anchor_step=10, horizon=10, n_rollouts=32),
}


class TumourConfig(BaseModel):
    """Everything that determines a tumour world (the structural model is in :mod:`fcd_secure.data.tumour`).

    Build it from a preset with :meth:`from_preset`; every field can be overridden. Invalid combinations raise
    ``pydantic.ValidationError`` naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = Field("default", description="name of the preset the config was built from (provenance only)")
    seed: int = Field(0, ge=0)
    n_patients: int = Field(3000, ge=2)
    max_len: int = Field(30, ge=2, description="L: days per trajectory at most")
    min_len: int | None = Field(None, ge=1, description="shortest trajectory; default ceil(L/2)")
    n_sites: int = Field(10, ge=1)
    dirichlet_alpha: float = Field(10.0, gt=0, description="site-size proportions ~ Dirichlet(alpha) (paper: 10)")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    gamma: float = Field(2.0, ge=0, description="confounding strength γ (CRN's chemo_coeff = radio_coeff)")
    window: int = Field(15, ge=1, description="days of diameter history the logging policy averages (CRN: 15)")
    epsilon: float = Field(0.01, ge=0, description="propensity floor per action, 0 <= eps <= 1/4")
    chemo_bias: float = Field(-0.3, description="logit shift of chemotherapy in the logging policy (all sites)")
    radio_bias: float = Field(-1.2, description="logit shift of radiotherapy in the logging policy (all sites); "
                              "1.0 below chemotherapy so that \"chemo\" stays the second anchor whatever the sites' "
                              "own shifts")
    site_practice_sd: float = Field(0.3, ge=0, description="s.d. of each site's own chemo/radio logit shifts")
    site_casemix_sd: float = Field(0.5, ge=0, description="s.d. of each site's tilt of the stage distribution")
    site_spread: float = Field(1.0, ge=0, le=20, description="multiplies every site-level spread (case-mix tilt, "
                               "chemo and radio practice shifts); 0: sites differ in size only")
    noise_sd: float = Field(0.01, gt=0, description="s.d. of the daily volume noise e_t (Geng et al.: 0.01)")
    response_diameter: float = Field(3.0, gt=0, lt=D_MAX, description="Y_t = 1 when the next diameter is at most "
                                     "this many cm (TNM T1)")
    anchor_step: int = Field(5, ge=0, description="t0 of true_effects")
    horizon: int = Field(10, ge=1, description="steps averaged by true_effects")
    n_rollouts: int = Field(32, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "TumourConfig":
        if self.epsilon > 1.0 / N_ACTIONS:
            raise ValueError(f"epsilon={self.epsilon} exceeds 1/{N_ACTIONS}: a per-action floor above that is impossible")
        lo = self.resolved_min_len
        if lo > self.max_len:
            raise ValueError(f"min_len={lo} exceeds max_len={self.max_len}")
        if self.anchor_step >= lo:
            raise ValueError(f"anchor_step={self.anchor_step} must be < min_len={lo} so every patient reaches it")
        if self.anchor_step + self.horizon > self.max_len:
            raise ValueError(f"anchor_step + horizon = {self.anchor_step + self.horizon} exceeds max_len={self.max_len}")
        if self.n_patients < 2 * self.n_sites:
            raise ValueError(f"n_patients={self.n_patients} is too few for {self.n_sites} sites (>= 2 each)")
        return self

    @property
    def resolved_min_len(self) -> int:
        """The shortest trajectory: ``min_len``, or ⌈L/2⌉ when it is not set."""
        return self.min_len if self.min_len is not None else math.ceil(self.max_len / 2)

    @classmethod
    def from_preset(cls, name: str = "default", **overrides: Any) -> "TumourConfig":
        """The config of preset ``name`` (:data:`PRESETS`) with ``overrides`` applied.

        Raises:
            ValueError: Unknown preset (``pydantic.ValidationError``, a ``ValueError``, for a bad override).
        """
        if name not in PRESETS:
            raise ValueError(f"unknown tumour preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(preset=name, **{**PRESETS[name], **overrides})

"""What every generated world's config has: :class:`WorldConfig` (sizes, sites, split, the effect window) and its
checks; a world's config adds the fields of its own mechanism.

Same config (seed included) → the same entities, logged data and ground truth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Split", "WorldConfig", "world_presets"]

#: Which side of a site's train/test split.
Split = Literal["train", "test"]


def world_presets(entity: str, paper: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """A generated world's ``PRESETS`` (preset name → field values; :meth:`WorldConfig.from_preset`).

    ``tiny``, ``small`` and ``default`` are the same for every world (entity count, length, effect window, rollouts),
    so that a preset costs alike whichever world a run picks; ``paper`` is each world's own sizes (``paper``: its
    ``n_<entity>s``, ``max_len``, ``anchor_step``, ``horizon`` and ``n_rollouts``).
    """
    n = f"n_{entity}s"
    return {
        # tests: generation + ground truth in about a second
        "tiny": {n: 300, "max_len": 12, "anchor_step": 2, "horizon": 4, "n_rollouts": 8},
        # the default world with half the entities and rollouts (``fcd reproduce --preset quick``, ``fcd data
        # export``'s default): ~1,200 training sequences, test splits of ~30 entities per site (above the
        # evaluation's cohort floor of 20)
        "small": {n: 1500, "max_len": 30, "anchor_step": 5, "horizon": 10, "n_rollouts": 16},
        # the main federated run (10 sites): ~2,400 training sequences of <= 30 steps, a 10-step effect window from
        # step 5 (each world's config says why 10 steps)
        "default": {n: 3000, "max_len": 30, "anchor_step": 5, "horizon": 10, "n_rollouts": 32},
        "paper": dict(paper),
    }


class WorldConfig(BaseModel):
    """The fields and checks shared by the generated worlds' configs.

    A world's config sets the class attributes below, declares its entity count ``n_<ENTITY>s`` (``n_students``,
    ``n_patients``) and its own ``gamma`` and ``epsilon`` (their defaults differ by world, and say why there), and adds
    the fields of its mechanism. Build one from a preset with :meth:`from_preset`; every field can be overridden.
    Invalid combinations raise ``pydantic.ValidationError`` naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The world's name in messages ("DKT-Synth", "tumour").
    WORLD: ClassVar[str]
    #: What one trajectory belongs to ("student", "patient"); the entity count is the field ``n_<ENTITY>s``.
    ENTITY: ClassVar[str]
    #: |T|: the number of actions (bounds the propensity floor ε).
    N_ACTIONS: ClassVar[int]
    #: Preset name → field values (the world's ``PRESETS``).
    PRESETS: ClassVar[dict[str, dict[str, Any]]]

    preset: str = Field("default", description="name of the preset the config was built from (provenance only)")
    seed: int = Field(0, ge=0)
    max_len: int = Field(30, ge=2, description="L: steps (days) per trajectory at most")
    min_len: int | None = Field(None, ge=1, description="shortest trajectory; default ceil(L/2)")
    n_sites: int = Field(10, ge=1)
    dirichlet_alpha: float = Field(10.0, gt=0, description="site-size proportions ~ Dirichlet(alpha) (paper: 10)")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    #: confounding strength of the logging policy and its per-action propensity floor (each world sets both)
    gamma: float
    epsilon: float
    site_spread: float = Field(1.0, ge=0, le=20, description="multiplies every site-level spread (the world's config "
                               "docstring lists them); 0: sites differ in size only")
    anchor_step: int = Field(5, ge=0, description="t0 of true_effects")
    horizon: int = Field(10, ge=1, description="steps averaged by true_effects")
    n_rollouts: int = Field(32, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.epsilon > 1.0 / self.N_ACTIONS:
            raise ValueError(f"epsilon={self.epsilon} exceeds 1/{self.N_ACTIONS}: a per-action floor above that is "
                             "impossible")
        lo = self.resolved_min_len
        if lo > self.max_len:
            raise ValueError(f"min_len={lo} exceeds max_len={self.max_len}")
        if self.anchor_step >= lo:
            raise ValueError(f"anchor_step={self.anchor_step} must be < min_len={lo} so every {self.ENTITY} reaches it")
        if self.anchor_step + self.horizon > self.max_len:
            raise ValueError(f"anchor_step + horizon = {self.anchor_step + self.horizon} exceeds max_len={self.max_len}")
        if self.n_entities < 2 * self.n_sites:
            raise ValueError(f"n_{self.ENTITY}s={self.n_entities} is too few for {self.n_sites} sites (>= 2 each)")
        return self

    @property
    def n_entities(self) -> int:
        """The number of entities (``n_students``, ``n_patients``)."""
        return getattr(self, f"n_{self.ENTITY}s")

    @property
    def resolved_min_len(self) -> int:
        """The shortest trajectory: ``min_len``, or ⌈L/2⌉ when it is not set."""
        return self.min_len if self.min_len is not None else math.ceil(self.max_len / 2)

    @classmethod
    def from_preset(cls, name: str = "default", **overrides: Any) -> Self:
        """The config of preset ``name`` (the world's ``PRESETS``) with ``overrides`` applied.

        Raises:
            ValueError: Unknown preset (``pydantic.ValidationError``, a ``ValueError``, for a bad override).
        """
        if name not in cls.PRESETS:
            raise ValueError(f"unknown {cls.WORLD} preset {name!r}; choose one of {sorted(cls.PRESETS)}")
        return cls(preset=name, **{**cls.PRESETS[name], **overrides})

"""Site-pinned policy of secure aggregation (Bonawitz et al., CCS 2017 §4; DESIGN.md P3, P6, P10, P17).

The *site* decides what it will accept; the server only proposes round parameters, and a site refuses a
round whose parameters are weaker than its :class:`SecAggPolicy` (a server asking for threshold 1, a smaller
modulus, a wider clip range or fewer than three sites gets a :class:`~.errors.PolicyError`).

Fixed point (see :mod:`.encoding`): a site multiplies its clipped input (the carrier sends the *update*
Θc_i − Θc_global, so the clip range bounds one round's change, not the parameters) by its weight ``w = n_i / max_weight``
(so ``0 < w <= 1``), scales by ``2**scale_bits`` and rounds; each encoded word is a signed integer of
magnitude at most ``B = clip * 2**scale_bits`` carried mod ``2**modulus_bits``. The sum over ``n`` sites
decodes without wrap-around iff ``n * B < 2**(modulus_bits - 1)``; that is checked when a round is configured
(:meth:`SecAggPolicy.check_overflow`) and a round that could wrap is refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import PolicyError


class StageDeadlines(BaseModel):
    """Per-stage deadlines in seconds (P17). A site that has not answered by then is a dropout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: float = Field(600.0, gt=0, description="local training before the protocol starts")
    advertise_keys: float = Field(30.0, gt=0)
    share_keys: float = Field(30.0, gt=0)
    masked_input: float = Field(120.0, gt=0)
    consistency: float = Field(30.0, gt=0)
    unmask: float = Field(60.0, gt=0)

    def for_stage(self, stage: str) -> float:
        if stage not in type(self).model_fields:
            raise KeyError(f"unknown secure-aggregation stage {stage!r}")
        return float(getattr(self, stage))


class SecAggPolicy(BaseModel):
    """What a site accepts in a secure-aggregation round. Pinned in the site's own config.

    ``threshold_rule``: ``majority`` is t >= floor(n/2) + 1 (two groups of signers on different survivor
    sets cannot both reach t, which is what defeats split views, P1); ``two_thirds`` is the malicious-model
    super-majority t >= floor(2n/3) + 1 of Bonawitz et al. §6.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_sites: int = Field(3, ge=3, description="fewest sites in a secure round (P10: n=2 leaks by subtraction)")
    max_sites: int = Field(31, ge=3, description="most sites in one round; bounds the overflow check")
    threshold_rule: Literal["majority", "two_thirds"] = "majority"
    modulus_bits: Literal[32] = Field(32, description="arithmetic mod 2**32 over uint32 words (4 B/parameter)")
    clip: float = Field(1.0, gt=0, le=2.0**20, description="each value entering the vector (a Θc update) is clipped to [-clip, clip]")
    scale_bits: int = Field(26, ge=1, le=30, description="fixed-point scale 2**scale_bits")
    max_weight: int = Field(
        1 << 15, ge=1, description="largest sample count a site may weigh with (a larger site must raise it, and "
        "every site must pin the same value); precision per value is about n_sites * max_weight / (2**scale_bits * Σn)"
    )
    deadlines: StageDeadlines = Field(default_factory=StageDeadlines)

    @model_validator(mode="after")
    def _fits_its_own_bound(self) -> "SecAggPolicy":
        if self.max_sites < self.min_sites:
            raise ValueError(f"max_sites ({self.max_sites}) < min_sites ({self.min_sites})")
        if self.max_overflow_sites() < self.min_sites:
            raise ValueError(
                f"clip={self.clip} with scale_bits={self.scale_bits} leaves room for only "
                f"{self.max_overflow_sites()} sites mod 2**{self.modulus_bits}; lower clip or scale_bits"
            )
        return self

    # -- derived bounds -----------------------------------------------------------------------------
    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    @property
    def word_bound(self) -> int:
        """Largest magnitude of one site's encoded word, B = ceil(clip * 2**scale_bits)."""
        return int(-(-self.clip * self.scale // 1))

    def max_overflow_sites(self) -> int:
        """Largest n with n * max(B, max_weight) < 2**(modulus_bits-1): the sum cannot wrap."""
        half = 2 ** (self.modulus_bits - 1)
        per_site = max(self.word_bound, self.max_weight)
        return (half - 1) // per_site

    def min_threshold(self, n_sites: int) -> int:
        if self.threshold_rule == "two_thirds":
            return (2 * n_sites) // 3 + 1
        return n_sites // 2 + 1

    def check_overflow(self, n_sites: int) -> None:
        """Refuse a round of ``n_sites`` whose sum could wrap mod 2**modulus_bits (P6)."""
        limit = self.max_overflow_sites()
        if n_sites > limit:
            raise PolicyError(
                f"{n_sites} sites could overflow mod 2**{self.modulus_bits} "
                f"(clip={self.clip}, scale_bits={self.scale_bits}, max_weight={self.max_weight}: at most {limit})"
            )

    def check_round(
        self,
        *,
        n_sites: int,
        threshold: int,
        modulus_bits: int,
        clip: float,
        scale_bits: int,
        max_weight: int,
    ) -> None:
        """Raise :class:`PolicyError` naming the first field where the server's proposal is below policy."""
        if n_sites < self.min_sites:
            raise PolicyError(f"n_sites={n_sites} is below the policy minimum of {self.min_sites} sites (P10)")
        if n_sites > self.max_sites:
            raise PolicyError(f"n_sites={n_sites} is above the policy maximum of {self.max_sites} sites")
        need = self.min_threshold(n_sites)
        if threshold < need:
            raise PolicyError(f"threshold={threshold} is below the policy minimum {need} for {n_sites} sites (P3)")
        if threshold > n_sites:
            raise PolicyError(f"threshold={threshold} exceeds n_sites={n_sites}")
        if modulus_bits != self.modulus_bits:
            raise PolicyError(f"modulus_bits={modulus_bits}, the site's policy pins {self.modulus_bits} (P3)")
        if clip != self.clip:
            raise PolicyError(f"clip={clip}, the site's policy pins {self.clip} (P3)")
        if scale_bits != self.scale_bits:
            raise PolicyError(f"scale_bits={scale_bits}, the site's policy pins {self.scale_bits} (P3)")
        if max_weight != self.max_weight:
            raise PolicyError(f"max_weight={max_weight}, the site's policy pins {self.max_weight} (P3)")
        self.check_overflow(n_sites)

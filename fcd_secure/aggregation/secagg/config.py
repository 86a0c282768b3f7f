"""Site-pinned policy of secure aggregation (Bonawitz et al., CCS 2017 §4 and §6; docs/threats.md P3, P6, P10, P17, P19).

The *site* decides what it will accept; the server only proposes round parameters, and a site refuses a
round whose parameters are weaker than its :class:`SecAggPolicy` (a server asking for a threshold below the
two-thirds rule, a smaller modulus, a wider clip range or fewer than four sites gets a
:class:`~.errors.PolicyError`).

Threshold and minimum number of sites (active adversary: the server plus ``C`` colluding sites). With ``n``
selected sites and threshold ``t``:

* *split view* (P1, P19): to learn one honest site's update the server needs ``t`` signatures on a survivor
  list that names it alive (its self-mask seed b_u) and ``t`` signatures on one that names it dropped (its mask
  key s_u^SK). The colluders sign both; the honest signers of the two lists are disjoint, so
  ``2 (t - C) <= n - C``, i.e. the attack needs ``C >= 2t - n``. Under ``majority`` (t = floor(n/2) + 1) one
  colluder suffices for n = 5 (t = 3): each half of the honest sites plus the colluder reaches t. Under
  ``two_thirds`` (t = floor(2n/3) + 1, the active-model super-majority of Bonawitz et al. §6) the attack needs
  more than n/3 colluders, so at most ``C = 2t - n - 1`` are tolerated;
* *reconstruction*: fewer than t colluders hold fewer than t shares of any secret;
* *small sums* (P10): every accepted sum has at least t survivors, at least ``t - C`` of them honest, and it must
  never isolate one honest input. With ``t - 1`` colluders (the most that cannot reconstruct a secret on their
  own) the selected set keeps ``n - (t - 1)`` honest sites, and ``n - (t - 1) >= 2`` iff ``t <= n - 1`` iff
  ``floor(2n/3) <= n - 2``: false for n = 3 (t = 3: the server and two colluders read the third input off any
  sum), true from n = 4 (t = 3: two honest inputs). Hence at least **four sites** in a secure round. (Under the old
  ``majority`` rule n = 3 had t = 2: the server and one colluder learned the third update as soon as the second
  honest site timed out.)

Together: a round withstands ``C <= min(2t - n - 1, t - 2)`` colluding sites (:meth:`SecAggPolicy.tolerated_colluders`;
n = 4, 5, 7, 10 with the default threshold: 1, 2, 2, 3), and ``two_thirds`` is both the default and the weakest
rule a site accepts.

Fixed point (see :mod:`.encoding`): a site multiplies its clipped input (the carrier sends the *update*
Θc_i − Θc_global, so the clip range bounds one round's change, not the parameters) by its weight ``w = n_i / max_weight``
(so ``0 < w <= 1``), scales by ``2**scale_bits`` and rounds; each encoded word is a signed integer of
magnitude at most ``B = clip * 2**scale_bits`` carried mod ``2**modulus_bits``. The sum over ``n`` sites
decodes without wrap-around iff ``n * B < 2**(modulus_bits - 1)``; that is checked when a round is configured
(:meth:`SecAggPolicy.check_overflow`) and a round that could wrap is refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import PolicyError

#: fewest sites of a secure round: with t = floor(2n/3) + 1, n - (t - 1) >= 2 needs n >= 4 (module docstring)
MIN_SITES = 4


class StageDeadlines(BaseModel):
    """Per-stage deadlines in seconds (P17). A site that has not answered by then is a dropout.

    A stage's own field bounds the site's work on it; every protocol message's deadline adds ``site_start``, the
    time a site takes to take a message up before any work starts (:meth:`for_message`). A site whose executor
    starts a fresh ClientApp process per message (``fcd site start --cold``, ``engines.site_exec``) imports torch
    and Flower for every message: about 3 s on a quiet 2-core machine, 53 s at load average 18 (measured,
    ``benchmarks/federation.py --deployment``), so a 30 s stage deadline alone dropped every such site at
    ``advertise_keys`` on a loaded host, and a hospital's host can be loaded too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: float = Field(600.0, gt=0, description="local training before the protocol starts")
    advertise_keys: float = Field(30.0, gt=0, description="stage 0: the sites' signed round keys (Bonawitz et al. §4)")
    share_keys: float = Field(30.0, gt=0, description="stage 1: the encrypted Shamir shares to relay")
    masked_input: float = Field(120.0, gt=0, description="stage 2: the masked vectors")
    consistency: float = Field(30.0, gt=0, description="stage 3: signatures on the survivor list")
    unmask: float = Field(60.0, gt=0, description="stage 4: the shares that unmask the sum")
    site_start: float = Field(
        120.0, ge=0, description="added to every protocol message's deadline: a site's time to take the message up "
        "(a cold executor starts a ClientApp process per message: ~3 s quiet, ~55 s on a loaded 2-core host)")

    def for_stage(self, stage: str) -> float:
        """The site's work on ``stage`` (one of the five stages or ``train``), without its start."""
        if stage not in type(self).model_fields or stage == "site_start":
            raise KeyError(f"unknown secure-aggregation stage {stage!r}")
        return float(getattr(self, stage))

    def for_message(self, work_s: float) -> float:
        """The deadline of one message whose stages' work is bounded by ``work_s`` (the stages' own deadlines,
        summed where the site does them one after the other): that plus ``site_start``."""
        return float(work_s) + self.site_start


class SecAggPolicy(BaseModel):
    """What a site accepts in a secure-aggregation round. Pinned in the site's own config.

    ``threshold_rule``: ``two_thirds`` is t >= floor(2n/3) + 1 (Bonawitz et al. §6, active model). It is the only
    rule accepted: ``majority`` (t >= floor(n/2) + 1) lets one colluding site sign two survivor views and the
    server unmask every honest update (P19; arithmetic in the module docstring), so a site pinned to it is a
    configuration error. ``min_sites`` is at least 4 for the same reason (P10).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_sites: int = Field(
        MIN_SITES, ge=MIN_SITES,
        description="fewest sites in a secure round (P10: t - 1 colluders must leave >= 2 honest inputs, so >= 4)",
    )
    max_sites: int = Field(31, ge=MIN_SITES, description="most sites in one round; bounds the overflow check")
    threshold_rule: Literal["two_thirds"] = Field(
        "two_thirds", description="t >= floor(2n/3) + 1 (Bonawitz et al. §6); 'majority' is refused (P19)"
    )
    modulus_bits: Literal[32] = Field(32, description="arithmetic mod 2**32 over uint32 words (4 B/parameter)")
    clip: float = Field(1.0, gt=0, le=2.0**20, description="each value entering the vector (a Θc update) is clipped to [-clip, clip]")
    scale_bits: int = Field(26, ge=1, le=30, description="fixed-point scale 2**scale_bits")
    max_weight: int = Field(
        1 << 15, ge=1, description="largest sample count a site may weigh with (a larger site must raise it, and "
        "every site must pin the same value); precision per value is about n_sites * max_weight / (2**scale_bits * Σn)"
    )
    deadlines: StageDeadlines = Field(default_factory=StageDeadlines)

    @field_validator("threshold_rule", mode="before")
    @classmethod
    def _no_weaker_rule(cls, v: object) -> object:
        if v == "majority":
            raise ValueError(
                "threshold_rule='majority' is refused: with it one colluding site signs two survivor views and the "
                "server unmasks every honest update (P19); use 'two_thirds' (t >= floor(2n/3) + 1)"
            )
        return v

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
        """The smallest threshold this site accepts for ``n_sites``: floor(2n/3) + 1 (Bonawitz et al. §6)."""
        return (2 * n_sites) // 3 + 1

    @staticmethod
    def tolerated_colluders(n_sites: int, threshold: int) -> int:
        """How many colluding sites a round of ``n_sites`` with ``threshold`` withstands (module docstring):
        ``2t - n - 1`` against a split view (P19), ``t - 2`` so that every accepted sum keeps two honest inputs."""
        return max(0, min(2 * threshold - n_sites - 1, threshold - 2))

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

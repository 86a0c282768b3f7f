"""The ``[dp]`` table of a run configuration: optional record-level DP-SGD on every site.

Sites may train with DP-SGD (Opacus 1.6) and each keeps its own budget. The choices fixed here:

* Poisson sampling: Opacus' accountants assume it; shuffled fixed-size batches would need a different (much
  larger) ε (Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson Subsampling", NeurIPS 2024), so turning it off is
  refused rather than silently mis-reported.
* ``grad_sample_mode="hooks"``: exact per-sample gradients, the fastest mode on CPU for this model, and the one
  that handles empty Poisson batches and ``wrap_model=False``.
* PRV accountant by default (Gopi et al. 2021, the tightest in Opacus); RDP (Mironov 2017) as the conservative
  alternative. GDP is not offered: Opacus itself warns it can underestimate.
* δ defaults to a power of ten ≤ 1/(10·n_site) (the Opacus FAQ's rule of thumb δ < 1/N, tightened by 10×).
* Batch-coupled losses: the MMD balancing term L_align (paper §III-A) couples samples of a batch, so one record
  moves every other record's gradient and per-sample clipping no longer bounds its influence (the Opacus
  grad-sample README excludes batch-coupled computations; Kong et al. 2023, arXiv 2310.03104). Under DP it is
  either ``"off"`` or replaced by a per-sample kernel distance to a fixed, data-free ``"reference"`` set (the
  model's ``ModelConfig.align_under_dp``).
* Noise seed: a known seed would let whoever knows it regenerate and subtract the Gaussian noise. By default the
  noise generator is seeded from a secret kept in the site's state directory together with the run seed and the
  round, so a site re-running with the same state and seed reproduces its numbers and nobody else can.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AccountantName = Literal["prv", "rdp"]
AlignUnderDP = Literal["off", "reference"]
NoiseSeed = Literal["site_secret", "run_seed"]


class DPConfig(BaseModel):
    """Record-level DP-SGD settings shared by all sites of a run (the ``[dp]`` table).

    ``epsilon`` is each site's lifetime cap: the ledger of a site's dataset never goes above it, across rounds,
    restarts and new runs on the same data.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Train every site's local step with DP-SGD (Opacus).")
    epsilon: float = Field(8.0, gt=0, le=100, description="Lifetime ε cap of each site's dataset.")
    run_epsilon: float | None = Field(
        None,
        gt=0,
        le=100,
        description="The ε this run may add to each site's spend, a share of its lifetime cap: σ is planned so that "
        "the site's worst record ends the run at most this much above what it had spent. A site with less left "
        "refuses the run (the server may ask for less, never more than a site has left). None: up to the cap.",
    )
    delta: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="δ of the (ε, δ) guarantee; default: the largest power of ten ≤ 1/(10·n_site).",
    )
    delta_max: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="The site's δ ceiling, set by each site from its own policy (federation.site_policy), never by "
        "the server: the default δ is lowered to it and a larger δ is refused. None: no ceiling beyond δ < 1/n_site.",
    )
    clip: float = Field(1.0, gt=0, description="Per-sample L2 clipping norm C.")
    accountant: AccountantName = Field("prv", description="Opacus accountant: 'prv' (tightest) or 'rdp'.")
    poisson: bool = Field(True, description="Poisson sampling; required for the reported ε to be valid.")
    ledger_dir: str | None = Field(
        None,
        description="Persistent folder of the per-dataset privacy ledgers (keyed by dataset fingerprint). Default: "
        "each site's state directory, which must then outlive runs, or a new run would start a new budget.",
    )
    max_noise_multiplier: float = Field(
        10.0,
        gt=0,
        description="Refuse a planned use that would need a larger σ (what is left of the budget is too small).",
    )
    grad_sample_mode: Literal["hooks"] = Field("hooks", description="Opacus per-sample gradient mode.")
    align_under_dp: AlignUnderDP = Field(
        "off",
        description="The batch-coupled MMD term L_align under DP: 'off', or 'reference' (per-sample, fixed reference).",
    )
    noise_seed: NoiseSeed = Field(
        "site_secret",
        description="Seed of the Gaussian noise: a site-local secret mixed with the run seed, or the run seed alone "
        "(reproducible by anyone who knows it: tests and benchmarks only).",
    )

    @model_validator(mode="after")
    def _poisson_only(self) -> "DPConfig":
        if not self.poisson:
            # Reporting a Poisson-subsampled ε for shuffled batches under-states the loss (Chua et al. 2024).
            raise ValueError("dp.poisson = false is not supported: the accountants assume Poisson sampling")
        return self

    def resolve_delta(self, n_site: int) -> float:
        """δ for a site of ``n_site`` trajectories; refuses a δ that could release a whole record (δ ≥ 1/n) or one
        above the site's ceiling ``delta_max`` (to which the default δ is lowered)."""
        if n_site < 1:
            raise ValueError(f"dp: a site needs at least one trajectory, got n_site={n_site}")
        if self.delta is None:
            rule = 10.0 ** math.floor(math.log10(1.0 / (10.0 * n_site)))
            return rule if self.delta_max is None else min(rule, float(self.delta_max))
        if self.delta_max is not None and self.delta > self.delta_max:
            raise ValueError(f"dp.delta = {self.delta:g} is above the site's ceiling dp.delta_max = {self.delta_max:g}")
        if self.delta >= 1.0 / n_site:
            raise ValueError(
                f"dp.delta = {self.delta:g} is ≥ 1/n_site = {1.0 / n_site:g}: such a δ allows releasing a record; "
                f"use δ ≤ 1/(10·n_site) = {1.0 / (10 * n_site):g}"
            )
        return float(self.delta)

"""``ModelConfig``: every knob of the Fed-CausalDiff network and its local objective (paper §III-B, §III-C).

One pydantic model so that a run's TOML/YAML section validates with field names in the error, and so that an
ablation is a config diff (switch a loss off, change the transition kind) rather than a code path.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Every key of ``fcd_secure.model.baselines.SIMULATORS`` and whether that simulator trains Fed-CausalDiff's local
#: objective (so DP-SGD, ``privacy.engine``, applies to it). Kept here, without torch, so that a config is validated
#: before any heavy import (a typo is refused in well under a second); ``tests/test_cli_errors.py`` holds it equal
#: to the classes.
SIMULATOR_KEYS: dict[str, bool] = {
    "fed_causaldiff": True, "gformula": True, "naive": False, "crn": False, "rcgan": False, "timegan": False,
    "fedcm": False,
}

#: the keys of the free-running loss (model/free_running.py), added after ``context_head``: a run folder's full dump
#: from before they existed lacks them (read back as the loss off)
FREE_RUNNING_KEYS = ("free_running_steps", "lambda_free_running", "free_running_stride", "free_running_discount")
#: a key added after ``context_head`` whose off value (False) is the model from before it existed
ORDER_KEY = "outcome_reads_contexts"


class ModelConfig(BaseModel):
    """Dimensions, diffusion schedule, loss weights and switches of Fed-CausalDiff.

    Loss weights follow the paper's local objective (§III-C)::

        L = L_recon + λ_diff·L_diff + λ1·L_align + λ2·L_dis + λ3·L_cf (+ λ_context·L_context)

    and each term has a ``use_*`` switch for ablations (w/o L_dis, w/o L_cf, ...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    simulator: str = Field(
        "fed_causaldiff",
        description=(
            "which causal simulator a run trains and federates: a key of fcd_secure.model.baselines.SIMULATORS "
            "(fed_causaldiff, gformula, naive, crn, rcgan, timegan, fedcm); the size knobs below size every one"
        ),
    )

    # -- dimensions --------------------------------------------------------------------------------------
    k_causal: int = Field(8, ge=1, description="dim of K^(c), the shared causal latent")
    k_site: int = Field(4, ge=1, description="dim of K^(s), the site-local confounding latent")
    hidden: int = Field(64, ge=2, description="GRU trunk width")
    action_emb: int = Field(8, ge=1, description="embedding size of the categorical action T_t")
    mlp_hidden: int = Field(64, ge=2, description="width of the ε-nets, decoder and heads")
    time_emb: int = Field(16, ge=2, description="sinusoidal embedding size of the diffusion step n")

    decoder_head: Literal["per_action", "embedding"] = Field(
        "per_action",
        description=(
            "'per_action': one read-out per action from (K_t, A_t), the taken action's gathered (DKT-style, extrapolates "
            "linearly to states where an action was never logged); 'embedding': an MLP over (K_t, A_t, emb(T_t))"
        ),
    )
    outcome: Literal["binary", "gaussian"] = Field("binary", description="Bernoulli logits or Gaussian mean for Y_t")

    # -- Phase B: transition -----------------------------------------------------------------------------
    transition: Literal["diffusion", "deterministic"] = Field(
        "diffusion",
        description="'diffusion' is Fed-CausalDiff (eq. 1); 'deterministic' is the GRU g-formula baseline, and the "
        "default of the tumour and carry-over worlds (config.WORLD_DEFAULTS: `fcd select` chose it there)",
    )
    transition_given_y: bool = Field(
        False,
        description=(
            "condition the transition on the step's outcome: K_{t+1} ~ p_Θ(·|K_t, A_t, do(T_t), Y_t), with Y_t drawn "
            "from the decoder in rollouts. False is the paper's p_Θ(·|K_t, A_t, do(T_t)), whose K_{t+1} must then carry "
            "P(Y_t | K_t, T_t) as the mode weights of a bimodal latent distribution (docs/fidelity.md)"
        ),
    )
    diffusion_steps: int = Field(50, ge=2, description="N, number of forward-noising steps")
    schedule: Literal["linear", "cosine"] = Field(
        "cosine", description="noise schedule of the forward diffusion: cosine (Nichol & Dhariwal 2021) or linear β"
    )
    beta_start: float = Field(1e-4, gt=0, lt=1, description="β_1 of the linear schedule (Ho et al. 2020)")
    beta_end: float = Field(0.02, gt=0, lt=1, description="β_N of the linear schedule (Ho et al. 2020)")
    diff_samples: int = Field(2, ge=1, description="diffusion steps n drawn per (patient, t); kept as a [B, L, K, F] axis")

    # -- loss weights and switches -----------------------------------------------------------------------
    lambda_diff: float = Field(1.0, ge=0, description="λ_diff, the weight of L_diff (§III-C)")
    lambda_align: float = Field(0.05, ge=0, description="λ1")
    lambda_dis: float = Field(0.1, ge=0, description="λ2")
    lambda_cf: float = Field(1.0, ge=0, description="λ3")
    use_recon: bool = True
    use_diff: bool = True
    use_align: bool = True
    use_dis: bool = True
    use_cf: bool = True
    use_context: bool = Field(
        True,
        description=(
            "learn the context head (L_context) and generate the endogenous contexts in rollouts (g-computation); "
            "off replays every context from the log, as the paper's rollout does"
        ),
    )
    lambda_context: float = Field(1.0, ge=0, description="weight of L_context (the endogenous contexts' MSE)")
    exposure_decays: tuple[float, ...] = Field(
        (),
        description=(
            "the encoder also reads, per action a and decay λ here, the decayed count of the actions taken before "
            "t, e_t(a) = Σ_{s<t} λ^(t−1−s)·1[T_s = a] (λ = 1: the cumulative count): the lagged and cumulative "
            "treatment history a parametric g-formula's models condition on (Taubman et al. 2009; gfoRmula's "
            "'lag' and 'cumavg' histories, McGrath et al. 2020), so that a treatment whose action decays over days "
            "is a function of the encoder's input, fed back in rollouts, rather than something the GRU must "
            "carry over untreated courses longer than the logs hold; empty (the default): the paper's encoder. "
            "Measured on the tumour world with [0.5, 0.9]: always − never error 0.067 → 0.044 on seeds 3-8, but "
            "worse on seeds 0-2 and 9-11, no gain over all 15 runs (docs/benchmarks.md, 'Per-world defaults')"
        ),
    )
    context_head: Literal["affine", "direct"] = Field(
        "affine",
        description=(
            "form of the context head: 'affine' Â_{t+1} = A_t·(1 + tanh m) + b with (b, m) = g(K_t, T_t, Y_t), which "
            "starts as carry forward (its last layer is zero-initialised); 'direct' Â_{t+1} = g(K_t, A_t, T_t, Y_t), "
            "a free regression of the next value. Affine by measurement on the tumour oracle "
            "(model/context.py, docs/tumour.md)"
        ),
    )

    outcome_reads_contexts: bool = Field(
        True,
        description=(
            "order of a simulated step where the data has endogenous contexts: draw the step's next contexts first, "
            "Â_{t+1} ~ p(A_{t+1} | H_t, do(T_t)) (the context head then reads no Y_t), and let the decoder read them, "
            "Y_t ~ P(Y_t | H_t, do(T_t), Â_{t+1}); trained on the logged A_{t+1} (teacher forcing). Both orders "
            "factor the same joint (Robins 1986; Taubman et al. 2009); this one keeps an outcome that is a function "
            "of the next context (the tumour's Y_t = 1[d_{t+1} <= 3 cm]) consistent with it in a rollout "
            "(model/context.py). On by measurement (issue 42, docs/benchmarks.md): tumour's always − never error "
            "0.045 / 0.074 / 0.091 -> 0.005 / 0.050 / 0.046 on seeds 0-2, carry-over's 0.050 / 0.128 / 0.034 -> 0.004 / "
            "0.022 / 0.042 (with clamp_contexts = 'floor'). False: the outcome first, the context head reading it (the "
            "model of a run folder written before the key). No effect without endogenous contexts"
        ),
    )

    clamp_contexts: Literal["off", "range", "floor"] = Field(
        "floor",
        description=(
            "truncate each generated endogenous context in a rollout to the range of that column on the site's own "
            "training rows (the parametric g-formula's observed-range restriction: Taubman et al. 2009; McGrath et "
            "al. 2020, gfoRmula): 'range' to [min, max], 'floor' to ≥ min only, 'off' not at all. The bounds are "
            "computed and kept at the site, never sent (model/context.py ContextBounds). Do-simulation only: training, "
            "L_free's rollouts included, is the same, so it is not in the training hash. 'floor' by measurement with "
            "the contexts drawn first (carry-over, 20 rounds, seeds 0-2: always − never error 0.012 / 0.196 / 0.062 "
            "-> 0.004 / 0.022 / 0.042, the true order on every seed; tumour unchanged; docs/benchmarks.md, issue 42)"
        ),
    )

    cf_horizon: int = Field(3, ge=1, description="rollout length R of L_cf")
    cf_grad_to_encoder: bool = Field(
        True,
        description=(
            "let L_cf's gradient reach the encoder through the rollout's starting K_t (shapes K so that the transition "
            "can carry it; with the site-target parallel head on DKT-Synth default it cut PEHE from 0.147/0.207/0.282 to "
            "0.096/0.135/0.239 on seeds 0/1/2)"
        ),
    )
    cf_sampler_steps: int = Field(2, ge=1, description="DDIM steps per transition inside L_cf (differentiable)")
    free_running_steps: int = Field(
        0,
        ge=0,
        description=(
            "k of the free-running loss L_free (model/free_running.py): the simulator rolled k steps forward under "
            "the logged actions on its own generated contexts and scored against the logged outcomes and endogenous "
            "contexts (multi-step training, Venkatraman et al. 2015; the natural-course check as a loss), the way "
            "``rollout`` runs it: 'latent' from every free_running_stride-th logged step, 'encoder' from t = 0 (k ≥ "
            "L − 1: the whole horizon). 0 (the default) switches it off; measured in docs/tumour.md"
        ),
    )
    lambda_free_running: float = Field(1.0, ge=0, description="weight of L_free")
    free_running_stride: int = Field(
        1, ge=1, description="L_free rolls out from every stride-th logged step (t = 0, s, 2s, ...): its cost ∝ k / s"
    )
    free_running_discount: float = Field(
        1.0, gt=0, description="per-step weights of L_free: w_r ∝ discount^(r−1), r = 1..k, normalised to sum to 1"
    )
    align_bandwidth: float = Field(1.0, gt=0, description="RBF bandwidth of the MMD in L_align")
    align_max_points: int = Field(256, ge=4, description="valid steps subsampled per batch for the batch MMD")
    dis_parallel_target: Literal["action", "site"] = Field(
        "action",
        description=(
            "what the parallel head on K^(s) predicts: the logged action (the site's behaviour policy, the nuisance "
            "a site can learn alone) or the site label (the paper's wording; a site-local copy under federation only "
            "ever sees its own label). 'action' gave the better effects on DKT-Synth (see losses.l_dis)"
        ),
    )
    grl_scale: float = Field(1.0, ge=0, description="gradient-reversal factor in front of the shared site discriminator")
    ipw: Literal["off", "auto", "step", "cumulative"] = Field(
        "auto",
        description=(
            "weight the likelihood terms (L_recon, L_diff, L_cf) by stabilised inverse-propensity weights "
            "w_t = p̂(T_t | observed history) / P_t, P_t the logged propensity, read on the site only (Robins, Hernán & "
            "Brumback 2000; RMSN, Lim et al. 2018): 'step' uses w_t, 'cumulative' the product over the last "
            "``ipw_window`` steps; both need logged propensities on every step. 'auto' (the default) is 'step' on a "
            "site whose training data logs a propensity on every step and the unweighted objective elsewhere, decided "
            "by each site on its own data. 'off' is the paper's unweighted objective everywhere"
        ),
    )
    ipw_window: int = Field(0, ge=0, description="steps in the cumulative IPW product (0: the whole past)")
    ipw_clip: float = Field(10.0, gt=0, description="upper truncation of each step's IPW weight and of their product")

    # -- optimisation ------------------------------------------------------------------------------------
    lr: float = Field(2e-3, gt=0, description="learning rate of the local optimiser (Adam)")
    batch_size: int = Field(64, ge=1, description="local minibatch size (the expected Poisson batch under DP)")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay of the local optimiser")
    grad_clip: float | None = Field(1.0, gt=0, description="global-norm clip outside DP (DP clips per sample)")
    seed: int = Field(0, description="parameter-initialisation seed (every site builds the same initial Θc)")

    # -- DP-SGD ------------------------------------------------------------------------------------------
    dp_mode: bool = Field(
        False, description="train under per-sample DP-SGD: batch-coupled terms are off or replaced (Opacus: no joint computation over a batch)"
    )
    align_under_dp: Literal["off", "reference"] = Field(
        "off",
        description="under dp_mode: drop L_align, or use a per-sample kernel distance to a fixed data-free reference",
    )

    # -- do-simulation -----------------------------------------------------------------------------------
    sampler: Literal["ddpm", "ddim"] = Field("ddim", description="sampler used by do-simulation")
    sampler_steps: int = Field(
        25,
        ge=1,
        description=(
            "DDIM steps per transition in do-simulation (DDPM always uses all N). Measured on DKT-Synth default, "
            "3 seeds: 25 steps gave PEHE 0.078 vs 0.124 at 10 steps (benchmarks/sampler.py)"
        ),
    )
    rollout: Literal["auto", "latent", "encoder"] = Field(
        "auto",
        description=(
            "'latent' (the paper): K_{t+1} drawn by the diffusion transition; 'encoder': the simulated (T_t, Y_t) and "
            "generated contexts are fed back through the encoder (a Monte-Carlo g-formula that does not use the "
            "transition); 'auto' (the default): 'latent' for the diffusion transition, 'encoder' for the "
            "deterministic one, whose K_{t+1} cannot condition on the drawn outcomes (model/simulate.py)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _written_before_context_head(cls, data: Any) -> Any:
        """A complete model section without ``context_head`` was written before the key existed (a run folder's
        config.toml is a full dump): its run trained the direct head, so it reads back as ``"direct"`` and its
        Θc still loads; likewise a complete section without ``outcome_reads_contexts`` trained the outcome first and
        reads back as False. A partial section (a hand-written config) takes the defaults."""
        # keys added after the head's; absent is "off"
        later = {"context_head", "clamp_contexts", "exposure_decays", ORDER_KEY, *FREE_RUNNING_KEYS}
        complete = isinstance(data, dict) and set(cls.model_fields) - later <= set(data)
        if not complete:
            return data
        before = {"context_head": "direct", ORDER_KEY: False}
        return {**{k: v for k, v in before.items() if k not in data}, **data}

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.schedule == "linear" and self.beta_end <= self.beta_start:
            raise ValueError(f"beta_end ({self.beta_end}) must exceed beta_start ({self.beta_start})")
        if self.sampler_steps > self.diffusion_steps:
            raise ValueError(f"sampler_steps ({self.sampler_steps}) > diffusion_steps ({self.diffusion_steps})")
        if any(not 0.0 < lam <= 1.0 for lam in self.exposure_decays):
            raise ValueError(f"exposure_decays {list(self.exposure_decays)}: each decay λ must be in (0, 1]")
        if self.cf_sampler_steps > self.diffusion_steps:
            raise ValueError(f"cf_sampler_steps ({self.cf_sampler_steps}) > diffusion_steps ({self.diffusion_steps})")
        return self

    @property
    def rollout_kind(self) -> Literal["latent", "encoder"]:
        """The rollout ``rollout`` names, ``'auto'`` resolved by the transition: a deterministic K_{t+1} = f(K_t, A_t,
        T_t) is one path per patient that no drawn outcome moves, so its latent rollout propagates a mean state where
        the g-formula must draw each time-varying variable from its distribution given the simulated history
        (Robins 1986; Taubman et al. 2009, Int J Epidemiol 38:1599) and carry the draw forward; the encoder is the
        model's filter of a history, so feeding it the drawn step does exactly that (``model.simulate``). The
        diffusion transition draws K_{t+1} itself and keeps the paper's latent rollout."""
        if self.rollout != "auto":
            return self.rollout
        return "encoder" if self.transition == "deterministic" else "latent"

    # -- what the privacy report reads -------------------------------------------------------------------
    @property
    def k(self) -> int:
        """dim of K = [K^(c), K^(s)]."""
        return self.k_causal + self.k_site

    @property
    def align_form(self) -> Literal["batch_mmd", "reference", "off"]:
        """How L_align is computed in this configuration.

        ``batch_mmd`` couples samples of a batch and is therefore never used under DP-SGD: one record would move
        every other record's clipped gradient (Opacus ``grad_sample/README.md``: layers that compute jointly over batch
        samples are not allowed; Kong et al. 2023, arXiv 2310.03104: such a loss's sensitivity grows with the batch). Under ``dp_mode`` it is ``off`` or ``reference``.
        """
        if not self.use_align or self.lambda_align == 0:
            return "off"
        if self.dp_mode:
            return self.align_under_dp
        return "batch_mmd"

    @property
    def batch_coupled_terms(self) -> list[str]:
        """Loss terms whose per-sample gradient depends on other samples (empty means DP-SGD-safe)."""
        return ["align"] if self.align_form == "batch_mmd" else []

    @property
    def per_sample_safe(self) -> bool:
        """Whether every loss term is per-sample (the condition for DP-SGD)."""
        return not self.batch_coupled_terms

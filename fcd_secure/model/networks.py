"""The Fed-CausalDiff network: Phase A encoder, Phase B score networks, Phase C decoder, and the L_dis heads
(paper §III-A/B, Fig. 1; what is shared and why: ``manifest.py``).

Parameter names (state_dict names) are the identity the whole system uses: the manifest, DSS, secure aggregation,
the egress gate and the audit all key on them. They must not depend on the process, the DP mode or the dataset
beyond its dims, hence:

* the trunk is always ``opacus.layers.DPGRU`` (its parameter names equal ``nn.GRU``'s, and it runs under Opacus'
  per-sample hooks without a module swap that would rename things);
* padding is handled with the mask M, never with ``pack_padded_sequence`` (``enforce_sorted=False`` misaligns
  Opacus' per-sample rows: ``DPRNNBase`` un-permutes the returned hidden states but not the activations its
  hooks captured, so one clipped row mixes two records; read in Opacus 1.6's ``layers/dp_rnn.py``). The GRU is causal and valid steps form a prefix, so outputs at
  valid steps never see padding.

Module → partition (``manifest.py`` reads :data:`THETA_S_MODULES`):

=================  ========  ==================================================================================
module             part      role
=================  ========  ==================================================================================
action_emb         Θc        embedding of T (used by encoder input, ε_c and decoder)
trunk              Θc        DPGRU over (X, A_t, T_{t-1}, Y_{t-1}) — shared so K^(c) has one coordinate system
head_c             Θc        h_t → K^(c)_t
head_s             Θs        h_t → K^(s)_t (site-local confounding latent)
eps_c              Θc        ε_c(K^(n)_{t+1}, n, K_t, A_t, T_t)
eps_s              Θs        ε_s(K^(n)_{t+1}, n, K_t, A_t)  — no T_t: confounding is not an effect of the action
decoder            Θc        P_φ(Y_t | K_t, A_t, T_t) — by default one read-out per action, the taken one gathered;
                             with ``cfg.outcome_reads_contexts`` it also reads Â_{t+1}[:n_endo] (``context.py``)
site_disc          Θc        site classifier behind the gradient-reversal layer on K^(c) (shared: trap 2)
parallel_head      Θs        the parallel head on K^(s) (L_dis)
context_head       Θc        Â_{t+1} = A_t·(1 + tanh m) + b, (b, m) = g(K_t, T_t, Y_t), of the endogenous contexts
                             (``context.py``, ``cfg.context_head``; only when the data has endogenous contexts and
                             ``cfg.use_context``)
propensity_head    Θs        p̂(T_t | observed history) from the detached trunk state: the site's behaviour policy,
                             the numerator of the stabilised IPW weights (only when ``cfg.ipw`` is not ``'off'``);
                             site-bound: not sent even under full synchronisation
=================  ========  ==================================================================================
"""

from __future__ import annotations

import torch
from opacus.layers import DPGRU
from torch import nn

from fcd_secure.model.config import ModelConfig
from fcd_secure.model.context import ContextHead
from fcd_secure.model.samplers import ddim_sample, ddpm_sample
from fcd_secure.model.schedule import NoiseSchedule, timestep_embedding

#: Top-level modules whose parameters are site-local (Θs). Everything else is Θc.
THETA_S_MODULES: tuple[str, ...] = ("head_s", "eps_s", "parallel_head", "propensity_head")
#: Θs modules that no synchronisation sends, full synchronisation included: the behaviour head models the site's
#: logging policy, so it carries what the logged propensities carry (``fcd_secure.manifest``, site-bound entries).
SITE_BOUND_MODULES: tuple[str, ...] = ("propensity_head",)


def mlp(d_in: int, d_out: int, hidden: int, depth: int = 2) -> nn.Sequential:
    """``depth`` hidden Linear+SiLU layers of width ``hidden``, then a Linear read-out to ``d_out``."""
    layers: list[nn.Module] = []
    d = d_in
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.SiLU()]
        d = hidden
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return -ctx.scale * g, None


def grad_reverse(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Identity forward, −scale·grad backward (Ganin & Lempitsky 2015). Parameter-free, per-sample safe."""
    return _GradReverse.apply(x, scale)


class FedCausalDiff(nn.Module):
    """Fed-CausalDiff: K_t = [K^(c)_t, K^(s)_t]; K_{t+1} ~ p_Θ(·|K_t, A_t, do(T_t)); Y_t ~ P_φ(·|K_t, A_t, T_t).

    Build with :meth:`from_dims`. The methods below are the pieces the losses and the simulator compose; they
    call sub-modules directly so that Opacus' per-sample hooks (registered on the leaf layers) see every use.

    Args:
        cfg: dimensions, transition kind, decoder head and L_dis targets.
        dx: static covariates.
        da: exogenous context features per step.
        n_actions: size of the action set.
        n_sites: number of sites (classes of the shared site discriminator).
        n_endogenous: leading context columns that treatment can change (generated in a rollout by the context
            head; 0, or ``cfg.use_context = False``, replays every context).

    Raises:
        ValueError: for impossible dimensions.
    """

    def __init__(self, cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, n_endogenous: int = 0) -> None:
        super().__init__()
        if min(dx, da) < 0 or n_actions < 1 or n_sites < 1 or not 0 <= n_endogenous <= da:
            raise ValueError(f"bad dims dx={dx} da={da} n_actions={n_actions} n_sites={n_sites} "
                             f"n_endogenous={n_endogenous}")
        self.cfg = cfg
        self.dx, self.da, self.n_actions, self.n_sites = dx, da, n_actions, n_sites
        k, kc, ks, H, E = cfg.k, cfg.k_causal, cfg.k_site, cfg.mlp_hidden, cfg.action_emb
        # index n_actions is the "no previous action" token at t = 0
        self.action_emb = nn.Embedding(n_actions + 1, E)
        #: the decays of the treatment-history features the encoder reads (cfg.exposure_decays; :meth:`exposures`)
        self.register_buffer("decays", torch.tensor(cfg.exposure_decays, dtype=torch.float32), persistent=False)
        self.n_exposure = n_actions * len(cfg.exposure_decays)
        self.trunk = DPGRU(dx + da + E + 2 + self.n_exposure, cfg.hidden, batch_first=True)
        self.head_c = nn.Linear(cfg.hidden, kc)
        self.head_s = mlp(cfg.hidden, ks, H, depth=1)
        temb = cfg.time_emb if cfg.transition == "diffusion" else 0
        dy = 1 if cfg.transition_given_y else 0
        self.eps_c = mlp(k + temb + k + da + dy + E, k, H)
        self.eps_s = mlp(k + temb + k + da + dy, k, H)
        self.n_out = 2 if cfg.outcome == "gaussian" else 1
        n_endo = n_endogenous if cfg.use_context else 0
        #: the decoder reads the step's next endogenous contexts Â_{t+1} (``cfg.outcome_reads_contexts``; context.py)
        self.outcome_reads_contexts = bool(cfg.outcome_reads_contexts and n_endo)
        d_dec = k + da + (n_endo if self.outcome_reads_contexts else 0)
        if cfg.decoder_head == "per_action":
            # DKT-style read-out: one output per action from (K_t, A_t), the taken one gathered
            self.decoder = mlp(d_dec, n_actions * self.n_out, H)
        else:
            self.decoder = mlp(d_dec + E, self.n_out, H)
        self.site_disc = mlp(kc, n_sites, H, depth=1)
        n_par = n_actions if cfg.dis_parallel_target == "action" else n_sites
        self.parallel_head = mlp(ks, n_par, H, depth=1)
        self.n_endogenous = n_endo
        self.context_head = (ContextHead(k, da, E, self.n_endogenous, H, form=cfg.context_head,
                                         reads_outcome=not self.outcome_reads_contexts)
                             if self.n_endogenous else None)
        # built last and only when used, so that the other modules' initial values do not depend on the switch
        self.propensity_head = mlp(cfg.hidden, n_actions, H, depth=1) if cfg.ipw != "off" else None
        self.schedule = NoiseSchedule.from_config(cfg)

    @classmethod
    def from_dims(
        cls, cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, n_endogenous: int = 0
    ) -> "FedCausalDiff":
        """Build with parameters initialised from ``cfg.seed`` (same seed → same initial Θc at every site)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            return cls(cfg, dx, da, n_actions, n_sites, n_endogenous)

    @property
    def dims(self) -> dict[str, int]:
        """The data dimensions the network was built for."""
        return {"dx": self.dx, "da": self.da, "n_actions": self.n_actions, "n_sites": self.n_sites,
                "n_endogenous": self.n_endogenous}

    # -- Phase A ---------------------------------------------------------------------------------------------
    def exposures(self, T: torch.Tensor) -> torch.Tensor:
        """The treatment-history features ``[B, L, n_actions·len(decays)]`` (decay-major): at step t, for each decay λ
        and action a, e_t(a) = Σ_{s<t} λ^(t−1−s)·1[T_s = a], so e_0 = 0 and e_{t+1} = λ·e_t + 1[T_t = a]
        (:meth:`encode_step` advances it so). Empty (last dim 0) without ``cfg.exposure_decays``."""
        B, L = T.shape
        if not self.n_exposure:
            return torch.zeros(B, L, 0)
        taken = torch.nn.functional.one_hot(T[:, :-1].clamp(0, self.n_actions - 1), self.n_actions).float()
        taken = torch.cat([torch.zeros(B, 1, self.n_actions), taken], 1)  # [B, L, a]: 1[T_{t−1} = a], 0 at t = 0
        lag = torch.arange(L)[:, None] - torch.arange(L)[None, :]  # t − u
        # W[d, t, u] = λ_d^(t−u) for u ≤ t: e_t = Σ_{u ≤ t} λ^(t−u)·1[T_{u−1} = a]
        W = torch.where(lag >= 0, self.decays[:, None, None] ** lag.clamp(min=0).float(), torch.zeros(()))
        return torch.einsum("dtu,bua->btda", W, taken).reshape(B, L, self.n_exposure)

    def encoder_inputs(self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """Step-t input: [X, A_t, emb(T_{t−1}), Y_{t−1}, 1{t=0}, e_t] so that K_t summarises history before T_t, Y_t
        (e_t: :meth:`exposures`, absent without ``cfg.exposure_decays``)."""
        B, L = T.shape
        prev_t = torch.cat([torch.full((B, 1), self.n_actions, dtype=torch.long, device=T.device), T[:, :-1]], 1)
        prev_y = torch.cat([torch.zeros(B, 1, device=Y.device), Y[:, :-1]], 1)
        first = torch.zeros(B, L, device=Y.device)
        first[:, 0] = 1.0
        return torch.cat(
            [X.unsqueeze(1).expand(B, L, X.shape[-1]), A, self.action_emb(prev_t), prev_y.unsqueeze(-1), first.unsqueeze(-1),
             self.exposures(T)],
            dim=-1,
        )

    def start_state(self, h0: torch.Tensor) -> torch.Tensor:
        """The rollout state at t = 0 from the trunk's output there, ``h0 [B, hidden]``: no treatment before it."""
        return torch.cat([h0, torch.zeros(h0.shape[0], self.n_exposure)], -1).unsqueeze(0)

    def encode(self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K^(c), K^(s)), each [B, L, ·] in (−1, 1). K_t depends on (X, A_≤t, T_<t, Y_<t) only."""
        Kc, Ks, _ = self.encode_states(X, A, T, Y)
        return Kc, Ks

    def encode_states(
        self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`encode` plus the trunk states h ``[B, L, hidden]`` (what the propensity head reads)."""
        h, _ = self.trunk(self.encoder_inputs(X, A, T, Y))
        return torch.tanh(self.head_c(h)), torch.tanh(self.head_s(h)), h

    def encode_prefix(
        self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor, t: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K_t [B, k], rollout state [1, B, hidden + n_exposure]: the GRU state h_t and the treatment-history
        features e_t of :meth:`exposures`) from the logged history before step t."""
        inputs = self.encoder_inputs(X, A, T, Y)[:, : t + 1]
        h, _ = self.trunk(inputs)
        ht = h[:, -1]
        state = torch.cat([ht, inputs[:, -1, inputs.shape[-1] - self.n_exposure:]], -1)
        return torch.cat([torch.tanh(self.head_c(ht)), torch.tanh(self.head_s(ht))], -1), state.unsqueeze(0)

    def encode_step(
        self, state: torch.Tensor, X: torch.Tensor, A_next: torch.Tensor, a: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance the encoder by one simulated step (T_t = a, Y_t = y) → (K_{t+1}, h_{t+1}). Used by the
        ``rollout='encoder'`` do-simulation (simulated outcomes fed back through the encoder). ``state``: as
        :meth:`encode_prefix` or :meth:`start_state` give it (the GRU state, then e_t, advanced here by T_t = a)."""
        hidden = self.cfg.hidden
        e = state[0, :, hidden:]
        if self.n_exposure:  # e_{t+1} = λ·e_t + 1[T_t = a], decay-major as exposures() lays it out
            taken = torch.nn.functional.one_hot(a, self.n_actions).float()[:, None, :]  # [B, 1, a]
            e = (self.decays[None, :, None] * e.view(-1, len(self.decays), self.n_actions) + taken).reshape(e.shape)
        inp = torch.cat([X, A_next, self.action_emb(a), y.unsqueeze(-1), torch.zeros_like(y).unsqueeze(-1), e], -1)
        h, _ = self.trunk(inp.unsqueeze(1), state[..., :hidden].contiguous())
        ht = h[:, -1]
        return (torch.cat([torch.tanh(self.head_c(ht)), torch.tanh(self.head_s(ht))], -1),
                torch.cat([ht, e], -1).unsqueeze(0))

    # -- Phase B ---------------------------------------------------------------------------------------------
    def eps(
        self, x_n: torch.Tensor, n: torch.Tensor, K: torch.Tensor, A: torch.Tensor, T: torch.Tensor,
        y: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ε_c(K^(n)_{t+1}, n, K_t, A_t, T_t; Θc) + ε_s(K^(n)_{t+1}, n, K_t, A_t; Θs) — the summed score of eq. (1).

        With ``cfg.transition_given_y`` both nets also read the step's outcome Y_t (``y``, then required). For
        ``transition='deterministic'`` (g-formula baseline) the same nets, without x_n's noise or n, output K_{t+1}
        directly.

        Raises:
            ValueError: ``cfg.transition_given_y`` and no ``y``.
        """
        parts = [x_n]
        if self.cfg.transition == "diffusion":
            parts.append(timestep_embedding(n, self.cfg.time_emb, self.cfg.diffusion_steps))
        parts += [K, A]
        if self.cfg.transition_given_y:
            if y is None:
                raise ValueError("transition_given_y: the transition needs the step's outcome y")
            parts.append(y.unsqueeze(-1).to(K.dtype))
        common = torch.cat(parts, dim=-1)
        return self.eps_c(torch.cat([common, self.action_emb(T)], -1)) + self.eps_s(common)

    def transition(
        self,
        K: torch.Tensor,
        A: torch.Tensor,
        T: torch.Tensor,
        sampler: str | None = None,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        y: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draw K_{t+1} ~ p_Θ(·|K_t, A_t, do(T_t)[, Y_t = y]) by running a reverse sampler (or the deterministic map).

        ``y`` (the step's outcome) is read only with ``cfg.transition_given_y``.
        """
        y = y if self.cfg.transition_given_y else None
        if self.cfg.transition == "deterministic":
            return torch.tanh(self.eps(torch.zeros_like(K), torch.zeros(K.shape[:-1], dtype=torch.long), K, A, T, y))
        sampler = sampler or self.cfg.sampler
        steps = steps or self.cfg.sampler_steps

        def eps_fn(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            return self.eps(x, n, K, A, T, y)

        if sampler == "ddpm":
            return ddpm_sample(eps_fn, self.schedule, tuple(K.shape), generator)
        if sampler == "ddim":
            return ddim_sample(eps_fn, self.schedule, tuple(K.shape), steps, generator)
        raise ValueError(f"unknown sampler {sampler!r}; expected 'ddpm' or 'ddim'")

    # -- Phase C ---------------------------------------------------------------------------------------------
    def decode(
        self, K: torch.Tensor, A: torch.Tensor, T: torch.Tensor, A_next: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decoder output [..., 1] (Bernoulli logit) or [..., 2] (Gaussian mean, log σ).

        With :attr:`outcome_reads_contexts` the decoder also reads the step's next endogenous contexts ``A_next``
        ``[..., n_endogenous]`` (a rollout's drawn Â_{t+1}, the logged A_{t+1} in training); ``None`` reads the context
        head's Â_{t+1} given (K_t, A_t, T_t), detached, so that the outcome's loss never bends the head (the one-step
        E[Y_t | H_t, do(T_t)] at the head's conditional mean; ``context.py``). Without it ``A_next`` is ignored.
        """
        parts = [K, A]
        if self.outcome_reads_contexts:
            if A_next is None:  # no_grad, not only detach: Opacus' hooks keep no activation of a call no loss reads
                with torch.no_grad():
                    A_next = self.next_context(K, A, T, None)
            parts.append(A_next)
        if self.cfg.decoder_head == "per_action":
            out = self.decoder(torch.cat(parts, dim=-1))
            out = out.view(*out.shape[:-1], self.n_actions, self.n_out)
            idx = T.unsqueeze(-1).unsqueeze(-1).expand(*T.shape, 1, self.n_out)
            return out.gather(-2, idx).squeeze(-2)
        return self.decoder(torch.cat([*parts, self.action_emb(T)], dim=-1))

    def outcome_mean(self, K: torch.Tensor, A: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        """E[Y_t | K_t, A_t, T_t]: a probability for binary Y, the Gaussian mean otherwise (with
        :attr:`outcome_reads_contexts`, at the context head's Â_{t+1}: :meth:`decode`)."""
        out = self.decode(K, A, T)
        return torch.sigmoid(out[..., 0]) if self.cfg.outcome == "binary" else out[..., 0]

    def next_context(self, K: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor | None) -> torch.Tensor:
        """Â_{t+1}: the generated endogenous contexts [..., n_endogenous] after (K_t, A_t, T_t, Y_t) (``context.py``);
        with :attr:`outcome_reads_contexts` the head is drawn before the outcome and reads no ``Y`` (None allowed).

        Raises:
            RuntimeError: the network has no context head (no endogenous contexts, or ``use_context`` off).
        """
        if self.context_head is None:
            raise RuntimeError("this network has no context head (no endogenous contexts, or cfg.use_context is off)")
        return self.context_head(K, A, self.action_emb(T), Y)

    # -- L_dis heads -----------------------------------------------------------------------------------------
    def site_logits(self, Kc: torch.Tensor) -> torch.Tensor:
        """Shared site discriminator on K^(c) behind a GRL: minimising its loss maximises site confusion in K^(c)."""
        return self.site_disc(grad_reverse(Kc, self.cfg.grl_scale))

    def parallel_logits(self, Ks: torch.Tensor) -> torch.Tensor:
        """The parallel head on K^(s) (Θs, no reversal): logits of the logged action or of the site label."""
        return self.parallel_head(Ks)

    def propensity_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of p̂(T_t | observed history) from trunk states, detached: the behaviour model never shapes K.

        Raises:
            RuntimeError: the network has no propensity head (``cfg.ipw`` is off).
        """
        if self.propensity_head is None:
            raise RuntimeError("this network has no propensity head (cfg.ipw is off)")
        return self.propensity_head(h.detach())


def unwrap(model: nn.Module) -> FedCausalDiff:
    """The bare model behind an Opacus ``GradSampleModule`` (or the model itself)."""
    m = model
    while not isinstance(m, FedCausalDiff) and hasattr(m, "_module"):
        m = m._module  # type: ignore[assignment]
    if not isinstance(m, FedCausalDiff):
        raise TypeError(f"expected a FedCausalDiff (possibly wrapped by Opacus), got {type(model).__name__}")
    return m

"""The Recurrent Conditional GAN (RCGAN; Esteban, Hyland & Rätsch, "Real-valued (medical) time series generation
with recurrent conditional GANs", arXiv:1706.02633, 2017; paper ref. [32]) as a
:class:`~fcd_secure.model.simulator.Simulator`, re-implemented from the paper (no code copied).

Architecture and losses, as in the paper: a recurrent **generator** reads, at every step, a fresh noise vector z_t and
the conditional information c_t and emits the step's value; a recurrent **discriminator** reads the (real or
generated) sequence with the same conditional information and outputs a real/fake decision *at every step*. The
discriminator minimises the per-step cross-entropy of real vs generated; the generator minimises the per-step
cross-entropy of its sequences being called real (the non-saturating form).

Choices the paper leaves open (or that this setting forces), stated here:

* **what is conditioned on** — c_t = ``[X, A_t, emb(T_t)]``: the static features, the exogenous context and the
  action *sequence*. Generating under a policy therefore means feeding the policy's actions as the condition, step by
  step (the generator is causal, so a policy that reacts to the simulated outcomes can be rolled out). The logged
  outcomes are *not* a condition: RCGAN models P(Y_{1:L} | X, A, T), so a rollout from ``start_t`` replays the logged
  actions of the prefix through the generator with fresh noise and ignores the logged outcomes — an individual's past
  outcomes reach its counterfactual only through what its logged actions reveal.
* **what is generated** — the binary outcome Y_t. The generator's output is a Bernoulli logit; the discriminator sees
  a straight-through Gumbel sample of it (exactly 0/1 like the real outcomes, :func:`~.sequence.st_bernoulli`,
  τ = 0.5). As a simulator the step's probability is σ(logit) given the noise so far, and Y_t is drawn from it.
* **recurrent cells** — GRUs (the paper uses LSTMs), width ``cfg.hidden``; noise of size ``cfg.k`` per step, N(0, I);
  the generator and the discriminator each have their own action embedding (size ``cfg.action_emb``), so neither
  player moves the other's inputs.
* **updates** — one discriminator step, then one generator step, per batch (one Adam over two named parameter groups,
  :mod:`~.fitting`), Adam at ``cfg.lr`` with β = (0.5, 0.999) (the usual GAN setting), global-norm clip
  ``cfg.grad_clip``.
* **factual probability** — RCGAN cannot condition on the logged outcomes, so its one-step probability of the
  factual Y_t is σ(logit_t) averaged over :data:`FACTUAL_DRAWS` noise sequences under the logged conditions (fixed
  seed, deterministic).
* **federation** — no site-local part: generator and discriminator are both Θc (full synchronisation, as FedGAN,
  paper ref. [7], synchronises both players).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import Batch
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.baselines.fitting import grouped_adam, step_group
from fcd_secure.model.baselines.rollout import Stepper, SteppedSimulator
from fcd_secure.model.baselines.sequence import st_bernoulli
from fcd_secure.model.losses import masked_mean

__all__ = ["FACTUAL_DRAWS", "RCGANNetwork", "RCGANSimulator"]

#: Noise sequences averaged by :meth:`RCGANSimulator.factual_probs`.
FACTUAL_DRAWS = 16
#: Adam's β of both players.
BETAS = (0.5, 0.999)


class RCGANNetwork(nn.Module):
    """Generator and per-step discriminator of RCGAN (module docstring)."""

    def __init__(self, cfg: ModelConfig, dx: int, da: int, n_actions: int) -> None:
        super().__init__()
        self.dx, self.da, self.n_actions, self.noise_dim = dx, da, n_actions, cfg.k
        E, H = cfg.action_emb, cfg.hidden
        self.gen_action_emb = nn.Embedding(n_actions, E)
        self.gen_rnn = nn.GRU(self.noise_dim + dx + da + E, H, batch_first=True)
        self.gen_out = nn.Linear(H, 1)
        self.disc_action_emb = nn.Embedding(n_actions, E)
        self.disc_rnn = nn.GRU(1 + dx + da + E, H, batch_first=True)
        self.disc_out = nn.Linear(H, 1)

    def generator_groups(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if n.startswith("gen_")]

    def discriminator_groups(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if n.startswith("disc_")]

    @staticmethod
    def _static(X: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return X.unsqueeze(1).expand(X.shape[0], like.shape[1], X.shape[-1])

    def generate(
        self, Z: torch.Tensor, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, L]`` of Y under conditions (X, A, T) and noise ``Z`` ``[B, L, noise]``, and the final state."""
        inp = torch.cat([Z, self._static(X, A), A, self.gen_action_emb(T)], -1)
        h, last = self.gen_rnn(inp, state)
        return self.gen_out(h)[..., 0], last

    def discriminate(self, Y: torch.Tensor, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        """Per-step real/fake logits ``[B, L]`` of outcomes ``Y`` under the conditions."""
        inp = torch.cat([Y.unsqueeze(-1), self._static(X, A), A, self.disc_action_emb(T)], -1)
        return self.disc_out(self.disc_rnn(inp)[0])[..., 0]


class RCGANSimulator(SteppedSimulator):
    """RCGAN behind the :class:`~fcd_secure.model.simulator.Simulator` protocol (module docstring)."""

    name = "rcgan"
    network = RCGANNetwork
    label = "RCGAN"

    def make_optimizer(self) -> torch.optim.Optimizer:
        """One Adam over the groups ``generator`` and ``discriminator``."""
        return grouped_adam(
            {"generator": self.net.generator_groups(), "discriminator": self.net.discriminator_groups()},
            self.config.lr, BETAS,
        )

    def train_step(self, b: Batch) -> dict[str, float]:
        """Per batch a discriminator step then a generator step; the site label is not used."""
        net, opt, clip = self.net, self.optimizer, self.config.grad_clip
        B, L = b.T.shape
        Z = torch.randn(B, L, net.noise_dim)
        fake = st_bernoulli(net.generate(Z, b.X, b.A, b.T)[0], torch.rand(B, L))
        d_real = net.discriminate(b.Y, b.X, b.A, b.T)
        d_fake = net.discriminate(fake.detach(), b.X, b.A, b.T)
        d_loss = (masked_mean(F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real), reduction="none"), b.M)
                  + masked_mean(F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake), reduction="none"), b.M)).mean()
        step_group(opt, d_loss, "discriminator", clip)
        g_out = net.discriminate(fake, b.X, b.A, b.T)
        g_loss = masked_mean(F.binary_cross_entropy_with_logits(g_out, torch.ones_like(g_out), reduction="none"), b.M).mean()
        step_group(opt, g_loss, "generator", clip)
        d, g = float(d_loss.detach()), float(g_loss.detach())
        return {"discriminator": d, "generator": g, "total": d + g}

    def stepper(self, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> Stepper:
        """The generator run over the logged prefix (its actions, fresh noise), then under the plan's actions."""
        return _RCGANStepper(self.net, ds, rows, start_t, S, g)

    def factual_tensor(self, b: Batch, ds: SiteDataset) -> torch.Tensor:
        """σ(logit_t) under the logged conditions, averaged over :data:`FACTUAL_DRAWS` noise draws."""
        net = self.net
        g = torch.Generator().manual_seed(0)
        acc = torch.zeros(ds.n, ds.L)
        for _ in range(FACTUAL_DRAWS):
            Z = torch.randn(ds.n, ds.L, net.noise_dim, generator=g)
            acc += torch.sigmoid(net.generate(Z, b.X, b.A, b.T)[0])
        return acc / FACTUAL_DRAWS


class _RCGANStepper:
    """An RCGAN rollout over one chunk of rows: the generator's state after the logged prefix, then step by step."""

    def __init__(self, net: RCGANNetwork, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> None:
        self.net = net
        self.X = torch.as_tensor(ds.X[rows], dtype=torch.float32).repeat_interleave(S, 0)
        self.A = torch.as_tensor(ds.A[rows], dtype=torch.float32).repeat_interleave(S, 0)
        B = self.X.shape[0]
        self.state: torch.Tensor | None = None
        if start_t > 0:
            T = torch.as_tensor(ds.T[rows, :start_t], dtype=torch.long).repeat_interleave(S, 0)
            Z = torch.randn(B, start_t, net.noise_dim, generator=g)
            _, self.state = net.generate(Z, self.X, self.A[:, :start_t], T)

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        z = torch.randn(len(a), 1, self.net.noise_dim, generator=g)
        logit, self.state = self.net.generate(z, self.X, self.A[:, t : t + 1], a.unsqueeze(1), self.state)
        return torch.sigmoid(logit[:, 0])

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        """RCGAN's generator does not read its own outcomes: its state already moved in :meth:`prob`."""

"""FedCM / FeDCM (Rahman & Kocaoglu, "FeDCM: Federated learning of deep causal generative models", UAI 2025; paper
ref. [10]) as a :class:`~fcd_secure.model.simulator.Simulator`, re-implemented from the paper's description (no code
copied).

What the method is: a *deep causal generative model* — one conditional generative model per causal mechanism,
P(V | pa(V)), each a conditional GAN of the CTGAN family (conditional generator and critic, Wasserstein loss with a
gradient penalty, Gumbel-softmax outputs for discrete variables) — learnt *modularly* across clients: the mechanisms
that are shared by every client are trained globally (FedAvg of generator and critic), the others locally. Sampling
the model under do(V = v) replaces V's mechanism by the constant and samples the rest in causal order.

The sequential model here, and the choices the paper leaves open for it:

* **the graph** — per step t, the treatment mechanism T_t ← f_T(pa_T, u) and the outcome mechanism
  Y_t ← f_Y(pa_Y, u), with pa_Y = ``[X, A_t, emb(T_t), s_t]`` and pa_T = ``[X, A_t, emb(T_{t−1}), s_t]``, where s_t
  is a fixed, parameter-free summary of the outcome history (Y_{t−1}, the running mean of Y_{<t}, a first-step flag,
  t/L; :func:`~.sequence.history_summary`). The history enters only through s_t: the mechanisms read explicit parents,
  as a DCM's do, and no latent state is learnt.
* **global vs local** — the outcome mechanism (its generator and its critic) is global: the causal law of the outcome
  is what the sites share. The treatment mechanism (the site's logging practice, which differs between sites) is
  local: its generator, critic and action embedding are Θs and never leave the site. FeDCM additionally refits each
  client's local model on interventional samples drawn from the global mechanisms; do-simulation here needs only the
  outcome mechanism, so that step is not run.
* **losses** — WGAN-GP for each mechanism (Gulrajani et al. 2017, λ_GP = 10, one critic step per generator step as in
  CTGAN's default), each valid step (i, t) one sample of the mechanism. The outcome generator emits a Bernoulli logit
  and a straight-through Gumbel sample (:func:`~.sequence.st_bernoulli`); the treatment generator a straight-through
  Gumbel-softmax over the actions (τ = 0.5).
* **sizes** — generators and critics are MLPs with two hidden layers of width ``cfg.mlp_hidden`` (SiLU for
  generators, LeakyReLU(0.2) for critics), noise of size ``cfg.k``, action embeddings of size ``cfg.action_emb``
  (one each for the outcome generator and critic, so neither player moves the other's inputs). One Adam over named
  parameter groups at ``cfg.lr``, β = (0.5, 0.9) as in WGAN-GP, global-norm clip ``cfg.grad_clip``.
* **simulation** — under a plan the treatment mechanism is cut (do(T_t = a)) and Y_t is sampled from the outcome
  generator given the simulated history summary; the step's probability is σ(logit) for the drawn noise.
* **factual probability** — σ(logit) of the outcome generator under the logged parents, averaged over
  :data:`FACTUAL_DRAWS` noise draws (fixed seed, deterministic).
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
from fcd_secure.model.baselines.sequence import GUMBEL_TAU, history_summary, shift_right, st_bernoulli
from fcd_secure.model.networks import mlp

__all__ = ["FACTUAL_DRAWS", "FedCMNetwork", "FedCMSimulator", "THETA_S_MODULES"]

#: The treatment mechanism: site-local (Θs).
THETA_S_MODULES = ("treat_action_emb", "treat_gen", "treat_critic")
FACTUAL_DRAWS = 16
LAMBDA_GP = 10.0
BETAS = (0.5, 0.9)
_SUMMARY = 4  # width of history_summary


def _critic(d_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                         nn.Linear(hidden, 1))


class FedCMNetwork(nn.Module):
    """The outcome mechanism (global) and the treatment mechanism (local) of the sequential DCM (module docstring)."""

    def __init__(self, cfg: ModelConfig, dx: int, da: int, n_actions: int) -> None:
        super().__init__()
        self.dx, self.da, self.n_actions, self.noise_dim = dx, da, n_actions, cfg.k
        E, Hm, k = cfg.action_emb, cfg.mlp_hidden, cfg.k
        pa = dx + da + E + _SUMMARY
        self.outcome_action_emb = nn.Embedding(n_actions, E)
        self.outcome_gen = mlp(pa + k, 1, Hm)
        self.critic_action_emb = nn.Embedding(n_actions, E)
        self.outcome_critic = _critic(1 + pa, Hm)
        # index n_actions is the "no previous action" token at t = 0
        self.treat_action_emb = nn.Embedding(n_actions + 1, E)
        self.treat_gen = mlp(pa + k, n_actions, Hm)
        self.treat_critic = _critic(n_actions + pa, Hm)

    def groups(self) -> dict[str, list[nn.Parameter]]:
        """``generators`` (both mechanisms' generators and their embeddings) and ``critics``."""
        out: dict[str, list[nn.Parameter]] = {"generators": [], "critics": []}
        for n, p in self.named_parameters():
            out["critics" if "critic" in n.split(".", 1)[0] else "generators"].append(p)
        return out

    @staticmethod
    def context(X: torch.Tensor, A: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        """``[X, A_t, s_t]`` per step (the parents every mechanism shares)."""
        return torch.cat([X.unsqueeze(1).expand(*A.shape[:2], X.shape[-1]), A, S], -1)

    def outcome_logit(self, ctx: torch.Tensor, T: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """The outcome generator's Bernoulli logit ``[B, L]`` from the parents and noise."""
        return self.outcome_gen(torch.cat([ctx, self.outcome_action_emb(T), Z], -1))[..., 0]

    def outcome_score(self, y: torch.Tensor, ctx: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        return self.outcome_critic(torch.cat([y.unsqueeze(-1), ctx, self.critic_action_emb(T)], -1))[..., 0]

    def treat_parents(self, ctx: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        return torch.cat([ctx, self.treat_action_emb(shift_right(T, self.n_actions))], -1)


def _gradient_penalty(score, real: torch.Tensor, fake: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """λ_GP · E[(‖∇ score(x̂)‖ − 1)²] at random interpolates x̂ of real and fake, over valid steps."""
    eps = torch.rand(*real.shape[:2], *([1] * (real.dim() - 2)))
    x = (eps * real + (1 - eps) * fake).detach().requires_grad_(True)
    out = score(x)
    (grad,) = torch.autograd.grad((out * M).sum(), x, create_graph=True)
    norm = grad.reshape(*grad.shape[:2], -1).norm(dim=-1)
    return LAMBDA_GP * (((norm - 1) ** 2) * M).sum() / M.sum().clamp(min=1)


def _mean(v: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    return (v * M).sum() / M.sum().clamp(min=1)


class FedCMSimulator(SteppedSimulator):
    """FedCM behind the :class:`~fcd_secure.model.simulator.Simulator` protocol (module docstring)."""

    name = "fedcm"
    theta_s_modules = THETA_S_MODULES
    network = FedCMNetwork
    label = "FedCM"

    def make_optimizer(self) -> torch.optim.Optimizer:
        """One Adam over the groups ``generators`` and ``critics``, β = (0.5, 0.9)."""
        return grouped_adam(self.net.groups(), self.config.lr, BETAS)

    def train_step(self, b: Batch) -> dict[str, float]:
        """Per batch a critic step of both mechanisms, then a generator step of both."""
        net, opt, clip = self.net, self.optimizer, self.config.grad_clip
        B, L = b.T.shape
        M = b.M
        ctx = net.context(b.X, b.A, history_summary(b.Y, L))
        t_pa = net.treat_parents(ctx, b.T)
        real_t = F.one_hot(b.T, net.n_actions).float()

        def fakes() -> tuple[torch.Tensor, torch.Tensor]:
            y = st_bernoulli(net.outcome_logit(ctx, b.T, torch.randn(B, L, net.noise_dim)), torch.rand(B, L))
            logits_t = net.treat_gen(torch.cat([t_pa, torch.randn(B, L, net.noise_dim)], -1))
            return y, F.gumbel_softmax(logits_t, tau=GUMBEL_TAU, hard=True)

        fy, ft = fakes()
        y_score = lambda y: net.outcome_score(y, ctx.detach(), b.T)  # noqa: E731
        t_score = lambda t: net.treat_critic(torch.cat([t, t_pa.detach()], -1))[..., 0]  # noqa: E731
        c_y = _mean(y_score(fy.detach()) - y_score(b.Y), M) + _gradient_penalty(y_score, b.Y, fy.detach(), M)
        c_t = _mean(t_score(ft.detach()) - t_score(real_t), M) + _gradient_penalty(t_score, real_t, ft.detach(), M)
        step_group(opt, c_y + c_t, "critics", clip)
        fy, ft = fakes()
        g_y = -_mean(y_score(fy), M)
        g_t = -_mean(t_score(ft), M)
        step_group(opt, g_y + g_t, "generators", clip)
        parts = {"outcome_critic": float(c_y.detach()), "treatment_critic": float(c_t.detach()),
                 "outcome_generator": float(g_y.detach()), "treatment_generator": float(g_t.detach())}
        parts["total"] = sum(parts.values())
        return parts

    def stepper(self, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> Stepper:
        """The outcome mechanism sampled step by step under do(T_t = plan), parents from the simulated history."""
        return _FedCMStepper(self.net, ds, rows, start_t, S)

    def factual_tensor(self, b: Batch, ds: SiteDataset) -> torch.Tensor:
        """σ(outcome logit) under the logged parents, averaged over :data:`FACTUAL_DRAWS` noise draws."""
        net = self.net
        ctx = net.context(b.X, b.A, history_summary(b.Y, ds.L))
        g = torch.Generator().manual_seed(0)
        acc = torch.zeros(ds.n, ds.L)
        for _ in range(FACTUAL_DRAWS):
            acc += torch.sigmoid(net.outcome_logit(ctx, b.T, torch.randn(ds.n, ds.L, net.noise_dim, generator=g)))
        return acc / FACTUAL_DRAWS


class _FedCMStepper:
    """A FedCM rollout over one chunk of rows: the outcome mechanism with the simulated history summary."""

    def __init__(self, net: FedCMNetwork, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int) -> None:
        self.net = net
        self.L = ds.L
        self.X = torch.as_tensor(ds.X[rows], dtype=torch.float32).repeat_interleave(S, 0)
        self.A = torch.as_tensor(ds.A[rows], dtype=torch.float32).repeat_interleave(S, 0)
        self.Y = torch.as_tensor(ds.Y[rows, :start_t], dtype=torch.float32).repeat_interleave(S, 0)

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        net = self.net
        z = torch.randn(len(a), 1, net.noise_dim, generator=g)
        hist = torch.cat([self.Y, torch.zeros(len(a), 1)], 1)  # Y_t itself is never read by the summary at t
        s_t = history_summary(hist, self.L)[:, t : t + 1]
        ctx = net.context(self.X, self.A[:, t : t + 1], s_t)
        return torch.sigmoid(net.outcome_logit(ctx, a.unsqueeze(1), z)[:, 0])

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        self.Y = torch.cat([self.Y, y.unsqueeze(1)], 1)

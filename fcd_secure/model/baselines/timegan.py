"""TimeGAN (Yoon, Jarrett & van der Schaar, "Time-series generative adversarial networks", NeurIPS 2019; paper ref.
[8]) as a :class:`~fcd_secure.model.simulator.Simulator`, re-implemented from the paper (no code copied).

Architecture and losses, as in the paper — four recurrent networks around a learned embedding space, plus a
discriminator in that space:

* **embedder** e: the real sequence → latent codes h_t; **recovery** r: h_t → the sequence's values. Reconstruction
  loss L_R.
* **supervisor** s: the latent history → the next latent code, trained on real codes with the *supervised* loss
  L_S = ‖h_t − s(h_{<t})‖² (the step-wise transition the adversarial loss alone does not teach).
* **generator** g: noise sequence → latent codes ê_t; the supervisor turns them into ĥ_t = s(ê_{<t}), recovered into
  generated values r(ĥ_t).
* **discriminator** d: a bidirectional recurrent network over latent codes, real (h) vs generated (ĥ and ê), per
  step — the *unsupervised* loss L_U.
* objectives: embedder and recovery minimise L_R + λ·L_S; generator and supervisor minimise the non-saturating
  L_U(ĥ) + γ·L_U(ê) + η·L_S; the discriminator maximises L_U. λ = 1, η = 10 (the values Yoon et al. report),
  γ = 1.

Choices the paper leaves open (or that this setting forces), stated here:

* **conditioning** — c_t = ``[X, A_t, emb(T_t)]`` is an input of the embedder, supervisor, generator and
  discriminator (TimeGAN generates static features too; here X, A and the action sequence are conditions, so that a
  rollout under a policy feeds the policy's actions). The supervisor reads ``[code of step t−1, c_t]``, so the action
  of step t moves the code of step t and, through r, the outcome Y_t. The recovery reads ``[h_t, c_t]`` (the paper's
  r reads h_t alone; the condition is known at every step, so r need not re-derive it from the code).
* **what is generated** — the binary outcome Y_t: r gives its Bernoulli logit and L_R is binary cross-entropy.
  Latent codes are sigmoid outputs of size ``cfg.k``, as in the paper's embedding networks.
* **from a logged history** — a rollout from ``start_t`` embeds the logged prefix with e, runs the supervisor over the
  real codes, and continues with generated codes: at step t the supervisor reads the real code of ``start_t − 1``,
  after that the generator's codes (noise z_t ~ N(0, I) of size ``cfg.k`` per step), exactly the generation path
  ĥ = s(ê). The generator's own state runs over the prefix with fresh noise.
* **schedule** — the paper trains in three phases (autoencoder, supervisor, joint); under federation every local
  round runs all three updates on every batch: (e, r) step, (g, s) step, then d step (one Adam over named parameter
  groups, :mod:`~.fitting`; Adam at ``cfg.lr``, β = (0.9, 0.999); global-norm clip ``cfg.grad_clip``). No
  moment-matching term.
* **recurrent cells** — GRUs of width ``cfg.hidden``; the discriminator is bidirectional and has its own action
  embedding.
* **factual probability** — E[Y_t | history before t, A_t, T_t] is r(s(real codes before t, c_t)): the supervised
  one-step path, no noise.
* **federation** — no site-local part: every network is Θc (full synchronisation).
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
from fcd_secure.model.baselines.sequence import shift_right
from fcd_secure.model.losses import masked_mean

__all__ = ["TimeGANNetwork", "TimeGANSimulator"]

LAMBDA = 1.0
ETA = 10.0
GAMMA = 1.0


class TimeGANNetwork(nn.Module):
    """Embedder, recovery, supervisor, generator and discriminator of a conditional TimeGAN (module docstring)."""

    def __init__(self, cfg: ModelConfig, dx: int, da: int, n_actions: int) -> None:
        super().__init__()
        self.dx, self.da, self.n_actions = dx, da, n_actions
        E, H, k = cfg.action_emb, cfg.hidden, cfg.k
        self.k = k
        c = dx + da + E
        self.action_emb = nn.Embedding(n_actions, E)
        self.emb_rnn = nn.GRU(c + 1, H, batch_first=True)
        self.emb_out = nn.Linear(H, k)
        self.recovery = nn.Sequential(nn.Linear(k + c, H), nn.SiLU(), nn.Linear(H, 1))
        self.sup_rnn = nn.GRU(k + c, H, batch_first=True)
        self.sup_out = nn.Linear(H, k)
        self.gen_rnn = nn.GRU(k + c, H, batch_first=True)
        self.gen_out = nn.Linear(H, k)
        self.disc_action_emb = nn.Embedding(n_actions, E)
        self.disc_rnn = nn.GRU(k + c, H // 2, batch_first=True, bidirectional=True)
        self.disc_out = nn.Linear(2 * (H // 2), 1)

    def groups(self) -> dict[str, list[nn.Parameter]]:
        """The players' parameter groups: ``autoencoder`` (e, r, shared action embedding), ``generator`` (g, s) and
        ``discriminator`` (d)."""
        out: dict[str, list[nn.Parameter]] = {"autoencoder": [], "generator": [], "discriminator": []}
        for n, p in self.named_parameters():
            key = ("discriminator" if n.startswith("disc_") else "generator" if n.startswith(("gen_", "sup_"))
                   else "autoencoder")
            out[key].append(p)
        return out

    def cond(self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, emb: nn.Embedding | None = None) -> torch.Tensor:
        """c_t = ``[X, A_t, emb(T_t)]``, ``[B, L, c]``."""
        B, L = T.shape
        return torch.cat([X.unsqueeze(1).expand(B, L, X.shape[-1]), A, (emb or self.action_emb)(T)], -1)

    def embed(self, C: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """h_t = e(c_≤t, Y_≤t), ``[B, L, k]`` in (0, 1)."""
        return torch.sigmoid(self.emb_out(self.emb_rnn(torch.cat([C, Y.unsqueeze(-1)], -1))[0]))

    def recover(self, Hc: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        """Bernoulli logits of Y_t from the codes, ``[B, L]``."""
        return self.recovery(torch.cat([Hc, C], -1))[..., 0]

    def supervise(self, prev: torch.Tensor, C: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """ĥ_t = s(code of step t−1 (``prev``), c_t), and the final state."""
        h, last = self.sup_rnn(torch.cat([prev, C], -1), state)
        return torch.sigmoid(self.sup_out(h)), last

    def generate(self, Z: torch.Tensor, C: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """ê_t = g(z_≤t, c_≤t), and the final state."""
        h, last = self.gen_rnn(torch.cat([Z, C], -1), state)
        return torch.sigmoid(self.gen_out(h)), last

    def discriminate(self, codes: torch.Tensor, Cd: torch.Tensor) -> torch.Tensor:
        """Per-step real/fake logits of latent codes under the discriminator's conditions ``Cd``."""
        return self.disc_out(self.disc_rnn(torch.cat([codes, Cd], -1))[0])[..., 0]


def _bce(logits: torch.Tensor, target: float, M: torch.Tensor) -> torch.Tensor:
    return masked_mean(F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target), reduction="none"), M).mean()


class TimeGANSimulator(SteppedSimulator):
    """TimeGAN behind the :class:`~fcd_secure.model.simulator.Simulator` protocol (module docstring)."""

    name = "timegan"
    network = TimeGANNetwork
    label = "TimeGAN"

    def make_optimizer(self) -> torch.optim.Optimizer:
        """One Adam over the groups ``autoencoder``, ``generator`` and ``discriminator``."""
        return grouped_adam(self.net.groups(), self.config.lr)

    def _supervised(self, Hc: torch.Tensor, C: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
        """L_S on real codes: ‖h_t − s(h_{t−1}, c_t)‖² over valid steps after the first."""
        pred, _ = self.net.supervise(shift_right(Hc, 0.0), C)
        m = M.clone()
        m[:, 0] = 0.0
        return masked_mean(((Hc - pred) ** 2).mean(-1), m).mean()

    def train_step(self, b: Batch) -> dict[str, float]:
        """Per batch an (e, r) step, a (g, s) step and a d step; the site label is not used."""
        net, opt, clip = self.net, self.optimizer, self.config.grad_clip
        B, L = b.T.shape
        C = net.cond(b.X, b.A, b.T)
        Cd = net.cond(b.X, b.A, b.T, net.disc_action_emb)
        # (e, r): reconstruction + λ · supervised
        Hc = net.embed(C, b.Y)
        rec = masked_mean(F.binary_cross_entropy_with_logits(net.recover(Hc, C), b.Y, reduction="none"), b.M).mean()
        sup = self._supervised(Hc, C, b.M)
        step_group(opt, rec + LAMBDA * sup, "autoencoder", clip)
        # (g, s): unsupervised (fool d on ĥ and ê) + η · supervised on the (now fixed) real codes
        C = net.cond(b.X, b.A, b.T).detach()
        Hc = net.embed(C, b.Y).detach()
        E_hat, _ = net.generate(torch.randn(B, L, net.k), C)
        H_hat, _ = net.supervise(shift_right(E_hat, 0.0), C)
        g_u = _bce(net.discriminate(H_hat, Cd), 1.0, b.M) + GAMMA * _bce(net.discriminate(E_hat, Cd), 1.0, b.M)
        g_s = self._supervised(Hc, C, b.M)
        step_group(opt, g_u + ETA * g_s, "generator", clip)
        # d: real codes vs both generated paths (its conditions re-embedded: the last graph was freed)
        Cd = net.cond(b.X, b.A, b.T, net.disc_action_emb)
        d_loss = (_bce(net.discriminate(Hc, Cd), 1.0, b.M) + _bce(net.discriminate(H_hat.detach(), Cd), 0.0, b.M)
                  + GAMMA * _bce(net.discriminate(E_hat.detach(), Cd), 0.0, b.M))
        step_group(opt, d_loss, "discriminator", clip)
        parts = {"reconstruction": float(rec.detach()), "supervised": float(g_s.detach()),
                 "generator": float(g_u.detach()), "discriminator": float(d_loss.detach())}
        parts["total"] = parts["reconstruction"] + parts["supervised"] + parts["generator"] + parts["discriminator"]
        return parts

    def stepper(self, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> Stepper:
        """Embed the logged prefix, then generate codes under the plan's actions (module docstring)."""
        return _TimeGANStepper(self.net, ds, rows, start_t, S, g)

    def factual_tensor(self, b: Batch, ds: SiteDataset) -> torch.Tensor:
        """σ(r(s(real code of t−1, c_t), c_t)) for every step."""
        net = self.net
        C = net.cond(b.X, b.A, b.T)
        pred, _ = net.supervise(shift_right(net.embed(C, b.Y), 0.0), C)
        return torch.sigmoid(net.recover(pred, C))


class _TimeGANStepper:
    """A TimeGAN rollout over one chunk of rows (module docstring, "from a logged history")."""

    def __init__(self, net: TimeGANNetwork, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> None:
        self.net = net
        X = torch.as_tensor(ds.X[rows], dtype=torch.float32)
        A = torch.as_tensor(ds.A[rows], dtype=torch.float32)
        self.X = X.repeat_interleave(S, 0)
        self.A = A.repeat_interleave(S, 0)
        B = self.X.shape[0]
        self.sup_state: torch.Tensor | None = None
        self.gen_state: torch.Tensor | None = None
        self.prev = torch.zeros(B, net.k)
        if start_t > 0:
            T = torch.as_tensor(ds.T[rows, :start_t], dtype=torch.long)
            Y = torch.as_tensor(ds.Y[rows, :start_t], dtype=torch.float32)
            C = net.cond(X, A[:, :start_t], T)
            Hc = net.embed(C, Y)
            _, sup_state = net.supervise(shift_right(Hc, 0.0), C)
            self.sup_state = sup_state.repeat_interleave(S, 1)
            self.prev = Hc[:, -1].repeat_interleave(S, 0)
            Cr = C.repeat_interleave(S, 0)
            _, self.gen_state = net.generate(torch.randn(B, start_t, net.k, generator=g), Cr)

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        net = self.net
        z = torch.randn(len(a), 1, net.k, generator=g)
        C = net.cond(self.X, self.A[:, t : t + 1], a.unsqueeze(1))
        h_hat, self.sup_state = net.supervise(self.prev.unsqueeze(1), C, self.sup_state)
        e_hat, self.gen_state = net.generate(z, C, self.gen_state)
        self.prev = e_hat[:, 0]
        return torch.sigmoid(net.recover(h_hat, C)[:, 0])

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        """TimeGAN's codes do not read the sampled outcomes: its state already moved in :meth:`prob`."""

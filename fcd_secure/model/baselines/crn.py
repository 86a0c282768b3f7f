"""The Counterfactual Recurrent Network (CRN; Bica, Alaa, Jordon & van der Schaar, "Estimating counterfactual
treatment outcomes over time through adversarially balanced representations", ICLR 2020; paper ref. [20]) as a
:class:`~fcd_secure.model.simulator.Simulator`, re-implemented from the paper (no code copied).

Architecture and losses, as in the paper:

* **encoder** — a recurrent network over the history ``[X, A_t, T_{t−1}, Y_{t−1}]`` whose state is mapped to a
  *balancing representation* Φ_t (ELU layer). Two heads read Φ_t: the outcome head G_Y(Φ_t, T_t) → Y_t and the
  treatment classifier G_T(Φ_t) → T_t behind a gradient-reversal layer (Ganin & Lempitsky 2015), so that minimising
  the treatment loss makes Φ_t *non-predictive* of the current treatment — the adversarial balancing against
  time-varying confounding. Loss: L_Y + L_T (the reversal supplies the minus sign of the min-max game).
* **decoder** — a second recurrent network initialised from the encoder's Φ_{t0} through a linear adapter, which
  predicts Y_{t0+1}, …, Y_{t0+τ} under a treatment sequence, again with a balancing representation Ψ, an outcome head
  and a reversed treatment classifier; trained with the same loss.

Choices the paper leaves open (or that this setting forces), stated here:

* **outcome** — Y is binary (the datasets of paper Table I); the outcome heads give a Bernoulli logit, L_Y is binary
  cross-entropy. CRN's paper predicts a continuous tumour volume with a squared error.
* **treatment** — T_t is one categorical action (up to thousands on Statics2011), embedded (``cfg.action_emb``)
  instead of one-hot; G_T is a softmax classifier, L_T cross-entropy.
* **reversal strength** — the paper ramps λ with the schedule 2/(1 + e^{−10p}) − 1 of training progress p; a site's
  local round does not know the global progress, so λ = 1 (the value the ramp tends to) throughout.
* **training schedule** — CRN trains the encoder, then the decoder on the frozen encoder. Under federation every
  round trains both: the decoder reads Φ_{t0} *detached*, so the decoder's loss never changes the encoder, which is
  the two-stage schedule run concurrently.
* **decoder windows** — for each trajectory of a batch one random t0 (uniform over its valid steps but the last) and
  the window to the end of the trajectory, teacher-forced with the logged (T, Y) as inputs; at simulation time the
  decoder is fed its own sampled outcomes.
* **sampling** — CRN predicts a mean; as a simulator, a rollout draws Y_t ~ Bernoulli(p_t) and feeds the draw back
  (Monte-Carlo over ``n_samples``), with the same random numbers for every plan.
* **sizes** — GRUs of width ``cfg.hidden``, Φ and Ψ of size ``cfg.k`` (= k_causal + k_site), heads of width
  ``cfg.mlp_hidden`` with one hidden layer; Adam at ``cfg.lr``; global-norm clip ``cfg.grad_clip``.
* **federation** — CRN has no site-local part: every parameter is Θc (full synchronisation, paper Table II).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import Batch
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.losses import masked_mean
from fcd_secure.model.networks import grad_reverse, mlp
from fcd_secure.model.baselines.fitting import step_group
from fcd_secure.model.baselines.rollout import Stepper, SteppedSimulator
from fcd_secure.model.baselines.sequence import history_inputs, shift_right

__all__ = ["CRNNetwork", "CRNSimulator"]

#: Gradient-reversal strength λ (module docstring, "reversal strength").
GRL_LAMBDA = 1.0


class CRNNetwork(nn.Module):
    """Encoder and decoder of CRN (module docstring). Build with :meth:`CRNSimulator.from_dims`."""

    def __init__(self, cfg: ModelConfig, dx: int, da: int, n_actions: int) -> None:
        super().__init__()
        self.dx, self.da, self.n_actions = dx, da, n_actions
        E, H, R, Hm = cfg.action_emb, cfg.hidden, cfg.k, cfg.mlp_hidden
        # index n_actions is the "no previous action" token at t = 0
        self.action_emb = nn.Embedding(n_actions + 1, E)
        self.enc_rnn = nn.GRU(dx + da + E + 2, H, batch_first=True)
        self.enc_repr = nn.Linear(H, R)
        self.enc_outcome = mlp(R + E, 1, Hm, depth=1)
        self.enc_treat = mlp(R, n_actions, Hm, depth=1)
        self.adapter = nn.Linear(R, H)
        self.dec_rnn = nn.GRU(dx + da + E + 1, H, batch_first=True)
        self.dec_repr = nn.Linear(H, R)
        self.dec_outcome = mlp(R + E, 1, Hm, depth=1)
        self.dec_treat = mlp(R, n_actions, Hm, depth=1)

    def encode(self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """Φ_t for every step, ``[B, L, R]``; Φ_t reads (X, A_≤t, T_<t, Y_<t) only."""
        prev_t = shift_right(T, self.n_actions)
        h, _ = self.enc_rnn(history_inputs(X, A, self.action_emb(prev_t), Y))
        return F.elu(self.enc_repr(h))

    def dec_inputs(self, X: torch.Tensor, A_t: torch.Tensor, T_prev: torch.Tensor, Y_prev: torch.Tensor) -> torch.Tensor:
        """Decoder input of one step or a window: ``[X, A_t, emb(T_{t−1}), Y_{t−1}]``."""
        Xe = X.unsqueeze(-2).expand(*A_t.shape[:-1], X.shape[-1]) if A_t.dim() == 3 else X
        return torch.cat([Xe, A_t, self.action_emb(T_prev), Y_prev.unsqueeze(-1)], -1)

    def outcome_logit(self, head: nn.Module, rep: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        return head(torch.cat([rep, self.action_emb(T)], -1))[..., 0]


class CRNSimulator(SteppedSimulator):
    """CRN behind the :class:`~fcd_secure.model.simulator.Simulator` protocol (module docstring)."""

    name = "crn"
    network = CRNNetwork
    label = "CRN"

    # -- training --------------------------------------------------------------------------------------------
    def losses(self, b: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Encoder and decoder losses on one batch (outcome BCE + reversed treatment cross-entropy each)."""
        net = self.net
        B, L = b.T.shape
        phi = net.encode(b.X, b.A, b.T, b.Y)
        enc_y = F.binary_cross_entropy_with_logits(net.outcome_logit(net.enc_outcome, phi, b.T), b.Y, reduction="none")
        enc_t = F.cross_entropy(net.enc_treat(grad_reverse(phi, GRL_LAMBDA)).transpose(1, 2), b.T, reduction="none")
        # decoder windows: one random t0 per row, then every later valid step, teacher-forced
        lengths = b.M.sum(1).long()
        t0 = (torch.rand(B) * (lengths - 1).clamp(min=0).float()).long()
        idx = torch.arange(L).expand(B, L)
        win = ((idx > t0.unsqueeze(1)) & (b.M > 0)).float()
        h0 = torch.tanh(net.adapter(phi[torch.arange(B), t0].detach())).unsqueeze(0)
        inp = net.dec_inputs(b.X, b.A, shift_right(b.T, net.n_actions), shift_right(b.Y, 0.0))
        # rows start their windows at different t0: run the decoder over every step, each row from its own h0 at
        # t0 + 1, by masking the state update before the window
        hd = self._decode_windows(inp, h0, t0)
        psi = F.elu(net.dec_repr(hd))
        dec_y = F.binary_cross_entropy_with_logits(net.outcome_logit(net.dec_outcome, psi, b.T), b.Y, reduction="none")
        dec_t = F.cross_entropy(net.dec_treat(grad_reverse(psi, GRL_LAMBDA)).transpose(1, 2), b.T, reduction="none")
        parts_t = {
            "enc_outcome": masked_mean(enc_y, b.M).mean(),
            "enc_treatment": masked_mean(enc_t, b.M).mean(),
            "dec_outcome": masked_mean(dec_y, win).mean(),
            "dec_treatment": masked_mean(dec_t, win).mean(),
        }
        loss = sum(parts_t.values())
        parts = {k: float(v.detach()) for k, v in parts_t.items()}
        parts["total"] = float(loss.detach())
        return loss, parts

    def _decode_windows(self, inp: torch.Tensor, h0: torch.Tensor, t0: torch.Tensor) -> torch.Tensor:
        """Decoder states ``[B, L, H]``: row i's state is h0_i until t0_i, then the GRU runs from t0_i + 1."""
        net = self.net
        L = inp.shape[1]
        h = h0[0]
        outs = []
        for t in range(L):
            step = net.dec_rnn(inp[:, t : t + 1], h.unsqueeze(0))[1][0]
            active = (t > t0).float().unsqueeze(1)
            h = active * step + (1 - active) * h
            outs.append(h)
        return torch.stack(outs, 1)

    def train_step(self, b: Batch) -> dict[str, float]:
        """One step of the encoder and decoder losses; the site label is not used."""
        loss, parts = self.losses(b)
        step_group(self.optimizer, loss, None, self.config.grad_clip)
        return parts

    def stepper(self, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> Stepper:
        """Encoder over the logged history before ``start_t``, its outcome head at ``start_t``, then the decoder fed
        with the plan's actions and its own sampled outcomes."""
        return _CRNStepper(self.net, ds, rows, start_t, S)

    def factual_tensor(self, b: Batch, ds: SiteDataset) -> torch.Tensor:
        """The encoder's one-step E[Y_t | Φ_t, logged T_t]."""
        net = self.net
        return torch.sigmoid(net.outcome_logit(net.enc_outcome, net.encode(b.X, b.A, b.T, b.Y), b.T))


class _CRNStepper:
    """A CRN rollout over one chunk of rows: encoder state at start_t, then the decoder."""

    def __init__(self, net: CRNNetwork, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int) -> None:
        self.net = net
        X = torch.as_tensor(ds.X[rows], dtype=torch.float32)
        A = torch.as_tensor(ds.A[rows], dtype=torch.float32)
        T = torch.as_tensor(ds.T[rows], dtype=torch.long)
        Y = torch.as_tensor(ds.Y[rows], dtype=torch.float32)
        phi = net.encode(X, A[:, : start_t + 1], T[:, : start_t + 1], Y[:, : start_t + 1])[:, start_t]
        self.phi = phi.repeat_interleave(S, 0)
        self.X = X.repeat_interleave(S, 0)
        self.A = A.repeat_interleave(S, 0)
        self.h = torch.tanh(net.adapter(self.phi)).unsqueeze(0)
        self.start_t = start_t
        self.psi: torch.Tensor | None = None

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        net = self.net
        if t == self.start_t:
            return torch.sigmoid(net.outcome_logit(net.enc_outcome, self.phi, a))
        assert self.psi is not None
        return torch.sigmoid(net.outcome_logit(net.dec_outcome, self.psi, a))

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        if t + 1 >= self.A.shape[1]:
            return
        net = self.net
        inp = net.dec_inputs(self.X, self.A[:, t + 1], a, y).unsqueeze(1)
        _, self.h = net.dec_rnn(inp, self.h)
        self.psi = F.elu(net.dec_repr(self.h[0]))

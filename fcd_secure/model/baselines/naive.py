"""The naive observational baseline: an outcome regression P(Y_t | X, A_t, T_t, Y_{t−1}) that ignores the rest of
the history, simulated forward by feeding its own sampled Y back as Y_{t−1}.

Under time-varying confounding (the logging policy reacts to the learner's hidden state) its action coefficient
absorbs the confounding, so its effects are biased: the reference a causal simulator must beat. It has no site-local
part, so if it were federated every parameter would be Θc.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.baselines.fitting import step_group
from fcd_secure.model.baselines.rollout import Stepper, SteppedSimulator
from fcd_secure.model.batch import Batch
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.losses import masked_mean
from fcd_secure.model.networks import mlp

__all__ = ["NaiveOutcomeModel", "NaiveSimulator"]


class NaiveOutcomeModel(nn.Module):
    """P(Y_t | X, A_t, T_t, Y_{t−1}): an MLP over the current step and the previous outcome only.

    Args:
        dx: static covariates.
        da: exogenous context features per step.
        n_actions: size of the action set.
        hidden: MLP width.
        action_emb: embedding size of T_t.
        outcome: 'binary' (logit) or 'gaussian' (mean).
    """

    def __init__(self, dx: int, da: int, n_actions: int, hidden: int = 64, action_emb: int = 8, outcome: str = "binary") -> None:
        super().__init__()
        self.dx, self.da, self.n_actions, self.outcome = dx, da, n_actions, outcome
        self.action_emb = nn.Embedding(n_actions, action_emb)
        self.net = mlp(dx + da + action_emb + 2, 1, hidden)

    def forward(self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, y_prev: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """Logit (binary) or mean (gaussian) of Y_t; all inputs share their leading axes, X broadcast by the caller."""
        return self.net(torch.cat([X, A, self.action_emb(T), y_prev.unsqueeze(-1), first.unsqueeze(-1)], -1))[..., 0]

    def mean(self, out: torch.Tensor) -> torch.Tensor:
        """E[Y_t] from the network's output: a probability for binary Y, the mean otherwise."""
        return torch.sigmoid(out) if self.outcome == "binary" else out

    def step_inputs(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(X broadcast over steps, Y_{t−1} with 0 at t = 0, the first-step indicator), each ``[B, L, ·]``."""
        B, L = Y.shape
        y_prev = torch.cat([torch.zeros(B, 1), Y[:, :-1]], 1)
        first = torch.zeros(B, L)
        first[:, 0] = 1
        return X.unsqueeze(1).expand(B, L, X.shape[-1]), y_prev, first

    def nll(self, batch: Batch) -> torch.Tensor:
        """Per-trajectory negative log-likelihood (squared error for gaussian Y) over valid steps, ``[B]``."""
        Xe, y_prev, first = self.step_inputs(batch.X, batch.Y)
        out = self(Xe, batch.A, batch.T, y_prev, first)
        Y = batch.Y
        per = F.binary_cross_entropy_with_logits(out, Y, reduction="none") if self.outcome == "binary" else (out - Y) ** 2
        return masked_mean(per, batch.M)


class NaiveSimulator(SteppedSimulator):
    """The naive observational model behind the :class:`~fcd_secure.model.simulator.Simulator` protocol: trained by
    maximum likelihood of the factual outcomes, rolled forward feeding the sampled Y back as Y_{t−1} (binary Y) or
    the mean (gaussian Y)."""

    name = "naive"
    label = "naive"
    # one generator over all rows, as this baseline has always drawn its rollouts: chunking would change its numbers
    chunk_rows = None

    @property
    def model(self) -> NaiveOutcomeModel:
        """The outcome model (:attr:`net`)."""
        return self.net

    @classmethod
    def build_network(cls, cfg: ModelConfig, dx: int, da: int, n_actions: int) -> NaiveOutcomeModel:
        """Width, action embedding and outcome type (binary or gaussian) from ``cfg``."""
        return NaiveOutcomeModel(dx, da, n_actions, hidden=cfg.mlp_hidden, action_emb=cfg.action_emb,
                                 outcome=cfg.outcome)

    def train_step(self, b: Batch) -> dict[str, float]:
        """One Adam step on the negative log-likelihood (no gradient clipping)."""
        loss = self.net.nll(b).mean()
        step_group(self.optimizer, loss, None, None)
        nll = float(loss.detach())
        return {"nll": nll, "total": nll}

    def stepper(self, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> Stepper:
        """The last logged outcome before ``start_t`` (0 at t = 0), then the simulated ones."""
        return _NaiveStepper(self.net, ds, rows, start_t, S)

    def factual_tensor(self, b: Batch, ds: SiteDataset) -> torch.Tensor:
        """E[Y_t | X, A_t, logged T_t, logged Y_{t−1}]."""
        Xe, y_prev, first = self.net.step_inputs(b.X, b.Y)
        return self.net.mean(self.net(Xe, b.A, b.T, y_prev, first))


class _NaiveStepper:
    """A naive rollout over one chunk of rows: the previous outcome is the whole state."""

    def __init__(self, net: NaiveOutcomeModel, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int) -> None:
        self.net = net
        self.X = torch.as_tensor(ds.X[rows], dtype=torch.float32).repeat_interleave(S, 0)
        self.A = torch.as_tensor(ds.A[rows], dtype=torch.float32).repeat_interleave(S, 0)
        self.y_prev = (torch.as_tensor(np.repeat(ds.Y[rows, start_t - 1], S).astype(np.float32)) if start_t > 0
                       else torch.zeros(len(self.X)))

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        first = torch.full((len(a),), 1.0 if t == 0 else 0.0)
        return self.net.mean(self.net(self.X, self.A[:, t], a, self.y_prev, first))

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        self.y_prev = y

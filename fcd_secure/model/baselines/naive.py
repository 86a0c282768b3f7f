"""The naive observational baseline: an outcome regression P(Y_t | X, A_t, T_t, Y_{t−1}) that ignores the rest of
the history, simulated forward by feeding its own sampled Y back as Y_{t−1}.

Under time-varying confounding (the logging policy reacts to the learner's hidden state) its action coefficient
absorbs the confounding, so its effects are biased: the reference a causal simulator must beat. It has no site-local
part, so if it were federated every parameter would be Θc.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.baselines.fitting import run_local_round
from fcd_secure.model.batch import Batch, dataset_tensors
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.losses import masked_mean
from fcd_secure.model.networks import mlp
from fcd_secure.model.simulator import Plan, SimResult, Simulator, check_window, plan_fn

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


class NaiveSimulator(Simulator):
    """The naive observational model behind the :class:`~fcd_secure.model.simulator.Simulator` protocol."""

    name = "naive"

    def __init__(self, model: NaiveOutcomeModel, config: ModelConfig) -> None:
        super().__init__(model, config)
        self.model = model

    @classmethod
    def from_dims(
        cls, cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, n_endogenous: int = 0
    ) -> "NaiveSimulator":
        """Width, action embedding and outcome type from ``cfg``; parameters initialised from ``cfg.seed``. It has no
        context model: its rollouts replay every context, endogenous ones included."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model = NaiveOutcomeModel(dx, da, n_actions, hidden=cfg.mlp_hidden, action_emb=cfg.action_emb,
                                      outcome=cfg.outcome)
        return cls(model, cfg)

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam at ``cfg.lr``."""
        return torch.optim.Adam(self.model.parameters(), lr=self.config.lr)

    def train_site(
        self, ds: SiteDataset, site_index: int | None, n_sites: int, epochs: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """Maximum likelihood of the factual outcomes (:func:`run_local_round`); the site label is not used."""
        opt = self.optimizer

        def step(batch: Batch) -> dict[str, float]:
            opt.zero_grad(set_to_none=True)
            loss = self.model.nll(batch).mean()
            loss.backward()
            opt.step()
            nll = float(loss.detach())
            return {"nll": nll, "total": nll}

        return run_local_round(self.model, ds, self.config.batch_size, epochs, seed, step)

    @torch.no_grad()
    def _simulate(self, ds: SiteDataset, plan: Plan, n_samples: int, seed: int, start_t: int, horizon: int | None,
                  anchors: tuple[int, int] | None, **kw: Any) -> SimResult:
        """Roll forward, feeding the sampled Y back as Y_{t−1} (binary Y) or the mean (gaussian Y).

        Raises:
            TypeError: for an option only another simulator knows (``kw`` must be empty).
        """
        if kw:
            raise TypeError(f"the naive simulator takes no options {sorted(kw)}")
        model = self.model
        model.eval()
        n, S = ds.n, n_samples
        H = check_window(ds.L, start_t, horizon)
        fn, name = plan_fn(plan, anchors, ds)
        g = torch.Generator().manual_seed(int(seed) * 1_000_003)
        X = torch.as_tensor(ds.X, dtype=torch.float32).repeat_interleave(S, 0)
        A = torch.as_tensor(ds.A, dtype=torch.float32).repeat_interleave(S, 0)
        rows = np.repeat(np.arange(n), S)
        lengths = np.repeat(ds.lengths, S)
        y_hist = np.repeat(ds.Y[:, :start_t], S, axis=0).astype(np.float32)
        y_prev = torch.as_tensor(y_hist[:, -1] if start_t > 0 else np.zeros(n * S, np.float32))
        probs = np.zeros((n, S, H), np.float32)
        ys = np.zeros((n, S, H), np.float32)
        acts = np.zeros((n, S, H), np.int64)
        for h in range(H):
            t = start_t + h
            a = fn(h, t, y_hist, lengths, rows, A[:, : t + 1].numpy())  # no context model: contexts are replayed
            first = torch.full((n * S,), 1.0 if t == 0 else 0.0)
            p = model.mean(model(X, A[:, t], torch.as_tensor(a), y_prev, first))
            u = torch.rand(n * S, generator=g)
            y = (u < p).float() if model.outcome == "binary" else p
            probs[:, :, h] = p.view(n, S).numpy()
            ys[:, :, h] = y.view(n, S).numpy()
            acts[:, :, h] = a.reshape(n, S)
            y_hist = np.concatenate([y_hist, y.numpy()[:, None]], 1)
            y_prev = y
        return SimResult.from_rollout(name, ds, start_t, probs, ys, acts, meta={"model": "naive", "seed": seed})

    @torch.no_grad()
    def factual_probs(self, ds: SiteDataset) -> np.ndarray:
        """E[Y_t | X, A_t, logged T_t, logged Y_{t−1}], float64 ``[n, L]``."""
        with self.evaluating() as model:
            b = dataset_tensors(ds, 0)
            Xe, y_prev, first = model.step_inputs(b.X, b.Y)
            p = model.mean(model(Xe, b.A, b.T, y_prev, first))
        return p.numpy().astype(np.float64)

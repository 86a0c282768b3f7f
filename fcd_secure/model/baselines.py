"""Two simple reference models for the centralised comparison (``fcd train --centralised``).

* **GRU g-formula** (:func:`gformula_config`): the same encoder and decoder as Fed-CausalDiff, the same losses,
  but a deterministic latent transition K_{t+1} = f(K_t, A_t, T_t) instead of the diffusion (no Phase B noise).
  It isolates what the stochastic transition buys.
* **Naive observational model** (:class:`NaiveOutcomeModel`): an outcome regression
  P(Y_t | X, A_t, T_t, Y_{t−1}) that ignores the rest of the history. Simulated forward by feeding its own sampled
  Y back as Y_{t−1}. Under time-varying confounding (the logging policy reacts to the learner's hidden state) its
  action coefficient absorbs the confounding, so its effects are biased — the reference the causal model must beat.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.losses import masked_mean
from fcd_secure.model.networks import mlp
from fcd_secure.model.simulate import Plan, SimResult, _plan_fn, effect_window_mask
from fcd_secure.model.training import make_loader


def gformula_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with the diffusion replaced by a deterministic latent transition (the GRU g-formula baseline)."""
    return cfg.model_copy(update={"transition": "deterministic"})


class NaiveOutcomeModel(nn.Module):
    """P(Y_t | X, A_t, T_t, Y_{t−1}) — an MLP over the current step and the previous outcome only."""

    def __init__(self, dx: int, da: int, n_actions: int, hidden: int = 64, action_emb: int = 8, outcome: str = "binary") -> None:
        super().__init__()
        self.dx, self.da, self.n_actions, self.outcome = dx, da, n_actions, outcome
        self.action_emb = nn.Embedding(n_actions, action_emb)
        self.net = mlp(dx + da + action_emb + 2, 1, hidden)

    def forward(self, X: torch.Tensor, A: torch.Tensor, T: torch.Tensor, y_prev: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """Logit (binary) or mean (gaussian) of Y_t; all inputs share their leading axes, X broadcast by the caller."""
        return self.net(torch.cat([X, A, self.action_emb(T), y_prev.unsqueeze(-1), first.unsqueeze(-1)], -1))[..., 0]

    def step_inputs(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, L = Y.shape
        y_prev = torch.cat([torch.zeros(B, 1), Y[:, :-1]], 1)
        first = torch.zeros(B, L)
        first[:, 0] = 1
        return X.unsqueeze(1).expand(B, L, X.shape[-1]), y_prev, first

    def nll(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        X, A, T, Y, M, _ = batch
        Xe, y_prev, first = self.step_inputs(X, Y)
        out = self(Xe, A, T, y_prev, first)
        per = F.binary_cross_entropy_with_logits(out, Y, reduction="none") if self.outcome == "binary" else (out - Y) ** 2
        return masked_mean(per, M)


def train_naive(
    model: NaiveOutcomeModel, ds: SiteDataset, epochs: int, seed: int, lr: float = 2e-3, batch_size: int = 64
) -> dict[str, float]:
    """Fit by maximum likelihood of the factual outcomes (pooled over sites)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dl = make_loader(ds, batch_size, seed, site_index=0)
    total, count = 0.0, 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(epochs):
            for batch in dl:
                opt.zero_grad(set_to_none=True)
                loss = model.nll(batch).mean()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(batch[0])
                count += len(batch[0])
    return {"nll": total / max(count, 1), "n": float(ds.n)}


@torch.no_grad()
def simulate_naive(
    model: NaiveOutcomeModel,
    ds: SiteDataset,
    plan: Plan,
    n_samples: int,
    seed: int,
    start_t: int = 0,
    horizon: int | None = None,
    anchors: tuple[int, int] | None = None,
) -> SimResult:
    """Roll the naive model forward, feeding its sampled Y back as Y_{t−1}; same outputs as ``simulate``."""
    model.eval()
    n, L, S = ds.n, ds.L, n_samples
    H = (L - start_t) if horizon is None else int(horizon)
    if not (0 <= start_t < L and 1 <= H <= L - start_t):
        raise ValueError(f"bad window start_t={start_t} horizon={horizon} for L={L}")
    fn, name = _plan_fn(plan, anchors)
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
        a = fn(h, t, y_hist, lengths, rows)
        first = torch.full((n * S,), 1.0 if t == 0 else 0.0)
        out = model(X, A[:, t], torch.as_tensor(a), y_prev, first)
        p = torch.sigmoid(out) if model.outcome == "binary" else out
        u = torch.rand(n * S, generator=g)
        y = (u < p).float() if model.outcome == "binary" else p
        probs[:, :, h] = p.view(n, S).numpy()
        ys[:, :, h] = y.view(n, S).numpy()
        acts[:, :, h] = a.reshape(n, S)
        y_hist = np.concatenate([y_hist, y.numpy()[:, None]], 1)
        y_prev = y
    mask = ds.M[:, start_t : start_t + H].astype(np.float32)
    vpp = ((probs * mask[:, None]).sum(2) / np.maximum(mask.sum(1), 1)[:, None]).mean(1)
    value = float(vpp.mean())
    se = float(vpp.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return SimResult(name, start_t, H, probs, ys, acts, mask, vpp, value, se, (value - 1.96 * se, value + 1.96 * se),
                     meta={"model": "naive", "seed": seed})


def estimate_effects_naive(
    model: NaiveOutcomeModel, ds: SiteDataset, anchors: tuple[int, int], anchor_step: int, horizon: int,
    n_samples: int, seed: int, **_: Any,
) -> np.ndarray:
    """Same definition as :func:`fcd_secure.model.simulate.estimate_effects`, for the naive model."""
    a_off, a_on = anchors
    on = simulate_naive(model, ds, int(a_on), n_samples, seed, anchor_step, horizon)
    off = simulate_naive(model, ds, int(a_off), n_samples, seed, anchor_step, horizon)
    m = effect_window_mask(ds, anchor_step, horizon)
    return ((on.probs - off.probs).mean(1) * m).sum(1) / m.sum(1)

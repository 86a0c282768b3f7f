"""Per-step inputs and the discrete-outcome sampler the baselines share (CRN, RCGAN, TimeGAN, FedCM).

* :func:`history_inputs` — what a causal recurrent model may read at step t: ``[X, A_t, T_{t−1}, Y_{t−1}, 1{t=0}]``
  (the same information set as Fed-CausalDiff's encoder, paper §III-A), so K_t / Φ_t summarises the history before
  T_t and Y_t;
* :func:`history_summary` — a fixed, parameter-free summary of the outcome history (Y_{t−1}, the running mean of
  Y_{<t}, the first-step flag and the relative position t/L) for models whose mechanisms read explicit parents;
* :func:`st_bernoulli` — a straight-through Gumbel (logistic-noise) Bernoulli sample, exactly 0/1 forward and the
  relaxed sample's gradient backward (Jang et al., ICLR 2017; Maddison et al., ICLR 2017), so a GAN's fake binary
  outcomes are as discrete as the real ones a discriminator sees.

Every baseline here models a binary outcome (the four datasets of paper Table I are binary);
:func:`check_binary` refuses any other.
"""

from __future__ import annotations

import torch

from fcd_secure.model.config import ModelConfig

__all__ = ["GUMBEL_TAU", "check_binary", "history_inputs", "history_summary", "shift_right", "st_bernoulli"]

#: Temperature of the relaxed Bernoulli behind :func:`st_bernoulli`'s gradient.
GUMBEL_TAU = 0.5


def check_binary(cfg: ModelConfig, name: str) -> None:
    """Refuse a non-binary outcome for baseline ``name``.

    Raises:
        ValueError: naming ``model.outcome``.
    """
    if cfg.outcome != "binary":
        raise ValueError(f"model.outcome = {cfg.outcome!r}: the {name} baseline models binary outcomes only")


def shift_right(v: torch.Tensor, fill: float | int) -> torch.Tensor:
    """``v`` shifted one step later along axis 1 (``[B, L, ...]``), ``fill`` at t = 0: the value of step t−1."""
    pad = torch.full_like(v[:, :1], fill)
    return torch.cat([pad, v[:, :-1]], 1)


def history_inputs(
    X: torch.Tensor, A: torch.Tensor, prev_t_emb: torch.Tensor, Y: torch.Tensor
) -> torch.Tensor:
    """``[X, A_t, emb(T_{t−1}), Y_{t−1}, 1{t=0}]`` per step, ``[B, L, dx + da + E + 2]``.

    Args:
        X: ``[B, dx]``.
        A: ``[B, L, da]``.
        prev_t_emb: the embedding of T_{t−1} (a "no action" token at t = 0), ``[B, L, E]``.
        Y: the outcomes ``[B, L]`` (Y_{t−1} is read, never Y_t).
    """
    B, L = Y.shape
    first = torch.zeros(B, L)
    first[:, 0] = 1.0
    return torch.cat(
        [X.unsqueeze(1).expand(B, L, X.shape[-1]), A, prev_t_emb, shift_right(Y, 0.0).unsqueeze(-1), first.unsqueeze(-1)],
        -1,
    )


def history_summary(Y: torch.Tensor, L: int) -> torch.Tensor:
    """``[Y_{t−1}, mean(Y_{<t}), 1{t=0}, t/(L−1)]`` per step, ``[B, T, 4]`` for outcomes ``Y`` ``[B, T]`` (T ≤ L).

    Padding steps of a shorter trajectory come after its valid prefix, so they never enter the summary of a valid
    step.
    """
    B, T = Y.shape
    prev = shift_right(Y, 0.0)
    t_idx = torch.arange(T, dtype=torch.float32).expand(B, T)
    past_mean = torch.cumsum(prev, 1) / t_idx.clamp(min=1.0)
    first = (t_idx == 0).float()
    return torch.stack([prev, past_mean, first, t_idx / max(L - 1, 1)], -1)


def st_bernoulli(logits: torch.Tensor, noise: torch.Tensor, tau: float = GUMBEL_TAU) -> torch.Tensor:
    """A 0/1 sample of Bernoulli(σ(logits)) with the relaxed sample's gradient (straight-through).

    Args:
        logits: the Bernoulli logits.
        noise: U(0, 1) draws of the same shape (passed in, so the caller decides the random stream).
        tau: temperature of the relaxation.

    Returns:
        ``hard + soft − soft.detach()``: equal to the hard sample, differentiable through ``soft``.
    """
    u = noise.clamp(1e-6, 1 - 1e-6)
    soft = torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / tau)
    hard = (soft > 0.5).float()
    return hard + soft - soft.detach()

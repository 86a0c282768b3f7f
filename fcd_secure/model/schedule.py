"""The forward-noising schedule of the latent transition diffusion (paper §III-B, Phase B; DDPM, Ho et al. 2020).

Kept apart from the networks, diffusers-style: the ε-networks only see ``(K^(n)_{t+1}, n, condition)``; the
schedule says how ``K^(n)`` is made from ``K_{t+1}`` and is what the samplers walk back.

The schedule is a plain object holding tensors, not an ``nn.Module`` with registered buffers: Opacus refuses
trainable modules that carry buffers (``GradSampleModule``: "Model contains a trainable layer with buffers"), and the schedule has nothing to learn.
"""

from __future__ import annotations

import math

import torch

from fcd_secure.model.config import ModelConfig


class NoiseSchedule:
    """Variance schedule β_1..β_N and its cumulative products ᾱ_n = Π_{i≤n} (1 − β_i).

    Indices are 0-based: ``n ∈ {0, …, N−1}``; ``alpha_bar[n]`` is ᾱ_{n+1} in the paper's 1-based notation.
    """

    def __init__(self, n_steps: int, kind: str = "cosine", beta_start: float = 1e-4, beta_end: float = 0.02) -> None:
        if n_steps < 2:
            raise ValueError(f"diffusion_steps must be >= 2, got {n_steps}")
        if kind == "linear":
            betas = torch.linspace(beta_start, beta_end, n_steps, dtype=torch.float64)
        elif kind == "cosine":
            # Nichol & Dhariwal (2021): ᾱ(s) = cos²((s/N + 0.008)/1.008 · π/2), betas clipped at 0.999.
            s = 0.008
            x = torch.arange(n_steps + 1, dtype=torch.float64) / n_steps
            f = torch.cos((x + s) / (1 + s) * math.pi / 2) ** 2
            ab = f / f[0]
            betas = (1 - ab[1:] / ab[:-1]).clamp(1e-5, 0.999)
        else:
            raise ValueError(f"unknown schedule {kind!r}; expected 'linear' or 'cosine'")
        self.kind = kind
        self.n_steps = n_steps
        self.betas = betas.float()
        self.alphas = (1 - betas).float()
        self.alpha_bar = torch.cumprod(1 - betas, 0).float()

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> "NoiseSchedule":
        """The schedule ``cfg`` names (steps, kind, β range)."""
        return cls(cfg.diffusion_steps, cfg.schedule, cfg.beta_start, cfg.beta_end)

    def q_sample(self, x0: torch.Tensor, n: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """K^(n) = sqrt(ᾱ_n)·K_0 + sqrt(1 − ᾱ_n)·ε  (DDPM forward process, closed form).

        ``n`` has the shape of ``x0`` without its last (feature) axis.
        """
        ab = self.alpha_bar.to(x0.device)[n].unsqueeze(-1)
        return ab.sqrt() * x0 + (1 - ab).sqrt() * eps


def timestep_embedding(n: torch.Tensor, dim: int, n_steps: int) -> torch.Tensor:
    """Sinusoidal embedding of the diffusion step (Vaswani-style), scaled so N maps to ~1000 positions.

    Parameter-free on purpose: nothing here needs to be synchronised or privatised.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=n.device) / max(half, 1))
    args = (n.float() * (1000.0 / n_steps)).unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[..., :1])], dim=-1)
    return emb

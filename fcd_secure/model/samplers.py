"""Reverse-process samplers for the latent transition K_t → K_{t+1} (paper §III-B, Phase B).

Both take ``eps_fn(x_n, n) -> ε̂`` (the summed prediction ε_c + ε_s with the condition already bound), so they
know nothing of the networks:

* :func:`ddpm_sample` — ancestral DDPM (Ho et al. 2020, Alg. 2), all N steps, stochastic.
* :func:`ddim_sample` — deterministic DDIM (Song et al. 2021, η = 0) on a strided sub-sequence of S ≤ N steps.
  Given the same initial noise it is a deterministic map, which is also what makes it usable, with gradients,
  inside L_cf.

Randomness comes only from the ``generator`` passed in (or from the global RNG when it is None, the case used
during training so that Opacus sees per-row noise drawn inside the forward pass).
"""

from __future__ import annotations

from typing import Callable

import torch

from fcd_secure.model.schedule import NoiseSchedule

EpsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: K lives in tanh range; clipping the x0-estimate to a slightly wider box stabilises few-step sampling.
X0_CLIP = 1.5


def _randn(shape: tuple[int, ...], generator: torch.Generator | None, like: torch.Tensor | None = None) -> torch.Tensor:
    dev = like.device if like is not None else None
    return torch.randn(shape, generator=generator, device=dev)


def ddpm_sample(
    eps_fn: EpsFn,
    schedule: NoiseSchedule,
    shape: tuple[int, ...],
    generator: torch.Generator | None = None,
    x_init: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ancestral sampling: x_{n-1} = (x_n − β_n/sqrt(1−ᾱ_n)·ε̂)/sqrt(α_n) + σ_n·z, σ_n² = β̃_n (posterior variance)."""
    x = x_init if x_init is not None else _randn(shape, generator)
    lead = x.shape[:-1]
    ab, a, b = schedule.alpha_bar, schedule.alphas, schedule.betas
    for n in range(schedule.n_steps - 1, -1, -1):
        nt = torch.full(lead, n, dtype=torch.long)
        eps = eps_fn(x, nt)
        x0 = ((x - (1 - ab[n]).sqrt() * eps) / ab[n].sqrt()).clamp(-X0_CLIP, X0_CLIP)
        if n == 0:
            x = x0
            break
        # posterior mean μ̃(x_n, x0) and variance β̃_n = β_n (1 − ᾱ_{n−1}) / (1 − ᾱ_n)
        ab_prev = ab[n - 1]
        mean = (ab_prev.sqrt() * b[n] / (1 - ab[n])) * x0 + (a[n].sqrt() * (1 - ab_prev) / (1 - ab[n])) * x
        var = b[n] * (1 - ab_prev) / (1 - ab[n])
        x = mean + var.sqrt() * _randn(tuple(x.shape), generator, x)
    return x


def ddim_timesteps(n_steps: int, s_steps: int) -> list[int]:
    """Evenly strided, descending sub-sequence of S indices from N−1 down to 0."""
    if not 1 <= s_steps <= n_steps:
        raise ValueError(f"DDIM steps must be in [1, {n_steps}], got {s_steps}")
    if s_steps == 1:
        return [n_steps - 1]
    idx = torch.linspace(n_steps - 1, 0, s_steps).round().long().tolist()
    out: list[int] = []
    for i in idx:
        if not out or i != out[-1]:
            out.append(int(i))
    return out


def ddim_sample(
    eps_fn: EpsFn,
    schedule: NoiseSchedule,
    shape: tuple[int, ...],
    steps: int,
    generator: torch.Generator | None = None,
    x_init: torch.Tensor | None = None,
) -> torch.Tensor:
    """DDIM with η = 0: x_{prev} = sqrt(ᾱ_prev)·x̂0 + sqrt(1−ᾱ_prev)·ε̂, x̂0 = (x_n − sqrt(1−ᾱ_n)·ε̂)/sqrt(ᾱ_n).

    Only the initial noise is random; the rest is deterministic (and differentiable).
    """
    x = x_init if x_init is not None else _randn(shape, generator)
    lead = x.shape[:-1]
    ab = schedule.alpha_bar
    seq = ddim_timesteps(schedule.n_steps, steps)
    for i, n in enumerate(seq):
        nt = torch.full(lead, n, dtype=torch.long)
        eps = eps_fn(x, nt)
        x0 = ((x - (1 - ab[n]).sqrt() * eps) / ab[n].sqrt()).clamp(-X0_CLIP, X0_CLIP)
        if i == len(seq) - 1:
            x = x0
        else:
            ab_prev = ab[seq[i + 1]]
            x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
    return x

"""Do-simulation with a trained Fed-CausalDiff: roll the latent state forward under do(T_t = π(history)) and
decode outcomes (paper §III-A "Probabilistic State Transition K_{t+1} ~ p_Θ(K_{t+1}|K_t, A_t, do(T_t))", §V).

How a rollout works (the paper's reading, in latent space):

1. the encoder reads the logged history up to ``start_t`` and gives K_{start_t} (with ``start_t = 0`` it has only
   X and A_0);
2. for h = 0 … H−1, t = start_t + h: the action a_t = π(t, simulated Y history) (or the fixed plan); the decoder
   gives E[Y_t | K_t, A_t, a_t] (and a sampled Y_t); the diffusion transition draws K_{t+1} ~ p_Θ(·|K_t, A_t, a_t).

Simulated outcomes are NOT fed back through the encoder: the transition carries the state, which is what the
paper's model is for (and what makes its stochasticity matter). ``rollout='encoder'`` does feed (a_t, Y_t) back
through the GRU instead — a Monte-Carlo g-formula kept for comparison; on DKT-Synth it was the worse of the two. The exogenous context A_t is taken from the logged
trajectory. Each patient is simulated ``n_samples`` times; randomness comes from one generator seeded by ``seed``
and the row chunk, and is drawn in the same order whatever the policy, so two policies (or two arms of an effect)
share their random numbers (common random numbers, DESIGN trap 6).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.networks import unwrap
from fcd_secure.model.simulator import (
    Plan,
    SimResult,
    Simulator,
    check_window,
    contrast_effects,
    plan_fn,
)

__all__ = ["estimate_effects", "simulate", "simulate_policy"]


@torch.no_grad()
def simulate(
    model: nn.Module,
    ds: SiteDataset,
    plan: Plan,
    n_samples: int,
    seed: int,
    start_t: int = 0,
    horizon: int | None = None,
    anchors: tuple[int, int] | None = None,
    sample_y: bool = True,
    sampler: str | None = None,
    steps: int | None = None,
    chunk_rows: int = 512,
    rollout: str | None = None,
) -> SimResult:
    """Roll out ``plan`` for every trajectory of ``ds`` from ``start_t`` for ``horizon`` steps, ``n_samples`` times.

    Args:
        model: a FedCausalDiff network (bare or wrapped by Opacus).
        ds: trajectories; the history before ``start_t`` is taken as logged.
        plan: a policy, a constant action or an action array (:data:`~fcd_secure.model.simulator.Plan`).
        n_samples: simulated futures per trajectory.
        seed: seed of all draws (one generator per row chunk).
        start_t: first simulated step.
        horizon: steps to simulate (None: to the end).
        anchors: ``(a_off, a_on)`` for a policy plan.
        sample_y: feed sampled outcomes (True) or their probabilities to the policy's history.
        sampler: 'ddim' or 'ddpm' (default ``cfg.sampler``).
        steps: DDIM steps per transition (default ``cfg.sampler_steps``).
        chunk_rows: rows simulated together.
        rollout: 'latent' (default ``cfg.rollout``) steps K with the diffusion transition (module docstring);
            'encoder' feeds the simulated (a_t, Y_t) back through the encoder instead (kept for comparison).

    Returns:
        The outcome trajectories and the policy value.

    Raises:
        ValueError: a window outside the data, dims that do not match the model, or a policy that returns an
            action outside the action set.
    """
    core = unwrap(model)
    rollout = rollout or core.cfg.rollout
    if rollout not in ("latent", "encoder"):
        raise ValueError(f"unknown rollout {rollout!r}; expected 'latent' or 'encoder'")
    was_training = core.training
    core.eval()
    n = ds.n
    H = check_window(ds.L, start_t, horizon)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if ds.n_actions != core.n_actions or ds.dx != core.dx or ds.da != core.da:
        raise ValueError(
            f"{ds.name}: dims (dx={ds.dx}, da={ds.da}, n_actions={ds.n_actions}) do not match the model {core.dims}"
        )
    fn, name = plan_fn(plan, anchors)
    S = n_samples
    probs = np.zeros((n, S, H), dtype=np.float32)
    ys = np.zeros((n, S, H), dtype=np.float32)
    acts = np.zeros((n, S, H), dtype=np.int64)
    lengths_all = ds.lengths
    for c0 in range(0, n, chunk_rows):
        rows = np.arange(c0, min(n, c0 + chunk_rows))
        b = len(rows)
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + c0)
        X = torch.as_tensor(ds.X[rows], dtype=torch.float32)
        A = torch.as_tensor(ds.A[rows], dtype=torch.float32)
        T = torch.as_tensor(ds.T[rows], dtype=torch.long)
        Y = torch.as_tensor(ds.Y[rows], dtype=torch.float32)
        K, state = core.encode_prefix(X, A, T, Y, start_t)
        K = K.repeat_interleave(S, 0)  # [b*S, k], patient-major
        state = state.repeat_interleave(S, 1)
        X_rep = X.repeat_interleave(S, 0)
        A_rep = A.repeat_interleave(S, 0)
        rows_rep = np.repeat(rows, S)
        lengths = np.repeat(lengths_all[rows], S)
        y_hist = np.repeat(ds.Y[rows, :start_t], S, axis=0).astype(np.float32)
        for h in range(H):
            t = start_t + h
            a = fn(h, t, y_hist, lengths, rows_rep)
            if a.shape != (b * S,):
                raise ValueError(f"policy {name} returned shape {a.shape} at t={t}, expected ({b * S},)")
            if (a < 0).any() or (a >= core.n_actions).any():
                raise ValueError(f"policy {name} returned an action outside [0, {core.n_actions}) at t={t}")
            at = torch.as_tensor(a)
            out = core.decode(K, A_rep[:, t], at)
            u = torch.rand(b * S, generator=g)
            if core.cfg.outcome == "binary":
                p = torch.sigmoid(out[..., 0])
                y = (u < p).float()
            else:
                p = out[..., 0]
                z = torch.randn(b * S, generator=g)
                y = p + torch.exp(out[..., 1].clamp(-5, 5)) * z
            probs[rows, :, h] = p.view(b, S).numpy()
            ys[rows, :, h] = y.view(b, S).numpy()
            acts[rows, :, h] = a.reshape(b, S)
            y_hist = np.concatenate([y_hist, (y if sample_y else p).numpy()[:, None]], axis=1)
            if h < H - 1 and rollout == "latent":
                K = core.transition(K, A_rep[:, t], at, sampler=sampler, steps=steps, generator=g)
            elif h < H - 1:
                K, state = core.encode_step(state, X_rep, A_rep[:, t + 1], at, y)
    if was_training:
        core.train()
    return SimResult.from_rollout(
        name, ds, start_t, probs, ys, acts,
        meta={"sampler": sampler or core.cfg.sampler, "steps": steps or core.cfg.sampler_steps,
              "transition": core.cfg.transition, "rollout": rollout, "seed": seed},
    )


def _rollout_of(model: nn.Module | Simulator) -> Callable[..., SimResult]:
    """``simulate(ds, plan, n_samples, seed, ...)`` of a Simulator, or :func:`simulate` bound to a network."""
    return model.simulate if isinstance(model, Simulator) else partial(simulate, model)


def simulate_policy(
    model: nn.Module | Simulator,
    ds: SiteDataset,
    policy: Plan,
    anchors: tuple[int, int],
    n_samples: int,
    seed: int,
    start_t: int = 0,
    horizon: int | None = None,
    **kw: Any,
) -> SimResult:
    """Simulate ``policy`` (an object with ``.name`` and ``.actions(t, y_hist, lengths, a_off, a_on)``, or any
    plan :func:`simulate` accepts) on every trajectory of ``ds``; returns outcome trajectories and the value."""
    return _rollout_of(model)(ds, policy, n_samples, seed, start_t=start_t, horizon=horizon, anchors=anchors, **kw)


def estimate_effects(
    model: nn.Module | Simulator,
    ds: SiteDataset,
    anchors: tuple[int, int],
    anchor_step: int,
    horizon: int,
    n_samples: int,
    seed: int,
    **kw: Any,
) -> np.ndarray:
    """Individual effects τ̂ ``[n]`` of ``model`` (a FedCausalDiff network or any Simulator): always-a_on minus
    always-a_off from ``anchor_step`` over ``horizon`` (:func:`~fcd_secure.model.simulator.contrast_effects`)."""
    return contrast_effects(_rollout_of(model), ds, anchors, anchor_step, horizon, n_samples, seed, **kw)

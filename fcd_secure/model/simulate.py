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

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.networks import unwrap


class PolicyLike(Protocol):
    name: str

    def actions(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int) -> np.ndarray: ...


#: A plan is a policy object, ``fn(t, y_hist, lengths) -> int64[B]``, a constant action, or actions [H] / [n, H].
Plan = Any


@dataclass
class SimResult:
    """Outcome trajectories of one simulated policy.

    ``probs[i, s, h]`` is E[Y_{start_t+h} | simulated state] for patient i and sample s; ``y`` the sampled outcome;
    ``mask[i, h]`` the logged valid-step mask over the window. ``value_per_patient[i]`` = mean over samples of
    (1/L_i) Σ_h M·probs — the policy value of the evaluation note (per-step average outcome over valid steps).
    ``value`` is its mean over patients, with the between-patient standard error and a normal 95 % interval.
    """

    name: str
    start_t: int
    horizon: int
    probs: np.ndarray
    y: np.ndarray
    actions: np.ndarray
    mask: np.ndarray
    value_per_patient: np.ndarray
    value: float
    se: float
    ci95: tuple[float, float]
    meta: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.name, "value": self.value, "se": self.se, "ci95": list(self.ci95),
                "start_t": self.start_t, "horizon": self.horizon, "n": int(self.probs.shape[0]),
                "n_samples": int(self.probs.shape[1])}


def _plan_fn(plan: Plan, anchors: tuple[int, int] | None) -> tuple[Callable[[int, int, np.ndarray, np.ndarray, np.ndarray], np.ndarray], str]:
    """Normalise a plan to fn(h, t, y_hist, lengths, rows) -> int64[B]."""
    if hasattr(plan, "actions") and callable(plan.actions):
        if anchors is None:
            raise ValueError("a policy needs anchors=(a_off, a_on)")
        a_off, a_on = anchors
        return (lambda h, t, yh, ln, rows: np.asarray(plan.actions(t, yh, ln, a_off, a_on), dtype=np.int64)), str(
            getattr(plan, "name", "policy")
        )
    if isinstance(plan, (int, np.integer)):
        return (lambda h, t, yh, ln, rows: np.full(len(ln), int(plan), dtype=np.int64)), f"always_{int(plan)}"
    if isinstance(plan, np.ndarray):
        arr = plan.astype(np.int64)
        if arr.ndim == 1:
            return (lambda h, t, yh, ln, rows: np.full(len(ln), arr[h], dtype=np.int64)), "plan"
        if arr.ndim == 2:
            return (lambda h, t, yh, ln, rows: arr[rows, h]), "plan"
        raise ValueError(f"an action plan must be [H] or [n, H], got shape {arr.shape}")
    if callable(plan):
        return (lambda h, t, yh, ln, rows: np.asarray(plan(t, yh, ln), dtype=np.int64)), getattr(plan, "__name__", "plan")
    raise TypeError(f"cannot use {type(plan).__name__} as a policy or action plan")


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

    ``rollout`` (default ``cfg.rollout``): 'latent' steps K with the diffusion transition (module docstring);
    'encoder' feeds the simulated (a_t, Y_t) back through the encoder instead (kept for comparison).
    """
    core = unwrap(model)
    rollout = rollout or core.cfg.rollout
    if rollout not in ("latent", "encoder"):
        raise ValueError(f"unknown rollout {rollout!r}; expected 'latent' or 'encoder'")
    was_training = core.training
    core.eval()
    n, L = ds.n, ds.L
    if not 0 <= start_t < L:
        raise ValueError(f"start_t must be in [0, {L}), got {start_t}")
    H = (L - start_t) if horizon is None else int(horizon)
    if not 1 <= H <= L - start_t:
        raise ValueError(f"horizon must be in [1, {L - start_t}] from start_t={start_t}, got {horizon}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if ds.n_actions != core.n_actions or ds.dx != core.dx or ds.da != core.da:
        raise ValueError(
            f"{ds.name}: dims (dx={ds.dx}, da={ds.da}, n_actions={ds.n_actions}) do not match the model {core.dims}"
        )
    fn, name = _plan_fn(plan, anchors)
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
    mask = ds.M[:, start_t : start_t + H].astype(np.float32)
    denom = np.maximum(mask.sum(1), 1.0)
    vpp = ((probs * mask[:, None, :]).sum(2) / denom[:, None]).mean(1)
    value = float(vpp.mean())
    se = float(vpp.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    if was_training:
        core.train()
    return SimResult(
        name=name, start_t=start_t, horizon=H, probs=probs, y=ys, actions=acts, mask=mask,
        value_per_patient=vpp, value=value, se=se, ci95=(value - 1.96 * se, value + 1.96 * se),
        meta={"sampler": sampler or core.cfg.sampler, "steps": steps or core.cfg.sampler_steps,
              "transition": core.cfg.transition, "rollout": rollout, "seed": seed},
    )


def simulate_policy(
    model: nn.Module,
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
    return simulate(model, ds, policy, n_samples, seed, start_t=start_t, horizon=horizon, anchors=anchors, **kw)


def effect_window_mask(ds: SiteDataset, anchor_step: int, horizon: int) -> np.ndarray:
    """Valid-step mask of the effect window [anchor_step, anchor_step + horizon); rows with none get all ones."""
    m = ds.M[:, anchor_step : anchor_step + horizon].astype(np.float64)
    empty = m.sum(1) == 0
    m[empty] = 1.0
    return m


def estimate_effects(
    model: nn.Module,
    ds: SiteDataset,
    anchors: tuple[int, int],
    anchor_step: int,
    horizon: int,
    n_samples: int,
    seed: int,
    **kw: Any,
) -> np.ndarray:
    """τ̂_i = mean over h < horizon of (E[Y_{t0+h} | do(a_on …)] − E[Y_{t0+h} | do(a_off …)]), t0 = anchor_step.

    Same definition as the oracle's ``true_effects``: always-a_on minus always-a_off from the anchor step, the
    history before t0 as logged. Both arms share their random numbers. The mean runs over the window's valid steps
    (all steps for a row that has none).
    """
    a_off, a_on = anchors
    on = simulate(model, ds, int(a_on), n_samples, seed, start_t=anchor_step, horizon=horizon, **kw)
    off = simulate(model, ds, int(a_off), n_samples, seed, start_t=anchor_step, horizon=horizon, **kw)
    m = effect_window_mask(ds, anchor_step, horizon)
    diff = (on.probs - off.probs).mean(1)  # [n, H]
    return (diff * m).sum(1) / m.sum(1)

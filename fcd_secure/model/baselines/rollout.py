"""The rollout loop of the recurrent baselines: one place that turns a plan into actions, draws the outcome noise and
builds the :class:`~fcd_secure.model.simulator.SimResult`.

A baseline supplies a :class:`Stepper` for a chunk of rows (its state after the logged history before ``start_t``,
already repeated ``n_samples`` times, patient-major); the loop asks it, step by step, for E[Y_t | state, do(T_t = a)]
and then tells it the sampled outcome. Randomness comes from one generator per row chunk seeded by ``seed`` and the
chunk, and every step draws the stepper's noise first and then one uniform per row, in the same order whatever the
plan — so two plans (two arms of an effect) share their random numbers (common random numbers, DESIGN trap 6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.simulator import Plan, SimResult, check_window, plan_fn

__all__ = ["Stepper", "check_dims", "rollout"]


class Stepper(Protocol):
    """One chunk of rows being simulated (``B = rows × n_samples``)."""

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """E[Y_t | simulated state, do(T_t = a)], ``[B]``; may draw the model's own noise from ``g``."""
        ...

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        """Record the simulated step (action ``a`` and sampled outcome ``y``) before step t + 1."""
        ...


#: ``begin(rows, start_t, n_samples, g) -> Stepper``: the state after the logged history of ``rows`` before start_t.
Begin = Callable[[np.ndarray, int, int, torch.Generator], Stepper]


def check_dims(ds: SiteDataset, dims: dict[str, int], name: str) -> None:
    """Refuse a dataset whose dims differ from those the model was built for.

    Raises:
        ValueError: naming the dataset and both sets of dims.
    """
    have = {"dx": ds.dx, "da": ds.da, "n_actions": int(ds.n_actions)}
    want = {k: dims[k] for k in have}
    if have != want:
        raise ValueError(f"{ds.name}: dims {have} do not match the {name} model {want}")


@torch.no_grad()
def rollout(
    ds: SiteDataset,
    plan: Plan,
    n_samples: int,
    seed: int,
    start_t: int,
    horizon: int | None,
    anchors: tuple[int, int] | None,
    n_actions: int,
    begin: Begin,
    meta: dict,
    chunk_rows: int = 512,
) -> SimResult:
    """Simulate ``plan`` for every row of ``ds`` from ``start_t`` (see the module docstring).

    Raises:
        ValueError: a window outside the data, ``n_samples`` < 1, or a plan that returns a wrong shape or an action
            outside ``[0, n_actions)``.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    H = check_window(ds.L, start_t, horizon)
    fn, name = plan_fn(plan, anchors, ds)
    n, S = ds.n, n_samples
    probs = np.zeros((n, S, H), np.float32)
    ys = np.zeros((n, S, H), np.float32)
    acts = np.zeros((n, S, H), np.int64)
    for c0 in range(0, n, chunk_rows):
        rows = np.arange(c0, min(n, c0 + chunk_rows))
        b = len(rows)
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + c0)
        stepper = begin(rows, start_t, S, g)
        rows_rep = np.repeat(rows, S)
        lengths = np.repeat(ds.lengths[rows], S)
        y_hist = np.repeat(ds.Y[rows, :start_t], S, axis=0).astype(np.float32)
        A_rep = np.repeat(ds.A[rows], S, axis=0)
        for h in range(H):
            t = start_t + h
            # no context model: a context-reading policy sees the logged contexts (SimResult.contexts: replayed)
            a = np.asarray(fn(h, t, y_hist, lengths, rows_rep, A_rep[:, : t + 1]), dtype=np.int64)
            if a.shape != (b * S,):
                raise ValueError(f"policy {name} returned shape {a.shape} at t={t}, expected ({b * S},)")
            if (a < 0).any() or (a >= n_actions).any():
                raise ValueError(f"policy {name} returned an action outside [0, {n_actions}) at t={t}")
            at = torch.as_tensor(a)
            p = stepper.prob(t, at, g)
            y = (torch.rand(b * S, generator=g) < p).float()
            stepper.observe(t, at, y)
            probs[rows, :, h] = p.view(b, S).numpy()
            ys[rows, :, h] = y.view(b, S).numpy()
            acts[rows, :, h] = a.reshape(b, S)
            y_hist = np.concatenate([y_hist, y.numpy()[:, None]], axis=1)
    return SimResult.from_rollout(name, ds, start_t, probs, ys, acts, meta={**meta, "seed": seed})

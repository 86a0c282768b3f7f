"""One local round of a baseline (the loop every :meth:`Simulator.train_site` of this package runs) and the optimiser
step of one named parameter group.

Adversarial baselines (RCGAN, TimeGAN, FedCM) alternate updates of their players. They keep *one* Adam over named
parameter groups, so that a site persists one optimiser state between rounds like every other simulator, and
:func:`step_group` updates one group at a time: every gradient outside the group is dropped before the step, and
Adam leaves a parameter without a gradient untouched (its moments included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import Batch, make_loader

__all__ = ["grouped_adam", "run_local_round", "step_group"]


def grouped_adam(
    groups: dict[str, Iterable[nn.Parameter]], lr: float, betas: tuple[float, float] = (0.9, 0.999)
) -> torch.optim.Adam:
    """Adam over named parameter groups (``group["name"]``), one learning rate for all."""
    return torch.optim.Adam([{"params": list(ps), "name": k} for k, ps in groups.items()], lr=lr, betas=betas)


def step_group(opt: torch.optim.Optimizer, loss: torch.Tensor, group: str | None, clip: float | None) -> None:
    """Back-propagate ``loss`` and step only the parameters of ``group`` (None: every group).

    Args:
        opt: an optimiser from :func:`grouped_adam` (or any optimiser, with ``group=None``).
        loss: the scalar to minimise.
        group: the name of the parameter group to update.
        clip: global-norm clip of the updated parameters' gradients (None: no clipping).

    Raises:
        KeyError: if no parameter group has that name.
    """
    opt.zero_grad(set_to_none=True)
    loss.backward()
    chosen: list[torch.Tensor] = []
    found = group is None
    for pg in opt.param_groups:
        mine = group is None or pg.get("name") == group
        found = found or mine
        for p in pg["params"]:
            if mine:
                chosen.append(p)
            else:
                p.grad = None
    if not found:
        raise KeyError(f"no parameter group named {group!r}")
    if clip is not None:
        nn.utils.clip_grad_norm_([p for p in chosen if p.grad is not None], clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def run_local_round(
    module: nn.Module,
    ds: SiteDataset,
    batch_size: int,
    epochs: int,
    seed: int,
    step: Callable[[Batch], dict[str, float]],
) -> dict[str, float]:
    """``epochs`` shuffled passes over ``ds`` (propensities dropped), calling ``step`` on every batch.

    All randomness of the round derives from ``seed``; the caller's global RNG state is restored.

    Args:
        module: the network (put in training mode).
        ds: the site's training data.
        batch_size: rows per batch.
        epochs: passes over the data (≥ 1).
        seed: seed of the shuffling and of every draw inside ``step``.
        step: one optimisation step on a batch; returns its loss parts, ``total`` among them.

    Returns:
        The example-weighted mean of each loss part, ``n``, ``steps`` and ``epochs``.

    Raises:
        ValueError: if ``epochs`` < 1.
        FloatingPointError: on a non-finite loss.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    module.train()
    dl = make_loader(ds.without_propensities(), batch_size, seed, site_index=0)
    sums: dict[str, float] = {}
    count = steps = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for _ in range(epochs):
            for raw in dl:
                batch = Batch.of(raw)
                parts = step(batch)
                steps += 1
                if not all(math.isfinite(v) for v in parts.values()):
                    raise FloatingPointError(f"{ds.name}: non-finite loss at step {steps}: {parts}")
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + v * batch.size
                count += batch.size
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out.update(n=float(ds.n), steps=float(steps), epochs=float(epochs))
    return out

"""The optimisers of the baselines: one Adam over named parameter groups and the step of one group.

Adversarial baselines (RCGAN, TimeGAN, FedCM) alternate updates of their players. They keep *one* Adam over named
parameter groups, so that a site persists one optimiser state between rounds like every other simulator, and
:func:`step_group` updates one group at a time: every gradient outside the group is dropped before the step, and
Adam leaves a parameter without a gradient untouched (its moments included).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["grouped_adam", "step_group"]


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

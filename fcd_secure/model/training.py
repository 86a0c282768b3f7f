"""Local training of Fed-CausalDiff: the API the federation and DP layers build on.

* :func:`make_loader` — tensors of one site (never the propensities P, DESIGN trap 5);
* :func:`batch_loss` — the local objective on one batch (paper §III-C), per-sample-safe unless a batch term is on;
* :func:`train_local` — one call = one local round (``epochs`` passes), returns mean loss parts and n.

privacy/ wraps ``model``/``optimizer``/``loader`` with Opacus (hooks mode, Poisson) and passes them back in:
``train_local(..., optimizer=dp_optimizer, loader=dp_loader)``; ``batch_loss`` accepts a GradSampleModule.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model import losses as L
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.networks import FedCausalDiff, unwrap


def site_labels(ds: SiteDataset, site_index: int | None) -> np.ndarray:
    """Per-row site ids: ``site_index`` for every row, or ``ds.meta['site']`` for a pooled dataset."""
    if site_index is not None:
        return np.full(ds.n, int(site_index), dtype=np.int64)
    site = ds.meta.get("site")
    if site is None:
        raise ValueError(f"{ds.name}: no site_index given and meta['site'] is missing (pool sites with schema.concat)")
    site = np.asarray(site, dtype=np.int64)
    if site.ndim == 0:  # a single site's dataset carries its index as a scalar
        return np.full(ds.n, int(site), dtype=np.int64)
    if site.shape != (ds.n,):
        raise ValueError(f"{ds.name}: meta['site'] has shape {site.shape}, expected ({ds.n},)")
    return site


def dataset_tensors(ds: SiteDataset, site_index: int | None) -> tuple[torch.Tensor, ...]:
    """(X, A, T, Y, M, site) as tensors. P is deliberately not among them."""
    return (
        torch.as_tensor(ds.X, dtype=torch.float32),
        torch.as_tensor(ds.A, dtype=torch.float32),
        torch.as_tensor(ds.T, dtype=torch.long),
        torch.as_tensor(ds.Y, dtype=torch.float32),
        torch.as_tensor(ds.M, dtype=torch.float32),
        torch.as_tensor(site_labels(ds, site_index)),
    )


def make_loader(
    ds: SiteDataset, batch_size: int, seed: int, site_index: int | None, poisson: bool = False
) -> DataLoader:
    """A shuffling loader over ``(X, A, T, Y, M, site)``; ``poisson=True`` gives Opacus' Poisson-sampled loader
    (sample rate batch_size/n, variable and possibly empty batches), which DP accounting assumes."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    tensors = TensorDataset(*dataset_tensors(ds, site_index))
    g = torch.Generator().manual_seed(int(seed))
    dl = DataLoader(tensors, batch_size=min(batch_size, ds.n), shuffle=True, generator=g)
    if poisson:
        from opacus.data_loader import DPDataLoader

        g2 = torch.Generator().manual_seed(int(seed) + 1)
        dl = DPDataLoader.from_data_loader(dl, generator=g2)
    return dl


def batch_loss(
    model: nn.Module, batch: tuple[torch.Tensor, ...], cfg: ModelConfig, n_sites: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """L = L_recon + λ_diff L_diff + λ1 L_align + λ2 L_dis + λ3 L_cf on one batch → (scalar loss, parts).

    The scalar is (1/B)·Σ_i ℓ_i of per-sample losses ℓ_i, plus λ1·MMD only when ``cfg.align_form == 'batch_mmd'``
    (never under ``dp_mode``). An empty (Poisson) batch gives a zero loss that still has a graph.
    """
    core = unwrap(model)
    X, A, T, Y, M, site = batch
    B = int(T.shape[0])
    if B and int(site.max()) >= n_sites:
        raise ValueError(f"site label {int(site.max())} out of range for n_sites={n_sites}")
    Kc, Ks = core.encode(X, A, T, Y)
    K = torch.cat([Kc, Ks], -1)
    per = torch.zeros(B)
    parts: dict[str, float] = {}

    def add(name: str, on: bool, weight: float, fn: Callable[[], torch.Tensor]) -> None:
        nonlocal per
        if not on or weight == 0:
            return
        v = fn()
        per = per + weight * v
        parts[name] = float(v.detach().mean()) if B else 0.0

    add("recon", cfg.use_recon, 1.0, lambda: L.l_recon(core, K, batch))
    add("diff", cfg.use_diff, cfg.lambda_diff, lambda: L.l_diff(core, K, batch))
    add("dis", cfg.use_dis, cfg.lambda_dis, lambda: L.l_dis(core, Kc, Ks, batch))
    add("cf", cfg.use_cf, cfg.lambda_cf, lambda: L.l_cf(core, K, batch))
    if cfg.align_form == "reference":
        add("align", True, cfg.lambda_align, lambda: L.l_align_reference(core, Kc, batch))
    loss = per.sum() / max(B, 1)
    if cfg.align_form == "batch_mmd" and B:
        mmd = L.l_align_batch(core, Kc, batch)
        loss = loss + cfg.lambda_align * mmd
        parts["align"] = float(mmd.detach())
    parts["total"] = float(loss.detach())
    return loss, parts


def make_optimizer(model: nn.Module, cfg: ModelConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def train_local(
    model: nn.Module,
    ds: SiteDataset,
    cfg: ModelConfig,
    site_index: int | None,
    n_sites: int,
    epochs: int = 1,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    loader: DataLoader | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """One local round: ``epochs`` passes over ``ds`` (or over ``loader`` when privacy/ supplies a DP one).

    Returns the example-weighted mean of each loss part, ``n`` (trajectories), ``steps`` and ``epochs``. All
    randomness (shuffling, diffusion steps/noise) derives from ``seed``; the caller's global RNG state is restored.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    model.train()
    opt = optimizer or make_optimizer(model, cfg)
    dl = loader or make_loader(ds, cfg.batch_size, seed, site_index)
    sums: dict[str, float] = {}
    count = 0
    steps = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for _ in range(epochs):
            for batch in dl:
                b = int(batch[2].shape[0])
                opt.zero_grad(set_to_none=True)
                loss, parts = batch_loss(model, batch, cfg, n_sites)
                loss.backward()
                if cfg.grad_clip is not None and not cfg.dp_mode:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                steps += 1
                if not math.isfinite(parts["total"]):
                    raise FloatingPointError(f"{ds.name}: non-finite loss at step {steps}: {parts}")
                for k_, v in parts.items():
                    sums[k_] = sums.get(k_, 0.0) + v * b
                count += b
                if on_step is not None:
                    on_step(steps, parts)
    out = {k_: v / max(count, 1) for k_, v in sums.items()}
    out.update(n=float(ds.n), steps=float(steps), epochs=float(epochs))
    return out

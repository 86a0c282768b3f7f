"""Local training of Fed-CausalDiff: the API the federation and DP layers build on.

* :func:`make_loader` / :func:`dataset_tensors` (``batch.py``) — tensors of one site, converted to a
  :class:`~fcd_secure.model.batch.Batch` where they are consumed;
* :func:`site_objective` — ``ipw = 'auto'`` resolved on the site's own data (``'step'`` or ``'off'``);
* :func:`training_view` — the dataset a site trains on: the logged propensities P dropped unless ``cfg.ipw`` reads
  them (on the site only: propensities never leave it, docs/privacy.md "Audit"; ``'auto'`` weights only where the site logs them);
* :func:`batch_loss` — the local objective on one batch (paper §III-C), per-sample-safe unless a batch term is on;
* :func:`train_local` — one call = one local round (``epochs`` passes), returns mean loss parts and n;
* :func:`run_round` — the loop of that round, which the baselines' ``train_site`` runs too.

privacy/ wraps ``model``/``optimizer``/``loader`` with Opacus (hooks mode, Poisson) and passes them back in:
``train_local(..., optimizer=dp_optimizer, loader=dp_loader)``; ``batch_loss`` accepts a GradSampleModule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model import losses as L
from fcd_secure.model.batch import Batch, dataset_tensors, make_loader
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.context import l_context
from fcd_secure.model.free_running import l_free_running
from fcd_secure.model.networks import unwrap

__all__ = ["Batch", "batch_loss", "dataset_tensors", "make_loader", "make_optimizer", "run_round", "site_objective",
           "train_local", "training_view"]


def site_objective(ds: SiteDataset, cfg: ModelConfig) -> ModelConfig:
    """The configuration a site trains ``ds`` with: ``ipw = 'auto'`` resolved on the site's own data, to ``'step'``
    where it logs propensities and to ``'off'`` (the paper's objective) where it does not.

    Resolved once per dataset, not per batch: a site without propensities then neither weights nor fits the
    behaviour head, so its training (DP clipping and noise, the global gradient clip) is exactly the paper's; the
    unused head stays at its initial values (and DP-SGD freezes it for the round,
    ``fcd_secure.privacy.engine``). Every other value passes through.
    """
    if cfg.ipw != "auto":
        return cfg
    return cfg.model_copy(update={"ipw": "step" if ds.P is not None else "off"})


def training_view(ds: SiteDataset, cfg: ModelConfig) -> SiteDataset:
    """``ds`` as the local objective may read it: without P, unless ``cfg.ipw`` weights the likelihood by it.

    ``'auto'`` keeps P when the site logs it (a dataset's P, when present, covers every step: ``SiteDataset.validate``):
    the site decides from its own data, and a site without propensities trains on the paper's unweighted objective.
    Even then P reaches no network input, parameter or reported metric: :func:`~fcd_secure.model.losses.ipw_weights`
    turns it into per-step loss weights on the site.
    """
    return ds if cfg.ipw != "off" else ds.without_propensities()


def batch_loss(
    model: nn.Module, batch: Sequence[torch.Tensor], cfg: ModelConfig, n_sites: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """L = L_recon + λ_diff L_diff + λ1 L_align + λ2 L_dis + λ3 L_cf on one batch (paper §III-C), plus λ_context
    L_context where the data has endogenous contexts and λ_free L_free when ``cfg.free_running_steps`` > 0.

    The scalar is (1/B)·Σ_i ℓ_i of per-sample losses ℓ_i, plus λ1·MMD only when ``cfg.align_form == 'batch_mmd'``
    (never under ``dp_mode``). An empty (Poisson) batch gives a zero loss that still has a graph.

    Args:
        model: a FedCausalDiff, bare or wrapped by Opacus' ``GradSampleModule``.
        batch: a :class:`Batch`, or a loader's seven tensors in its field order.
        cfg: loss weights and switches.
        n_sites: number of site labels of the shared discriminator.

    Returns:
        ``(loss, parts)``: the scalar to back-propagate and the batch mean of each term (plus ``total``).

    Raises:
        ValueError: if a site label is outside ``[0, n_sites)``.
    """
    core = unwrap(model)
    batch = Batch.of(batch)
    B = batch.size
    if B and int(batch.site.max()) >= n_sites:
        raise ValueError(f"site label {int(batch.site.max())} out of range for n_sites={n_sites}")
    Kc, Ks, h = core.encode_states(batch.X, batch.A, batch.T, batch.Y)
    K = torch.cat([Kc, Ks], -1)
    # inverse-propensity weights of the likelihood terms (cfg.ipw); P never leaves this function as a metric
    W = L.ipw_weights(core, h, batch) if L.weighs(cfg, batch) else None
    per = torch.zeros(B)
    parts: dict[str, float] = {}

    def add(name: str, on: bool, weight: float, fn: Callable[[], torch.Tensor]) -> None:
        nonlocal per
        if not on or weight == 0:
            return
        v = fn()
        per = per + weight * v
        parts[name] = float(v.detach().mean()) if B else 0.0

    add("recon", cfg.use_recon, 1.0, lambda: L.l_recon(core, K, batch, W))
    add("diff", cfg.use_diff, cfg.lambda_diff, lambda: L.l_diff(core, K, batch, W))
    add("dis", cfg.use_dis, cfg.lambda_dis, lambda: L.l_dis(core, Kc, Ks, batch))
    add("cf", cfg.use_cf, cfg.lambda_cf, lambda: L.l_cf(core, K, batch, W))
    if cfg.ipw != "off":  # the behaviour head (Θs); its loss is not reported (the egress allow-list has no slot)
        per = per + L.l_propensity(core, h, batch)
    # the endogenous contexts' head (context.py): present only when the data marks contexts endogenous
    add("context", core.context_head is not None, cfg.lambda_context, lambda: l_context(core, K, batch))
    # multi-step free-running rollout under the logged actions (free_running.py): off unless free_running_steps > 0
    add("free", cfg.free_running_steps > 0, cfg.lambda_free_running, lambda: l_free_running(core, K, h, batch, W))
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
    """Adam with the configured learning rate and weight decay (the optimiser state a site keeps across rounds)."""
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

    All randomness (shuffling, diffusion steps/noise) derives from ``seed``; the caller's global RNG state is
    restored.

    Args:
        model: a FedCausalDiff, bare or wrapped by Opacus.
        ds: the site's training data.
        cfg: the model configuration (loss weights, batch size, clipping outside DP).
        site_index: the site label of every row, or None for a pooled dataset with ``meta['site']``.
        n_sites: number of sites (labels of the shared discriminator).
        epochs: passes over the data.
        seed: seed of this round's randomness.
        optimizer: the optimiser to step (its state persists across calls); a fresh Adam when None.
        loader: a loader to use instead of :func:`make_loader` (Opacus' DP loader).
        on_step: called after every optimiser step with the step count and the loss parts.

    Returns:
        The example-weighted mean of each loss part, ``n`` (trajectories), ``steps`` and ``epochs``.

    Raises:
        ValueError: if ``epochs`` < 1.
        FloatingPointError: on a non-finite loss.
    """
    opt = optimizer or make_optimizer(model, cfg)

    def step(batch: Batch) -> dict[str, float]:
        opt.zero_grad(set_to_none=True)
        loss, parts = batch_loss(model, batch, cfg, n_sites)
        loss.backward()
        if cfg.grad_clip is not None and not cfg.dp_mode:  # under DP the privacy engine clips per sample
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        return parts

    return run_round(model, loader or make_loader(ds, cfg.batch_size, seed, site_index), ds, epochs, seed, step,
                     on_step)


def run_round(
    module: nn.Module,
    loader: Iterable[Sequence[torch.Tensor]],
    ds: SiteDataset,
    epochs: int,
    seed: int,
    step: Callable[[Batch], dict[str, float]],
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """The loop of every local round (:func:`train_local`, and each baseline's ``train_site``): ``epochs`` passes over
    ``loader``, ``step`` on every batch.

    All randomness of the round derives from ``seed`` (the loader brings its own shuffling); the caller's global RNG
    state is restored.

    Args:
        module: the network (put in training mode).
        loader: the site's batches (a loader's tensors in :class:`Batch` field order).
        ds: the dataset behind ``loader`` (its name and size for the result).
        epochs: passes over the data (≥ 1).
        seed: seed of every draw inside ``step``.
        step: one optimisation step on a batch; returns its loss parts, ``total`` among them.
        on_step: called after every step with the step count and the loss parts.

    Returns:
        The example-weighted mean of each loss part, ``n`` (trajectories), ``steps`` and ``epochs``.

    Raises:
        ValueError: if ``epochs`` < 1.
        FloatingPointError: on a non-finite loss part.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    module.train()
    sums: dict[str, float] = {}
    count = steps = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for _ in range(epochs):
            for raw in loader:
                batch = Batch.of(raw)
                parts = step(batch)
                steps += 1
                if not all(math.isfinite(v) for v in parts.values()):
                    raise FloatingPointError(f"{ds.name}: non-finite loss at step {steps}: {parts}")
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + v * batch.size
                count += batch.size
                if on_step is not None:
                    on_step(steps, parts)
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out.update(n=float(ds.n), steps=float(steps), epochs=float(epochs))
    return out

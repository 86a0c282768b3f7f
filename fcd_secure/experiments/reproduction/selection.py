"""The hyperparameter budget of the reproduction: the same for every method, chosen by a causal criterion.

For each (dataset, method) every learning rate of the preset's ``lr_grid`` is tried: the method is trained on 80 % of
the pooled *training* trajectories (a seeded split by trajectory, site labels kept) for ``selection_epochs`` passes,
and scored on the other 20 % by the truth-free rule of ``queries.selection`` that also chooses a federated run's
round: the one-step doubly robust discrepancy D₁ of the anchor contrast with the logged propensities
(``evaluation.discrepancy``), the candidates within one SE of the smallest D₁, then the lowest factual log-loss of
the one-step probabilities. On confounded logs the best fit is the most confounded model, so fit alone never
chooses where propensities are logged; a dataset without them (Diabetes-130, Statics2011) is chosen by the log-loss
alone and the choice says so. Nothing of the test split, the DKT-Synth oracle or the paper's numbers enters the
choice. A grid with one candidate is no selection and trains nothing.

Table III's ablations use the learning rate chosen for Fed-CausalDiff (they are Fed-CausalDiff with one part
switched off). Each choice is cached as JSON under ``<out>/selection/``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure._io import atomic_write_text
from fcd_secure.data.schema import SiteDataset, concat
from fcd_secure.evaluation.discrepancy import DiscrepancySums, one_step_dr_terms
from fcd_secure.experiments.centralised import POOLED_SITE
from fcd_secure.experiments.reproduction.cells import Cell, cell_config, config_hash, load_cached
from fcd_secure.experiments.reproduction.presets import ReproPreset
from fcd_secure.federation import learner
from fcd_secure.model.baselines import get_simulator
from fcd_secure.queries.selection import RoundScore, choose_round

__all__ = ["VALIDATION_FRACTION", "choose_lr", "select_lr", "validation_split", "validation_logloss"]

VALIDATION_FRACTION = 0.2


def validation_split(pooled: SiteDataset, seed: int) -> tuple[SiteDataset, SiteDataset]:
    """(train, validation) rows of ``pooled``, a seeded 80/20 split by trajectory; per-row site labels follow."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5E1EC7])
    perm = rng.permutation(pooled.n)
    n_val = max(1, int(round(VALIDATION_FRACTION * pooled.n)))
    parts = []
    for idx in (np.sort(perm[n_val:]), np.sort(perm[:n_val])):
        sub = pooled.subset(idx)
        sub.meta["site"] = np.asarray(pooled.meta["site"])[idx]
        parts.append(sub)
    return parts[0], parts[1]


def validation_logloss(probs: np.ndarray, ds: SiteDataset) -> float:
    """Mean binary log-loss of ``probs`` ``[n, L]`` against the valid outcomes of ``ds``."""
    m = ds.M > 0
    p = np.clip(probs[m], 1e-6, 1 - 1e-6)
    y = ds.Y[m].astype(np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def _score(preset: ReproPreset, dataset: str, method: str, seed: int, lr: float, data_dir: str | None) -> dict[str, Any]:
    """The candidate's validation figures: ``val_logloss`` and, with logged propensities, ``d1`` and ``d1_se``."""
    cfg = cell_config(preset, Cell(dataset, method, seed), lr, data_dir)
    fd = learner.load_federated(cfg)
    train, valid = validation_split(concat(list(fd.train)), seed)
    n_sites = len(fd.train)
    sim = get_simulator(cfg.model.simulator).from_dims(
        learner.model_config(cfg), train.dx, train.da, int(train.n_actions), n_sites
    )
    for e in range(preset.selection_epochs):
        sim.train_site(train, None, n_sites, epochs=1, seed=learner.round_seed(seed, e + 1, POOLED_SITE))
    loss = validation_logloss(sim.factual_probs(valid), valid)
    out: dict[str, Any] = {"lr": lr, "val_logloss": loss if math.isfinite(loss) else math.inf, "d1": None, "d1_se": None}
    if valid.P is not None:
        a_off, a_on = (int(a) for a in fd.anchors)
        terms = one_step_dr_terms(valid.Y, valid.M, valid.T, valid.P, sim.one_step_probs(valid, a_on),
                                  sim.one_step_probs(valid, a_off), a_on, a_off)
        d = DiscrepancySums.from_terms(terms)
        if math.isfinite(d.d1()):
            out.update(d1=d.d1(), d1_se=d.se())
    return out


def choose_lr(cands: list[dict[str, Any]]) -> tuple[float, str]:
    """The learning rate by ``queries.selection.choose_round`` over the candidates, and what it was selected on."""
    scores = [RoundScore(round=i, d1=math.nan if c["d1"] is None else c["d1"],
                         se=math.nan if c["d1_se"] is None else c["d1_se"], mean=math.nan,
                         n=0 if c["d1"] is None else 1, clipped_share=0.0, fit=c["val_logloss"],
                         sites_scoring=0 if c["d1"] is None else 1, sites=1) for i, c in enumerate(cands)]
    if all(c["d1"] is None for c in cands):
        best = min(range(len(cands)), key=lambda i: cands[i]["val_logloss"])
        return cands[best]["lr"], "validation log-loss (no logged propensities: the causal criterion is unavailable)"
    pick = choose_round(scores, len(cands) - 1)
    return cands[pick["round"]]["lr"], "D1 within one SE of the smallest, then validation log-loss (queries.selection)"


def select_lr(
    preset: ReproPreset, dataset: str, method: str, seed: int, root: Path, data_dir: str | None = None
) -> dict[str, Any]:
    """The learning rate of ``method`` on ``dataset`` (module docstring), cached under ``root/selection``.

    Returns:
        ``{"dataset", "method", "lr", "candidates": [{"lr", "val_logloss", "d1", "d1_se"}], "selected_on"}``; with
        one candidate the figures are None (nothing trained).
    """
    cfg = cell_config(preset, Cell(dataset, method, seed), preset.lr_grid[0], data_dir)
    h = config_hash(cfg, preset) + f"-grid{list(preset.lr_grid)}-e{preset.selection_epochs}"
    path = root / "selection" / dataset / f"{method}.json"
    cached = load_cached(path, h)
    if cached is not None:
        return cached
    if len(preset.lr_grid) == 1:
        cands = [{"lr": preset.lr_grid[0], "val_logloss": None, "d1": None, "d1_se": None}]
        best, how = preset.lr_grid[0], "one candidate: nothing selected"
    else:
        cands = [_score(preset, dataset, method, seed, lr, data_dir) for lr in preset.lr_grid]
        best, how = choose_lr(cands)
    out = {"dataset": dataset, "method": method, "lr": best, "candidates": cands, "config_hash": h,
           "selected_on": how, "seed": seed}
    out["candidates"] = [{**c, "val_logloss": None if c["val_logloss"] in (None, math.inf) else c["val_logloss"]}
                         for c in cands]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out, indent=1))
    return out

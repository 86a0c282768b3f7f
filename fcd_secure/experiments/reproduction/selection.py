"""The hyperparameter budget of the reproduction: the same for every method, chosen by a causal criterion.

For each (dataset, method) every learning rate of the preset's ``lr_grid`` is tried: the method is trained on 80 % of
the pooled *training* trajectories (a seeded split by trajectory, site labels kept) for ``selection_epochs`` passes,
and the other 20 % are scored and the candidates chosen by the functions that choose a federated run's round
(``queries.selection``): a candidate's score is the ``select.*`` sums a site sends of its validation rows
(:func:`~fcd_secure.queries.selection.site_selection_sums`: the one-step doubly robust discrepancy D₁ of the anchor
contrast with the logged propensities, the validation fit, D_h) read as a
:class:`~fcd_secure.queries.selection.RoundScore`, and the choice is
:func:`~fcd_secure.queries.selection.choose_round`'s rule over the candidates: those within one SE of the smallest D₁
(and of the smallest D_h where it is supported for every candidate), then the smallest D_h or D₁ (never the fit). On confounded
logs the best fit is the most confounded model, so fit alone never chooses where propensities are logged; a dataset
without them (Diabetes-130, Statics2011), where that rule cannot choose, is chosen by the validation fit alone and
the choice says so. Nothing of the test split, the DKT-Synth oracle or the paper's numbers enters the choice. A grid
with one candidate is no selection and trains nothing.

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
from fcd_secure.experiments.centralised import POOLED_SITE
from fcd_secure.experiments.reproduction.cells import Cell, cell_config, config_hash, load_cached
from fcd_secure.experiments.reproduction.presets import ReproPreset
from fcd_secure.federation import learner
from fcd_secure.model.baselines import get_simulator
from fcd_secure.queries.selection import RoundScore, choose_round, site_selection_sums

__all__ = ["RULE", "VALIDATION_FRACTION", "choose_lr", "select_lr", "validation_split"]

VALIDATION_FRACTION = 0.2
#: the version of the scoring and choice rule, part of a cached choice's key (a change of rule recomputes it)
RULE = "queries.selection/2"


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


def _score(preset: ReproPreset, dataset: str, method: str, seed: int, lr: float, data_dir: str | None) -> dict[str, Any]:
    """The candidate's validation figures: its :class:`RoundScore` row (``score``) and, for the tables,
    ``val_logloss`` (the validation fit) and, with logged propensities, ``d1`` and ``d1_se``."""
    cfg = cell_config(preset, Cell(dataset, method, seed), lr, data_dir)
    fd = learner.load_federated(cfg)
    train, valid = validation_split(concat(list(fd.train)), seed)
    n_sites = len(fd.train)
    sim = get_simulator(cfg.model.simulator).from_dims(
        learner.model_config(cfg), train.dx, train.da, int(train.n_actions), n_sites
    )
    for e in range(preset.selection_epochs):
        sim.train_site(train, None, n_sites, epochs=1, seed=learner.round_seed(seed, e + 1, POOLED_SITE))
    # the pooled validation rows as one site's: the selection reads only its ``validation`` rows and its anchors
    # (the test rows are never loaded into it); no cohort floor, as nothing leaves this process
    rows = learner.SiteData(train=train, test=valid, site_index=POOLED_SITE, n_sites=n_sites, anchors=fd.anchors,
                            oracle=None, description={}, validation=valid)
    sums = site_selection_sums(sim, rows, cfg.model.outcome == "binary", floor=0, seed=seed)
    row = RoundScore.from_totals(0, sums, sites=1).as_row()
    fit = row["validation_fit"]
    return {"lr": lr, "val_logloss": math.inf if fit is None else fit, "d1": row["d1"], "d1_se": row["d1_se"],
            "score": row}


def choose_lr(cands: list[dict[str, Any]]) -> tuple[float, str]:
    """The learning rate by :func:`~fcd_secure.queries.selection.choose_round` over the candidates' scores (candidate
    i is "learning rate #i+1" in the reason), and what it was selected on; where no candidate has a D₁ (no logged
    propensities) that rule cannot choose, and the best validation fit does."""
    scores = [RoundScore.from_row(c["score"], i + 1) for i, c in enumerate(cands)]
    pick = choose_round(scores, len(cands), unit="learning rate", name="learning rate #{}")
    if pick["rule"] == "last":
        best = min(range(len(cands)), key=lambda i: cands[i]["val_logloss"])
        return cands[best]["lr"], "validation fit (no logged propensities: the causal criterion is unavailable)"
    return cands[pick["round"] - 1]["lr"], f"{pick['rule']} (queries.selection): {pick['reason']}"


def select_lr(
    preset: ReproPreset, dataset: str, method: str, seed: int, root: Path, data_dir: str | None = None
) -> dict[str, Any]:
    """The learning rate of ``method`` on ``dataset`` (module docstring), cached under ``root/selection``.

    Returns:
        ``{"dataset", "method", "lr", "candidates": [{"lr", "val_logloss", "d1", "d1_se"}], "selected_on"}``; with
        one candidate the figures are None (nothing trained).
    """
    cfg = cell_config(preset, Cell(dataset, method, seed), preset.lr_grid[0], data_dir)
    h = config_hash(cfg, preset) + f"-grid{list(preset.lr_grid)}-e{preset.selection_epochs}-{RULE}"
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

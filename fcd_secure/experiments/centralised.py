"""The centralised reference: one simulator trained on the pooled training data of all sites (the non-private
yardstick a federated result is compared with: docs/fidelity.md, "Targets"), used by ``fcd train --centralised`` and by the ``centralised`` row of
``fcd ablate`` (paper Table III), so that both report the same numbers for the same configuration and seed.

One epoch rule, one seed rule:

* **epochs** — :func:`matched_epochs`: as many passes over the data as a federated site makes on average,
  ``rounds × clients_per_round / n_sites × local_epochs`` (the site's passes of a round where
  ``min_local_steps`` raises them; rounded, at least 1), so the reference sees no more data
  than a federated site; an explicit ``epochs`` overrides it.
* **seeds** — the parameters are initialised from the run seed (every simulator's ``from_dims``); pass ``e`` (from 1)
  uses ``round_seed(seed, e, POOLED_SITE)``, the per-(run, round, site) stream of the federation with the pooled
  data as one more site.

Every method is scored by :func:`fcd_secure.experiments.evaluate.evaluate_on_sites`, the federated evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from fcd_secure.config import RunConfig
from fcd_secure.data.schema import concat
from fcd_secure.experiments.evaluate import evaluate_on_sites
from fcd_secure.experiments.tables import mean_sd_table
from fcd_secure.federation import learner
from fcd_secure.model.baselines import SIMULATORS
from fcd_secure.model.simulator import Simulator

__all__ = ["POOLED_SITE", "matched_epochs", "run_centralised", "run_centralised_seeds", "train_centralised"]

Progress = Callable[[str], None]

#: The ``round_seed`` site index of the pooled data (no real site has it).
POOLED_SITE = 10_000
#: Table columns of the centralised multi-seed summary: output name → metric key of :func:`run_centralised`.
SUMMARY_METRICS = {"pehe": "pehe", "ate": "ate_error", "value": "value_error_mean", "auc": "factual_auc"}


def matched_epochs(cfg: RunConfig) -> int:
    """Passes over the data that match a federated site's average: rounds × clients_per_round / n_sites × the local
    round's passes (``local_epochs``, or more on a site that needs them for ``min_local_steps``:
    ``learner.round_epochs``, averaged over the sites), rounded, at least 1."""
    f = cfg.federation
    passes = float(f.local_epochs)
    if f.min_local_steps:
        passes = sum(learner.round_epochs(f.local_epochs, f.min_local_steps, learner.load_site_data(cfg, i).train.n,
                                          cfg.model.batch_size) for i in range(cfg.data.n_sites)) / cfg.data.n_sites
    return max(1, int(round(f.rounds * f.clients_per_round / cfg.data.n_sites * passes)))


def train_centralised(
    simulator: type[Simulator], cfg: RunConfig, epochs: int, progress: Progress | None = None
) -> tuple[Simulator, dict[str, float]]:
    """Train ``simulator`` on the pooled training split of every site (site labels kept for L_dis).

    Args:
        simulator: the simulator class (``SIMULATORS[name]``).
        cfg: the run configuration; its seed initialises the parameters and seeds every pass.
        epochs: passes over the pooled data, one optimiser throughout.
        progress: called with one line per pass.

    Returns:
        The trained simulator and the loss parts of its last pass.

    Raises:
        ValueError: if ``epochs`` < 1.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    fd = learner.load_federated(cfg)
    pooled = concat(list(fd.train))
    n_sites = len(fd.train)
    dims = learner.dims_of(pooled, n_sites)
    sim = simulator.from_dims(learner.model_config(cfg), pooled.dx, pooled.da, int(pooled.n_actions), n_sites,
                              dims["n_endogenous"])
    fit: dict[str, float] = {}
    for e in range(epochs):
        fit = sim.train_site(pooled, None, n_sites, epochs=1, seed=learner.round_seed(cfg.seed, e + 1, POOLED_SITE))
        if progress is not None:
            progress(f"{sim.name} epoch {e + 1}/{epochs}: loss {fit['total']:.4f}")
    sim.keep_context_range(pooled)  # the rows it trained on bound its rollouts (model.clamp_contexts)
    return sim, fit


def run_centralised(
    cfg: RunConfig,
    methods: Sequence[str] = ("fed_causaldiff",),
    epochs: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train each of ``methods`` centrally and score it on every site's test split.

    Args:
        cfg: the run configuration (data, model, evaluation settings, seed; federation settings set the epochs).
        methods: keys of :data:`fcd_secure.model.baselines.SIMULATORS`.
        epochs: passes over the pooled data (default :func:`matched_epochs`).
        progress: called with progress lines.

    Returns:
        A JSON-able dict: ``preset``, ``dataset``, ``seed``, ``epochs``, ``n_sites``, ``n_train``, ``n_test`` and
        ``methods[name]``: the merged metrics plus ``train_seconds``, ``eval_seconds`` and ``last_epoch``.

    Raises:
        ValueError: an unknown method or ``epochs`` < 1.
    """
    unknown = [m for m in methods if m not in SIMULATORS]
    if unknown or not methods:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(SIMULATORS)}")
    n_epochs = matched_epochs(cfg) if epochs is None else int(epochs)
    if n_epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {n_epochs}")
    fd = learner.load_federated(cfg)
    n_sites = len(fd.train)
    out: dict[str, Any] = {
        "preset": cfg.preset, "dataset": cfg.data.dataset, "seed": cfg.seed, "epochs": n_epochs, "n_sites": n_sites,
        "n_train": int(sum(d.n for d in fd.train)), "n_test": int(sum(d.n for d in fd.test)), "methods": {},
    }
    for name in methods:
        t0 = time.perf_counter()
        sim, fit = train_centralised(SIMULATORS[name], cfg, n_epochs, progress)
        t1 = time.perf_counter()
        metrics = evaluate_on_sites(cfg, [sim] * n_sites)
        out["methods"][name] = {
            **metrics, "train_seconds": t1 - t0, "eval_seconds": time.perf_counter() - t1, "last_epoch": fit,
        }
        if progress is not None:
            shown = {k: ("n/a" if metrics.get(k) is None else f"{metrics[k]:.4f}")
                     for k in ("pehe", "ate_error", "value_error_mean")}
            progress(f"{name}: PEHE {shown['pehe']}  |ATE err| {shown['ate_error']}  "
                     f"mean |value err| {shown['value_error_mean']}")
    return out


def run_centralised_seeds(
    cfg: RunConfig,
    seeds: Sequence[int],
    methods: Sequence[str] = ("fed_causaldiff",),
    epochs: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """:func:`run_centralised` for each seed, and the mean ± s.d. table over seeds per method.

    Returns:
        ``{"runs": [one result per seed], "summary": [one row per method]}`` (rows of
        :func:`~fcd_secure.experiments.tables.mean_sd_table` over :data:`SUMMARY_METRICS`).
    """
    runs = [run_centralised(cfg.model_copy(update={"seed": int(s)}), methods, epochs, progress) for s in seeds]
    rows = [{"method": name, "seed": r["seed"], **m} for r in runs for name, m in r["methods"].items()]
    return {"runs": runs, "summary": mean_sd_table(rows, by="method", metrics=SUMMARY_METRICS)}

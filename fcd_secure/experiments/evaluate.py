"""Scoring a trained simulator the way a federated run is scored: every site evaluates on its own test split with
the site-side code of the federated evaluation (``queries.evaluation.site_metrics``) and the sums are merged
(``merge_site_metrics``), which gives exactly the pooled numbers. Every row of Table III and every method of
``fcd train --centralised`` goes through here, so no two of them are scored differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
from fcd_secure.queries.request import EvaluationRequest
from fcd_secure.model.simulator import Simulator

__all__ = ["evaluate_on_sites", "full_eval_config"]


def full_eval_config(cfg: RunConfig) -> EvaluationRequest:
    """The final (not quick) evaluation request of a run, as the server sends it to the sites."""
    ev = cfg.evaluation
    return EvaluationRequest(quick=False, part="full", n_samples=ev.n_samples, max_rows=ev.max_rows)


def evaluate_on_sites(cfg: RunConfig, simulators: Sequence[Simulator]) -> dict[str, Any]:
    """Site ``i`` scores ``simulators[i]`` on its test split; the per-site sums are merged.

    Args:
        cfg: the run configuration (data, seed, evaluation settings).
        simulators: one per site (the same object for every site when one model is scored).

    Returns:
        The merged metrics (``pehe``, ``ate_error``, ``factual_auc``, ``policies``, ``value_error_mean``, ...).

    Raises:
        ValueError: if there is not one simulator per site.
    """
    n_sites = len(learner.load_federated(cfg).train)
    if len(simulators) != n_sites:
        raise ValueError(f"evaluate_on_sites: {len(simulators)} simulators for {n_sites} sites")
    conf = full_eval_config(cfg)
    return merge_site_metrics(
        [site_metrics(sim, learner.load_site_data(cfg, i), cfg, conf) for i, sim in enumerate(simulators)],
        binary=cfg.model.outcome == "binary",
    )

"""Ablations of paper Table III on one data set, split and seed list (``fcd ablate``).

=================  =================================================================================================
variant            what changes (everything else: same data, same Dirichlet split, same seeds, same evaluation)
=================  =================================================================================================
``dss``            Fed-CausalDiff: DSS, only Θc is synchronised (paper §III)
``full_sync``      "w/o DSS": every parameter is averaged (the flow aggregates part ``full``), Θs_i included but
                   its site-bound behaviour head (``fcd_secure.manifest``)
``no_ldis``        "w/o L_dis": ``model.use_dis = false`` (no gradient-reversal discriminator, no parallel head)
``local_only``     no federation: each site trains its own model alone and is evaluated with it
``centralised``    one model on the pooled training data of all sites (the reference of ``fcd train --centralised``)
=================  =================================================================================================

The federated variants run on Flower's simulation engine (``engines.simulation.run_simulated``). The two
non-federated references train for :func:`~fcd_secure.experiments.centralised.matched_epochs` passes, so no variant
sees more data, and every variant is scored by the same federated evaluation
(:func:`~fcd_secure.experiments.evaluate.evaluate_on_sites`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fcd_secure._io import atomic_write_text
from fcd_secure.config import RunConfig
from fcd_secure.evaluation.plots import plot_utility_vs_uplink
from fcd_secure.experiments.centralised import matched_epochs, run_centralised
from fcd_secure.experiments.evaluate import evaluate_on_sites
from fcd_secure.experiments.tables import mean_sd_table, skill_flags
from fcd_secure.experiments.variants import ALL_VARIANTS, LABELS
from fcd_secure.federation import learner
from fcd_secure.engines.simulation import run_simulated
from fcd_secure.model.baselines import FedCausalDiffSimulator

__all__ = ["ALL_VARIANTS", "LABELS", "run_ablation", "run_centralised_row", "run_local_only", "variant_config"]

#: Table III columns: output name → per-seed column.
TABLE_METRICS = {"pehe": "pehe", "pehe0": "pehe0", "sd_tau": "sd_tau", "skill": "skill", "ate": "ate_error",
                 "value": "value_error", "auc": "factual_auc", "uplink_mb": "uplink_mb"}


def run_local_only(cfg: RunConfig) -> dict[str, Any]:
    """Each site trains Fed-CausalDiff alone (no message leaves it) and evaluates its own model.

    Returns:
        ``final_eval`` (merged metrics), ``uplink_bytes`` (0) and ``epochs``.
    """
    epochs = matched_epochs(cfg)
    sims = []
    for i in range(cfg.data.n_sites):
        data = learner.load_site_data(cfg, i)
        d = data.train
        sim = FedCausalDiffSimulator.from_dims(learner.model_config(cfg), d.dx, d.da, int(d.n_actions), data.n_sites,
                                               learner.dims_of(d, data.n_sites)["n_endogenous"])
        for e in range(epochs):  # one seed per pass, as a federated site gets one per round
            sim.train_site(d, i, data.n_sites, epochs=1, seed=learner.round_seed(cfg.seed, e + 1, i))
        sim.keep_context_range(d)  # the site's own rows bound its rollouts (model.clamp_contexts)
        sims.append(sim)
    return {"final_eval": evaluate_on_sites(cfg, sims), "uplink_bytes": 0, "epochs": epochs}


def run_centralised_row(cfg: RunConfig) -> dict[str, Any]:
    """The ``centralised`` row: :func:`~fcd_secure.experiments.centralised.run_centralised` of Fed-CausalDiff.

    Returns:
        ``final_eval`` (merged metrics), ``uplink_bytes`` (0) and ``epochs``.
    """
    res = run_centralised(cfg, ("fed_causaldiff",))
    return {"final_eval": res["methods"]["fed_causaldiff"], "uplink_bytes": 0, "epochs": res["epochs"]}


def variant_config(base: RunConfig, variant: str, seed: int, out: Path) -> RunConfig:
    """The run configuration of ``variant`` for ``seed`` (plain aggregation; its run folder under ``out``)."""
    fed = base.federation.model_copy(update={"sync": "full" if variant == "full_sync" else "dss", "secure_aggregation": False})
    model = base.model.model_copy(update={"use_dis": False}) if variant == "no_ldis" else base.model
    return base.model_copy(
        update={"seed": seed, "federation": fed, "model": model, "out": str(out / f"{variant}-seed{seed}"), "state_dir": None}
    )


def _run_variant(cfg: RunConfig, variant: str) -> dict[str, Any]:
    if variant == "local_only":
        return run_local_only(cfg)
    if variant == "centralised":
        return run_centralised_row(cfg)
    r = run_simulated(cfg)
    return {"final_eval": r.final_eval, "uplink_bytes": int(sum(h["uplink_bytes"] for h in r.history))}


def _figure(rows: list[dict[str, Any]], out: Path, preset: str) -> None:
    """Paper Fig. 4 over the variants: utility (factual AUC, else PEHE) against mean uplink."""
    key, ylabel = ("auc", "factual AUC (higher is better)") if any(r["auc_n"] for r in rows) else ("pehe", "PEHE (lower is better)")
    points = [(LABELS[r["variant"]], r["uplink_mb_mean"], r[f"{key}_mean"]) for r in rows
              if np.isfinite(r[f"{key}_mean"]) and np.isfinite(r["uplink_mb_mean"])]
    if points:
        plot_utility_vs_uplink(points, out / "utility_vs_uplink.png", ylabel=ylabel,
                               title=f"DKT-Synth {preset}: utility vs uplink (paper Fig. 4)")


def run_ablation(
    base: RunConfig, variants: list[str], seeds: list[int], out: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run every variant for every seed.

    Writes ``ablation.csv`` (one row per variant × seed), ``ablation.json`` (the mean ± s.d. table) and
    ``utility_vs_uplink.png`` (Fig. 4 over the variants) into ``out``.

    Args:
        base: the resolved run configuration (preset, rounds, sites, data, model).
        variants: keys of :data:`ALL_VARIANTS`.
        seeds: the seeds (data split, initialisation, sampling and training).
        out: the output folder (each federated variant's run folder goes below it).
        log: progress lines.

    Returns:
        The table: ``seeds``, ``preset``, ``rounds``, ``rows`` (per variant: label, key, ``<m>_mean``, ``<m>_sd``,
        ``<m>_fmt`` for pehe, ate, value, auc, uplink_mb) and ``per_seed`` (the rows of ``ablation.csv``, full
        precision, NaN as null).

    Raises:
        ValueError: for an unknown variant.
    """
    bad = [v for v in variants if v not in ALL_VARIANTS]
    if bad:
        raise ValueError(f"unknown variant(s) {bad}; choose from {list(ALL_VARIANTS)}")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for variant in variants:
            cfg = variant_config(base, variant, seed, out)
            log(f"[ablation] {variant} seed {seed}")
            res = _run_variant(cfg, variant)
            fe = res["final_eval"]
            rows.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "pehe": fe.get("pehe"),
                    # beside PEHE: the zero-effect PEHE₀, the constant-effect floor sd τ and the skill score
                    "pehe0": (fe.get("effect_skill") or {}).get("pehe_zero"),
                    "sd_tau": (fe.get("effect_skill") or {}).get("sd_tau"),
                    "skill": (fe.get("effect_skill") or {}).get("skill"),
                    "ate_error": fe.get("ate_error"),
                    "value_error": fe.get("value_error_mean"),
                    "factual_auc": fe.get("factual_auc"),
                    "uplink_mb": res["uplink_bytes"] / 1e6,
                }
            )
            log(f"[ablation]   PEHE {rows[-1]['pehe']}, ATE {rows[-1]['ate_error']}, value {rows[-1]['value_error']}")
    atomic_write_text(out / "ablation.csv", pd.DataFrame(rows).to_csv(index=False))
    summary = mean_sd_table(rows, by="variant", metrics=TABLE_METRICS)
    table_rows = [
        {**{k: v for k, v in r.items() if k != "variant"}, "variant": LABELS[r["variant"]], "key": r["variant"],
         "uplink_mb_fmt": f"{r['uplink_mb_mean']:.2f}", "flags": skill_flags(r)}
        for r in summary
    ]
    per_seed = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]
    table = {"seeds": seeds, "preset": base.preset, "rounds": base.federation.rounds, "rows": table_rows,
             "per_seed": per_seed}
    atomic_write_text(out / "ablation.json", json.dumps(table, indent=2))
    _figure(summary, out, base.preset)
    return table

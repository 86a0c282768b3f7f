"""Ablations of paper Table III on one data set, split and seed list (``fcd ablate``).

=================  =================================================================================================
variant            what changes (everything else: same data, same Dirichlet split, same seeds, same evaluation)
=================  =================================================================================================
``dss``            Fed-CausalDiff: DSS, only Θc is synchronised (paper §III)
``full_sync``      "w/o DSS": every parameter is averaged (the flow aggregates part ``full``), Θs_i included
``no_ldis``        "w/o L_dis": ``model.use_dis = false`` (no gradient-reversal discriminator, no parallel head)
``local_only``     no federation: each site trains its own model alone and is evaluated with it
``centralised``    one model on the pooled training data of all sites (the non-private reference)
=================  =================================================================================================

The federated variants run on Flower's simulation engine (``simulation.run_simulated``). The two non-federated
references train for the same number of passes over each site's data as a federated site makes on average:
``rounds × clients_per_round / n_sites × local_epochs`` epochs (rounded, at least 1), so no variant sees more data.
They are evaluated with the same site-side code (``federation.evaluation.site_metrics``) and the same merge.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.federation.evaluation import merge_site_metrics, site_metrics

ALL_VARIANTS = ("dss", "full_sync", "no_ldis", "local_only", "centralised")
LABELS = {
    "dss": "Fed-CausalDiff (DSS)",
    "full_sync": "w/o DSS (full sync)",
    "no_ldis": "w/o L_dis",
    "local_only": "local only",
    "centralised": "centralised (pooled)",
}


def matched_epochs(cfg: RunConfig) -> int:
    f = cfg.federation
    return max(1, int(round(f.rounds * f.clients_per_round / cfg.data.n_sites * f.local_epochs)))


def _full_eval_config(cfg: RunConfig) -> dict[str, Any]:
    ev = cfg.evaluation
    return {"quick": False, "part": "full", "n-samples": ev.n_samples, "max-rows": ev.max_rows or -1}


def run_local_only(cfg: RunConfig) -> dict[str, Any]:
    """Each site trains alone (no message leaves it) and evaluates its own model."""
    epochs = matched_epochs(cfg)
    parts = []
    for i in range(cfg.data.n_sites):
        data = learner.load_site_data(cfg, i)
        model = learner.build_model(cfg, learner.dims_of(data.train, data.n_sites))
        opt = learner.make_optimizer(model, cfg)
        for e in range(epochs):  # one seed per pass, as a federated site gets one per round
            learner.train_local(model, data.train, cfg, i, data.n_sites, 1, learner.round_seed(cfg.seed, e + 1, i), opt)
        parts.append(site_metrics(model, data, cfg, _full_eval_config(cfg)))
    return {"final_eval": merge_site_metrics(parts), "uplink_bytes": 0, "epochs": epochs}


def run_centralised(cfg: RunConfig) -> dict[str, Any]:
    """One model on the pooled training sites (site labels kept for L_dis), evaluated on every site's test split."""
    from fcd_secure.data.schema import concat  # noqa: PLC0415

    epochs = matched_epochs(cfg)
    fd = learner.load_federated(cfg)
    pooled = concat(list(fd.train))
    n_sites = len(fd.train)
    model = learner.build_model(cfg, learner.dims_of(pooled, n_sites))
    opt = learner.make_optimizer(model, cfg)
    for e in range(epochs):
        learner.train_local(model, pooled, cfg, None, n_sites, 1, learner.round_seed(cfg.seed, e + 1, 10_000), opt)
    parts = [site_metrics(model, learner.load_site_data(cfg, i), cfg, _full_eval_config(cfg)) for i in range(n_sites)]
    return {"final_eval": merge_site_metrics(parts), "uplink_bytes": 0, "epochs": epochs}


def variant_config(base: RunConfig, variant: str, seed: int, out: Path) -> RunConfig:
    fed = base.federation.model_copy(update={"sync": "full" if variant == "full_sync" else "dss", "secure_aggregation": False})
    model = base.model.model_copy(update={"use_dis": False}) if variant == "no_ldis" else base.model
    return base.model_copy(
        update={"seed": seed, "federation": fed, "model": model, "out": str(out / f"{variant}-seed{seed}"), "state_dir": None}
    )


def run_ablation(base: RunConfig, variants: list[str], seeds: list[int], out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every variant for every seed; save ``ablation.csv`` (one row per variant × seed) and ``ablation.json``."""
    from fcd_secure.federation.simulation import run_simulated  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for variant in variants:
            cfg = variant_config(base, variant, seed, out)
            log(f"[ablation] {variant} seed {seed}")
            if variant == "local_only":
                res = run_local_only(cfg)
            elif variant == "centralised":
                res = run_centralised(cfg)
            else:
                r = run_simulated(cfg)
                res = {"final_eval": r.final_eval, "uplink_bytes": int(sum(h["uplink_bytes"] for h in r.history))}
            fe = res["final_eval"]
            rows.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "pehe": fe.get("pehe"),
                    "ate_error": fe.get("ate_error"),
                    "value_error": fe.get("value_error_mean"),
                    "factual_auc": fe.get("factual_auc"),
                    "uplink_mb": res["uplink_bytes"] / 1e6,
                }
            )
            log(f"[ablation]   PEHE {rows[-1]['pehe']}, ATE {rows[-1]['ate_error']}, value {rows[-1]['value_error']}")
    df = pd.DataFrame(rows)
    df.to_csv(out / "ablation.csv", index=False)
    table = {"seeds": seeds, "preset": base.preset, "rounds": base.federation.rounds, "rows": []}
    for variant in variants:
        sub = df[df.variant == variant]

        def ms(col: str) -> tuple[float, float, str]:
            vals = sub[col].astype(float).to_numpy()
            vals = vals[np.isfinite(vals)]
            if vals.size == 0:
                return math.nan, math.nan, "n/a"
            m, s = float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else 0.0
            return m, s, f"{m:.3f}±{s:.3f}"

        pe, ae, ve, um = ms("pehe"), ms("ate_error"), ms("value_error"), ms("uplink_mb")
        table["rows"].append(
            {
                "variant": LABELS[variant],
                "key": variant,
                "pehe_mean": pe[0], "pehe_sd": pe[1], "pehe_fmt": pe[2],
                "ate_mean": ae[0], "ate_sd": ae[1], "ate_fmt": ae[2],
                "value_mean": ve[0], "value_sd": ve[1], "value_fmt": ve[2],
                "uplink_mb_mean": um[0], "uplink_mb_fmt": f"{um[0]:.2f}",
            }
        )
    table["per_seed"] = json.loads(df.to_json(orient="records"))
    (out / "ablation.json").write_text(json.dumps(table, indent=2))
    return table

"""The run folder: everything a run leaves behind, written once the federation has finished.

``<out>/``
  ``config.toml`` and ``config.json``   the resolved run configuration
  ``theta_c.npz``                       the final global synchronised parameters, keyed by manifest names
  ``manifest.json``                     the Θc / Θs partition the run used
  ``rounds.csv`` / ``rounds.json``      per-round metrics (sites, bytes, loss, PEHE every few rounds)
  ``traffic.csv``                       every message: round, action, site, direction, payload / message bytes
  ``summary.json``                      final metrics, bytes, rounds, wall time, seed, versions
  ``pehe_vs_round.png``                 paper Fig. 3 (oracle PEHE vs round; DKT-Synth only)
  ``utility_vs_uplink.png``             paper Fig. 4 (utility vs cumulative uplink MB)

  ``state/``                            per-site state, server checkpoint and audit ledgers (simulation default)

Each file is written atomically and ``summary.json`` last: a folder without it is an unfinished run.
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fcd_secure._io import atomic_write_bytes, atomic_write_text, npz_bytes
from fcd_secure.config import RunConfig
from fcd_secure.manifest import FULL, THETA_C, THETA_S


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None  # JSON has no NaN; None reads as "not available"
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    return x


def versions() -> dict[str, str]:
    import flwr  # noqa: PLC0415
    import torch  # noqa: PLC0415

    import fcd_secure  # noqa: PLC0415

    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "unknown"

    return {
        "fcd_secure": v("fcd_secure"),
        "flwr": getattr(flwr, "__version__", v("flwr")),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "opacus": v("opacus"),
        "python": platform.python_version(),
    }


def build_summary(cfg: RunConfig, result, engine: str) -> dict[str, Any]:
    """``summary.json`` content from a ``FederationResult``."""
    hist = result.history
    up = int(sum(r["uplink_bytes"] for r in hist))
    down = int(sum(r["downlink_bytes"] for r in hist))
    formula = int(sum(r["uplink_formula_bytes"] for r in hist))
    m = result.manifest
    fe = dict(result.final_eval)
    summary = {
        "dataset": cfg.data.dataset,
        "preset": cfg.preset,
        "engine": engine,
        "seed": cfg.seed,
        "rounds": len(hist),
        "rounds_aborted": int(sum(1 for r in hist if r.get("aborted"))),
        "n_sites": cfg.data.n_sites,
        "clients_per_round": cfg.federation.clients_per_round,
        "sync": cfg.federation.sync,
        "secure_aggregation": cfg.federation.secure_aggregation,
        "synchronised_part": result.part,
        "params": {part: m.size(part) for part in (THETA_C, THETA_S, FULL)},
        "uplink_bytes": up,
        "downlink_bytes": down,
        "uplink_mb": up / 1e6,
        "uplink_formula_bytes": formula,
        "uplink_formula": "Σ_rounds participating sites × synchronised parameter bytes (paper Table II)",
        "pehe": fe.get("pehe"),
        "ate_error": fe.get("ate_error"),
        "factual_auc": fe.get("factual_auc"),
        "value_error_mean": fe.get("value_error_mean"),
        "policies": fe.get("policies", {}),
        "whatif": fe.get("whatif"),
        "anchors": fe.get("anchors"),
        "contexts": fe.get("contexts"),
        "factual_residual": fe.get("factual_residual"),
        "failed_sites_final_eval": fe.get("failed_sites", []),
        "wall_s": result.wall_s,
        "resumed_from_round": result.resumed_from,
        "layout_hash": m.layout_hash,
        "versions": versions(),
    }
    return _jsonable(summary)


def write_run_folder(out: str | Path, cfg: RunConfig, result, engine: str = "flower") -> Path:
    """Write the run folder: each file atomically, ``summary.json`` last (its presence means the folder is
    complete; the run's ``state/`` may live in the same folder, so the folder itself is never replaced).

    Args:
        out: the run folder.
        cfg: the resolved run config.
        result: the ``server_app.FederationResult``.
        engine: recorded in ``summary.json``.

    Returns:
        The run folder.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    if summary_path.exists():
        summary_path.unlink()  # the old summary would vouch for a mix of old and new files
    atomic_write_text(out / "config.toml", cfg.to_toml())
    atomic_write_text(out / "config.json", cfg.model_dump_json(indent=2))
    atomic_write_bytes(out / "theta_c.npz", npz_bytes(result.theta))
    atomic_write_text(out / "manifest.json", result.manifest.to_json())
    atomic_write_text(out / "rounds.csv", pd.DataFrame(result.history).to_csv(index=False))
    atomic_write_text(out / "rounds.json", json.dumps(_jsonable(result.history), indent=1))
    atomic_write_text(out / "traffic.csv", pd.DataFrame(result.traffic_rows).to_csv(index=False))
    summary = build_summary(cfg, result, engine)
    _plots(out, result.history, summary)
    atomic_write_text(summary_path, json.dumps(summary, indent=2, ensure_ascii=False))
    return out


def _plots(folder: Path, history: list[dict], summary: dict) -> None:
    """Paper Figs. 3 and 4 for this run (one method); skipped quietly when the metric was never evaluated."""
    from fcd_secure.evaluation.plots import plot_metric_vs_round, plot_utility_vs_uplink  # noqa: PLC0415

    label = f"Fed-CausalDiff ({summary['sync']})"
    pts = [(r["round"], r["pehe"]) for r in history if r.get("pehe") is not None]
    if pts:
        plot_metric_vs_round([p[0] for p in pts], {label: [p[1] for p in pts]}, folder / "pehe_vs_round.png",
                             ylabel="oracle PEHE (lower is better)",
                             title=f"{summary['dataset']}: PEHE vs round (paper Fig. 3)")
    # Fig. 4 plots downstream AUC against cumulative uplink; without an AUC (non-binary outcomes) PEHE stands in
    has_auc = any(r.get("factual_auc") is not None for r in history)
    key, name = ("factual_auc", "factual AUC (higher is better)") if has_auc else ("pehe", "PEHE (lower is better)")
    pts2 = [(r["cum_uplink_bytes"] / 1e6, r.get(key)) for r in history if r.get(key) is not None]
    if pts2:
        plot_utility_vs_uplink([(label, [p[0] for p in pts2], [p[1] for p in pts2])], folder / "utility_vs_uplink.png",
                               ylabel=name, title=f"{summary['dataset']}: utility vs uplink (paper Fig. 4)",
                               xlabel="cumulative uplink (MB)")

"""Tables III and IV and the data of Figs. 2–4 from the cells of a reproduction, written as CSV + JSON (+ PNG).

=====================  ==========================================================================================
file                   content (mean ± s.d. over seeds via :func:`~fcd_secure.experiments.tables.mean_sd_table`)
=====================  ==========================================================================================
``table3.csv/.json``   DKT-Synth: PEHE, |ATE error|, mean |policy value error|, factual AUC, uplink MB per method
                       (the ablations too), the paper's cell beside each
``table4.csv/.json``   per dataset and method: TSTR-AUC, TSTR-RMSE (and the paper's); one TRTR row per dataset
``fig2.csv/.json``     per dataset, method and policy: the step-wise DR (``dr``, :mod:`~.policy_values`), the
                       per-decision DR over the first ``ope_horizon`` steps (``pdr``) and the full horizon
                       (``pdr_full``), the simulated (direct-method) value; DKT-Synth's true value
``fig3.csv/.json``     DKT-Synth: PEHE per method and evaluated round
``fig4.csv/.json``     per dataset, method and evaluated round: cumulative uplink MB and factual AUC
``params.csv``         Θc / Θs parameter counts per dataset and method
``selection.csv``      the learning-rate candidates, their validation log-loss and the choice
``fig2_dr.png``        Fig. 2 (DR); ``fig2_simulated.png`` the simulated values; ``fig3_pehe_vs_rounds.png``;
                       ``fig4_auc_vs_uplink_<dataset>.png``
=====================  ==========================================================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fcd_secure._io import atomic_write_text, jsonable
from fcd_secure.evaluation.metrics import summarise
from fcd_secure.evaluation.plots import plot_metric_vs_round, plot_policy_values, plot_utility_vs_uplink
from fcd_secure.experiments.reproduction.presets import ABLATIONS
from fcd_secure.data.names import LABELS
from fcd_secure.experiments.reproduction.paper import PAPER_METHOD, TABLE_III, TABLE_IV
from fcd_secure.experiments.tables import mean_sd_table, skill_flags

__all__ = ["DATASET_LABELS", "POLICIES", "TABLE3_ORDER", "build_outputs", "paper_fmt"]

POLICIES = ("never", "always", "early_on", "late_on")
DATASET_LABELS = LABELS  # data.names: the one registry of dataset names
#: Table III's row order (the paper's).
TABLE3_ORDER = ("fed_causaldiff", "full_sync", "no_ldis", "fedcm", "crn", "timegan", "rcgan")


def paper_fmt(cell: tuple[float, float | None] | None) -> str:
    """A paper cell as the paper prints it: ``0.057±0.010`` or ``0.065``; ``—`` when the paper has none."""
    if cell is None:
        return "—"
    mean, sd = cell
    if isinstance(mean, float) and math.isnan(mean):
        return "NaN"
    return f"{mean:.3f}" if sd is None else f"{mean:.3f}±{sd:.3f}"


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def _write(out: Path, stem: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
    atomic_write_text(out / f"{stem}.csv", pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(out / f"{stem}.json", json.dumps(jsonable({**(extra or {}), "rows": rows}), indent=1))


def _label(method: str) -> str:
    return PAPER_METHOD.get(method, method)


def _dr_key(ope_horizon: int | None) -> str:
    return f"dr_h{ope_horizon}" if ope_horizon else "dr"


# -- Table III ---------------------------------------------------------------------------------------------------------
#: the skill figures beside PEHE in Table III (column -> key of ``EffectStats.skill_figures``)
SKILL_COLUMNS = {"pehe0": "pehe_zero", "sd_tau": "sd_tau", "corr": "corr", "ate_ratio": "ate_ratio", "skill": "skill"}


def table3(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    per_seed = [
        {"method": c["cell"]["method"], "seed": c["cell"]["seed"], "pehe": c["final"].get("pehe"),
         "ate": c["final"].get("ate_error"), "value": c["final"].get("value_error_mean"),
         "auc": c["final"].get("factual_auc"), "uplink_mb": c["uplink_mb"],
         **{k: (c["final"].get("effect_skill") or {}).get(src) for k, src in SKILL_COLUMNS.items()}}
        for c in cells if c["cell"]["dataset"] == "dkt-synth"
    ]
    summary = {r["method"]: r for r in mean_sd_table(
        per_seed, by="method", metrics=["pehe", "ate", "value", "auc", "uplink_mb", *SKILL_COLUMNS])}
    rows = []
    for m in [m for m in TABLE3_ORDER if m in summary] + [m for m in summary if m not in TABLE3_ORDER]:
        r = summary[m]
        paper = TABLE_III.get(m, {})
        rows.append({"method": m, "label": _label(m), **{k: v for k, v in r.items() if k != "method"},
                     "flags": skill_flags(r),
                     **{f"paper_{k}": paper_fmt(paper.get(k)) for k in ("pehe", "ate", "value")},
                     **{f"paper_{k}_mean": (paper[k][0] if k in paper else None) for k in ("pehe", "ate", "value")}})
    return rows


# -- Table IV ----------------------------------------------------------------------------------------------------------
def table4(cells: Sequence[dict[str, Any]], trtr: Sequence[dict[str, Any]], datasets: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for ds in datasets:
        per_seed = [{"method": c["cell"]["method"], "seed": c["cell"]["seed"], "auc": c["tstr"].get("auc"),
                     "rmse": c["tstr"].get("rmse")}
                    for c in cells if c["cell"]["dataset"] == ds and c["cell"]["method"] not in ABLATIONS]
        for r in mean_sd_table(per_seed, by="method", metrics=["auc", "rmse"]):
            paper = TABLE_IV.get(ds, {}).get(r["method"], {})
            rows.append({"dataset": ds, "method": r["method"], "label": _label(r["method"]),
                         **{k: v for k, v in r.items() if k != "method"},
                         "paper_auc": paper_fmt(paper.get("auc")), "paper_rmse": paper_fmt(paper.get("rmse")),
                         "paper_auc_mean": paper["auc"][0] if paper else None,
                         "paper_rmse_mean": paper["rmse"][0] if paper else None})
        ceil = [{"method": "trtr", "seed": t["seed"], "auc": t["trtr"].get("auc"), "rmse": t["trtr"].get("rmse")}
                for t in trtr if t["dataset"] == ds]
        for r in mean_sd_table(ceil, by="method", metrics=["auc", "rmse"]):
            rows.append({"dataset": ds, "method": "trtr", "label": "TRTR (real → real, ceiling)",
                         **{k: v for k, v in r.items() if k != "method"}, "paper_auc": "—", "paper_rmse": "—",
                         "paper_auc_mean": None, "paper_rmse_mean": None})
    return rows


# -- Fig. 2 ------------------------------------------------------------------------------------------------------------
def fig2(cells: Sequence[dict[str, Any]], ope_horizon: int | None) -> list[dict[str, Any]]:
    key = _dr_key(ope_horizon)
    groups: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for c in cells:
        ds, m = c["cell"]["dataset"], c["cell"]["method"]
        for pol, d in (c["final"].get("policies") or {}).items():
            g = groups.setdefault((ds, m, pol), {"dr": [], "pdr": [], "pdr_full": [], "simulated": [], "true": []})
            g["dr"].append(_num((c.get("stepwise_dr") or {}).get(pol, {}).get("value")))
            g["pdr"].append(_num((d.get(key) or {}).get("value")))
            g["pdr_full"].append(_num((d.get("dr") or {}).get("value")))
            g["simulated"].append(_num(d.get("value_sim")))
            g["true"].append(_num(d.get("value_true")))
    rows = []
    for (ds, m, pol), g in groups.items():
        row: dict[str, Any] = {"dataset": ds, "method": m, "label": _label(m), "policy": pol}
        for k, vals in g.items():
            s = summarise(vals)
            row.update({f"{k}_mean": s.mean, f"{k}_sd": s.std, f"{k}_n": s.n})
        rows.append(row)
    return rows


# -- Figs. 3 and 4 -----------------------------------------------------------------------------------------------------
def _per_round(cells: Sequence[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for c in cells:
        for r in c["history"]:
            if r.get(metric) is None:
                continue
            g = groups.setdefault((c["cell"]["dataset"], c["cell"]["method"], int(r["round"])), {metric: [], "mb": []})
            g[metric].append(float(r[metric]))
            g["mb"].append(float(r["cum_uplink_bytes"]) / 1e6)
    rows = []
    for (ds, m, rnd), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        s = summarise(g[metric])
        rows.append({"dataset": ds, "method": m, "label": _label(m), "round": rnd, f"{metric}_mean": s.mean,
                     f"{metric}_sd": s.std, "n_seeds": s.n, "cum_uplink_mb": float(np.mean(g["mb"]))})
    return rows


def _figures(out: Path, t2: list[dict[str, Any]], f3: list[dict[str, Any]], f4: list[dict[str, Any]],
             datasets: Sequence[str], methods: Sequence[str], preset: str,
             references: dict[str, float] | None = None) -> list[str]:
    """Figs. 2 and 4 over ``methods``; Fig. 3 also draws Table III's ablations and ``references`` (the zero-effect
    PEHE₀ and the constant-effect floor sd τ of the test cohorts)."""
    written: list[str] = []
    for key, stem, ylabel in (("dr", "fig2_dr", "step-wise DR estimate"), ("simulated", "fig2_simulated",
                                                                          "simulated policy value")):
        panels = {DATASET_LABELS.get(ds, ds): {_label(m): {r["policy"]: r[f"{key}_mean"] for r in t2
                                                          if r["dataset"] == ds and r["method"] == m}
                                               for m in methods if any(r["method"] == m and r["dataset"] == ds for r in t2)}
                  for ds in datasets}
        panels = {k: v for k, v in panels.items() if v}
        if panels:
            plot_policy_values(panels, POLICIES, out / f"{stem}.png", ylabel=ylabel,
                               title=f"paper Fig. 2 ({preset}): {ylabel} of the four policies")
            written.append(f"{stem}.png")
    dkt = [r for r in f3 if r["dataset"] == "dkt-synth"]
    rounds = sorted({r["round"] for r in dkt})
    series = {_label(m): [next((r["pehe_mean"] for r in dkt if r["method"] == m and r["round"] == rnd), math.nan)
                          for rnd in rounds]
              for m in list(methods) + list(ABLATIONS) if any(r["method"] == m for r in dkt)}
    if rounds and series:
        plot_metric_vs_round(rounds, series, out / "fig3_pehe_vs_rounds.png", ylabel="PEHE (DKT-Synth oracle)",
                             title=f"paper Fig. 3 ({preset}): PEHE against rounds", references=references)
        written.append("fig3_pehe_vs_rounds.png")
    for ds in datasets:
        pts = []
        for m in methods:
            rs = [r for r in f4 if r["dataset"] == ds and r["method"] == m and np.isfinite(r["factual_auc_mean"])]
            if rs:
                pts.append((_label(m), [r["cum_uplink_mb"] for r in rs], [r["factual_auc_mean"] for r in rs]))
        if pts:
            name = f"fig4_auc_vs_uplink_{ds}.png"
            plot_utility_vs_uplink(pts, out / name, ylabel="factual AUC", xlabel="cumulative uplink (MB)",
                                   title=f"paper Fig. 4 ({preset}): {DATASET_LABELS.get(ds, ds)}")
            written.append(name)
    return written


def build_outputs(
    out: Path,
    cells: Sequence[dict[str, Any]],
    trtr: Sequence[dict[str, Any]],
    selections: Sequence[dict[str, Any]],
    datasets: Sequence[str],
    methods: Sequence[str],
    preset: str,
    ope_horizon: int | None,
) -> dict[str, Any]:
    """Write every table and figure of the reproduction into ``out`` (module docstring).

    Returns:
        The tables as written (``table3``, ``table4``, ``fig2``, ``fig3``, ``fig4``, ``params``, ``selection``) and
        ``figures`` (the PNG names).
    """
    out.mkdir(parents=True, exist_ok=True)
    t3 = table3(cells)
    t4 = table4(cells, trtr, datasets)
    f2 = fig2(cells, ope_horizon)
    f3 = [r for r in _per_round(cells, "pehe") if r["dataset"] == "dkt-synth"]
    f4 = _per_round(cells, "factual_auc")
    params = []
    for c in cells:
        if c["cell"]["seed"] == min(x["cell"]["seed"] for x in cells):
            params.append({"dataset": c["cell"]["dataset"], "method": c["cell"]["method"], **c["params"],
                           "total": c["params"]["theta_c"] + c["params"]["theta_s"]})
    sel = [{"dataset": s["dataset"], "method": s["method"], "lr": s["lr"], "selected_on": s.get("selected_on"),
            **{f"logloss_lr{c['lr']:g}": c["val_logloss"] for c in s["candidates"]},
            **{f"d1_lr{c['lr']:g}": c.get("d1") for c in s["candidates"]}} for s in selections]
    _write(out, "table3", t3, {"dataset": "dkt-synth"})
    _write(out, "table4", t4)
    _write(out, "fig2", f2, {"dr": "step-wise DR", "pdr": f"per-decision DR, key {_dr_key(ope_horizon)}",
                             "pdr_full": "per-decision DR, full horizon"})
    _write(out, "fig3", f3)
    _write(out, "fig4", f4)
    atomic_write_text(out / "params.csv", pd.DataFrame(params).to_csv(index=False))
    atomic_write_text(out / "selection.csv", pd.DataFrame(sel).to_csv(index=False))
    # the world's PEHE₀ and sd τ are the same for every method of a seed: any row of Table III carries them
    ref_row = next((r for r in t3 if r.get("pehe0_n")), {})
    refs = {"zero-effect PEHE₀": ref_row.get("pehe0_mean"), "constant-effect floor sd τ": ref_row.get("sd_tau_mean")}
    figures = _figures(out, f2, f3, f4, datasets, [m for m in methods if m not in ABLATIONS], preset, refs)
    return {"table3": t3, "table4": t4, "fig2": f2, "fig3": f3, "fig4": f4, "params": params, "selection": sel,
            "figures": figures}

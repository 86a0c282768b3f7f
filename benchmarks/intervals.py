"""Measured coverage of the 90 % intervals of policy values and effects (``fcd_secure.evaluation.intervals``).

For each seed this trains the federation exactly as ``fcd run`` does (simulation engine, DSS, the preset's sizes),
lets its final evaluation ask the paper's four policies (never as the reference), and then compares with the
oracle's truth:

* **run**: does the interval the server computed from the consortium sums cover the true value on the same test
  entities? One check per policy value (simulated, and factually rectified) and per effect
  (always/early_on/late_on − never), per seed.
* **resamples**: the per-entity values each site wrote into its own folder are resampled — ``--resamples`` cohorts
  of ``m`` test entities for each ``m`` in ``--sizes`` — and the interval is rebuilt from that cohort's sums exactly
  as the server would. Coverage is counted against two targets:
  ``truth`` (the oracle's mean over the same cohort: the honest figure, where a biased simulator shows) and
  ``model`` (the simulator's own mean over every test entity: whether the interval machinery itself is calibrated).

Where sites log propensities the doubly robust intervals (``dr-``) are counted too, and for binary outcomes their
widened form (``drb-``: the unseen-mass bounds of ``fcd_secure.evaluation.intervals``, rebuilt for each cohort from
the per-step pieces in the sites' per-entity files exactly as one site holding that cohort would send them), with
their median width beside the coverage.

Nominal 90 %; the target is 85–95 %. The oracle of a dataset is one function in :data:`ORACLES` (per-entity true
values of a policy, in the order of the per-entity file's ``entity`` column): DKT-Synth and the tumour world.

    .venv/bin/python benchmarks/intervals.py --quick                       # tiny, 1 seed, 1 round, in-process engine
    .venv/bin/python benchmarks/intervals.py --preset default --seeds 3    # the README run's sizes
    .venv/bin/python benchmarks/intervals.py --quick --dataset tumour      # the tumour oracle (Geng et al. 2017)
    .venv/bin/python benchmarks/intervals.py --from-run runs/a runs/b      # score finished runs (no training)
    .venv/bin/python benchmarks/intervals.py --json
    .venv/bin/python benchmarks/intervals.py --quick --dataset tumour --gamma 10 --horizon 2   # a confounded world
    .venv/bin/python benchmarks/intervals.py --synthetic                    # no training: seconds (below)

``--synthetic`` measures the bounded doubly robust interval alone, on both oracles (DKT-Synth and the tumour world)
at γ = 1.5, 4 and 10 (``--gammas``) and horizons 2 and 5 (``--horizons``), with stand-in models in place of a trained
simulator (as ``benchmarks/dr_tails.py``): ``truth`` (each entity's true per-step value under π), ``flat+0.1`` (the
population's true per-step mean, 0.1 too high), ``swap`` (each entity's truth under the opposite policy: always ↔
never, early_on ↔ late_on) and ``inverted`` (1 − the truth: a model that errs most where confounding hides π, the
failure of issue 32). For each it draws ``--resamples`` cohorts of ``--sizes`` test entities and counts how often
the bounded interval covers the cohort's true mean — with the unseen share priced at the model's extremes (what
``fcd_secure.evaluation.intervals`` does) and, for comparison, at its average (what it did before).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"

import numpy as np  # noqa: E402
from _coverage import wilson  # noqa: E402


def dkt_synth_truth(fd: Any, policy: Any, site: int, entities: np.ndarray, horizon: int | None) -> np.ndarray:
    """DKT-Synth: each test student's true value of ``policy`` (mean over the oracle's rollouts), by student id."""
    world = fd.oracle
    ids = world.student_ids(site, "test")
    per = world.policy_values_per_student(policy, site, "test", horizon=horizon).mean(axis=0)
    pos = {int(s): i for i, s in enumerate(ids)}
    return per[[pos[int(e)] for e in entities]]


def tumour_truth(fd: Any, policy: Any, site: int, entities: np.ndarray, horizon: int | None) -> np.ndarray:
    """Tumour world (Geng et al. 2017): each test patient's true value of ``policy`` (mean over the oracle's
    rollouts), by global patient id (the per-entity file's ``entity`` column)."""
    return fd.oracle.policy_values_of(policy, np.asarray(entities, dtype=np.int64), horizon=horizon).mean(axis=0)


#: dataset name -> ``truth(federated data, policy, site, entity ids of the per-entity file, horizon) -> [n]``
ORACLES: dict[str, Callable[..., np.ndarray]] = {"dkt-synth": dkt_synth_truth, "tumour": tumour_truth}


#: stand-in models of ``--synthetic``: name -> per-step v̂ from (policy name, its logged arrays, every policy's)
SYNTHETIC_MODELS: dict[str, Callable[..., np.ndarray]] = {
    "truth": lambda name, d, data: d["step"],
    "flat+0.1": lambda name, d, data: np.broadcast_to(
        np.nanmean(np.where(d["M"] > 0, d["step"], np.nan), axis=0), d["step"].shape) + 0.1,
    "swap": lambda name, d, data: data[{"never": "always", "always": "never", "early_on": "late_on",
                                        "late_on": "early_on"}[name]]["step"],
    "inverted": lambda name, d, data: 1.0 - d["step"],
}


def logged_with_truth(dataset: str, gamma: float, horizon: int, preset: str, sites: int, seed: int
                      ) -> dict[str, dict[str, np.ndarray]]:
    """Per default policy, over every site's test entities: logged Y, M, P, π(logged a) over the first ``horizon``
    steps, each entity's true per-step values under π and its true window value (the oracle's rollouts)."""
    from fcd_secure.data.policy import bind_policy, default_policies
    from fcd_secure.data.registry import load_federated
    from fcd_secure.evaluation.ope import target_probs

    fd = load_federated(dataset, n_sites=sites, preset=preset, seed=seed, world={"gamma": gamma})
    world = fd.oracle
    out: dict[str, dict[str, list[np.ndarray]]] = {}
    for s in range(sites):
        sub = fd.test[s]
        ids = world.entity_ids(s, "test")
        for pol in default_policies():
            pol = bind_policy(pol, sub)
            cum = np.stack([world.policy_values_of(pol, ids, horizon=h + 1).mean(0) * (h + 1) for h in range(horizon)],
                           axis=1)
            d = out.setdefault(pol.name, {})
            for k, v in (("Y", sub.Y[:, :horizon]), ("M", sub.M[:, :horizon]), ("P", sub.P[:, :horizon]),
                         ("pi", target_probs(pol, sub, fd.anchors)[:, :horizon]),
                         ("step", np.diff(np.concatenate([np.zeros((sub.n, 1)), cum], axis=1), axis=1)),
                         ("truth", world.policy_values_of(pol, ids, horizon=horizon).mean(0))):
                d.setdefault(k, []).append(np.asarray(v, dtype=np.float64))
    return {n: {k: np.concatenate(v) for k, v in d.items()} for n, d in out.items()}


def _average_priced(w: np.ndarray, scale: np.ndarray, v: np.ndarray) -> dict[str, float]:
    """The unseen-mass sums as ``evaluation.intervals`` formed them before issue 32: B_t times the model's average."""
    from fcd_secure.evaluation.intervals import reached_mass

    valid = scale > 0
    missed = np.clip(1.0 - reached_mass(w, scale), 0.0, 1.0)
    return {"q.unseen_lo": float((missed * np.where(valid, scale * v, 0.0).sum(0)).sum()),
            "q.unseen_hi": float((missed * np.where(valid, scale * (1 - v), 0.0).sum(0)).sum())}


def synthetic(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--synthetic`` (module docstring): one row per dataset, γ, horizon, cohort size, model and policy."""
    import warnings

    from fcd_secure.evaluation.intervals import interval_from_sums, site_sums, unseen_bounds, unseen_mass_sums
    from fcd_secure.evaluation.ope import PerDecisionDR

    rows = []
    for dataset in args.datasets:
        for gamma in args.gammas:
            for horizon in args.horizons:
                _status(f"{dataset} γ {gamma:g} horizon {horizon}")
                data = logged_with_truth(dataset, gamma, horizon, args.preset if args.preset != "tiny" else "default",
                                         args.sites or 3, 0)
                rng = np.random.default_rng(args.seed if hasattr(args, "seed") else 0)
                for model, make in SYNTHETIC_MODELS.items():
                    for name, d in data.items():
                        v = np.clip(np.where(d["M"] > 0, make(name, d, data), 0.0), 0.0, 1.0)
                        rtg = np.cumsum(v[:, ::-1], axis=1)[:, ::-1]
                        est = PerDecisionDR()
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            dr, support = est.per_entity(d["Y"], d["M"], d["P"], d["pi"], q_hat=rtg, v_hat=rtg)
                            w, scale = est.step_weights(d["Y"], d["M"], d["P"], d["pi"])
                        for m in args.sizes:
                            if m > len(dr):
                                continue
                            hit = {"extremes": 0, "average": 0}
                            width = []
                            for _ in range(args.resamples):
                                idx = rng.choice(len(dr), size=m, replace=False)
                                truth = float(d["truth"][idx].mean())
                                base = site_sums("q", dr[idx])
                                iv = interval_from_sums(base, "q", args.level)
                                for kind, sums in (("extremes", unseen_mass_sums("q", w[idx], scale[idx], v[idx],
                                                                                 dr=dr[idx])),
                                                   ("average", _average_priced(w[idx], scale[idx], v[idx]))):
                                    b = unseen_bounds(iv, {**base, **sums}, "q")
                                    hit[kind] += b["low"] <= truth <= b["high"]
                                    if kind == "extremes":
                                        width.append(b["high"] - b["low"])
                            rows.append({"dataset": dataset, "gamma": gamma, "horizon": horizon, "m": m, "model": model,
                                         "policy": name, "support": float(support.mean()),
                                         "coverage": hit["extremes"] / args.resamples,
                                         "coverage_average_priced": hit["average"] / args.resamples,
                                         "width": float(np.median(width))})
    return rows


def print_synthetic(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"bounded DR value interval: coverage of the cohort's truth (nominal {args.level:.0%}; mean over "
                    f"4 models × 4 policies, lowest in brackets; stand-in models, no training)")
    for c in ("dataset", "γ", "H", "m", "now (extremes)", "before (average)", "median width"):
        t.add_column(c, justify="left" if c == "dataset" else "right")
    keys = sorted({(r["dataset"], r["gamma"], r["horizon"], r["m"]) for r in rows})
    for key in keys:
        rs = [r for r in rows if (r["dataset"], r["gamma"], r["horizon"], r["m"]) == key]
        now = [r["coverage"] for r in rs]
        old = [r["coverage_average_priced"] for r in rs]
        t.add_row(key[0], f"{key[1]:g}", str(key[2]), str(key[3]), f"{np.mean(now):.1%} ({min(now):.0%})",
                  f"{np.mean(old):.1%} ({min(old):.0%})", f"{np.mean([r['width'] for r in rs]):.3f}")
    con.print(t)
    worst = sorted(rows, key=lambda r: r["coverage"])[:5]
    for r in worst:
        con.print(f"  lowest: {r['dataset']} γ {r['gamma']:g} H {r['horizon']} m {r['m']} {r['model']} / "
                  f"{r['policy']}:"
                  f" {r['coverage']:.0%} (before {r['coverage_average_priced']:.0%}), support {r['support']:.0%}")


def _status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train(preset: str, seed: int, sites: int | None, rounds: int | None, level: float, dataset: str,
          horizon: int | None = None, test_fraction: float | None = None, gamma: float | None = None,
          inprocess: bool = False) -> Path:
    """One federated run as ``fcd run`` makes it (its final evaluation asks the paper's four policies, over the
    first ``horizon`` steps when given), on Flower's simulation engine or, with ``inprocess``, on the in-process
    engine (``engines.inprocess``: the same round loop, ClientApp and messages without Ray's start; the quick form)."""
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.engines.simulation import run_simulated

    over: dict[str, Any] = {"seed": seed, "data": {"dataset": dataset}, "federation": {"eval_every": 0},
                            "evaluation": {"level": level, "horizon": horizon}}
    if sites:
        over["data"]["n_sites"] = sites
        over["federation"]["clients_per_round"] = max(1, sites // 2)
        # secure aggregation needs 4 sites a round; below that the run is plain FedAvg (the sums are the same)
        over["federation"]["secure_aggregation"] = sites // 2 >= 4
    if rounds:
        over["federation"]["rounds"] = rounds
    if test_fraction:
        over["data"]["test_fraction"] = test_fraction
    if gamma is not None:
        over["data"]["gamma"] = gamma
    cfg = build_config(preset, over).model_copy(update={"out": tempfile.mkdtemp(prefix="fcd-intervals-")})
    _status(f"seed {seed}: training ({cfg.data.n_sites} sites, {cfg.federation.rounds} rounds, preset {preset})")
    (run_inprocess if inprocess else run_simulated)(cfg)
    return Path(cfg.out)


def score(run: Path, sizes: list[int], resamples: int) -> dict[str, Any]:
    """Count coverage of one finished run (module docstring); its seed seeds the cohorts."""
    import pandas as pd

    from fcd_secure.config import RunConfig
    from fcd_secure.data.policy import default_policies
    from fcd_secure.evaluation.intervals import interval_from_sums, site_sums, unseen_bounds, unseen_mass_sums
    from fcd_secure.federation import learner
    from fcd_secure.queries.request import request_from_config

    cfg = RunConfig.load(run / "config.toml")
    seed, level = cfg.seed, cfg.evaluation.level
    summary = json.loads((run / "summary.json").read_text())
    if not summary.get("whatif"):  # the run's final evaluation did not answer: use `fcd whatif`'s answer instead
        summary = json.loads((run / "whatif" / f"{request_from_config(cfg).query_id}.json").read_text())
    request = request_from_config(cfg)
    query = summary["whatif"]["query_id"]  # the question the run's final evaluation asked (its per-entity files)
    fd = learner.load_federated(cfg)
    truth_of = ORACLES[cfg.data.dataset]
    pols = {p.name: p for p in default_policies()}
    ref = request.reference

    # run level: the server's intervals against the truth on the same entities
    checks = []
    for name, d in summary["policies"].items():
        checks.append({"quantity": f"value[{name}]", "covered": d["interval"]["low"] <= d["value_true"] <= d["interval"]["high"],
                       "estimate": d["value_sim"], "truth": d["value_true"]})
        r = d["rectified"]
        checks.append({"quantity": f"rectified[{name}]", "covered": r["low"] <= d["value_true"] <= r["high"],
                       "estimate": r["estimate"], "truth": d["value_true"]})
        if "doubly_robust" in d:
            r = d["doubly_robust"]
            checks.append({"quantity": f"dr-value[{name}]", "covered": r["low"] <= d["value_true"] <= r["high"],
                           "estimate": r["estimate"], "truth": d["value_true"], "support": r["support"]})
            if "bounded" in r:
                b = r["bounded"]
                checks.append({"quantity": f"drb-value[{name}]", "covered": b["low"] <= d["value_true"] <= b["high"],
                               "estimate": r["estimate"], "truth": d["value_true"], "width": b["high"] - b["low"]})
        if "effect" in d:
            e = d["effect"]
            checks.append({"quantity": f"effect[{name} - {ref}]", "covered": e["low"] <= e["true"] <= e["high"],
                           "estimate": e["estimate"], "truth": e["true"]})
            if "doubly_robust" in e:
                r = e["doubly_robust"]
                checks.append({"quantity": f"dr-effect[{name} - {ref}]", "covered": r["low"] <= e["true"] <= r["high"],
                               "estimate": r["estimate"], "truth": e["true"]})
                if "bounded" in r:
                    b = r["bounded"]
                    checks.append({"quantity": f"drb-effect[{name} - {ref}]", "covered": b["low"] <= e["true"] <= b["high"],
                                   "estimate": r["estimate"], "truth": e["true"], "width": b["high"] - b["low"]})

    # resamples: per-entity model values (from the sites' own files) and per-entity truth
    model_v: dict[str, list[np.ndarray]] = {n: [] for n in pols}
    true_v: dict[str, list[np.ndarray]] = {n: [] for n in pols}
    dr_v: dict[str, list[np.ndarray]] = {n: [] for n in pols}
    # the unseen-mass bounds' per-step pieces (w_{0:t}, v̂_t per policy; each step's share of the value)
    dr_w: dict[str, list[np.ndarray]] = {n: [] for n in pols}
    dr_vhat: dict[str, list[np.ndarray]] = {n: [] for n in pols}
    dr_scale: list[np.ndarray] = []
    residual: list[np.ndarray] = []
    state = run / "state"
    missing = [s for s in range(cfg.data.n_sites) if not (state / f"site-{s:02d}" / "whatif" / f"{query}.csv").exists()]
    if missing:  # a site declined the evaluation (test split below its cohort floor): no truth for the whole run
        raise SystemExit(f"{run}: sites {missing} wrote no per-entity file (declined under their cohort rules?); "
                         f"use fewer sites or a larger --test-fraction")
    for s in range(cfg.data.n_sites):
        df = pd.read_csv(state / f"site-{s:02d}" / "whatif" / f"{query}.csv")
        ent = df["entity"].to_numpy()
        residual.append(df["factual_residual"].to_numpy())
        for n, p in pols.items():
            model_v[n].append(df[f"value[{n}]"].to_numpy())
            true_v[n].append(truth_of(fd, p, s, ent, request.horizon))
            if f"dr[{n}]" in df:
                dr_v[n].append(df[f"dr[{n}]"].to_numpy())
            if f"dr_w[{n}][0]" in df:
                dr_w[n].append(df[[c for c in df.columns if c.startswith(f"dr_w[{n}][")]].to_numpy())
                dr_vhat[n].append(df[[c for c in df.columns if c.startswith(f"dr_vhat[{n}][")]].to_numpy())
        if "dr_scale[0]" in df:
            dr_scale.append(df[[c for c in df.columns if c.startswith("dr_scale[")]].to_numpy())
    mv = {n: np.concatenate(v) for n, v in model_v.items()}
    tv = {n: np.concatenate(v) for n, v in true_v.items()}
    res_v = np.concatenate(residual)
    quantities = {f"value[{n}]": (mv[n], tv[n]) for n in pols}
    quantities.update({f"rectified[{n}]": (mv[n] - res_v, tv[n]) for n in pols})
    quantities.update({f"effect[{n} - {ref}]": (mv[n] - mv[ref], tv[n] - tv[ref]) for n in pols if n != ref})
    dv = {n: np.concatenate(v) for n, v in dr_v.items() if len(v) == cfg.data.n_sites}
    if len(dv) == len(pols):
        quantities.update({f"dr-value[{n}]": (dv[n], tv[n]) for n in pols})
        quantities.update({f"dr-effect[{n} - {ref}]": (dv[n] - dv[ref], tv[n] - tv[ref]) for n in pols if n != ref})
    steps = None
    if len(dr_scale) == cfg.data.n_sites and all(len(v) == cfg.data.n_sites for v in dr_w.values()):
        steps = {"scale": np.concatenate(dr_scale), "w": {n: np.concatenate(v) for n, v in dr_w.items()},
                 "v_hat": {n: np.concatenate(v) for n, v in dr_vhat.items()}}
    dr_support = {n: d["doubly_robust"]["support"] for n, d in summary["policies"].items() if "doubly_robust" in d}
    N = len(mv[ref])
    rng = np.random.default_rng(seed)
    counts: dict[tuple[str, int], dict[str, int]] = {}
    for m in sizes:
        if m > N:
            continue
        for r in range(resamples):
            idx = rng.choice(N, size=m, replace=False)
            for q, (x, t) in quantities.items():
                iv = interval_from_sums(site_sums("q", x[idx]), "q", level)
                c = counts.setdefault((q, m), {"truth": 0, "model": 0, "n": 0})
                c["truth"] += iv.covers(float(t[idx].mean()))
                c["model"] += iv.covers(float(x.mean()))
                c["n"] += 1
                if steps is not None and q.startswith("dr-"):
                    # the cohort as one site would bound it: its own B_t from the cohort's weights
                    names = [p.strip() for p in q.split("[", 1)[1].rstrip("]").split(" - ")]
                    total = site_sums("q", x[idx])
                    for k, n in zip(("p", "r"), names):
                        total.update(unseen_mass_sums(k, steps["w"][n][idx], steps["scale"][idx],
                                                      steps["v_hat"][n][idx], dr=dv[n][idx]))
                    b = unseen_bounds(iv, total, "p", "r" if len(names) == 2 else None)
                    cb = counts.setdefault((q.replace("dr-", "drb-", 1), m), {"truth": 0, "model": 0, "n": 0, "width": []})
                    cb["truth"] += b["low"] <= float(t[idx].mean()) <= b["high"]
                    cb["model"] += b["low"] <= float(x.mean()) <= b["high"]
                    cb["width"].append(b["high"] - b["low"])
                    cb["n"] += 1
                    c.setdefault("width", []).append(iv.high - iv.low)
    def _bias(q: str) -> float:
        x, t = quantities[q.replace("drb-", "dr-", 1)]
        return float(x.mean() - t.mean())

    resampled = [{"quantity": q, "m": m, "truth": c["truth"] / c["n"], "model": c["model"] / c["n"], "n": c["n"],
                  "bias": _bias(q), "width": float(np.median(c["width"])) if "width" in c else None}
                 for (q, m), c in counts.items()]
    return {"seed": seed, "dataset": cfg.data.dataset, "n_test": N, "pehe": summary.get("pehe"), "run": checks,
            "resamples": resampled, "dr_support": dr_support, "horizon": request.horizon}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--dataset", default="dkt-synth", choices=sorted(ORACLES))
    ap.add_argument("--seeds", type=int, default=2, help="seeds 0..S-1")
    ap.add_argument("--sites", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--test-fraction", type=float, default=None,
                    help="share of each site's entities held out (data.test_fraction; --quick: 0.4, so that every "
                    "site's test split is above the cohort floor of 20)")
    ap.add_argument("--horizon", type=int, default=None,
                    help="values over the first H steps (evaluation.horizon; default: whole trajectories)")
    ap.add_argument("--from-run", type=Path, nargs="+", default=None, help="score these finished run folders instead")
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 100])
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--quick", action="store_true",
                    help="tiny preset, 1 seed, 3 sites, 1 round, test fraction 0.4, 100 resamples, the in-process "
                    "engine (no Ray start)")
    ap.add_argument("--gamma", type=float, default=None, help="confounding strength γ of the generated world (data.gamma)")
    ap.add_argument("--synthetic", action="store_true",
                    help="no training: the bounded DR interval with stand-in models on both oracles (module docstring)")
    ap.add_argument("--datasets", nargs="+", default=sorted(ORACLES), help="--synthetic: the oracles")
    ap.add_argument("--gammas", type=float, nargs="+", default=[1.5, 4.0, 10.0], help="--synthetic: the γ values")
    ap.add_argument("--horizons", type=int, nargs="+", default=[2, 5], help="--synthetic: the horizons")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.synthetic:
        if args.sizes == [25, 100]:
            args.sizes = [100]
        rows = synthetic(args)
        machine = f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f}"
        if args.json:
            print(json.dumps({"machine": machine, "params": vars(args), "rows": rows}, default=str))
        else:
            print_synthetic(rows, args)
            print(machine)
        return

    import torch

    torch.set_num_threads(1)
    if args.quick:
        # one round: the coverage is counted on the final evaluation's answer, which one round reaches
        args.preset, args.seeds, args.sites, args.rounds, args.resamples = "tiny", 1, 3, 1, 100
        args.test_fraction = args.test_fraction or 0.4
    runs = args.from_run or [train(args.preset, s, args.sites, args.rounds, args.level, args.dataset, args.horizon,
                                   args.test_fraction, args.gamma, inprocess=args.quick)
                             for s in range(args.seeds)]
    results = [score(r, args.sizes, args.resamples) for r in runs]
    run_checks = [c for r in results for c in r["run"]]
    agg: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        for row in r["resamples"]:
            agg.setdefault((row["quantity"], row["m"]), []).append(row)
    table = [{"quantity": q, "cohort m": m,
              "coverage of truth": float(np.mean([x["truth"] for x in rows])),
              "coverage of model mean": float(np.mean([x["model"] for x in rows])),
              "model − truth": float(np.mean([x["bias"] for x in rows])),
              "median width": float(np.mean([x["width"] for x in rows])) if rows[0].get("width") is not None else None}
             for (q, m), rows in sorted(agg.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    kinds = ("value", "rectified", "dr-value", "drb-value", "effect", "dr-effect", "drb-effect")
    by_m: dict[int, dict[str, dict[str, float]]] = {}
    for m in sorted({k[1] for k in agg}):
        for kind in kinds:
            rows = [x for (q, mm), xs in agg.items() if mm == m and q.startswith(kind) for x in xs]
            if rows:
                by_m.setdefault(m, {})[kind] = {"truth": float(np.mean([x["truth"] for x in rows])),
                                                "model": float(np.mean([x["model"] for x in rows])),
                                                "min": float(np.min([x["truth"] for x in rows])),
                                                "width": (float(np.mean([x["width"] for x in rows]))
                                                          if rows[0].get("width") is not None else None)}
    # cohorts drawn from one test set overlap: the coverage over many resamples of m from n is a mean over about
    # n // m independent trials per seed, not over the resamples (cohorts of 100 from 120 entities are one trial each)
    independent = {m: sum(r["n_test"] // m for r in results) for m in by_m}
    for m, per in by_m.items():
        for c in per.values():
            c["independent_cohorts"] = independent[m]
            c["wilson90"] = wilson(c["truth"], independent[m], 0.9)
    run_by_kind = {kind: float(np.mean([c["covered"] for c in run_checks if c["quantity"].startswith(kind)]))
                   for kind in kinds if any(c["quantity"].startswith(kind) for c in run_checks)}
    datasets = ", ".join(sorted({r["dataset"] for r in results}))
    machine = (f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · {datasets} · "
               + (f"{len(runs)} finished runs" if args.from_run else f"preset {args.preset} · {args.seeds} seeds")
               + f" · horizon {', '.join(sorted({str(r['horizon'] or 'whole') for r in results}))}"
               + f" · nominal {args.level:.0%}")
    out = {"machine": machine, "params": vars(args),
           "run_coverage_of_truth": float(np.mean([c["covered"] for c in run_checks])) if run_checks else None,
           "run_coverage_by_kind": run_by_kind, "run_checks": len(run_checks), "by_cohort_size": by_m,
           "results": table, "seeds": results}
    if args.json:
        print(json.dumps(out, default=str))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    t = Table(title=f"interval coverage ({machine})")
    for k in table[0]:
        t.add_column(k, justify="left" if k == "quantity" else "right", overflow="fold")
    for r in table:
        t.add_row(*(f"{v:.3f}" if isinstance(v, float) else escape(str("" if v is None else v)) for v in r.values()))  # "value[never]"
    con.print(t)
    con.print(f"nominal {args.level:.0%}, target 85–95 %")
    for m, per in by_m.items():
        for kind, c in per.items():
            width = f", median width {c['width']:.3f}" if c.get("width") is not None else ""
            lo, hi = c["wilson90"]
            con.print(f"cohorts of {m}, {kind}: coverage of the truth {c['truth']:.1%} (lowest quantity "
                      f"{c['min']:.1%}; ≈ {c['independent_cohorts']} independent cohorts, 90 % Wilson interval "
                      f"{lo:.0%}–{hi:.0%}), of the model's own mean {c['model']:.1%}{width}")
    for m in by_m:
        if any(m > r["n_test"] / 4 for r in results):
            con.print(f"[bold]note[/bold]: cohorts of {m} are drawn from test sets of "
                      f"{', '.join(str(r['n_test']) for r in results)} entities: they overlap, so their coverage rests "
                      f"on about {independent[m]} independent cohorts, not {args.resamples} per seed (use a larger "
                      "--test-fraction or preset, or smaller --sizes)")
    for kind, cov in run_by_kind.items():
        con.print(f"whole test sets (the server's intervals), {kind}: coverage of the truth {cov:.1%}")
    for r in results:
        sup = ", ".join(f"{n} {v:.0%}" for n, v in r["dr_support"].items())
        con.print(f"  seed {r['seed']}: {r['n_test']} test entities, PEHE {r['pehe']:.3f}, horizon "
                  f"{r['horizon'] or 'whole trajectories'}; steps with logged support (DR): {sup or 'n/a'}")


if __name__ == "__main__":
    main()

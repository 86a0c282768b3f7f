"""Whole-trajectory fidelity with and without the free-running loss (``model.free_running_steps``,
:mod:`fcd_secure.model.free_running`; issue 42 item 3), side by side on the worlds this work may be tuned on.

Per world and seed, Fed-CausalDiff is trained once per variant (``--steps``: k = 0 is one-step training only, the
project's objective before the loss existed; every other k adds L_free with ``--discount``) on the pooled training
rows of the sites (validation rows held out), as :mod:`benchmarks.tumour` trains it, and each trained network is
also rolled out through its encoder (``model.rollout = "encoder"``, not trained again). Every one is scored on every
site's test split as a federated run scores it (``queries.evaluation.site_metrics``, merged):

* ``value err`` — the mean over the evaluated policies of |V̂ − V| of the whole-trajectory value (every step from
  t = 0, the per-step mean outcome; the oracle's truth under common random numbers);
* ``A−N err`` — the always-vs-never effect over the whole trajectory (h = 30 on the tumour world),
  |(V̂_always − V̂_never) − (V_always − V_never)|;
* ``NC gap`` / ``NC |z|`` — the natural-course check (``queries.natural_course``): the mean over steps of
  |simulated − observed| outcome mean under the logging policy from t = 0, and the largest per-step |z|;
  ``NC ctx`` the same gap of the generated endogenous contexts (pooled over steps);
* ``train s`` — wall seconds of training (the cost of the loss).

Worlds: the tumour world (``--gamma``, seeds ``--seeds``; 10-12 by default: seeds 0-2 are quoted by the carry-over
benchmark and are not tuned on) and DKT-Synth (``--dkt``; its confounder is hidden, so its whole-trajectory values
are not identified by g-computation; they are printed as a check that the loss does no harm, not as a target).

The figures and what they say: ``docs/tumour.md``, "Training over the whole horizon".

    nice -n 10 .venv/bin/python benchmarks/free_running.py                       # tumour γ = 2, seeds 10-12, k = 0, 5
    nice -n 10 .venv/bin/python benchmarks/free_running.py --steps 29 --model '{"rollout": "encoder"}'  # encoder loss
    nice -n 10 .venv/bin/python benchmarks/free_running.py --steps 0 3 5 10 --dkt
    nice -n 10 .venv/bin/python benchmarks/free_running.py --quick               # 300 patients, 1 epoch, one seed
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import tumour as tb  # noqa: E402  (the tumour benchmark's site views, training and scoring)

ROLLOUTS = ("latent", "encoder")


def scored(sim: Any, cfg: Any, views: list[Any]) -> dict[str, Any]:
    """The figures of the module docstring for one trained (or re-rolled) simulator."""
    from fcd_secure.data.schema import concat
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.federation.learner import SiteData
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.natural_course import NaturalCourse
    from fcd_secure.queries.policy_values import PolicyValues, SimulatedValues

    # the two answers scored, on the sites' test rows pooled (the sums are additive; pooled, no site's test split
    # falls below the cohort floor of the natural-course sums)
    queries = (PolicyValues(parts=(SimulatedValues(),)), NaturalCourse())
    pooled = SiteData(train=concat([v.train for v in views]), test=concat([v.test for v in views]), site_index=0,
                      n_sites=views[0].n_sites, anchors=views[0].anchors, oracle=views[0].oracle, description={},
                      validation=None)
    m = merge_site_metrics([site_metrics(sim, pooled, cfg, full_eval_config(cfg), queries=queries)],
                           queries=queries)
    pol = {p: (d.get("value_sim"), d.get("value_true")) for p, d in (m.get("policies") or {}).items()
           if isinstance(d, dict)}
    errs = [abs(s - t) for s, t in pol.values() if s is not None and t is not None]
    eff = None
    if {"always", "never"} <= set(pol):
        (sa, ta), (sn, tn) = pol["always"], pol["never"]
        eff = abs((sa - sn) - (ta - tn))
    nc = m.get("natural_course") or {}
    return {"value_error": float(np.mean(errs)) if errs else None, "effect_error": eff, "values": pol,
            "nc_gap": nc.get("mean_abs_gap"), "nc_z": nc.get("max_abs_z"),
            "nc_ctx": (nc.get("contexts") or {}).get("mean_abs_gap"), "pehe": m.get("pehe"),
            # the per-step gaps (simulated − observed outcome mean): whether the gap grows with t (compounding) or
            # is there from the first steps
            "nc_steps": [row["gap"] for row in nc.get("steps") or []]}


def run_world(world_name: str, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every variant of ``--steps`` on one world and seed."""
    from fcd_secure.config import build_config
    from fcd_secure.federation import learner

    rows = []
    world = None
    if world_name == "tumour":
        from fcd_secure.data.tumour import TumourConfig, generate

        world = generate(TumourConfig.from_preset("default", gamma=args.gamma, seed=seed, n_patients=args.patients,
                                                  max_len=args.days, test_fraction=0.2))
    for k in args.steps:
        # the paper's diffusion transition, with which docs/tumour.md's figures were measured (the tumour world's own
        # default is the deterministic one, config.WORLD_DEFAULTS); --model '{"transition": ...}' names another
        model = {"transition": tb.PAPER_TRANSITION, "free_running_steps": k, "free_running_discount": args.discount,
                 **args.model}
        if world is not None:
            cfg = build_config("default", {"seed": seed, "data": {"dataset": "tumour"}, "model": model,
                                           "evaluation": {"n_samples": args.samples}})
            views = tb.site_views(world, cfg, 0.2)
            epochs = args.epochs
        else:
            cfg = build_config(args.dkt_preset, {"seed": seed, "model": model,
                                                 "evaluation": {"n_samples": args.samples}})
            views = [learner.load_site_data(cfg, i) for i in range(cfg.data.n_sites)]
            epochs = args.dkt_epochs
        t0 = time.perf_counter()
        sim = tb.train("fed_causaldiff", cfg, views, epochs)
        train_s = time.perf_counter() - t0
        for rollout in ROLLOUTS:
            r = scored(tb.rolled_out_by(sim, rollout), cfg, views)
            r.update(world=world_name, seed=seed, k=k, rollout=rollout, train_s=train_s)
            rows.append(r)
            print(f"{world_name} seed {seed} k={k} {rollout}: value err {_f(r['value_error'])} A−N err "
                  f"{_f(r['effect_error'])} NC gap {_f(r['nc_gap'])} |z| {_f(r['nc_z'], '.1f')} ctx "
                  f"{_f(r['nc_ctx'], '.4f')} ({train_s:.0f} s)", file=sys.stderr, flush=True)
    return rows


def _f(v: Any, fmt: str = ".3f") -> str:
    return "–" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, fmt)


def print_table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(out["machine"])
    rows = out["rows"]
    t = Table(title="whole-trajectory fidelity: one-step training (k = 0) vs the free-running loss (k > 0)")
    for col in ("world", "seed", "rollout", "k", "value err", "A−N err", "NC gap", "NC |z|", "NC ctx", "train s"):
        t.add_column(col, justify="left" if col in ("world", "rollout") else "right")
    for r in rows:
        t.add_row(r["world"], str(r["seed"]), r["rollout"], str(r["k"]), _f(r["value_error"]),
                  _f(r["effect_error"]), _f(r["nc_gap"]), _f(r["nc_z"], ".1f"), _f(r["nc_ctx"], ".4f"),
                  _f(r["train_s"], ".0f"))
    con.print(t)
    m = Table(title="mean over seeds")
    for col in ("world", "rollout", "k", "value err", "A−N err", "NC gap", "NC |z|", "train s"):
        m.add_column(col, justify="left" if col in ("world", "rollout") else "right")
    keys = sorted({(r["world"], r["rollout"], r["k"]) for r in rows}, key=lambda x: (x[0], ROLLOUTS.index(x[1]), x[2]))
    for w, ro, k in keys:
        sel = [r for r in rows if (r["world"], r["rollout"], r["k"]) == (w, ro, k)]

        def mean(f: str) -> float | None:
            v = [r[f] for r in sel if r[f] is not None]
            return float(np.mean(v)) if v else None
        m.add_row(w, ro, str(k), _f(mean("value_error")), _f(mean("effect_error")), _f(mean("nc_gap")),
                  _f(mean("nc_z"), ".1f"), _f(mean("train_s"), ".0f"))
    con.print(m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[0, 5], help="free_running_steps k of each variant")
    ap.add_argument("--discount", type=float, default=1.0, help="model.free_running_discount of every variant")
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12])
    ap.add_argument("--gamma", type=float, default=2.0, help="the tumour world's confounding strength")
    ap.add_argument("--patients", type=int, default=1000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=6, help="passes over the pooled tumour training rows")
    ap.add_argument("--samples", type=int, default=4, help="rollouts per entity in every simulation")
    ap.add_argument("--no-tumour", action="store_true")
    ap.add_argument("--dkt", action="store_true", help="also DKT-Synth (hidden confounder: a no-harm check)")
    ap.add_argument("--dkt-preset", default="default")
    ap.add_argument("--dkt-epochs", type=int, default=6)
    ap.add_argument("--model", type=json.loads, default={}, metavar="JSON", help="further model keys of every variant")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="one seed, 300 patients, 1 epoch, 2 rollouts; tiny DKT-Synth")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.patients, args.epochs, args.samples = args.seeds[:1], 300, 1, 2
        args.dkt_preset, args.dkt_epochs = "tiny", 1

    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    worlds = ([] if args.no_tumour else ["tumour"]) + (["dkt_synth"] if args.dkt else [])
    for w in worlds:
        for s in args.seeds:
            rows += run_world(w, s, args)
    machine = (f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · torch "
               f"{torch.__version__} · tumour γ={args.gamma:g} {args.patients} patients {args.days} days "
               f"{args.epochs} epochs · DKT-Synth {args.dkt_preset} {args.dkt_epochs} epochs · {args.samples} rollouts "
               f"· discount {args.discount:g} · wall {time.perf_counter() - t0:.0f} s · {' '.join(sys.argv)}")
    out = {"machine": machine, "params": vars(args), "rows": rows}
    if args.json:
        print(json.dumps(out, default=float))
        return
    print_table(out)


if __name__ == "__main__":
    main()

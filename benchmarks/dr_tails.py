"""Coverage of the doubly robust interval and of its unseen-mass bounds on DKT-Synth's logged data, with synthetic
models in place of a trained one (no training: seconds).

The doubly robust (DR) value of ``fcd_secure.queries.doubly_robust`` is the model's value plus its importance-weighted
error on the logged steps a policy could take; its interval is unbiased whatever the model, but with heavy-tailed
weights (DKT-Synth's tutor gives some items with probability 0.002) a typical sample lacks exactly the entities that
carry the correction. How badly that shows depends on the model used as the control variate: this script separates
the interval's calibration from the simulator's fidelity by replacing the simulator with

* ``truth``: each student's true per-step value under the policy (a perfect per-student model);
* ``truth+0.1``: the same, 0.1 too high everywhere;
* ``flat``: the population's true per-step mean for every student (right on average, no per-student signal — the
  shape of a simulator whose per-student effects have collapsed, docs/fidelity.md);
* ``flat+0.1`` / ``flat-0.1``: that, shifted.

For each model and policy (the paper's four) it draws ``--resamples`` cohorts of m test students and counts how often
the DR interval, and the DR interval widened by the unseen-mass bounds (``fcd_secure.evaluation.intervals
.unseen_mass_sums`` / ``unseen_bounds``), cover the cohort's true mean; median widths beside them. Nominal 90 %.

    .venv/bin/python benchmarks/dr_tails.py                          # default preset, 3 sites, horizon 2
    .venv/bin/python benchmarks/dr_tails.py --horizon 12 --json      # longer windows
    .venv/bin/python benchmarks/dr_tails.py --quick                  # tiny preset, cohorts of 25, 20 resamples
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np

#: model name -> (what it starts from, the shift added everywhere)
MODELS = {"truth": ("truth", 0.0), "truth+0.1": ("truth", 0.1), "flat": ("flat", 0.0), "flat+0.1": ("flat", 0.1),
          "flat-0.1": ("flat", -0.1)}


def logged(preset: str, sites: int, horizon: int) -> dict[str, dict[str, np.ndarray]]:
    """Per policy: the test students' logged Y, M, P, π(logged a), true per-step values and true window value."""
    from fcd_secure.data.dkt_synth.config import DKTSynthConfig
    from fcd_secure.data.dkt_synth.generation import generate
    from fcd_secure.data.policy import bind_policy, default_policies
    from fcd_secure.evaluation.ope import target_probs

    world = generate(DKTSynthConfig.from_preset(preset, n_sites=sites))
    out: dict[str, dict[str, list[np.ndarray]]] = {}
    for s in range(sites):
        sub = world.test[s]
        for pol in default_policies():
            pol = bind_policy(pol, sub)
            cum = np.stack([world.policy_values_per_student(pol, s, "test", horizon=h + 1).mean(0) * (h + 1)
                            for h in range(horizon)], axis=1)  # Σ_{t≤h} of the true per-step values (full windows)
            step = np.diff(np.concatenate([np.zeros((sub.n, 1)), cum], axis=1), axis=1)
            d = out.setdefault(pol.name, {})
            for k, v in (("Y", sub.Y[:, :horizon]), ("M", sub.M[:, :horizon]), ("P", sub.P[:, :horizon]),
                         ("pi", target_probs(pol, sub, world.anchors)[:, :horizon]), ("step", step),
                         ("truth", world.policy_values_per_student(pol, s, "test", horizon=horizon).mean(0))):
                d.setdefault(k, []).append(np.asarray(v, dtype=np.float64))
    return {n: {k: np.concatenate(v) for k, v in d.items()} for n, d in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--horizon", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 100, 300])
    ap.add_argument("--resamples", type=int, default=300)
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny preset, cohorts of 25, 20 resamples: checks the script")
    args = ap.parse_args()
    if args.quick:
        args.preset, args.sizes, args.resamples = "tiny", [25], 20

    from fcd_secure.evaluation.intervals import (
        interval_from_sums, reached_mass, site_sums, unseen_bounds, unseen_mass_sums,
    )
    from fcd_secure.evaluation.ope import PerDecisionDR

    data = logged(args.preset, args.sites, args.horizon)
    rng = np.random.default_rng(args.seed)
    rows = []
    for model, (start, shift) in MODELS.items():
        for name, d in data.items():
            step = d["step"] if start == "truth" else np.broadcast_to(
                np.nanmean(np.where(d["M"] > 0, d["step"], np.nan), axis=0), d["step"].shape)
            v_step = np.clip(np.where(d["M"] > 0, step + shift, 0.0), 0.0, 1.0)
            rtg = np.cumsum(v_step[:, ::-1], axis=1)[:, ::-1]  # the model's return-to-go under π
            est = PerDecisionDR()
            dr, _ = est.per_entity(d["Y"], d["M"], d["P"], d["pi"], q_hat=rtg, v_hat=rtg)
            w, scale = est.step_weights(d["Y"], d["M"], d["P"], d["pi"])
            N = len(dr)
            for m in args.sizes:
                if m > N:
                    continue
                hit = {"dr": 0, "bounded": 0}
                width = {"dr": [], "bounded": []}
                for _ in range(args.resamples):
                    idx = rng.choice(N, size=m, replace=False)
                    truth = float(d["truth"][idx].mean())
                    total = {**site_sums("q", dr[idx]), **unseen_mass_sums("q", w[idx], scale[idx], v_step[idx])}
                    iv = interval_from_sums(total, "q", args.level)
                    b = unseen_bounds(iv, total, "q")
                    hit["dr"] += iv.covers(truth)
                    hit["bounded"] += b["low"] <= truth <= b["high"]
                    width["dr"].append(iv.high - iv.low)
                    width["bounded"].append(b["high"] - b["low"])
                rows.append({"model": model, "policy": name, "m": m, "dr": hit["dr"] / args.resamples,
                             "bounded": hit["bounded"] / args.resamples,
                             "dr_width": float(np.median(width["dr"])), "bounded_width": float(np.median(width["bounded"])),
                             "dr_minus_truth": float(dr.mean() - d["truth"].mean()),
                             "weight_mass": [float(x) for x in reached_mass(w, scale)]})
    machine = f"{platform.node()} · {os.cpu_count()} CPUs · python {sys.version.split()[0]}"
    summary = {}
    for model in MODELS:
        for m in args.sizes:
            rs = [r for r in rows if r["model"] == model and r["m"] == m]
            if rs:
                summary[f"{model} m={m}"] = {k: (float(np.mean([r[k] for r in rs])), float(np.min([r[k] for r in rs])))
                                              for k in ("dr", "bounded")} | {
                    "dr_width": float(np.mean([r["dr_width"] for r in rs])),
                    "bounded_width": float(np.mean([r["bounded_width"] for r in rs]))}
    out = {"machine": machine, "params": vars(args), "rows": rows, "summary": summary}
    if args.json:
        print(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"DR interval coverage of the truth, DKT-Synth {args.preset}, {args.sites} sites, horizon "
                    f"{args.horizon}, nominal {args.level:.0%} (mean over the 4 policies, lowest in brackets)")
    for c in ("model", "m", "DR", "DR + unseen-mass bounds", "median width DR", "median width bounded"):
        t.add_column(c, justify="left" if c == "model" else "right")
    for key, v in summary.items():
        model, m = key.split(" m=")
        t.add_row(model, m, f"{v['dr'][0]:.1%} ({v['dr'][1]:.0%})", f"{v['bounded'][0]:.1%} ({v['bounded'][1]:.0%})",
                  f"{v['dr_width']:.3f}", f"{v['bounded_width']:.3f}")
    con.print(t)
    for r in rows:
        if r["m"] == args.sizes[0] and r["model"] == "flat":
            con.print(f"  {r['policy']}: mean weight per step (1 if the sample reached all of π) "
                      + ", ".join(f"{x:.2f}" for x in r["weight_mass"]))
    con.print(machine)


if __name__ == "__main__":
    main()

"""How far the logs' own sampling noise moves the identified one-step effect, with no trained model (seconds a world).

The one-step effect θ₁ of ``fcd_secure.queries.targeted`` is answered by augmented IPW with the simulator as outcome
model. Its error on a world has two parts: the outcome model's (which the 1/P correction removes on average) and the
noise of the logged actions and outcomes themselves, which no outcome model removes. This script measures the second
part alone, and whether the cluster-robust 90 % interval is calibrated, by giving the product's own estimator
(``one_step_sums`` → ``merge_one_step``, the sums a site sends and the server's merge) outcome models that need no
training, on fresh DKT-Synth worlds (each seed a new world, its own logging draws and test split):

* ``truth``: the oracle's P(Y_t | history, latents, do(a)) for both anchors: the floor; its error is the outcome
  noise weighted by 1/P, which is what the interval's SE estimates;
* ``truth+0.1``: the same with a_on's probability 0.1 too high everywhere (a confounded model: the AIPW correction
  must remove the shift);
* ``flat``: the test steps' mean outcome for both anchors (no model: the AIPW reduces to an IPW difference).

Per model it prints the coverage of the 90 % interval over the worlds (Wilson interval beside it), the mean and s.d. of
the error beside the mean SE (calibrated when they agree), the largest |z|, and on how many worlds |error| ≤ 0.05.
``--show`` prints the worlds whose oracle-model error is largest: a trained model's miss on such a world is the logs',
not the model's.

Measured (default preset: 10 sites, ~600 test students, ~13,500 test steps; seeds 0-39, 2 cores, 69 s):
``truth`` covers 36 of 40 (error s.d. 0.0151 against a mean SE of 0.0150), ``truth+0.1`` 35 of 40 (0.0163 / 0.0155),
``flat`` 35 of 40 (0.024 / 0.023). Seed 4 is the worst of the 40 worlds (z +3.0). The README run's worlds (seeds 0-4) with the true model miss by +0.001 / +0.001 / +0.002 /
−0.027 / +0.045: seeds 3 and 4, where ``fcd run``'s answer missed by −0.046 and +0.057, are worlds whose logs alone
move the answer 2-3 SE.

    .venv/bin/python benchmarks/onestep_noise.py                        # default preset, seeds 0-39
    .venv/bin/python benchmarks/onestep_noise.py --seeds 0-4 --show 5   # the README run's worlds
    .venv/bin/python benchmarks/onestep_noise.py --preset small --json
    .venv/bin/python benchmarks/onestep_noise.py --quick                # the tiny preset, seeds 0-1: checks the script
"""

from __future__ import annotations

import json
import time

import numpy as np
import typer
from _coverage import coverage_line
from _machine import machine
from rich.console import Console
from rich.table import Table
from targeted import oracle_pair, parse_seeds

#: the outcome models: name -> what it is (module docstring)
MODELS = ("truth", "truth+0.1", "flat")
LEVEL = 0.9


def one_world(preset: str, seed: int) -> dict[str, dict]:
    """The merged one-step answer of each model of :data:`MODELS` on a fresh world's test students (all sites)."""
    from fcd_secure.data.dkt_synth.config import DKTSynthConfig
    from fcd_secure.data.dkt_synth.generation import generate
    from fcd_secure.queries.targeted import merge_one_step, one_step_sums

    world = generate(DKTSynthConfig.from_preset(preset, seed=seed))
    tot: dict[str, dict[str, float]] = {m: {} for m in MODELS}
    for i, sub in enumerate(world.test):
        if sub.n == 0:
            continue
        mu_on, mu_off = oracle_pair(world, i, np.arange(sub.n), sub.L, world.anchors)
        flat = np.full(sub.Y.shape, float(sub.Y[sub.M > 0].mean()))
        pairs = {"truth": (mu_on, mu_off), "truth+0.1": (np.clip(mu_on + 0.1, 0.0, 1.0), mu_off), "flat": (flat, flat)}
        truth = mu_on - mu_off  # the oracle's one-step contrast (queries.targeted.one_step_truth)
        for m in MODELS:
            for k, v in one_step_sums(None, sub, world.anchors, truth, pairs[m]).items():
                tot[m][k] = tot[m].get(k, 0.0) + v
    out = {}
    for m in MODELS:
        o = merge_one_step(tot[m], LEVEL, True)
        out[m] = {k: o[k] for k in ("estimate", "low", "high", "se", "true", "clipped_share")}
    return out


def main(
    seeds: str = typer.Option("0-39", help="worlds: comma-separated seeds, or a range such as 0-39"),
    preset: str = typer.Option("default", help="the DKT-Synth data preset (default: the README run's world)"),
    show: int = typer.Option(0, help="also list this many worlds with the largest oracle-model |error|"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    quick: bool = typer.Option(False, help="the tiny preset, seeds 0-1: checks the script"),
) -> None:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)  # fair to a shared machine (benchmarks/README.md)
    if quick:
        seeds, preset = "0-1", "tiny"
    err = Console(stderr=True)
    seed_list = parse_seeds(seeds)
    t0 = time.perf_counter()
    worlds = []
    for s in seed_list:
        worlds.append({"seed": s, **one_world(preset, s)})
        err.print(f"world {s}: truth-model error {worlds[-1]['truth']['estimate'] - worlds[-1]['truth']['true']:+.3f}")
    out = {"machine": machine(), "params": {"seeds": seed_list, "preset": preset}, "wall_s": time.perf_counter() - t0,
           "worlds": worlds}
    if as_json:
        print(json.dumps(out, indent=1, default=float))
        return
    con = Console(width=140)  # the table is wider than a pipe's default 80 columns
    con.print(json.dumps(out["machine"]))
    t = Table(title=f"DKT-Synth {preset}: one-step AIPW over {len(worlds)} fresh worlds, nominal {LEVEL:.0%}")
    for c in ("outcome model", "interval covers", "mean error", "s.d. error", "mean SE", "largest |z|", "|error| ≤ 0.05"):
        t.add_column(c, justify="right")
    for m in MODELS:
        e = np.array([w[m]["estimate"] - w[m]["true"] for w in worlds])
        se = np.array([w[m]["se"] for w in worlds])
        hits = [w[m]["low"] <= w[m]["true"] <= w[m]["high"] for w in worlds]
        t.add_row(m, coverage_line(hits, LEVEL), f"{e.mean():+.4f}", f"{e.std(ddof=1) if len(e) > 1 else 0:.4f}",
                  f"{se.mean():.4f}", f"{np.max(np.abs(e / se)):.1f}", f"{int((np.abs(e) <= 0.05).sum())} of {len(e)}")
    con.print(t)
    if show:
        worst = sorted(worlds, key=lambda w: -abs(w["truth"]["estimate"] - w["truth"]["true"]))[:show]
        con.print("largest errors with the true outcome model (the logs' own noise): " + "; ".join(
            f"seed {w['seed']} {w['truth']['estimate'] - w['truth']['true']:+.3f} "
            f"(z {(w['truth']['estimate'] - w['truth']['true']) / w['truth']['se']:+.1f})" for w in worst))
    con.print(f"wall {out['wall_s']:.0f} s")


if __name__ == "__main__":
    typer.run(main)

"""Sampler benchmark: rollouts per second and PEHE for ancestral DDPM vs few-step DDIM, side by side.

One Fed-CausalDiff is trained centrally on DKT-Synth (the centralised reference of ``fcd_secure.experiments``:
same epoch and seed rules as ``fcd train``), then the same effect query (always-a_on minus
always-a_off from the anchor step over the horizon, every test trajectory, ``--samples`` futures each) is answered
with each sampler setting. A "rollout" is one simulated future of one trajectory over the whole horizon.

    .venv/bin/python benchmarks/sampler.py                 # DKT-Synth default, rich table
    .venv/bin/python benchmarks/sampler.py --quick --json  # tiny preset, one JSON object
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _machine import machine  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

err = Console(stderr=True)


def main(
    quick: bool = typer.Option(False, "--quick", help="Tiny preset, 1 epoch, few steps: checks the script runs."),
    seed: int = typer.Option(0, "--seed"),
    epochs: int = typer.Option(0, "--epochs", help="Training epochs (0: the centralised reference's matched epochs)."),
    samples: int = typer.Option(8, "--samples", min=1, help="Futures per test trajectory."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed repeats per setting (median reported)."),
    ddim_steps: str = typer.Option("1,2,5,10,25", "--ddim-steps", help="Comma-separated DDIM step counts."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout; progress on stderr."),
) -> None:
    torch.set_num_threads(1)
    from fcd_secure.config import build_config
    from fcd_secure.data.schema import concat
    from fcd_secure.evaluation.metrics import ate_error, pehe
    from fcd_secure.experiments.centralised import matched_epochs, train_centralised
    from fcd_secure.federation import learner
    from fcd_secure.model.baselines import FedCausalDiffSimulator

    preset = "tiny" if quick else "default"
    run_cfg = build_config(preset, {"seed": seed})
    n_ep = epochs or (1 if quick else matched_epochs(run_cfg))
    cfg = learner.model_config(run_cfg)
    steps = [int(s) for s in ddim_steps.split(",") if s.strip()]
    steps = [s for s in steps if 1 <= s <= cfg.diffusion_steps]
    fd = learner.load_federated(run_cfg)
    w = fd.oracle
    train, test = concat(list(fd.train)), concat(list(fd.test))
    err.print(f"[dim]training Fed-CausalDiff on DKT-Synth {preset} ({train.n} trajectories, {n_ep} epochs)[/]")
    sim, _ = train_centralised(FedCausalDiffSimulator, run_cfg, n_ep)
    tau = w.true_effects(None, "test")
    settings = [("ddpm", cfg.diffusion_steps)] + [("ddim", s) for s in steps]
    results = []
    for sampler, n_steps in settings:
        kw = dict(sampler=sampler, steps=n_steps)
        sim.estimate_effects(test.subset(np.arange(min(8, test.n))), w.anchors, w.anchor_step, w.horizon, 1, seed, **kw)
        times, eff = [], None
        for _ in range(1 if sampler == "ddpm" and not quick else repeats):
            t0 = time.perf_counter()
            eff = sim.estimate_effects(test, w.anchors, w.anchor_step, w.horizon, samples, seed, **kw)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        rollouts = 2 * test.n * samples  # two arms
        results.append({
            "sampler": sampler, "steps": n_steps, "seconds": med, "seconds_min": min(times), "seconds_max": max(times),
            "rollouts_per_second": rollouts / med, "pehe": pehe(eff, tau), "ate_error": ate_error(eff, tau),
        })
        err.print(f"[dim]{sampler} {n_steps}: {rollouts / med:.0f} rollouts/s, PEHE {results[-1]['pehe']:.4f}[/]")
    params = {"preset": preset, "seed": seed, "epochs": n_ep, "samples": samples, "n_test": test.n,
              "horizon": int(w.horizon), "diffusion_steps": cfg.diffusion_steps, "repeats": repeats}
    if as_json:
        print(json.dumps({"machine": machine(), "params": params, "results": results}))
        return
    out = Console()
    out.print(f"[dim]machine: {machine()}[/]")
    t = Table(title=f"Do-simulation samplers on DKT-Synth {preset} ({test.n} test trajectories × {samples} futures × 2 arms, "
                    f"horizon {w.horizon})")
    for c in ("sampler", "steps / transition", "seconds (median)", "rollouts / second", "PEHE", "|ATE err|"):
        t.add_column(c, justify="left" if c == "sampler" else "right")
    for r in results:
        t.add_row(r["sampler"], str(r["steps"]), f"{r['seconds']:.2f}", f"{r['rollouts_per_second']:.0f}",
                  f"{r['pehe']:.4f}", f"{r['ate_error']:.4f}")
    out.print(t)


if __name__ == "__main__":
    typer.run(main)

"""Per-entity one-step effects on DKT-Synth: the federated DR-learner beside the simulator's own contrast (issue 29
item 4; ``fcd_secure.queries.dr_learner``).

Each seed is one federated run as ``fcd run`` makes it (secure aggregation, the real ServerApp and ClientApps on the
in-process engine, the truth-free round selection); the DR-learner is fitted on the sites' validation pseudo-outcomes
of the chosen round and scored on their test steps against the oracle's one-step truth. Printed side by side per seed:
corr(τ̂, τ), the skill against the constant true ATE (1 − PEHE²/sd²τ), PEHE, sd τ, PEHE₀, the mean effect and δ,
the shift of the intercept re-fitted on the validation and test rows' pseudo-outcomes together.

    .venv/bin/python benchmarks/dr_learner.py                     # DKT-Synth small, 4 sites, 8 rounds, seeds 0-2
    .venv/bin/python benchmarks/dr_learner.py --data-preset default --sites 10 --rounds 10
    .venv/bin/python benchmarks/dr_learner.py --quick --json   # tiny world, 1 round, seed 0: checks the script
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _machine import machine  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

err = Console(stderr=True)


def one_seed(seed: int, data_preset: str, rounds: int, sites: int, run_preset: str, test_fraction: float = 0.2,
             validation_fraction: float = 0.2) -> dict:
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    tmp = Path(tempfile.mkdtemp(prefix="fcd-drl-"))
    data = {"dataset": "dkt-synth", "preset": data_preset, "n_sites": sites, "alpha": 1000.0,
            "test_fraction": test_fraction, "validation_fraction": validation_fraction}
    cfg = build_config(run_preset, {"seed": seed, "data": data,
                                    "federation": {"clients_per_round": sites, "rounds": rounds, "eval_every": 2},
                                    "state_dir": str(tmp / "state"), "out": str(tmp / "run")})
    t0 = time.perf_counter()
    res = run_inprocess(cfg)
    d = res.final_eval.get("dr_learner") or {}
    return {"seed": seed, "wall_s": time.perf_counter() - t0, "secure": cfg.federation.secure_aggregation,
            "round": d.get("round"), "lambda": d.get("lambda"), "n_fit": d.get("n"), "coverage": d.get("coverage"),
            "steps": d.get("steps"), "dr_learner": d.get("dr_learner"), "simulator": d.get("simulator"),
            "intercept": d.get("intercept")}


def main(
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
    data_preset: str = typer.Option("small", help="the DKT-Synth preset"),
    run_preset: str = typer.Option("tiny", help="the run preset (model size)"),
    rounds: int = typer.Option(8, help="rounds per run"),
    sites: int = typer.Option(4, help="sites"),
    quick: bool = typer.Option(False, help="seed 0, 1 round, the tiny world (test fraction 0.4 and validation "
                               "fraction 0.5, so that each site's test and validation rows reach the cohort floor of "
                               "20): checks the script"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    torch.set_num_threads(1)
    seed_list = [int(s) for s in seeds.split(",")]
    test_fraction, validation_fraction = 0.2, 0.2
    if quick:  # the same run, fit and scores on a fifth of the rows and one round (the last round is always scored)
        seed_list, rounds, data_preset = seed_list[:1], 1, "tiny"
        test_fraction, validation_fraction = 0.4, 0.5
    results = []
    for seed in seed_list:
        err.print(f"DKT-Synth {data_preset} seed {seed}: {rounds} rounds, {sites} sites …")
        results.append(one_seed(seed, data_preset, rounds, sites, run_preset, test_fraction, validation_fraction))
    out = {"machine": machine(), "params": {"seeds": seed_list, "data_preset": data_preset, "run_preset": run_preset,
                                            "rounds": rounds, "sites": sites, "test_fraction": test_fraction,
                                            "validation_fraction": validation_fraction}, "results": results}
    if as_json:
        print(json.dumps(out, indent=1, default=float))
        return
    con = Console(width=160)  # 14 columns side by side, also when piped
    con.print(json.dumps(out["machine"]))
    t = Table(title="DKT-Synth: one-step effect per decision step, DR-learner (DR) vs the simulator's contrast (sim)")
    for c in ("seed", "corr DR", "corr sim", "skill DR", "skill sim", "PEHE DR", "PEHE sim", "sd τ", "PEHE₀",
              "mean τ̂ DR", "mean τ", "δ", "λ", "round"):
        t.add_column(c, justify="right")
    ok = [r for r in results if r["dr_learner"] and r["simulator"] and "corr" in r["dr_learner"]]
    for r in ok:
        a, b = r["dr_learner"], r["simulator"]
        t.add_row(str(r["seed"]), f"{a['corr']:+.3f}", f"{b['corr']:+.3f}", f"{a['skill']:+.3f}", f"{b['skill']:+.3f}",
                  f"{a['pehe']:.4f}", f"{b['pehe']:.4f}", f"{a['sd_tau']:.4f}", f"{a['pehe_zero']:.4f}",
                  f"{a['mean_tau_hat']:+.4f}", f"{a['mean_tau']:+.4f}",
                  f"{(r.get('intercept') or {}).get('shift', float('nan')):+.4f}", f"{r['lambda']:g}", str(r["round"]))
    con.print(t)
    if ok:
        con.print("mean over seeds: " + ", ".join(
            f"{k} DR {np.mean([r['dr_learner'][k] for r in ok]):+.3f} / "
            f"sim {np.mean([r['simulator'][k] for r in ok]):+.3f}"
            for k in ("corr", "skill")) + " (targets: corr ≥ 0.3, skill > 0)")
    for r in results:
        if r not in ok:
            con.print(f"seed {r['seed']}: DR-learner {r['coverage']} (no figures against the truth)")


if __name__ == "__main__":
    typer.run(main)

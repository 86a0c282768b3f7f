"""Incremental propensity interventions on DKT-Synth: how many steps the logs support them, against the deterministic
Always policy (issue 29 item 5; ``fcd_secure.queries.incremental``).

Each seed is one federated run as ``fcd run`` makes it (secure aggregation, the real ServerApp and ClientApps on the
in-process engine), asked at its end about Always and the incremental policies "multiply the odds of anchor:on by δ"
for δ ∈ {0.5, 2, 5}. For every policy and horizon h of the identified path (``queries.targeted``) it prints the
effective sample size of the weight products (supported when ≥ 20) and the doubly robust value over the first h
steps beside the oracle's truth (the oracle rolls the incremental policy out on the tutor's *true* item
probabilities; the sites weigh with the logged propensity where a_t = a_on and their own propensity model elsewhere).

    .venv/bin/python benchmarks/incremental.py                      # DKT-Synth tiny and small, seed 0
    .venv/bin/python benchmarks/incremental.py --presets small --seeds 0,1,2
    .venv/bin/python benchmarks/incremental.py --quick --json
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
DELTAS = (0.5, 1.0, 2.0, 5.0)
#: δ = 1 is the logging policy itself: the reference of the effects (its DR value is the observed mean, so an
#: effect against it cancels the test sample's own luck, which every policy's value shares)
REFERENCE = "incremental_x1"


def policy_files(folder: Path) -> list[str]:
    out = []
    for d in DELTAS:
        name = f"incremental_x{d:g}".replace(".", "_")  # δ = 1: incremental_x1
        f = folder / f"{name}.toml"
        f.write_text(f'name = "{name}"\n[rule]\nkind = "incremental"\ndelta = {d}\naction = "anchor:on"\n')
        out.append(str(f))
    return out


def one_run(seed: int, data_preset: str, rounds: int, sites: int) -> dict:
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    tmp = Path(tempfile.mkdtemp(prefix="fcd-incremental-"))
    data = {"dataset": "dkt-synth", "preset": data_preset, "n_sites": sites, "alpha": 1000.0}
    if data_preset != "tiny":  # tiny keeps its 60 % test share: 20 % of 75 students is below a site's cohort floor
        data["test_fraction"] = 0.2
    cfg = build_config("tiny", {"seed": seed, "data": data,
                                "federation": {"clients_per_round": sites, "rounds": rounds, "eval_every": 2},
                                "evaluation": {"policies": ["always", *policy_files(tmp)], "reference": REFERENCE},
                                "state_dir": str(tmp / "state"), "out": str(tmp / "run")})
    t0 = time.perf_counter()
    res = run_inprocess(cfg)
    rows = {}
    for name, d in (res.final_eval.get("policies") or {}).items():
        ident = d.get("identified") or {}
        rows[name] = {"horizons": ident.get("horizons", []), "pi_k": ident.get("pi_k"),
                      "answer_h": (ident.get("answer") or {}).get("horizon"), "effect": ident.get("effect")}
    return {"seed": seed, "preset": data_preset, "secure_aggregation": cfg.federation.secure_aggregation,
            "wall_s": time.perf_counter() - t0, "policies": rows}


def main(
    seeds: str = typer.Option("0", help="comma-separated seeds"),
    presets: str = typer.Option("tiny,small", help="DKT-Synth presets"),
    rounds: int = typer.Option(8, help="rounds per run"),
    sites: int = typer.Option(4, help="sites"),
    quick: bool = typer.Option(False, help="tiny, seed 0, 2 rounds: checks the script"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    torch.set_num_threads(1)
    if quick:
        seeds, presets, rounds = seeds.split(",")[0], "tiny", 2
    results = []
    for preset in presets.split(","):
        for seed in (int(s) for s in seeds.split(",")):
            err.print(f"dkt-synth {preset} seed {seed}: {rounds} rounds, {sites} sites …")
            results.append(one_run(seed, preset, rounds, sites))
    out = {"machine": machine(), "params": {"seeds": seeds, "presets": presets, "rounds": rounds, "sites": sites,
                                            "deltas": DELTAS}, "results": results}
    if as_json:
        print(json.dumps(out, indent=1, default=float))
        return
    con = Console()
    con.print(json.dumps(out["machine"]))
    for r in results:
        hs = sorted({h["horizon"] for p in r["policies"].values() for h in p["horizons"]})
        t = Table(title=f"DKT-Synth {r['preset']}, seed {r['seed']} ({r['wall_s']:.0f} s): ESS of the weight "
                        "products per horizon (* supported: ≥ 20)")
        t.add_column("policy")
        for h in hs:
            t.add_column(f"h={h}", justify="right")
        for name, p in r["policies"].items():
            by = {h["horizon"]: h for h in p["horizons"]}
            t.add_row(name, *(f"{by[h]['ess']:.0f}" + ("*" if by[h]["supported"] else "") if h in by else ""
                              for h in hs))
        con.print(t)
        t = Table(title="doubly robust value over the first h steps [90 % CI] / oracle truth")
        t.add_column("policy")
        for h in hs:
            t.add_column(f"h={h}", justify="right")
        for name, p in r["policies"].items():
            by = {h["horizon"]: h for h in p["horizons"]}
            t.add_row(name, *(f"{by[h]['estimate']:.3f} [{by[h]['low']:.2f},{by[h]['high']:.2f}] / "
                              f"{by[h].get('true', float('nan')):.3f}" if h in by else "" for h in hs))
        con.print(t)
        t = Table(title=f"effect vs {REFERENCE} (the logging policy) on the longest horizon both pass")
        for c in ("policy", "h", "DR effect", "90 % CI", "truth", "covers"):
            t.add_column(c, justify="left" if c == "policy" else "right")
        for name, p in r["policies"].items():
            e = p.get("effect")
            if name != REFERENCE:
                t.add_row(name, *((str(e["horizon"]), f"{e['estimate']:+.3f}", f"[{e['low']:+.3f}, {e['high']:+.3f}]",
                                   f"{e['true']:+.3f}", "yes" if e["low"] <= e["true"] <= e["high"] else "no")
                                  if e and e.get("true") is not None else ("–", "not identified", "", "", "")))
        con.print(t)
    effs = [p["effect"] for r in results for n, p in r["policies"].items()
            if n.startswith("incremental") and n != REFERENCE and p.get("effect") and p["effect"].get("true") is not None]
    if effs:
        con.print(f"incremental effects vs the logging policy, all runs: {len(effs)}; mean |DR − truth| "
                  f"{np.mean([abs(e['estimate'] - e['true']) for e in effs]):.3f}, 90 % coverage "
                  f"{np.mean([e['low'] <= e['true'] <= e['high'] for e in effs]):.0%}")


if __name__ == "__main__":
    typer.run(main)

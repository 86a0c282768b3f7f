"""Stochastic policies on DKT-Synth: how many steps the logs support them, against the deterministic Always policy,
and whether their doubly robust values and effects cover the truth (issue 29 item 5;
``fcd_secure.queries.incremental``).

Each seed is one federated run as ``fcd run`` makes it (secure aggregation, the real ServerApp and ClientApps on the
in-process engine), asked at its end about Always, the incremental policies "multiply the odds of anchor:on by δ"
for δ ∈ {0.5, 2, 5} (``--deltas``) and the share policies "give anchor:on at a share s of the steps" for
s ∈ {0.1, 0.25, 0.5} (``--shares``). For every policy and horizon h of the identified path (``queries.targeted``) it
prints the effective sample size of the weight products (supported when ≥ 20), the doubly robust value over the first
h steps beside the oracle's truth (the oracle rolls the policy out on the tutor's *true* item probabilities) and the
effect against δ = 1, the logging policy (which is also share 0), on every horizon both pass. The sites weigh an
incremental policy with the logged propensity where a_t = a_on and their own propensity model elsewhere; a share
policy with the logged propensity of the logged action alone. The last lines pool |DR − truth| and the 90 % coverage
of values and effects per family over all runs.

    .venv/bin/python benchmarks/incremental.py                      # DKT-Synth tiny and small, seed 0
    .venv/bin/python benchmarks/incremental.py --presets small --seeds 0,1,2
    .venv/bin/python benchmarks/incremental.py --quick --json > out.json
    .venv/bin/python benchmarks/incremental.py --replay out.json   # the tables of a saved run
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
SHARES = (0.1, 0.25, 0.5)
#: a horizon whose entities' mean weight product is at least this reached most of the policy's distribution
REACHED = 0.9
#: δ = 1 is the logging policy itself: the reference of the effects (its DR value is the observed mean, so an
#: effect against it cancels the test sample's own luck, which every policy's value shares)
REFERENCE = "incremental_x1"


def policy_files(folder: Path, deltas: tuple[float, ...], shares: tuple[float, ...]) -> list[str]:
    out = []
    for kind, field, values in (("incremental", "delta", deltas), ("share", "share", shares)):
        for v in values:
            name = (f"incremental_x{v:g}" if kind == "incremental" else f"share_{v:g}").replace(".", "_")
            f = folder / f"{name}.toml"
            f.write_text(f'name = "{name}"\n[rule]\nkind = "{kind}"\n{field} = {v}\naction = "anchor:on"\n')
            out.append(str(f))
    return out


def family(name: str) -> str | None:
    """The benchmark's families of policies (None: Always and the reference)."""
    if name == REFERENCE or name == "always":
        return None
    return "odds (δ)" if name.startswith("incremental") else "share (s)"


def one_run(seed: int, data_preset: str, rounds: int, sites: int, deltas: tuple[float, ...],
            shares: tuple[float, ...]) -> dict:
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    tmp = Path(tempfile.mkdtemp(prefix="fcd-incremental-"))
    data = {"dataset": "dkt-synth", "preset": data_preset, "n_sites": sites, "alpha": 1000.0}
    if data_preset != "tiny":  # tiny keeps its 60 % test share: 20 % of 75 students is below a site's cohort floor
        data["test_fraction"] = 0.2
    cfg = build_config("tiny", {"seed": seed, "data": data,
                                "federation": {"clients_per_round": sites, "rounds": rounds, "eval_every": 2},
                                "evaluation": {"policies": ["always", *policy_files(tmp, deltas, shares)],
                                               "reference": REFERENCE},
                                "state_dir": str(tmp / "state"), "out": str(tmp / "run")})
    t0 = time.perf_counter()
    res = run_inprocess(cfg)
    rows = {}
    for name, d in (res.final_eval.get("policies") or {}).items():
        ident = d.get("identified") or {}
        rows[name] = {"horizons": ident.get("horizons", []), "pi_k": ident.get("pi_k"),
                      "answer_h": (ident.get("answer") or {}).get("horizon"), "effect": ident.get("effect"),
                      "effect_horizons": ident.get("effect_horizons", [])}
    return {"seed": seed, "preset": data_preset, "secure_aggregation": cfg.federation.secure_aggregation,
            "wall_s": time.perf_counter() - t0, "policies": rows}


def main(
    seeds: str = typer.Option("0", help="comma-separated seeds"),
    presets: str = typer.Option("tiny,small", help="DKT-Synth presets"),
    rounds: int = typer.Option(8, help="rounds per run"),
    sites: int = typer.Option(4, help="sites"),
    deltas: str = typer.Option(",".join(f"{d:g}" for d in DELTAS), help="odds multipliers δ (1 is added: the "
                               "reference)"),
    shares: str = typer.Option(",".join(f"{s:g}" for s in SHARES), help="shares s of the share policies ('' for none)"),
    quick: bool = typer.Option(False, help="tiny, seed 0, 2 rounds, δ = 2 and s = 0.1: checks the script"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    replay: str = typer.Option("", help="print the tables of a --json output file instead of running"),
) -> None:
    if replay:
        show(json.loads(Path(replay).read_text()))
        return
    torch.set_num_threads(1)
    if quick:  # one policy of each family beside Always and the reference
        seeds, presets, rounds, deltas, shares = seeds.split(",")[0], "tiny", 2, "2", "0.1"
    ds = tuple(sorted({1.0, *(float(d) for d in deltas.split(",") if d)}))
    ss = tuple(float(s) for s in shares.split(",") if s)
    results = []
    for preset in presets.split(","):
        for seed in (int(s) for s in seeds.split(",")):
            err.print(f"dkt-synth {preset} seed {seed}: {rounds} rounds, {sites} sites …")
            results.append(one_run(seed, preset, rounds, sites, ds, ss))
    out = {"machine": machine(), "params": {"seeds": seeds, "presets": presets, "rounds": rounds, "sites": sites,
                                            "deltas": ds, "shares": ss}, "results": results,
           "pooled": pooled(results)}
    if as_json:
        print(json.dumps(out, indent=1, default=float))
        return
    show(out)


def show(out: dict) -> None:
    """The tables of one benchmark output (a fresh run's or a ``--json`` file's)."""
    results = out["results"]
    con = Console()
    con.print(json.dumps(out["machine"]))
    for r in results:
        hs = sorted({h["horizon"] for p in r["policies"].values() for h in p["horizons"]})
        t = Table(title=f"DKT-Synth {r['preset']}, seed {r['seed']} ({r['wall_s']:.0f} s): ESS of the weight "
                        "products per horizon (* supported: ≥ 20) and their mean Σw/n (expected 1)")
        t.add_column("policy")
        for h in hs:
            t.add_column(f"h={h}", justify="right")
        for name, p in r["policies"].items():
            by = {h["horizon"]: h for h in p["horizons"]}
            t.add_row(name, *(f"{by[h]['ess']:.0f}" + ("*" if by[h]["supported"] else "")
                              + (f" ({by[h]['weight_mean']:.2f})" if by[h].get("weight_mean") is not None else "")
                              if h in by else "" for h in hs))
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
        t = Table(title=f"effect vs {REFERENCE} (the logging policy) on each horizon both pass: DR [90 % CI] / truth")
        t.add_column("policy")
        for h in hs:
            t.add_column(f"h={h}", justify="right")
        for name, p in r["policies"].items():
            if name == REFERENCE:
                continue
            by = {e["horizon"]: e for e in p.get("effect_horizons") or [] if e.get("true") is not None}
            miss = {h: "" if e["low"] <= e["true"] <= e["high"] else " ✗" for h, e in by.items()}
            t.add_row(name, *(f"{by[h]['estimate']:+.3f} [{by[h]['low']:+.2f},{by[h]['high']:+.2f}] / "
                              f"{by[h]['true']:+.3f}{miss[h]}" if h in by else "" for h in hs))
        con.print(t)
    summary = out.get("pooled") or pooled(results)
    t = Table(title="all runs, per family: identified values and effects vs the logging policy (δ = 1 ≡ share 0)")
    for c in ("family", "values", "mean |DR − truth|", "90 % coverage", "effects", "mean |DR − truth| ",
              "90 % coverage ", "mean ESS at the longest h"):
        t.add_column(c, justify="left" if c == "family" else "right")
    for fam, d in summary.items():
        t.add_row(fam, str(d["values"]), f"{d['value_err']:.3f}", f"{d['value_cover']}/{d['values']}",
                  str(d["effects"]), f"{d['effect_err']:.3f}", f"{d['effect_cover']}/{d['effects']}",
                  f"{d['ess_last']:.0f} (h={d['h_last']})")
    con.print(t)


def pooled(results: list[dict]) -> dict[str, dict]:
    """Per family, over every run, policy and supported horizon with a truth: how many values and effects, their
    mean |DR − truth|, how many 90 % intervals cover, and the mean ESS on the longest horizon estimated; then the same
    over the horizons whose mean weight product Σw/n (expected 1) is at least :data:`REACHED`, where the sample
    reached most of the policy's distribution (``queries.targeted._weight_mean``)."""
    out: dict[str, dict] = {}
    for fam in ("odds (δ)", "share (s)"):
        for label, keep in ((fam, lambda wm: True),
                            (f"{fam}, Σw/n ≥ {REACHED:g}", lambda wm: wm is not None and wm >= REACHED)):
            vals, effs, last = [], [], []
            for r in results:
                for n, p in r["policies"].items():
                    if family(n) != fam:
                        continue
                    by = {h["horizon"]: h for h in p["horizons"]}
                    vals += [h for h in p["horizons"] if h["supported"] and h.get("true") is not None
                             and keep(h.get("weight_mean"))]
                    effs += [e for e in p.get("effect_horizons") or [] if e.get("true") is not None
                             and keep(by.get(e["horizon"], {}).get("weight_mean"))]
                    if p["horizons"]:
                        last.append(max(p["horizons"], key=lambda h: h["horizon"]))
            if not vals:
                continue
            out[label] = {
                "values": len(vals), "value_err": float(np.mean([abs(h["estimate"] - h["true"]) for h in vals])),
                "value_cover": int(sum(h["low"] <= h["true"] <= h["high"] for h in vals)), "effects": len(effs),
                "effect_err": float(np.mean([abs(e["estimate"] - e["true"]) for e in effs])) if effs else float("nan"),
                "effect_cover": int(sum(e["low"] <= e["true"] <= e["high"] for e in effs)),
                "ess_last": float(np.mean([h["ess"] for h in last])), "h_last": max(h["horizon"] for h in last)}
    return out


if __name__ == "__main__":
    typer.run(main)

"""Targeted answers on DKT-Synth and the tumour world: what the logs identify, doubly robust, beside the simulator's own
number and the naive contrast (issue 29 item 3; ``fcd_secure.queries.targeted``).

Each seed is one federated run as ``fcd run`` makes it (secure aggregation, the real ServerApp and ClientApps on the
in-process engine, the truth-free round selection), and its final evaluation is read as the server has it:

* the one-step effect of a_on vs a_off at every decision step: the AIPW estimate with its 90 % interval, the
  simulator's own contrast, the naive contrast (mean outcome after a_on minus after a_off on the same test steps),
  the same AIPW with the oracle's outcome probabilities as μ (the logs' own sampling noise: the floor no outcome
  model gets under, so a seed's miss can be told apart from the model's) and the oracle's truth;
* each policy's identified value (its longest supported horizon) and effect: the absolute error against the oracle's
  value over the same steps and whether the 90 % interval covers it (pooled over policies and seeds: a coverage
  estimate), beside the simulator's whole-trajectory extrapolation error.

    .venv/bin/python benchmarks/targeted.py                    # DKT-Synth small, 4 sites, 8 rounds, seeds 0-2
    .venv/bin/python benchmarks/targeted.py --dataset tumour --gamma 4
    .venv/bin/python benchmarks/targeted.py --quick --json
    .venv/bin/python benchmarks/targeted.py --seeds 0-19 --workers 8   # coverage over 20 independent worlds

Coverage needs many independent trials: each seed is a new world, a new split and a new run, so ``--seeds 0-19``
gives 20 independent one-step intervals (3 seeds say little: 2 of 3 is within the noise of a 90 % interval).
``--workers`` runs seeds in parallel processes (one torch thread each); ``--run-preset default`` trains the model
of the README's run (its rounds unless ``--rounds`` is given).
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _coverage import coverage_line  # noqa: E402
from _machine import machine  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

err = Console(stderr=True)


def naive_contrast(cfg) -> float:
    """Mean outcome at the test steps logged with a_on minus those logged with a_off, over every site."""
    from fcd_secure.federation import learner

    on, off = [], []
    for i in range(cfg.data.n_sites):
        d = learner.load_site_data(cfg, i)
        a_off, a_on = d.anchors
        v = d.test.M > 0
        on.append(d.test.Y[v & (d.test.T == a_on)])
        off.append(d.test.Y[v & (d.test.T == a_off)])
    return float(np.concatenate(on).mean() - np.concatenate(off).mean())


def oracle_pair(oracle, site: int, rows: np.ndarray, L: int, anchors: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's P(Y_t | history, latents, do(a_on / a_off)) at every test step of ``rows``, ``[n, L]`` each (NaN on
    padding): the true outcome model, whose difference is ``queries.targeted.one_step_truth``."""
    a_off, a_on = anchors
    return tuple(np.stack([oracle.outcome_probs_do(site, "test", rows, t, a) for t in range(L)], 1)
                 for a in (a_on, a_off))


def oracle_aipw(cfg) -> dict | None:
    """The same one-step AIPW on the same test steps and logged propensities with the oracle's own outcome
    probabilities as μ (``queries.targeted.one_step_sums`` with ``pair`` given): what the logs' sampling noise alone
    leaves, the floor no outcome model gets under. Its error is the martingale noise of the outcomes weighted by 1/P,
    so the product's error can be read against it world by world (measured on 40 default worlds, seeds 0-39: error
    s.d. 0.0151 against a mean SE of 0.0150, the 90 % interval covers 36 of 40)."""
    from fcd_secure.federation import learner
    from fcd_secure.queries.targeted import merge_one_step, one_step_sums

    tot: dict[str, float] = {}
    for i in range(cfg.data.n_sites):
        d = learner.load_site_data(cfg, i)
        if d.oracle is None or d.test.P is None or d.test.n == 0:
            return None
        mu_on, mu_off = oracle_pair(d.oracle, d.site_index, np.arange(d.test.n), d.test.L, d.anchors)
        for k, v in one_step_sums(None, d.test, d.anchors, mu_on - mu_off, (mu_on, mu_off)).items():
            tot[k] = tot.get(k, 0.0) + v
    o = merge_one_step(tot, 0.9, True)
    return None if o is None else {k: o[k] for k in ("estimate", "low", "high", "se", "true")}


def one_seed(seed: int, dataset: str, data_preset: str, rounds: int | None, sites: int, gamma: float | None,
             run_preset: str = "tiny") -> dict:
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    torch.set_num_threads(1)

    tmp = Path(tempfile.mkdtemp(prefix="fcd-targeted-"))
    data = {"dataset": dataset, "preset": data_preset, "n_sites": sites, "alpha": 1000.0, "test_fraction": 0.2}
    if gamma is not None:
        data["gamma"] = gamma
    fed = {"clients_per_round": sites} | ({"rounds": rounds, "eval_every": 2} if rounds else {})
    cfg = build_config(run_preset, {"seed": seed, "data": data, "federation": fed,
                                    "state_dir": str(tmp / "state"), "out": str(tmp / "run")})
    t0 = time.perf_counter()
    res = run_inprocess(cfg)
    fe = res.final_eval
    o = fe.get("one_step_effect") or {}
    rows = {"seed": seed, "wall_s": time.perf_counter() - t0, "selected_round": res.extra["selection"]["round"],
            "onestep_dr": o.get("estimate"), "onestep_low": o.get("low"), "onestep_high": o.get("high"),
            "onestep_model": o.get("model"), "onestep_true": o.get("true"), "onestep_naive": naive_contrast(cfg),
            "onestep_variant": o.get("variant"), "onestep_aipw": o.get("aipw"), "onestep_sn": o.get("self_normalised"),
            "onestep_oracle_mu": oracle_aipw(cfg)}
    vals, effs = [], []
    for name, d in (fe.get("policies") or {}).items():
        ident = d.get("identified") or {}
        a = ident.get("answer")
        if a and a.get("true") is not None:
            vals.append({"policy": name, "h": a["horizon"], "err": abs(a["estimate"] - a["true"]),
                         "covered": a["low"] <= a["true"] <= a["high"],
                         "sim_err_whole": abs(d["value_sim"] - d["value_true"]) if d.get("value_true") is not None else None})
        e = ident.get("effect")
        if e and e.get("true") is not None and e["se"] > 0:
            effs.append({"policy": name, "h": e["horizon"], "err": abs(e["estimate"] - e["true"]),
                         "covered": e["low"] <= e["true"] <= e["high"]})
    rows["values"], rows["effects"] = vals, effs
    # every horizon of every policy, supported or not (to judge a support rule against the truth)
    rows["horizons"] = {name: [{k: r.get(k) for k in ("horizon", "ess", "supported", "weight_mean", "weight_se",
                                                     "estimate", "low", "high", "true")}
                               for r in (d.get("identified") or {}).get("horizons", [])]
                        for name, d in (fe.get("policies") or {}).items()}
    drl = fe.get("dr_learner") or {}  # per-entity one-step effects (queries.dr_learner): skill against the truth
    rows["dr_learner"] = {k: {f: (drl.get(k) or {}).get(f) for f in ("corr", "skill", "sd_tau", "heldout")}
                          for k in ("dr_learner", "simulator") if "corr" in (drl.get(k) or {})}
    # β's own figures before the intercept's re-fit on the validation and test rows (queries.dr_learner)
    rows["dr_learner_unshifted"] = (drl.get("intercept") or {}).get("unshifted")
    rows["not_identified"] = [n for n, d in (fe.get("policies") or {}).items()
                              if not (d.get("identified") or {}).get("answer")]
    return rows


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-19"`` (or a mix: ``"0-4,9"``)."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def main(
    seeds: str = typer.Option("0,1,2", help="seeds: comma-separated, or a range such as 0-19"),
    dataset: str = typer.Option("dkt-synth", help="dkt-synth | tumour"),
    data_preset: str = typer.Option("small", help="the data preset"),
    rounds: int = typer.Option(8, help="rounds per run (0: the run preset's own)"),
    run_preset: str = typer.Option("tiny", help="the run preset (model size, rounds): tiny | default"),
    workers: int = typer.Option(1, help="seeds run in parallel processes"),
    sites: int = typer.Option(4, help="sites"),
    gamma: float = typer.Option(None, help="confounding strength γ of the generated world (default: its own)"),
    quick: bool = typer.Option(False, help="seed 0, 2 rounds: checks the script"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    load: Path = typer.Option(None, help="print the tables of a saved --json output instead of running"),
) -> None:
    if load is not None:
        return report(json.loads(load.read_text()))
    torch.set_num_threads(1)
    seed_list = parse_seeds(seeds)
    if quick:
        seed_list, rounds = seed_list[:1], 2
    args = [(seed, dataset, data_preset, rounds or None, sites, gamma, run_preset) for seed in seed_list]
    t0 = time.perf_counter()
    err.print(f"{dataset} seeds {seed_list}: {rounds or run_preset + ' preset'} rounds, {sites} sites, "
              f"{workers} worker(s) …")
    if workers > 1:
        import multiprocessing as mp  # noqa: PLC0415
        from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(one_seed, *zip(*args)))
    else:
        results = [one_seed(*a) for a in args]
    out = {"machine": machine(), "params": {"seeds": seed_list, "dataset": dataset, "data_preset": data_preset,
                                            "run_preset": run_preset, "rounds": rounds, "sites": sites,
                                            "gamma": gamma, "workers": workers},
           "wall_s": time.perf_counter() - t0, "results": results}
    if as_json:
        print(json.dumps(out, indent=1, default=float))
        return
    report(out)


def _ess_only_answers(results: list[dict]) -> list[bool]:
    """Whether each policy's answer under the ESS check alone (its longest horizon with ESS ≥ 20, the support rule
    before the mean-weight test of ``queries.targeted.reaches_policy``) covers the oracle's truth."""
    from fcd_secure.queries.targeted import MIN_SUPPORT_ESS  # noqa: PLC0415

    hits = []
    for r in results:
        for rows in (r.get("horizons") or {}).values():
            ok = [h for h in rows if h["ess"] >= MIN_SUPPORT_ESS and h.get("true") is not None]
            if ok:
                hits.append(ok[-1]["low"] <= ok[-1]["true"] <= ok[-1]["high"])
    return hits


def _same_steps(r: dict) -> dict | None:
    """The oracle-μ AIPW of a seed when it was computed on the run's own test steps (the same truth), else None."""
    o = r.get("onestep_oracle_mu")
    return o if o and r["onestep_true"] is not None and abs(o["true"] - r["onestep_true"]) < 1e-9 else None


def report(out: dict) -> None:
    """The tables of one benchmark output (``main``'s JSON)."""
    results, dataset = out["results"], out["params"]["dataset"]
    con = Console(width=max(Console().width, 130))  # the one-step table is wider than a pipe's 80 columns
    con.print(json.dumps(out["machine"]))
    t = Table(title=f"{dataset}: one-step effect at every decision step (|error| against the oracle)")
    for c in ("seed", "truth", "AIPW", "covers", "self-norm.", "covers", "AIPW, true μ", "covers", "simulator",
              "naive", "round"):
        t.add_column(c, justify="right")

    def cell(d, tr):
        return (f"{abs(d['estimate'] - tr):.3f}", "yes" if d["low"] <= tr <= d["high"] else "no") if d else ("n/a", "")

    for r in results:
        if r["onestep_true"] is None:
            continue
        tr = r["onestep_true"]
        t.add_row(str(r["seed"]), f"{tr:+.3f}", *cell(r["onestep_aipw"], tr), *cell(r["onestep_sn"], tr),
                  *cell(_same_steps(r), tr), f"{abs(r['onestep_model'] - tr):.3f}", f"{abs(r['onestep_naive'] - tr):.3f}", str(r["selected_round"]))
    con.print(t)
    ok = [r for r in results if r["onestep_true"] is not None and r["onestep_aipw"] and r["onestep_sn"]]
    if ok:
        con.print("mean |error|: " + ", ".join(
            f"{k} {np.mean([abs(r[c]['estimate'] - r['onestep_true']) for r in ok]):.3f}"
            for k, c in (("AIPW", "onestep_aipw"), ("self-normalised", "onestep_sn")))
            + f", simulator {np.mean([abs(r['onestep_model'] - r['onestep_true']) for r in ok]):.3f}"
            + f"; the answer uses: {ok[0]['onestep_variant']}")
        floor = [(abs(r["onestep_aipw"]["estimate"] - r["onestep_true"]),
                  abs(_same_steps(r)["estimate"] - r["onestep_true"])) for r in ok if _same_steps(r)]
        if floor:
            con.print(f"the logs' own noise (AIPW with the oracle's outcome probabilities as μ, same steps and P): "
                      f"mean |error| {np.mean([b for _, b in floor]):.3f}, largest {max(b for _, b in floor):.3f}; "
                      f"the product's AIPW exceeds it by {np.mean([a - b for a, b in floor]):+.3f} on average")
        for k, c in (("AIPW", "onestep_aipw"), ("self-normalised", "onestep_sn")):
            errs = [abs(r[c]["estimate"] - r["onestep_true"]) for r in ok]
            hits = [r[c]["low"] <= r["onestep_true"] <= r[c]["high"] for r in ok]
            con.print(f"{k}: |error| ≤ 0.05 on {sum(e <= 0.05 for e in errs)} of {len(errs)} seeds (largest "
                      f"{max(errs):.3f}); 90 % interval covers {coverage_line(hits)}")
    vals = [v for r in results for v in r["values"]]
    effs = [v for r in results for v in r["effects"]]
    if vals:
        con.print(f"identified values: {len(vals)} (policy, seed) answers on h = "
                  f"{sorted({v['h'] for v in vals})}; mean |error| {np.mean([v['err'] for v in vals]):.3f}, 90 % "
                  f"interval covers {coverage_line([v['covered'] for v in vals])}; the simulator's whole-trajectory "
                  f"value misses by {np.mean([v['sim_err_whole'] for v in vals if v['sim_err_whole'] is not None]):.3f}")
    if effs:
        con.print(f"identified effects: {len(effs)}; mean |error| {np.mean([v['err'] for v in effs]):.3f}, coverage "
                  f"{coverage_line([v['covered'] for v in effs])} (a seed's policies share their data: not "
                  "independent)")
    by_ess = _ess_only_answers(results)
    if by_ess:
        con.print(f"under the ESS check alone (without the mean-weight test; from the recorded horizons) the "
                  f"values would have covered {coverage_line(by_ess)}")
    drl = [r for r in results if {"dr_learner", "simulator"} <= set(r.get("dr_learner") or {})]
    if drl:
        con.print("per-entity one-step effects, corr(τ̂, τ) / skill: " + "; ".join(
            f"seed {r['seed']} DR-learner {r['dr_learner']['dr_learner']['corr']:+.2f} / "
            f"{r['dr_learner']['dr_learner']['skill']:+.2f}, simulator {r['dr_learner']['simulator']['corr']:+.2f} / "
            f"{r['dr_learner']['simulator']['skill']:+.2f}" for r in drl) + " (targets: corr ≥ 0.3, skill > 0)")
        pairs = [(r["dr_learner"]["dr_learner"]["skill"], r["dr_learner_unshifted"]["skill"]) for r in drl
                 if (r.get("dr_learner_unshifted") or {}).get("skill") is not None]
        if pairs:
            diff = np.array([a - b for a, b in pairs])
            con.print(f"DR-learner skill > 0 in {sum(a > 0 for a, _ in pairs)} of {len(pairs)} worlds with the "
                      f"intercept re-fitted on the validation and test rows, {sum(b > 0 for _, b in pairs)} with β's "
                      f"own (validation) intercept; mean skill {np.mean([a for a, _ in pairs]):+.3f} against "
                      f"{np.mean([b for _, b in pairs]):+.3f} (paired difference {diff.mean():+.3f} ± "
                      f"{diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float('nan'):.3f})")
    checks = [(r["seed"], k, r["dr_learner"][k]["heldout"]) for r in drl for k in ("dr_learner", "simulator")
              if (r["dr_learner"][k].get("heldout") or {}).get("true_gain") is not None]
    if checks:
        for k in ("dr_learner", "simulator"):
            c = [h for _, kk, h in checks if kk == k]
            if not c:
                continue
            within = sum(abs(h["gain"] - h["true_gain"]) <= 1.645 * h["se"] for h in c)
            con.print(f"held-out check of the {k.replace('_', '-')}'s per-entity effects (truth-free): shown on "
                      f"{sum(h['verdict'] == 'shown' for h in c)} of {len(c)} worlds (true gain > 0 on "
                      f"{sum(h['true_gain'] > 0 for h in c)}; shown where the true gain ≤ 0: "
                      f"{sum(h['verdict'] == 'shown' and h['true_gain'] <= 0 for h in c)}); estimated gain − true gain "
                      f"{np.mean([h['gain'] - h['true_gain'] for h in c]):+.4f} on average, within its 90 % interval on "
                      f"{within} of {len(c)}; mean SE {np.mean([h['se'] for h in c]):.4f}")
    con.print("not identified (no horizon with ESS ≥ 20 whose mean weight product reaches 1): "
              + "; ".join(f"seed {r['seed']}: {', '.join(r['not_identified']) or 'none'}" for r in results))


if __name__ == "__main__":
    typer.run(main)

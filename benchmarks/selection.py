"""Truth-free model selection on DKT-Synth: does the one-step DR discrepancy D₁ rank models by their true one-step
effect error, where the validation fit does not? (issue 29 item 2; ``fcd_secure.queries.selection``)

Every candidate is one scored round of one federated run (secure aggregation, the real ServerApp and ClientApps on
the in-process engine): the recipes ``ours`` (the default objective) and ``paper`` (the paper's: no inverse-propensity
weights, latent rollout, transition not given Y) at learning rates ``--lrs``. For each candidate the script reads the
run's own per-round figures (D₁ ± SE and the validation fit, computed on the sites' validation rows and summed
securely: what the server saw) and computes, with the oracle, the **true one-step error**: over every valid step of
every site's test rows, |mean(μ̂_on − μ̂_off) − mean(μ_on − μ_off)|, μ̂ from the model each site answers with (the kept
Θc of that round and the site's own kept Θs), μ the oracle's exact P(Y_t | history, do(a)).

Printed side by side, per seed: Spearman(D₁, true error) against Spearman(validation fit, true error); the true error
of the round the one-SE rule picks among all candidates (this is the learning-rate selection too) against the
log-loss pick and the best candidate; the share of paper-recipe rounds after the second flagged at ≥ 3 SE; and the
cost of the selection sums against a round's wall time.

    .venv/bin/python benchmarks/selection.py                 # small world, 4 sites, 8 rounds, 3 lrs × 2 recipes, seeds 0-2
    .venv/bin/python benchmarks/selection.py --quick         # tiny world, 2 rounds, 1 lr, seed 0: checks the script
    .venv/bin/python benchmarks/selection.py --json
    .venv/bin/python benchmarks/selection.py --recipes ours,g-formula --lrs 1e-3   # outcome-model variants (fcd select)

With more than one recipe the script also chooses between the recipes as ``fcd select`` does between finished runs
(``queries.selection.choose_run``): each (recipe, lr) run answers with the round its own rule picked, and the rule is
applied across those runs; printed beside the true error of each run's answer.
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import json  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _machine import machine  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

err = Console(stderr=True)
#: the paper's recipe (benchmarks/fidelity.py PAPER_RECIPE)
RECIPES: dict[str, dict[str, Any]] = {
    "ours": {},
    "paper": {"transition_given_y": False, "ipw": "off", "rollout": "latent"},
    # the other outcome-model variant: the same network with a deterministic transition (the g-formula row)
    "g-formula": {"transition": "deterministic"},
}


def spearman(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return math.nan
    ra = np.argsort(np.argsort(a[ok])).astype(float)
    rb = np.argsort(np.argsort(b[ok])).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def true_one_step_error(cfg, state: Path, rnd: int) -> float:
    """|mean(μ̂_on − μ̂_off) − mean(μ_on − μ_off)| over every valid test step of every site, for the model each site
    answers with at round ``rnd`` (module docstring)."""
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.queries.selection import KeptParams

    theta = KeptParams(state / "_server" / "selection").load(rnd)
    hat, true = [], []
    for i in range(cfg.data.n_sites):
        rt = SiteRuntime(cfg, f"site-{i:02d}", i, str(state))
        model = rt.load_for_eval(theta, "theta_c", restore_round=rnd)
        d = rt.data
        a_off, a_on = d.anchors
        test = d.test
        valid = test.M > 0
        h = model.one_step_probs(test, a_on) - model.one_step_probs(test, a_off)
        tr = np.stack([d.oracle.outcome_probs_do(i, "test", None, t, a_on) - d.oracle.outcome_probs_do(i, "test", None, t, a_off)
                       for t in range(test.L)], axis=1)
        hat.append(h[valid])
        true.append(tr[valid])
    hat, true = np.concatenate(hat), np.concatenate(true)
    return float(abs(hat.mean() - np.nanmean(true)))


def one_run(seed: int, recipe: str, lr: float, rounds: int, data_preset: str, n_sites: int,
            test_fraction: float = 0.2, validation_fraction: float = 0.2) -> list[dict]:
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    tmp = Path(tempfile.mkdtemp(prefix="fcd-select-"))
    cfg = build_config("tiny", {
        "seed": seed,
        "data": {"preset": data_preset, "n_sites": n_sites, "alpha": 1000.0,
                 "test_fraction": test_fraction, "validation_fraction": validation_fraction},
        "federation": {"clients_per_round": n_sites, "rounds": rounds, "eval_every": 1, "select": "last"},
        "model": {**RECIPES[recipe], "lr": lr},
        "state_dir": str(tmp / "state"), "out": str(tmp / "run"),
    })
    t0 = time.perf_counter()
    res = run_inprocess(cfg)
    wall = time.perf_counter() - t0
    out = []
    for r in res.history:
        s = r.get("selection") or {}
        if s.get("d1") is None:
            continue
        out.append({"seed": seed, "recipe": recipe, "lr": lr, "round": r["round"], "d1": s["d1"], "se": s["d1_se"],
                    "fit": s["validation_fit"], "alarm": s["alarm"], "round_s": r["round_s"],
                    "true_error": true_one_step_error(cfg, tmp / "state", r["round"]), "run_wall_s": wall})
    return out


def selection_cost(data_preset: str, n_sites: int, seed: int, test_fraction: float = 0.2,
                   validation_fraction: float = 0.2) -> dict:
    """Seconds of one site's scored-round sums (selection and DR-learner fit, validation rows) against that site's
    local training round."""
    from fcd_secure.config import build_config
    from fcd_secure.federation import learner
    from fcd_secure.queries import registry
    from fcd_secure.queries.base import SiteContext
    from fcd_secure.queries.dr_learner import DRLearnerFit
    from fcd_secure.queries.request import EvaluationRequest
    from fcd_secure.queries.selection import Selection

    # the runs' own splits: the scored rows reach the cohort floor exactly where the runs' do
    cfg = build_config("tiny", {"seed": seed, "data": {"preset": data_preset, "n_sites": n_sites, "alpha": 1000.0,
                                                       "test_fraction": test_fraction,
                                                       "validation_fraction": validation_fraction}})
    d = learner.load_site_data(cfg, 0)
    model = learner.build_model(cfg, learner.dims_of(d.train, n_sites))
    opt = model.optimizer
    t0 = time.perf_counter()
    learner.train_local(model, d.train, cfg, 0, n_sites, 1, seed, opt)
    train_s = time.perf_counter() - t0
    def scored_round_sums():  # the two queries of a scored round, on a fresh context (nothing cached between calls)
        ctx = SiteContext(model=model, data=d, cfg=cfg, request=EvaluationRequest(quick=True, keep_round=1),
                          rows=np.arange(d.test.n), sub=d.test, seed=0, floor=20)
        return registry.site_sums(ctx, (Selection(), DRLearnerFit()))

    scored_round_sums()  # warm-up
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        scored_round_sums()
        times.append(time.perf_counter() - t0)
    return {"train_round_s": train_s, "selection_s": float(np.median(times))}


def main(
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
    rounds: int = typer.Option(8, help="rounds per run (every one scored)"),
    lrs: str = typer.Option("3e-4,1e-3,3e-3", help="learning-rate grid"),
    data_preset: str = typer.Option("small", help="DKT-Synth preset"),
    sites: int = typer.Option(4, help="sites"),
    recipes: str = typer.Option("ours,paper", help=f"comma-separated recipes of {sorted(RECIPES)}"),
    quick: bool = typer.Option(False, help="2 rounds, the last lr, seed 0, the tiny world (test fraction 0.4 and "
                               "validation fraction 0.5, so that each site's test and validation rows reach the "
                               "cohort floor of 20): checks the script"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    torch.set_num_threads(1)
    seed_list = [int(s) for s in seeds.split(",")]
    lr_list = [float(x) for x in lrs.split(",")]
    test_fraction, validation_fraction = 0.2, 0.2
    if quick:
        seed_list, rounds, lr_list = seed_list[:1], 2, lr_list[-1:]
        data_preset, test_fraction, validation_fraction = "tiny", 0.4, 0.5
    from fcd_secure.queries.selection import RoundScore, choose_round, choose_run

    recipe_list = [r.strip() for r in recipes.split(",") if r.strip()]
    unknown = [r for r in recipe_list if r not in RECIPES]
    if unknown:
        raise typer.BadParameter(f"unknown recipe(s) {unknown}; known: {sorted(RECIPES)}", param_hint="--recipes")
    rows: list[dict] = []
    for seed in seed_list:
        for recipe in recipe_list:
            for lr in lr_list:
                err.print(f"seed {seed} · {recipe} · lr {lr:g} · {rounds} rounds …")
                rows += one_run(seed, recipe, lr, rounds, data_preset, sites, test_fraction,
                                validation_fraction)
    results = []
    for seed in seed_list:
        c = [r for r in rows if r["seed"] == seed]
        scores = [RoundScore(round=k, d1=r["d1"], se=r["se"], mean=math.nan, n=1, clipped_share=0.0, fit=r["fit"],
                             sites_scoring=sites, sites=sites) for k, r in enumerate(c)]
        pick = c[choose_round(scores, len(c) - 1)["round"]]
        fit_pick = min(c, key=lambda r: r["fit"])
        best = min(c, key=lambda r: r["true_error"])
        late_paper = [r for r in c if r["recipe"] == "paper" and r["round"] > 2]
        # the variants as `fcd select` sees them: each run's own chosen round, then the rule across the runs
        answers = []
        for recipe in recipe_list:
            for lr in lr_list:
                run = [r for r in c if r["recipe"] == recipe and r["lr"] == lr]
                if run:
                    own = choose_round([RoundScore(round=r["round"], d1=r["d1"], se=r["se"], mean=math.nan, n=1,
                                                   clipped_share=0.0, fit=r["fit"], sites_scoring=sites, sites=sites)
                                        for r in run], run[-1]["round"])
                    answers.append(next(r for r in run if r["round"] == own["round"]))
        run_pick = choose_run([RoundScore(round=0, d1=r["d1"], se=r["se"], mean=math.nan, n=1, clipped_share=0.0,
                                          fit=r["fit"], sites_scoring=sites, sites=sites).as_row() for r in answers])
        results.append({
            "seed": seed, "candidates": len(c),
            "spearman_d1": spearman([r["d1"] for r in c], [r["true_error"] for r in c]),
            "spearman_fit": spearman([r["fit"] for r in c], [r["true_error"] for r in c]),
            "rule_pick": {k: pick[k] for k in ("recipe", "lr", "round", "true_error")},
            "fit_pick": {k: fit_pick[k] for k in ("recipe", "lr", "round", "true_error")},
            "best": {k: best[k] for k in ("recipe", "lr", "round", "true_error")},
            "paper_rounds_after_2_flagged": (sum(r["alarm"] for r in late_paper), len(late_paper)),
            "runs": [{k: r[k] for k in ("recipe", "lr", "round", "d1", "se", "fit", "true_error")} for r in answers],
            "run_pick": run_pick["run"],
        })
    cost = selection_cost(data_preset, sites, seed_list[0], test_fraction, validation_fraction)
    out = {"machine": machine(), "params": {"seeds": seed_list, "rounds": rounds, "lrs": lr_list, "recipes": recipe_list,
                                            "data_preset": data_preset, "sites": sites},
           "results": results, "cost": cost, "candidates": rows}
    if as_json:
        print(json.dumps(out, indent=1, default=float))
        return
    con = Console()
    con.print(json.dumps(out["machine"]))
    t = Table(title="Truth-free selection (true one-step effect error from the oracle)")
    for col in ("seed", "cands", "ρ D1 (≥0.8)", "ρ fit", "rule pick", "fit pick", "best", "paper r>2 flagged"):
        t.add_column(col, justify="right")
    for r in results:
        f = r["paper_rounds_after_2_flagged"]
        t.add_row(str(r["seed"]), str(r["candidates"]), f"{r['spearman_d1']:+.2f}", f"{r['spearman_fit']:+.2f}",
                  f"{r['rule_pick']['true_error']:.3f}", f"{r['fit_pick']['true_error']:.3f}",
                  f"{r['best']['true_error']:.3f}", f"{f[0]} of {f[1]}")
    con.print(t)
    for r in results:
        con.print(f"seed {r['seed']}: rule pick " + ", ".join(f"{k} {r['rule_pick'][k]}" for k in ("recipe", "lr", "round"))
                  + "; fit pick " + ", ".join(f"{k} {r['fit_pick'][k]}" for k in ("recipe", "lr", "round")))
    if len(recipe_list) > 1:
        v = Table(title="Outcome-model variants: each run's answer, and the one `fcd select` takes")
        for col in ("seed", "recipe", "lr", "round", "D1 ± SE", "val. fit", "true one-step err", ""):
            v.add_column(col, justify="right")
        for r in results:
            for i, a in enumerate(r["runs"]):
                v.add_row(str(r["seed"]), a["recipe"], f"{a['lr']:g}", str(a["round"]), f"{a['d1']:.4f} ± {a['se']:.4f}",
                          f"{a['fit']:.4f}", f"{a['true_error']:.3f}", "chosen" if i == r["run_pick"] else "")
        con.print(v)
    con.print(f"cost: selection sums {cost['selection_s']:.3f} s per site-evaluation against a local training round of "
              f"{cost['train_round_s']:.3f} s ({100 * cost['selection_s'] / cost['train_round_s']:.1f} %)")


if __name__ == "__main__":
    typer.run(main)

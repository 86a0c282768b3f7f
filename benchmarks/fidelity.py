"""Effect fidelity on DKT-Synth: the causal targets beside the paper's figures, the naive model and the centralised
reference, plus the DSS and L_dis ablations and the information ceiling of per-student effects.

Every federated row runs through the real simulation engine, as ``fcd run`` does (``engines.simulation
.run_simulated``: Flower's simulation engine, the site ClientApps, pairwise-masked secure aggregation of Θc for the
main row; the quick form runs it on the in-process engine, ``engines.inprocess``: the same round loop, ClientApps
and messages without Ray's start); the non-federated rows train for the matched epochs of
``experiments.centralised``. Every row is scored by the federated evaluation (``experiments.evaluate.evaluate_on_sites``), and per-student effects for the
correlation and the ATE ratio are recomputed on each site with the evaluation's own seed and model (Θc + that
site's Θs), so they are the effects the PEHE was computed from.

    .venv/bin/python benchmarks/fidelity.py                           # default preset, 3 seeds, 40 rounds
    .venv/bin/python benchmarks/fidelity.py --seeds 0 --rounds 10     # what fits a shared 2-core machine
    .venv/bin/python benchmarks/fidelity.py --quick                   # tiny, seed 0, ours vs naive, in-process engine
    .venv/bin/python benchmarks/fidelity.py --recipe paper            # the paper's recipe as the main row
    nice -n 5 .venv/bin/python benchmarks/fidelity.py --rows centralised --epochs 10 --seeds 0 --no-tiny \
        --no-ceiling --recipe paper                                   # the centralised overshoot of docs/fidelity.md §3
    .venv/bin/python benchmarks/fidelity.py --causes --epochs 10 --seeds 0   # why: confounding vs regime support
    .venv/bin/python benchmarks/fidelity.py --world '{"gamma": 0}'    # every row on an unconfounded world

Rows: ``ours`` (the default recipe, DSS, secure aggregation), ``paper`` (the paper's recipe, DSS, secure aggregation;
only when the default recipe differs from it), ``centralised`` (the default recipe on the pooled data), ``naive``
(the observational P(Y_t | X, A_t, T_t, Y_{t−1}) model, pooled), ``full_sync`` (w/o DSS) and ``no_ldis`` (w/o
L_dis), both federated with plain aggregation as ``fcd ablate`` runs them, and ``plain`` (ours with plain
aggregation: the control that tells the ablations' effect from the aggregation's). On the tiny preset: ours vs
naive.
``--causes`` separates the two causes of docs/fidelity.md: it runs the rows (default ``naive,centralised``) on the
world as generated, with the logging policy's confounding off (``data.gamma = 0``), with a one-step effect
(``data.effect_horizon = 1``) and with both, and prints each world's anchor ATE beside the estimate with how many
logged trajectories follow each anchor regime over the effect window (``data.policy.regime_support``). ``--world``
runs every row on one such world.
``--ceiling`` adds the supervised information ceiling (docs/fidelity.md): a regression of the TRUE τ_i on what is
observable at the anchor step (the oracle's knowledge state from the logged history, X, the outcome history),
fitted on the training split's true effects and scored on the test split.
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _machine import machine  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

err = Console(stderr=True)

#: paper Table III (DKT-Synth, Fed-CausalDiff) and the targets of effect fidelity.
PAPER = {"pehe": 0.057, "ate_error": 0.045, "value_error": 0.049}
TARGETS = {"pehe": "≤ 0.06", "ate_error": "≤ 0.045", "value_error": "≤ 0.05", "ate_ratio": "[0.9, 1.1]", "corr": "≥ 0.6"}
#: the paper's recipe: every switch of docs/fidelity.md at the paper's setting (the sampler's steps stay the preset's).
PAPER_RECIPE = {"transition_given_y": False, "ipw": "off", "rollout": "latent"}
ROWS_DEFAULT = "ours,paper,centralised,naive,full_sync,no_ldis"
#: the worlds of ``--causes``: DKT-Synth's generator options (``data.gamma``, ``data.effect_horizon``) per label.
CAUSE_WORLDS: dict[str, dict[str, Any]] = {
    "as generated": {},
    "γ = 0": {"gamma": 0.0},
    "one step": {"effect_horizon": 1},
    "γ = 0, one step": {"gamma": 0.0, "effect_horizon": 1},
}


def per_student_effects(cfg, sims) -> tuple[np.ndarray, np.ndarray]:
    """(τ̂, τ) over every site's test students, computed exactly as ``queries.evaluation.site_metrics`` does."""
    from fcd_secure.federation import learner
    from fcd_secure.queries.evaluation import EVAL_SALT

    hats, trues = [], []
    cap = cfg.evaluation.max_rows
    for i, sim in enumerate(sims):
        data = learner.load_site_data(cfg, i)
        # the rows site_metrics scores when evaluate_on_sites passes none: the first max_rows of the test split
        rows = np.arange(data.test.n if cap is None else min(data.test.n, cap), dtype=np.int64)
        sub = data.test if len(rows) == data.test.n else data.test.subset(rows)
        seed = learner.round_seed(cfg.seed, 0, data.site_index, EVAL_SALT)
        o = data.oracle
        trues.append(np.asarray(o.true_effects(data.site_index, "test", rows), dtype=np.float64))
        hats.append(np.asarray(sim.estimate_effects(sub, data.anchors, o.anchor_step, o.horizon,
                                                    cfg.evaluation.n_samples, seed), dtype=np.float64))
    return np.concatenate(hats), np.concatenate(trues)


def score(cfg, sims) -> dict[str, Any]:
    """The federated evaluation of ``sims`` (one per site) plus the per-student correlation and the ATE ratio."""
    from fcd_secure.experiments.evaluate import evaluate_on_sites

    from fcd_secure.evaluation.metrics import EffectStats

    ev = evaluate_on_sites(cfg, sims)
    tau_hat, tau = per_student_effects(cfg, sims)
    pol = ev.get("policies") or {}
    skill = EffectStats.from_arrays(tau_hat, tau).skill_figures()
    return {
        "pehe": float(np.sqrt(np.mean((tau_hat - tau) ** 2))),
        # PEHE means nothing without these beside it (EffectStats.skill_figures)
        "pehe0": skill["pehe_zero"], "sd_tau": skill["sd_tau"], "skill": skill["skill"], "flags": skill["flags"],
        "ate_error": float(abs(tau_hat.mean() - tau.mean())),
        "value_error": ev.get("value_error_mean"),
        "ate_ratio": float(tau_hat.mean() / tau.mean()) if tau.mean() != 0 else float("nan"),
        "corr": float(np.corrcoef(tau_hat, tau)[0, 1]) if tau_hat.std() > 0 else float("nan"),
        "sd_ratio": float(tau_hat.std() / tau.std()) if tau.std() > 0 else float("nan"),
        "ate_hat": float(tau_hat.mean()), "ate_true": float(tau.mean()),
        "eval_pehe": ev.get("pehe"),
        "values": {k: (v.get("value_sim"), v.get("value_true")) for k, v in pol.items() if isinstance(v, dict)},
    }


def federated_sims(cfg, result) -> list:
    """One simulator per site from a finished run: the final Θc (or every parameter under full sync) and, under
    DSS, the site's own Θs from its state folder — the model each site evaluated with."""
    from fcd_secure.federation import learner
    from fcd_secure.federation.state import SiteState

    sims = []
    for info in sorted(result.sites, key=lambda s: s.site_index):
        model = learner.build_model(cfg, info.dims)
        model.set_params(result.part, result.theta)
        if result.part != "full":
            snap = SiteState(cfg.state_root(), info.site_id).load()
            if snap is not None:
                model.set_params("theta_s", snap.theta_s)
        sims.append(model)
    return sims


def run_row(base, row: str, seed: int, out: Path, epochs: int = 0, inprocess: bool = False) -> dict[str, Any]:
    """One row (module docstring); a federated row on Flower's simulation engine or, with ``inprocess``, on the
    in-process engine (``engines.inprocess``: the same round loop, ClientApps and messages without Ray's start)."""
    from fcd_secure.experiments.ablation import variant_config
    from fcd_secure.experiments.centralised import matched_epochs, train_centralised
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.engines.simulation import run_simulated
    from fcd_secure.model.baselines import SIMULATORS

    t0 = time.perf_counter()
    if row in ("centralised", "naive"):
        cfg = base.model_copy(update={"seed": seed})
        n_epochs = epochs or matched_epochs(cfg)
        sim, _ = train_centralised(SIMULATORS["fed_causaldiff" if row == "centralised" else "naive"], cfg, n_epochs)
        res = score(cfg, [sim] * cfg.data.n_sites)
        res["epochs"] = n_epochs
    else:
        if row in ("full_sync", "no_ldis", "plain"):
            cfg = variant_config(base, row, seed, out)  # "plain": DSS and L_dis as ours, plain aggregation
        else:
            model = base.model.model_copy(update=PAPER_RECIPE) if row == "paper" else base.model
            fed = base.federation.model_copy(update={"secure_aggregation": True, "sync": "dss"})
            cfg = base.model_copy(update={"seed": seed, "model": model, "federation": fed,
                                          "out": str(out / f"{row}-seed{seed}"), "state_dir": None})
        cfg = cfg.model_copy(update={"state_dir": str(Path(cfg.out) / "state")})
        result = (run_inprocess if inprocess else run_simulated)(cfg)
        res = score(cfg, federated_sims(cfg, result))
    res.update(row=row, seed=seed, seconds=time.perf_counter() - t0, support=support(cfg))
    err.print(f"[dim]{row} seed {seed}: PEHE {res['pehe']:.4f} |ATE| {res['ate_error']:.4f} ratio {res['ate_ratio']:.2f} "
              f"corr {res['corr']:.2f} value {res['value_error'] if res['value_error'] is None else round(res['value_error'], 4)} "
              f"({res['seconds']:.0f} s)[/]")
    return res


def support(cfg) -> dict[str, Any]:
    """How many training trajectories follow each anchor regime over the world's effect window (pooled sites)."""
    from fcd_secure.data.policy import anchor_regime_support
    from fcd_secure.data.schema import concat
    from fcd_secure.federation import learner

    fd = learner.load_federated(cfg)
    pooled, o = concat(list(fd.train)), fd.oracle
    return {"horizon": o.horizon, **anchor_regime_support(pooled.T, pooled.M, fd.anchors, o.anchor_step, o.horizon)}


def run_row_isolated(preset: str, rounds: int, recipe: str, row: str, seed: int, out: Path,
                     epochs: int = 0, world: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`run_row` in a fresh interpreter: Flower's simulation engine starts once per process (a second
    ``run_simulation`` in one process does not get its sites through hello). ``recipe`` is 'default', 'paper' or
    a JSON object of ModelConfig keys (a candidate recipe); ``epochs`` > 0 trains the centralised rows that long;
    ``world`` holds data options of a generated world (``data.gamma``, ``data.effect_horizon``)."""
    args = [preset, rounds, recipe, row, seed, str(out), epochs, world or {}]
    cmd = [sys.executable, __file__, "--one", json.dumps(args)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"row {row} seed {seed} ({preset}) failed with exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: the rows trained without Flower (``experiments.centralised``): they need no interpreter of their own
POOLED_ROWS = ("centralised", "naive")


def run_rows(calls: list[tuple], jobs: int, inprocess: bool = False) -> list[dict[str, Any]]:
    """:func:`run_row` of each ``(preset, rounds, recipe, row, seed, epochs, world)``, ``jobs`` at once, in order;
    their run folders live in one temporary folder. Each row runs in a fresh interpreter
    (:func:`run_row_isolated`), except one after another (``jobs`` = 1) with at most one federated row: then every
    row runs in this process, which starts Flower's simulation engine at most once and imports torch and Flower once
    (the quick form's two rows); with ``inprocess`` (the quick form) every federated row runs on the in-process
    engine, all of them in this process, one after another."""
    with tempfile.TemporaryDirectory(prefix="fcd-fidelity-") as tmp:
        if inprocess or (jobs == 1 and sum(c[3] not in POOLED_ROWS for c in calls) <= 1):
            return [json.loads(json.dumps(run_row(base_config(p, r, rec, wo), row, seed, Path(tmp), ep, inprocess),
                                          default=float))
                    for p, r, rec, row, seed, ep, wo in calls]
        with ThreadPoolExecutor(jobs) as pool:
            futures = [pool.submit(run_row_isolated, p, r, rec, row, seed, Path(tmp), ep, wo)
                       for p, r, rec, row, seed, ep, wo in calls]
            return [f.result() for f in futures]


def base_config(preset: str, rounds: int, recipe: str, world: dict[str, Any] | None = None):
    """The run configuration of every row: the preset, its rounds unless given, the default or the paper's recipe,
    the generated world's options (``world``: ``data.gamma``, ``data.effect_horizon``) when given."""
    from fcd_secure.config import build_config

    over: dict[str, Any] = {"federation": {"rounds": rounds}} if rounds else {}
    if world:
        over["data"] = dict(world)
    base = build_config(preset, over)
    if recipe == "paper":
        base = base.model_copy(update={"model": base.model.model_copy(update=PAPER_RECIPE)})
    elif recipe != "default":
        from fcd_secure.model.config import ModelConfig

        model = ModelConfig.model_validate({**base.model.model_dump(), **json.loads(recipe)})
        base = base.model_copy(update={"model": model})
    return base


def information_ceiling(preset: str, seed: int) -> dict[str, float]:
    """Supervised regression of the true τ_i on the observables at the anchor step (module docstring)."""
    from fcd_secure.data.dkt_synth import truth
    from fcd_secure.data.schema import concat
    from fcd_secure.federation import learner
    from fcd_secure.config import build_config

    w = learner.load_federated(build_config(preset, {"seed": seed})).oracle

    def feats(split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids = w.student_ids(None, split)
        ds = concat(w.train if split == "train" else w.test)
        state = truth.factual_state(w.oracle, w.T_all[ids], w.Y_all[ids], w.anchor_step)
        with torch.no_grad():
            z = w.oracle.logits(state).numpy()
        off = w.cfg.beta_theta * w.theta[ids] + w.cfg.beta_u * w.u[ids]
        obs = np.concatenate([z, ds.X, ds.Y[:, : w.anchor_step]], 1)
        return obs, np.concatenate([obs, off[:, None]], 1), np.asarray(w.true_effects(None, split), dtype=np.float64)

    (o_tr, h_tr, tau_tr), (o_te, h_te, tau_te) = feats("train"), feats("test")

    def fit(Ftr: np.ndarray, Fte: np.ndarray) -> np.ndarray:
        mu, sd = Ftr.mean(0), Ftr.std(0) + 1e-9
        Xtr = torch.tensor((Ftr - mu) / sd, dtype=torch.float32)
        Xte = torch.tensor((Fte - mu) / sd, dtype=torch.float32)
        y = torch.tensor(tau_tr, dtype=torch.float32)
        preds = []
        for k in range(3):
            torch.manual_seed(k)
            net = torch.nn.Sequential(torch.nn.Linear(Xtr.shape[1], 128), torch.nn.SiLU(), torch.nn.Linear(128, 128),
                                      torch.nn.SiLU(), torch.nn.Linear(128, 1))
            opt = torch.optim.Adam(net.parameters(), lr=2e-3, weight_decay=1e-3)
            for _ in range(800):
                opt.zero_grad()
                ((net(Xtr)[:, 0] - y) ** 2).mean().backward()
                opt.step()
            with torch.no_grad():
                preds.append(net(Xte)[:, 0].numpy())
        return np.mean(preds, 0)

    out = {"sd_tau": float(tau_te.std())}
    for name, (a, b) in {"observable": (o_tr, o_te), "with_hidden": (h_tr, h_te)}.items():
        pr = fit(a, b)
        out[f"{name}_corr"] = float(np.corrcoef(pr, tau_te)[0, 1])
        out[f"{name}_pehe"] = float(np.sqrt(np.mean((pr - tau_te) ** 2)))
    return out


def causes_main(preset: str, rounds: int, recipe: str, rows: list[str], seeds: list[int], epochs: int, jobs: int,
                as_json: bool) -> None:
    """``--causes``: the rows on each of :data:`CAUSE_WORLDS`, the anchor ATE beside each estimate (one table)."""
    t_start = time.perf_counter()
    tasks = [(label, row, seed) for label in CAUSE_WORLDS for seed in seeds for row in rows]
    done = [{"world": label, **r} for (label, _, _), r in zip(tasks, run_rows(
        [(preset, rounds, recipe, row, seed, epochs, CAUSE_WORLDS[label]) for label, row, seed in tasks], jobs))]
    params = {"preset": preset, "seeds": seeds, "rows": rows, "recipe": recipe, "worlds": CAUSE_WORLDS,
              "centralised_epochs": epochs or "matched", "minutes": (time.perf_counter() - t_start) / 60}
    if as_json:
        print(json.dumps({"machine": machine(), "params": params, "results": done}, default=str))
        return
    out = Console(width=160)
    out.print(f"machine: {machine()}")
    out.print(f"params: {params}")
    # one line per seed: the seed draws the world too, and its anchors and true ATE (even its sign) with it
    t = Table(title=f"Why the anchor effect is wrong: DKT-Synth {preset}, seeds {seeds}")
    for c in ("world", "row", "seed", "horizon", "true ATE", "estimated ATE", "|ATE err|", "PEHE", "corr(τ̂, τ)",
              "whole-window runs a_off / a_on of n"):
        t.add_column(c, justify="left" if c in ("world", "row") else "right")
    for label in CAUSE_WORLDS:
        for row in rows:
            for r in (r for r in done if r["world"] == label and r["row"] == row):
                sp = r["support"]
                t.add_row(label, row + (f" ({r['epochs']} ep.)" if "epochs" in r else ""), str(r["seed"]),
                          str(sp["horizon"]), _f(r["ate_true"]), _f(r["ate_hat"]), _f(r["ate_error"]), _f(r["pehe"]),
                          _f(r["corr"], ".2f"), f"{sp['a_off']['whole']} / {sp['a_on']['whole']} of {sp['a_off']['n']}")
    out.print(t)
    for label in CAUSE_WORLDS:  # the seed means of the errors (the signed ATEs do not average across worlds' seeds)
        for row in rows:
            rs = [r for r in done if r["world"] == label and r["row"] == row]
            if len(rs) > 1:
                m = {k: [r[k] for r in rs] for k in ("ate_error", "pehe", "corr")}
                out.print(f"{label}, {row}: |ATE err| {np.mean(m['ate_error']):.4f} ± {np.std(m['ate_error'], ddof=1):.4f}"
                          f"  PEHE {np.mean(m['pehe']):.4f} ± {np.std(m['pehe'], ddof=1):.4f}"
                          f"  corr {np.mean(m['corr']):.2f} ± {np.std(m['corr'], ddof=1):.2f}")
    out.print(f"wall: {params['minutes']:.1f} min")


def _f(v: Any, fmt: str = ".4f") -> str:
    return "—" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, fmt)


def main(
    quick: bool = typer.Option(False, "--quick", help="Tiny preset, its 2 rounds, seed 0, ours vs naive, the "
                               "in-process engine (no Ray start): checks the script runs."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Comma-separated seeds."),
    rounds: int = typer.Option(0, "--rounds", help="Global rounds (0: the preset's); centralised rows match them."),
    rows: str = typer.Option(ROWS_DEFAULT, "--rows", help="Rows to run."),
    recipe: str = typer.Option("default", "--recipe", help="'default' (the shipped ModelConfig), 'paper', or a JSON "
                               "object of model keys for the main rows, e.g. '{\"transition_given_y\": true}'."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Rows run at once (each in its own process)."),
    epochs: int = typer.Option(0, "--epochs", min=0, help="Epochs of the centralised and naive rows (0: matched to "
                               "the federated rounds, experiments.centralised.matched_epochs)."),
    tiny: bool = typer.Option(True, "--tiny/--no-tiny", help="Also run ours vs naive on the tiny preset."),
    ceiling: bool = typer.Option(True, "--ceiling/--no-ceiling", help="Also fit the information ceiling (seed 0)."),
    world: str = typer.Option("", "--world", help="Data options of the generated world for every row, a JSON object, "
                              "e.g. '{\"gamma\": 0, \"effect_horizon\": 1}' (data.gamma, data.effect_horizon)."),
    causes: bool = typer.Option(False, "--causes", help="Run the rows (default naive,centralised) on the world as "
                                "generated, with γ = 0, with a one-step effect and with both; print the anchor ATE "
                                "beside each estimate and the logged support of each anchor regime."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout; progress on stderr."),
    one: str = typer.Option("", "--one", hidden=True, help="[PRESET, ROUNDS, RECIPE, ROW, SEED, OUT, EPOCHS, WORLD] "
                            "— one row, JSON out."),
) -> None:
    torch.set_num_threads(1)
    if one:
        p, r, rec, row, sd, o, ep, wo = json.loads(one)
        print(json.dumps(run_row(base_config(p, int(r), rec, wo), row, int(sd), Path(o), int(ep)), default=float))
        return
    if causes and world:
        raise typer.BadParameter("--causes runs its own worlds; drop --world", param_hint="--world")
    try:
        world_opts = json.loads(world) if world else {}
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not a JSON object: {exc}", param_hint="--world") from None
    if not isinstance(world_opts, dict):
        raise typer.BadParameter("not a JSON object", param_hint="--world")
    preset = "tiny" if quick else "default"
    base = base_config(preset, rounds, recipe, world_opts)
    if causes and rows == ROWS_DEFAULT:
        rows = "naive,centralised"
    wanted = [r.strip() for r in rows.split(",") if r.strip()]
    if all(getattr(base.model, k) == v for k, v in PAPER_RECIPE.items()) and "paper" in wanted:
        wanted.remove("paper")  # the default recipe is the paper's: the 'ours' row is that row
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    if quick:  # the tiny comparison of a full run: ours (federated, secure) vs naive, first seed
        seed_list = seed_list[:1]
        wanted = [r for r in wanted if r in ("ours", "naive")] if rows != ROWS_DEFAULT else ["ours", "naive"]
    t_start = time.perf_counter()
    if causes:
        causes_main(preset, rounds, recipe, wanted, seed_list, epochs, jobs, as_json)
        return
    tasks = [(preset, rounds, row, seed) for seed in seed_list for row in wanted]
    if tiny and not quick:
        tasks += [("tiny", 0, row, seed) for seed in seed_list for row in ("ours", "naive")]
    done = [{"preset": p, **r} for (p, _, _, _), r in zip(tasks, run_rows(
        [(p, r, recipe, row, seed, epochs if p == preset else 0, world_opts if p == preset else None)
         for p, r, row, seed in tasks], jobs, inprocess=quick))]
    results = [r for r in done if r["preset"] == preset]
    tiny_rows = [r for r in done if r["preset"] == "tiny" and preset != "tiny"]
    ceil = information_ceiling(preset, seed_list[0]) if ceiling and not quick else None
    params = {"preset": preset, "seeds": seed_list, "rounds": base.federation.rounds, "rows": wanted, "recipe": recipe,
              "model": {k: getattr(base.model, k) for k in (*PAPER_RECIPE, "ipw_clip", "ipw_window", "sampler",
                                                             "sampler_steps")},
              "centralised_epochs": epochs or "matched", "world": world_opts,
              "minutes": (time.perf_counter() - t_start) / 60}
    if as_json:
        print(json.dumps({"machine": machine(), "params": params, "results": results, "tiny": tiny_rows,
                          "ceiling": ceil}, default=str))
        return
    out = Console(width=140)
    out.print(f"machine: {machine()}")
    out.print(f"params: {params}")
    metrics = ("pehe", "pehe0", "sd_tau", "skill", "ate_error", "value_error", "ate_ratio", "corr", "sd_ratio")
    t = Table(title=f"Effect fidelity, DKT-Synth {preset}, {base.federation.rounds} rounds, seeds {seed_list} "
                    "(mean ± s.d. over seeds)")
    for c in ("row", "PEHE", "PEHE₀", "sd τ", "skill", "|ATE err|", "|value err|", "ATE ratio", "corr(τ̂, τ)",
              "sd τ̂ / sd τ", "s / seed", "flags"):
        t.add_column(c, justify="left" if c in ("row", "flags") else "right")
    t.add_row("target", *[TARGETS.get(m, "") for m in metrics], "", "")
    t.add_row("paper (Table III)", _f(PAPER["pehe"], ".3f"), "", "", "", _f(PAPER["ate_error"], ".3f"),
              _f(PAPER["value_error"], ".3f"), "", "", "", "", "")

    def agg(rs: list[dict[str, Any]], m: str) -> str:
        v = np.array([np.nan if r[m] is None else r[m] for r in rs], dtype=float)
        if len(v) == 1:
            return _f(float(v[0]))
        return f"{np.nanmean(v):.4f} ± {np.nanstd(v, ddof=1):.4f}"

    for group in (results, tiny_rows):
        for row in dict.fromkeys(r["row"] for r in group):
            rs = [r for r in group if r["row"] == row]
            label = f"{row} ({rs[0]['preset']}" + (f", {rs[0]['epochs']} ep.)" if "epochs" in rs[0] else ")")
            flags = sorted({f for r in rs for f in r.get("flags", [])})
            t.add_row(label, *[agg(rs, m) for m in metrics], f"{np.mean([r['seconds'] for r in rs]):.0f}",
                      "; ".join(flags) or "—")
    out.print(t)

    def mean(row: str, m: str, group=results) -> float:
        v = [r[m] for r in group if r["row"] == row and r[m] is not None]
        return float(np.mean(v)) if v else float("nan")

    checks = []
    for m, ok in (("pehe", lambda v: v <= 0.06), ("ate_error", lambda v: v <= 0.045), ("value_error", lambda v: v <= 0.05),
                  ("ate_ratio", lambda v: 0.9 <= v <= 1.1), ("corr", lambda v: v >= 0.6)):
        v = mean("ours", m)
        checks.append((f"ours {m} {TARGETS[m]}", _f(v), bool(np.isfinite(v) and ok(v))))
    for m in ("pehe", "ate_error"):
        f, c = mean("ours", m), mean("centralised", m)
        checks.append((f"federated {m} within 1.1× of centralised", f"{_f(f)} vs {_f(c)}", bool(f <= 1.1 * c)))
        for ab in ("full_sync", "no_ldis"):
            a = mean(ab, m)
            checks.append((f"DSS+L_dis better than {ab} on {m}", f"{_f(f)} vs {_f(a)}", bool(f < a)))
            if any(r["row"] == "plain" for r in results):  # the same comparison at the same (plain) aggregation
                p_ = mean("plain", m)
                checks.append((f"DSS+L_dis (plain aggregation) better than {ab} on {m}", f"{_f(p_)} vs {_f(a)}",
                               bool(p_ < a)))
        checks.append((f"better than naive on {m}", f"{_f(f)} vs {_f(mean('naive', m))}", bool(f < mean("naive", m))))
    if tiny_rows:
        f, n = mean("ours", "pehe", tiny_rows), mean("naive", "pehe", tiny_rows)
        checks.append(("tiny: better than naive on PEHE", f"{_f(f)} vs {_f(n)}", bool(f < n)))
    ct = Table(title="Targets")
    for c in ("check", "measured", "met"):
        ct.add_column(c)
    for name, val, ok in checks:
        ct.add_row(name, val, "yes" if ok else "NO")
    out.print(ct)
    if ceil:
        out.print(f"information ceiling (seed {seed_list[0]}, supervised on the training split's true τ): observable at "
                  f"t0 corr {ceil['observable_corr']:.3f} PEHE {ceil['observable_pehe']:.4f}; with the hidden offset "
                  f"corr {ceil['with_hidden_corr']:.3f} PEHE {ceil['with_hidden_pehe']:.4f}; constant effect PEHE "
                  f"{ceil['sd_tau']:.4f} (= sd τ)")
    for r in results + tiny_rows:
        vals = " ".join(f"{k} {_f(a, '.3f')}/{_f(b, '.3f')}" for k, (a, b) in r["values"].items())
        out.print(f"[dim]values (model/true) {r['row']} {r['preset']} seed {r['seed']}: {vals}[/]")
    out.print(f"wall: {params['minutes']:.1f} min")


if __name__ == "__main__":
    typer.run(main)

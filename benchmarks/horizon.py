"""Whole-trajectory answers (issue 42's targets): the value of each regimen over the whole trajectory, the
always-vs-never effect and the regimens' order, on the tumour world and the carry-over world, federated with secure
aggregation, beside a centralised g-formula, IPW with the same propensities, the product's sequential doubly robust
values with their interval coverage, and the natural-course check on the trained simulator and on a deliberately
broken one.

Per world and seed (``--worlds``, ``--seeds``; the run preset ``--preset``, default ``default``):

1. a federated run per latent transition (``--transitions``, default both: ``model.transition = "diffusion"``, the
   paper's, and ``"deterministic"``, the GRU g-formula's, ``model.baselines.gformula``), each exactly as ``fcd run
   --dataset <world> --preset <preset> --seed <seed>`` with that ``[model] transition`` makes it (the ServerApp, the
   site ClientApps, pairwise-masked secure aggregation of Θc, DSS, the product's round selection; on
   ``engines.inprocess`` by default, the same apps without starting Ray, ``--engine simulation`` for Flower's
   simulation engine); then the rule of ``fcd select`` across those runs, by the command's own code
   (``cli.select.choose_among``: D₁ at each run's selected round within one SE of the smallest, then the smallest
   natural-course gap; never the validation fit, never the truth). Each run's figures, read back from its
   ``summary.json``, are printed with the one the rule chose; the chosen one's are scored against the targets:
   the simulator's whole-trajectory value of each of the paper's four regimens (``policies.<π>.value_sim``) against
   the truth (``value_true``, the oracle's, every valid step from t = 0), IPW with the logged propensities over the
   whole trajectory (``policies.<π>.ipw``, the same P every weighting estimator uses), the sequential doubly robust
   value with its 90 % interval (``policies.<π>.sequential_dr``, ``queries.sequential_dr``) and the natural-course
   check (``natural_course``, ``queries.natural_course``: the simulator under the logging policy against the logs,
   outcome and generated contexts, max |z|);
2. (unless ``--no-centralised``) the centralised g-formula (``model.simulator = "gformula"``: Fed-CausalDiff with
   a deterministic latent transition, as ``benchmarks/tumour.py`` trains it) and the naive observational model,
   trained on the pooled
   training rows for the epochs matched to the run (``experiments.centralised.matched_epochs``) and scored by the
   same federated evaluation (``experiments.evaluate.evaluate_on_sites``);
3. the natural-course check of a deliberately broken simulator: each site's federated model (the chosen run's) with
   its context head set to carry forward (the affine head's last layer zeroed: every generated context stays at its
   value on the start step, :func:`frozen_contexts`), checked on the same test rows.

Figures per method: the mean |value error| over the regimens it answers (IPW answers none where no logged trajectory
follows the regimen to its end: every weight product is then 0, shown "–"), the |error| of the always − never contrast, and
whether the four estimates are in the true order. Sequential DR coverage is pooled over regimens, seeds and worlds
(``_coverage.coverage_line``); both worlds floor every action's propensity (tumour 1 %, carry-over 2 %), so per-step
positivity holds for every regimen. Issue 42's targets are printed beside the figures (:data:`TARGETS`); nothing here
was tuned on the seeds it reports (the script has no tuned constant: every setting is the product's default).

    nice -n 10 .venv/bin/python benchmarks/horizon.py                     # default preset, seeds 0-2, both worlds
    nice -n 10 .venv/bin/python benchmarks/horizon.py --seeds 0 --worlds carryover
    nice -n 10 .venv/bin/python benchmarks/horizon.py --rounds 10 --no-centralised --out runs/h --json h.json
    .venv/bin/python benchmarks/horizon.py --quick      # tiny, 1 round, tumour, seed 0, never/always, 2 transitions
    .venv/bin/python benchmarks/horizon.py --json out.json                # the figures as JSON as well
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _coverage import coverage_line  # noqa: E402
from _machine import machine  # noqa: E402

WORLDS = ("tumour", "carryover")
#: the latent transitions compared (``model.transition``): the paper's diffusion and the deterministic g-formula one
TRANSITIONS = ("diffusion", "deterministic")
#: the paper's four regimens, in the order the tables list them
REGIMENS = ("never", "always", "early_on", "late_on")
#: ``--quick``: the fewest regimens that still give a value error, the always − never contrast and an order
QUICK_REGIMENS = ("never", "always")
#: issue 42's targets
TARGETS = {"value error (mean over regimens)": "≤ 0.05", "always − never effect error": "≤ 0.05",
           "ranked in the true order": "every seed", "sequential DR coverage": "85-95 %",
           "natural course flags the broken simulator": "max |z| ≥ 3"}
#: the row labels of the single-model methods (the transitions' rows are labelled by their transition)
LABELS = {"gformula": "g-formula (centralised)", "naive": "naive (centralised)", "ipw": "IPW (logged P)"}


def _status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_config(world: str, preset: str, seed: int, rounds: int | None, out: Path, transition: str = "diffusion",
               quick: bool = False, min_local_steps: int = 0):
    """The config of ``fcd run --dataset <world> --preset <preset> --seed <seed>`` with ``[model] transition =
    <transition>``, secure aggregation and DSS (the defaults, named so that a changed default cannot silently change
    this benchmark), its folder ``out``. ``quick``: the run evaluated once, at its end, on the regimens of
    :data:`QUICK_REGIMENS` only (every test row: the oracle's truth is reported only over all of them)."""
    from fcd_secure.config import build_config

    fed: dict[str, Any] = {"secure_aggregation": True, "sync": "dss"}
    if rounds:
        fed["rounds"] = rounds
    if min_local_steps:
        fed["min_local_steps"] = min_local_steps
    evaluation: dict[str, Any] = {}
    if quick:
        fed["eval_every"] = 0
        evaluation = {"policies": list(QUICK_REGIMENS)}
    cfg = build_config(preset, {"seed": seed, "data": {"dataset": world}, "federation": fed,
                                "model": {"transition": transition}, "evaluation": evaluation, "out": str(out)})
    return cfg.model_copy(update={"state_dir": str(out / "state")})


def federated(cfg, engine: str = "inprocess") -> tuple[dict[str, Any], list[Any]]:
    """The run of ``cfg`` on ``engine`` (``inprocess``: the same ServerApp and ClientApps without Ray,
    ``engines.inprocess``; ``simulation``: Flower's simulation engine): its ``summary.json`` and each site's model
    (Θc and its Θs)."""
    from fidelity import federated_sims

    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.engines.simulation import run_simulated

    result = (run_inprocess if engine == "inprocess" else run_simulated)(cfg)
    summary = json.loads((Path(cfg.out) / "summary.json").read_text(encoding="utf-8"))
    return summary, federated_sims(cfg, result)


def reopened(run_dir: Path, rollout: str | None = None) -> tuple[Any, dict[str, Any], list[Any]]:
    """A finished run folder of :func:`federated` (``--reuse``): its config, its ``summary.json`` and each site's
    model (the folder's Θc, ``theta_c.npz``, and the site's Θs from its state), as ``fcd whatif`` reopens a run.
    ``rollout``: the models' ``[model] rollout`` set to this (``--rescore``: a rollout setting does not change the
    trained numbers, ``model.simulate``), else the run's own."""
    from fcd_secure.apps.site import default_site_id
    from fcd_secure.engines.whatif_run import open_run
    from fcd_secure.federation import learner
    from fcd_secure.federation.state import SiteState

    cfg, theta = open_run(run_dir)
    if rollout is not None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"rollout": rollout})})
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    sims = []
    for i in range(cfg.data.n_sites):
        model = learner.build_model(cfg, learner.dims_of(learner.load_site_data(cfg, i).train, cfg.data.n_sites))
        model.set_params("theta_c", theta)
        snap = SiteState(cfg.state_root(), default_site_id(i)).load()
        if snap is not None:
            model.set_params("theta_s", snap.theta_s)
        sims.append(model)
    return cfg, summary, sims


def centralised(name: str, cfg, epochs: int | None) -> tuple[dict[str, Any], int]:
    """``name`` (a key of ``model.baselines.SIMULATORS``) trained on the pooled training rows and scored by the
    federated evaluation; returns the merged metrics and the epochs."""
    from fcd_secure.experiments.centralised import matched_epochs, train_centralised
    from fcd_secure.experiments.evaluate import evaluate_on_sites
    from fcd_secure.model.baselines import SIMULATORS

    n = epochs or matched_epochs(cfg)
    sim, _ = train_centralised(SIMULATORS[name], cfg, n)
    return evaluate_on_sites(cfg, [sim] * cfg.data.n_sites), n


def frozen_contexts(sim: Any) -> Any:
    """A copy of ``sim`` whose generated contexts stay at their value on the rollout's start step: the affine context
    head (``model.context``) with its last layer zeroed is carry forward (the head's own initial state), so from the
    start of a natural-course rollout (t = 0) every endogenous context is frozen at A_0.

    Raises:
        ValueError: The simulator has no affine context head (nothing to break).
    """
    from fcd_secure.model.context import ContextHead
    from fcd_secure.model.networks import unwrap

    twin = copy.deepcopy(sim)
    heads = [m for m in unwrap(twin.module).modules() if isinstance(m, ContextHead)]
    if not heads or any(h.form != "affine" for h in heads):
        raise ValueError("frozen_contexts needs a simulator with an affine context head")
    import torch

    with torch.no_grad():
        for h in heads:
            h.net[-1].weight.zero_()
            h.net[-1].bias.zero_()
    return twin


def natural_course(cfg, sims: list[Any]) -> dict[str, Any] | None:
    """The natural-course check alone (``queries.natural_course.NaturalCourse``) of one model per site on the sites'
    test rows, merged as the run merges it."""
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.federation import learner
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.natural_course import NaturalCourse

    queries = (NaturalCourse(),)
    request = full_eval_config(cfg)
    parts = [site_metrics(sim, learner.load_site_data(cfg, i), cfg, request, queries=queries)
             for i, sim in enumerate(sims)]
    return merge_site_metrics(parts, queries=queries).get("natural_course")


def nc_figures(nc: dict[str, Any] | None) -> dict[str, Any]:
    """max |z| of the outcome and of the generated contexts, the mean |gap| of the outcome, and the verdict."""
    if not nc:
        return {"y_z": None, "a_z": None, "gap": None, "passes": None}
    ctx = nc.get("contexts") or {}
    return {"y_z": nc.get("max_abs_z"), "a_z": ctx.get("max_abs_z"), "gap": nc.get("mean_abs_gap"),
            "passes": nc.get("passes")}


def asked(policies: dict[str, Any]) -> tuple[str, ...]:
    """The regimens of :data:`REGIMENS` an evaluation answered (all four; ``--quick``: :data:`QUICK_REGIMENS`)."""
    return tuple(n for n in REGIMENS if n in policies)


def estimates(policies: dict[str, Any], method: str) -> dict[str, float | None]:
    """Each regimen's whole-trajectory value by ``method`` from an evaluation's ``policies``."""
    out: dict[str, float | None] = {}
    for name in asked(policies):
        p = policies.get(name) or {}
        if method == "ipw":
            v = (p.get("ipw") or {}).get("value")
        elif method == "sequential_dr":
            v = (p.get("sequential_dr") or {}).get("estimate")
        else:
            v = p.get("value_sim")
        out[name] = None if v is None or not np.isfinite(v) else float(v)
    return out


def scores(est: dict[str, float | None], true: dict[str, float]) -> dict[str, Any]:
    """Mean |value error| over the regimens estimated, the |error| of always − never, and whether the four
    estimates are in the true order (None where a regimen has no estimate)."""
    names = list(true)
    have = [n for n in names if est.get(n) is not None]
    value_error = float(np.mean([abs(est[n] - true[n]) for n in have])) if have else None
    effect_error = (abs((est["always"] - est["never"]) - (true["always"] - true["never"]))
                    if est.get("always") is not None and est.get("never") is not None else None)
    ranked = (sorted(names, key=lambda n: -est[n]) == sorted(names, key=lambda n: -true[n])
              if len(have) == len(names) else None)
    return {"values": est, "value_error": value_error, "effect_error": effect_error, "ranked": ranked}


def sdr_hits(policies: dict[str, Any], true: dict[str, float]) -> list[bool]:
    """Whether each regimen's sequential DR interval covers its truth (regimens with an interval only)."""
    hits = []
    for name in true:
        sd = (policies.get(name) or {}).get("sequential_dr") or {}
        if sd.get("low") is not None and sd.get("high") is not None:
            hits.append(bool(sd["low"] <= true[name] <= sd["high"]))
    return hits


def transition_run(world: str, seed: int, transition: str, args: argparse.Namespace,
                   root: Path) -> tuple[Path, Any, dict[str, Any], list[Any], str]:
    """The federated run of one transition (its folder, config, summary, per-site models, and how its final
    evaluation was made), reopened where ``--reuse`` finds it finished."""
    folder = root / f"{world}-seed{seed}-{transition}"
    from fcd_secure.model.config import ModelConfig

    rescore = False
    if args.reuse and (folder / "summary.json").is_file():
        rescore = args.rescore
        cfg, summary, sims = reopened(folder, ModelConfig.model_fields["rollout"].default if rescore else None)
    else:
        cfg = run_config(world, args.preset, seed, args.rounds, folder, transition, args.quick, args.min_local_steps)
        summary, sims = federated(cfg, args.engine)
    evaluated = "the run's final evaluation (secure sums)"
    if rescore:
        # the run's trained models (its selected round's Θc, each site's Θs) evaluated by this code's rollout
        from fcd_secure.experiments.evaluate import evaluate_on_sites

        evaluated = f"in process, rescored with [model] rollout = {cfg.model.rollout!r} (the run's trained models)"
        summary = {**summary, **evaluate_on_sites(cfg, sims)}
    elif not all(n in (summary.get("policies") or {}) for n in args.regimens):
        # the run's final secure evaluation did not answer (on a loaded host the sites can miss its round timeout):
        # the same evaluation of the same per-site models, in process
        from fcd_secure.experiments.evaluate import evaluate_on_sites

        evaluated = f"in process (the run's final evaluation: {summary.get('final_eval_aborted') or 'no answer'})"
        summary = {**summary, **evaluate_on_sites(cfg, sims)}
    return folder, cfg, summary, sims, evaluated


def selection_figures(row: dict[str, Any]) -> dict[str, Any]:
    """The selected round's truth-free figures that ``fcd select`` compares (``rounds.json``'s ``selection``)."""
    return {k: row.get(k) for k in ("round", "d1", "d1_se", "dh", "dh_se", "dh_supported", "nc_gap",
                                    "validation_fit", "coverage")}


def run_one(world: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Everything the module docstring lists for one world and seed: a federated run per transition, the rule of
    ``fcd select`` across them (``cli.select.choose_among``), the chosen run's figures."""
    from fcd_secure.cli.select import choose_among

    t0 = time.perf_counter()
    runs: dict[str, Any] = {}
    true: dict[str, float] = {}
    for tr in args.transitions:
        t_run = time.perf_counter()
        folder, cfg, summary, sims, evaluated = transition_run(world, seed, tr, args, root)
        pol = summary.get("policies") or {}
        true = {n: float(pol[n]["value_true"]) for n in asked(pol)}
        runs[tr] = {"folder": folder, "cfg": cfg, "sims": sims, "rounds": summary.get("rounds"),
                    "selected_round": (summary.get("selection") or {}).get("round"), "evaluated": evaluated,
                    "federated": scores(estimates(pol, "federated"), true),
                    "ipw": scores(estimates(pol, "ipw"), true),
                    "sequential_dr": scores(estimates(pol, "sequential_dr"), true),
                    "sdr_hits": sdr_hits(pol, true),
                    "natural_course": nc_figures(summary.get("natural_course")),
                    "seconds": time.perf_counter() - t_run}
        _status(f"{world} seed {seed} {tr}: federated run {runs[tr]['seconds']:.0f} s; value error "
                f"{_f(runs[tr]['federated']['value_error'])}")
    if len(runs) > 1:
        choice, loaded = choose_among([r["folder"] for r in runs.values()])
        for (tr, r), (_, row) in zip(runs.items(), loaded):
            r["selection"] = selection_figures(row)
        chosen = list(runs)[choice["run"]] if choice["run"] is not None else None
        choice = {k: v for k, v in choice.items() if k != "run"}
    else:  # one transition: nothing to choose
        chosen, choice = next(iter(runs)), {"rule": "only run", "reason": "one transition run", "candidates": [0]}
    pick = runs[chosen or next(iter(runs))]
    out: dict[str, Any] = {"world": world, "seed": seed, "truth": true, "rounds": pick["rounds"],
                           "selected_round": pick["selected_round"], "evaluated": pick["evaluated"],
                           "chosen": chosen, "choice": choice, "methods": {}, "transitions": {}}
    for tr, r in runs.items():
        out["transitions"][tr] = {k: v for k, v in r.items() if k not in ("folder", "cfg", "sims")}
        out["transitions"][tr]["folder"] = str(r["folder"])
    out["methods"]["federated"] = pick["federated"]
    out["methods"]["ipw"] = pick["ipw"]
    out["methods"]["sequential_dr"] = pick["sequential_dr"]
    out["sdr_hits"] = pick["sdr_hits"]
    out["natural_course"] = {"federated": pick["natural_course"]}
    t1 = time.perf_counter()
    if args.centralised:
        for name in ("gformula", "naive"):
            metrics, epochs = centralised(name, pick["cfg"], args.epochs)
            truth_c = {n: float(metrics["policies"][n]["value_true"]) for n in asked(metrics["policies"])}
            out["methods"][name] = scores(estimates(metrics.get("policies") or {}, name), truth_c)
            out["methods"][name]["epochs"] = epochs
            if name == "gformula":
                out["natural_course"]["gformula"] = nc_figures(metrics.get("natural_course"))
                out["sdr_hits_gformula"] = sdr_hits(metrics.get("policies") or {}, truth_c)
    t2 = time.perf_counter()
    out["natural_course"]["broken"] = nc_figures(natural_course(pick["cfg"],
                                                                [frozen_contexts(s) for s in pick["sims"]]))
    out["seconds"] = {"federated": t1 - t0, "centralised": t2 - t1, "broken": time.perf_counter() - t2}
    _status(f"{world} seed {seed}: chosen {chosen} ({choice.get('rule')}); done in {time.perf_counter() - t0:.0f} s")
    return out


def _plain(v: Any) -> Any:
    """JSON for numpy scalars (their Python value) and paths (their text)."""
    return v.item() if hasattr(v, "item") else str(v)


def _f(v: Any, fmt: str = ".3f") -> str:
    return "–" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, fmt)


def _yes(v: bool | None) -> str:
    return "–" if v is None else ("yes" if v else "no")


def print_tables(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(json.dumps(out["machine"]))
    res = out["results"]
    for world in dict.fromkeys(r["world"] for r in res):
        rows = [r for r in res if r["world"] == world]
        t = Table(title=f"{world}: whole-trajectory values (the regimens asked, every valid step from t = 0)")
        for col in ("seed", "method", "mean |value err|", "always − never err", "ranked", *REGIMENS):
            t.add_column(col, justify="left" if col == "method" else "right")
        for r in rows:
            t.add_row(str(r["seed"]), "truth", "", "", "", *[_f(r["truth"].get(n)) for n in REGIMENS])
            lines = [(f"federated, {tr}" + (" (chosen)" if tr == r.get("chosen") else ""), f["federated"])
                     for tr, f in (r.get("transitions") or {}).items()]
            lines += [(f"seq. DR, {tr} Q̂", f["sequential_dr"]) for tr, f in (r.get("transitions") or {}).items()]
            lines += [(LABELS[m], r["methods"][m]) for m in ("ipw", "gformula", "naive") if m in r["methods"]]
            for i, (label, s) in enumerate(lines):
                t.add_row("", label, _f(s["value_error"]), _f(s["effect_error"]), _yes(s["ranked"]),
                          *[_f(s["values"].get(n)) for n in REGIMENS], end_section=i == len(lines) - 1)
        con.print(t)
        c = Table(title=f"{world}: the transition `fcd select`'s rule chose (cli.select.choose_among), and why")
        for col in ("seed", "transition", "round", "D1 ± SE", "D2 (supported)", "NC gap", "val. fit", "NC passes"):
            c.add_column(col, justify="left" if col == "transition" else "right")
        for r in rows:
            for i, (tr, f) in enumerate((r.get("transitions") or {}).items()):
                sel = f.get("selection") or {}
                c.add_row(str(r["seed"]) if i == 0 else "", tr + (" ← chosen" if tr == r.get("chosen") else ""),
                          str(sel.get("round", f.get("selected_round"))),
                          f"{_f(sel.get('d1'), '.4f')} ± {_f(sel.get('d1_se'), '.4f')}",
                          f"{_f(sel.get('dh'), '.4f')} ({_yes(sel.get('dh_supported'))})", _f(sel.get("nc_gap"), ".4f"),
                          _f(sel.get("validation_fit"), ".4f"), _yes((f.get("natural_course") or {}).get("passes")))
        con.print(c)
        for r in rows:
            con.print(f"{world} seed {r['seed']}: chosen {r.get('chosen')} — {(r.get('choice') or {}).get('rule')}: "
                      f"{(r.get('choice') or {}).get('reason')}", soft_wrap=True)
        n = Table(title=f"{world}: natural course (simulator under the logging policy vs the logs, test rows)")
        for col in ("seed", "simulator", "max |z| outcome", "max |z| contexts", "mean |gap| outcome", "passes"):
            n.add_column(col, justify="left" if col == "simulator" else "right")
        for r in rows:
            for i, (k, label) in enumerate((("federated", "trained (federated, chosen)"), ("gformula", "g-formula"),
                                            ("broken", "broken: contexts frozen at A_0"))):
                f = r["natural_course"].get(k) or {}
                n.add_row(str(r["seed"]) if i == 0 else "", label, _f(f.get("y_z"), ".2f"), _f(f.get("a_z"), ".2f"),
                          _f(f.get("gap")), _yes(f.get("passes")), end_section=i == 2)
        con.print(n)
        for r in rows:
            con.print(f"{world} seed {r['seed']}: {r.get('rounds')} rounds, the chosen run's selected round "
                      f"{r.get('selected_round')}; federated model scored by {r.get('evaluated', 'the run')}")
        con.print(f"{world}: sequential DR 90 % intervals cover the truth: "
                  f"{coverage_line([h for r in rows for h in r['sdr_hits']])} (federated Q̂); "
                  f"{coverage_line([h for r in rows for h in r.get('sdr_hits_gformula', [])])} (g-formula Q̂)")
    hits = [h for r in res for h in r["sdr_hits"]]
    con.print(f"sequential DR coverage over every world, seed and regimen: {coverage_line(hits)}")
    tg = Table(title="issue 42's targets (the federated simulator `fcd select` chose, every world and seed)")
    for col in ("target", "wanted", "met"):
        tg.add_column(col)
    fed = [r["methods"]["federated"] for r in res]
    broken = [r["natural_course"]["broken"] for r in res]
    met = {
        "value error (mean over regimens)": all(s["value_error"] is not None and s["value_error"] <= 0.05 for s in fed),
        "always − never effect error": all(s["effect_error"] is not None and s["effect_error"] <= 0.05 for s in fed),
        "ranked in the true order": all(bool(s["ranked"]) for s in fed),
        "sequential DR coverage": bool(hits) and 0.85 <= sum(hits) / len(hits) <= 0.95,
        "natural course flags the broken simulator": all(
            max(b.get("y_z") or 0.0, b.get("a_z") or 0.0) >= 3.0 for b in broken),
    }
    for k, v in TARGETS.items():
        tg.add_row(k, v, _yes(met[k]))
    con.print(tg)
    con.print(f"wall {out['wall_s']:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", nargs="+", default=list(WORLDS), choices=WORLDS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--preset", default="default", help="the run preset (tiny | default | paper)")
    ap.add_argument("--rounds", type=int, default=None, help="federated rounds (default: the preset's)")
    ap.add_argument("--min-local-steps", type=int, default=32,
                    help="federation.min_local_steps of every federated run (default 32: the setting the issue-42 "
                    "figures of docs/benchmarks.md were measured with, ~11 passes a round on a 190-row site; 0: the "
                    "preset's one pass, Table II)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs of the centralised models (default: matched to the run, experiments.centralised)")
    ap.add_argument("--out", type=Path, default=None, help="folder of the runs (default: a temporary one)")
    ap.add_argument("--reuse", action="store_true",
                    help="take the federated run from --out where its folder is finished (scored in process where "
                    "its final evaluation did not answer)")
    ap.add_argument("--rescore", action="store_true",
                    help="with --reuse: evaluate a finished run's trained models again, in process, with the current "
                    "default [model] rollout (a run trained before model.rollout = 'auto' keeps 'latent' in its "
                    "config); the run's round selection is kept as it was")
    ap.add_argument("--transitions", nargs="+", default=list(TRANSITIONS), choices=TRANSITIONS,
                    help="a federated run per latent transition ([model] transition); with two, `fcd select`'s rule "
                    "chooses between them")
    ap.add_argument("--engine", default="inprocess", choices=("inprocess", "simulation"),
                    help="inprocess: the same apps without Ray (engines.inprocess); simulation: Flower's engine")
    ap.add_argument("--no-centralised", dest="centralised", action="store_false",
                    help="skip the centralised g-formula and naive models")
    ap.add_argument("--quick", action="store_true",
                    help="tiny preset, 1 round evaluated at its end only, the first world, seed 0, never and always "
                    "only, 1 centralised epoch")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the figures to this file (rewritten after every world and seed)")
    args = ap.parse_args()
    args.regimens = REGIMENS
    if args.quick:
        args.preset, args.rounds, args.seeds, args.epochs, args.min_local_steps = "tiny", 1, [0], 1, 0
        args.worlds, args.regimens = args.worlds[:1], QUICK_REGIMENS
    start = time.perf_counter()
    results: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        out = {"machine": machine(), "params": {k: str(v) for k, v in vars(args).items()}, "results": results,
               "wall_s": time.perf_counter() - start}
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=_plain), encoding="utf-8")
        return out

    with tempfile.TemporaryDirectory(prefix="fcd-horizon-") as tmp:
        root = args.out or Path(tmp)
        for w in args.worlds:
            for seed in args.seeds:
                results.append(run_one(w, seed, args, root))
                report()
    print_tables(report())


if __name__ == "__main__":
    main()

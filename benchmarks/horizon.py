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
   simulation engine; every other setting is the world's own default, ``config.WORLD_DEFAULTS``); then the rule
   of ``fcd select`` across those runs, by the command's own code (``cli.select.choose_among``: D₁ at each run's
   selected round within one SE of the smallest, then the smallest natural-course gap; never the validation fit,
   never the truth). Each run's figures, read back from its ``summary.json``, are printed with the one the rule
   chose; the chosen one's are scored against the targets:
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
positivity holds for every regimen. ``--sdr-horizons`` prints coverage twice: of the test patients' own mean
value (a sample-average truth, which the interval over-covers, since its SE includes the spread between patients)
and of the population value, the same regimen over every site's training patients (disjoint from the test rows),
which is the estimand the interval's SE is for (Imbens 2004, Rev. Econ. Stat. 86:4-29). Issue 42's targets are
printed beside the figures (:data:`TARGETS`); nothing here was tuned on the seeds it reports (the script has no
tuned constant: every setting is the product's default).

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
import math  # noqa: E402
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
               quick: bool = False, min_local_steps: int = 0, eval_every: int | None = None,
               model: dict[str, Any] | None = None):
    """The config of ``fcd run --dataset <world> --preset <preset> --seed <seed>`` with ``[model] transition =
    <transition>``, secure aggregation and DSS (the defaults, named so that a changed default cannot silently change
    this benchmark), its folder ``out``. ``quick``: the run evaluated once, at its end, on the regimens of
    :data:`QUICK_REGIMENS` only (every test row: the oracle's truth is reported only over all of them). ``model``:
    further ``[model]`` keys (``--model KEY=VALUE``; the centralised rows train with the same)."""
    from fcd_secure.config import build_config

    fed: dict[str, Any] = {"secure_aggregation": True, "sync": "dss"}
    if rounds:
        fed["rounds"] = rounds
    fed["min_local_steps"] = min_local_steps  # named, 0 included: the worlds' own default is 32 (config.WORLD_DEFAULTS)
    if eval_every is not None:
        fed["eval_every"] = eval_every
    evaluation: dict[str, Any] = {}
    if quick:
        fed["eval_every"] = 0
        evaluation = {"policies": list(QUICK_REGIMENS)}
    cfg = build_config(preset, {"seed": seed, "data": {"dataset": world}, "federation": fed,
                                "model": {**(model or {}), "transition": transition}, "evaluation": evaluation,
                                "out": str(out)})
    return cfg.model_copy(update={"state_dir": str(out / "state")})


def federated(cfg, engine: str = "inprocess") -> tuple[dict[str, Any], list[Any]]:
    """The run of ``cfg`` on ``engine`` (``inprocess``: the same ServerApp and ClientApps without Ray,
    ``engines.inprocess``; ``simulation``: Flower's simulation engine): its ``summary.json`` and each site's model
    as the run answered with it (:func:`reopened`: the selected round's Θc and Θs)."""
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.engines.simulation import run_simulated

    (run_inprocess if engine == "inprocess" else run_simulated)(cfg)
    _, summary, sims = reopened(Path(cfg.out))
    return summary, sims


def reopened(run_dir: Path, rollout: str | None = None) -> tuple[Any, dict[str, Any], list[Any]]:
    """A finished run folder of :func:`federated` (``--reuse``): its config, its ``summary.json`` and each site's
    model as ``fcd whatif`` reopens a run (``engines.whatif_run``): the folder's Θc, ``theta_c.npz`` (the selected
    round's), and each site's Θs **of that round** (``SiteRuntime.load_for_eval``), not its latest: where the round
    rule chose an earlier round, the last round's Θs beside the chosen round's Θc is a model no round trained.
    ``rollout``: the models' ``[model] rollout`` set to this (``--rescore``: a rollout setting does not change the
    trained numbers, ``model.simulate``), else the run's own."""
    from fcd_secure.apps.site import SiteRuntime, default_site_id
    from fcd_secure.apps.whatif_app import selected_round
    from fcd_secure.engines.whatif_run import open_run
    from fcd_secure.manifest import FULL, THETA_C

    cfg, theta = open_run(run_dir)
    if rollout is not None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"rollout": rollout})})
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    restore = selected_round(run_dir, cfg)
    part = THETA_C if cfg.federation.sync == "dss" else FULL
    sims = [SiteRuntime(cfg, default_site_id(i), i, cfg.state_root()).load_for_eval(theta, part, restore_round=restore)
            for i in range(cfg.data.n_sites)]
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
        cfg = run_config(world, args.preset, seed, args.rounds, folder, transition, args.quick, args.min_local_steps,
                         args.eval_every, dict(args.model))
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


#: ``--sdr-horizons``: the horizons (steps from t = 0) at which the sequential DR value is asked and scored
SDR_HORIZONS = (1, 2, 3, 5, 10)
#: rollouts of the oracle per logged history for its Q̂ (Monte-Carlo SE of a step's expected outcome ≤ 0.5/√64)
ORACLE_Q_ROLLOUTS = 64
#: the misspecification cases of issue 42 (Deliver 2): (Q̂, P) per case; "model" is the run's federated simulator
SDR_CASES = {"model Q̂, logged P": ("model", "logged"), "oracle Q̂, logged P": ("oracle", "logged"),
             "constant Q̂, logged P": ("constant", "logged"), "oracle Q̂, constant P": ("oracle", "constant"),
             "constant Q̂, constant P": ("constant", "constant")}
#: the wrong Q̂ (every step's expected outcome) and the wrong P (every logged action's propensity) of those cases
WRONG_Q, WRONG_P = 0.5, 0.5


def at_horizon(cfg, horizon: int):
    """``cfg`` asking its policies at ``horizon`` steps from t = 0 (``[evaluation] horizon``, what ``fcd whatif
    --horizon`` asks)."""
    return cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"horizon": int(horizon)})})


def product_policies(cfg, sims: list[Any], horizon: int) -> dict[str, Any]:
    """The product's what-if answer (``queries.registry.POLICY_VALUES``: the simulated values, their truth, the
    sequential DR value with its support rule) of one model per site at ``horizon``, merged as a run merges it."""
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.federation import learner
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.registry import POLICY_VALUES
    from fcd_secure.queries.request import request_from_config

    c = at_horizon(cfg, horizon)
    queries = (POLICY_VALUES,)
    parts = [site_metrics(sim, learner.load_site_data(c, i), c, full_eval_config(c), queries=queries)
             for i, sim in enumerate(sims)]
    return merge_site_metrics(parts, request=request_from_config(c), queries=queries).get("policies") or {}


def regimen_plan(pol: Any, sub: Any, a_off: int, a_on: int) -> np.ndarray:
    """The action a deterministic regimen takes at every step of every logged row, ``[n, L]`` (a_on where it gives
    a_on probability 1, else a_off: the paper's regimens take only the two anchors)."""
    n = sub.n
    on = np.full(n, a_on, dtype=np.int64)
    return np.stack([np.where(pol.prob(t, sub.Y[:, :t], sub.lengths, a_off, a_on, on) > 0.5, a_on, a_off)
                     for t in range(sub.L)], axis=1)


def oracle_step_values(oracle: Any, ids: np.ndarray, plan: np.ndarray, horizon: int, n_rollouts: int) -> np.ndarray:
    """The oracle's E[Y_s | logged history before t, the regimen from t on] for every start t < ``horizon`` and step
    t ≤ s < ``horizon``, ``[n, horizon (t), horizon (s)]`` (0 where s < t or s is padding). The oracle conditions on
    each entity's hidden parameters as well as its recorded history (``OracleWorld.regime_outcome_probs_of``): the
    iterated conditional expectation given a finer history, for which every correction term of the sequential DR
    still has mean zero whatever the weights (Bang & Robins 2005), so it is a right Q̂."""
    n = len(ids)
    H = min(int(horizon), plan.shape[1])
    out = np.zeros((n, H, H))
    for t in range(H):
        probs = oracle.regime_outcome_probs_of(ids, t, plan[:, t:H], n_rollouts)
        out[:, t, t:] = np.nan_to_num(probs, nan=0.0)
    return out


def case_return_to_go(kind: str, M: np.ndarray, oracle_eq: np.ndarray | None, horizon: int) -> np.ndarray:
    """V̂(h_t) = Q̂(h_t, π(h_t)) over the first ``horizon`` steps, ``[n, L]``, of a deterministic regimen: the oracle's
    (``oracle``) or :data:`WRONG_Q` at every remaining valid step (``constant``)."""
    n, L = M.shape
    H = min(int(horizon), L)
    v = np.zeros((n, L))
    Mh = M[:, :H].astype(np.float64)
    for t in range(H):
        if kind == "oracle":
            v[:, t] = (oracle_eq[:, t, t:H] * Mh[:, t:H]).sum(1)
        else:
            v[:, t] = WRONG_Q * Mh[:, t:H].sum(1)
    return v


def sdr_cases(cfg, horizons: tuple[int, ...], n_rollouts: int = ORACLE_Q_ROLLOUTS) -> dict[str, Any]:
    """The sequential DR value (``queries.sequential_dr.sequential_dr_per_entity``, the product's estimator) of each
    regimen at each horizon on every site's test rows, pooled, under the (Q̂, P) cases of :data:`SDR_CASES` other
    than the run's own Q̂: ``{(case, regimen, horizon): {estimate, low, high}}``, with the truth and the product's
    support rule (Kish ESS and mean of the logged-P weight products, ``queries.targeted.support_of``) per
    (regimen, horizon)."""
    from fcd_secure.data.policy import bind_policy, load_policy_refs
    from fcd_secure.evaluation.intervals import interval_from_sums, site_sums
    from fcd_secure.federation import learner
    from fcd_secure.queries.logged import target_probs
    from fcd_secure.queries.sequential_dr import sequential_dr_per_entity
    from fcd_secure.queries.targeted import final_weights, support_of

    Hmax = max(horizons)
    per: dict[tuple[str, str, int], list[np.ndarray]] = {}
    weights: dict[tuple[str, int], list[np.ndarray]] = {}
    oracle = None
    for i in range(cfg.data.n_sites):
        data = learner.load_site_data(cfg, i)
        sub, oracle = data.test, data.oracle
        ids = oracle.entity_ids(i, "test")
        a_off, a_on = int(data.anchors[0]), int(data.anchors[1])
        P_right = np.where(sub.M > 0, np.asarray(sub.P, np.float64), 1.0)
        P_wrong = np.where(sub.M > 0, WRONG_P, 1.0)
        for name in REGIMENS:
            pol = bind_policy(load_policy_refs([name])[0], sub)
            pi = target_probs(pol, sub, a_off, a_on)
            eq = oracle_step_values(oracle, ids, regimen_plan(pol, sub, a_off, a_on), Hmax, n_rollouts)
            for h in horizons:
                weights.setdefault((name, h), []).append(final_weights(sub, pi, h))
                for case, (qk, pk) in SDR_CASES.items():
                    if qk == "model":
                        continue
                    v = case_return_to_go(qk, sub.M, eq, h)
                    P = P_right if pk == "logged" else P_wrong
                    per.setdefault((case, name, h), []).append(
                        sequential_dr_per_entity(sub.Y, sub.M, P, pi, v, v, h))
    bound = {name: bind_policy(load_policy_refs([name])[0], learner.load_site_data(cfg, 0).test) for name in REGIMENS}
    truth = {name: dict(zip(horizons, (v for v, _se in oracle.true_policy_values_at(bound[name], None, "test",
                                                                                    horizons))))
             for name in REGIMENS}
    # the population value the interval's SE is for (a PATE, Imbens 2004): the same regimen over every site's
    # training entities, patients disjoint from the test rows drawn from the same sites; the test patients' own mean
    # above is a sample-average truth, which does not vary with the between-patient spread the SE includes
    population = {name: dict(zip(horizons, (v for v, _se in oracle.true_policy_values_at(bound[name], None, "train",
                                                                                         horizons))))
                  for name in REGIMENS}
    out: dict[str, Any] = {"truth": truth, "truth_population": population, "support": {}, "cases": {}}
    for (name, h), ws in weights.items():
        w = np.concatenate(ws)
        out["support"][f"{name}@{h}"] = support_of({"w.sw": float(w.sum()), "w.sww": float((w * w).sum())}, "w",
                                                   float(len(w)))
    for (case, name, h), drs in per.items():
        iv = interval_from_sums(site_sums("sdr", np.concatenate(drs)), "sdr", cfg.evaluation.level)
        out["cases"][f"{case}|{name}@{h}"] = {"estimate": iv.estimate, "low": iv.low, "high": iv.high}
    return out


def sdr_coverage_one(run_dir: Path, horizons: tuple[int, ...]) -> dict[str, Any]:
    """One finished run (``--reuse``d, never retrained) scored at each horizon: the product's sequential DR with its
    federated Q̂ (shown or withheld by its support rule) and the oracle/constant cases of :func:`sdr_cases`."""
    cfg, summary, sims = reopened(run_dir)
    res = sdr_cases(cfg, horizons)
    for h in horizons:
        t0 = time.perf_counter()
        pol = product_policies(cfg, sims, h)
        for name in REGIMENS:
            sd = (pol.get(name) or {}).get("sequential_dr") or {}
            shown = sd.get("estimate") is not None
            iv = sd if shown else (sd.get("withheld") or {})
            res["cases"][f"model Q̂, logged P|{name}@{h}"] = {
                "estimate": iv.get("estimate"), "low": iv.get("low"), "high": iv.get("high"), "shown": shown,
                "value_true": (pol.get(name) or {}).get("value_true"), "ess": sd.get("ess")}
        _status(f"{run_dir.name} h={h}: product's evaluation {time.perf_counter() - t0:.0f} s")
    res["run"] = run_dir.name
    res["world"], res["seed"] = cfg.data.dataset, cfg.seed
    return res


def sdr_coverage_table(results: list[dict[str, Any]], horizons: tuple[int, ...],
                       truth_key: str = "truth") -> dict[str, Any]:
    """Coverage of each case's 90 % intervals over runs × horizons × regimens (all, and where the product's
    support rule shows the value), per horizon and pooled, printed; returns the hits. ``truth_key``: ``"truth"``,
    the test patients' own mean, or ``"truth_population"``, the population value (:func:`sdr_cases`)."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    hits: dict[str, dict[str, list[bool]]] = {case: {"all": [], "shown": [], **{f"h{h}": [] for h in horizons}}
                                              for case in SDR_CASES}
    what = "the population value" if truth_key == "truth_population" else "the test patients' own mean"
    detail = Table(title=f"sequential DR at each horizon: truth ({what}), the product's value (federated Q̂) and "
                   "the cases")
    for col in ("run", "regimen", "h", "truth", "ESS", "shown", *SDR_CASES):
        detail.add_column(col, justify="right")
    seen: set[tuple[Any, ...]] = set()
    for r in results:
        if truth_key not in r:
            continue  # scored before the population truth was recorded (--reuse)
        for name in REGIMENS:
            for h in horizons:
                by_h, by_t = r[truth_key][name], r["truth"][name]
                if h not in by_h and str(h) not in by_h:
                    continue  # a run scored at fewer horizons
                truth = by_h[h] if h in by_h else by_h[str(h)]  # JSON keys (--reuse) are text
                test_truth = by_t[h] if h in by_t else by_t[str(h)]
                sup = r["support"][f"{name}@{h}"]
                # two regimens that act alike over the first h steps (always and early_on at h = 1, ...) are one
                # trial: the same truth and the same intervals, counted once
                key = (r["run"], h, test_truth, r["cases"][f"oracle Q̂, logged P|{name}@{h}"]["estimate"])
                if key in seen:
                    continue
                seen.add(key)
                cells = []
                for case in SDR_CASES:
                    c = r["cases"][f"{case}|{name}@{h}"]
                    if c["low"] is None:
                        # no interval to score: the product computes no sequential DR where no site's entity follows
                        # the regimen through the horizon (queries.sequential_dr.support_first_q); not a miss
                        cells.append("– (not computed)")
                        continue
                    ok = c["low"] <= truth <= c["high"]
                    hits[case]["all"].append(ok)
                    hits[case][f"h{h}"].append(ok)
                    if sup["supported"]:
                        hits[case]["shown"].append(ok)
                    cells.append(f"{_f(c['estimate'])} [{_f(c['low'])}, {_f(c['high'])}]" + ("" if ok else " ✗"))
                detail.add_row(r["run"], name, str(h), _f(truth), _f(sup["ess"], ".0f"), _yes(sup["supported"]),
                               *cells)
    con.print(detail)
    t = Table(title=f"coverage of the 90 % sequential DR intervals of {what} (target 85-95 %; Wilson 90 % CI)")
    # "every horizon" counts the trials with an interval: withheld values the product still computed, and none
    # where it computed nothing (every weight product 0 on every site)
    for col in ("case", "where the product shows it", "every horizon with an interval",
                *[f"h = {h}" for h in horizons]):
        t.add_column(col)
    for case, hh in hits.items():
        t.add_row(case, coverage_line(hh["shown"]), coverage_line(hh["all"]),
                  *[coverage_line(hh[f"h{h}"]) for h in horizons])
    con.print(t)
    return hits


#: ``--spearman``: resamples of the percentile bootstrap of Spearman's ρ over the candidates, and its level
SPEARMAN_BOOT, SPEARMAN_LEVEL = 2000, 0.9


def scored_rounds(run_dir: Path) -> tuple[Any, list[dict[str, Any]]]:
    """The config of a run folder and its scored rounds so far (``rounds.json`` of a finished run, else the
    ``rounds.csv`` it appends each round to: a run still training can be scored round by round)."""
    import csv

    from fcd_secure.config import RunConfig

    if (run_dir / "summary.json").is_file():
        from fcd_secure.engines.whatif_run import open_run

        cfg, _theta = open_run(run_dir)
        rows = json.loads((run_dir / "rounds.json").read_text(encoding="utf-8"))
    else:
        cfg = RunConfig.load(run_dir / "config.toml")
        with open(run_dir / "rounds.csv", encoding="utf-8", newline="") as fh:
            rows = [{k: (float(v) if k in ("nc_gap", "nc_max_z", "d1") and v not in ("", None) else v)
                     for k, v in r.items()} for r in csv.DictReader(fh)]
    for r in rows:
        r["round"] = int(r["round"])
    return cfg, [r for r in rows if r.get("nc_gap") not in (None, "")]


def candidates_of(run_dirs: list[Path], done: dict[tuple[str, int], dict[str, Any]] | None = None,
                  frozen: bool = False, checks: bool = True) -> list[dict[str, Any]]:
    """Every scored round of the finished runs ``run_dirs`` (one world, one seed: the same test rows) as a
    candidate: the natural-course figures the run printed for it (``rounds.json``: ``nc_gap``, the whole-horizon
    gap the round rule reads, and ``nc_max_z``) and its true whole-trajectory error: the mean over the four regimens
    of |simulated − true value| over every valid step from t = 0 on every test row, each site answering with the
    round's kept Θc and its own Θs kept at that round (``SiteRuntime.load_for_eval``, as ``fcd whatif`` restores a
    round), scored by the product's simulated values (``queries.policy_values.SimulatedValues``). ``frozen``: each
    round's models with their contexts frozen (:func:`frozen_contexts`) are a candidate too, their natural-course
    gap computed as a scored round computes it (``queries.natural_course.NaturalCourse`` on the sites' validation
    rows, the run's seed), keyed ``"<run>+frozen"``. ``checks``: also the truth-free checks ``--spearman`` compares
    (:func:`regimen_checks`, :func:`tilt_checks`); ``--rules`` needs only the truth."""
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.apps.site import default_site_id
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.natural_course import NaturalCourse
    from fcd_secure.queries.policy_values import PolicyValues, SimulatedValues
    from fcd_secure.queries.request import request_from_config
    from fcd_secure.queries.selection import KeptParams, RoundScore

    out: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        cfg, rows = scored_rounds(run_dir)
        state = Path(cfg.state_root())
        sites = [SiteRuntime(cfg, default_site_id(i), i, str(state)) for i in range(cfg.data.n_sites)]
        queries = (PolicyValues(parts=(SimulatedValues(),)),)
        for row in sorted(rows, key=lambda r: r["round"]):  # rising: a site not yet trained keeps its initial Θs
            t0 = time.perf_counter()
            rnd = int(row["round"])
            done = done or {}
            theta = KeptParams(state / "_server" / "selection").load(rnd)
            if (run_dir.name, rnd) in done:  # scored by an earlier call (--reuse)
                out.append(done[(run_dir.name, rnd)])
            else:
                parts = [site_metrics(rt.load_for_eval(theta, "theta_c", restore_round=rnd), rt.data, cfg,
                                      full_eval_config(cfg), queries=queries) for rt in sites]
                pol = merge_site_metrics(parts, request=request_from_config(cfg), queries=queries).get("policies") or {}
                errs = [abs(pol[n]["value_sim"] - pol[n]["value_true"]) for n in REGIMENS]
                out.append({"run": run_dir.name, "round": rnd, "nc_gap": row["nc_gap"],
                            "nc_max_z": row.get("nc_max_z"), "d1": row.get("d1"), "dh": row.get("dh"),
                            "true_error": float(np.mean(errs)),
                            "score": RoundScore.from_round(row).as_row() if row.get("selection") else None,
                            "values": {n: pol[n]["value_sim"] for n in REGIMENS},
                            "truth": {n: pol[n]["value_true"] for n in REGIMENS}})
            if frozen and (run_dir.name + "+frozen", rnd) in done:
                out.append(done[(run_dir.name + "+frozen", rnd)])
            elif frozen:
                sims = [frozen_contexts(rt.load_for_eval(theta, "theta_c", restore_round=rnd)) for rt in sites]
                scored = full_eval_config(cfg).model_copy(update={"quick": True, "keep_round": rnd})
                nc_q = (NaturalCourse(),)
                nc = merge_site_metrics([site_metrics(m, rt.data, cfg, scored, queries=nc_q)
                                         for m, rt in zip(sims, sites)], queries=nc_q).get("natural_course") or {}
                pol = merge_site_metrics([site_metrics(m, rt.data, cfg, full_eval_config(cfg), queries=queries)
                                          for m, rt in zip(sims, sites)], request=request_from_config(cfg),
                                         queries=queries).get("policies") or {}
                out.append({"run": run_dir.name + "+frozen", "round": rnd, "nc_gap": nc.get("mean_abs_gap"),
                            "nc_max_z": nc.get("max_abs_z"), "d1": None,
                            "true_error": float(np.mean([abs(pol[n]["value_sim"] - pol[n]["value_true"])
                                                         for n in REGIMENS])),
                            "values": {n: pol[n]["value_sim"] for n in REGIMENS},
                            "truth": {n: pol[n]["value_true"] for n in REGIMENS}})
            for cand in out[-2 if frozen else -1:] if checks else ():  # the checks --spearman reads, once each
                missing = [f for f, key in ((regimen_checks, "rs_step_gap"), (tilt_checks, "tilt_max_z"))
                           if key not in cand]
                if missing:
                    ms = [rt.load_for_eval(theta, "theta_c", restore_round=rnd) for rt in sites]
                    ms = [frozen_contexts(m) for m in ms] if cand["run"].endswith("+frozen") else ms
                    for check in missing:
                        cand.update(check(cfg, ms, sites, rnd))
            _status(f"{run_dir.name} round {rnd}: NC gap {row['nc_gap']:.4f}, true error {out[-1]['true_error']:.4f} "
                    f"({time.perf_counter() - t0:.0f} s)")
    return out


#: ``--rules``: the truth-free scores each run stored per scored round that the pooled Spearman table ranks by
STORED_SCORES = ("nc_gap", "nc_max_z", "d1", "dh")


def rules_table(run_dirs: list[Path]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """``--rules``: for each finished run, the round the product's rule picks with and without its natural-course
    gate (``queries.selection.choose_round``, ``natural_course_gate``), from the truth-free scores the run stored
    (``rounds.json``: ``selection`` and the scored round's ``natural_course.passes``), and each pick's true
    whole-trajectory figures (every kept round re-scored as :func:`candidates_of` scores it). Then, per world, the
    Spearman ρ of each stored score (:data:`STORED_SCORES`) against the true whole-trajectory error over every kept
    round of every run given (each against its own seed's truth): issue 42's ranking target read on the product's
    own rounds, no check recomputed. Printed; returned as ``(per run, per world)``."""
    from rich.console import Console
    from rich.table import Table

    from fcd_secure.queries.selection import RoundScore, choose_round

    con = Console(width=200)
    t = Table(title="the round rule with and without its natural-course gate: each pick's whole-trajectory figures "
                    "(value error / always − never error / true order)")
    for col in ("run", "rounds (NC passes)", "without the gate", "with the gate", "best kept round"):
        t.add_column(col)
    out = []
    pooled: dict[str, list[dict[str, Any]]] = {}
    for run_dir in run_dirs:
        cands = candidates_of([run_dir], checks=False)
        pooled.setdefault(run_dir.name.split("-seed")[0], []).extend(cands)
        scored = {c["round"]: {**scores(c["values"], c["truth"]), "nc_passes": (c.get("score") or {}).get("nc_passes")}
                  for c in cands}
        rs = [RoundScore.from_row(c["score"]) for c in cands if c.get("score")]
        last = max(scored)
        picks = {gate: choose_round(rs, last, natural_course_gate=gate)["round"] for gate in (False, True)}
        best = min(scored, key=lambda r: scored[r]["value_error"])

        def cell(r: int) -> str:
            s = scored[r]
            return f"{r}: {s['value_error']:.4f} / {s['effect_error']:.4f} / {_yes(s['ranked'])}"

        t.add_row(run_dir.name, " ".join(f"{r}({_yes(scored[r]['nc_passes'])})" for r in sorted(scored)),
                  cell(picks[False]), cell(picks[True]), cell(best))
        out.append({"run": run_dir.name, "rounds": scored, "pick_without_gate": picks[False],
                    "pick_with_gate": picks[True], "best": best})
    con.print(t)
    rho: dict[str, dict[str, Any]] = {}
    for world, cands in pooled.items():
        truth = [c["true_error"] for c in cands]
        rho[world] = {"n": len(cands)}
        for key in STORED_SCORES:
            r, lo, hi = spearman_ci([np.nan if c.get(key) is None else c[key] for c in cands], truth)
            rho[world][key] = {"rho": r, "low": lo, "high": hi}
            con.print(f"{world}: Spearman({key}, true whole-trajectory error) over the {len(cands)} kept rounds of "
                      f"{len({c['run'] for c in cands})} runs: {r:+.3f} ({SPEARMAN_LEVEL:.0%} bootstrap CI "
                      f"{lo:+.3f} to {hi:+.3f})")
    return out, rho


def regimen_checks(cfg: Any, sims: list[Any], sites: list[Any], rnd: int) -> dict[str, Any]:
    """The truth-free checks of one candidate as a scored round computes them (the sites' validation rows, the run's
    seed): the regimen-directed score check (``queries.regimen_scores``, on the natural course's rollout) and D_h
    (``queries.selection``, :data:`~fcd_secure.queries.selection.DH_HORIZON` steps), for every candidate alike (the
    contexts-frozen copies too)."""
    from fcd_secure.evaluation.discrepancy import HorizonDiscrepancySums
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.natural_course import NaturalCourse
    from fcd_secure.queries.regimen_scores import RegimenScores
    from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR
    from fcd_secure.queries.selection import DH_FIELDS, site_selection_sums

    scored = full_eval_config(cfg).model_copy(update={"quick": True, "keep_round": rnd})
    qs = (NaturalCourse(keep_scores=True), RegimenScores())
    ans = merge_site_metrics([site_metrics(m, rt.data, cfg, scored, queries=qs) for m, rt in zip(sims, sites)],
                             queries=qs)
    rs = ans.get("regimen_scores") or {}
    tot = {f: 0.0 for f in DH_FIELDS}
    for m, rt in zip(sims, sites):
        got = site_selection_sums(m, rt.data, cfg.model.outcome == "binary", MIN_COHORT_FLOOR, seed=int(cfg.seed))
        for f in DH_FIELDS:
            tot[f] += got[f"select.dh.{f}"]
    hs = HorizonDiscrepancySums(**{f: (int(round(v)) if f in ("n", "clipped") else v) for f, v in tot.items()})
    return {"rs_step_gap": rs.get("step_mean_abs_gap"), "rs_gap": rs.get("mean_abs_gap"),
            "rs_max_z": rs.get("max_abs_z"), "dh_val": hs.discrepancy().d1() if hs.n else None}


#: ``--spearman``: the finite tilts of the logging policy towards each anchor whose simulated whole-trajectory value
#: is compared with its sequential DR value on the validation rows (:func:`tilt_checks`): Kennedy's (2019)
#: incremental interventions, odds of a_on × 2 and × ½, and Díaz et al.'s (2023) share policies, a_on or a_off at
#: 20 % of the steps
TILTS = (("inc_on_x2", {"kind": "incremental", "delta": 2.0, "action": "anchor:on"}),
         ("inc_on_x0_5", {"kind": "incremental", "delta": 0.5, "action": "anchor:on"}),
         ("share_on_20", {"kind": "share", "share": 0.2, "action": "anchor:on"}),
         ("share_off_20", {"kind": "share", "share": 0.2, "action": "anchor:off"}))


def tilt_checks(cfg: Any, sims: list[Any], sites: list[Any], rnd: int) -> dict[str, Any]:
    """The finite-tilt check of one candidate on the sites' validation rows (the run's evaluation seed): for each
    policy of :data:`TILTS` over the whole trajectory, the simulator's plug-in value (``queries.policy_terms``' rollout
    from t = 0, the product's simulated value) against its sequential doubly robust value (``queries.sequential_dr``:
    the same simulator's history-conditioned Q̂ corrected with the logged propensities; Bang & Robins 2005). With the
    right propensities the DR value is consistent whatever the simulator, and a tilt's weights are ratios near 1, so
    its effective sample survives 30 steps (Kennedy 2019): the gap tests the simulator away from the logging policy,
    in the regimens' direction. Per tilt the gap, the DR value's SE, and the SE of the paired per-entity difference
    (simulated − DR: the noise both share drops out); summaries max and mean |z| over the tilts for each SE, and the
    mean |gap|. ``rnd`` is unused (the signature of :func:`regimen_checks`)."""
    from fcd_secure.data.policy import Policy
    from fcd_secure.evaluation.intervals import interval_from_sums, site_sums
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.federation import learner
    from fcd_secure.queries.base import SiteContext
    from fcd_secure.queries.evaluation import EVAL_SALT
    from fcd_secure.queries.policy_terms import rollouts
    from fcd_secure.queries.request import WhatIfRequest
    from fcd_secure.queries.sequential_dr import sdr_history_q, sequential_dr_per_entity
    from fcd_secure.queries.targeted import support_of

    pols = [Policy.model_validate({"name": n, "rule": rule}) for n, rule in TILTS]
    request = full_eval_config(cfg).model_copy(update={"whatif": WhatIfRequest(policies=pols, reference=pols[0].name)})
    got: dict[str, dict[str, list[np.ndarray]]] = {n: {"sim": [], "dr": [], "w": []} for n, _ in TILTS}
    for m, rt in zip(sims, sites):
        val = rt.data.validation
        ctx = SiteContext(model=m, data=rt.data, cfg=cfg, request=request, rows=np.arange(val.n), sub=val,
                          seed=learner.round_seed(cfg.seed, 0, rt.data.site_index, EVAL_SALT))
        terms = rollouts(ctx)
        hq = sdr_history_q(ctx, terms)
        for r, (q_hat, v_hat), w in zip(terms.policies, hq.qv, hq.weights):
            got[r.name]["sim"].append(r.value)
            got[r.name]["dr"].append(sequential_dr_per_entity(val.Y, val.M, val.P, r.pi, q_hat, v_hat, hq.horizon))
            got[r.name]["w"].append(w)
    per: dict[str, dict[str, float]] = {}
    for name, g in got.items():
        sim, dr, w = (np.concatenate(g[k]) for k in ("sim", "dr", "w"))
        iv = interval_from_sums(site_sums("dr", dr), "dr")
        pair = interval_from_sums(site_sums("d", sim - dr), "d")
        ess = support_of({"w.sw": float(w.sum()), "w.sww": float((w * w).sum())}, "w", float(len(w)))["ess"]
        per[name] = {"sim": float(sim.mean()), "dr": iv.estimate, "dr_se": iv.se, "gap": pair.estimate,
                     "pair_se": pair.se, "z_dr": pair.estimate / iv.se, "z_pair": pair.estimate / pair.se,
                     "ess": float(ess)}
    return {"tilts": per, **tilt_summaries(per)}


#: the tilts paired into a contrast towards a_on against away from it (:func:`tilt_summaries`)
TILT_PAIRS = (("inc_on_x2", "inc_on_x0_5"), ("share_on_20", "share_off_20"))


def tilt_summaries(per: dict[str, dict[str, float]]) -> dict[str, float]:
    """The finite-tilt check's summaries from its per-tilt figures (:func:`tilt_checks`): max and mean |z| over the
    tilts (z by the DR's SE, and by the paired SE: ``zp``), the mean |gap|, and for each pair of :data:`TILT_PAIRS`
    the gap of the contrast (simulated − DR of the tilt towards a_on less that of the tilt away from it: the level
    gap the natural course already reads cancels, the slope towards the regimens stays), its mean |·| over the pairs
    and max |z| by the conservative SE √(SE_on² + SE_off²) of the two paired SEs (their positive covariance over
    the shared rows is ignored)."""
    z_dr = [abs(p["z_dr"]) for p in per.values()]
    z_pair = [abs(p["z_pair"]) for p in per.values()]
    con = [(per[a]["gap"] - per[b]["gap"], math.hypot(per[a]["pair_se"], per[b]["pair_se"])) for a, b in TILT_PAIRS]
    return {"tilt_max_z": max(z_dr), "tilt_mean_z": float(np.mean(z_dr)), "tilt_max_zp": max(z_pair),
            "tilt_mean_zp": float(np.mean(z_pair)), "tilt_gap": float(np.mean([abs(p["gap"]) for p in per.values()])),
            "tilt_contrast_gap": float(np.mean([abs(g) for g, _ in con])),
            "tilt_contrast_z": max(abs(g) / se for g, se in con)}


def spearman_ci(a: list[float], b: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Spearman's ρ of ``a`` and ``b`` (``benchmarks/selection.py``'s) and its percentile bootstrap interval over
    the candidates (:data:`SPEARMAN_BOOT` resamples, level :data:`SPEARMAN_LEVEL`; Efron & Tibshirani 1993, ch. 13)."""
    from selection import spearman

    a_, b_ = np.asarray(a, float), np.asarray(b, float)
    rho = spearman(a_, b_)
    rng = np.random.default_rng(seed)
    boots = [spearman(a_[i], b_[i]) for i in (rng.integers(0, len(a_), len(a_)) for _ in range(SPEARMAN_BOOT))]
    lo, hi = np.nanquantile(boots, [(1 - SPEARMAN_LEVEL) / 2, (1 + SPEARMAN_LEVEL) / 2])
    return rho, float(lo), float(hi)


#: the finite-tilt check's summaries (:func:`tilt_checks`) that ``--spearman`` ranks the candidates by
TILT_KEYS = ("tilt_max_z", "tilt_mean_z", "tilt_max_zp", "tilt_mean_zp", "tilt_gap", "tilt_contrast_gap",
             "tilt_contrast_z")


def spearman_table(cands: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidates one by one and the Spearman ρ of the natural-course gap (and beside it of D1, of the regimen
    score check's per-step and whole-trajectory gaps and max |z|, and of D_h, :func:`regimen_checks`) against the
    true whole-trajectory error, printed (target: ρ ≥ 0.8 over ≥ 20 candidates)."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    t = Table(title="natural course against the truth, candidate by candidate (whole trajectory, test rows)")
    for col in ("run", "round", "NC gap", "NC max |z|", "D1", "RS step |gap|", "RS |gap|", "RS max |z|", "D_h",
                "tilt max |z|", "tilt mean |z| (paired)", "true error", *REGIMENS):
        t.add_column(col, justify="right")
    for c in sorted(cands, key=lambda c: c["nc_gap"]):
        t.add_row(c["run"], str(c["round"]), _f(c["nc_gap"], ".4f"), _f(c["nc_max_z"], ".2f"), _f(c["d1"], ".4f"),
                  _f(c.get("rs_step_gap"), ".4f"), _f(c.get("rs_gap"), ".4f"), _f(c.get("rs_max_z"), ".2f"),
                  _f(c.get("dh_val"), ".4f"), _f(c.get("tilt_max_z"), ".2f"), _f(c.get("tilt_mean_zp"), ".2f"),
                  _f(c["true_error"], ".4f"), *[_f(c["values"][n]) for n in REGIMENS])
    con.print(t)
    truth = [c["true_error"] for c in cands]
    out = {"n": len(cands)}
    for key in ("nc_gap", "nc_max_z", "d1", "rs_step_gap", "rs_gap", "rs_max_z", "dh_val", *TILT_KEYS):
        rho, lo, hi = spearman_ci([np.nan if c.get(key) is None else c[key] for c in cands], truth)
        out[key] = {"rho": rho, "low": lo, "high": hi}
        con.print(f"Spearman({key}, true whole-trajectory error) over {len(cands)} candidates: {rho:+.3f} "
                  f"({SPEARMAN_LEVEL:.0%} bootstrap CI {lo:+.3f} to {hi:+.3f})")
    met = len(cands) >= 20 and out["nc_gap"]["rho"] >= 0.8
    con.print(f"target (ρ of the NC gap ≥ 0.8 over ≥ 20 candidates): {'met' if met else 'missed'}")
    return out


def cost_run(rounds: int, out: Path) -> dict[str, Any]:
    """The README's main job (``fcd run --engine inprocess``: DKT-Synth, the default preset, 10 sites, secure
    aggregation) for ``rounds`` rounds, with the wall and thread-CPU seconds of each of issue 42's checks on the
    sites: the natural course (``queries.natural_course.NaturalCourse``), the sequential DR (``SequentialDR``, its
    history-conditioned rollouts included) and the horizon bounds that read its Q̂ (``HorizonSensitivity``), beside
    the whole-trajectory rollouts of the asked regimens (``SimulatedValues``) and each kind of evaluation as a whole
    (``queries.registry.site_sums``: plain quick, scored round, full). There is no setting that turns the checks
    off (the round rule reads the natural course), so their share is measured in the run: each ``site_sums`` is
    timed around the real call (the engine handles one message at a time, so the wall seconds add up)."""
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.queries import registry
    from fcd_secure.queries.natural_course import NaturalCourse
    from fcd_secure.queries.policy_values import SimulatedValues
    from fcd_secure.queries.sensitivity import HorizonSensitivity
    from fcd_secure.queries.sequential_dr import SequentialDR

    acc: dict[str, list[float]] = {}

    def timed(owner: Any, attr: str, label: Any) -> None:
        inner = getattr(owner, attr)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*a, **k)
            finally:
                key = label(*a) if callable(label) else label
                got = acc.setdefault(key, [0.0, 0.0, 0])
                got[0] += time.perf_counter() - t0
                got[1] += time.thread_time() - c0
                got[2] += 1

        setattr(owner, attr, wrapper)

    for cls, label in ((NaturalCourse, "natural course"), (SequentialDR, "sequential DR"),
                       (HorizonSensitivity, "horizon bounds (SDR's Q̂)"),
                       (SimulatedValues, "whole-trajectory rollouts of the regimens")):
        timed(cls, "site_sums", label)

    def kind(ctx: Any, *_: Any) -> str:
        r = ctx.request
        return ("evaluation: full" if not r.quick else
                "evaluation: scored round" if r.keep_round is not None else "evaluation: plain quick")

    timed(registry, "site_sums", kind)
    cfg = build_config("default", {"seed": 0, "federation": {"rounds": rounds}, "out": str(out)})
    cfg = cfg.model_copy(update={"state_dir": str(out / "state")})
    t0, c0 = time.perf_counter(), time.process_time()
    run_inprocess(cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"rounds": rounds, "dataset": cfg.data.dataset, "eval_every": cfg.federation.eval_every, "wall_s": wall,
            "process_cpu_s": cpu, "parts": {k: {"wall_s": v[0], "thread_cpu_s": v[1], "calls": v[2]}
                                            for k, v in acc.items()}}


def cost_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    t = Table(title=f"cost of the checks in the README's main job ({res['dataset']}, default preset, "
                    f"{res['rounds']} rounds, eval every {res['eval_every']}): wall {res['wall_s']:.0f} s, "
                    f"process CPU {res['process_cpu_s']:.0f} s")
    for col in ("part", "calls", "wall s", "share of the run's wall", "thread CPU s"):
        t.add_column(col, justify="right")
    for k, v in sorted(res["parts"].items()):
        t.add_row(k, str(v["calls"]), f"{v['wall_s']:.1f}", f"{v['wall_s'] / res['wall_s']:.1%}",
                  f"{v['thread_cpu_s']:.1f}")
    con.print(t)
    checks = sum(res["parts"].get(k, {}).get("wall_s", 0.0)
                 for k in ("natural course", "sequential DR", "horizon bounds (SDR's Q̂)"))
    con.print(f"issue 42's checks (natural course, sequential DR, its horizon bounds): {checks:.1f} s, "
              f"{checks / max(res['wall_s'] - checks, 1e-9):.1%} added to the run without them (target ≤ 25 %)")


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

    con = Console(width=200)
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
        # no interval shown anywhere (every value withheld): not measured, so neither met nor missed
        "sequential DR coverage": (0.85 <= sum(hits) / len(hits) <= 0.95) if hits else None,
        "natural course flags the broken simulator": all(
            max(b.get("y_z") or 0.0, b.get("a_z") or 0.0) >= 3.0 for b in broken),
    }
    for k, v in TARGETS.items():
        tg.add_row(k, v, _yes(met[k]))
    con.print(tg)
    con.print(f"wall {out['wall_s']:.0f} s")


def _model_key(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--model``: the value as JSON where it parses (numbers, booleans), else the string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", nargs="+", default=list(WORLDS), choices=WORLDS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--preset", default="default", help="the run preset (tiny | default | paper)")
    ap.add_argument("--rounds", type=int, default=None, help="federated rounds (default: the preset's)")
    ap.add_argument("--min-local-steps", type=int, default=32,
                    help="federation.min_local_steps of every federated run (default 32: the setting the issue-42 "
                    "figures of docs/benchmarks.md were measured with, ~11 passes a round on a 190-row site, and the "
                    "tumour and carry-over worlds' default since; 0: Table II's one pass)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="federation.eval_every of every federated run (default: the preset's; 1: every round is a "
                    "scored candidate, kept for --spearman)")
    ap.add_argument("--model", type=_model_key, action="append", default=[], metavar="KEY=VALUE",
                    help="a [model] key of every federated run (and so of the centralised rows), the value read as "
                    "JSON where it parses (e.g. --model free_running_steps=29)")
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
    ap.add_argument("--sdr-horizons", type=int, nargs="*", default=None,
                    help="score finished runs of --out (the first of --transitions, never retrained) at these "
                    f"horizons (none given: {' '.join(map(str, SDR_HORIZONS))}): the product's sequential DR with the "
                    "run's Q̂, and with the oracle's or a constant Q̂ and the logged or a constant P; coverage over "
                    "runs x horizons x regimens with its Wilson interval")
    ap.add_argument("--spearman", type=Path, nargs="+", default=None, metavar="RUN",
                    help="rank the scored rounds of these finished run folders (one world and seed; run with "
                    "--eval-every 1 to score every round) by their natural-course gap against their true "
                    "whole-trajectory error: the table candidate by candidate and Spearman's ρ with its bootstrap CI; "
                    "beside it the same for D1, the regimen-directed score check, D_h and the finite-tilt check "
                    "(validation rows)")
    ap.add_argument("--rules", type=Path, nargs="+", default=None, metavar="RUN",
                    help="for each finished run folder: the round the product's rule picks with and without its "
                    "natural-course gate, from the scores the run stored, and each pick's true whole-trajectory "
                    "figures (every kept round re-scored on the test rows); then, per world, the Spearman rho of "
                    "the stored NC gap, NC max |z|, D1 and D_h against the true error over all those rounds")
    ap.add_argument("--spearman-frozen", action="store_true",
                    help="with --spearman: each round's contexts-frozen copy is a candidate too")
    ap.add_argument("--cost", type=int, default=None, metavar="ROUNDS",
                    help="time issue 42's checks inside the README's main job (fcd run --engine inprocess, DKT-Synth, "
                    "default preset) of this many rounds, in --out")
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

    if args.cost:
        with tempfile.TemporaryDirectory(prefix="fcd-horizon-cost-") as tmp:
            res = cost_run(args.cost, (args.out or Path(tmp)) / "main-job")
        cost_table(res)
        if args.json:
            args.json.write_text(json.dumps({**report(), "cost": res}, indent=1, default=_plain), encoding="utf-8")
        return
    if args.rules:
        res, rho = rules_table(args.rules)
        if args.json:
            args.json.write_text(json.dumps({**report(), "rules": res, "rules_spearman": rho}, indent=1,
                                            default=_plain), encoding="utf-8")
        return
    if args.spearman:
        done = ({(c["run"], int(c["round"])): c for c in json.loads(args.json.read_text(encoding="utf-8"))["candidates"]}
                if args.reuse and args.json and args.json.is_file() else None)
        cands = candidates_of(args.spearman, done, args.spearman_frozen)
        rho = {"all": spearman_table(cands)}
        if args.spearman_frozen:  # the rounds alone too: the frozen copies are far off on both counts
            rho["rounds"] = spearman_table([c for c in cands if not c["run"].endswith("+frozen")])
        if args.json:
            args.json.write_text(json.dumps({**report(), "candidates": cands, "spearman": rho}, indent=1,
                                            default=_plain), encoding="utf-8")
        return
    if args.sdr_horizons is not None:
        horizons = tuple(args.sdr_horizons or SDR_HORIZONS)
        if args.out is None:
            ap.error("--sdr-horizons scores the finished runs of --out")
        prior = ({r["run"]: r for r in json.loads(args.json.read_text(encoding="utf-8"))["results"]}
                 if args.reuse and args.json and args.json.is_file() else {})
        for w in args.worlds:
            for seed in args.seeds:
                folder = args.out / f"{w}-seed{seed}-{args.transitions[0]}"
                if folder.name in prior:  # scored by an earlier call (--reuse)
                    results.append(prior[folder.name])
                    continue
                if not (folder / "summary.json").is_file():
                    _status(f"{folder}: no finished run, skipped")
                    continue
                results.append(sdr_coverage_one(folder, horizons))
                report()
        hits = sdr_coverage_table(results, horizons)
        hits_population = sdr_coverage_table(results, horizons, "truth_population")
        if args.json:
            args.json.write_text(json.dumps({**report(), "coverage": hits, "coverage_population": hits_population},
                                            indent=1, default=_plain), encoding="utf-8")
        return
    with tempfile.TemporaryDirectory(prefix="fcd-horizon-") as tmp:
        root = args.out or Path(tmp)
        for w in args.worlds:
            for seed in args.seeds:
                results.append(run_one(w, seed, args, root))
                report()
    print_tables(report())


if __name__ == "__main__":
    main()

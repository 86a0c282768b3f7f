"""DP-SGD benchmark: step time with and without DP-SGD on the same model, and utility at ε ∈ {1, 2, 4, 8, ∞}.

DESIGN "Numbers": "DP: step time with and without DP-SGD; ε per site after a run".

1. Step time. One FedCausalDiff (the DKT-Synth preset's dims), one fixed batch of B trajectories, Adam. Runners are
   interleaved in shuffled order and reported as medians (wall and CPU), because the machine is shared:
     * ``nodp``        — the objective without DP (batch-MMD L_align on), global-norm clipping;
     * ``nodp_dpobj``  — the same objective the DP run uses (L_align off / per-sample), no Opacus;
     * ``dp``          — Opacus hooks mode through ``DPSite.make_private``: per-sample grads, clip C, noise σ.
   The target is ``dp`` ≤ 3 × ``nodp_dpobj`` (same loss, so the ratio is the price of DP-SGD itself).
2. Utility. The pooled DKT-Synth training split as one site (record-level DP over all its trajectories), trained
   ``--epochs`` epochs at each ε through ``train_round_private`` (σ planned once for all epochs, Poisson, PRV),
   and ε = ∞ with ordinary training, with the centralised reference's seed rule and scored by its evaluation
   (``fcd_secure.experiments``: PEHE, |ATE err|, mean |value err| over never / always / early_on / late_on, factual
   AUC) against the oracle's ground truth. The utility-vs-ε curve ends with the check "PEHE at ε = 8 within 1.5× of
   non-DP". ``--levers`` adds ε = 8 runs with the levers that keep the guarantee: a larger expected batch (fewer,
   less noisy steps: σ falls with the sample rate), fewer epochs (fewer compositions), and other clipping norms
   C. (Exempting parameters from DP-SGD is not a lever: every released parameter is covered, dp-anchors §9.)

Run: ``.venv/bin/python benchmarks/dp.py [--preset default] [--epochs 4] [--json]``. Prints figures; asserts nothing.
``--quick`` (seconds; checks the script end to end): the tiny preset, 3 timing rounds, one epoch at ε ∈ {8, ∞}.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def step_times(preset: str, batch_size: int, rounds: int, seed: int, model: dict | None = None) -> dict:
    from fcd_secure.data.dkt_synth import DKTSynthConfig, generate
    from fcd_secure.data.schema import concat
    from fcd_secure.model.batch import dataset_tensors
    from fcd_secure.model.config import ModelConfig
    from fcd_secure.model.networks import FedCausalDiff
    from fcd_secure.model.training import batch_loss, make_optimizer
    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite
    from fcd_secure.privacy.ledger import dataset_fingerprint

    w = generate(DKTSynthConfig.from_preset(preset, seed=seed))
    train = concat(w.train, "pooled/train")
    n_sites = len(w.train)
    sub = train.subset(np.arange(batch_size))
    sub.meta["site"] = np.asarray(train.meta["site"])[:batch_size]  # subset() shares meta; keep labels per row
    batch = dataset_tensors(sub, None)
    cfg = ModelConfig(**{**(model or {}), "seed": seed})
    cfg_dp = cfg.model_copy(update={"dp_mode": True})
    base = FedCausalDiff.from_dims(cfg, train.dx, train.da, train.n_actions, n_sites)

    def plain(c: ModelConfig):
        m = copy.deepcopy(base)
        opt = make_optimizer(m, c)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss, _ = batch_loss(m, batch, c, n_sites)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), c.grad_clip or 1.0)
            opt.step()

        return step

    tmp = tempfile.mkdtemp(prefix="fcd_dp_bench_")
    dp_cfg = DPConfig(enabled=True, epsilon=8.0, max_noise_multiplier=1e3)
    site = DPSite(tmp, dataset_fingerprint(sub), dp_cfg, sub.n, planned_rounds=1, local_epochs=1, batch_size=batch_size)
    m_dp = copy.deepcopy(base)
    site.reserve_round(steps=1)  # q = 1: one reserved step is all the loader has; the guard is lifted below
    from torch.utils.data import DataLoader, TensorDataset

    _, dp_opt, _ = site.make_private(m_dp, make_optimizer(m_dp, cfg_dp), DataLoader(TensorDataset(*batch), batch_size=batch_size))
    dp_opt.step_hook = lambda _o: None  # timing only: the steps below are never released or accounted

    def dp_step() -> None:
        dp_opt.zero_grad(set_to_none=True)
        loss, _ = batch_loss(m_dp, batch, cfg_dp, n_sites)
        loss.backward()
        dp_opt.step()

    runners = {"nodp": plain(cfg), "nodp_dpobj": plain(cfg_dp), "dp": dp_step}
    wall = {k: [] for k in runners}
    cpu = {k: [] for k in runners}
    keys = list(runners)
    rng = random.Random(seed)
    for r in range(rounds + 2):
        rng.shuffle(keys)
        for k in keys:
            c0, t0 = time.process_time(), time.perf_counter()
            runners[k]()
            if r >= 2:  # two warm-up rounds
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
    med = {k: statistics.median(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "preset": preset, "batch_size": batch_size, "L": train.L, "rounds": rounds,
        "threads": torch.get_num_threads(),
        "wall_median_s": med, "cpu_median_s": cmed,
        "ratio_dp_vs_nodp_same_objective": med["dp"] / med["nodp_dpobj"],
        "ratio_dp_vs_nodp_paper_objective": med["dp"] / med["nodp"],
        "cpu_ratio_dp_vs_nodp_same_objective": cmed["dp"] / cmed["nodp_dpobj"],
    }


def utility(preset: str, epochs: int, eps_list: list[str], seed: int, batch_size: int, say, clip: float = 1.0,
            label: str = "", model: dict | None = None) -> dict:
    from fcd_secure.config import build_config
    from fcd_secure.data.schema import concat
    from fcd_secure.experiments.centralised import POOLED_SITE
    from fcd_secure.experiments.evaluate import evaluate_on_sites
    from fcd_secure.federation import learner
    from fcd_secure.model.baselines import FedCausalDiffSimulator
    from fcd_secure.model.training import site_objective, training_view
    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite, train_round_private
    from fcd_secure.privacy.ledger import dataset_fingerprint

    run_cfg = build_config(preset, {"seed": seed, "model": {**(model or {}), "batch_size": batch_size}})
    fd = learner.load_federated(run_cfg)
    train = concat(list(fd.train), "pooled/train")
    n_sites = len(fd.train)
    cfg = learner.model_config(run_cfg)
    rows = []
    for token in eps_list:
        t0 = time.perf_counter()
        # "inf": ordinary training with the run's objective; "inf-dpobj": no noise, no clipping, but the objective
        # DP uses (batch-coupled L_align off), which separates the cost of the objective from the cost of noise
        eps = float("inf") if token.startswith("inf") else float(token)
        info: dict = {"epsilon_cap": eps, "setting": token}
        c = cfg.model_copy(update={"dp_mode": token != "inf"})
        sim = FedCausalDiffSimulator.from_dims(c, train.dx, train.da, train.n_actions, n_sites)
        # the centralised reference's seed rule (fcd_secure.experiments.centralised), for every ε alike
        seeds = [learner.round_seed(seed, ep + 1, POOLED_SITE) for ep in range(epochs)]
        if np.isinf(eps):
            for s in seeds:
                fit = sim.train_site(train, None, n_sites, epochs=1, seed=s)
        else:
            dp = DPConfig(enabled=True, epsilon=eps, clip=clip)
            state = tempfile.mkdtemp(prefix="fcd_dp_bench_")
            site = DPSite(state, dataset_fingerprint(train), dp, train.n, planned_rounds=epochs, local_epochs=1,
                          batch_size=batch_size)
            objective = site_objective(train, cfg)  # as a site resolves model.ipw = 'auto' (learner.train_local_dp)
            for ep, s in enumerate(seeds):
                fit = train_round_private(site, sim.module, training_view(train, objective), objective, None, n_sites,
                                          epochs=1, seed=s, optimizer=sim.optimizer, round_id=ep + 1)
            spent, delta = site.spent()
            info.update(sigma=site.noise_multiplier, q=site.sample_rate, delta=delta, epsilon_spent=spent,
                        steps=epochs * site.steps_per_round)
        t1 = time.perf_counter()
        m = evaluate_on_sites(run_cfg, [sim] * n_sites)  # scored exactly like the centralised reference
        info.update(
            pehe=m.get("pehe"), ate_error=m.get("ate_error"), mean_value_error=m.get("value_error_mean"),
            value_error={k: d.get("value_error") for k, d in m.get("policies", {}).items()},
            factual_auc=m.get("factual_auc"), last_loss=fit.get("total"), train_s=t1 - t0,
            sim_s=time.perf_counter() - t1,
        )
        info.update(clip=clip, batch_size=batch_size, epochs=epochs, lever=label)
        say(f"{label + ' ' if label else ''}ε={token}: PEHE {info['pehe']:.4f}  |ATE err| {info['ate_error']:.4f}  mean |value err| "
            f"{info['mean_value_error']:.4f}  (train {info['train_s']:.0f}s)")
        rows.append(info)
    return {"preset": preset, "epochs": epochs, "n_train": train.n, "batch_size": batch_size, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="default", help="DKT-Synth preset (tiny, default, paper)")
    ap.add_argument("--epochs", type=int, default=4, help="training epochs per ε (same for every ε)")
    ap.add_argument("--eps", default="1,2,4,8,inf,inf-dpobj",
                    help="comma-separated ε caps; 'inf' = no DP; 'inf-dpobj' = no DP but the DP objective (L_align off)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--clip", type=float, default=1.0, help="per-sample clipping norm C of the curve")
    ap.add_argument("--levers", action="store_true",
                    help="also ε = 8 with batch ×4, half the epochs, and C ∈ {0.5, 2}")
    ap.add_argument("--timing-rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=json.loads, default={}, metavar="JSON",
                    help='model keys, e.g. \'{"ipw": "off"}\' for the paper\'s objective (default: the shipped one)')
    ap.add_argument("--skip-utility", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--quick", action="store_true", help="tiny preset, 3 timing rounds, 1 epoch at ε ∈ {8, inf}")
    a = ap.parse_args(argv)
    if a.quick:
        a.preset, a.timing_rounds, a.epochs, a.eps = "tiny", 3, 1, "8,inf"
    torch.set_num_threads(a.threads)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if a.json else (lambda m: print(m, flush=True))
    out: dict = {}
    if not a.skip_timing:
        t = step_times(a.preset, a.batch_size, a.timing_rounds, a.seed, a.model)
        out["step_time"] = t
        say("step time (median of interleaved rounds, B={batch_size}, L={L}, {threads} thread(s)):".format(**t))
        for k in ("nodp", "nodp_dpobj", "dp"):
            say(f"  {k:11s} wall {t['wall_median_s'][k] * 1e3:7.1f} ms   cpu {t['cpu_median_s'][k] * 1e3:7.1f} ms")
        say(f"  DP / non-DP (same objective): {t['ratio_dp_vs_nodp_same_objective']:.2f}x wall, "
            f"{t['cpu_ratio_dp_vs_nodp_same_objective']:.2f}x cpu   (target ≤ 3x)")
        say(f"  DP / non-DP (the non-DP objective, batch MMD): {t['ratio_dp_vs_nodp_paper_objective']:.2f}x wall")
    if not a.skip_utility:
        eps_list = [x.strip() for x in a.eps.split(",")]
        u = utility(a.preset, a.epochs, eps_list, a.seed, a.batch_size, say, clip=a.clip, model=a.model)
        out["utility"] = u
        say("utility vs ε (PEHE, |ATE err|, mean |value err|):")
        for r in u["rows"]:
            say(f"  ε {r['setting']:>9s}  PEHE {r['pehe']:.4f}  |ATE err| {r['ate_error']:.4f}  "
                f"value {r['mean_value_error'] if r['mean_value_error'] is None else round(r['mean_value_error'], 4)}")
        by = {r["setting"]: r for r in u["rows"]}
        ref = by.get("inf", by.get("inf-dpobj"))
        if "8" in by and ref is not None:
            ratio = by["8"]["pehe"] / ref["pehe"]
            out["eps8_pehe_ratio"] = ratio
            say(f"PEHE at ε = 8 / non-DP = {by['8']['pehe']:.4f} / {ref['pehe']:.4f} = {ratio:.2f}× "
                f"(target ≤ 1.5×: {'met' if ratio <= 1.5 else 'NOT met'})")
        if a.levers:
            levers = [("batch×4", dict(batch_size=4 * a.batch_size)), ("epochs/2", dict(epochs=max(1, a.epochs // 2))),
                      ("C=0.5", dict(clip=0.5)), ("C=2", dict(clip=2.0))]
            out["levers"] = []
            for name, kw in levers:
                args = dict(preset=a.preset, epochs=a.epochs, eps_list=["8"], seed=a.seed, batch_size=a.batch_size,
                            say=say, clip=a.clip, label=name, model=a.model)
                args.update(kw)
                row = utility(**args)["rows"][0]
                out["levers"].append(row)
                if ref is not None:
                    say(f"  lever {name}: PEHE {row['pehe']:.4f} = {row['pehe'] / ref['pehe']:.2f}× non-DP "
                        f"(σ {row.get('sigma', float('nan')):.2f}, q {row.get('q', float('nan')):.3f})")
    if a.json:
        print(json.dumps(out, indent=2, default=float))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

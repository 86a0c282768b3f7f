"""Centralised reference training on DKT-Synth (all sites pooled), scored against the oracle's ground truth.

This is the yardstick the federated run is compared with (DESIGN.md "Numbers": "against a centralised-training
reference"): Fed-CausalDiff and two simple baselines (``baselines.py``) trained on the same pooled training split
with the same seed, each asked the same do-questions on the pooled test split:

* PEHE and |ATE error| of τ_i = always-a_on minus always-a_off from ``world.anchor_step`` over ``world.horizon``;
* |policy value error| for the four default policies (never, always, early_on, late_on) from t = 0;
* factual AUC of the one-step outcome prediction on the test split.

Metrics come from ``fcd_secure.evaluation.metrics`` (one definition for the whole project).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from fcd_secure.data.schema import SiteDataset, concat
from fcd_secure.model.baselines import (
    NaiveOutcomeModel,
    estimate_effects_naive,
    gformula_config,
    simulate_naive,
    train_naive,
)
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.networks import FedCausalDiff, unwrap
from fcd_secure.model.simulate import estimate_effects, simulate_policy
from fcd_secure.model.training import dataset_tensors, make_optimizer, train_local

METHODS = ("fed_causaldiff", "gformula", "naive")
#: Epochs of the centralised default: ~1–2 min of Fed-CausalDiff training on one core for DKT-Synth "default".
DEFAULT_EPOCHS = {"tiny": 3, "default": 15, "paper": 6}

Progress = Callable[[str], None]


@torch.no_grad()
def factual_probs(model: torch.nn.Module, ds: SiteDataset) -> np.ndarray:
    """One-step-ahead E[Y_t | history before t, A_t, T_t (logged)] for every step, [n, L] (padding included)."""
    core = unwrap(model)
    core.eval()
    X, A, T, Y, _, _ = dataset_tensors(ds, 0)
    Kc, Ks = core.encode(X, A, T, Y)
    return core.outcome_mean(torch.cat([Kc, Ks], -1), A, T).numpy()


@torch.no_grad()
def factual_probs_naive(model: NaiveOutcomeModel, ds: SiteDataset) -> np.ndarray:
    X, A, T, Y, _, _ = dataset_tensors(ds, 0)
    Xe, y_prev, first = model.step_inputs(X, Y)
    return torch.sigmoid(model(Xe, A, T, y_prev, first)).numpy()


def run_centralised(
    preset: str = "default",
    seed: int = 0,
    epochs: int | None = None,
    cfg: ModelConfig | None = None,
    n_sites: int = 10,
    n_samples: int = 16,
    policy_samples: int = 8,
    methods: tuple[str, ...] = METHODS,
    progress: Progress | None = None,
    world: Any = None,
) -> dict[str, Any]:
    """Train each of ``methods`` on the pooled DKT-Synth training split and score it. Returns a JSON-able dict."""
    from fcd_secure.data.dkt_synth import DKTSynthConfig, generate
    from fcd_secure.data.policy import default_policies
    from fcd_secure.evaluation.metrics import ate_error, factual_auc, pehe, value_error

    say = progress or (lambda _m: None)
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {METHODS}")
    epochs = int(epochs if epochs is not None else DEFAULT_EPOCHS.get(preset, 10))
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    cfg = (cfg or ModelConfig()).model_copy(update={"seed": seed})

    t0 = time.perf_counter()
    w = world if world is not None else generate(DKTSynthConfig.from_preset(preset, n_sites=n_sites, seed=seed))
    train, test = concat(w.train, "pooled/train"), concat(w.test, "pooled/test")
    policies = default_policies()
    anchors = tuple(int(a) for a in w.anchors)
    say(f"DKT-Synth {preset}: {train.n} train / {test.n} test trajectories, L={train.L}, anchors={anchors}")
    tau = np.asarray(w.true_effects(None, "test"), dtype=np.float64)
    true_values = {p.name: float(w.true_policy_value(p, None, "test")[0]) for p in policies}
    truth_s = time.perf_counter() - t0

    out: dict[str, Any] = {
        "preset": preset, "seed": seed, "epochs": epochs, "n_sites": len(w.train),
        "n_train": train.n, "n_test": test.n, "anchors": list(anchors),
        "anchor_step": int(w.anchor_step), "horizon": int(w.horizon),
        "truth": {"ate": float(tau.mean()), "values": true_values, "seconds": truth_s},
        "config": cfg.model_dump(), "methods": {},
    }

    def score(name: str, eff: np.ndarray, values: dict[str, float], probs: np.ndarray, train_s: float, sim_s: float,
              extra: dict[str, Any]) -> None:
        verr = {k: value_error(values[k], true_values[k]) for k in true_values}
        out["methods"][name] = {
            "pehe": pehe(eff, tau),
            "ate_error": ate_error(eff, tau),
            "value_error": verr,
            "mean_value_error": float(np.mean(list(verr.values()))),
            "ate_hat": float(np.mean(eff)),
            "values": values,
            "factual_auc": factual_auc(test.Y, probs, test.M),
            "train_seconds": train_s,
            "sim_seconds": sim_s,
            **extra,
        }
        m = out["methods"][name]
        say(f"{name}: PEHE {m['pehe']:.4f}  |ATE err| {m['ate_error']:.4f}  mean |value err| {m['mean_value_error']:.4f}")

    for name in methods:
        t1 = time.perf_counter()
        if name == "naive":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                nm = NaiveOutcomeModel(train.dx, train.da, train.n_actions, hidden=cfg.mlp_hidden,
                                       action_emb=cfg.action_emb, outcome=cfg.outcome)
            fit = train_naive(nm, train, epochs, seed, lr=cfg.lr, batch_size=cfg.batch_size)
            t2 = time.perf_counter()
            eff = estimate_effects_naive(nm, test, anchors, w.anchor_step, w.horizon, n_samples, seed)
            values = {p.name: simulate_naive(nm, test, p, policy_samples, seed, anchors=anchors).value for p in policies}
            score(name, eff, values, factual_probs_naive(nm, test), t2 - t1, time.perf_counter() - t2, {"fit": fit})
            continue
        c = cfg if name == "fed_causaldiff" else gformula_config(cfg)
        model = FedCausalDiff.from_dims(c, train.dx, train.da, train.n_actions, len(w.train))
        opt = make_optimizer(model, c)
        fit: dict[str, float] = {}
        for ep in range(epochs):
            fit = train_local(model, train, c, None, len(w.train), epochs=1, seed=seed * 1000 + ep, optimizer=opt)
            say(f"{name} epoch {ep + 1}/{epochs}: loss {fit['total']:.4f}")
        t2 = time.perf_counter()
        eff = estimate_effects(model, test, anchors, w.anchor_step, w.horizon, n_samples, seed)
        values = {p.name: simulate_policy(model, test, p, anchors, policy_samples, seed).value for p in policies}
        score(name, eff, values, factual_probs(model, test), t2 - t1, time.perf_counter() - t2, {"last_epoch": fit})
    return out

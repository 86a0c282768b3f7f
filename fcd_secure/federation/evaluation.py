"""Federated evaluation: each site evaluates Θc + its own Θs on its test split; only additive sums leave.

What a site sends (``site_metrics``), all sums over its own test trajectories, so that the server's merge
(``merge_site_metrics``) gives exactly the pooled numbers (``fcd_secure.evaluation.metrics``, ``.ope``):

* ``effect.*``: ``EffectStats`` (n, Σ(τ̂−τ)², Στ̂, Στ) against the DKT-Synth oracle's true effects → PEHE, |ATE err|
  (paper Table III);
* ``policy.<name>.*``: Σ simulated value, Σ true value (oracle), n → |policy value error| (Table III "Value");
* ``ope.<name>.<estimator>.*``: the ``OPEResult`` sums of IPW, SNIPW and per-decision DR computed on the site from
  its own logged propensities (which never leave; DESIGN trap 5) and the ESS ingredients Σw, Σw²; once over the full
  horizon and once over the first ``evaluation.ope_horizon`` steps (``<estimator>_h<H>``), where a deterministic
  policy still has logged support;
* ``auc.pos`` / ``auc.neg``: a 100-cell histogram of the model's one-step probability of the factual outcome by
  class (``AUCStats``) → factual AUC (paper §IV-C).

The model side of DR: V̂_t is the model's return-to-go under π from a do-simulation started at t = 0 and Q̂_t = V̂_t.
For the deterministic policies evaluated here Q̂_t only enters the per-decision DR sum multiplied by the weight
w_{0:t}, which is zero unless the logged action equals π's action, so setting Q̂ = V̂ is the model's estimate of
exactly the needed quantity (up to V̂ not being re-conditioned on the logged history at t).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.federation.learner import SiteData
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import EVALUATE_MESSAGE_TYPE, REC_CONFIG, REC_EVAL, REC_GLOBAL, arrays_to_record

AUC_BINS = 100
#: A fixed evaluation seed stream (salt) so that every evaluation of a run uses the same random numbers.
EVAL_SALT = 0xE7A1


def _rows(n: int, max_rows: int | None) -> np.ndarray:
    return np.arange(n if max_rows is None else min(n, int(max_rows)), dtype=np.int64)


def factual_probs(model, ds) -> np.ndarray:
    """The model's E[Y_t | history before t, A_t, logged T_t], shape [n, L] (``Simulator.factual_probs``)."""
    from fcd_secure.model.baselines import as_simulator  # noqa: PLC0415

    return as_simulator(model).factual_probs(ds)


def site_metrics(model, data: SiteData, cfg: RunConfig, eval_config: dict[str, Any]) -> dict[str, Any]:
    """Aggregate-only evaluation of one site (module docstring). Values are floats or lists of floats."""
    from fcd_secure.data.policy import default_policies  # noqa: PLC0415
    from fcd_secure.evaluation.metrics import AUCStats, EffectStats  # noqa: PLC0415
    from fcd_secure.evaluation.ope import IPW, SNIPW, PerDecisionDR, estimate_on_site  # noqa: PLC0415
    from fcd_secure.model.simulate import estimate_effects, simulate_policy  # noqa: PLC0415

    quick = bool(eval_config.get("quick", False))
    n_samples = int(eval_config.get("n-samples", cfg.evaluation.n_samples))
    max_rows = eval_config.get("max-rows")
    max_rows = None if max_rows in (None, 0, -1) else int(max_rows)
    seed = learner.round_seed(cfg.seed, 0, data.site_index, EVAL_SALT)
    test = data.test
    rows = _rows(test.n, max_rows)
    sub = test if len(rows) == test.n else test.subset(rows)
    out: dict[str, Any] = {"n_test": float(sub.n)}
    oracle = data.oracle

    if oracle is not None:
        tau = np.asarray(oracle.true_effects(data.site_index, "test", rows), dtype=np.float64)
        tau_hat = estimate_effects(model, sub, data.anchors, oracle.anchor_step, oracle.horizon, n_samples, seed)
        es = EffectStats.from_arrays(tau_hat, tau)
        out.update({"effect.n": float(es.n), "effect.sse": es.sse, "effect.sum_hat": es.sum_hat, "effect.sum_true": es.sum_true})

    p_fact = factual_probs(model, sub)
    if cfg.model.outcome == "binary":
        try:
            auc = AUCStats.from_scores(sub.Y, np.clip(p_fact, 0.0, 1.0), sub.M, bins=AUC_BINS)
            out["auc.pos"] = [float(v) for v in auc.pos]
            out["auc.neg"] = [float(v) for v in auc.neg]
        except ValueError:
            pass  # a site whose test outcomes are all one class contributes nothing to the AUC

    if quick:
        return out

    a_off, a_on = data.anchors
    lengths = sub.lengths
    for pol in default_policies():
        sim = simulate_policy(model, sub, pol, data.anchors, n_samples, seed)
        n = float(sub.n)
        out[f"policy.{pol.name}.n"] = n
        out[f"policy.{pol.name}.sim_sum"] = float(sim.value) * n
        if oracle is not None and len(rows) == test.n:
            v_true, _se = oracle.true_policy_value(pol, data.site_index, "test")
            out[f"policy.{pol.name}.true_sum"] = float(v_true) * n
        if sub.P is not None:
            pi = np.stack(
                [pol.prob(t, sub.Y[:, :t], lengths, a_off, a_on, sub.T[:, t]) for t in range(sub.L)], axis=1
            )
            step_v = np.asarray(sim.probs, dtype=np.float64).mean(1)  # [n, H] expected outcome under π
            H = min(step_v.shape[1], sub.L)
            contrib = step_v[:, :H] * sub.M[:, :H]
            h_ope = cfg.evaluation.ope_horizon
            # the full horizon, and a truncated one where deterministic policies still have logged support
            for suffix, hor in (("", None),) + (((f"_h{h_ope}", h_ope),) if h_ope and h_ope < sub.L else ()):
                Hh = H if hor is None else min(H, hor)
                v_hat = np.zeros((sub.n, sub.L))
                v_hat[:, :Hh] = np.cumsum(contrib[:, :Hh][:, ::-1], axis=1)[:, ::-1]  # return-to-go Σ_{t≤t'<Hh}
                for name, cls in (("ipw", IPW), ("snipw", SNIPW), ("dr", PerDecisionDR)):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # support warnings are reported through the merged result
                        r = estimate_on_site(cls(horizon=hor), sub, pi=pi, q_hat=v_hat, v_hat=v_hat)
                    key = f"ope.{pol.name}.{name}{suffix}"
                    out[f"{key}.n"] = float(r.n)
                    out[f"{key}.sum_value"] = float(r.sum_value)
                    out[f"{key}.sum_weight"] = float(r.sum_weight)
                    out[f"{key}.sum_weight_sq"] = float(r.sum_weight_sq)
                    out[f"{key}.n_consistent"] = float(r.n_consistent)
                    out[f"{key}.finite"] = 1.0 if math.isfinite(r.sum_value) else 0.0
    return out


def add_sums(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Element-wise sum of site dicts (scalars and equal-length lists); a key missing at a site counts as absent."""
    total: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for p in parts:
        for k, v in p.items():
            if isinstance(v, (list, tuple, np.ndarray)):
                arr = np.asarray(v, dtype=np.float64)
                total[k] = arr if k not in total else total[k] + arr
            else:
                total[k] = float(v) + float(total.get(k, 0.0))
            counts[k] = counts.get(k, 0) + 1
    total["_sites"] = len(parts)
    total["_counts"] = counts
    return total


def merge_site_metrics(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled metrics from per-site sums (exact: the numbers equal those of the concatenated test sets)."""
    from fcd_secure.evaluation.metrics import AUCStats, EffectStats  # noqa: PLC0415
    from fcd_secure.evaluation.ope import OPEResult, combine  # noqa: PLC0415

    s = add_sums(parts)
    res: dict[str, Any] = {"sites_evaluated": len(parts), "n_test": s.get("n_test")}
    if s.get("effect.n"):
        es = EffectStats(int(s["effect.n"]), s["effect.sse"], s["effect.sum_hat"], s["effect.sum_true"])
        res["pehe"] = es.pehe()
        res["ate_error"] = es.ate_error()
        res["ate_hat"] = es.sum_hat / es.n
        res["ate_true"] = es.sum_true / es.n
    if "auc.pos" in s:
        try:
            res["factual_auc"] = AUCStats(pos=s["auc.pos"].astype(np.int64), neg=s["auc.neg"].astype(np.int64)).auc()
        except ValueError:
            pass
    policies = sorted({k.split(".")[1] for k in s if k.startswith("policy.")})
    per_policy: dict[str, dict[str, Any]] = {}
    for name in policies:
        n = s[f"policy.{name}.n"]
        d: dict[str, Any] = {"value_sim": s[f"policy.{name}.sim_sum"] / n}
        # the true value only when every site reported it (a partial truth would bias the error)
        if s["_counts"].get(f"policy.{name}.true_sum") == len(parts):
            d["value_true"] = s[f"policy.{name}.true_sum"] / n
            d["value_error"] = abs(d["value_sim"] - d["value_true"])
        ests = sorted({k.split(".")[2] for k in s if k.startswith(f"ope.{name}.")}, key=lambda e: (len(e), e))
        for est in ests:  # ipw, snipw, dr, then their truncated-horizon forms (ipw_h2, ...)
            key = f"ope.{name}.{est}"
            if f"{key}.n" not in s:
                continue
            summed = OPEResult(
                estimator=est.split("_h")[0],  # the estimator class; '_h<H>' only names the truncated horizon
                value=float("nan"),
                n=int(s[f"{key}.n"]),
                ess=float("nan"),
                n_consistent=int(s[f"{key}.n_consistent"]),
                warning=None,
                sum_value=s[f"{key}.sum_value"],
                sum_weight=s[f"{key}.sum_weight"],
                sum_weight_sq=s[f"{key}.sum_weight_sq"],
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no support is reported in the result's 'warning' field
                pooled = combine([summed])  # the sums are already pooled over sites: combine finishes them
            d[est] = {"value": pooled.value, "ess": pooled.ess, "n_consistent": pooled.n_consistent, "warning": pooled.warning}
        per_policy[name] = d
    if per_policy:
        res["policies"] = per_policy
        errs = [d["value_error"] for d in per_policy.values() if "value_error" in d]
        if errs:
            res["value_error_mean"] = float(np.mean(errs))
    return res


def evaluate_federated(
    comm: Comm, node_ids: list[int], theta: dict[str, np.ndarray], cfg: RunConfig, part: str, *, quick: bool, sites=None
) -> dict[str, Any]:
    """Ask every site to evaluate ``theta`` (+ its own Θs) and merge the sums; failed sites are listed, not fatal."""
    ev = cfg.evaluation
    conf = {
        "quick": quick,
        "part": part,
        "n-samples": ev.quick_n_samples if quick else ev.n_samples,
        "max-rows": (ev.quick_max_rows if quick else ev.max_rows) or -1,
    }
    content = RecordDict({REC_GLOBAL: arrays_to_record(theta), REC_CONFIG: ConfigRecord(conf)})
    replies = comm.send(node_ids, EVALUATE_MESSAGE_TYPE, content, cfg.federation.round_timeout_s)
    parts, failed = [], []
    for nid in node_ids:
        rep = replies.get(nid)
        if rep is None or rep.has_error():
            failed.append(comm.site_of.get(nid, str(nid)))
            continue
        parts.append({k: (list(v) if isinstance(v, list) else v) for k, v in rep.content[REC_EVAL].items()})
    if not parts:
        return {"failed_sites": failed}
    merged = merge_site_metrics(parts)
    merged["failed_sites"] = failed
    return merged

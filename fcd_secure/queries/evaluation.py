"""Federated evaluation: each site evaluates Θc + its own Θs on its test split; only additive sums leave.

Which rows a site evaluates is the site's choice (``queries.cohort``, through ``SiteRuntime.evaluate``): the
request's ``max-rows`` is only a request. In secure mode the sums travel through secure aggregation
(``queries.secure_evaluation``) and the server merges only the consortium's totals (:func:`merge_totals`).

What a site sends (``site_metrics``), all sums over its own test trajectories, so that the server's merge
(``merge_site_metrics``) gives exactly the pooled numbers (``fcd_secure.evaluation.metrics``, ``.ope``):

* ``effect.*``: ``EffectStats`` (n, Σ(τ̂−τ)², Στ̂, Στ) against the DKT-Synth oracle's true effects → PEHE, |ATE err|
  (paper Table III);
* ``auc.pos`` / ``auc.neg``: a 100-cell histogram of the model's one-step probability of the factual outcome by
  class (``AUCStats``) → factual AUC (paper §IV-C);
* outside the cheap evaluations during training: the policy sums of a what-if question (``queries.whatif``):
  per policy the simulated value (and the oracle's), its OPE estimates on the site's own propensities (which never
  leave; DESIGN trap 5), and n, Σx, Σx² of the value and of the contrast to the reference policy (the intervals).
  The question rides in the request's ``whatif`` config entry (the run's ``[evaluation]`` policies by default), so
  its sums take whatever transport the evaluation sums take.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.federation.learner import SiteData
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import EVALUATE_MESSAGE_TYPE, REC_CONFIG, REC_EVAL, REC_GLOBAL, global_to_record
from fcd_secure.queries.dr_learner import beta_from_config, fit_totals, merge_effects, site_effect_sums
from fcd_secure.queries.selection import RoundScore
from fcd_secure.queries.targeted import merge_one_step, one_step_pair, one_step_sums, one_step_truth
from fcd_secure.queries.whatif import (
    WHATIF_KEY,
    WhatIfRequest,
    action_labels,
    context_columns,
    merge_policy_sums,
    request_from_config,
    site_policy_sums,
)

AUC_BINS = 100
#: A fixed evaluation seed stream (salt) so that every evaluation of a run uses the same random numbers.
EVAL_SALT = 0xE7A1


def _rows(n: int, max_rows: int | None) -> np.ndarray:
    return np.arange(n if max_rows is None else min(n, int(max_rows)), dtype=np.int64)


def factual_probs(model, ds) -> np.ndarray:
    """The model's E[Y_t | history before t, A_t, logged T_t], shape [n, L] (``Simulator.factual_probs``)."""
    return model.factual_probs(ds)


def site_metrics(
    model, data: SiteData, cfg: RunConfig, eval_config: dict[str, Any], rows: np.ndarray | None = None, site_dir=None,
    questions=None,
) -> dict[str, Any]:
    """Aggregate-only evaluation of one site (module docstring). Values are floats or lists of floats.

    Args:
        model: the model to evaluate (global Θc and the site's own Θs).
        data: the site's data.
        cfg: the run config.
        eval_config: ``quick``, ``n-samples``, the what-if question and, when ``rows`` is not given, ``max-rows``
            (the first rows).
        rows: the test rows to evaluate (a federated site passes the cohort it chose, ``queries.cohort``).
        site_dir: the site's own state folder: a what-if question writes its per-entity file there.
        questions: the site's question budget (``federation.site_policy.QuestionPolicy``; ``queries.whatif
            .admit_question``); None outside a site.
    """
    from fcd_secure.evaluation.metrics import AUCStats, EffectStats  # noqa: PLC0415

    quick = bool(eval_config.get("quick", False))
    n_samples = int(eval_config.get("n-samples", cfg.evaluation.n_samples))
    max_rows = eval_config.get("max-rows")
    max_rows = None if max_rows in (None, 0, -1) else int(max_rows)
    seed = learner.round_seed(cfg.seed, 0, data.site_index, EVAL_SALT)
    test = data.test
    rows = _rows(test.n, max_rows) if rows is None else np.asarray(rows, dtype=np.int64)
    sub = test if len(rows) == test.n else test.subset(rows)
    out: dict[str, Any] = {"n_test": float(sub.n)}
    oracle = data.oracle

    if oracle is not None:
        tau = np.asarray(oracle.true_effects(data.site_index, "test", rows), dtype=np.float64)
        tau_hat = model.estimate_effects(sub, data.anchors, oracle.anchor_step, oracle.horizon, n_samples, seed)
        es = EffectStats.from_arrays(tau_hat, tau)
        out.update({f"effect.{k}": float(v) for k, v in es.to_dict().items()})
        # how many of these entities follow each anchor regime over the effect window: the effect is identified from
        # the logs only where enough do; elsewhere it is extrapolation (docs/fidelity.md)
        from fcd_secure.data.policy import anchor_regime_support  # noqa: PLC0415

        sup = anchor_regime_support(sub.T, sub.M > 0, data.anchors, oracle.anchor_step, oracle.horizon)
        out["effect.regime_off"] = float(sup["a_off"]["whole"])
        out["effect.regime_on"] = float(sup["a_on"]["whole"])

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

    # the identified one-step effect at every decision step (queries.targeted), on the same rows
    beta = beta_from_config(eval_config)  # the DR-learner fitted on the sites' validation rows (queries.dr_learner)
    truth = (one_step_truth(oracle, data.site_index, rows, sub.L, data.anchors)
             if oracle is not None and (sub.P is not None or beta is not None) else None)
    # one pass of the model's one-step predictions on the test rows serves both answers
    pair = one_step_pair(model, sub, data.anchors) if sub.n and (sub.P is not None or beta is not None) else None
    out.update(one_step_sums(model, sub, data.anchors, truth, pair))
    if beta is not None:
        out.update(site_effect_sums(model, sub, data.anchors, beta, truth, pair))
    raw = eval_config.get(WHATIF_KEY)
    request = WhatIfRequest.from_json(str(raw)) if raw else request_from_config(cfg)
    out.update(site_policy_sums(model, sub, data, cfg, request, seed, n_samples, len(rows) == test.n, site_dir,
                                questions))
    return out


def effect_support(s: dict[str, Any]) -> dict[str, Any]:
    """The anchor regimes' support behind PEHE and the ATE error: how many evaluated entities follow "always a_off" and
    "always a_on" over the whole effect window, and whether that identifies the effect (both at least the support
    floor of ``queries.targeted``) or leaves it an extrapolation that no method can validate from these logs."""
    from fcd_secure.queries.targeted import MIN_SUPPORT_ESS  # noqa: PLC0415

    off, on = int(round(s["effect.regime_off"])), int(round(s["effect.regime_on"]))
    identified = min(off, on) >= MIN_SUPPORT_ESS
    return {"a_off": off, "a_on": on, "n": int(round(s["effect.n"])), "identified": identified,
            "label": "identified" if identified else "extrapolation"}


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


def merge_site_metrics(
    parts: list[dict[str, Any]], request: WhatIfRequest | None = None, action_names: list[str] | None = None,
    binary: bool = True,
) -> dict[str, Any]:
    """Pooled metrics from per-site sums (exact: the numbers equal those of the concatenated test sets); the policy
    part (values, intervals, contrasts to ``request``'s reference, anchors) is ``whatif.merge_policy_sums``."""
    return merge_totals(add_sums(parts), request, action_names, binary)


def merge_totals(
    s: dict[str, Any], request: WhatIfRequest | None = None, action_names: list[str] | None = None,
    binary: bool = True, dr_fit_steps: int = 0,
) -> dict[str, Any]:
    """Pooled metrics from the consortium's totals of the sites' sums.

    Args:
        s: :func:`add_sums` of the sites' dicts, or the same totals decoded from secure aggregation: every key's sum,
            plus ``_sites`` (how many sites were summed) and ``_counts`` (how many sites reported each key).
        request: the what-if question asked (its reference policy for the contrasts).
        action_names: the action labels of the run (for the anchors).
        binary: the outcome is binary (identified estimates are kept in [0, 1], effects in [−1, 1]).
        dr_fit_steps: the validation steps the DR-learner's β was fitted on (``queries.dr_learner.solve``'s ``n``),
            which its intercept's re-fit pools with the test steps (``queries.dr_learner.merge_effects``).
    """
    from fcd_secure.evaluation.metrics import AUCStats, EffectStats  # noqa: PLC0415

    n_parts = int(s["_sites"])
    res: dict[str, Any] = {"sites_evaluated": n_parts, "n_test": s.get("n_test")}
    if s.get("effect.n"):
        es = EffectStats.from_sums(s)
        res["pehe"] = es.pehe()
        res["effect_skill"] = es.skill_figures()
        res["ate_error"] = es.ate_error()
        res["ate_hat"] = es.sum_hat / es.n
        res["ate_true"] = es.sum_true / es.n
        if "effect.regime_on" in s:
            res["effect_support"] = effect_support(s)
    if "auc.pos" in s:
        try:
            res["factual_auc"] = AUCStats(pos=np.rint(s["auc.pos"]).astype(np.int64), neg=np.rint(s["auc.neg"]).astype(np.int64)).auc()
        except ValueError:
            pass
    res.update(merge_policy_sums(s, n_parts, request, action_names, binary))
    one_step = merge_one_step(s, request.level if request is not None else 0.9, binary)
    if one_step is not None:
        res["one_step_effect"] = one_step
    dr = merge_effects(s, dr_fit_steps)
    if dr is not None:
        res["dr_learner"] = dr
    return res


def coverage(sites: list[str], failed: list[str], declined: list[str], n_entities: float | None,
             aborted: bool = False) -> dict[str, Any]:
    """Which sites and how many entities an evaluation's answers cover, written beside every answer.

    Args:
        sites: every site of the run the evaluation asked.
        failed: sites that failed (or did not answer).
        declined: sites that declined under their cohort rules (a test split below the floor, a repeated cohort).
        n_entities: the test entities summed over the sites covered (None: no sum was revealed).
        aborted: no sum was revealed at all (a secure evaluation that could not run).

    Returns:
        ``{"sites_asked", "sites_covered", "n_sites_covered", "n_entities", "declined", "failed", "complete",
        "warning"}``: ``complete`` is false, and ``warning`` says so naming the sites left out, whenever an answer
        covers fewer sites than the run (``fcd run`` / ``fcd whatif`` then exit 7, ``cli.envelope.EXIT_INCOMPLETE``).
    """
    out_ = set(failed) | set(declined)
    covered = [] if aborted or n_entities is None else [s for s in sites if s not in out_]
    left = [s for s in sites if s not in covered]
    warning = None
    if left:
        why = [f"{s} (declined under its evaluation cohort rules)" for s in declined if s in left]
        why += [f"{s} (failed or did not answer)" for s in failed if s in left and s not in declined]
        why += [f"{s} (no sum revealed)" for s in left if s not in out_]
        warning = (f"the answers cover {len(covered)} of {len(sites)} sites"
                   + (f" ({int(round(n_entities))} test entities)" if covered and n_entities is not None else "")
                   + "; left out: " + ", ".join(why))
    return {
        "sites_asked": list(sites),
        "sites_covered": covered,
        "n_sites_covered": len(covered),
        "n_entities": None if n_entities is None or not covered else int(round(float(n_entities))),
        "declined": list(declined),
        "failed": [s for s in failed if s not in declined],
        "complete": not left,
        "warning": warning,
    }


def evaluate_federated(
    comm: Comm,
    node_ids: list[int],
    theta: dict[str, np.ndarray],
    cfg: RunConfig,
    part: str,
    *,
    quick: bool,
    sites=None,
    whatif: WhatIfRequest | None = None,
    secure=None,
    round_id: int = 0,
    extra: dict[str, Any] | None = None,
    dr_fit_steps: int = 0,
) -> dict[str, Any]:
    """Ask every site to evaluate ``theta`` (+ its own Θs) and merge the sums; failed sites are listed, not fatal,
    and so are the sites that declined under their cohort rules (``declined_sites``, e.g. a test split smaller than
    the cohort floor of ``federation.site_policy``).

    A full (not ``quick``) evaluation asks the what-if question ``whatif`` (default: the run's ``[evaluation]``
    policies, :func:`~fcd_secure.queries.whatif.request_from_config`).

    Args:
        comm: the server's door to the sites.
        node_ids: the sites.
        theta: the global parameters.
        cfg: the run config (its ``[evaluation]`` section is the request; each site chooses its own cohort).
        part: the synchronised part (``theta_c``, or ``full`` in the w/o-DSS ablation).
        quick: the cheap evaluation during training (effects and AUC only).
        sites: unused (kept for callers that pass the site list).
        whatif: the what-if question of a full evaluation.
        secure: a ``queries.secure_evaluation.SecureEvaluation``: the sums then travel through secure
            aggregation and only the consortium's totals reach the server (secure mode).
        round_id: the evaluation's protocol round under ``secure``.
        extra: more request fields (the consortium's standardisation statistics, ``queries.secure_stats``).
        dr_fit_steps: passed to :func:`merge_totals` (the DR-learner's validation steps).
    """
    ev = cfg.evaluation
    conf = {
        "quick": quick,
        "part": part,
        "n-samples": ev.quick_n_samples if quick else ev.n_samples,
        "max-rows": (ev.quick_max_rows if quick else ev.max_rows) or -1,
    }
    if not quick:
        whatif = whatif or request_from_config(cfg)
        conf[WHATIF_KEY] = whatif.to_json()
    n_declined = len(comm.declined)

    def split(failed: list[str]) -> dict[str, list[str]]:
        # a site that declined under its cohort rules did not fail: its policy kept it out of the sums
        declined = [r.site_id for r in comm.declined[n_declined:]]
        return {"failed_sites": [s for s in failed if s not in declined], "declined_sites": declined}

    conf.update(extra or {})
    everyone = [comm.site_of.get(nid, str(nid)) for nid in node_ids]
    if secure is not None:
        totals, failed, aborted = secure.totals(comm, node_ids, theta, conf, round_id)
        if totals is None:
            out = split(failed)
            if out["declined_sites"] and len(node_ids) - len(out["declined_sites"]) < cfg.secagg.min_sites:
                # the declines left fewer sites than secure aggregation needs, so no sum could be revealed: the
                # others did not fail, they were left without a quorum
                out["failed_sites"] = []
            return {**out, "secure": True, "aborted": aborted,
                    "coverage": coverage(everyone, out["failed_sites"], out["declined_sites"], None, aborted=True)}
    else:
        content = RecordDict({REC_GLOBAL: global_to_record(theta), REC_CONFIG: ConfigRecord(conf)})
        replies = comm.send(node_ids, EVALUATE_MESSAGE_TYPE, content, cfg.federation.round_timeout_s)
        parts, failed, named = [], [], []
        for nid in node_ids:
            rep = replies.get(nid)
            if rep is None or rep.has_error():
                failed.append(comm.site_of.get(nid, str(nid)))
                continue
            parts.append({k: (list(v) if isinstance(v, list) else v) for k, v in rep.content[REC_EVAL].items()})
            named.append(comm.site_of.get(nid, str(nid)))
        if not parts:
            out = split(failed)
            return {**out, "coverage": coverage(everyone, out["failed_sites"], out["declined_sites"], None)}
        totals = add_sums(parts)
    merged = merge_totals(totals, whatif, None if quick else action_labels(cfg), cfg.model.outcome == "binary",
                          dr_fit_steps)
    if "select.d1.n" in totals:  # a scored round (queries.selection): the consortium's D1 and validation fit
        score = RoundScore.from_totals(round_id, totals, int(totals["_sites"]))
        merged["selection"] = score.as_row() if score is not None else None
        merged["dr_learner_fit"] = fit_totals(totals)  # the DR-learner's sums of this round (queries.dr_learner)
    if not quick and "contexts" in merged:
        merged["contexts"].update(context_columns(cfg))
    merged.update(split(failed))
    merged["coverage"] = coverage(everyone, merged["failed_sites"], merged["declined_sites"], totals.get("n_test"))
    for name, d in (merged.get("policies") or {}).items():
        if d.get("n_sites_without_support"):
            # plain replies show which sites' logs never follow the policy; secure aggregation only how many
            d["sites_without_support"] = (
                None if secure is not None else
                [site for site, p in zip(named, parts) if p.get(f"whatif.support.{name}.none")]
            )
    if secure is not None:
        merged["secure"] = True
    return merged

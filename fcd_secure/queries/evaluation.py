"""Federated evaluation: each site evaluates Θc + its own Θs on its test split; only additive sums leave.

A site reads the server's typed request (``queries.request.EvaluationRequest``), chooses its own rows
(``queries.cohort``, through ``SiteRuntime.evaluate``: the request's ``max_rows`` is only a request) and runs every
registered query on them (:func:`site_metrics`; ``queries.registry``). The server sends the request, gathers the
consortium's totals (in clear under plain aggregation, through secure aggregation otherwise, where no per-site sum
reaches it) and merges them (:func:`merge_totals`): the numbers equal those of the concatenated test sets. Every
answer says which sites and entities it covers (:func:`coverage`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fcd_secure.audit.rules import REFUSAL_RULES
from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.federation.learner import SiteData
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import EVALUATE_MESSAGE_TYPE, REC_CONFIG, REC_EVAL, REC_GLOBAL, global_to_record
from fcd_secure.queries import registry
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.declared import declared_confounding
from fcd_secure.queries.request import EvaluationRequest, WhatIfRequest, request_from_config
from fcd_secure.queries.vocabulary import action_labels, context_columns

#: A fixed evaluation seed stream (salt) so that every evaluation of a run uses the same random numbers.
EVAL_SALT = 0xE7A1


def site_metrics(
    model, data: SiteData, cfg: RunConfig, request: EvaluationRequest, rows: np.ndarray | None = None,
    site_dir: str | Path | None = None, questions=None, *, seed: int | None = None,
    queries: Iterable[Query] = registry.QUERIES,
) -> SiteSums:
    """One site's sums for ``request`` (every applicable registered query). Values are floats or lists of floats.

    Args:
        model: the model to evaluate (global Θc and the site's own Θs).
        data: the site's data.
        cfg: the run config.
        request: the evaluation request (a full one without a question asks the run's ``[evaluation]`` policies).
        rows: the test rows to evaluate (a federated site passes the cohort it chose, ``queries.cohort``); default
            the first ``request.max_rows``.
        site_dir: the site's own state folder: a what-if question writes its per-entity file there.
        questions: the site's question budget (``federation.site_policy.QuestionPolicy``); None outside a site.
        seed: the evaluation seed (default: the run's fixed evaluation stream of this site).
        queries: the queries to answer (default: every registered one; a test or benchmark may ask one alone).
    """
    if not request.quick and request.whatif is None:
        request = request.model_copy(update={"whatif": request_from_config(cfg)})
    test = data.test
    if rows is None:
        rows = np.arange(test.n if request.max_rows is None else min(test.n, request.max_rows), dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    ctx = SiteContext(model=model, data=data, cfg=cfg, request=request, rows=rows,
                      sub=test if len(rows) == test.n else test.subset(rows),
                      seed=learner.round_seed(cfg.seed, 0, data.site_index, EVAL_SALT) if seed is None else int(seed),
                      site_dir=None if site_dir is None else Path(site_dir), questions=questions)
    return registry.site_sums(ctx, queries)


def merge_site_metrics(parts: list[SiteSums], request: WhatIfRequest | None = None,
                       action_names: list[str] | None = None, binary: bool = True,
                       queries: Iterable[Query] = registry.QUERIES,
                       unrecorded_confounding: dict[str, str] | None = None) -> dict[str, Any]:
    """Pooled metrics from per-site sums (exact: the numbers equal those of the concatenated test sets);
    ``unrecorded_confounding``: the run's declaration (``queries.declared.declared_confounding``)."""
    return registry.merge(Totals.of_sites(parts), MergeContext(request, action_names, binary,
                                                               unrecorded_confounding=unrecorded_confounding), queries)


def merge_totals(totals: Totals, ctx: MergeContext) -> dict[str, Any]:
    """The consortium's answer from its totals (every registered query's merge, ``queries.registry``)."""
    return registry.merge(totals, ctx)


def coverage(sites: list[str], failed: list[str], declined: list[str], n_entities: float | None,
             aborted: bool = False, rules: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Which sites and how many entities an evaluation's answers cover, written beside every answer.

    Args:
        sites: every site of the run the evaluation asked.
        failed: sites that failed (or did not answer).
        declined: sites that declined under their cohort rules (a test split below the floor, a repeated cohort).
        n_entities: the test entities summed over the sites covered (None: no sum was revealed).
        aborted: no sum was revealed at all (a secure evaluation that could not run).
        rules: the rule each declining site named (``federation.messaging.declined_rule``; default: the cohort rules).

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
        def declined_why(site: str) -> str:
            rule = (rules or {}).get(site)
            if rule in (None, "eval_cohort"):
                return f"{site} (declined under its evaluation cohort rules)"
            return f"{site} (declined under rule '{rule}': {REFUSAL_RULES.get(str(rule), '')})"

        why = [declined_why(s) for s in declined if s in left]
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
    request: EvaluationRequest,
    *,
    secure=None,
    round_id: int = 0,
    dr_fit_steps: int = 0,
) -> dict[str, Any]:
    """Ask every site to evaluate ``theta`` (+ its own Θs) for ``request`` and merge the sums; failed sites are
    listed, not fatal, and so are the sites that declined under their cohort rules (``declined_sites``, e.g. a test
    split smaller than the cohort floor of ``federation.site_policy``).

    Args:
        comm: the server's door to the sites.
        node_ids: the sites.
        theta: the global parameters.
        cfg: the run config.
        request: what the sites are asked (``EvaluationRequest.for_run``); each site chooses its own cohort.
        secure: a ``SecureEvaluation``: the sums then travel through secure aggregation and only the consortium's
            totals reach the server (secure mode).
        round_id: the evaluation's protocol round under ``secure``.
        dr_fit_steps: the DR-learner's validation steps (its intercept's re-fit, ``queries.dr_learner``).
    """
    quick, whatif = request.quick, request.whatif
    conf = request.to_config()
    n_declined = len(comm.declined)

    def split(failed: list[str]) -> dict[str, list[str]]:
        # a site that declined under its cohort rules did not fail: its policy kept it out of the sums
        recs = comm.declined[n_declined:]
        declined = [r.site_id for r in recs]
        out = {"failed_sites": [s for s in failed if s not in declined], "declined_sites": declined}
        if recs:  # the rule each declining site named (all it says): the operator learns who and under which rule
            out["declined_rules"] = {r.site_id: r.rule for r in recs}
        return out

    everyone = [comm.site_of.get(nid, str(nid)) for nid in node_ids]
    parts: list[SiteSums] = []
    named: list[str] = []
    if secure is not None:
        totals, failed, aborted = secure.totals(comm, node_ids, theta, conf, round_id)
        if totals is None:
            out = split(failed)
            if out["declined_sites"] and len(node_ids) - len(out["declined_sites"]) < cfg.secagg.min_sites:
                # the declines left fewer sites than secure aggregation needs, so no sum could be revealed: the
                # others did not fail, they were left without a quorum
                out["failed_sites"] = []
            return {**out, "secure": True, "aborted": aborted,
                    "coverage": coverage(everyone, out["failed_sites"], out["declined_sites"], None, aborted=True,
                                         rules=out.get("declined_rules"))}
        if not isinstance(totals, Totals):
            totals = Totals({k: v for k, v in totals.items() if k not in ("_sites", "_counts")},
                            int(totals["_sites"]), totals.get("_counts"))
    else:
        content = RecordDict({REC_GLOBAL: global_to_record(theta), REC_CONFIG: ConfigRecord(conf)})
        replies = comm.send(node_ids, EVALUATE_MESSAGE_TYPE, content, cfg.federation.round_timeout_s)
        failed = []
        for nid in node_ids:
            rep = replies.get(nid)
            if rep is None or rep.has_error():
                failed.append(comm.site_of.get(nid, str(nid)))
                continue
            parts.append({k: (list(v) if isinstance(v, list) else v) for k, v in rep.content[REC_EVAL].items()})
            named.append(comm.site_of.get(nid, str(nid)))
        if not parts:
            out = split(failed)
            return {**out, "coverage": coverage(everyone, out["failed_sites"], out["declined_sites"], None,
                                                rules=out.get("declined_rules"))}
        totals = Totals.of_sites(parts)
    merged = merge_totals(totals, MergeContext(whatif, None if quick else action_labels(cfg),
                                               cfg.model.outcome == "binary", dr_fit_steps, round_id,
                                               None if quick else declared_confounding(cfg),
                                               cfg.evaluation.behaviour_model))
    if not quick and "contexts" in merged:
        merged["contexts"].update(context_columns(cfg))
    merged.update(split(failed))
    merged["coverage"] = coverage(everyone, merged["failed_sites"], merged["declined_sites"], totals.get("n_test"),
                                  rules=merged.get("declined_rules"))
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

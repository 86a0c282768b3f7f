"""Federated evaluation through secure aggregation: the server learns only the consortium's totals (P7, P22).

The same protocol as Θc (``federation.secure.flow.secure_sum``), with a second vector
(``federation.secure.eval_vector``):

1. ``train.secagg_evaluate``: the global Θc and the evaluation request go to every site; each evaluates on the cohort
   it chooses (``queries.cohort``), keeps its sums in node memory and replies with their schema (key names and
   lengths, no values);
2. the server forms the union of the schemas and starts a secure round among the sites that answered, sending the
   union with the first stage; each site encodes its sums exactly on that layout;
3. the unmasked sum gives, per key, the total over the sites and how many sites had the key; the server computes the
   pooled metrics from these totals (``queries.evaluation.merge_totals``), exactly as from per-site sums.

Nothing per site reaches the server or its ledger: the uplinks are the schema and the protocol's opaque bytes. A
secure evaluation that cannot run (fewer sites than the policy's minimum, or an aborted protocol) reports no
metrics, never a partial clear-text fallback.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fcd_secure.aggregation.secagg import SecAggPolicy
from fcd_secure.federation.secure.eval_vector import (
    TENSOR,
    EvalLayout,
    EvalVectorError,
    decode_sums,
    schema_from_bytes,
    schema_to_bytes,
    union_schema,
)
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import (
    REC_CONFIG,
    REC_GLOBAL,
    REC_SECAGG,
    SECAGG_EVAL_LAYOUT_FIELD,
    SECAGG_EVALUATE_STAGE,
    SECAGG_FIELD,
    global_to_record,
    secagg_message_type,
)
from fcd_secure.federation.secure.flow import SecureSumAborted, secure_sum
from fcd_secure.federation.secure.setup import ROSTER_FILE, load_roster
from fcd_secure.manifest import Manifest

if TYPE_CHECKING:  # pragma: no cover
    from fcd_secure.config import RunConfig

log = logging.getLogger("fcd_secure.secagg")


def secure_evaluation_for(cfg: RunConfig, manifest: Manifest) -> "SecureEvaluation | None":
    """The secure evaluation of a run in secure mode (with the consortium roster when its state root holds one), or
    ``None`` for a plain run."""
    if not cfg.federation.secure_aggregation:
        return None
    root = cfg.state_root()
    roster_path = root / ROSTER_FILE if root is not None else None
    roster = load_roster(roster_path) if roster_path is not None and roster_path.exists() else None
    return SecureEvaluation(manifest, cfg.secagg, timeout_s=cfg.federation.round_timeout_s, roster=roster)


class SecureEvaluation:
    """Server side of secure federated evaluation.

    Args:
        manifest: the server's manifest (sites sign the hash of the Θc they evaluated, P12).
        policy: the secure-aggregation parameters the server proposes.
        timeout_s: how long the sites have to evaluate.
        session_id: the protocol session of this run's evaluations (apart from training's).
        roster: the consortium roster, when the server holds it (misbehaving sites are then named).
    """

    def __init__(
        self,
        manifest: Manifest,
        policy: SecAggPolicy,
        *,
        timeout_s: float = 600.0,
        session_id: bytes | None = None,
        roster: dict[str, bytes] | None = None,
    ) -> None:
        self.manifest = manifest
        self.roster = roster
        self.policy = policy
        self.timeout_s = float(timeout_s)
        self.session_id = session_id if session_id is not None else os.urandom(16)
        self.last_report: dict[str, Any] = {}

    def totals(
        self, comm: Comm, node_ids: list[int], theta: dict[str, np.ndarray], conf: dict[str, Any], round_id: int
    ) -> tuple[dict[str, Any] | None, list[str], str | None]:
        """Evaluate ``theta`` at every site and unmask the consortium's totals of their sums.

        Args:
            comm: the server's door to the sites.
            node_ids: the sites to evaluate at.
            theta: the global parameters.
            conf: the evaluation request (``quick``, ``part``, ``n-samples``, ``max-rows``, the what-if question).
            round_id: the evaluation's protocol round (increasing over a run; sites refuse a repeat).

        Returns:
            ``(totals, failed sites, None)`` with the totals as ``queries.evaluation.merge_totals`` reads them, or
            ``(None, every site, reason)`` when the secure round could not run.
        """
        self.last_report = {"selected": len(node_ids)}
        content = RecordDict(
            {REC_GLOBAL: global_to_record(theta), REC_CONFIG: ConfigRecord({**conf, "eval-round": int(round_id)})}
        )
        replies = comm.send(node_ids, secagg_message_type(SECAGG_EVALUATE_STAGE), content, self.timeout_s)
        ready: list[int] = []
        schemas = []
        for nid in node_ids:
            rep = replies.get(nid)
            if rep is None or rep.has_error() or REC_SECAGG not in rep.content:
                continue
            try:
                schemas.append(schema_from_bytes(bytes(rep.content[REC_SECAGG][SECAGG_FIELD])))
            except (EvalVectorError, KeyError, TypeError):
                continue
            ready.append(nid)
        site = comm.site_of.get
        failed = [site(n, str(n)) for n in node_ids if n not in ready]
        try:
            union = union_schema(schemas)
            layout = EvalLayout.of(union, self.policy)
            summed = secure_sum(
                comm, ready, self.policy, layout.vector_layout(), round_id=int(round_id), session_id=self.session_id,
                message_round=comm.round, report=self.last_report, roster=self.roster,
                first_stage_extra={SECAGG_EVAL_LAYOUT_FIELD: schema_to_bytes(union)},
            )
        except (SecureSumAborted, EvalVectorError) as exc:
            reason = getattr(exc, "reason", str(exc))
            log.warning("secure evaluation (round %d) did not run: %s", round_id, reason)
            return None, [site(n, str(n)) for n in node_ids], reason
        agg = summed.aggregate
        # the decoder returns Σ_i word_i * max_weight / (scale * Σ n_i); the word sums are exact integers below 2**31
        factor = self.policy.max_weight / (self.policy.scale * agg.n_total)
        words = np.rint(np.asarray(agg.theta_c[TENSOR], dtype=np.float64) / factor).astype(np.int64)
        totals = decode_sums(layout, words, len(summed.participants))
        return totals, failed + [site(n, str(n)) for n in ready if n not in summed.participants], None

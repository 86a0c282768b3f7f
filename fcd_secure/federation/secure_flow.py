"""The server side of pairwise-masked secure aggregation of Θc (Bonawitz et al., CCS 2017; DESIGN.md P1–P18).

Paper §III-B (DSS) and Table II: each sampled site trains (Θc, Θs_i) locally and only Θc is aggregated with
sample-size-weighted FedAvg. Here the server learns only the weighted sum. :class:`SecureAggregationFlow` is an
:class:`~fcd_secure.federation.records.AggregationFlow` over six ClientApp actions (the site side is
``federation.secure_site``):

====================================  ===================================================================
``train.secagg_train``                 global Θc in; the site trains and keeps the encoded update in its
                                       ``Context.state`` (never replied); the reply is an acknowledgement
``train.secagg_advertise_keys``        stage 0: round parameters in, signed X25519 round keys out
``train.secagg_share_keys``            stage 1: signed key list in, AES-GCM encrypted Shamir shares out
``train.secagg_masked_input``          stage 2: relayed shares in, masked uint32 vector out
``train.secagg_consistency``           stage 3: survivors in, Ed25519 signature (survivors + model hash) out
``train.secagg_unmask``                stage 4: signatures in, shares of alive / dropped sites out
====================================  ===================================================================

Every protocol message is the strict byte encoding of ``fcd_secure.aggregation.secagg.messages`` in a
``ConfigRecord`` field ``msg`` (the audit egress gate lets only bytes and ints through in ``train.secagg_*``).
Each stage has its own deadline (``SecAggPolicy.deadlines``, P17): a site that has not answered by then is a
dropout, and anything it sends later is ignored (P9). Fewer survivors than the threshold abort the round and
the global model stays unchanged (``RoundOutcome.theta_c is None``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from fcd_secure.aggregation.secagg import Aggregate, SecAggError, SecAggPolicy, SecAggServer, VectorLayout
from fcd_secure.aggregation.secagg.server import STAGES
from fcd_secure.config import RunConfig
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import (
    REC_SECAGG,
    SECAGG_FIELD,
    SECAGG_TRAIN_STAGE,
    AggregationFlow,
    Round,
    RoundAborted,
    RoundOutcome,
    secagg_message_type,
)
from fcd_secure.federation.secure_setup import (
    METRIC_RANGE,
    ROSTER_FILE,
    SecureAggregationConfigError,
    load_roster,
    vector_layout,
)
from fcd_secure.manifest import THETA_C, Manifest

log = logging.getLogger("fcd_secure.secagg")


@dataclass
class SecureSum:
    """What the protocol revealed: the decoded weighted sums, who survived, and the per-stage report."""

    aggregate: Aggregate
    participants: list[int]
    report: dict[str, Any]


class SecureAggregationFlow(AggregationFlow[SecureSum]):
    """Server side of a secure DSS round.

    Args:
        manifest: the server's Θc/Θs manifest (the server builds the model; sites check the same layout hash at
            hello); the vector layout is built from it.
        policy: the secure-aggregation parameters the server proposes (every site checks them against its own).
        session_id: one protocol session per federation run; rounds inside it are numbered by the server round.
        roster: the sites' Ed25519 identity keys, when the server holds the consortium roster: a site named as a
            culprit is then named on evidence it signed (Bonawitz et al. 2017 §6, active model).
    """

    train_message_type = secagg_message_type(SECAGG_TRAIN_STAGE)

    def __init__(
        self,
        manifest: Manifest,
        policy: SecAggPolicy | None = None,
        *,
        session_id: bytes | None = None,
        roster: dict[str, bytes] | None = None,
    ) -> None:
        self.manifest = manifest
        self.roster = roster
        self.policy = policy or SecAggPolicy()
        self.layout = vector_layout(manifest)
        self.session_id = session_id if session_id is not None else os.urandom(16)
        self.train_timeout_s = float(self.policy.deadlines.train)
        self.last_report: dict[str, Any] = {}

    @classmethod
    def check_config(cls, config: RunConfig) -> SecAggPolicy:
        """The run config's ``[secagg]`` policy, once it is checked against the federation section.

        Raises:
            SecureAggregationConfigError: ``sync = "full"`` (Θs may never enter the masked vector, P15), or
                ``clients_per_round`` below the policy's minimum (P10) or above what one round can sum (P6).
        """
        fed, policy = config.federation, config.secagg
        if fed.sync != "dss":
            raise SecureAggregationConfigError(
                "secure aggregation carries only Θc (federation.sync = 'dss'); the 'full' ablation synchronises Θs, "
                "which may never enter the masked vector (P15): run it with --no-secure-aggregation"
            )
        if fed.clients_per_round < policy.min_sites:
            raise SecureAggregationConfigError(
                f"federation.clients_per_round = {fed.clients_per_round} is below the secure-aggregation minimum of "
                f"{policy.min_sites} sites (P10); sample more sites or use --no-secure-aggregation"
            )
        if fed.clients_per_round > min(policy.max_sites, policy.max_overflow_sites()):
            raise SecureAggregationConfigError(
                f"federation.clients_per_round = {fed.clients_per_round} is above what one secure round can sum without "
                f"overflow or beyond the policy's max_sites ({min(policy.max_sites, policy.max_overflow_sites())}, P6); "
                "sample fewer sites per round or lower secagg clip / scale_bits"
            )
        return policy

    @classmethod
    def from_config(cls, config: RunConfig, manifest: Manifest) -> "SecureAggregationFlow":
        """The flow of a run: its checked ``[secagg]`` policy over the server's manifest, with the consortium roster
        when the run's state root holds one."""
        roster_path = config.state_root() / ROSTER_FILE if config.state_root() is not None else None
        roster = load_roster(roster_path) if roster_path is not None and roster_path.exists() else None
        return cls(manifest, cls.check_config(config), roster=roster)

    # -- hooks ---------------------------------------------------------------------------------------------------
    def _abort(self, report: dict[str, Any], why: str, participants: list[int] | None = None) -> RoundAborted:
        report["aborted"] = why
        return RoundAborted(why, participants or [], {"secagg": dict(report)})

    def check_sample(self, rnd: Round) -> None:
        self.last_report = {"selected": len(rnd.node_ids)}
        if len(rnd.node_ids) < self.policy.min_sites:
            raise self._abort(
                self.last_report,
                f"{len(rnd.node_ids)} sites selected, secure aggregation needs at least {self.policy.min_sites} (P10)",
            )

    def configure(self, rnd: Round) -> RecordDict:
        self.manifest.check_arrays(rnd.global_theta, THETA_C)
        return super().configure(rnd)

    def collect(self, rnd: Round, replies: dict[int, Message]) -> SecureSum:
        """Run the protocol's five stages among the sites that finished training."""
        trained = [n for n in rnd.node_ids if (r := replies.get(n)) is not None and not r.has_error()]
        try:
            return secure_sum(
                rnd.comm, trained, self.policy, self.layout, round_id=rnd.server_round, session_id=self.session_id,
                message_round=rnd.server_round, report=self.last_report, started=rnd.started, roster=self.roster,
            )
        except SecureSumAborted as stop:
            aborted = self._abort(self.last_report, stop.reason, stop.participants)
            if stop.culprits:
                aborted.metrics["dropped"] = dict(stop.culprits)
            raise aborted from None

    def aggregate(self, rnd: Round, collected: SecureSum) -> RoundOutcome:
        agg, g = collected.aggregate, rnd.global_theta
        # the vector held Σ w_i (Θc_i − Θc_global) / Σ w_i: the weighted FedAvg is the global plus that mean update
        theta = {k: (np.asarray(g[k], np.float64) + agg.theta_c[k]).astype(np.asarray(g[k]).dtype) for k in g}
        metrics = {
            "n_total": float(agg.n_total),
            "train_loss": agg.metrics["train_loss"] * METRIC_RANGE,
            "clipped_fraction": agg.clipped_fraction,
            # per value: the fixed-point bound plus one float32 ulp of the result (both FedAvgs round to float32)
            "quantisation_bound": agg.quantisation_bound + _max_abs(theta) * 2.0**-23,
            "secagg": dict(collected.report),
        }
        if collected.report.get("culprits"):  # sites the protocol excluded for misbehaving, named (DESIGN P26)
            metrics["dropped"] = dict(collected.report["culprits"])
        if agg.clipped_fraction > 0:
            log.warning(
                "secure round %d: %.4g of the aggregated values were clipped to ±%g",
                rnd.server_round, agg.clipped_fraction, self.policy.clip,
            )
        return RoundOutcome(theta, float(agg.n_total), collected.participants, rnd.failures(collected.participants), metrics)


class SecureSumAborted(Exception):
    """A secure sum that did not finish (too few sites or survivors, a broken bound, or the protocol aborted);
    ``culprits`` are the sites the protocol named on signed evidence."""

    def __init__(self, reason: str, participants: list[int], culprits: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.participants, self.culprits = reason, participants, dict(culprits or {})


def _send_stage(
    comm: Comm, stage: str, requests: dict[str, bytes], node_of: dict[str, int], timeout_s: float, message_round: int,
    extra: dict[str, object] | None,
) -> dict[str, bytes]:
    fields = dict(extra or {})
    contents = {node_of[s]: RecordDict({REC_SECAGG: ConfigRecord({SECAGG_FIELD: req, **fields})}) for s, req in requests.items()}
    replies = comm.send(list(contents), secagg_message_type(stage), contents, timeout_s, round=message_round)
    out: dict[str, bytes] = {}
    for s in requests:
        rep = replies.get(node_of[s])
        if rep is None or rep.has_error() or REC_SECAGG not in rep.content:
            continue
        blob = rep.content[REC_SECAGG].get(SECAGG_FIELD)
        if isinstance(blob, bytes):
            out[s] = blob
    return out


def secure_sum(
    comm: Comm,
    node_ids: list[int],
    policy: SecAggPolicy,
    layout: VectorLayout,
    *,
    round_id: int,
    session_id: bytes,
    message_round: int,
    report: dict[str, Any],
    started: float | None = None,
    first_stage_extra: dict[str, object] | None = None,
    roster: dict[str, bytes] | None = None,
) -> SecureSum:
    """Run the five protocol stages among ``node_ids`` (sites that hold an encoded input) and unmask their sum.

    The one carrier of every secure sum (Θc updates in :class:`SecureAggregationFlow`, evaluation sums in
    ``federation.secure_evaluation``).

    Args:
        comm: the server's door to the sites.
        node_ids: the sites that prepared an input.
        policy: the proposed round parameters (every site checks them against its own).
        layout: the vector layout every party built.
        round_id: the protocol round (sites refuse a round id they already used, P5).
        session_id: the protocol session.
        message_round: the round the messages are filed under (Flower group id, audit rounds).
        report: filled with per-stage survivor counts.
        started: ``time.perf_counter()`` at the round's start, for ``report["server_s"]``.
        first_stage_extra: extra fields of the first stage's request (e.g. the agreed evaluation layout).
        roster: the consortium roster, when the server holds it (a misbehaving site is then named on evidence it
            signed, ``report["culprits"]``).

    Raises:
        SecureSumAborted: too few sites, or the protocol aborted (the sum is not revealed).
    """
    t0 = time.perf_counter() if started is None else started
    site_of = {nid: comm.site_of.get(nid, f"node-{nid}") for nid in node_ids}
    node_of = {s: nid for nid, s in site_of.items()}
    report["trained"] = len(node_ids)
    if len(node_ids) < policy.min_sites:
        raise SecureSumAborted(f"only {len(node_ids)} sites are ready, secure aggregation needs {policy.min_sites}", [])
    try:
        server = SecAggServer(
            policy, layout, [site_of[n] for n in node_ids], round_id=round_id, session_id=session_id, roster=roster
        )
    except SecAggError as exc:
        raise SecureSumAborted(str(exc), []) from None
    requests = server.start()
    try:
        for i, stage in enumerate(STAGES):
            extra = first_stage_extra if i == 0 else None
            for s, blob in _send_stage(comm, stage, requests, node_of, policy.deadlines.for_stage(stage), message_round, extra).items():
                try:
                    server.collect(s, blob)
                except SecAggError:
                    pass  # recorded by the server as this site's failure; it is a dropout from now on
            requests = server.advance()
            report[stage] = len(server.report.survivors.get(stage, ()))
        agg = server.finish()
    except SecAggError as exc:  # too few survivors, shares that do not reconstruct, a bound broken: reveal nothing
        survivors = [node_of[s] for s in server.report.survivors.get("masked_input", ())]
        raise SecureSumAborted(str(exc), survivors, server.report.culprits) from None
    report["server_s"] = round(time.perf_counter() - t0, 3)
    report["culprits"] = dict(server.report.culprits)
    return SecureSum(agg, [node_of[s] for s in server.report.survivors["masked_input"]], report)


def _max_abs(arrays: dict[str, np.ndarray]) -> float:
    return max((float(np.abs(a).max()) for a in arrays.values() if np.size(a)), default=0.0)

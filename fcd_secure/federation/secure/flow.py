"""The server side of pairwise-masked secure aggregation of Θc (Bonawitz et al., CCS 2017; docs/threats.md P1–P18).

Paper §III-B (DSS) and Table II: each sampled site trains (Θc, Θs_i) locally and only Θc is aggregated with
sample-size-weighted FedAvg. Here the server learns only the weighted sum. :class:`SecureAggregationFlow` is an
:class:`~fcd_secure.federation.records.AggregationFlow` over the protocol's five stages (``advertise_keys``,
``share_keys``, ``masked_input``, ``consistency``, ``unmask``; the site side is ``apps.secure_site``), every
round with its own fresh keys, carried in as few Flower round trips as the protocol's order allows. Stages 0 and 1
use only per-round secrets and never the input (Bonawitz et al. §4: the input enters in round 2), so when the next
round's sites are known they run for round r + 1 inside round r's last two messages:

=======================================  ============================================================================
message (one Flower round trip each)     content
=======================================  ============================================================================
``train.secagg_train_masked``            round r whose keys were set up during r − 1 (protocol id ``2r``): global Θc
                                         and the relayed shares in; the site trains, binds its update to that client
                                         and answers stage 2 with the masked input
``train.secagg_train_advertise``         otherwise (round 1, another cohort, a lost setup; protocol id ``2r + 1``):
                                         global Θc and the round parameters in, the site trains and answers stage 0;
                                         then ``train.secagg_share_keys`` and ``train.secagg_masked_input``
``train.secagg_consistency_next``        round r's stage 3 (survivors in, signature out) and round r + 1's stage 0
                                         (round parameters in, signed X25519 keys and commitments out)
``train.secagg_unmask_next``             round r's stage 4 (signatures in, shares out) and round r + 1's stage 1
                                         (key list in, encrypted Shamir shares out)
=======================================  ============================================================================

A steady round is three round trips, a round without keys set up ahead five (the protocol alone was five, training
one more). The two rounds of a combined message are two clients at the site, each with its own keys, its own state
machine and every one of its checks; a site takes each protocol round id once and trains each server round once
(P5), and any failure clears both rounds at that site.

Every protocol message is the strict byte encoding of ``fcd_secure.aggregation.secagg.messages`` in a
``ConfigRecord`` field ``msg`` (``next`` for the next round's request; a combined reply is the two replies,
``records.pack_pair``; the audit egress gate lets only bytes and ints through in ``train.secagg_*``, each stage within
its size bound). Each stage has its own deadline (``SecAggPolicy.deadlines``, P17; a combined message the sum of
training's and the stage's, or the larger of its two stages'; every message also allows the site's start,
``StageDeadlines.site_start``: a cold site starts a process per message): a site that has not answered by then is a
dropout, and anything it sends later is ignored (P9). Fewer survivors than the threshold abort the round and the global model
stays unchanged (``RoundOutcome.theta_c is None``); the next round then sets up its own keys.

A sum outside what clipped inputs allow (``BoundViolation``, P26) says that some site of the sum sent an input
``encode`` could not have written, not which one: the server sees only the sum. The flow finds it by retrying
(docs/threats.md P33): the rounds that follow re-run the violating round's sites leaving one out at a time
(:class:`_CulpritSearch`), each with a fresh training and fresh keys — never the same inputs twice, since two sums of
one round's inputs over sets that differ by one site would give the server that site's update (the sites refuse it
anyway, P5). The first retry whose sum is exactly the other sites and stays within the bounds names the site left
out (``dropped``, in ``rounds.csv``, and an ``exclusion`` line of the server's signed ledger) and the flow leaves
it out of every later round. The naming is circumstantial:
a malicious site that behaves exactly when a chosen honest site is left out can shift the name onto it (only
per-site zero-knowledge range proofs would prevent that); the federation goes on either way. No single site
explaining the violation (two culprits, or fewer than ``min_sites + 1`` sites) ends the search without a name.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from fcd_secure.aggregation.secagg import Aggregate, SecAggError, SecAggPolicy, SecAggServer, VectorLayout
from fcd_secure.aggregation.secagg.errors import BoundViolation
from fcd_secure.aggregation.secagg.server import STAGES
from fcd_secure.config import RunConfig
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import (
    REC_SECAGG,
    SECAGG_CONSISTENCY_NEXT_STAGE,
    SECAGG_FIELD,
    SECAGG_NEXT_FIELD,
    SECAGG_TRAIN_ADVERTISE_STAGE,
    SECAGG_TRAIN_MASKED_STAGE,
    SECAGG_UNMASK_NEXT_STAGE,
    AggregationFlow,
    Round,
    RoundAborted,
    RoundOutcome,
    secagg_message_type,
    secagg_round_id,
    unpack_pair,
)
from fcd_secure.federation.secure.setup import (
    METRIC_RANGE,
    ROSTER_FILE,
    SecureAggregationConfigError,
    load_roster,
    vector_layout,
)
from fcd_secure.manifest import THETA_C, Manifest
from fcd_secure.errors import FcdError

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

    train_message_type = secagg_message_type(SECAGG_TRAIN_ADVERTISE_STAGE)

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
        #: the next round, when its first two stages ran inside this one
        self._ahead: _Ahead | None = None
        self._server: SecAggServer | None = None
        #: sites named as the culprit of a bound violation, left out of every later round (P33): site -> why
        self.excluded: dict[str, str] = {}
        self._search: _CulpritSearch | None = None

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
        self._choose_sites(rnd)
        if len(rnd.node_ids) < self.policy.min_sites:
            raise self._abort(
                self.last_report,
                f"{len(rnd.node_ids)} sites selected, secure aggregation needs at least {self.policy.min_sites} (P10)",
            )

    def _choose_sites(self, rnd: Round) -> None:
        """The sites this round asks: a culprit search's retry set, else the sample without the named culprits."""
        site_of = {n: rnd.comm.site_of.get(n, f"node-{n}") for n in rnd.comm.site_of}
        search = self._search
        if search is not None:
            candidate = search.next_candidate(self.policy.min_sites)
            if candidate is None:
                log.warning("round %d: no single site explains the bound violation of round %d (%s); the search ends "
                            "without naming a site", rnd.server_round, search.origin, ", ".join(search.sites))
                self.last_report["culprit_search"] = f"ended: no single site explains round {search.origin}'s violation"
                self._search = None
            else:
                node_of = {s: n for n, s in site_of.items()}
                rnd.node_ids = [node_of[s] for s in search.sites if s != candidate and s in node_of]
                self.last_report["retry"] = {"of_round": search.origin, "left_out": candidate}
                return
        if self.excluded:
            self.last_report["excluded"] = sorted(s for n in rnd.node_ids if (s := site_of.get(n)) in self.excluded)
            rnd.node_ids = [n for n in rnd.node_ids if site_of.get(n) not in self.excluded]

    def _after_violation(self, server: SecAggServer, server_round: int) -> str:
        """Start or advance the culprit search after a bound violation; returns the note for the abort reason."""
        sites = sorted(server.report.survivors.get("masked_input", ()))
        search = self._search
        if search is None:
            if len(sites) <= self.policy.min_sites:
                return (f"; leaving one of these {len(sites)} sites out leaves fewer than the {self.policy.min_sites} "
                        "secure aggregation needs, so the site cannot be found (P33)")
            self._search = _CulpritSearch(server_round, sites)
            return (f"; the next rounds retry these {len(sites)} sites leaving one out at a time to find the site "
                    "(P33)")
        if search.current is not None:  # the sum without it broke a bound too: not the (only) culprit
            search.cleared.add(search.current)
            search.current = None
        return f"; retry {search.attempts} of round {search.origin} without one site broke a bound too (P33)"

    def _after_success(self, rnd: Round, participants: list[int]) -> dict[str, str]:
        """The site a successful retry names (``{site: why}``), or nothing."""
        search = self._search
        if search is None or search.current is None:
            return {}
        asked = sorted(rnd.comm.site_of.get(n, f"node-{n}") for n in participants)
        if asked != sorted(s for s in search.sites if s != search.current):
            search.current = None  # someone else was missing too: inconclusive, the same site is tried again
            return {}
        why = (f"round {search.origin}'s secure sum broke a bound with it; the same sites' sum without it (round "
               f"{rnd.server_round}) did not: left out of every later round (P33)")
        self.excluded[search.current] = why
        if rnd.comm.audit is not None:  # named in the server's signed ledger too, for the auditor (verify: a note)
            rnd.comm.audit.record_exclusion(rnd.server_round, search.current, why)
        log.warning("round %d: %s named as the culprit of round %d's bound violation", rnd.server_round,
                    search.current, search.origin)
        self._search = None
        return {search.current: why}

    def configure(self, rnd: Round) -> RecordDict:
        self.manifest.check_arrays(rnd.global_theta, THETA_C)
        return super().configure(rnd)

    def send(self, rnd: Round, content: RecordDict) -> dict[int, Message]:
        """Send the training request: with the relayed shares when this round's keys were set up during the last
        one for exactly these sites, else with the round parameters of a fresh protocol run."""
        site_of = {n: rnd.comm.site_of.get(n, f"node-{n}") for n in rnd.node_ids}
        node_of = {s: n for n, s in site_of.items()}
        ahead, self._ahead = self._ahead, None
        deadlines = self.policy.deadlines
        if ahead is not None and ahead.server_round == rnd.server_round and ahead.sites == frozenset(node_of):
            self._server, requests, stage = ahead.server, ahead.requests, SECAGG_TRAIN_MASKED_STAGE
            timeout = deadlines.for_message(deadlines.train + deadlines.masked_input)
            self.last_report.update(ahead.report, pipelined=True)
        else:
            try:
                self._server = SecAggServer(
                    self.policy, self.layout, sorted(node_of), round_id=secagg_round_id(rnd.server_round, pipelined=False),
                    session_id=self.session_id, roster=self.roster,
                )
            except SecAggError as exc:
                raise self._abort(self.last_report, str(exc)) from None
            requests, stage = self._server.start(), SECAGG_TRAIN_ADVERTISE_STAGE
            timeout = deadlines.for_message(deadlines.train + deadlines.advertise_keys)
            self.last_report["pipelined"] = False
        contents = {
            node_of[s]: RecordDict({**dict(content.items()), REC_SECAGG: ConfigRecord({SECAGG_FIELD: req})})
            for s, req in requests.items()
        }
        return rnd.comm.send(list(contents), secagg_message_type(stage), contents, timeout, round=rnd.server_round)

    def collect(self, rnd: Round, replies: dict[int, Message]) -> SecureSum:
        """Run the rest of the round's protocol (and the next round's first two stages alongside its last two)."""
        server, report, comm = self._server, self.last_report, rnd.comm
        self._server = None
        assert server is not None
        site_of = {n: comm.site_of.get(n, f"node-{n}") for n in rnd.node_ids}
        node_of = {s: n for n, s in site_of.items()}
        report["trained"] = sum(1 for n, r in replies.items() if not r.has_error())
        try:
            _collect(server, {site_of[n]: b for n, b in _blobs(replies).items() if n in site_of})
            stages = STAGES[2:3] if report["pipelined"] else STAGES[:3]
            requests = self._advance(server, stages[0])
            for stage in stages[1:]:
                deadline = self.policy.deadlines.for_message(self.policy.deadlines.for_stage(stage))
                got = _send_stage(comm, stage, requests, node_of, deadline, rnd.server_round, None)
                _collect(server, got)
                requests = self._advance(server, stage)
            requests = self._last_stages(rnd, server, requests)
            agg = server.finish()
        except SecAggError as exc:  # too few survivors, shares that do not reconstruct, a bound broken: reveal nothing
            survivors = [node_of[s] for s in server.report.survivors.get("masked_input", ())]
            note = self._after_violation(server, rnd.server_round) if isinstance(exc, BoundViolation) else ""
            aborted = self._abort(report, str(exc) + note, survivors)
            if server.report.culprits:
                aborted.metrics["dropped"] = dict(server.report.culprits)
            raise aborted from None
        report["server_s"] = round(time.perf_counter() - rnd.started, 3)
        report["culprits"] = dict(server.report.culprits)
        return SecureSum(agg, [node_of[s] for s in server.report.survivors["masked_input"]], report)

    def _advance(self, server: SecAggServer, stage: str) -> dict[str, bytes]:
        try:
            return server.advance()
        finally:
            self.last_report[stage] = len(server.report.survivors.get(stage, ()))

    def _next_server(self, rnd: Round) -> SecAggServer | None:
        """The next round's protocol run, when its sites are known now (protocol id ``2(r + 1)``)."""
        if self._search is not None or rnd.next_node_ids is None or any(n not in rnd.comm.site_of for n in rnd.next_node_ids):
            return None
        sites = sorted(s for n in rnd.next_node_ids if (s := rnd.comm.site_of[n]) not in self.excluded)
        if len(sites) < self.policy.min_sites:
            return None
        try:
            return SecAggServer(self.policy, self.layout, sites, round_id=secagg_round_id(rnd.server_round + 1, pipelined=True),
                                session_id=self.session_id, roster=self.roster)
        except SecAggError:
            return None

    def _last_stages(self, rnd: Round, server: SecAggServer, requests: dict[str, bytes]) -> dict[str, bytes]:
        """Stages 3 and 4 of this round, each carrying stage 0 and 1 of the next round when its sites are known.
        The next round's failure never touches this round: it then sets up its own keys (``_ahead`` stays empty)."""
        comm, deadlines = rnd.comm, self.policy.deadlines
        node_of = {s: n for n, s in comm.site_of.items()}
        nxt = self._next_server(rnd)
        next_requests = nxt.start() if nxt is not None else {}
        next_report: dict[str, int] = {}
        for stage, next_stage, pair in (("consistency", "advertise_keys", SECAGG_CONSISTENCY_NEXT_STAGE),
                                        ("unmask", "share_keys", SECAGG_UNMASK_NEXT_STAGE)):
            timeout = deadlines.for_message(max(deadlines.for_stage(stage),
                                                deadlines.for_stage(next_stage) if next_requests else 0.0))
            got, got_next = _send_pair(comm, pair, requests, next_requests, node_of, timeout, rnd.server_round)
            _collect(server, got)
            if nxt is not None:
                _collect(nxt, got_next)
                try:
                    next_requests = nxt.advance()
                    next_report[next_stage] = len(nxt.report.survivors.get(next_stage, ()))
                except SecAggError as exc:
                    log.warning("round %d: the next round's keys could not be set up ahead (%s)", rnd.server_round, exc)
                    nxt, next_requests = None, {}
            requests = self._advance(server, stage)
        if nxt is not None:
            self._ahead = _Ahead(rnd.server_round + 1, frozenset(nxt.params.selected), nxt, next_requests, next_report)
        return requests

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
        if collected.report.get("culprits"):  # sites the protocol excluded for misbehaving, named (docs/threats.md P26)
            metrics["dropped"] = dict(collected.report["culprits"])
        named = self._after_success(rnd, collected.participants)
        if named:  # the culprit of an earlier bound violation, found by leaving it out (P33)
            metrics["dropped"] = {**metrics.get("dropped", {}), **named}
        if agg.clipped_fraction > 0:
            log.warning(
                "secure round %d: %.4g of the aggregated values were clipped to ±%g",
                rnd.server_round, agg.clipped_fraction, self.policy.clip,
            )
        return RoundOutcome(theta, float(agg.n_total), collected.participants, rnd.failures(collected.participants), metrics)


@dataclass
class _CulpritSearch:
    """Finding the site behind round ``origin``'s bound violation (P33): ``sites`` are that sum's sites; each retry
    leaves out the next site not yet ``cleared`` (a retry without it broke a bound too); ``current`` is the site the
    running retry leaves out. A retry that fails another way (a dropout) tries the same site again, up to
    ``2 × len(sites)`` retries in all."""

    origin: int
    sites: list[str]
    cleared: set[str] = field(default_factory=set)
    current: str | None = None
    attempts: int = 0

    def next_candidate(self, min_sites: int) -> str | None:
        """The site the next retry leaves out, or ``None`` when the search cannot go on."""
        left = [s for s in self.sites if s not in self.cleared]
        if not left or len(self.sites) - 1 < min_sites or self.attempts >= 2 * len(self.sites):
            return None
        self.current = self.current if self.current in left else left[0]
        self.attempts += 1
        return self.current


@dataclass
class _Ahead:
    """A round whose first two protocol stages ran inside the round before it: its server (at stage 2), the stage 2
    requests (relayed shares) of the sites that shared keys, and those stages' survivor counts."""

    server_round: int
    sites: frozenset[str]
    server: SecAggServer
    requests: dict[str, bytes]
    report: dict[str, int]


def _blobs(replies: dict[int, Message], field: str = SECAGG_FIELD) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for nid, rep in replies.items():
        if rep is None or rep.has_error() or REC_SECAGG not in rep.content:
            continue
        blob = rep.content[REC_SECAGG].get(field)
        if isinstance(blob, bytes):
            out[nid] = blob
    return out


def _collect(server: SecAggServer, replies: dict[str, bytes]) -> None:
    for s, blob in replies.items():
        try:
            server.collect(s, blob)
        except SecAggError:
            pass  # recorded by the server as this site's failure; it is a dropout from now on


def _send_pair(
    comm: Comm, stage: str, this: dict[str, bytes], nxt: dict[str, bytes], node_of: dict[str, int], timeout_s: float,
    message_round: int,
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """One combined stage: this round's request as ``msg``, the next round's as ``next``, to the union of both
    rounds' sites; returns each round's replies (a part a site was not asked for is ignored)."""
    contents: dict[int, RecordDict] = {}
    for s in sorted(set(this) | set(nxt)):
        fields = {**({SECAGG_FIELD: this[s]} if s in this else {}), **({SECAGG_NEXT_FIELD: nxt[s]} if s in nxt else {})}
        contents[node_of[s]] = RecordDict({REC_SECAGG: ConfigRecord(fields)})
    site_of = {n: s for s, n in node_of.items()}
    got: dict[str, bytes] = {}
    got_next: dict[str, bytes] = {}
    for nid, blob in _blobs(comm.send(list(contents), secagg_message_type(stage), contents, timeout_s, round=message_round)).items():
        try:
            first, second = unpack_pair(blob)
        except ValueError:
            continue  # malformed: a dropout in both rounds
        s = site_of[nid]
        if first and s in this:
            got[s] = first
        if second and s in nxt:
            got_next[s] = second
    return got, got_next


class SecureSumAborted(FcdError, Exception):
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
    blobs = _blobs({node_of[s]: replies[node_of[s]] for s in requests if node_of[s] in replies})
    return {s: blobs[node_of[s]] for s in requests if node_of[s] in blobs}


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
    ``federation.secure.secure_evaluation``).

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
            deadline = policy.deadlines.for_message(policy.deadlines.for_stage(stage))
            _collect(server, _send_stage(comm, stage, requests, node_of, deadline, message_round, extra))
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

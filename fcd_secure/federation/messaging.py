"""The server's only door to the sites: ``Comm`` wraps Flower's Grid and counts every byte (paper Table II).

Paper Table II states communication as "uplink/downlink = selected clients × synchronised parameter size". We
measure it instead, from the serialized Flower messages, with the audit's one definition of a message's bytes
(``fcd_secure.audit.payload_bytes`` / ``message_bytes``: the ``deflate()`` bytes of Flower's content-addressed
objects, the pinned Flower's ``flwr.common.inflatable``), so the run's accounting and the audit ledgers agree byte for
byte. Two figures are kept per message:

* ``payload_bytes``: the serialized ``RecordDict`` content (records, arrays, chunks). Deterministic for a seed,
  and what the paper's formula approximates; the headline figure.
* ``message_bytes``: the whole message object tree including metadata (varies by a few bytes with the random
  node ids and timestamps); HTTP framing (~600 B per message) and heartbeats are not included.

``Comm.send`` never raises for a site's failure: error replies come back as error messages, late or silent sites
are simply absent from the result, so an aggregation flow decides what a missing site means.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fcd_secure.audit import POLICY_REASON_PREFIX, ServerAudit, message_bytes, payload_bytes, site_error_name
from fcd_secure.audit.entries import UNNAMED_NODE_PREFIX
from fcd_secure.errors import FcdError
from fcd_secure.federation.asked_runs import WHATIF_RULE


@dataclass(frozen=True)
class TrafficRecord:
    """One message on the wire, as the server saw it."""

    round: int
    action: str
    node_id: int
    site_id: str
    direction: str  # "down" (server -> site, request) or "up" (site -> server, reply)
    payload_bytes: int
    message_bytes: int
    ok: bool


class RunStopped(FcdError, RuntimeError):
    """The operator stopped the run (``Comm.stop`` was set); the state on disk is that of the last finished round."""


#: the rules under which a site *declines* an evaluation (its policy at work, not a failure): its cohort rules, and
#: a question about a deployed run it has no record of answering as asked (``federation.asked_runs``)
DECLINING_RULES = ("eval_cohort", WHATIF_RULE)


def declined_rule(reply: Message) -> str | None:
    """The rule under which ``reply`` declines an evaluation (:data:`DECLINING_RULES`: a test split smaller than the
    cohort floor, a cohort too close to an earlier one, the same rows evaluated too often, a question about a run
    the site did not answer), or None: the ``policy_refusal`` category with such a rule. The evaluation then merges
    the other sites' sums; nothing failed. The rule's name is all a declining site says (P41)."""
    if not reply.has_error() or site_error_name(reply.error.code) != "policy_refusal":
        return None
    reason = str(reply.error.reason)
    return next((r for r in DECLINING_RULES if reason == POLICY_REASON_PREFIX + r), None)


def declined_evaluation(reply: Message) -> bool:
    """Whether ``reply`` declines an evaluation under one of :data:`DECLINING_RULES` (:func:`declined_rule`)."""
    return declined_rule(reply) is not None


#: the category of a :class:`SiteErrorRecord` for a site that sent no reply before the deadline (the server's own
#: observation, beside the categories a site's error reply carries, ``fcd_secure.audit.SITE_ERRORS``)
NO_REPLY = "no_reply"


@dataclass(frozen=True)
class SiteErrorRecord:
    """An error reply as the server saw it: which site, when, and the category of the site's closed vocabulary
    (``fcd_secure.audit.SITE_ERRORS``: ``data_mismatch``, ``budget_exhausted``, ``policy_refusal``, ``internal``), or
    :data:`NO_REPLY` when the site sent nothing before the deadline."""

    round: int
    action: str
    node_id: int
    site_id: str
    error: str
    #: the rule a declining site named (:func:`declined_rule`); None for any other error
    rule: str | None = None


class TrafficLedger:
    """Per-site, per-round, per-action byte counts of every request and reply."""

    def __init__(self) -> None:
        self.records: list[TrafficRecord] = []

    def add(self, rec: TrafficRecord) -> None:
        self.records.append(rec)

    def total(self, direction: str, *, round: int | None = None, action: str | None = None, field: str = "payload_bytes") -> int:
        return int(
            sum(
                getattr(r, field)
                for r in self.records
                if r.direction == direction
                and (round is None or r.round == round)
                and (action is None or r.action == action)
            )
        )

    def per_round(self, direction: str, *, action_prefix: str = "train") -> dict[int, int]:
        """Bytes per round for actions starting with ``action_prefix`` (training traffic, evaluation excluded)."""
        out: dict[int, int] = {}
        for r in self.records:
            if r.direction == direction and r.action.startswith(action_prefix):
                out[r.round] = out.get(r.round, 0) + r.payload_bytes
        return out

    def to_rows(self) -> list[dict]:
        return [asdict(r) for r in self.records]


class Comm:
    """Push/pull over a Flower ``Grid`` with a short poll, recording exact bytes of every message.

    ``site_of`` maps Flower node ids (random per run, never used as identity) to stable site ids, filled in by the
    server after the hello exchange; accounting is keyed by site id.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        poll_s: float = 0.02,
        ledger: TrafficLedger | None = None,
        audit: ServerAudit | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.grid = grid
        #: set by whoever runs the server (Ctrl-C, SIGTERM): the next wait for replies raises :class:`RunStopped`
        self.stop = stop
        #: the server's audit ledger: receipts ride on downlinks, every reply is recorded (the ServerApp always sets
        #: one; a bare ``Comm`` without it serves protocol tests)
        self.audit = audit
        # the server's import: this module is also imported by every ClientApp (``federation.records`` names
        # ``Comm``), where ``_flower.waits`` would bring in the SuperLink's grid and state code (of a bare
        # ``import fcd_secure.apps.client_app``, 1.1 s of CPU; 0.1-0.3 s in a process that runs Flower's ClientApp
        # runtime, which imports much of it itself)
        from fcd_secure._flower.waits import grid_poll_s  # noqa: PLC0415

        self.poll_s = grid_poll_s(grid, poll_s)
        self.ledger = ledger if ledger is not None else TrafficLedger()
        self.site_of: dict[int, str] = {}
        self.round = 0
        #: every error reply, in arrival order (the ServerApp turns them into messages for the operator)
        self.site_errors: list[SiteErrorRecord] = []
        #: evaluations a site declined under its cohort rules (:func:`declined_evaluation`): its policy at work, not
        #: an error
        self.declined: list[SiteErrorRecord] = []

    def _site(self, node_id: int) -> str:
        return self.site_of.get(node_id, f"{UNNAMED_NODE_PREFIX}{node_id}")

    def send(
        self,
        node_ids: Iterable[int],
        message_type: str,
        contents: Mapping[int, RecordDict] | RecordDict,
        timeout_s: float,
        *,
        round: int | None = None,
    ) -> dict[int, Message]:
        """Send one request per node and wait for replies until all are in or ``timeout_s`` passes.

        ``contents`` is one ``RecordDict`` for all nodes or a per-node mapping. Returns ``{node_id: reply}`` for
        the nodes that replied in time (error replies included: check ``reply.has_error()``); missing nodes are
        absent.
        """
        rnd = self.round if round is None else int(round)
        node_ids = [int(n) for n in node_ids]
        msgs: list[Message] = []
        for nid in node_ids:
            if isinstance(contents, RecordDict):
                content = RecordDict(dict(contents.items()))  # a fresh container per message, records shared
            else:
                content = contents[nid]
            if self.audit is not None:
                content = self.audit.attach(nid, content)
            msg = Message(content, nid, message_type, group_id=str(rnd))
            self.ledger.add(
                TrafficRecord(rnd, message_type, nid, self._site(nid), "down", payload_bytes(msg), message_bytes(msg), True)
            )
            msgs.append(msg)
        if not msgs:
            return {}
        pushed = list(self.grid.push_messages(msgs))
        waiting = {mid: nid for mid, nid in zip(pushed, node_ids) if mid}
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + float(timeout_s)
        while waiting and time.monotonic() < deadline:
            if self.stop is not None and self.stop.is_set():
                raise RunStopped("the run was stopped while waiting for the sites' replies")
            # the server ledger's lines of one pull's replies reach the disk by one fsync (ServerAudit.deferred_sync)
            with self.audit.deferred_sync() if self.audit is not None else nullcontext():
                for reply in self.grid.pull_messages(list(waiting)):
                    mid = reply.metadata.reply_to_message_id
                    nid = waiting.pop(mid, None)
                    if nid is None:
                        continue  # a reply to something we no longer wait for
                    ok = not reply.has_error()
                    if not ok:
                        rule = declined_rule(reply)
                        record = SiteErrorRecord(rnd, message_type, nid, self._site(nid),
                                                 site_error_name(reply.error.code), rule)
                        (self.declined if rule is not None else self.site_errors).append(record)
                    if self.audit is not None:
                        self.audit.on_reply(reply, self._site(nid))
                    self.ledger.add(
                        TrafficRecord(
                            rnd, message_type, nid, self._site(nid), "up", payload_bytes(reply), message_bytes(reply), ok
                        )
                    )
                    replies[nid] = reply
            if waiting:
                time.sleep(self.poll_s)
        # a site that never answered missed this step as surely as one that answered with an error: recorded too, so
        # that the run's records (summary.json, rounds.csv) name every round a site missed
        for nid in waiting.values():
            self.site_errors.append(SiteErrorRecord(rnd, message_type, nid, self._site(nid), NO_REPLY))
        return replies

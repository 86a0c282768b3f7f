"""Plain FedAvg of Θc over clear-text replies (``--no-secure-aggregation``; paper Table II "Aggregation").

Message type ``train``: each sampled site replies with its locally trained Θc (keyed by manifest names), its sample
count and its local objective; the server forms ``Σ n_i Θc_i / Σ n_i`` with :func:`fcd_secure.aggregation.fedavg`.
In the "w/o DSS" ablation (paper Table III) the same flow averages every parameter but the site-bound ones (part
``full``).

Robust to one bad site (docs/threats.md P26): each reply is screened on its own (:func:`~fcd_secure.aggregation.fedavg.
screen_update`: names, shapes and dtypes of the manifest, finite values, a whole sample count within the consortium's
pinned maximum); a bad update is dropped, recorded with its site in the round's metrics (``dropped``) and logged,
and the round goes on if at least ``min_replies`` good updates remain.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from fcd_secure.aggregation.fedavg import AggregationError, fedavg, screen_update
from fcd_secure.federation.records import (
    REC_METRICS,
    REC_NUM,
    REC_UPDATE,
    TRAIN_MESSAGE_TYPE,
    AggregationFlow,
    Round,
    RoundAborted,
    RoundOutcome,
    record_to_arrays,
)

log = logging.getLogger("fcd_secure.federation")


@dataclass
class PlainReplies:
    """The well-formed training replies of one round."""

    updates: list[dict[str, np.ndarray]] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)
    participants: list[int] = field(default_factory=list)
    site_metrics: dict[str, dict] = field(default_factory=dict)
    #: site id -> why its update was dropped
    dropped: dict[str, str] = field(default_factory=dict)


class PlainFedAvgFlow(AggregationFlow[PlainReplies]):
    """Sample-size-weighted FedAvg over clear-text replies.

    Args:
        specs: ``{name: (shape, dtype)}`` of the synchronised part (``Manifest.specs(part)``); every update must match.
        max_count: the largest sample count one site may claim (``[secagg] max_weight``, pinned by the consortium).
        timeout_s: how long the sampled sites have to reply.
        min_replies: the round is aborted (global unchanged) if fewer sites reply with a well-formed update.
    """

    train_message_type = TRAIN_MESSAGE_TYPE

    def __init__(
        self,
        specs: dict[str, tuple[tuple[int, ...], str]],
        *,
        max_count: float,
        timeout_s: float = 600.0,
        min_replies: int = 1,
    ) -> None:
        self.specs = dict(specs)
        self.max_count = float(max_count)
        self.train_timeout_s = float(timeout_s)
        self.min_replies = int(min_replies)

    def collect(self, rnd: Round, replies: dict[int, Message]) -> PlainReplies:
        got = PlainReplies()
        for nid in rnd.node_ids:
            reply = replies.get(nid)
            if reply is None or reply.has_error() or REC_UPDATE not in reply.content:
                continue
            site = rnd.comm.site_of.get(nid, str(nid))
            arrays = record_to_arrays(reply.content[REC_UPDATE])
            n = reply.content[REC_NUM].get("n") if REC_NUM in reply.content else None
            why = screen_update(arrays, n, self.specs, self.max_count)
            if why is not None:  # one bad update never enters the average, and never stops the others
                got.dropped[site] = why
                log.warning("round %d: dropped the update of %s (%s)", rnd.server_round, site, why)
                continue
            got.updates.append(arrays)
            got.counts.append(float(n))
            got.participants.append(nid)
            if REC_METRICS in reply.content:
                got.site_metrics[site] = dict(reply.content[REC_METRICS])
        if len(got.updates) < self.min_replies:
            dropped = "; ".join(f"{s}: {w}" for s, w in got.dropped.items())
            raise RoundAborted(f"too few good replies ({len(got.updates)} < {self.min_replies})"
                               + (f"; dropped {dropped}" if dropped else ""), got.participants)
        return got

    def aggregate(self, rnd: Round, collected: PlainReplies) -> RoundOutcome:
        try:
            theta, n_total = fedavg(collected.updates, collected.counts)
        except AggregationError as exc:
            raise RoundAborted(str(exc), collected.participants) from None
        theta = {k: v.astype(rnd.global_theta[k].dtype) for k, v in theta.items()}
        metrics: dict = {"n_total": n_total}
        if collected.dropped:
            metrics["dropped"] = dict(collected.dropped)
        with_loss = [m for m in collected.site_metrics.values() if m.get("total") is not None]
        if with_loss:  # the sample-weighted mean local objective L (paper §III-C) of this round's sites
            metrics["train_loss"] = float(
                np.average([m["total"] for m in with_loss], weights=[m.get("n", 1.0) for m in with_loss])
            )
        return RoundOutcome(theta, n_total, collected.participants, rnd.failures(collected.participants), metrics)

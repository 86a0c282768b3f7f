"""Plain FedAvg of Θc over clear-text replies (``--no-secure-aggregation``; paper Table II "Aggregation").

Message type ``train``: each sampled site replies with its locally trained Θc (keyed by manifest names), its sample
count and its local objective; the server forms ``Σ n_i Θc_i / Σ n_i`` with :func:`fcd_secure.aggregation.fedavg`.
In the "w/o DSS" ablation (paper Table III) the same flow averages every parameter (part ``full``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from fcd_secure.aggregation.fedavg import AggregationError, fedavg
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


@dataclass
class PlainReplies:
    """The well-formed training replies of one round."""

    updates: list[dict[str, np.ndarray]] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)
    participants: list[int] = field(default_factory=list)
    site_metrics: dict[str, dict] = field(default_factory=dict)


class PlainFedAvgFlow(AggregationFlow[PlainReplies]):
    """Sample-size-weighted FedAvg over clear-text replies.

    Args:
        timeout_s: how long the sampled sites have to reply.
        min_replies: the round is aborted (global unchanged) if fewer sites reply with a well-formed update.
    """

    train_message_type = TRAIN_MESSAGE_TYPE

    def __init__(self, *, timeout_s: float = 600.0, min_replies: int = 1) -> None:
        self.train_timeout_s = float(timeout_s)
        self.min_replies = int(min_replies)

    def collect(self, rnd: Round, replies: dict[int, Message]) -> PlainReplies:
        got = PlainReplies()
        for nid in rnd.node_ids:
            reply = replies.get(nid)
            if reply is None or reply.has_error() or REC_UPDATE not in reply.content:
                continue
            arrays = record_to_arrays(reply.content[REC_UPDATE])
            n = float(reply.content[REC_NUM]["n"])
            if sorted(arrays) != sorted(rnd.global_theta) or not np.isfinite(n) or n <= 0:
                continue  # a malformed update never enters the average
            got.updates.append(arrays)
            got.counts.append(n)
            got.participants.append(nid)
            if REC_METRICS in reply.content:
                got.site_metrics[rnd.comm.site_of.get(nid, str(nid))] = dict(reply.content[REC_METRICS])
        if len(got.updates) < self.min_replies:
            raise RoundAborted("too few replies", got.participants)
        return got

    def aggregate(self, rnd: Round, collected: PlainReplies) -> RoundOutcome:
        try:
            theta, n_total = fedavg(collected.updates, collected.counts)
        except AggregationError as exc:
            raise RoundAborted(str(exc), collected.participants) from None
        theta = {k: v.astype(rnd.global_theta[k].dtype) for k, v in theta.items()}
        metrics: dict = {"n_total": n_total}
        with_loss = [m for m in collected.site_metrics.values() if m.get("total") is not None]
        if with_loss:  # the sample-weighted mean local objective L (paper §III-C) of this round's sites
            metrics["train_loss"] = float(
                np.average([m["total"] for m in with_loss], weights=[m.get("n", 1.0) for m in with_loss])
            )
        return RoundOutcome(theta, n_total, collected.participants, rnd.failures(collected.participants), metrics)

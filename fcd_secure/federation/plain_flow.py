"""Plain FedAvg of Θc over clear-text replies (``--no-secure-aggregation``; paper Table II "Aggregation").

Message type ``train``: each sampled site replies with its locally trained Θc (keyed by manifest names), its sample
count and its local objective; the server forms ``Σ n_i Θc_i / Σ n_i`` with :func:`fcd_secure.aggregation.fedavg`.
In the "w/o DSS" ablation (paper Table III) the same flow averages every parameter but the site-bound ones (part
``full``).

Robust to one bad site (docs/threats.md P26): each reply is screened on its own (:func:`~fcd_secure.aggregation.fedavg.
screen_update`: names, shapes and dtypes of the manifest, finite values, a whole sample count within the consortium's
pinned maximum); a bad update is dropped, recorded with its site in the round's metrics (``dropped``) and logged,
and the round goes on if at least ``min_replies`` good updates remain.

A finite update can still be absurd (docs/threats.md P32): a float32 3e38, or a model replacement scaled so that the
average lands where one site wants it. The well-formed updates are then screened together: an update whose distance
from the global model exceeds :data:`~fcd_secure.aggregation.fedavg.NORM_FACTOR` × the median of the round's update
distances (:func:`~fcd_secure.aggregation.fedavg.norm_bound`) is dropped and named the same way. A round with fewer
than three well-formed updates has no honest median of its own and is held to the bound of the last round that had
one (none before the first such round).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from fcd_secure.aggregation.fedavg import (
    NORM_FACTOR,
    AggregationError,
    fedavg,
    norm_bound,
    screen_update,
    update_norm,
)
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
        #: the norm bound of the last round that had enough well-formed updates for a median (P32)
        self.last_norm_bound: float | None = None

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
        self._screen_norms(rnd, got)
        if len(got.updates) < self.min_replies:
            dropped = "; ".join(f"{s}: {w}" for s, w in got.dropped.items())
            raise RoundAborted(f"too few good replies ({len(got.updates)} < {self.min_replies})"
                               + (f"; dropped {dropped}" if dropped else ""), got.participants)
        return got

    def _screen_norms(self, rnd: Round, got: PlainReplies) -> None:
        """Drop and name the well-formed updates that reach too far from the global model (P32)."""
        norms = [update_norm(u, rnd.global_theta) for u in got.updates]
        bound = norm_bound(norms, update_norm(rnd.global_theta))
        if bound is not None:
            self.last_norm_bound = bound
        else:
            bound = self.last_norm_bound
        if bound is None:
            return
        keep = [i for i, x in enumerate(norms) if x <= bound]
        for i, x in enumerate(norms):
            if x > bound:
                site = rnd.comm.site_of.get(got.participants[i], str(got.participants[i]))
                why = (f"update norm {x:.3g} is above {bound:.3g}, {NORM_FACTOR:g} × the median of the round's update "
                       "norms (a far-out or model-replacing update, P32)")
                got.dropped[site] = why
                got.site_metrics.pop(site, None)
                log.warning("round %d: dropped the update of %s (%s)", rnd.server_round, site, why)
        got.updates = [got.updates[i] for i in keep]
        got.counts = [got.counts[i] for i in keep]
        got.participants = [got.participants[i] for i in keep]

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

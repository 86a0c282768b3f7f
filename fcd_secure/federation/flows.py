"""The aggregation seam of a DSS round: one protocol, two implementations (plain and secure).

Paper §III "Decoupled synchronisation" and Table II: each round the sampled sites train (Θc, Θs_i) locally for
one epoch and upload only Θc; the server forms the sample-size-weighted FedAvg of Θc and broadcasts it. How the
weighted sum is formed is the only thing that differs between plain FedAvg and pairwise-masked secure
aggregation, so the ServerApp has one code path and calls ``flow.run_round(...)``:

* ``PlainFedAvgFlow`` (here): message type ``"train"``; each site replies with its Θc arrays (keyed by manifest
  names) and its sample count in clear; the server averages with ``fcd_secure.aggregation.fedavg``.
* ``SecureAggregationFlow`` (``fcd_secure.federation.secure_flow``, written by the secure-aggregation owner): the
  same ``run_round`` contract over several custom actions; the server only learns the weighted sum.

``make_flow(config)`` is the single place where the choice is made.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fcd_secure.aggregation.fedavg import AggregationError, fedavg

if TYPE_CHECKING:  # pragma: no cover
    from fcd_secure.config import RunConfig
    from fcd_secure.federation.messaging import Comm

#: Record names of the plain "train" exchange (both sides read these constants).
REC_GLOBAL = "global"
REC_CONFIG = "config"
REC_UPDATE = "update"
REC_METRICS = "metrics"
REC_NUM = "num"


@dataclass
class RoundOutcome:
    """What one round produced. ``theta_c is None`` means the round was aborted and the global model is unchanged."""

    theta_c: dict[str, np.ndarray] | None
    n_total: float | None
    participants: list[int]
    failures: list[int]
    metrics: dict = field(default_factory=dict)


class AggregationFlow(Protocol):
    """Server side of one synchronisation round (plain or secure)."""

    def run_round(
        self,
        comm: "Comm",
        node_ids: list[int],
        server_round: int,
        global_theta_c: dict[str, np.ndarray],
        round_config: dict,
    ) -> RoundOutcome: ...


def arrays_to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Arrays keyed by manifest name, in name order (so the serialized bytes do not depend on dict order)."""
    return ArrayRecord({name: Array(np.ascontiguousarray(arrays[name])) for name in sorted(arrays)})


def record_to_arrays(rec: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: arr.numpy() for name, arr in rec.items()}


def config_record(round_config: dict) -> ConfigRecord:
    """Round config as a ConfigRecord; ``None`` values are dropped (ConfigRecord has no null)."""
    return ConfigRecord({k: v for k, v in round_config.items() if v is not None})


class PlainFedAvgFlow:
    """Sample-size-weighted FedAvg over clear-text replies (``--no-secure-aggregation``).

    ``min_replies``: the round is aborted (global unchanged) if fewer sites reply successfully.
    """

    message_type = "train"

    def __init__(self, *, timeout_s: float = 600.0, min_replies: int = 1) -> None:
        self.timeout_s = float(timeout_s)
        self.min_replies = int(min_replies)

    def run_round(
        self,
        comm: "Comm",
        node_ids: list[int],
        server_round: int,
        global_theta_c: dict[str, np.ndarray],
        round_config: dict,
    ) -> RoundOutcome:
        content = RecordDict(
            {
                REC_GLOBAL: arrays_to_record(global_theta_c),
                REC_CONFIG: config_record({**round_config, "server-round": int(server_round)}),
            }
        )
        replies = comm.send(node_ids, self.message_type, content, self.timeout_s, round=server_round)
        updates, counts, participants, failures = [], [], [], []
        site_metrics: dict[str, dict] = {}
        for nid in node_ids:
            reply = replies.get(nid)
            if reply is None or reply.has_error() or REC_UPDATE not in reply.content:
                failures.append(nid)
                continue
            arrays = record_to_arrays(reply.content[REC_UPDATE])
            n = float(reply.content[REC_NUM]["n"])
            if sorted(arrays) != sorted(global_theta_c) or not np.isfinite(n) or n <= 0:
                failures.append(nid)  # a malformed update never enters the average
                continue
            updates.append(arrays)
            counts.append(n)
            participants.append(nid)
            if REC_METRICS in reply.content:
                site_metrics[comm.site_of.get(nid, str(nid))] = dict(reply.content[REC_METRICS])
        if len(updates) < self.min_replies:
            return RoundOutcome(None, None, participants, failures, {"aborted": "too few replies"})
        try:
            theta, n_total = fedavg(updates, counts)
        except AggregationError as exc:
            return RoundOutcome(None, None, participants, failures, {"aborted": str(exc)})
        theta = {k: v.astype(global_theta_c[k].dtype) for k, v in theta.items()}
        metrics = {"n_total": n_total}
        with_loss = [m for m in site_metrics.values() if m.get("total") is not None]
        if with_loss:  # the sample-weighted mean local objective L (paper §III-C) of this round's sites
            metrics["train_loss"] = float(
                np.average([m["total"] for m in with_loss], weights=[m.get("n", 1.0) for m in with_loss])
            )
        return RoundOutcome(theta, n_total, participants, failures, metrics)


class SecureAggregationUnavailable(RuntimeError):
    """Secure mode was requested but ``fcd_secure.federation.secure_flow`` is not installed yet."""


def _secure_flow_module():
    try:
        secure_flow = importlib.import_module("fcd_secure.federation.secure_flow")
    except ModuleNotFoundError as exc:
        if exc.name != "fcd_secure.federation.secure_flow":
            raise
        raise SecureAggregationUnavailable(
            "secure aggregation is not available yet (fcd_secure/federation/secure_flow.py is missing); "
            "run with --no-secure-aggregation"
        ) from None
    return secure_flow


def make_flow(config: "RunConfig") -> AggregationFlow:
    """=== THE place where the aggregation flow is chosen (``federation.secure_aggregation``). ==="""
    fed = config.federation
    if fed.secure_aggregation:
        secure_flow = _secure_flow_module()
        return secure_flow.SecureAggregationFlow.from_config(config)
    return PlainFedAvgFlow(timeout_s=fed.round_timeout_s, min_replies=fed.min_replies)

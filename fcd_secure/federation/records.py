"""What travels between the ServerApp and the ClientApp, and the base class of every aggregation flow.

Both ends read the names here, so a message type or record name is spelled once:

==================================  =================================================================================
message type                        content (request → reply)
==================================  =================================================================================
``query.hello``                     ``hello`` (empty) → ``hello``: site id, site index, manifest layout hash, data dims
``train``                           ``global`` Θc + ``config`` → ``update`` Θc, ``num`` (n), ``metrics`` (plain FedAvg)
``train.secagg_<stage>``            ``secagg`` ``{msg: bytes}`` both ways (secure aggregation;
                                    ``secagg_evaluate`` carries ``global`` + ``config`` down and the sums' schema
                                    (names, lengths) up as ``{msg: bytes}``; an evaluation round's first stage also
                                    carries ``layout`` down)
``train.secagg_train_advertise``    ``global`` + ``config`` + ``secagg {msg}`` (stage 0 request) → ``secagg {msg}``
``train.secagg_train_masked``       ``global`` + ``config`` + ``secagg {msg}`` (stage 2 request of a round whose keys
                                    were set up in the round before) → ``secagg {msg}`` (the masked input)
``train.secagg_consistency_next``,  ``secagg {msg, next}``: this round's stage 3 / 4 request and the next round's
``train.secagg_unmask_next``        stage 0 / 1 request, either may be absent → ``secagg {msg}``: the two replies
                                    (:func:`pack_pair`)
``query.evaluate``                  ``global`` + ``config`` → ``eval``: aggregate sums only (``queries.evaluation``)
==================================  =================================================================================

:class:`AggregationFlow` is the server side of one synchronisation round (paper §III-B, Table II: the sampled sites
train locally and only Θc is aggregated with sample-size-weighted FedAvg). It follows the shape of the pinned Flower's
``flwr.serverapp.strategy.Strategy``: a base class whose hooks (:meth:`~AggregationFlow.check_sample`,
:meth:`~AggregationFlow.configure`, :meth:`~AggregationFlow.collect`, :meth:`~AggregationFlow.aggregate`) a
subclass fills in, and one template (:meth:`~AggregationFlow.run_round`) that owns the steps every flow shares:
send the training request, turn an abort into an unchanged global model. The round loop itself (sampling,
checkpoints, evaluation) stays in ``apps.server_app``.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fcd_secure.audit.rules import SECAGG_PREFIX
from fcd_secure.federation.messaging import Comm
from fcd_secure.errors import FcdError

if TYPE_CHECKING:  # pragma: no cover - fcd_secure.config pulls in torch; the record names must not
    from fcd_secure.config import RunConfig

log = logging.getLogger("fcd_secure.federation")

# -- message types ---------------------------------------------------------------------------------------------------
HELLO_ACTION = "hello"
EVALUATE_ACTION = "evaluate"
HELLO_MESSAGE_TYPE = f"query.{HELLO_ACTION}"
EVALUATE_MESSAGE_TYPE = f"query.{EVALUATE_ACTION}"
TRAIN_MESSAGE_TYPE = "train"
#: Secure-aggregation actions are ``train.secagg_<stage>``; ``<stage>`` is a protocol stage name or one of the
#: stages below.
SECAGG_ACTION_PREFIX = SECAGG_PREFIX.removeprefix(f"{TRAIN_MESSAGE_TYPE}.")  # spelled once, in the gate's rules
#: the secure evaluation's preparation (``federation.secure.secure_evaluation``): evaluate, keep the sums, reply the
#: schema
SECAGG_EVALUATE_STAGE = "evaluate"
#: the combined stages of a training round (``federation.secure.flow``; the egress gate bounds each reply)
SECAGG_TRAIN_ADVERTISE_STAGE = "train_advertise"
SECAGG_TRAIN_MASKED_STAGE = "train_masked"
SECAGG_CONSISTENCY_NEXT_STAGE = "consistency_next"
SECAGG_UNMASK_NEXT_STAGE = "unmask_next"

# -- record names ----------------------------------------------------------------------------------------------------
REC_GLOBAL = "global"
REC_CONFIG = "config"
REC_UPDATE = "update"
REC_METRICS = "metrics"
REC_NUM = "num"
REC_HELLO = "hello"
REC_EVAL = "eval"
REC_SECAGG = "secagg"
#: The one field of a ``secagg`` record: the strict byte encoding of a protocol message.
SECAGG_FIELD = "msg"
#: The extra downlink field of an evaluation round's first stage: the agreed layout (union of the sites' schemas).
SECAGG_EVAL_LAYOUT_FIELD = "layout"
#: The downlink field of a combined stage that carries the next training round's request.
SECAGG_NEXT_FIELD = "next"

#: Run-config key under which a deployment carries the resolved ``RunConfig`` as JSON (``engines.deployment``).
RUN_CONFIG_KEY = "fcd-config"


def secagg_action(stage: str) -> str:
    """The ClientApp action of one secure-aggregation stage (``secagg_<stage>``)."""
    return SECAGG_ACTION_PREFIX + stage


def secagg_message_type(stage: str) -> str:
    """The message type of one secure-aggregation stage (``train.secagg_<stage>``)."""
    return f"{TRAIN_MESSAGE_TYPE}.{secagg_action(stage)}"


def secagg_round_id(server_round: int, *, pipelined: bool) -> int:
    """The protocol round id of a training round: ``2r`` when its keys were set up during round r − 1, ``2r + 1``
    when they are set up in the round itself. A site takes each id once and in increasing order (P5), so a round
    whose early setup was lost (an abort, a server restart) can still run with fresh keys under its second id."""
    return 2 * int(server_round) + (0 if pipelined else 1)


def pack_pair(first: bytes, second: bytes) -> bytes:
    """Two protocol messages in one field: each behind its 4-byte big-endian length (empty: absent)."""
    return b"".join(len(b).to_bytes(4, "big") + b for b in (first, second))


def unpack_pair(blob: bytes) -> tuple[bytes, bytes]:
    """The two messages of :func:`pack_pair`.

    Raises:
        ValueError: the lengths do not account for every byte exactly.
    """
    out: list[bytes] = []
    at = 0
    for _ in range(2):
        if at + 4 > len(blob):
            raise ValueError("pair of protocol messages: truncated length")
        n = int.from_bytes(blob[at:at + 4], "big")
        if at + 4 + n > len(blob):
            raise ValueError("pair of protocol messages: truncated message")
        out.append(bytes(blob[at + 4:at + 4 + n]))
        at += 4 + n
    if at != len(blob):
        raise ValueError("pair of protocol messages: bytes left over")
    return out[0], out[1]


# -- arrays and configs in records -----------------------------------------------------------------------------------
def arrays_to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Arrays keyed by manifest name, in name order (so the serialized bytes do not depend on dict order)."""
    return ArrayRecord({name: Array(np.ascontiguousarray(arrays[name])) for name in sorted(arrays)})


def record_to_arrays(rec: ArrayRecord) -> dict[str, np.ndarray]:
    """The arrays of an ``ArrayRecord``, keyed by their record names."""
    return {name: arr.numpy() for name, arr in rec.items()}


#: the two fields of a packed global-parameters record (:func:`global_to_record`)
GLOBAL_INDEX, GLOBAL_DATA = "index", "data"


def global_to_record(arrays: dict[str, np.ndarray]) -> ConfigRecord:
    """The global parameters the server sends down, packed into one record of two byte strings: a JSON index (name,
    dtype, shape per tensor, in name order) and the tensors' bytes back to back.

    Flower stores, pushes and pulls every object of a message on its own, one HTTP request each at every hop
    (ServerApp → SuperLink → SuperNode → task), and an ``ArrayRecord`` is a tree (the record, each array, each array's
    chunks): the tiny model's Θc as one array per tensor was 56 objects, and its delivery took 20-37 s per message on
    loopback; as two arrays, 5. As one ``ConfigRecord`` it is 1. Replies are not packed: the egress gate checks each
    tensor a site sends by its manifest name (``audit.rules``).
    """
    names = sorted(arrays)
    parts = [np.require(arrays[n], requirements="C") for n in names]  # keeps a 0-d tensor 0-d
    index = json.dumps([[n, p.dtype.str, list(p.shape)] for n, p in zip(names, parts)]).encode()
    return ConfigRecord({GLOBAL_INDEX: index, GLOBAL_DATA: b"".join(p.tobytes() for p in parts)})


def record_to_global(rec: ConfigRecord) -> dict[str, np.ndarray]:
    """The tensors of a :func:`global_to_record` record (copies; a malformed record is a ``ValueError``).

    Raises:
        ValueError: not two byte strings, the index does not parse, names a non-numeric dtype, or does not account
            for every byte.
    """
    if not isinstance(rec, ConfigRecord) or set(rec.keys()) != {GLOBAL_INDEX, GLOBAL_DATA}:
        raise ValueError(f"global parameters: expected a record of the byte strings {GLOBAL_INDEX!r} and {GLOBAL_DATA!r}")
    raw_index, data = rec[GLOBAL_INDEX], rec[GLOBAL_DATA]
    if not isinstance(raw_index, bytes) or not isinstance(data, bytes):
        raise ValueError(f"global parameters: {GLOBAL_INDEX!r} and {GLOBAL_DATA!r} must be bytes")
    try:
        index = json.loads(raw_index)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("global parameters: the index is not JSON") from None
    out: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype_str, shape in index:
        dtype = np.dtype(dtype_str)
        if dtype.kind not in "fiub":
            raise ValueError(f"global parameters: {name}: dtype {dtype_str!r} is not numeric")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        end = offset + count * dtype.itemsize
        if end > len(data) or name in out:
            raise ValueError(f"global parameters: {name}: the index does not match the data")
        out[str(name)] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(tuple(shape)).copy()
        offset = end
    if offset != len(data):
        raise ValueError("global parameters: bytes left over after the last tensor")
    return out


def config_record(round_config: dict) -> ConfigRecord:
    """Round config as a ConfigRecord; ``None`` values are dropped (ConfigRecord has no null)."""
    return ConfigRecord({k: v for k, v in round_config.items() if v is not None})


def config_from_context(context: Context, fallback: RunConfig | None) -> RunConfig:
    """The run config: the ``fcd-config`` run-config entry (deployment; a question run's question is read by
    ``federation.asked_runs.question_start_of``), else ``fallback`` (simulation).

    Raises:
        RuntimeError: neither is there.
    """
    from fcd_secure.config import RunConfig  # noqa: PLC0415 - see the TYPE_CHECKING import above

    from fcd_secure.federation.asked_runs import split_config_text  # noqa: PLC0415 - it imports nothing of this module

    raw = context.run_config.get(RUN_CONFIG_KEY) if context.run_config else None
    if raw:
        fields, question = split_config_text(str(raw))
        # a question run's text carries the question beside the config (``federation.asked_runs``)
        return RunConfig.from_json(str(raw) if question is None else json.dumps(fields))
    if fallback is None:
        raise RuntimeError(f"no run configuration: the run config has no {RUN_CONFIG_KEY!r} entry")
    return fallback


def config_came_from_server(context: Context) -> bool:
    """Whether this message's run config was sent by the server (deployment) rather than held by the site."""
    return bool(context.run_config and context.run_config.get(RUN_CONFIG_KEY))


# -- the aggregation flow --------------------------------------------------------------------------------------------
@dataclass
class RoundOutcome:
    """What one round produced. ``theta_c is None`` means the round was aborted and the global model is unchanged."""

    theta_c: dict[str, np.ndarray] | None
    n_total: float | None
    participants: list[int]
    failures: list[int]
    metrics: dict = field(default_factory=dict)


class RoundAborted(FcdError, Exception):
    """Raised by a flow hook: the round ends here and the global model stays as it was.

    Args:
        reason: why, in words (``RoundOutcome.metrics["aborted"]``).
        participants: node ids that had contributed so far; every other sampled node counts as a failure.
        metrics: extra outcome metrics (e.g. the secure-aggregation stage report).
    """

    def __init__(self, reason: str, participants: Iterable[int] = (), metrics: dict | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.participants = list(participants)
        self.metrics = dict(metrics or {})


@dataclass
class Round:
    """One round as the hooks of an :class:`AggregationFlow` see it."""

    comm: Comm
    node_ids: list[int]
    server_round: int
    global_theta: dict[str, np.ndarray]
    round_config: dict[str, Any]
    started: float = field(default_factory=time.perf_counter)
    #: the sites the next round will sample, when the round loop knows them now (a flow may prepare that round)
    next_node_ids: list[int] | None = None

    def failures(self, participants: Iterable[int]) -> list[int]:
        """The sampled nodes not in ``participants``, in sampling order."""
        done = set(participants)
        return [n for n in self.node_ids if n not in done]


C = TypeVar("C")


class AggregationFlow(ABC, Generic[C]):
    """Server side of one DSS round: how the sampled sites' Θc become the next global Θc.

    A subclass sets :attr:`train_message_type` and :attr:`train_timeout_s` and implements :meth:`collect` (the
    training replies → whatever :meth:`aggregate` needs, possibly over further exchanges) and :meth:`aggregate`.
    Any hook may raise :class:`RoundAborted`; :meth:`run_round` turns that into an outcome with ``theta_c = None``.
    """

    #: message type of the training request
    train_message_type: str = TRAIN_MESSAGE_TYPE
    #: how long the sampled sites have to answer the training request
    train_timeout_s: float = 600.0

    # -- hooks ---------------------------------------------------------------------------------------------------
    def check_sample(self, rnd: Round) -> None:
        """Refuse a sample this flow cannot aggregate by raising :class:`RoundAborted` (default: accept any)."""

    def configure(self, rnd: Round) -> RecordDict:
        """The training request every sampled site receives: the global parameters and the round config."""
        return RecordDict(
            {
                REC_GLOBAL: global_to_record(rnd.global_theta),
                REC_CONFIG: config_record({**rnd.round_config, "server-round": int(rnd.server_round)}),
            }
        )

    def send(self, rnd: Round, content: RecordDict) -> dict[int, Message]:
        """Send the training request to the sampled sites and wait for their replies (late sites are absent)."""
        return rnd.comm.send(rnd.node_ids, self.train_message_type, content, self.train_timeout_s, round=rnd.server_round)

    @abstractmethod
    def collect(self, rnd: Round, replies: dict[int, Message]) -> C:
        """Turn the training replies into the input of :meth:`aggregate`; raise :class:`RoundAborted` to stop."""

    @abstractmethod
    def aggregate(self, rnd: Round, collected: C) -> RoundOutcome:
        """The new global parameters (same names and dtypes as ``rnd.global_theta``) and the round's metrics."""

    # -- the template ----------------------------------------------------------------------------------------------
    def run_round(
        self,
        comm: Comm,
        node_ids: list[int],
        server_round: int,
        global_theta: dict[str, np.ndarray],
        round_config: dict[str, Any],
        next_node_ids: list[int] | None = None,
    ) -> RoundOutcome:
        """Run one round: check the sample, send the training request, collect, aggregate.

        Args:
            comm: the server's door to the sites (every message is counted).
            node_ids: the sampled sites' Flower node ids.
            server_round: the round number (1-based); it rides in the request config and the message group id.
            global_theta: the current global parameters, keyed by manifest name.
            round_config: ``part`` and ``local-epochs`` for the sites.
            next_node_ids: the next round's sampled sites when already known (None: the last round, or unknown).

        Returns:
            The round's outcome; ``theta_c is None`` when the round was aborted (global model unchanged).
        """
        rnd = Round(comm, [int(n) for n in node_ids], int(server_round), global_theta, dict(round_config),
                    next_node_ids=None if next_node_ids is None else [int(n) for n in next_node_ids])
        try:
            self.check_sample(rnd)
            replies = self.send(rnd, self.configure(rnd))
            return self.aggregate(rnd, self.collect(rnd, replies))
        except RoundAborted as stop:
            log.warning("round %d aborted: %s (global model unchanged)", rnd.server_round, stop.reason)
            return RoundOutcome(
                None, None, stop.participants, rnd.failures(stop.participants), {"aborted": stop.reason, **stop.metrics}
            )

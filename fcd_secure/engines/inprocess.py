"""Run the Flower app in this process, without Ray: the same ServerApp round loop (``server_app.run_federation``), the
same ClientApp (egress gate, guard, plain and secure actions) and the same Message API, carried by a
:class:`flwr.serverapp.Grid` that hands each message to the ClientApp directly.

Why it exists: Flower's simulation engine starts a Ray cluster and an actor for every run, a fixed 20–50 s on a
shared 2-core machine. A study that trains many small federations (``fcd reproduce``: every method × dataset × seed)
would spend most of its time starting Ray. :func:`run_inprocess` is the simulation engine's message semantics
without that cost, and tests pin that both give the same global parameters bit for bit.

What the grid does for each pushed message, as Flower's simulation engine does: it gives the message an id, passes
a *copy* (its object tree deflated and inflated, as Flower's transport carries it) to the ClientApp with that node's
:class:`~flwr.app.Context` (``node_config`` ``partition-id`` / ``num-partitions``, a ``state`` kept per node for the
run), turns an exception into an error reply (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``) and keeps the reply, with
its own id, until the server pulls it. Messages are processed one at a time in push order (one actor, as
``simulation.backend_config`` sets up).
"""

from __future__ import annotations

import logging
import secrets
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fcd_secure._flower.internals import SUPERLINK_NODE_ID, ErrorCode, TaskIdentity, transport_copy
from fcd_secure.config import RunConfig
from fcd_secure.errors import FcdError
from fcd_secure.apps.client_app import make_client_app
from fcd_secure.apps.outputs import write_run_folder
from fcd_secure.apps.server_app import FederationResult, run_federation
from fcd_secure.apps.server_loop import ProgressHook
from fcd_secure.engines.choice import Engine
from fcd_secure.engines.simulation import provision_simulated_roster, write_simulated_policies, quiet_flower_env
from fcd_secure.federation.state import ServerCheckpoint

__all__ = ["InProcessGrid", "run_inprocess", "run_rounds"]

log = logging.getLogger("fcd_secure.federation")

#: ``summary.json``'s engine name of a run folder written by :func:`run_inprocess`.
ENGINE = Engine.INPROCESS.summary_name


class InProcessGrid(Grid):
    """A Flower ``Grid`` whose nodes are ClientApp calls in this process (module docstring).

    Args:
        client_app: the ClientApp every node runs.
        n_nodes: number of nodes (partition ids 0..n_nodes−1).
    """

    def __init__(self, client_app: ClientApp, n_nodes: int) -> None:
        self._app = client_app
        self._run_id = secrets.randbits(63)
        self._node_ids = [secrets.randbits(63) for _ in range(n_nodes)]
        self._contexts = {
            nid: Context(
                run_id=self._run_id, node_id=nid,
                node_config={"partition-id": i, "num-partitions": n_nodes}, state=RecordDict(), run_config={},
            )
            for i, nid in enumerate(self._node_ids)
        }
        self._replies: dict[str, Message] = {}
        self._run = None

    @property
    def run_id(self) -> int:
        """The run id of every message and node context of this grid."""
        return self._run_id

    # -- the Grid interface ----------------------------------------------------------------------------------
    def set_run(self, run) -> None:  # noqa: ANN001 - flwr's Run
        self._run = run

    @property
    def run(self):  # noqa: ANN201 - flwr's Run
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp now; returns the message ids (the replies wait for a pull).

        Raises:
            ValueError: a message for a node that does not exist.
        """
        ids: list[str] = []
        for msg in messages:
            dst = int(msg.metadata.dst_node_id)
            if dst not in self._contexts:
                raise ValueError(f"no node {dst} in this grid")
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            ids.append(msg.metadata.message_id)
            delivered = transport_copy(msg)
            try:
                reply = self._app(delivered, self._contexts[dst])
            except Exception as exc:  # noqa: BLE001 - a site's failure is an error reply, as in Flower's engine
                log.error("ClientApp raised %s on %s", type(exc).__name__, msg.metadata.message_type)
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc)}:<'{exc}'>"),
                    reply_to=delivered,
                )
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self._replies[msg.metadata.message_id] = transport_copy(reply)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(mid) for mid in list(message_ids) if mid in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def run_inprocess(
    cfg: RunConfig,
    progress: ProgressHook | None = None,
    stop: threading.Event | None = None,
    server_app_factory: Callable[[RunConfig, dict], ServerApp] | None = None,
) -> FederationResult:
    """Run the whole federation of ``cfg`` in this process (same arguments and result as
    :func:`~fcd_secure.engines.simulation.run_simulated`).

    Args:
        cfg: the resolved run config; its state root defaults to ``<out>/state`` (a temp dir without an out folder).
        progress: the ServerApp's progress hook.
        stop: set it (a signal handler of this process) to end the run at its next wait for replies
            (``server_app.run_federation``): here the check after each round's messages, since a site answers
            while the message is pushed.
        server_app_factory: ``(cfg, sink) -> ServerApp`` for another server job on the same sites (e.g.
            ``apps.whatif_app.make_whatif_server_app``), called with this grid and a server context as Flower's
            engines call a ServerApp; its result is ``sink["result"]``. Default: the training federation.

    Returns:
        The ``FederationResult`` (or the other job's result); the run folder is written when ``cfg.out`` is set and
        the job is training.

    Raises:
        RuntimeError: the other job ended without a result.
    """
    quiet_flower_env()
    root = cfg.state_root() or Path(tempfile.mkdtemp(prefix="fcd-state-"))
    cfg = cfg.model_copy(update={"state_dir": str(root)})
    Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
    write_simulated_policies(cfg)  # each site enforces its own policy, as on the simulation engine
    if cfg.federation.secure_aggregation:
        provision_simulated_roster(cfg)
    grid = InProcessGrid(make_client_app(cfg), cfg.data.n_sites)
    # the server's task identity, which Flower's Message constructor reads (run_simulation sets it the same way)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    if server_app_factory is not None:
        sink: dict = {}
        context = Context(run_id=grid.run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                          run_config={})
        server_app_factory(cfg, sink)(grid, context)
        if "result" not in sink:
            raise RuntimeError("the server job ended without a result (see the log above)")
        return sink["result"]
    t0 = time.perf_counter()
    result = run_federation(grid, cfg, progress, stop)
    result.extra["engine"] = ENGINE
    result.extra["engine_s"] = time.perf_counter() - t0
    if cfg.out:
        write_run_folder(cfg.out, cfg, result, engine=ENGINE)
    return result


class _RoundsDone(FcdError):
    """Raised by :func:`run_rounds`'s progress hook once the rounds are done, before the closing evaluation."""


def run_rounds(cfg: RunConfig) -> tuple[dict[str, np.ndarray], list[dict]]:
    """The training rounds of ``cfg`` on this engine and nothing after them: Θc after the last round (the run's
    checkpoint) and the rounds' rows (``rounds.csv``'s, with ``round_s`` and ``n_total``), without the round
    selection's closing evaluation and without a run folder (the state in ``cfg.state_dir``, else a temporary
    folder).

    For a reference whose figures are the rounds' own (a deployment's Θc after its rounds, the seconds per round):
    the closing evaluation changes neither and was half of a one-round tiny run's time (cProfile, 4 sites, two
    policies with one rollout each: 28 of 60 s). Θc is the run's final one when the run keeps its last round (one
    round, or ``federation.select = "last"``).

    Raises:
        RuntimeError: the run ended without reaching its closing evaluation.
    """
    rows: list[dict] = []

    def progress(event: str, info: dict) -> None:
        if event == "round":
            rows.append(dict(info))
        elif event == "selected":  # the rounds and their checkpoints are done; the closing evaluation comes next
            raise _RoundsDone

    root = Path(cfg.state_dir) if cfg.state_dir else Path(tempfile.mkdtemp(prefix="fcd-state-"))
    try:
        run_inprocess(cfg.model_copy(update={"out": None, "state_dir": str(root)}), progress)
    except _RoundsDone:
        _, theta, *_ = ServerCheckpoint(root).load()
        return theta, rows
    raise RuntimeError("the run ended without reaching its closing evaluation")

"""What the site's own SuperExec (``fcd_secure.engines.site_exec``) takes from Flower's task plumbing.

The site's executor decides *whether* a task runs (its app hash against the site policy); how a task is acquired,
pulled, heart-beaten and answered is Flower's own (flwr 1.42 ``flwr.supercore.superexec.run_superexec`` and
``flwr.supernode.runtime.run_clientapp``), imported here and nowhere else. One function is copied:
:func:`pull_task_input` is Flower's with the short object-pull backoff of :mod:`fcd_secure._flower.waits`.
Importing this module checks the Flower version and the source of every function it copies or mirrors
(:func:`fcd_secure._flower.pins.require`).
"""

from __future__ import annotations

import logging
import time

import flwr.supercore.superexec.run_superexec
import flwr.supernode.runtime.run_clientapp
from flwr.app import Message
from flwr.common.constant import SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fcd_secure._flower.pins import require
from fcd_secure._flower.waits import PULL_BACKOFF_CAP_S, PULL_BACKOFF_S

require("superexec")

__all__ = [
    "AcquireTaskRequest", "HeartbeatSender", "RuntimeTokenHttpInterceptor", "SubStatus", "SuperExecAuthHttpInterceptor",
    "TaskType", "make_task_heartbeat_fn_http", "pull_task_input", "push_message", "push_task_output",
    "quiet_heartbeat", "runtime_client", "start_parent_process_monitor",
]

log = logging.getLogger("fcd_secure.site_exec")


def runtime_client(address: str, interceptors: list, *, retry: bool = True) -> RuntimeHttpClient:
    """A client of the SuperNode's Runtime API.

    With ``retry`` it uses Flower's HTTP retry invoker, which also ends the process (SIGINT) when its token is no
    longer accepted (HTTP 401), as a task process should. Without it every error is raised to the caller: the
    executor's own per-task heartbeats must never end the executor when a task's token lapses because it finished.
    """
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,  # the SuperNode's Runtime API on loopback; tasks authenticate with their token
        root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), *interceptors],
        retry_invoker=make_simple_http_retry_invoker() if retry else None,
    )


def pull_task_input(client):
    """The task's message, context, run and FAB from the SuperNode: flwr 1.42's
    ``flwr.supernode.runtime.run_clientapp.pull_task_input`` with the short object-pull backoff of
    ``_flower.waits`` (the SuperNode creates the task before it holds the message's objects)."""
    t0 = time.perf_counter()
    res = client.PullTaskInput(PullTaskInputRequest())
    t_input = time.perf_counter() - t0
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
        initial_backoff=PULL_BACKOFF_S,
        backoff_cap=PULL_BACKOFF_CAP_S,
        max_tries_per_object=None,  # bounded by Flower's PULL_MAX_TIME, as with its defaults
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # the deflated message does not carry its own id
    log.info("task input %.3f s, message %.3f s (%d objects)", t_input, time.perf_counter() - t0 - t_input,
             len(tree.children))
    return message, context, run, fab


def quiet_heartbeat(client):
    """A task heartbeat that never fails the executor: Flower's own one raises SIGINT in its process when the
    SuperNode no longer knows the task (it finished), which would stop the executor; ``client`` must be built
    without Flower's retry invoker (:func:`runtime_client`), which does the same on HTTP 401."""
    import httpx  # noqa: PLC0415

    def beat() -> bool:
        try:
            client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        except httpx.HTTPError:
            pass  # the task is over or the SuperNode is gone; the task process reports its own outcome
        return True

    return beat

"""Flower 1.42's hard-wired waits, shortened where the pinned version leaves no option to set them.

Measured on loopback (the site executor's per-task timings; the constants are read from
flwr 1.42's ``flwr.supernode`` and ``flwr.server.grid`` modules), a secure-aggregation stage of a deployment spent seconds in sleeps, not in work:

* the SuperNode loop (``flwr.supernode.start_client_internal``) sleeps **3 s** after every pull that finds no
  message and **0.5 s** while it waits for the ClientApp's reply or its objects;
* a message's objects are pulled with a backoff from **1 s** doubling to 10 s whenever one is not there yet: by the
  SuperNode from the SuperLink (it creates the task before it has the objects), by the task from the SuperNode, and
  by the ServerApp's grid from the SuperLink (a reply is listed before its objects arrive). Chained, one late object
  costs 1 + 2 + 4 + ... seconds.

:func:`shorten_supernode_waits` (the site's SuperNode, ``_flower.supernode_main``) and
:func:`shorten_grid_backoff` (the ServerApp's ``HttpGrid``) cap these at :func:`idle_poll_s`, :data:`REPLY_POLL_S` and
:data:`PULL_BACKOFF_S`/:data:`PULL_BACKOFF_CAP_S`; only the names those Flower modules look up change, nothing
about what is sent, to whom, or how it is authenticated. The cost is more requests while waiting (one per
:func:`idle_poll_s` per idle SuperNode instead of one per 3 s). Importing this module refuses another Flower version, or a Flower whose patched functions changed
(:func:`fcd_secure._flower.pins.require`).

:func:`wake_executor_on_messages` is the other half of ``_flower.wake``: the SuperNode loop signals the site's
executor once a pulled message and its objects are stored, instead of the executor polling for it.
"""

from __future__ import annotations

import functools
import time
import types

import flwr.supercore.inflatable.inflatable_utils
import flwr.superlink.grid.http_grid
import flwr.supernode.start_client_internal

from fcd_secure._flower.pins import require

# every Flower object this module patches still has the source it was read from (``_flower.pins.SOURCES``)
require("waits")

#: the least the SuperNode loop waits between two pulls from the SuperLink that found no message (s)
IDLE_POLL_S = 0.2
#: the consortium's idle SuperNodes together pull from the SuperLink at most this often (per second): each pull costs
#: the SuperLink about 9 ms of CPU (TLS, an ECDSA P-384 signature check, the state; py-spy on loopback), so ten
#: sites at :data:`IDLE_POLL_S` kept 0.43 of a core busy doing nothing
SUPERLINK_PULLS_PER_S = 20.0
#: the SuperNode loop's wait between two looks at its ClientApp's reply (a read of its own state, no request) (s)
REPLY_POLL_S = 0.1
#: the environment variable that hands the idle poll (:func:`idle_poll_s`) to ``_flower.supernode_main``
IDLE_POLL_ENV = "FCD_SUPERNODE_IDLE_POLL_S"
#: the least wait (s) between two pulls of replies by a ServerApp on the Deployment Engine: each pull is an HTTP
#: request that costs the SuperLink milliseconds of CPU (above), where the simulation's in-memory grid costs nothing
HTTP_GRID_POLL_S = 0.1
#: objects the ServerApp's grid pushes at once (Flower: 2, and never more than the CPU count); the requests wait on
#: the SuperLink, not on the ServerApp's CPU
GRID_TRANSFERS = 8
#: first wait and cap (s) when a message object is not there yet
PULL_BACKOFF_S, PULL_BACKOFF_CAP_S = 0.02, 0.25


def short_pull(pull_objects):
    """``pull_objects`` with the short backoff (bounded by Flower's own ``PULL_MAX_TIME``, as with its defaults)."""
    if isinstance(pull_objects, functools.partial):
        return pull_objects  # patched already
    return functools.partial(pull_objects, initial_backoff=PULL_BACKOFF_S, backoff_cap=PULL_BACKOFF_CAP_S,
                             max_tries_per_object=None)


def idle_poll_s(n_sites: int) -> float:
    """The SuperNode's wait after a pull that found no message, in a consortium of ``n_sites``: at least
    :data:`IDLE_POLL_S`, and long enough that the sites together stay within :data:`SUPERLINK_PULLS_PER_S`."""
    return max(IDLE_POLL_S, int(n_sites) / SUPERLINK_PULLS_PER_S)


def shorten_supernode_waits(idle_s: float = IDLE_POLL_S) -> None:
    """Cap the SuperNode loop's sleeps and object-pull backoff (module docstring).

    Args:
        idle_s: the wait after a pull from the SuperLink that found no message (Flower: 3 s), :func:`idle_poll_s`.
    """
    from flwr.supernode import start_client_internal as loop  # noqa: PLC0415

    if not isinstance(loop.time, types.SimpleNamespace):
        clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
        # the loop sleeps 3 s after an empty pull and 0.5 s while it waits for its ClientApp's reply or objects
        clock.sleep = lambda seconds: time.sleep(idle_s if seconds >= 1 else min(float(seconds), REPLY_POLL_S))
        loop.time = clock
    loop.pull_objects = short_pull(loop.pull_objects)


def wake_executor_on_messages(pipe: str) -> None:
    """After the SuperNode loop has stored a message for a task (``_pull_and_store_message`` returned its run),
    wake the executor waiting on ``pipe`` (``_flower.wake``).
    """
    from flwr.supernode import start_client_internal as loop  # noqa: PLC0415

    from fcd_secure._flower.wake import notify  # noqa: PLC0415

    pull_and_store = loop._pull_and_store_message  # noqa: SLF001 - the name the loop calls, flwr 1.42
    if getattr(pull_and_store, "wakes", None) == pipe:
        return

    @functools.wraps(pull_and_store)
    def pull_store_and_wake(*args, **kwargs):
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            notify(pipe)
        return run_id

    pull_store_and_wake.wakes = pipe
    loop._pull_and_store_message = pull_store_and_wake  # noqa: SLF001


def shorten_grid_backoff() -> None:
    """The ServerApp's grid pulls the sites' reply objects with the short backoff (module docstring).
    """
    from flwr.superlink.grid import http_grid  # noqa: PLC0415
    from flwr.supercore.inflatable import inflatable_utils  # noqa: PLC0415

    http_grid.pull_objects = short_pull(http_grid.pull_objects)
    if not isinstance(http_grid.push_objects, functools.partial):
        http_grid.push_objects = functools.partial(http_grid.push_objects, max_concurrent_pushes=GRID_TRANSFERS)
        inflatable_utils.get_num_workers = lambda max_concurrent: max(1, int(max_concurrent))


def grid_poll_s(grid, poll_s: float) -> float:
    """The ServerApp's wait between two pulls of replies from ``grid``: ``poll_s`` (``federation.poll_s``), and at
    least :data:`HTTP_GRID_POLL_S` on the Deployment Engine's ``HttpGrid``."""
    from flwr.superlink.grid.http_grid import HttpGrid  # noqa: PLC0415

    return max(float(poll_s), HTTP_GRID_POLL_S) if isinstance(grid, HttpGrid) else float(poll_s)

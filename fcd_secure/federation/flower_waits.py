"""Flower 1.42's hard-wired waits, shortened where the pinned version leaves no option to set them.

Measured on loopback (the site executor's per-task timings; the constants are read from
flwr 1.42's ``flwr.supernode`` and ``flwr.server.grid`` modules), a secure-aggregation stage of a deployment spent seconds in sleeps, not in work:

* the SuperNode loop (``flwr.supernode.start_client_internal``) sleeps **3 s** after every pull that finds no
  message and **0.5 s** while it waits for the ClientApp's reply or its objects;
* a message's objects are pulled with a backoff from **1 s** doubling to 10 s whenever one is not there yet: by the
  SuperNode from the SuperLink (it creates the task before it has the objects), by the task from the SuperNode, and
  by the ServerApp's grid from the SuperLink (a reply is listed before its objects arrive). Chained, one late object
  costs 1 + 2 + 4 + ... seconds.

:func:`shorten_supernode_waits` (the site's SuperNode, ``federation.supernode_main``) and
:func:`shorten_grid_backoff` (the ServerApp's ``HttpGrid``) cap these at :data:`IDLE_POLL_S` and
:data:`PULL_BACKOFF_S`/:data:`PULL_BACKOFF_CAP_S`; only the names those Flower modules look up change, nothing
about what is sent, to whom, or how it is authenticated. The cost is more requests while waiting (one per
:data:`IDLE_POLL_S` per idle SuperNode instead of one per 3 s). Both refuse to patch another Flower version.
"""

from __future__ import annotations

import functools
import time
import types

#: the Flower release these module-level names were read from (``provisioning.versions`` pins it)
FLWR_VERSION = "1.42.0"
#: the longest the SuperNode loop waits between two looks at the SuperLink or at the ClientApp's reply (s)
IDLE_POLL_S = 0.2
#: first wait and cap (s) when a message object is not there yet
PULL_BACKOFF_S, PULL_BACKOFF_CAP_S = 0.02, 0.25


class FlowerVersionError(RuntimeError):
    """The installed Flower is not the version whose waits this module shortens."""


def _check_version() -> None:
    import flwr  # noqa: PLC0415

    if flwr.__version__ != FLWR_VERSION:
        raise FlowerVersionError(f"fcd_secure.federation.flower_waits: written for flwr {FLWR_VERSION}, found "
                                 f"{flwr.__version__}; check its waits before running it")


def short_pull(pull_objects):
    """``pull_objects`` with the short backoff (bounded by Flower's own ``PULL_MAX_TIME``, as with its defaults)."""
    if isinstance(pull_objects, functools.partial):
        return pull_objects  # patched already
    return functools.partial(pull_objects, initial_backoff=PULL_BACKOFF_S, backoff_cap=PULL_BACKOFF_CAP_S,
                             max_tries_per_object=None)


def shorten_supernode_waits() -> None:
    """Cap the SuperNode loop's sleeps and object-pull backoff (module docstring).

    Raises:
        FlowerVersionError: another Flower version.
    """
    _check_version()
    from flwr.supernode import start_client_internal as loop  # noqa: PLC0415

    if not isinstance(loop.time, types.SimpleNamespace):
        clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
        clock.sleep = lambda seconds: time.sleep(min(float(seconds), IDLE_POLL_S))
        loop.time = clock  # the loop's `time.sleep(3)` and `time.sleep(0.5)`
    loop.pull_objects = short_pull(loop.pull_objects)


def shorten_grid_backoff() -> None:
    """The ServerApp's grid pulls the sites' reply objects with the short backoff (module docstring).

    Raises:
        FlowerVersionError: another Flower version.
    """
    _check_version()
    from flwr.superlink.grid import http_grid  # noqa: PLC0415

    http_grid.pull_objects = short_pull(http_grid.pull_objects)

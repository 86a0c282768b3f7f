"""Start a simulated federation on the chosen local engine (``engines.choice.Engine``): one call with the same
arguments for both, so ``fcd run`` and ``fcd whatif`` choose an engine in one place."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fcd_secure.engines.choice import Engine

if TYPE_CHECKING:  # pragma: no cover
    from flwr.serverapp import ServerApp

    from fcd_secure.apps.server_loop import ProgressHook
    from fcd_secure.config import RunConfig

__all__ = ["ServerAppFactory", "run_on"]

#: ``(cfg, sink) -> ServerApp`` for a server job other than training, which puts its result in ``sink["result"]``
ServerAppFactory = Callable[["RunConfig", dict], "ServerApp"]


def run_on(
    engine: Engine,
    cfg: "RunConfig",
    progress: "ProgressHook | None" = None,
    stop: threading.Event | None = None,
    server_app_factory: ServerAppFactory | None = None,
) -> Any:
    """Run ``cfg``'s federation (or ``server_app_factory``'s job) on ``engine``; both engines take the same
    arguments (``engines.simulation.run_simulated``).

    Returns:
        The ``FederationResult`` of training (the run folder written when ``cfg.out`` is set), or the other job's
        ``sink["result"]``.
    """
    if engine is Engine.INPROCESS:
        from fcd_secure.engines.inprocess import run_inprocess  # noqa: PLC0415 - torch and Flower load only to run

        return run_inprocess(cfg, progress, stop=stop, server_app_factory=server_app_factory)
    from fcd_secure.engines.simulation import run_simulated  # noqa: PLC0415 - torch, Flower and Ray load only to run

    return run_simulated(cfg, progress, stop=stop, server_app_factory=server_app_factory)

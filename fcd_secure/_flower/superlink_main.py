"""``flower-superlink`` whose Control API answers only the coordinator host (``fcd server start --control-api-address``).

Flower 1.42 serves its Fleet API (the sites' SuperNodes), its Control API (``flwr run``, ``flwr supernode
register``, ``flwr ls``) and the ServerApp's Runtime API on **one** HTTP port (``--host``/``--port``; its own
``--control-api-address`` is deprecated and ignored). The Control API of open-source Flower is unauthenticated
(Flower 1.42 documentation: the Control API has no authentication in open-source Flower): whoever reaches the SuperLink could submit an app or register a SuperNode.
When the port must face the sites' network, binding alone cannot keep the Control API on the coordinator host.

This entry point starts Flower's own ``flower-superlink`` with one ASGI middleware in front of its app: a request to
the Control API (``/v1/control``) or the Runtime API (``/v1/runtime``, the ServerApp's) from any client address
other than the allowed ones is answered ``403`` before Flower sees it. The Fleet API and ``/health`` are unchanged.

It also scopes five of Flower's eight app-wide middlewares to the paths they act on (:func:`scope_middlewares`).
Each is a Starlette ``BaseHTTPMiddleware``, and each layer costs every request an anyio task group, streams and
events whether it acts or not: on loopback a SuperLink request cost about 11 ms of its CPU, 70 % of it in those
layers (py-spy), and the SuperLink's one event loop is what a 10-site round waits on. In Flower 1.42 the four
Control-API middlewares call the next layer unchanged for any path outside ``/v1/control/``, and the Fleet
event-log middleware does the same outside ``/v1/fleet/`` and whenever no event-log plugin is loaded (open-source
Flower loads none). Skipping a layer exactly where it would pass the request through changes nothing that is
answered; the node-authentication, protobuf-translation and error-translation layers still see every request.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable

import flwr.superlink.main
import flwr.superlink.routers.control.middlewares
import flwr.superlink.routers.fleet.middlewares

from fcd_secure._flower.pins import require

# Flower's create_app and the middlewares scoped below still have the source they were read from (_flower.pins)
require("superlink_main")

#: the paths only the coordinator host may call
COORDINATOR_ONLY = ("/v1/control", "/v1/runtime")
#: our option, taken off the command line before Flower parses it
ALLOW_OPTION = "--control-api-address"
DEFAULT_CONTROL_HOST = "127.0.0.1"


class CoordinatorOnly:
    """ASGI middleware: ``403`` for :data:`COORDINATOR_ONLY` paths unless the client address is in ``allowed``."""

    def __init__(self, app, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(COORDINATOR_ONLY):
            client = scope.get("client")
            if client is None or client[0] not in self.allowed:
                body = json.dumps({"detail": "the Control API answers only the coordinator host"}).encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


CONTROL_PREFIX, FLEET_PREFIX = "/v1/control/", "/v1/fleet/"


def _outside(prefix: str) -> Callable[[dict], bool]:
    def passes_through(scope: dict) -> bool:
        from starlette.datastructures import URL  # noqa: PLC0415

        # the middlewares test ``request.url.path``; the router routes on ``scope["path"]``: both must be outside
        return not scope["path"].startswith(prefix) and not URL(scope=scope).path.startswith(prefix)
    return passes_through


def _fleet_log_passes_through(scope: dict) -> bool:
    app = scope.get("app")
    no_plugin = app is not None and getattr(app.state, "fleet_event_log_plugin", None) is None
    return no_plugin or _outside(FLEET_PREFIX)(scope)


#: Flower middleware class name -> when it calls the next layer with the request unchanged (flwr 1.42,
#: ``flwr.superlink.routers.control.middlewares`` and ``flwr.superlink.routers.fleet.middlewares``)
PASS_THROUGH: dict[str, Callable[[dict], bool]] = {
    "ControlSensitiveResponseMiddleware": _outside(CONTROL_PREFIX),  # headers only on two Control auth routes
    "ControlAuthenticationMiddleware": _outside(CONTROL_PREFIX),
    "ControlLicenseMiddleware": _outside(CONTROL_PREFIX),
    "ControlEventLogMiddleware": _outside(CONTROL_PREFIX),
    "FleetEventLogMiddleware": _fleet_log_passes_through,
}


class Scoped:
    """ASGI middleware: ``middleware`` (a Starlette middleware class) only for the HTTP requests where
    ``passes_through(scope)`` is false; every other request goes straight to the next layer."""

    def __init__(self, app, middleware: type, passes_through: Callable[[dict], bool], *args, **kwargs) -> None:
        self.app = app
        self.inner = middleware(app, *args, **kwargs)
        self.passes_through = passes_through

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.passes_through(scope):
            await self.app(scope, receive, send)
        else:
            await self.inner(scope, receive, send)


def scope_middlewares(app) -> list[str]:
    """Wrap the middlewares of ``app`` named in :data:`PASS_THROUGH` in :class:`Scoped`, in place and in order.

    Returns:
        the names of the wrapped middlewares.

    Raises:
        RuntimeError: ``app`` has not all of them (read its middlewares again).
    """
    from starlette.middleware import Middleware  # noqa: PLC0415

    if app.middleware_stack is not None:
        raise RuntimeError("superlink_main: the app has started; its middlewares are fixed")
    wrapped, out = [], []
    for m in app.user_middleware:
        name = getattr(m.cls, "__name__", "")
        if name in PASS_THROUGH:
            out.append(Middleware(Scoped, m.cls, PASS_THROUGH[name], *m.args, **m.kwargs))
            wrapped.append(name)
        else:
            out.append(m)
    if sorted(wrapped) != sorted(PASS_THROUGH):
        raise RuntimeError(f"superlink_main: expected the middlewares {sorted(PASS_THROUGH)}, found {sorted(wrapped)}")
    app.user_middleware[:] = out
    return wrapped


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(allowed hosts, the rest for flower-superlink)``; :data:`ALLOW_OPTION` may repeat (default 127.0.0.1)."""
    allowed, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == ALLOW_OPTION and i + 1 < len(argv):
            allowed.append(argv[i + 1])
            i += 2
        elif argv[i].startswith(ALLOW_OPTION + "="):
            allowed.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return allowed or [DEFAULT_CONTROL_HOST], rest


def main() -> None:
    """``python -m fcd_secure._flower.superlink_main [--control-api-address HOST] <flower-superlink args>``."""
    import flwr.superlink.main as _main  # noqa: PLC0415 - the coordinator's CLI imports the constants above only
    from flwr.superlink.cli import flower_superlink  # noqa: PLC0415

    allowed, rest = split_args(sys.argv[1:])
    create_app = _main.create_app

    def guarded_app(*args, **kwargs):
        app = create_app(*args, **kwargs)
        scope_middlewares(app)
        app.add_middleware(CoordinatorOnly, allowed=allowed)
        return app

    _main.create_app = guarded_app  # flower_superlink imports it when it starts serving
    sys.argv = ["flower-superlink", *rest]
    flower_superlink()


if __name__ == "__main__":  # pragma: no cover - process entry point
    main()

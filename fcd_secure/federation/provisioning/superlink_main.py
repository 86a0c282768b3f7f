"""``flower-superlink`` whose Control API answers only the coordinator host (``fcd server start --control-api-address``).

Flower 1.42 serves its Fleet API (the sites' SuperNodes), its Control API (``flwr run``, ``flwr supernode
register``, ``flwr ls``) and the ServerApp's Runtime API on **one** HTTP port (``--host``/``--port``; its own
``--control-api-address`` is deprecated and ignored). The Control API of open-source Flower is unauthenticated
(Flower 1.42 documentation: the Control API has no authentication in open-source Flower): whoever reaches the SuperLink could submit an app or register a SuperNode.
When the port must face the sites' network, binding alone cannot keep the Control API on the coordinator host.

This entry point starts Flower's own ``flower-superlink`` with one ASGI middleware in front of its app: a request to
the Control API (``/v1/control``) or the Runtime API (``/v1/runtime``, the ServerApp's) from any client address
other than the allowed ones is answered ``403`` before Flower sees it. The Fleet API and ``/health`` are unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

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
    """``python -m fcd_secure.federation.provisioning.superlink_main [--control-api-address HOST] <flower-superlink args>``."""
    import flwr.superlink.main as _main  # noqa: PLC0415 - the coordinator's CLI imports the constants above only
    from flwr.superlink.cli import flower_superlink  # noqa: PLC0415

    allowed, rest = split_args(sys.argv[1:])
    create_app = _main.create_app

    def guarded_app(*args, **kwargs):
        app = create_app(*args, **kwargs)
        app.add_middleware(CoordinatorOnly, allowed=allowed)
        return app

    _main.create_app = guarded_app  # flower_superlink imports it when it starts serving
    sys.argv = ["flower-superlink", *rest]
    flower_superlink()


if __name__ == "__main__":  # pragma: no cover - process entry point
    main()

"""``flower-superlink`` whose Control API answers only the coordinator host (``fcd server start --control-api-address``).

Flower 1.42 serves its Fleet API (the sites' SuperNodes), its Control API (``flwr run``, ``flwr supernode
register``, ``flwr ls``) and the ServerApp's Runtime API on **one** HTTP port (``--host``/``--port``; its own
``--control-api-address`` is deprecated and ignored). The Control API of open-source Flower is unauthenticated
(Flower 1.42 documentation: the Control API has no authentication in open-source Flower): whoever reaches the SuperLink could submit an app or register a SuperNode.
When the port must face the sites' network, binding alone cannot keep the Control API on the coordinator host.

This entry point starts Flower's own ``flower-superlink`` with one ASGI middleware in front of its app: a request to
the Control API (``/v1/control``) or the Runtime API (``/v1/runtime``, the ServerApp's) from any client address
other than the allowed ones is answered ``403`` before Flower sees it. The Fleet API and ``/health`` are unchanged.

An address is not an identity: every local user reaches 127.0.0.1 (docs/threats.md P35; as the unprivileged user
``nobody``, ``flwr ls`` listed every run, ``flwr stop`` stopped any, and a submitted app's ServerApp ran as the
coordinator). Flower 1.42's only Control-API authentication is OIDC account login, which open-source Flower does not
ship (``flwr.superlink.config_loader.load_control_authn_plugin``: "unavailable in this Flower distribution"). So the
middleware also asks the kernel who holds the client end of the connection: on the coordinator host that socket is
the kernel's, with its owner's uid (sock_diag(7), what ``ss -e`` shows), which a process cannot choose. A Control or Runtime
API request is answered only when that uid is the coordinator's (the SuperLink's own uid; ``--control-api-uid`` may
name others): Flower's own ``flwr`` CLI, the SuperLink's executor and the ServerApp it starts all run as the
coordinator and pass unchanged; any other local user gets ``403`` with the reason, a request from another host
(no such local socket) too. The kernel's answer costs about 0.07 ms a request.

It also scopes five of Flower's eight app-wide middlewares to the paths they act on (:func:`scope_middlewares`).
Each is a Starlette ``BaseHTTPMiddleware``, and each layer costs every request an anyio task group, streams and
events whether it acts or not: on loopback a SuperLink request cost about 11 ms of its CPU, 70 % of it in those
layers (py-spy), and the SuperLink's one event loop is what a 10-site round waits on. In Flower 1.42 the four
Control-API middlewares call the next layer unchanged for any path outside ``/v1/control/``, and the Fleet
event-log middleware does the same outside ``/v1/fleet/`` and whenever no event-log plugin is loaded (open-source
Flower loads none). Skipping a layer exactly where it would pass the request through changes nothing that is
answered; the node-authentication, protobuf-translation and error-translation layers still see every request.

Two more guards run before any of Flower's layers (docs/threats.md P51, P53):

* :class:`RequestGate` reads no request body before it knows the body's size and, on the Fleet API, who sends it.
  Flower 1.42's protobuf-translation middleware reads the whole body (``await request.body()``) before its
  node-authentication middleware looks at the signed headers, so a peer without a node key could make the SuperLink
  hold any body it sent (a 300 MB body took it from 144 MB to 691 MB resident, never returned). The gate answers
  ``411`` to a body without ``Content-Length``, ``413`` to one over ``--max-request-bytes`` (default
  :data:`DEFAULT_MAX_BODY`; :data:`ENROL_MAX_BODY` on the two routes a SuperNode calls before its key is known,
  :data:`ENROL_ROUTES`), and ``401`` to a Fleet request whose signed timestamp does not verify under a
  registered SuperNode key (on :data:`ENROL_ROUTES`: under the key it sends) (Flower's own header check, ``flwr.superlink.routers.fleet.node_auth.authenticate_node``,
  without the part that needs the body), all before the body is received, and closes the connection; uvicorn stops
  reading a connection whose body the application has not asked for (its flow-control high-water mark), so each
  connection holds at most the headers (h11's 16 KiB limit) plus one bounded body.
* FastAPI's API description routes (``/docs``, ``/openapi.json`` and the OAuth2 redirect) are removed: they answered
  anyone on the Fleet port, before authentication, with every route and Flower's version (:func:`drop_api_description`).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import flwr.superlink.main
import flwr.superlink.routers.control.middlewares
import flwr.superlink.routers.fleet.middlewares
import flwr.superlink.routers.fleet.node_auth

from fcd_secure._flower.pins import require

# Flower's create_app and the middlewares scoped below still have the source they were read from (_flower.pins)
require("superlink_main")

#: the paths only the coordinator host may call
COORDINATOR_ONLY = ("/v1/control", "/v1/runtime")
#: our option, taken off the command line before Flower parses it
ALLOW_OPTION = "--control-api-address"
DEFAULT_CONTROL_HOST = "127.0.0.1"


#: our option naming a further OS user (uid) allowed on the Control and Runtime APIs (the SuperLink's own always is)
UID_OPTION = "--control-api-uid"


#: netlink's socket-diagnostics protocol (linux/sock_diag.h, linux/inet_diag.h): one exact lookup of a TCP socket by
#: its 4-tuple, answered with its owner's uid (what ``ss -e`` prints)
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 4, 20, 1, 2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
#: where ``inet_diag_msg.idiag_uid`` sits in the reply: after the netlink header (16 bytes), family, state, timer and
#: retransmits (4), the socket id (48) and expires, rqueue, wqueue (12); ``idiag_inode`` follows it
_UID_OFFSET = 16 + 4 + 48 + 12


def _v4(host: str) -> str:
    return host.removeprefix("::ffff:") if host.startswith("::ffff:") and "." in host else host


def socket_owner(client: tuple[str, int], server: tuple[str, int] | None) -> int | None:
    """The uid owning the local TCP socket at ``client`` connected to ``server`` (the other end of a connection this
    host accepted), or ``None`` when there is none on this host (another host) or it cannot be asked
    (:func:`socket_identity`)."""
    found = socket_identity(client, server)
    return None if found is None else found[0]


def socket_identity(client: tuple[str, int], server: tuple[str, int] | None) -> tuple[int, int] | None:
    """``(uid, inode)`` of the local TCP socket at ``client`` connected to ``server``, or ``None`` when there is
    none on this host (another host) or it cannot be asked.

    One ``SOCK_DIAG_BY_FAMILY`` request without ``NLM_F_DUMP`` (sock_diag(7)): the kernel looks the socket up by its
    4-tuple and answers with its ``idiag_uid``, about 0.07 ms; reading ``/proc/net/tcp`` instead cost about 13 ms a
    request on a loaded coordinator (the kernel prints every socket).
    """
    if not server:
        return None
    host, shost = _v4(str(client[0])), _v4(str(server[0]))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        src, dst = (socket.inet_pton(family, h).ljust(16, b"\0") for h in (host, shost))
        req = (struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
               + struct.pack("!HH16s16s", int(client[1]), int(server[1]), src, dst)
               + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE))
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(struct.pack("=LHHLL", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req, (0, 0))
            reply = nl.recv(8192)
        _length, kind = struct.unpack_from("=LH", reply)
        if kind == NLMSG_ERROR or len(reply) < _UID_OFFSET + 4:
            return None  # no such socket on this host
        uid, inode = struct.unpack_from("=II", reply, _UID_OFFSET)
        return int(uid), int(inode)
    except (OSError, ValueError, struct.error):
        return None  # not Linux, or no netlink: nobody is known, so nobody is let in


def socket_holders(inode: int, uid: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids of ``uid``'s processes that hold the socket ``inode`` open (``/proc/<pid>/fd``, proc(5))."""
    target, out = f"socket:[{inode}]", []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fds = entry / "fd"
            if any(os.readlink(fds / fd) == target for fd in os.listdir(fds)):
                out.append(int(entry.name))
        except OSError:
            continue  # exited, or not ours to look at
    return out


def _status(pid: int | str) -> dict[str, str]:
    """``/proc/<pid>/status`` as ``{field: value}`` (proc(5))."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = set()
    while pid > 1 and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        try:
            pid = int(_status(pid).get("PPid", "0"))
        except ValueError:
            return False
    return False


class CoordinatorOnly:
    """ASGI middleware: ``403`` for :data:`COORDINATOR_ONLY` paths unless the client address is in ``allowed`` and
    the client's socket belongs to one of ``uids`` on this host (default: this process's own uid); on the Control
    API also unless the process holding it is neither a confined ServerApp nor started by this SuperLink
    (:meth:`confined_refusal`, docs/threats.md P50)."""

    def __init__(self, app, allowed: Iterable[str], uids: Iterable[int] | None = None) -> None:
        self.app = app
        self.allowed = frozenset(allowed)
        self.uids = frozenset(uids) if uids is not None else frozenset({os.getuid()})
        #: no_new_privs marks a confined ServerApp only where this SuperLink runs without it (prctl(2): it is
        #: inherited and cannot be unset)
        self.nnp_marks = _status("self").get("NoNewPrivs") == "0"

    def refusal(self, scope) -> str | None:
        """Why this request may not reach the Control or Runtime API, or ``None``."""
        client = scope.get("client")
        if client is None or client[0] not in self.allowed:
            return "refused: the Control API answers only the coordinator host"
        found = socket_identity(client, scope.get("server"))
        uid = None if found is None else found[0]
        if uid not in self.uids:
            who = "an unknown user" if uid is None else f"uid {uid}"
            return (f"refused: the Control API answers only the coordinator's OS user; this connection belongs to "
                    f"{who} (docs/threats.md P35)")
        if scope.get("path", "").startswith(CONTROL_PREFIX.rstrip("/")):
            return self.confined_refusal(*found)
        return None

    def confined_refusal(self, uid: int, inode: int) -> str | None:
        """Why the process holding the socket ``inode`` may not call the Control API, or ``None``.

        A ServerApp runs as the coordinator's OS user and needs the Runtime API on this port, so the uid cannot keep
        it from ``flwr ls``, ``flwr run`` or ``flwr stop`` (P50). It is told apart by what it cannot shed: it was
        started by this SuperLink (its executor starts every ServerApp) and, once confined (``apps.sandbox``), it
        carries ``no_new_privs``, which survives a fork that leaves the SuperLink's process tree. A connection whose
        holder cannot be found is refused too.
        """
        holders = socket_holders(inode, uid)
        if not holders:
            return "refused: the Control API cannot tell which process holds this connection (docs/threats.md P50)"
        me = os.getpid()
        for pid in holders:
            if _descends_from(pid, me) or (self.nnp_marks and _status(pid).get("NoNewPrivs") == "1"):
                return (f"refused: the Control API does not answer a ServerApp or another process this SuperLink "
                        f"started, or a confined process (pid {pid}, docs/threats.md P50)")
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(COORDINATOR_ONLY):
            if scope["path"].startswith(CONTROL_PREFIX.rstrip("/")):
                from starlette.concurrency import run_in_threadpool  # noqa: PLC0415

                # the /proc scan of confined_refusal takes milliseconds: off the loop the Fleet rounds wait on
                why = await run_in_threadpool(self.refusal, scope)
            else:
                why = self.refusal(scope)
            if why is not None:
                await _answer(send, 403, why)
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


#: our option: the largest request body, in bytes, the SuperLink reads
BODY_OPTION = "--max-request-bytes"
#: 64 MiB: far above a message of this package's models (a few MB of float32 parameters) and a FAB, far below what
#: makes a coordinator host swap
DEFAULT_MAX_BODY = 64 * 2**20
#: the Fleet routes a SuperNode calls before the SuperLink may know its key (flwr 1.42 fleet router): Flower itself
#: answers why an unregistered key is refused there ("must be registered", "Failed to activate SuperNode"). Their
#: bodies hold a public key and little else, so they get a signature over the timestamp (the sender holds the key),
#: no registry check, and a small body limit
ENROL_ROUTES = frozenset({"/v1/fleet/register-node", "/v1/fleet/activate-node"})
ENROL_MAX_BODY = 64 * 1024
#: the routes FastAPI adds to describe the API (flwr 1.42 ``create_app``: ``docs_url="/docs"``, ``redoc_url=None``)
DESCRIPTION_ROUTES = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def drop_api_description(app) -> list[str]:
    """Remove FastAPI's API description routes from ``app`` (in place) and turn off their generation.

    Returns:
        the paths removed.

    Raises:
        RuntimeError: ``app`` serves no ``/openapi.json`` (read ``flwr.superlink.main.create_app`` again).
    """
    removed = [r.path for r in app.router.routes if getattr(r, "path", None) in DESCRIPTION_ROUTES]
    if "/openapi.json" not in removed:
        raise RuntimeError("superlink_main: the app has no /openapi.json route; read Flower's create_app again")
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in DESCRIPTION_ROUTES]
    app.openapi_url = app.docs_url = app.redoc_url = None
    return removed


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def node_refusal(headers: dict[str, str], registered: Callable[[bytes], bool]) -> str | None:
    """Why a Fleet request with these headers is not from a registered SuperNode, or ``None``.

    Flower 1.42's own check (``flwr.superlink.routers.fleet.node_auth.authenticate_node``) less the part that needs
    the body (the node id inside it, which Flower still checks afterwards): the ``flwr-public-key`` header is a
    registered SuperNode key (``registered``) and ``flwr-signature`` is its ECDSA signature over ``flwr-timestamp``,
    a time within Flower's tolerance of now.
    """
    import binascii  # noqa: PLC0415
    import datetime  # noqa: PLC0415
    from base64 import b64decode  # noqa: PLC0415

    from flwr.common.constant import SYSTEM_TIME_TOLERANCE, TIMESTAMP_HEADER, TIMESTAMP_TOLERANCE  # noqa: PLC0415
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER  # noqa: PLC0415
    from flwr.supercore.date import now  # noqa: PLC0415
    from flwr.supercore.primitives.asymmetric import bytes_to_public_key, verify_signature  # noqa: PLC0415

    try:
        public_key = b64decode(headers[FLEET_HTTP_PUBLIC_KEY_HEADER], validate=True)
        signature = b64decode(headers[FLEET_HTTP_SIGNATURE_HEADER], validate=True)
        timestamp = headers[TIMESTAMP_HEADER]
        age = (now() - datetime.datetime.fromisoformat(timestamp)).total_seconds()
    except KeyError as exc:
        return f"no SuperNode authentication (header {exc.args[0]} missing)"
    except (ValueError, TypeError, binascii.Error):
        return "malformed SuperNode authentication headers"
    if not -SYSTEM_TIME_TOLERANCE < age < TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE:
        return "the signed timestamp is outside the allowed window"
    try:
        if not registered(public_key):
            return "the public key is not a registered SuperNode's"
        if not verify_signature(bytes_to_public_key(public_key), timestamp.encode("ascii"), signature):
            return "the signature over the timestamp does not verify"
    except (ValueError, TypeError, UnicodeError):
        return "malformed SuperNode authentication headers"
    return None


class RequestGate:
    """ASGI middleware (module docstring): no request body is read before its size is known and within
    ``max_body``, and, on the Fleet API with SuperNode authentication on, before the sender is a registered SuperNode.
    """

    def __init__(self, app, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_body = int(max_body)

    def refusal(self, scope) -> tuple[int, str] | None:
        """``(status, reason)`` for a request whose body may not be read, from its head alone, or ``None``."""
        limit = ENROL_MAX_BODY if scope.get("path") in ENROL_ROUTES else self.max_body
        headers = _headers(scope)
        length = headers.get("content-length")
        if "transfer-encoding" in headers or (length is None and scope.get("method") in ("POST", "PUT", "PATCH")):
            return 411, "refused: a request body needs a Content-Length (docs/threats.md P51)"
        if length is not None:
            if not length.isdigit():
                return 400, "refused: Content-Length is not a number"
            if int(length) > limit:
                return 413, (f"refused: a request body of {int(length)} bytes is over the SuperLink's limit of "
                             f"{limit} bytes for {scope.get('path')} ({BODY_OPTION}, docs/threats.md P51)")
        return None

    @staticmethod
    def fleet_refusal(scope) -> str | None:
        """Why a Fleet request is not from a registered SuperNode (:func:`node_refusal`), or ``None`` when it is or
        SuperNode authentication is off (``--enable-supernode-auth`` not given)."""
        app = scope.get("app")
        if app is None or not getattr(app.state, "enable_supernode_auth", False):
            return None
        if scope.get("path") in ENROL_ROUTES:
            why = node_refusal(_headers(scope), lambda _key: True)
        else:
            state = app.state.linkstate_factory.state()
            why = node_refusal(_headers(scope), lambda key: state.get_node_id_by_public_key(key) is not None)
        return None if why is None else f"refused: {why} (docs/threats.md P51)"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refused = None
            if scope.get("path", "").startswith(FLEET_PREFIX):  # who sends it first: a stranger learns no limit
                from starlette.concurrency import run_in_threadpool  # noqa: PLC0415

                why = await run_in_threadpool(self.fleet_refusal, scope)  # the LinkState takes a lock
                refused = None if why is None else (401, why)
            refused = refused or self.refusal(scope)
            if refused is not None:
                await _answer(send, *refused, close=True)
                return
        await self.app(scope, receive, send)


async def _answer(send, status: int, why: str, close: bool = False) -> None:
    """Send a JSON ``{"detail": why}`` response; ``close`` ends the connection after it (a body the client still
    sends is then never read)."""
    body = json.dumps({"detail": why}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body})


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(allowed hosts, the rest for flower-superlink)``; :data:`ALLOW_OPTION` may repeat (default 127.0.0.1)."""
    allowed, rest = _take(argv, ALLOW_OPTION)
    return allowed or [DEFAULT_CONTROL_HOST], rest


def _take(argv: list[str], option: str) -> tuple[list[str], list[str]]:
    """The values of a repeatable ``option`` (``--opt v`` or ``--opt=v``) and the other arguments."""
    values, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == option and i + 1 < len(argv):
            values.append(argv[i + 1])
            i += 2
        elif argv[i].startswith(option + "="):
            values.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return values, rest


def main() -> None:
    """``python -m fcd_secure._flower.superlink_main [--control-api-address HOST] [--control-api-uid UID]
    [--max-request-bytes N] <flower-superlink args>``."""
    import flwr.superlink.main as _main  # noqa: PLC0415 - the coordinator's CLI imports the constants above only
    from flwr.superlink.cli import flower_superlink  # noqa: PLC0415

    allowed, rest = split_args(sys.argv[1:])
    extra_uids, rest = _take(rest, UID_OPTION)
    uids = {os.getuid(), *(int(u) for u in extra_uids)}
    max_body, rest = _take(rest, BODY_OPTION)
    create_app = _main.create_app

    def guarded_app(*args, **kwargs):
        app = create_app(*args, **kwargs)
        scope_middlewares(app)
        drop_api_description(app)
        app.add_middleware(CoordinatorOnly, allowed=allowed, uids=uids)
        app.add_middleware(RequestGate, max_body=int(max_body[-1]) if max_body else DEFAULT_MAX_BODY)  # outermost
        return app

    _main.create_app = guarded_app  # flower_superlink imports it when it starts serving
    sys.argv = ["flower-superlink", *rest]
    flower_superlink()


if __name__ == "__main__":  # pragma: no cover - process entry point
    main()

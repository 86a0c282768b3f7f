"""The one Flower version this package is written for, and the source of every Flower function it reaches into.

The rest of the package uses Flower's public API (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``,
``flwr.simulation``, the ``flwr``/``flower-*`` commands). The modules of ``fcd_secure._flower`` go further: they
replace module-level names that Flower's loops look up (``waits``), wrap Flower's ASGI app (``superlink_main``), copy
one Flower function with a shorter backoff (``superexec``), and import a few internal helpers (``internals``). Each of
those is correct only for the code it was read from. So, when such a module is imported, :func:`require` checks

* that the installed Flower is :data:`FLWR_VERSION` (``pyproject.toml`` pins the same version for the wheel;
  ``tests/test_flower_pins.py`` checks the two agree), and
* that every Flower object the module touches still has the source it was read from: SHA-256 of
  ``inspect.getsource`` against :data:`SOURCES`.

A mismatch stops the start with :class:`FlowerVersionError` naming the object, instead of running a patch over code it
was not written for. To move to another Flower: read each object named in :data:`SOURCES` again, adapt the module
that uses it, and record the new hashes (``python scripts/flower_pins.py`` prints them).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from fcd_secure.errors import FcdError

#: the Flower release the whole package is written for (``pyproject.toml``: ``flwr[simulation]==`` this)
FLWR_VERSION = "1.42.0"

#: ``module:qualname`` of each Flower object we patch, wrap, copy or rely on the internals of -> SHA-256 (hex) of its
#: source, and the ``fcd_secure._flower`` module that depends on it
SOURCES: dict[str, tuple[str, str]] = {
    # waits: the SuperNode loop's sleeps (3 s, 0.5 s) and its ``pull_objects`` name; wake: ``_pull_and_store_message``
    "flwr.supernode.start_client_internal:start_client_internal": ("9e89a6eb68fbec6821e817cd2c09f7894fc7b0f5725c2365b19a7122307f11f3", "waits"),
    "flwr.supernode.start_client_internal:_pull_and_store_message": ("eaf5d0e36dc34e4cf46a490511d077ac55cc8edbbcdbe938c1f6dbcb758628be", "waits"),
    "flwr.supernode.start_client_internal:_push_messages": ("00bb86faffdec114db87e7f716af2acd901d12284e44f51f5c2a84704db05f64", "waits"),
    # waits: the ServerApp's HttpGrid calls the module-level pull_objects/push_objects we replace with partials
    "flwr.superlink.grid.http_grid:HttpGrid": ("72e288cdc292c3fd37a424966e4d27be31757de12372af5f1695707c19eb303e", "waits"),
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": ("31bb2de46b450e6acfadb7a8bb15e3f2074bb112199826a40a5eaa648bad5b2b", "waits"),
    "flwr.supercore.inflatable.inflatable_utils:push_objects": ("5893dafc584a46c8f743cad77554f3366cc03074f7807238bd3dd07ec2be39d0", "waits"),
    "flwr.supercore.inflatable.inflatable_utils:get_num_workers": ("d738f7dba5bff74b5db68e15a39bde2660ef1750f3e8f9f4f95376d2252341b4", "waits"),
    # superlink_main: create_app is swapped for a guarded one; five middlewares are scoped to the paths they act on
    "flwr.superlink.main:create_app": ("ee966b630c8ba8b56315e8db3296df6c2ae6d9bd3a9826e28be63c85e321dbe1", "superlink_main"),
    "flwr.superlink.routers.control.middlewares:ControlSensitiveResponseMiddleware": ("25cca938600324c2f1834aceba94915a6c8ea26871d796c5af5608ad9b18a90b", "superlink_main"),
    "flwr.superlink.routers.control.middlewares:ControlAuthenticationMiddleware": ("1495e41d9bbbd25d2fce0e7b81da0780ed9c9064fa9651a18987987daa87df21", "superlink_main"),
    "flwr.superlink.routers.control.middlewares:ControlLicenseMiddleware": ("0f57194171e921a3d5cbea4f1d59d8313c386c3b8a66ee79dfed6f845b0a15dc", "superlink_main"),
    "flwr.superlink.routers.control.middlewares:ControlEventLogMiddleware": ("d8db2d506ca7d0c5bc27c81bb5c1eebd6c41fc27e758e3ad47c687b0ee002636", "superlink_main"),
    "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware": ("4466ecde96fb2315fe44027e038b8ac693b49dc65c7a3810c2b2c5844305ae76", "superlink_main"),
    # superlink_main: RequestGate runs the header part of Flower's SuperNode check before the body is read
    "flwr.superlink.routers.fleet.node_auth:authenticate_node": ("f8e66372d61b3653fc6ee3f9772cc89f805a01bed65e6ce55e4b5fb3a6ad3a17", "superlink_main"),
    # superexec: pull_task_input is copied (short backoff); run_clientapp and run_superexec are what the site's
    # executor mirrors (acquire a task, pull its input, push the reply and the task output)
    "flwr.supernode.runtime.run_clientapp:pull_task_input": ("5607a23e1673ee876930c1b35685b8dfdfd8b3776a436560b0467042e15fc695", "superexec"),
    "flwr.supernode.runtime.run_clientapp:run_clientapp": ("6ce09559f3a2f5dcafb7d08f4b443585d76b9b53b9cb29ba1ec06a6982163443", "superexec"),
    "flwr.supernode.runtime.run_clientapp:push_message": ("07cb512c93e065a93a4cba3facc7d37dd99758c56835065a63fdfbfc604dcd8a", "superexec"),
    "flwr.supernode.runtime.run_clientapp:push_task_output": ("9206407456e79e17338d367de7c21e2d840d939de378c03ac61da6cc2b57a3c6", "superexec"),
    "flwr.supercore.superexec.run_superexec:run_superexec": ("91e7a33c5b898f33249c29d2058c57637ca7668a14c27296d2506dc98ac84f9b", "superexec"),
}


class FlowerVersionError(FcdError, RuntimeError):
    """The installed Flower is not the one a ``fcd_secure._flower`` module was written for."""


def source_sha256(key: str) -> str:
    """SHA-256 (hex) of the source of the Flower object ``module:qualname``; its module must be imported already
    (each ``_flower`` module imports what it touches, by name, before it calls :func:`require`).

    Raises:
        FlowerVersionError: the module is not imported or has no such object.
    """
    module, _, qualname = key.partition(":")
    obj = sys.modules.get(module)
    if obj is None:
        raise FlowerVersionError(f"{key}: its module is not imported; import it before checking it")
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise FlowerVersionError(f"{key}: this Flower has no such object")
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def check_version() -> None:
    """Raise :class:`FlowerVersionError` unless the installed Flower is :data:`FLWR_VERSION`."""
    import flwr  # noqa: PLC0415

    if flwr.__version__ != FLWR_VERSION:
        raise FlowerVersionError(
            f"fcd_secure is written for flwr {FLWR_VERSION}, found flwr {flwr.__version__}: install "
            f"flwr=={FLWR_VERSION} (pip install 'flwr[simulation]=={FLWR_VERSION}')")


@functools.lru_cache(maxsize=None)
def require(user: str) -> None:
    """Check the version and the source of every object in :data:`SOURCES` that ``user`` (a ``_flower`` module
    name) depends on; called once, when that module is imported.

    Raises:
        FlowerVersionError: another Flower version, or an object whose source changed (named in the message).
    """
    check_version()
    for key, (want, who) in SOURCES.items():
        if who != user:
            continue
        got = source_sha256(key)
        if got != want:
            raise FlowerVersionError(
                f"fcd_secure._flower.{user} patches or copies {key}, whose source differs from the one it was "
                f"written for (sha256 {got[:16]}…, expected {want[:16]}…): read it again before running")

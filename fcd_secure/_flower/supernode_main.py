"""``flower-supernode`` with short waits, kept running across SuperLink restarts: the site's SuperNode, Flower's
own, with its hard-wired sleeps and object-pull backoff capped (``_flower.waits``; ``$FCD_SUPERNODE_IDLE_POLL_S``
sets the wait after an empty pull); TLS, node authentication, isolation, the Runtime API and the messages are
unchanged. When ``$FCD_EXEC_WAKE`` names a pipe, it wakes the site's executor through it after each message it
stores (``_flower.wake``).

This process is the SuperNode's **supervisor**: it runs the SuperNode as its child and starts it again, with
exponential backoff (:data:`BACKOFF_S`, doubling up to :data:`BACKOFF_MAX_S`), whenever it exits. Why: the
coordinator's SuperLink keeps its state in memory (``engines.deployment.FLWR_IN_MEMORY``), so a restarted SuperLink
has new node ids for the keys it registers again, and Flower 1.42's SuperNode answers the first HTTP 401 on its
heartbeat by ending itself (``flwr.supercore.retry.http_retry``: SIGINT to its own process). A new SuperNode
process activates its key again (``flwr.superlink.servicer.fleet.fleet_handlers.activate_node``: the node id is
looked up by the public key) and gets the new node id, as systemd's ``Restart=on-failure`` with ``RestartSec``
would restart it. The supervisor's PID is the one the site records and the site's executor watches
(``--parent-pid``), so the executor keeps running; its Runtime API client retries the reconnect itself (Flower's
HTTP retry invoker). SIGTERM or SIGINT to the supervisor stops the child and ends the supervisor; the child also
gets SIGTERM if the supervisor dies (Linux ``PR_SET_PDEATHSIG``, prctl(2)), so a killed supervisor leaves no
SuperNode behind.

    python -m fcd_secure._flower.supernode_main <flower-supernode arguments>
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

from fcd_secure._flower.wake import WAKE_ENV

#: set in the child's environment: this process is the SuperNode itself, not its supervisor
CHILD_ENV = "FCD_SUPERNODE_CHILD"
#: the first wait before a restart, doubled after each restart that follows a short run, up to BACKOFF_MAX_S
BACKOFF_S = 1.0
BACKOFF_MAX_S = 30.0
#: a SuperNode that ran this long before it exited starts again after BACKOFF_S (not after the doubled wait)
STABLE_S = 60.0
_PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def next_backoff(previous: float, ran_s: float) -> float:
    """The wait before the next start: :data:`BACKOFF_S` after a SuperNode that ran :data:`STABLE_S` or longer,
    else twice the previous wait, at most :data:`BACKOFF_MAX_S`."""
    if ran_s >= STABLE_S:
        return BACKOFF_S
    return min(BACKOFF_MAX_S, max(BACKOFF_S, 2 * previous))


def supervise(args: list[str]) -> int:
    """Run the SuperNode (``args``: its command line) as a child and restart it whenever it exits, until SIGTERM
    or SIGINT; returns the exit code for the supervisor."""
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait = 0.0
    while not stopping:
        t0 = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "fcd_secure._flower.supernode_main", *args],
                                 env={**os.environ, CHILD_ENV: "1"}, preexec_fn=_die_with_parent)
        rc = child.wait()
        if stopping:
            break
        ran = time.monotonic() - t0
        wait = next_backoff(wait, ran)
        print(f"[fcd supernode] the SuperNode exited with code {rc} after {ran:.0f} s (e.g. the SuperLink restarted "
              f"and no longer knows its node id); starting it again in {wait:.0f} s", file=sys.stderr, flush=True)
        deadline = time.monotonic() + wait
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)
    if child is not None and child.poll() is None:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
    return 0


def main() -> None:
    if os.environ.get(CHILD_ENV) != "1":
        sys.exit(supervise(sys.argv[1:]))
    # Flower is imported by the SuperNode child only: the supervisor runs no Flower code, and importing it (with
    # ``_flower.waits``' version check) cost each site's supervisor 1.4 s of CPU per start (``/usr/bin/time``)
    from fcd_secure._flower.waits import (  # noqa: PLC0415
        IDLE_POLL_ENV,
        IDLE_POLL_S,
        shorten_supernode_waits,
        wake_executor_on_messages,
    )

    shorten_supernode_waits(float(os.environ.get(IDLE_POLL_ENV, IDLE_POLL_S)))
    if os.environ.get(WAKE_ENV):
        wake_executor_on_messages(os.environ[WAKE_ENV])
    from flwr.supernode.cli import flower_supernode  # noqa: PLC0415

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":  # pragma: no cover - process entry point
    main()

"""``flower-supernode`` with short waits: the site's SuperNode, Flower's own, with its hard-wired sleeps and
object-pull backoff capped (``_flower.waits``; ``$FCD_SUPERNODE_IDLE_POLL_S`` sets the wait after an empty
pull); TLS, node authentication, isolation, the Runtime API and
the messages are unchanged. When ``$FCD_EXEC_WAKE`` names a pipe, it wakes the site's executor through it after
each message it stores (``_flower.wake``).

    python -m fcd_secure._flower.supernode_main <flower-supernode arguments>
"""

from __future__ import annotations

import os
import sys

from fcd_secure._flower.waits import (
    IDLE_POLL_ENV,
    IDLE_POLL_S,
    shorten_supernode_waits,
    wake_executor_on_messages,
)
from fcd_secure._flower.wake import WAKE_ENV


def main() -> None:
    shorten_supernode_waits(float(os.environ.get(IDLE_POLL_ENV, IDLE_POLL_S)))
    if os.environ.get(WAKE_ENV):
        wake_executor_on_messages(os.environ[WAKE_ENV])
    from flwr.supernode.cli import flower_supernode  # noqa: PLC0415

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":  # pragma: no cover - process entry point
    main()

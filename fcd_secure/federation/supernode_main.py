"""``flower-supernode`` with short waits: the site's SuperNode, Flower's own, with its hard-wired sleeps and
object-pull backoff capped (``federation.flower_waits``); TLS, node authentication, isolation, the Runtime API and
the messages are unchanged.

    python -m fcd_secure.federation.supernode_main <flower-supernode arguments>
"""

from __future__ import annotations

import sys

from fcd_secure.federation.flower_waits import shorten_supernode_waits


def main() -> None:
    shorten_supernode_waits()
    from flwr.supernode.cli import flower_supernode  # noqa: PLC0415

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":  # pragma: no cover - process entry point
    main()

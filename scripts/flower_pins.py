"""Print the SHA-256 of the source of every Flower object in ``fcd_secure._flower.pins.SOURCES``, as table lines.

For a maintainer moving to another Flower: read each object again, adapt the ``_flower`` module that uses it, then
paste these lines into ``SOURCES`` (and change ``FLWR_VERSION`` and the pin in ``pyproject.toml``).
Usage: ``.venv/bin/python scripts/flower_pins.py``
"""

from __future__ import annotations

import sys

from fcd_secure._flower.pins import SOURCES, source_sha256


def main() -> int:
    for key in SOURCES:
        __import__(key.partition(":")[0])  # the module must be loaded before its source is read
    for key, (_, who) in SOURCES.items():
        print(f'    "{key}": ("{source_sha256(key)}", "{who}"),')
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A pin file: the key fingerprints of every ledger writer, exported by the operator at provisioning and handed to
the auditor out of band (``fcd audit fingerprints --out pins.toml``; ``fcd audit verify --pins pins.toml``).

The format is TOML, one table per role, writer id -> fingerprint::

    [server]
    _server = "SHA256:4f0c…"

    [sites]
    site-00 = "SHA256:bafca5659cf7…"
    site-01 = "SHA256:…"

A pin proves nothing by itself: it is worth exactly as much as the channel it travelled through (the NVFLARE
provisioning model: the startup kit's root of trust is handed over out of band).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import tomli_w

from fcd_secure._io import atomic_write_text
from fcd_secure.fingerprints import normalise_fingerprint
from fcd_secure.errors import FcdError

#: role -> the table of the pin file that holds it
ROLE_TABLES = {"server": "server", "site": "sites"}


class PinFileError(FcdError, ValueError):
    """A pin file that cannot be read or holds something other than fingerprints; the message names file and key."""


def write_pins(path: str | Path, rows: list[dict[str, str | None]]) -> Path:
    """Write the fingerprints of ``rows`` (``{role, writer_id, key_fingerprint}``, as ``ledger_identities`` lists
    them) to a pin file, atomically. Rows without a fingerprint are left out.

    Raises:
        PinFileError: two different fingerprints for one writer.
    """
    tables: dict[str, dict[str, str]] = {t: {} for t in ROLE_TABLES.values()}
    for r in rows:
        role, writer, fp = r.get("role"), r.get("writer_id"), r.get("key_fingerprint")
        if role not in ROLE_TABLES or not writer or not fp:
            continue
        table = tables[ROLE_TABLES[role]]
        if table.get(writer, fp) != fp:
            raise PinFileError(f"{writer}: two different keys ({table[writer]} and {fp}); which one to pin is for you")
        table[writer] = fp
    text = (
        "# Key fingerprints of every ledger writer (fcd audit fingerprints). Hand this file to the auditor out of\n"
        "# band; they verify with: fcd audit verify RUN_DIR --pins THIS_FILE\n" + tomli_w.dumps(tables)
    )
    return atomic_write_text(Path(path), text, mode=0o644)


def read_pins(path: str | Path) -> tuple[list[str], list[str]]:
    """``(site fingerprints, server fingerprints)`` of a pin file.

    Raises:
        PinFileError: unreadable, not TOML, an unknown table, or a value that is not a fingerprint.
    """
    table = read_pin_table(path)
    return list(table["sites"].values()), list(table["server"].values())


def read_pin_table(path: str | Path) -> dict[str, dict[str, str]]:
    """The pin file's tables: ``{"sites": {writer id: fingerprint}, "server": {...}}``, fingerprints normalised.

    Raises:
        PinFileError: unreadable, not TOML, an unknown table, or a value that is not a fingerprint.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PinFileError(f"{path}: cannot read the pin file ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PinFileError(f"{path}: not a TOML pin file ({exc})") from None
    out: dict[str, dict[str, str]] = {t: {} for t in ROLE_TABLES.values()}
    for table, entries in raw.items():
        if table not in out or not isinstance(entries, dict):
            raise PinFileError(f"{path}: unknown table [{table}]; a pin file has [server] and [sites]")
        for writer, fp in entries.items():
            try:
                out[table][str(writer)] = normalise_fingerprint(str(fp))
            except ValueError as exc:
                raise PinFileError(f"{path}: [{table}] {writer}: {exc}") from None
    return out

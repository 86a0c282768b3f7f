"""Which site home on this host holds which table: one ε budget per table, never a second home at ε 0.

A site's DP ledgers, its record secret and its anchor live in its home (``state/<site-id>/``, ``fcd_secure.privacy``),
so the budget of a table's patients belongs to the home that trains on it. A second ``fcd site init`` on the same
table (a second consortium, a re-install beside the first) would start every patient at ε 0 with no warning
(docs/threats.md P46). So ``init`` claims the table in a registry of this host's site homes and refuses, naming the
other home, while a home that still holds a site has the same table (by its resolved path or by the sha256 of its
bytes, so a copy elsewhere is the same table). An entry whose home no longer holds a site is dropped.

The registry is ``$FCD_SITE_REGISTRY`` when set, else ``$XDG_STATE_HOME/fcd_secure/site_tables.json`` (default
``~/.local/state``): one per OS user. Limits: another OS user on the same host, or a table changed by a row, is not
seen as the same table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.provisioning.consortium import ProvisioningError

__all__ = ["REGISTRY_ENV", "claim_table", "registry_path"]

#: the environment variable that names the registry file (tests and shared hosts set it)
REGISTRY_ENV = "FCD_SITE_REGISTRY"
_SITE_FILE = "site.toml"


def registry_path() -> Path:
    """The registry of this host's site homes (module docstring)."""
    if os.environ.get(REGISTRY_ENV):
        return Path(os.environ[REGISTRY_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fcd_secure" / "site_tables.json"


def claim_table(home: Path, table: "Path | str", sha256: str | None) -> None:
    """Record that ``home`` holds ``table`` (resolved path, its bytes' ``sha256``; a database URL, None), or refuse.

    Raises:
        ProvisioningError: another home that still holds a site has this table (naming it), or the registry cannot
            be read (fail closed: an unreadable registry must not let a second home start at ε 0).
    """
    path = registry_path()
    with file_lock(path):
        try:
            entries = json.loads(path.read_text())["homes"] if path.exists() else []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ProvisioningError(f"{path}: the registry of this host's site homes cannot be read ({exc}); "
                                    f"repair it or set {REGISTRY_ENV}") from None
        live = [e for e in entries if isinstance(e, dict) and e.get("home") != str(home)
                and (Path(str(e.get("home"))) / _SITE_FILE).is_file()]
        for e in live:
            if e.get("table") == str(table) or (sha256 is not None and e.get("sha256") == sha256):
                raise ProvisioningError(
                    f"{table}: the site home {e['home']} holds this table already (field: --table); its patients' "
                    "ε budget lives there, and a second home would start them at ε 0. Use that home, or remove it "
                    "first if it is no longer used"
                )
        atomic_write_text(path, json.dumps({"homes": live + [{"home": str(home), "table": str(table),
                                                               "sha256": sha256}]}, indent=1))

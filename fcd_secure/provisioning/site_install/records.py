"""The signed ``install`` lines of a site ledger (:class:`fcd_secure.audit.entries.InstallLine`).

They go into the same ledger the site's uplink is recorded in, signed with the same identity key, so that
``fcd audit verify`` reports an installation beside the runs it made possible.
"""

from __future__ import annotations

from pathlib import Path

from fcd_secure.audit import SITE_LEDGER_FILE, SiteLedger
from fcd_secure.audit.entries import InstallLine
from fcd_secure.federation.state import SiteState


def record_install(state_root: str | Path, site_id: str, event: str, facts: dict[str, object]) -> InstallLine:
    """Append one signed ``install`` line (``event``: init, join or preflight) to the site's ledger."""
    state = SiteState(state_root, site_id)
    ledger = SiteLedger(state.slot(SITE_LEDGER_FILE), state.identity_private_key(), writer_id=site_id)
    return ledger.append(InstallLine, {"event": event, "facts": {k: str(v) for k, v in facts.items()}})

"""The ClientApp mods of every site, in one list (outermost first): the audit egress gate, then the guard.

* the egress gate (:func:`fcd_secure.apps.egress.make_egress_gate_mod`) is outermost so that it sees exactly
  what leaves (it also turns exceptions into generic errors and records every reply in the site ledger);
* the guard (:func:`fcd_secure.apps.guard.guard_mod`) replaces any exception of a handler by a generic error
  reply, so no exception text or traceback leaves.

Both are imported directly: a site without its gate cannot be built (the import or the factory fails), it never
runs ungated.
"""

from __future__ import annotations

from fcd_secure.apps.egress import RuntimeGetter, make_egress_gate_mod
from fcd_secure.apps.guard import guard_mod


def client_mods(runtime_getter: RuntimeGetter | None) -> list:
    """Mods of every site's ClientApp, outermost first: ``[egress gate, guard]``.

    Args:
        runtime_getter: ``(msg, context) -> SiteRuntime`` for the gate; ``None`` gives a gate that lets nothing out.

    Raises:
        Whatever the gate factory raises: there is no app without a gate.
    """
    return [make_egress_gate_mod(runtime_getter), guard_mod]

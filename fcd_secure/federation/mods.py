"""The ClientApp mods of every site, in one list (outermost first): the audit egress gate, then the guard.

* the egress gate (:func:`fcd_secure.federation.egress.make_egress_gate_mod`) is outermost so that it sees exactly
  what leaves (it also turns exceptions into generic errors and records every reply in the site ledger);
* the guard (:func:`guard_mod`): flwr 1.42 turns an exception in a handler into an error reply that carries
  ``str(exception)`` and, under simulation, the full traceback (../shared/research/flower-runtime.md §0.9): a
  ``KeyError`` on a patient id would leave the site. The guard replaces every exception by a generic error
  reply with a fixed reason; nothing about the exception leaves.

Both are imported directly: a site without its gate cannot be built (the import or the factory fails), it never
runs ungated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from flwr.app import Context, Error, Message

from fcd_secure.federation.egress import RuntimeGetter, make_egress_gate_mod

log = logging.getLogger("fcd_secure.site")

#: Error code and reason of every guarded failure: fixed strings, so no data or exception text can ride on them.
GUARD_ERROR_CODE = 1
GUARD_ERROR_REASON = "site error (details stay on the site)"


def guard_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Run the handler; on any exception reply with a generic error (no text, no traceback, no data)."""
    try:
        return call_next(msg, context)
    except Exception as exc:  # noqa: BLE001 - the point is to catch everything
        # Only the type name is logged, and only locally: the message itself may hold record values.
        log.warning("handler for %s failed with %s (reply: generic error)", msg.metadata.message_type, type(exc).__name__)
        if os.environ.get("FCD_SITE_DEBUG") == "1":
            # opt-in, for an operator at the site console: the traceback goes to the local log only
            log.exception("site-local traceback")
        return Message(Error(code=GUARD_ERROR_CODE, reason=GUARD_ERROR_REASON), reply_to=msg)


def client_mods(runtime_getter: RuntimeGetter | None) -> list:
    """Mods of every site's ClientApp, outermost first: ``[egress gate, guard]``.

    Args:
        runtime_getter: ``(msg, context) -> SiteRuntime`` for the gate; ``None`` gives a gate that lets nothing out.

    Raises:
        Whatever the gate factory raises: there is no app without a gate.
    """
    return [make_egress_gate_mod(runtime_getter), guard_mod]

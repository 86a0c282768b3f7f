"""The guard mod: no exception text ever leaves a site.

flwr 1.42 turns an exception in a handler into an error reply that carries ``str(exception)`` and, under
simulation, the full traceback (../shared/research/flower-runtime.md §0.9): a ``KeyError`` on a patient id would
leave the site. :func:`guard_mod` replaces every exception by a generic error reply with a fixed reason; nothing
about the exception leaves. ``federation.mods.client_mods`` puts it inside the audit egress gate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from flwr.app import Context, Error, Message

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

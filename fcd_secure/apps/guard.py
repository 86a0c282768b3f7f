"""The guard mod: no exception text ever leaves a site.

The pinned Flower (``fcd_secure._flower.pins``) turns an exception in a handler into an error reply that carries ``str(exception)`` and, under
simulation, the full traceback (its ClientApp error reply): a ``KeyError`` on a patient id would
leave the site. :func:`guard_mod` replaces every exception by a generic error reply with a fixed reason; nothing
about the exception leaves. ``apps.mods.client_mods`` puts it inside the audit egress gate.

A :class:`~fcd_secure.audit.rules.Refusal` passes through: it is the site's policy refusing a request (its text is
a rule name from a closed vocabulary), and the gate records it as a refusal rather than a failure.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from flwr.app import Context, Error, Message

from fcd_secure.audit.rules import SITE_ERRORS, Refusal, SiteFailure
from fcd_secure.data.spec import DataError
from fcd_secure.privacy.errors import BudgetExceeded

log = logging.getLogger("fcd_secure.site")

#: Error code and reason of a guarded failure without a known category: fixed, so no data or exception text can ride
#: on them. A failure of a known category gets that category's code and reason (:func:`site_error_of`).
GUARD_ERROR_CODE, GUARD_ERROR_REASON = SITE_ERRORS["internal"]


def site_error_of(exc: BaseException) -> str:
    """The category of :data:`~fcd_secure.audit.rules.SITE_ERRORS` a site reports for ``exc``.

    The site's data failing its spec (``DataError``) is ``data_mismatch``; a round refused by the site's privacy
    ledger (``BudgetExceeded``) is ``budget_exhausted``; a :class:`~fcd_secure.audit.rules.SiteFailure` names its
    own category; anything else is ``internal``.
    """
    if isinstance(exc, SiteFailure):
        return exc.error
    if isinstance(exc, DataError):
        return "data_mismatch"
    if isinstance(exc, BudgetExceeded):
        return "budget_exhausted"
    return "internal"


def guard_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Run the handler; on any exception reply with its category's fixed error (no text, no traceback, no data)."""
    try:
        return call_next(msg, context)
    except Refusal:
        raise
    except Exception as exc:  # noqa: BLE001 - the point is to catch everything
        # Only the type name is logged, and only locally: the message itself may hold record values.
        error = site_error_of(exc)
        log.warning("handler for %s failed with %s (reply: %s)", msg.metadata.message_type, type(exc).__name__, error)
        if os.environ.get("FCD_SITE_DEBUG") == "1":
            # opt-in, for an operator at the site console: the traceback goes to the local log only
            log.exception("site-local traceback")
        code, reason = SITE_ERRORS[error]
        return Message(Error(code=code, reason=reason), reply_to=msg)

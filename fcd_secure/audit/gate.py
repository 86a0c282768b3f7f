"""The egress gate: the Flower mod that decides, on every reply, what may leave a site, and writes down what did.

Put it first in ``ClientApp(mods=[...])``: the pinned Flower wraps the handler in the mods in reverse order
(``flwr.client.mod.utils.make_ffn``), so the first mod is outermost and sees every reply, custom actions included;
nothing a handler or an inner mod builds can pass around it. The rules are :mod:`~fcd_secure.audit.rules`.

* A refused reply is replaced by an error reply the gate builds itself, with a fixed reason naming only the rule.
* Exceptions from the handler become a generic error, so no exception text can carry data out. The one exception
  is a :class:`~fcd_secure.audit.rules.Refusal` a handler raises because the site's own policy refuses the request
  (weaker settings, a downgrade to clear text, an evaluation cohort): it is recorded as a refusal under its rule
  and answered with the ``policy_refusal`` category of :data:`~fcd_secure.audit.rules.SITE_ERRORS`
  (:data:`POLICY_ERROR_CODE`), its reason followed by the rule's name only.
* Error replies a handler or an inner mod builds are replaced too, code included: an error leaves with a code and
  reason of the closed vocabulary :data:`~fcd_secure.audit.rules.SITE_ERRORS` (the category the inner code names,
  e.g. "data does not match the spec"; any other code becomes :data:`GATE_ERROR_CODE`, "site error"). The handler's
  own code, a 64-bit value of its choosing, is kept in the site ledger only. A site that cannot even be prepared
  (:class:`~fcd_secure.audit.rules.SiteFailure`) answers with that failure's category.
* A reply that passes leaves as a message the gate builds itself, ``Message(content, reply_to=msg)``: its metadata
  (``ttl``, ``created_at``, the task ids, ``delivered_at``, all settable in the pinned Flower) is what Flower derives from
  the instruction and the gate's clock, so no field a handler could set carries bits out.
* A secure-aggregation reply passes the stage's size bound (:mod:`~fcd_secure.audit.rules`) and then, when the site
  binds one (``SiteAuditContext.protocol_reply``), the protocol's own exact check against the request it answers:
  header, length, names (P29).
* A part of the request the handler declines while it answers the rest (``audit.rules.note_declined``: e.g. a scored
  round's values of a policy pair the site's cohort rules refuse, P70) is written into the reply's line as
  ``declined``, by rule, so the ledger shows such a probe as it shows a refused reply.
* Every reply that leaves (content, refusal error or generic error) is measured by
  :func:`fcd_secure.audit.accounting.describe_message` and written to the site ledger *before* it is returned; if
  the ledger cannot be written, only a generic error leaves. The line records the heads of the site's privacy
  ledgers (:mod:`fcd_secure.privacy.anchor`), so a budget reset shows in the signed chain.
* Receipts and countersignatures the server attaches to a downlink are stored and removed before the handler sees
  the message. At the first message of a new round the gate signs a checkpoint closing the previous round(s); the
  federation's final :data:`RECEIPTS_MESSAGE_TYPE` message closes the last one. The latest checkpoint the server has
  not countersigned rides on every reply with content (``content["fcd.audit.head"]``) until it has.
* Each new Θs version the gate sees is kept in the site's :class:`~fcd_secure.audit.history.ThetaSHistory`, so
  replies are checked against the Θs of the last ``GatePolicy.theta_s_history_rounds`` rounds too.
"""

from __future__ import annotations

import inspect
import logging
import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Context, Error, Message, RecordDict

from fcd_secure.audit.accounting import MessageFacts, describe_message, round_of
from fcd_secure.audit.entries import PrivacyAnchor, RefusalRecord, UploadLine
from fcd_secure.audit.history import ThetaSHistory
from fcd_secure.audit.ledger import SiteLedger
from fcd_secure.audit.receipts import (
    HEAD_RECORD,
    RECEIPTS_MESSAGE_TYPE,
    RECEIPTS_RECORD,
    countersigns_from_record,
    head_to_record,
    receipts_from_record,
)
from fcd_secure.audit.rules import (
    SITE_ERRORS,
    GatePolicy,
    Refusal,
    SiteFailure,
    check_content,
    check_reply_binding,
    declining,
    site_error_name,
)
from fcd_secure.manifest import Manifest

__all__ = [
    "GATE_ERROR_CODE",
    "GENERIC_ERROR_REASON",
    "POLICY_ERROR_CODE",
    "POLICY_REASON_PREFIX",
    "RECEIPTS_MESSAGE_TYPE",
    "GatePolicy",
    "SiteAuditContext",
    "make_egress_gate",
]

log = logging.getLogger("fcd_secure.audit.gate")

#: Error code of a refusal and of a generic site error. Reasons come from closed vocabularies (``rules.REFUSAL_RULES``,
#: ``rules.SITE_ERRORS``).
GATE_ERROR_CODE, GENERIC_ERROR_REASON = SITE_ERRORS["internal"]
#: Error code of a request the site's own policy refused (reason: ``POLICY_REASON_PREFIX + rule``): the server can
#: tell a refusal from a failure, and learns nothing but the rule's name.
POLICY_ERROR_CODE = SITE_ERRORS["policy_refusal"][0]
POLICY_REASON_PREFIX = SITE_ERRORS["policy_refusal"][1] + ": "


@dataclass
class SiteAuditContext:
    """What the gate needs from a site, produced per message by the federation's ``get_site(context)``.

    ``theta_s`` and ``propensities`` are callables so the gate reads the *current* arrays at check time, keeps only
    their fingerprints for the duration of one check, and holds no copy afterwards.

    Attributes:
        site_id: the site's stable id (the ledger's writer).
        manifest: the Θc/Θs layout in force.
        theta_s: the site's current Θs tensors.
        ledger: the site's audit ledger.
        policy: what may leave besides Θc.
        propensities: the site's logged propensities ``[n, L]`` (rows and columns are refused), or ``None``.
        privacy_ledger_hash: :func:`fcd_secure.privacy.ledger.privacy_ledger_hash` of the site, or ``None``.
        server_public_key: the server's Ed25519 key, if the site pins it (receipts are then checked on arrival).
        theta_s_history: where the gate keeps the Θs versions of earlier rounds (e.g.
            ``ThetaSHistory(state.slot(THETA_S_HISTORY_FILE))``); ``None``: only the current Θs is refused.
        privacy_anchors: the heads of the site's privacy ledgers, recorded in every upload line:
            ``fcd_secure.privacy.anchor.read_anchors(state_dir)`` (its models, or their JSON as mappings, are read as
            :class:`~fcd_secure.audit.entries.PrivacyAnchor`), or ``None`` when the site keeps no anchor.
        protocol_reply: ``(instruction, content) -> None``, the exact check of a secure-aggregation reply against
            the request it answers (the protocol's own parser; the federation binds
            ``apps.secure_site.secure_reply_check``): it raises :class:`~fcd_secure.audit.rules.Refusal` for a reply
            that is not byte for byte the shape of the stage's message (P29). ``None``: only the stage's size bound
            (``GatePolicy.secagg_replies``) applies.
    """

    site_id: str
    manifest: Manifest
    theta_s: Callable[[], Mapping[str, np.ndarray]]
    ledger: SiteLedger
    policy: GatePolicy = field(default_factory=GatePolicy)
    propensities: Callable[[], np.ndarray | None] = lambda: None
    privacy_ledger_hash: Callable[[], str | None] = lambda: None
    server_public_key: bytes | None = None
    theta_s_history: ThetaSHistory | None = None
    privacy_anchors: Callable[[], Sequence[Any] | None] = lambda: None
    protocol_reply: Callable[[Message, RecordDict], None] | None = None


def make_egress_gate(get_site: Callable[..., SiteAuditContext]) -> Callable[[Message, Context, Callable], Message]:
    """The egress gate mod. Put it first in ``ClientApp(mods=[...])`` (outermost).

    Args:
        get_site: ``get_site(context)`` or ``get_site(msg, context)``, returning the :class:`SiteAuditContext` of the
            site that runs this message. If it raises, the gate answers with a generic error (fail closed).

    Returns:
        The mod, ``egress_gate(msg, context, call_next) -> Message``.
    """
    try:
        takes_msg = len(inspect.signature(get_site).parameters) >= 2
    except (TypeError, ValueError):
        takes_msg = False

    def egress_gate(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        try:
            ctx = get_site(msg, context) if takes_msg else get_site(context)
        except Exception as exc:  # noqa: BLE001 - fail closed: without a working ledger nothing with content leaves
            return _unprepared(msg, exc)
        try:
            # every line this message adds (receipts, checkpoints, the upload line) is on disk, by one fsync at the
            # block's end, before the reply is returned to leave
            with ctx.ledger.deferred_sync():
                return _gate(msg, context, call_next, ctx)
        except Exception as exc:  # noqa: BLE001 - a ledger that cannot be flushed: nothing with content leaves
            log.error("egress gate could not flush its ledger (%s); replying with a generic error", type(exc).__name__)
            _debug_trace()
            return _error_reply(msg, GENERIC_ERROR_REASON)

    egress_gate.__name__ = "egress_gate"
    return egress_gate


def _gate(msg: Message, context: Context, call_next: Callable[[Message, Context], Message],
          ctx: SiteAuditContext) -> Message:
    """:func:`make_egress_gate`'s mod for the site ``ctx``: the reply that may leave for ``msg``, recorded."""
    try:
        ctx.ledger.record_manifest(ctx.manifest)
        rnd = round_of(msg)
        _take_receipts(msg, ctx)
        if msg.metadata.message_type == RECEIPTS_MESSAGE_TYPE:
            # the dedicated receipts message after the last round: store, close every open round, and ack with
            # the last checkpoint so the server countersigns the final head too
            _close_rounds(ctx, None)
            reply = Message(_with_head(RecordDict(), ctx), reply_to=msg)
            _record(ctx, reply, "sent")
            return reply
        if rnd is not None:
            _close_rounds(ctx, rnd)
    except Exception as exc:  # noqa: BLE001 - fail closed: without a working ledger nothing with content leaves
        return _unprepared(msg, exc)

    # what the handler declines while it answers the rest (audit.rules.note_declined) goes into the reply's line
    declined: list[Refusal] = []
    try:
        with declining() as declined:
            reply = call_next(msg, context)
    except Refusal as refusal:  # the site's policy refused the request before anything was computed
        try:
            out = _policy_refusal(msg, refusal)
            _record(ctx, out, "refused", refusal=refusal.to_record(), declined=declined)
            return out
        except Exception as exc:  # noqa: BLE001
            log.error("egress gate could not record a refusal (%s); replying with a generic error", type(exc).__name__)
            return _error_reply(msg, GENERIC_ERROR_REASON)
    except Exception as exc:  # noqa: BLE001 - exception text must never leave the site
        log.warning("handler for %s raised %s; replying with a generic error", msg.metadata.message_type, type(exc).__name__)
        reply = None

    try:
        return _checked(msg, reply, ctx, declined)
    except Exception as exc:  # noqa: BLE001
        log.error("egress gate failed while checking or recording (%s); replying with a generic error", type(exc).__name__)
        _debug_trace()
        return _error_reply(msg, GENERIC_ERROR_REASON)


def _unprepared(msg: Message, exc: Exception) -> Message:
    """The reply when the gate cannot find the site or prepare its ledger for ``msg``: a :class:`SiteFailure`'s
    category (the site knows why it cannot answer: that, nothing more), else a generic error."""
    if isinstance(exc, SiteFailure):
        log.error("egress gate could not prepare (%s); replying with that error", exc.error)
        _debug_trace()
        return _site_error_reply(msg, exc.error)
    log.error("egress gate could not prepare (%s); replying with a generic error", type(exc).__name__)
    _debug_trace()
    return _error_reply(msg, GENERIC_ERROR_REASON)


def _checked(
    msg: Message, reply: Message | None, ctx: SiteAuditContext, declined: Sequence[Refusal] = ()
) -> Message:
    """The reply that may leave for ``msg`` (``reply`` itself, or an error the gate builds), recorded with the parts
    of the request its handler ``declined``."""
    if reply is None or not isinstance(reply, Message):
        out = _error_reply(msg, GENERIC_ERROR_REASON)
        _record(ctx, out, "error", declined=declined)
        return out
    if reply.has_error():
        # the handler's code and reason are both its choice (a 64-bit integer is a covert channel, the reason may
        # quote an exception): only the category of the closed vocabulary leaves, the original code stays local
        out = _site_error_reply(msg, site_error_name(reply.error.code))
        _record(ctx, out, "error", handler_error_code=_int_or_none(reply.error.code), declined=declined)
        return out
    try:
        check_reply_binding(reply, msg)
        theta_s = ctx.theta_s()
        history = (
            ctx.theta_s_history.observe(theta_s, ctx.policy.theta_s_history_rounds) if ctx.theta_s_history is not None else []
        )
        # classified by the instruction's type: a reply's own label is writable by whoever built it
        check_content(
            reply.content, msg.metadata.message_type, ctx.manifest, ctx.policy, theta_s, ctx.propensities(), history
        )
        if ctx.protocol_reply is not None and msg.metadata.message_type.startswith(ctx.policy.secagg_prefix):
            ctx.protocol_reply(msg, reply.content)  # the exact shape of the stage's message, header first (P29)
    except Refusal as refusal:
        withheld = describe_message(reply)
        out = _error_reply(msg, f"egress refused by the site gate: {refusal.rule}")
        _record(ctx, out, "refused", refusal=refusal.to_record(), withheld=withheld, declined=declined)
        log.warning("egress gate refused a %s reply (rule %s)", reply.metadata.message_type, refusal.rule)
        return out
    # rebuilt: only the checked content travels, under metadata Flower derives from the instruction
    out = Message(_with_head(reply.content, ctx), reply_to=msg)
    _record(ctx, out, "sent", declined=declined)
    return out


def _with_head(content: RecordDict, ctx: SiteAuditContext) -> RecordDict:
    """``content`` plus the site's latest checkpoint the server has not countersigned yet, if any."""
    head = ctx.ledger.pending_head()
    if head is None:
        return content
    out = RecordDict(dict(content.items()))
    out[HEAD_RECORD] = head_to_record(head, ctx.ledger.writer_id, ctx.ledger.public_key)
    return out


def record_site_refusal(
    ledger: SiteLedger,
    msg: Message,
    refusal: Refusal,
    *,
    layout_hash: str | None = None,
    privacy_ledger_hash: str | None = None,
    privacy_anchors: Sequence[Any] | None = None,
) -> Message:
    """The reply to a request the site refuses outside a running ClientApp (e.g. an app it does not pin), recorded
    in the site ledger before it leaves.

    Args:
        ledger: the site's ledger.
        msg: the refused instruction.
        refusal: the rule (from :data:`~fcd_secure.audit.rules.REFUSAL_RULES`) and where it fired.
        layout_hash: the manifest in force, if the site has one.
        privacy_ledger_hash: the site's privacy-ledger hash, as every upload line records it.
        privacy_anchors: the heads of the site's privacy ledgers, as every upload line records them.

    Returns:
        An error reply with :data:`POLICY_ERROR_CODE` whose reason names only the rule.
    """
    out = _policy_refusal(msg, refusal)
    ledger.record_upload(
        describe_message(out), status="refused", layout_hash=layout_hash, privacy_ledger_hash=privacy_ledger_hash,
        refusal=refusal.to_record(), privacy_anchors=_anchor_records(privacy_anchors),
    )
    return out


def _policy_refusal(msg: Message, refusal: Refusal) -> Message:
    log.warning("site policy refused a %s request (rule %s)", msg.metadata.message_type, refusal.rule)
    return Message(Error(code=POLICY_ERROR_CODE, reason=POLICY_REASON_PREFIX + refusal.rule), reply_to=msg)


def _error_reply(msg: Message, reason: str) -> Message:
    return Message(Error(code=GATE_ERROR_CODE, reason=reason), reply_to=msg)


def _site_error_reply(msg: Message, error: str) -> Message:
    code, reason = SITE_ERRORS[error]
    return Message(Error(code=code, reason=reason), reply_to=msg)


def _take_receipts(msg: Message, ctx: SiteAuditContext) -> int:
    """Store receipts and countersignatures the server attached to a downlink and remove them before the handler
    sees the message."""
    if not msg.has_content() or RECEIPTS_RECORD not in msg.content:
        return 0
    record = msg.content[RECEIPTS_RECORD]
    del msg.content[RECEIPTS_RECORD]
    stored = [ctx.ledger.store_receipt(r, server_public_key=ctx.server_public_key) for r in receipts_from_record(record)]
    countersigns, server_key = countersigns_from_record(record)
    for line in countersigns:
        if ctx.server_public_key is not None and bytes(ctx.server_public_key) != server_key:
            log.warning("a countersignature arrived under another server key than the pinned one; stored as evidence")
        stored.append(ctx.ledger.store_countersignature(line, server_public_key=server_key))  # type: ignore[arg-type]
    return sum(line is not None for line in stored)


def _close_rounds(ctx: SiteAuditContext, before: int | None) -> None:
    """Checkpoint every round with uploads that is older than ``before`` (all of them when ``before`` is None)."""
    for r in ctx.ledger.rounds_open():
        if before is None or r < before:
            ctx.ledger.checkpoint(r)


def _debug_trace() -> None:
    """With ``FCD_AUDIT_DEBUG=1`` only: the traceback goes to the site's own log (it may quote data; never sent)."""
    if os.environ.get("FCD_AUDIT_DEBUG") == "1":
        log.error("egress gate traceback (local only):\n%s", traceback.format_exc())


def _record(
    ctx: SiteAuditContext,
    out: Message,
    status: str,
    *,
    refusal: RefusalRecord | None = None,
    withheld: MessageFacts | None = None,
    handler_error_code: int | None = None,
    declined: Sequence[Refusal] = (),
) -> UploadLine:
    if declined:
        log.warning("site handler declined part of a %s request (rules %s)", out.metadata.message_type,
                    ", ".join(sorted({r.rule for r in declined})))
    return ctx.ledger.record_upload(
        describe_message(out),
        status=status,
        layout_hash=ctx.manifest.layout_hash,
        privacy_ledger_hash=ctx.privacy_ledger_hash(),
        refusal=refusal,
        withheld=withheld,
        handler_error_code=handler_error_code,
        declined=tuple(r.to_record() for r in declined),
        privacy_anchors=_anchors(ctx),
    )


def _anchors(ctx: SiteAuditContext) -> tuple[PrivacyAnchor, ...] | None:
    return _anchor_records(ctx.privacy_anchors())


def _anchor_records(anchors: Sequence[Any] | None) -> tuple[PrivacyAnchor, ...] | None:
    if anchors is None:
        return None
    # the privacy layer hands the same type (fcd_secure.anchor_records); a dict (a test's, a reloaded line's) is checked
    return tuple(PrivacyAnchor.model_validate(a) for a in anchors)


def _int_or_none(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None

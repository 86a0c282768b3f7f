"""The egress gate: the one place on a site that decides what may leave, and writes down what did.

Paper §III-B (decoupled synchronisation): "clients update (Θc, Θs_i) locally but only transmit Θc to the server".
DESIGN.md trap 5: logged propensities never leave a site. The gate enforces both on every reply, as the outermost
ClientApp mod (flwr 1.42: the first mod in ``ClientApp(mods=[...])`` wraps everything, custom actions included;
../shared/research/flower-runtime.md §3), so nothing a handler or an inner mod builds can pass around it.

A reply may carry only (a positive manifest, ops-anchors §3.5):

* ArrayRecords whose arrays are Θc tensors by manifest name, with the manifest's shape and dtype;
* MetricRecords whose keys are allow-listed aggregate metrics, scalar values only;
* ConfigRecords only in secure-aggregation protocol messages (``train.secagg_<stage>``: opaque bytes, ints,
  short strings; never floats) or under keys the site allow-lists.

It refuses, and records the refusal, anything that names a Θs parameter or a propensity (any record, array, metric
or config key), any tensor or bytes field whose bytes equal or contain a current Θs tensor's bytes (a renamed or
re-keyed copy) or the site's propensity array, and anything not on the list. A refused reply is replaced by an
error reply the gate builds itself with a fixed reason naming only the rule; exceptions from the handler become
the same kind of generic error, so no exception text can carry data out. Error replies a handler or an inner mod
builds are replaced too, code included: every error that leaves carries ``GATE_ERROR_CODE`` (the handler's own code,
a 64-bit value of its choosing, is kept in the local ledger entry only).

A reply must answer the instruction it is for: its type, ``reply_to_message_id``, run, round (``group_id``) and
destination must be what ``Message(content, reply_to=msg)`` sets (flwr 1.42 lets a handler relabel ``message_type``
and ``group_id`` through setters); anything else is refused (rule ``not_a_reply``). What may pass is decided by the
*instruction's* type, never by the reply's own label.

Every reply that leaves (content, refusal error or generic error) is measured by
:func:`fcd_secure.audit.accounting.describe_message` (exact serialized object bytes, Flower's content hash) and
written to the site ledger *before* it is returned; if the ledger cannot be written, only a generic error leaves.
At the first message of a new round the gate signs a checkpoint closing the previous round(s); the federation's
final receipts message closes the last one.

The bytes rule finds a whole Θs tensor or the propensity array (float32 or float64) at any byte offset of any array
or bytes field, and also any single row of them (a slice of a Θs matrix, one trajectory's propensities): a
vectorised rolling hash over every window, confirmed byte for byte.

Limits, stated honestly: inside secure aggregation the masked vector is opaque, so keeping Θs out of it is the
secure-aggregation module's job (DESIGN P15); a Θs tensor transformed (cast to another dtype, scaled, permuted) or
cut into pieces shorter than a row is not recognised by bytes, only by name and by the manifest's shape/dtype
rules; constant tensors and rows (all elements equal) carry one number and are skipped by the bytes rule (they
would collide with any constant Θc tensor, e.g. a zero bias); payloads above 16 MiB get the whole-tensor check only.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import inspect
import logging
import os
import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from pydantic import BaseModel, ConfigDict, Field

from fcd_secure.audit.accounting import MessageFacts, describe_message, round_of
from fcd_secure.audit.ledger import RECEIPTS_RECORD, SiteLedger, receipts_from_record

log = logging.getLogger("fcd_secure.audit.gate")

#: Error code of every reply the gate builds. Reasons come from a closed vocabulary (``REFUSAL_RULES``).
GATE_ERROR_CODE = 0x7E6
GENERIC_ERROR_REASON = "site error (details stay on the site)"
SECAGG_PREFIX = "train.secagg_"
#: Message type of the dedicated receipts downlink the ServerApp sends after the last round.
RECEIPTS_MESSAGE_TYPE = "query.audit_receipts"

REFUSAL_RULES = {
    "theta_s_name": "a Θs parameter name",
    "theta_s_bytes": "a tensor or field whose bytes equal or contain a Θs tensor",
    "propensity": "a propensity field or array",
    "unlisted_tensor": "a tensor that is not a Θc tensor of the manifest",
    "layout_mismatch": "a Θc tensor with another shape or dtype than the manifest",
    "metric_not_allowed": "a metric that is not allow-listed, or not a scalar",
    "config_not_allowed": "a config field outside the secure-aggregation protocol and the allow-list",
    "unsupported_record": "a record type the gate does not know",
    "not_a_reply": "a reply that does not answer the message it was built for (type, id, run, round or destination)",
}

#: Reply metadata that must equal what ``Message(content, reply_to=msg)`` sets (flwr 1.42 ``Message.__init__``):
#: ``(reply field, instruction field)``. ``message_type``, ``group_id`` and ``dst_node_id`` have setters in flwr
#: 1.42, so a handler or an inner mod can relabel a reply (e.g. as ``train.secagg_*`` to pass ConfigRecord bytes).
REPLY_BINDING = (
    ("message_type", "message_type"),
    ("reply_to_message_id", "message_id"),
    ("run_id", "run_id"),
    ("group_id", "group_id"),
    ("dst_node_id", "src_node_id"),
)

#: Key names that denote propensities (DESIGN trap 5). Matched against every record, array, metric and config key.
PROPENSITY_NAME = re.compile(r"(?i)(^|[/._-])(p|ps|pscore|pscores)$|propens|behaviou?r_?prob|logging_?prob|action_?prob")


class GatePolicy(BaseModel):
    """Site-owned egress policy. Everything not listed here or in the manifest's Θc part is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_metrics: frozenset[str] = Field(
        default=frozenset(),
        description="aggregate scalar metrics allowed in MetricRecords, as 'key' or 'record/key' (fnmatch patterns)",
    )
    allowed_metric_lists: frozenset[str] = Field(
        default=frozenset(),
        description="metrics that may be lists of numbers (aggregate histograms), same form as allowed_metrics",
    )
    allowed_config_keys: frozenset[str] = Field(
        default=frozenset(),
        description="config keys allowed outside secure-aggregation messages, as 'key' or 'record/key' (fnmatch patterns)",
    )
    allow_theta_s_upload: bool = Field(
        default=False,
        description=(
            "research only: let Θs pass (the paper's 'w/o DSS' full-synchronisation ablation). The uploads are "
            "recorded as they are, so `fcd audit verify` reports them as violations"
        ),
    )
    secagg_prefix: str = SECAGG_PREFIX
    max_config_str_len: int = Field(default=128, description="longest str value in a protocol ConfigRecord")
    min_private_tensor_bytes: int = Field(
        default=16, description="Θs/propensity tensors shorter than this are matched by name only (too little to fingerprint)"
    )


@dataclass
class ManifestView:
    """The part of the model manifest the gate needs (duck-typed on ``fcd_secure.model.manifest.Manifest``)."""

    layout_hash: str
    theta_c: dict[str, tuple[tuple[int, ...], str]]
    theta_s: dict[str, tuple[tuple[int, ...], str]]

    @classmethod
    def of(cls, manifest: Any) -> "ManifestView":
        if isinstance(manifest, ManifestView):
            return manifest
        entries = manifest["entries"] if isinstance(manifest, Mapping) else manifest.entries
        layout = manifest["layout_hash"] if isinstance(manifest, Mapping) else manifest.layout_hash
        c, s = {}, {}
        for e in entries:
            get = e.get if isinstance(e, Mapping) else (lambda k, _e=e: getattr(_e, k))
            part = str(get("part"))
            spec = (tuple(int(x) for x in get("shape")), _dtype_name(get("dtype")))
            if part == "theta_c":
                c[str(get("name"))] = spec
            elif part == "theta_s":
                s[str(get("name"))] = spec
            else:
                raise ValueError(f"manifest entry {get('name')!r}: part must be theta_c or theta_s, got {part!r}")
        return cls(layout_hash=str(layout), theta_c=c, theta_s=s)

    def to_json(self) -> dict:
        return {
            "layout_hash": self.layout_hash,
            "theta_c": [{"name": n, "shape": list(s), "dtype": d} for n, (s, d) in sorted(self.theta_c.items())],
            "theta_s": [{"name": n, "shape": list(s), "dtype": d} for n, (s, d) in sorted(self.theta_s.items())],
        }


@functools.lru_cache(maxsize=256)
def _dtype_name_of(text: str) -> str:
    try:
        return np.dtype(text).name
    except TypeError:
        return text


def _dtype_name(dtype: Any) -> str:
    """Canonical dtype name ("float32") of a numpy/torch dtype or its string."""
    text = str(dtype)
    if text.startswith("torch."):
        text = text[len("torch."):]
    return _dtype_name_of(text)


@dataclass
class SiteAuditContext:
    """What the gate needs from a site, produced per message by the federation's ``get_site(context)``.

    ``theta_s`` and ``propensities`` are callables so the gate reads the *current* arrays at check time, keeps only
    their fingerprints for the duration of one check, and holds no copy afterwards.
    """

    site_id: str
    manifest: Any
    theta_s: Callable[[], Mapping[str, np.ndarray]]
    ledger: SiteLedger
    policy: GatePolicy = field(default_factory=GatePolicy)
    propensities: Callable[[], np.ndarray | None] = lambda: None
    privacy_ledger_hash: Callable[[], str | None] = lambda: None
    server_public_key: bytes | None = None


class Refusal(Exception):
    """Internal: raised by a check; carries the rule id and where it fired (stays on the site)."""

    def __init__(self, rule: str, record: str, key: str | None = None) -> None:
        super().__init__(rule)
        self.rule, self.record, self.key = rule, record, key

    def to_json(self) -> dict:
        return {"rule": self.rule, "record": self.record, "key": self.key}


# -- fingerprints of the private arrays ----------------------------------------------------------------------------
#: Odd multiplier of the rolling hash (any odd constant is invertible modulo 2**64).
_R = np.uint64(0x9E3779B97F4A7C15)
_R_INV = np.uint64(pow(int(_R), -1, 2**64))
_BITMAP_SIZE = 1 << 20
_BITMAP_MASK = np.uint64(_BITMAP_SIZE - 1)
#: Payloads above this size are checked for whole private tensors only (the row scan holds ~24 B per payload byte).
MAX_ROW_SCAN_BYTES = 16 * 1024 * 1024


def _powers(base: np.uint64, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    out[0] = 1
    if n > 1:
        out[1:] = base
        np.cumprod(out[1:], out=out[1:])  # wraps modulo 2**64, which is the ring the hash lives in
    return out


class _Windows:
    """Rolling hashes of every window of one payload: prefix sums once, any window length in O(n)."""

    def __init__(self, data: bytes) -> None:
        buf = np.frombuffer(data, dtype=np.uint8)
        self.n = buf.size
        with np.errstate(over="ignore"):
            self.prefix = np.concatenate(([np.uint64(0)], np.cumsum(buf.astype(np.uint64) * _powers(_R, self.n), dtype=np.uint64)))
        self.inv = _powers(_R_INV, self.n)

    def hashes(self, length: int) -> np.ndarray:
        """Position-normalised hash of the window starting at each offset (equal windows hash equal)."""
        m = self.n - length + 1
        with np.errstate(over="ignore"):
            return (self.prefix[length:] - self.prefix[:m]) * self.inv[:m]


def _row_hashes(rows: np.ndarray) -> np.ndarray:
    """The same hash for each row of a ``[k, length]`` uint8 matrix, vectorised."""
    with np.errstate(over="ignore"):
        return (rows.astype(np.uint64) * _powers(_R, rows.shape[1])).sum(axis=1, dtype=np.uint64)


@dataclass
class _Private:
    """What must not leave, by kind (``theta_s`` / ``propensity``): whole arrays (exact hash and containment at any
    byte offset) and rows (found at any byte offset by a rolling hash, then confirmed byte for byte)."""

    kind: str
    blobs: list[bytes]
    hashes: set[str]
    #: row length -> (sorted row hashes, row bytes matrix in the same order, bitmap prefilter of the hashes)
    rows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def add_rows(self, arr: np.ndarray, min_len: int) -> None:
        if arr.ndim < 2:
            return
        flat = arr.reshape(arr.shape[0], -1)
        if flat.shape[1] < 2 or flat[0].nbytes < min_len:
            return
        # constant rows carry one number and would match any constant tensor (a zero bias): skipped
        keep = ~np.all(flat == flat[:, :1], axis=1)
        if not keep.any():
            return
        raw = np.ascontiguousarray(flat[keep]).view(np.uint8).reshape(int(keep.sum()), -1)
        hashes = _row_hashes(raw)
        length = raw.shape[1]
        if length in self.rows:
            old_h, old_raw, _ = self.rows[length]
            hashes, raw = np.concatenate([old_h, hashes]), np.concatenate([old_raw, raw])
        order = np.argsort(hashes, kind="stable")
        bitmap = np.zeros(_BITMAP_SIZE, dtype=bool)
        bitmap[(hashes & _BITMAP_MASK).astype(np.intp)] = True
        self.rows[length] = (hashes[order], raw[order], bitmap)

    def find_row(self, data: bytes, windows: "_Windows | None") -> bool:
        if not self.rows or windows is None:
            return False
        for length, (keys, raw, bitmap) in self.rows.items():
            if length > windows.n:
                continue
            hashes = windows.hashes(length)
            # a bitmap of the low hash bits rules out almost every window with one gather; the rest are looked up
            cand = np.flatnonzero(bitmap[(hashes & _BITMAP_MASK).astype(np.intp)])
            for pos in cand:
                j = int(np.searchsorted(keys, hashes[pos]))
                while j < keys.size and keys[j] == hashes[pos]:  # confirm byte for byte (hash collisions are possible)
                    if data[pos : pos + length] == raw[j].tobytes():
                        return True
                    j += 1
        return False


def _private_blobs(ctx: SiteAuditContext) -> list[_Private]:
    """Fingerprints of the current Θs tensors and the propensity array. Constant or tiny arrays are skipped."""
    min_len = ctx.policy.min_private_tensor_bytes

    def usable(a: np.ndarray) -> bool:
        return a.size >= 2 and a.nbytes >= min_len and not np.all(a.reshape(-1) == a.reshape(-1)[0])

    theta = _Private("theta_s", [], set())
    for arr in (ctx.theta_s() or {}).values():
        a = np.ascontiguousarray(np.asarray(arr))
        if usable(a):
            theta.blobs.append(a.tobytes())
            theta.add_rows(a, min_len)
    prop = _Private("propensity", [], set())
    p = ctx.propensities()
    if p is not None:
        a = np.ascontiguousarray(np.asarray(p))
        for cand in {a.dtype: a, np.dtype(np.float32): a.astype(np.float32), np.dtype(np.float64): a.astype(np.float64)}.values():
            if usable(cand):
                prop.blobs.append(np.ascontiguousarray(cand).tobytes())
                prop.add_rows(cand, min_len)
    for group in (theta, prop):
        group.hashes = {hashlib.sha256(b).hexdigest() for b in group.blobs}
    return [theta, prop]


def _check_bytes(data: bytes, private: list[_Private], record: str, key: str) -> None:
    if not data:
        return
    h = hashlib.sha256(data).hexdigest()
    windows = _Windows(data) if len(data) <= MAX_ROW_SCAN_BYTES and any(g.rows for g in private) else None
    for group in private:
        rule = "theta_s_bytes" if group.kind == "theta_s" else "propensity"
        if h in group.hashes:
            raise Refusal(rule, record, key)
        for blob in group.blobs:
            # containment catches a private tensor concatenated into a larger array or protocol field
            if len(blob) <= len(data) and blob in data:
                raise Refusal(rule, record, key)
        if group.find_row(data, windows):  # one row (a patient's propensities, a slice of a Θs matrix) is enough
            raise Refusal(rule, record, key)


def _check_name(name: str, theta_s_names: set[str], record: str, key: str | None) -> None:
    if name in theta_s_names or name.split("/")[-1] in theta_s_names:
        raise Refusal("theta_s_name", record, key)
    if PROPENSITY_NAME.search(name):
        raise Refusal("propensity", record, key)


def _allowed(name: str, record: str, allow: Iterable[str]) -> bool:
    full = f"{record}/{name}"
    return any(fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(full, pat) for pat in allow)


def check_reply_binding(reply: Message, msg: Message) -> None:
    """Raise :class:`Refusal` unless ``reply`` answers ``msg`` exactly as ``Message(content, reply_to=msg)`` would."""
    for reply_field, msg_field in REPLY_BINDING:
        if getattr(reply.metadata, reply_field) != getattr(msg.metadata, msg_field):
            raise Refusal("not_a_reply", "metadata", reply_field)


def check_content(content: RecordDict, message_type: str, ctx: SiteAuditContext, manifest: ManifestView) -> None:
    """Raise :class:`Refusal` if ``content`` may not leave the site; return quietly otherwise.

    ``message_type`` must be the type of the *instruction* being answered (never the reply's own label): it decides
    whether secure-aggregation protocol fields are allowed.
    """
    policy = ctx.policy
    s_names = set() if policy.allow_theta_s_upload else set(manifest.theta_s)
    private = [p for p in _private_blobs(ctx) if not (policy.allow_theta_s_upload and p.kind == "theta_s")]
    layout = {**manifest.theta_c, **manifest.theta_s} if policy.allow_theta_s_upload else manifest.theta_c
    secagg = message_type.startswith(policy.secagg_prefix)
    for rname, record in content.items():
        rname = str(rname)
        _check_name(rname, s_names, rname, None)
        if isinstance(record, ArrayRecord):
            for key, arr in record.items():
                key = str(key)
                _check_name(key, s_names, rname, key)
                data = np.ascontiguousarray(arr.numpy()).tobytes()
                _check_bytes(data, private, rname, key)
                spec = layout.get(key)
                if spec is None:
                    raise Refusal("unlisted_tensor", rname, key)
                if tuple(int(x) for x in arr.shape) != spec[0] or _dtype_name(arr.dtype) != spec[1]:
                    raise Refusal("layout_mismatch", rname, key)
        elif isinstance(record, MetricRecord):
            for key, value in record.items():
                key = str(key)
                _check_name(key, s_names, rname, key)
                if isinstance(value, list):
                    if not _allowed(key, rname, policy.allowed_metric_lists):
                        raise Refusal("metric_not_allowed", rname, key)
                elif not _allowed(key, rname, policy.allowed_metrics):
                    raise Refusal("metric_not_allowed", rname, key)
        elif isinstance(record, ConfigRecord):
            for key, value in record.items():
                key = str(key)
                _check_name(key, s_names, rname, key)
                values = value if isinstance(value, list) else [value]
                # private content first, so the ledger records the most specific reason for a refusal
                for v in values:
                    if isinstance(v, bytes):
                        _check_bytes(v, private, rname, key)
                    elif isinstance(v, str):
                        _check_name(v, s_names, rname, key)
                if not (secagg or _allowed(key, rname, policy.allowed_config_keys)):
                    raise Refusal("config_not_allowed", rname, key)
                for v in values:
                    if isinstance(v, str) and len(v) > policy.max_config_str_len:
                        raise Refusal("config_not_allowed", rname, key)
                    if isinstance(v, float):
                        # floats in protocol fields would be a clear-text channel for values; the protocol is ints/bytes
                        raise Refusal("config_not_allowed", rname, key)
        else:
            raise Refusal("unsupported_record", rname, None)


# -- the mod -------------------------------------------------------------------------------------------------------
def _error_reply(msg: Message, reason: str) -> Message:
    return Message(Error(code=GATE_ERROR_CODE, reason=reason), reply_to=msg)


def _take_receipts(msg: Message, ctx: SiteAuditContext) -> int:
    """Store receipts the server attached to a downlink and remove them before the handler sees the message."""
    if not msg.has_content() or RECEIPTS_RECORD not in msg.content:
        return 0
    record = msg.content[RECEIPTS_RECORD]
    del msg.content[RECEIPTS_RECORD]
    n = 0
    for receipt in receipts_from_record(record):
        if ctx.ledger.store_receipt(receipt, server_public_key=ctx.server_public_key):
            n += 1
    return n


def _close_rounds(ctx: SiteAuditContext, before: int | None) -> None:
    """Checkpoint every round with uploads that is older than ``before`` (all of them when ``before`` is None)."""
    for r in ctx.ledger.rounds_open():
        if before is None or r < before:
            ctx.ledger.checkpoint(r)


def make_egress_gate(get_site: Callable[..., SiteAuditContext]) -> Callable[[Message, Context, Callable], Message]:
    """The egress gate mod. Put it first in ``ClientApp(mods=[...])`` (outermost).

    ``get_site(context)`` (or ``get_site(msg, context)``) returns the :class:`SiteAuditContext` of the site that runs
    this message.
    """
    try:
        takes_msg = len(inspect.signature(get_site).parameters) >= 2
    except (TypeError, ValueError):
        takes_msg = False

    def egress_gate(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        try:
            ctx = get_site(msg, context) if takes_msg else get_site(context)
            manifest = ManifestView.of(ctx.manifest)
            ctx.ledger.record_manifest(manifest.to_json())
            rnd = round_of(msg)
            _take_receipts(msg, ctx)
            if msg.metadata.message_type == RECEIPTS_MESSAGE_TYPE:
                # the dedicated receipts message after the last round: store, close every open round, ack empty
                reply = Message(RecordDict(), reply_to=msg)
                _record(ctx, reply, "sent", manifest)
                _close_rounds(ctx, None)  # after the ack's own entry, so every upload is under a checkpoint
                return reply
            if rnd is not None:
                _close_rounds(ctx, rnd)
        except Exception as exc:  # noqa: BLE001 - fail closed: without a working ledger nothing with content leaves
            log.error("egress gate could not prepare (%s); replying with a generic error", type(exc).__name__)
            _debug_trace()
            return _error_reply(msg, GENERIC_ERROR_REASON)

        try:
            reply = call_next(msg, context)
        except Exception as exc:  # noqa: BLE001 - exception text must never leave the site
            log.warning("handler for %s raised %s; replying with a generic error", msg.metadata.message_type, type(exc).__name__)
            reply = None

        try:
            if reply is None or not isinstance(reply, Message):
                out = _error_reply(msg, GENERIC_ERROR_REASON)
                _record(ctx, out, "error", manifest)
                return out
            if reply.has_error():
                # the handler's code and reason are both its choice (a 64-bit integer is a covert channel, the
                # reason may quote an exception): a fixed code and reason leave, the original code stays local
                out = _error_reply(msg, GENERIC_ERROR_REASON)
                _record(ctx, out, "error", manifest, handler_error_code=_int_or_none(reply.error.code))
                return out
            try:
                check_reply_binding(reply, msg)
                # classified by the instruction's type: a reply's own label is writable by whoever built it
                check_content(reply.content, msg.metadata.message_type, ctx, manifest)
            except Refusal as refusal:
                withheld = describe_message(reply)
                out = _error_reply(msg, f"egress refused by the site gate: {refusal.rule}")
                _record(ctx, out, "refused", manifest, refusal=refusal.to_json(), withheld=withheld)
                log.warning("egress gate refused a %s reply (rule %s)", reply.metadata.message_type, refusal.rule)
                return out
            _record(ctx, reply, "sent", manifest)
            return reply
        except Exception as exc:  # noqa: BLE001
            log.error("egress gate failed while checking or recording (%s); replying with a generic error", type(exc).__name__)
            _debug_trace()
            return _error_reply(msg, GENERIC_ERROR_REASON)

    egress_gate.__name__ = "egress_gate"
    return egress_gate


def _debug_trace() -> None:
    """With ``FCD_AUDIT_DEBUG=1`` only: the traceback goes to the site's own log (it may quote data; never sent)."""
    if os.environ.get("FCD_AUDIT_DEBUG") == "1":
        log.error("egress gate traceback (local only):\n%s", traceback.format_exc())


def _record(
    ctx: SiteAuditContext,
    out: Message,
    status: str,
    manifest: ManifestView,
    *,
    refusal: dict | None = None,
    withheld: MessageFacts | None = None,
    handler_error_code: int | None = None,
) -> dict:
    facts = describe_message(out)
    return ctx.ledger.record_upload(
        facts,
        status=status,
        layout_hash=manifest.layout_hash,
        privacy_ledger_hash=ctx.privacy_ledger_hash(),
        refusal=refusal,
        withheld=withheld,
        handler_error_code=handler_error_code,
    )


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

"""What may leave a site: the egress policy, the closed vocabulary of refusals, and the checks of one reply.

A reply may carry only (a positive manifest: everything not listed is refused):

* ArrayRecords whose arrays are Θc tensors by manifest name, with the manifest's shape and dtype (paper §III-B:
  "clients update (Θc, Θs_i) locally but only transmit Θc to the server");
* MetricRecords whose keys are allow-listed aggregate metrics, by exact ``record/key`` name: scalars under
  ``allowed_metrics``, lists only under ``allowed_metric_lists`` and no longer than their cap;
* ConfigRecords under exactly allow-listed ``record/key`` names, each of its declared type and length;
* in the secure-aggregation protocol (``train.secagg_<stage>``), exactly the protocol's one field: the reply of
  ``train.secagg_evaluate`` is exactly one ``secagg/msg`` field holding the schema of the site's evaluation sums,
  whose every name is an allow-listed evaluation metric (names and lengths only; the values follow masked); the
  reply of every stage with a size bound (``GatePolicy.secagg_replies``: the protocol's five stages and the training
  round's combined ones) is exactly one ``secagg/msg`` bytes field no longer than that bound
  (:class:`SecaggReplyRule`); any other stage is refused, whatever its reply holds. The bound is the coarse check a
  gate can make alone: a site's gate also checks each protocol message exactly against its request, roster and
  layout (``SiteAuditContext.protocol_reply``, P29).

A site that requires secure aggregation (``GatePolicy.secure_only``) sends no tensor and no metric outside that
protocol at all (P20).

No glob: a name is allowed or it is not (a pattern such as ``eval/*`` or ``hello/dim-*`` let any value out under a
fresh name). :mod:`fcd_secure.audit.allowlist` builds the federation's exact lists.

It refuses anything that names a Θs parameter or a propensity (any record, array, metric or config key, and string
values), and anything in which :mod:`~fcd_secure.audit.scanner` finds a private value: a Θs tensor of this round or
of the last ``theta_s_history_rounds`` rounds, or the site's propensities, whole or one row or column, in any
tensor, bytes field or list of numbers (as float32, float64 and integer views), the scalars of a record read in
order as one list, and single Θs values carried as numbers. Private content is looked for first, so the ledger
records the most specific reason.

A reply must also answer the instruction it is for (:func:`check_reply_binding`); what may pass is decided by the
*instruction's* type, never by the reply's own label. Inside secure aggregation the masked vector is opaque: keeping
Θs out of it is the secure-aggregation module's job.

The scans find private values as they are, not transforms of them (1 − P, float16, a multiple, compressed bytes in
exact-length masked words): that residual is covered by the site running only code it pins, not by this module
(docs/threats.md P58).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fcd_secure.audit.entries import RefusalRecord
from fcd_secure.audit.scanner import PrivateArrays, PrivateValues, find_private, fingerprint_private, number_views
from fcd_secure.manifest import FULL, THETA_C, THETA_S, Manifest, dtype_name
from fcd_secure.errors import FcdError

#: Message types of the secure-aggregation protocol start with this prefix.
SECAGG_PREFIX = "train.secagg_"

#: The closed vocabulary of refusals: a refused reply leaves as an error whose reason names only the rule.
REFUSAL_RULES = {
    "theta_s_name": "a Θs parameter name",
    "theta_s_bytes": "a tensor, field or list of numbers whose bytes equal or contain a Θs tensor, row or column",
    "theta_s_value": "a number that carries a Θs parameter value",
    "propensity": "a propensity field, or an array, field or list holding the propensities or a row or column of them",
    "unlisted_tensor": "a tensor that is not a Θc tensor of the manifest",
    "layout_mismatch": "a Θc tensor with another shape or dtype than the manifest",
    "metric_not_allowed": "a metric that is not allow-listed by exact name, or a list longer than its cap",
    "config_not_allowed": "a config field that is not allow-listed by exact name, type and length",
    "protocol_shape": "a secure-aggregation reply that is not exactly its one expected field, type and size",
    "unsupported_record": "a record type the gate does not know",
    "not_a_reply": "a reply that does not answer the message it was built for (type, id, run, round, source or destination)",
    "clear_in_secure_mode": "a Θc tensor or a number outside the masked vector of a site that requires secure aggregation",
    # refusals a site's own handlers raise before anything is computed (recorded by the gate with this rule)
    "site_policy": "a request asking for less protection than the site's policy (the key names the field)",
    "downgrade": "a plain (clear-text) action sent to a site that requires secure aggregation",
    "eval_cohort": "an evaluation the site's cohort rules refuse (too few rows, a cohort too close to an earlier one, "
    "the same rows evaluated too often, or what-if policies whose cohorts differ by too few entities)",
    "app_not_pinned": "a Flower app whose bundle hash is not pinned by the site (its code never ran)",
    "unknown_message_type": "a message type the site's app does not handle (no handler ran; P28)",
    "run_not_signed": "a run start the consortium's coordinator did not sign for this consortium, app and run config "
    "(its code never ran)",
    "run_replayed": "a signed run start already used by another Flower run, or first seen after its expiry (its code "
    "never ran; P52)",
    "whatif_run": "a question about a deployed run the site has no record of answering, or whose Θs it deleted, or "
    "one whose Θc or question is not the run's and the coordinator's as signed (P61-P63)",
}
#: The rule of a message type the site's app does not handle (P28): ``apps.client_app.SiteClientApp`` raises it,
#: verify names the type in a note.
UNKNOWN_TYPE_RULE = "unknown_message_type"

#: The closed vocabulary of site errors: ``name -> (error code, reason)``, the only code and reason an error reply may
#: carry out of a site. A site's failure is reported by category, never by its text (an exception may quote a
#: record) or a code of the handler's choosing (a 64-bit covert channel): the server can tell the operator that a
#: site's data does not match the spec or that its DP budget is spent, and nothing more.
SITE_ERRORS: dict[str, tuple[int, str]] = {
    "internal": (0x7E6, "site error (details stay on the site)"),
    "data_mismatch": (0x7E7, "data does not match the spec"),
    "budget_exhausted": (0x7E8, "DP budget exhausted"),
    "policy_refusal": (0x7E9, "refused by the site's policy"),
}
#: error code -> category name of :data:`SITE_ERRORS`
SITE_ERROR_NAMES: dict[int, str] = {code: name for name, (code, _) in SITE_ERRORS.items()}


def site_error_name(code: object) -> str:
    """The category of an error code that left a site; any code outside :data:`SITE_ERRORS` is ``"internal"``."""
    try:
        return SITE_ERROR_NAMES.get(int(code), "internal")  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return "internal"


class SiteFailure(FcdError, Exception):
    """A failure a site reports by its category only (one of :data:`SITE_ERRORS`), raised where the cause is known.

    Args:
        error: the category name.
    """

    def __init__(self, error: str) -> None:
        if error not in SITE_ERRORS:
            raise ValueError(f"unknown site error {error!r}; the vocabulary is closed: {sorted(SITE_ERRORS)}")
        super().__init__(error)
        self.error = error


#: The rule a private array found by bytes breaks, by its kind.
_BYTES_RULE = {"theta_s": "theta_s_bytes", "propensity": "propensity"}

#: Reply metadata that must equal what ``Message(content, reply_to=msg)`` sets (the pinned Flower's ``Message.__init__``):
#: ``(reply field, instruction field)``. ``message_type``, ``group_id`` and ``dst_node_id`` have setters in the
#: pinned Flower, so a handler or an inner mod can relabel a reply (e.g. as ``train.secagg_*`` to pass ConfigRecord bytes).
#: The gate then rebuilds every reply's metadata itself, so fields nobody checks (``ttl``, ``created_at``, the task
#: ids, ``delivered_at``) carry nothing a handler chose.
REPLY_BINDING = (
    ("message_type", "message_type"),
    ("reply_to_message_id", "message_id"),
    ("run_id", "run_id"),
    ("group_id", "group_id"),
    ("dst_node_id", "src_node_id"),
    ("src_node_id", "dst_node_id"),
)

#: Key names that denote propensities. Matched against every record, array, metric and config key.
PROPENSITY_NAME = re.compile(r"(?i)(^|[/._-])(p|ps|pscore|pscores)$|propens|behaviou?r_?prob|logging_?prob|action_?prob")

_GLOB = re.compile(r"[*?\[\]]")


def _exact_name(name: str) -> str:
    if _GLOB.search(name) or name.count("/") != 1 or not all(name.split("/")):
        raise ValueError(f"{name!r}: allow-list entries are exact 'record/key' names (no glob, one '/')")
    return name


class ConfigFieldRule(BaseModel):
    """What one allow-listed config field may hold outside the secure-aggregation protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["int", "str", "bool", "bytes"]
    max_len: int = Field(default=64, ge=0, description="longest str (characters) or bytes value")
    max_abs: int = Field(default=2**31 - 1, ge=0, description="largest |int| value")


class SecaggReplyRule(BaseModel):
    """The size bound of one secure-aggregation stage's ``msg`` bytes (Bonawitz et al. CCS 2017, Fig. 4 rounds).

    ``max bytes = base + per_site · max_sites + per_theta_c_element · |Θc|``: a reply that is larger carries more
    than the stage's message (e.g. the masked vector is 4 bytes per Θc element plus a few words of header).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: int = Field(ge=0)
    per_site: int = Field(default=0, ge=0)
    per_theta_c_element: int = Field(default=0, ge=0)

    def max_bytes(self, n_theta_c: int, max_sites: int) -> int:
        return self.base + self.per_site * max_sites + self.per_theta_c_element * n_theta_c


#: The stages of ``fcd_secure.aggregation.secagg`` and the size of each reply (header 29 B, site id ≤ 128 B,
#: signatures 64 B, X25519 keys 32 B, AES-GCM share ciphertexts ≤ 512 B, Shamir shares 32 B, uint32 vector words),
#: with room for a commitment per peer.
SECAGG_REPLIES: dict[str, SecaggReplyRule] = {
    "advertise_keys": SecaggReplyRule(base=1024, per_site=96),
    "share_keys": SecaggReplyRule(base=512, per_site=768),
    "masked_input": SecaggReplyRule(base=512, per_theta_c_element=4),
    "consistency": SecaggReplyRule(base=512),
    "unmask": SecaggReplyRule(base=512, per_site=224),
}


def _both(a: SecaggReplyRule, b: SecaggReplyRule) -> SecaggReplyRule:
    # two protocol messages, each behind a 4-byte length
    return SecaggReplyRule(base=a.base + b.base + 8, per_site=a.per_site + b.per_site,
                           per_theta_c_element=a.per_theta_c_element + b.per_theta_c_element)


#: The carrier's combined stages (``fcd_secure.federation.secure.flow``): training with the first protocol stage of
#: its round (``train_advertise``) or with the masked input of a round whose keys came earlier (``train_masked``),
#: and one round's last two stages carrying the next round's first two (``consistency_next``, ``unmask_next``: the
#: two replies length-prefixed, ``fcd_secure.federation.records.pack_pair``).
SECAGG_REPLIES.update({
    "train_advertise": SECAGG_REPLIES["advertise_keys"],
    "train_masked": SECAGG_REPLIES["masked_input"],
    "consistency_next": _both(SECAGG_REPLIES["consistency"], SECAGG_REPLIES["advertise_keys"]),
    "unmask_next": _both(SECAGG_REPLIES["unmask"], SECAGG_REPLIES["share_keys"]),
})


class GatePolicy(BaseModel):
    """Site-owned egress policy. Everything not listed here or in the manifest's Θc part is refused.

    Names are exact ``record/key`` strings (no patterns): :func:`fcd_secure.audit.allowlist.federation_gate_policy`
    builds the federation's lists from the policy and estimator names it evaluates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_metrics: frozenset[str] = Field(
        default=frozenset(), description="aggregate scalar metrics allowed in MetricRecords, exact 'record/key' names"
    )
    allowed_metric_lists: Mapping[str, int] = Field(
        default_factory=dict,
        description="metrics that may be lists of numbers (aggregate histograms): exact 'record/key' -> longest length",
    )
    allowed_config_keys: Mapping[str, ConfigFieldRule] = Field(
        default_factory=dict,
        description="config fields allowed outside the secure-aggregation protocol: exact 'record/key' -> rule",
    )
    allow_theta_s_upload: bool = Field(
        default=False,
        description=(
            "research only: let Θs pass (the paper's 'w/o DSS' full-synchronisation ablation, Table III), except its "
            "site-bound entries (the behaviour head of inverse-propensity weighting), which stay refused by name, "
            "bytes and values. The uploads are recorded as they are, so `fcd audit verify` reports them as violations"
        ),
    )
    secure_only: bool = Field(
        default=False,
        description="the site requires secure aggregation: no tensor and no metric may leave outside the "
        "secure-aggregation protocol (no individual Θc, sample count or evaluation sum in clear; P20)",
    )
    secagg_prefix: str = SECAGG_PREFIX
    secagg_record: str = Field(default="secagg", description="the one record of every secure-aggregation reply")
    secagg_field: str = Field(default="msg", description="the one bytes field of a protocol stage's reply")
    secagg_schema_stage: str = Field(
        default="evaluate",
        description="the stage whose reply is the schema of the site's evaluation sums (names and lengths, no values)",
    )
    secagg_schema_record: str = Field(
        default="eval", description="the record whose allow-listed metrics are the only names a schema may declare"
    )
    secagg_schema_max_bytes: int = Field(default=1 << 16, ge=1, description="the longest evaluation schema")
    secagg_max_vector_words: int = Field(
        default=0, ge=0,
        description="the longest masked vector besides Θc (the evaluation sums' largest allow-listed layout): a "
        "masked input may be as long as the longer of the two",
    )
    secagg_replies: Mapping[str, SecaggReplyRule] = Field(default_factory=lambda: dict(SECAGG_REPLIES))
    secagg_max_sites: int = Field(default=64, ge=1, description="most sites of a secure round (bounds stage sizes)")
    max_config_str_len: int = Field(default=128, description="longest str value anywhere in a ConfigRecord")
    min_private_tensor_bytes: int = Field(
        default=16, description="Θs/propensity tensors, rows and columns shorter than this are matched by name only"
    )
    theta_s_history_rounds: int = Field(
        default=3, ge=0, description="also refuse the Θs of this many earlier rounds (what a site held before)"
    )

    @field_validator("allowed_metrics")
    @classmethod
    def _exact_metrics(cls, v: frozenset[str]) -> frozenset[str]:
        return frozenset(_exact_name(n) for n in v)

    @field_validator("allowed_metric_lists", "allowed_config_keys")
    @classmethod
    def _exact_keys(cls, v: Mapping) -> dict:
        return {_exact_name(k): x for k, x in dict(v).items()}


class Refusal(FcdError, Exception):
    """Raised by a check: the rule that refused a reply and where it fired (both stay on the site).

    A site's handler may raise it too (a request its policy refuses): the gate then records the refusal under its
    rule and answers with :data:`fcd_secure.audit.gate.POLICY_ERROR_CODE` instead of a generic error.
    """

    def __init__(self, rule: str, record: str, key: str | None = None) -> None:
        super().__init__(rule)
        self.rule, self.record, self.key = rule, record, key

    def to_record(self) -> RefusalRecord:
        """The refusal as the site ledger records it."""
        return RefusalRecord(rule=self.rule, record=self.record, key=self.key)


#: the parts of the request being answered that the site's handler declined (:func:`note_declined`): one list per
#: reply, opened by the egress gate around its handler (:func:`declining`); None where no gate runs
_DECLINED: ContextVar[list[Refusal] | None] = ContextVar("fcd_declined", default=None)


def note_declined(refusal: Refusal) -> None:
    """Record that the site's handler declined ``refusal``'s part of the request while it answers the rest: e.g. a
    scored round's values of a policy pair the site's cohort rules refuse (``queries.round_values``, docs/threats.md
    P70), where the round's other sums still leave. The egress gate running the handler writes it into the reply's
    upload line (``declined``), so the site's ledger shows the probe as it shows a refused reply; a no-op where no
    gate runs (a handler called directly, as a test or an offline evaluation does)."""
    bucket = _DECLINED.get()
    if bucket is not None:
        bucket.append(refusal)


@contextmanager
def declining() -> Iterator[list[Refusal]]:
    """The gate's side of :func:`note_declined`: the list the handler run inside the block appends to. The handler
    runs in the gate's thread (Flower calls a ClientApp's mods and handler in one call chain), so a context variable
    carries the list without passing it through every layer between them."""
    bucket: list[Refusal] = []
    token = _DECLINED.set(bucket)
    try:
        yield bucket
    finally:
        _DECLINED.reset(token)


def _check_name(name: str, theta_s_names: set[str], record: str, key: str | None) -> None:
    if name in theta_s_names or name.split("/")[-1] in theta_s_names:
        raise Refusal("theta_s_name", record, key)
    if PROPENSITY_NAME.search(name):
        raise Refusal("propensity", record, key)


def _check_bytes(data: bytes, private: list[PrivateArrays], record: str, key: str | None) -> None:
    kind = find_private(data, private)
    if kind is not None:
        raise Refusal(_BYTES_RULE[kind], record, key)


def _check_numbers(numbers: list, arrays: list[PrivateArrays], values: PrivateValues, record: str, key: str | None) -> None:
    """Numbers must not carry a Θs value one by one, nor a private array, row or column as a list."""
    if values.found_in(numbers):
        raise Refusal("theta_s_value", record, key)
    for view in number_views(numbers):
        _check_bytes(view, arrays, record, key)


def check_reply_binding(reply: Message, msg: Message) -> None:
    """Raise :class:`Refusal` unless ``reply`` answers ``msg`` exactly as ``Message(content, reply_to=msg)`` would.

    Raises:
        Refusal: rule ``not_a_reply``, keyed by the first metadata field that differs.
    """
    for reply_field, msg_field in REPLY_BINDING:
        if getattr(reply.metadata, reply_field) != getattr(msg.metadata, msg_field):
            raise Refusal("not_a_reply", "metadata", reply_field)


def check_content(
    content: RecordDict,
    message_type: str,
    manifest: Manifest,
    policy: GatePolicy,
    theta_s: Mapping[str, np.ndarray] | None,
    propensities: np.ndarray | None,
    theta_s_history: Sequence[Mapping[str, np.ndarray]] = (),
) -> None:
    """Return quietly if ``content`` may leave the site.

    Args:
        content: the reply's content.
        message_type: the type of the *instruction* being answered (never the reply's own label): it decides
            whether the reply is a secure-aggregation protocol message.
        manifest: the Θc/Θs layout in force.
        policy: the site's egress policy.
        theta_s: the site's current Θs tensors (fingerprinted for this check only).
        propensities: the site's logged propensities, or ``None``.
        theta_s_history: Θs of earlier rounds, most recent first (the first ``policy.theta_s_history_rounds`` count).

    Raises:
        Refusal: the first rule the content breaks (private content first, then names and shapes).
    """
    theta_c_specs, theta_s_specs = manifest.specs(THETA_C), manifest.specs(THETA_S)
    history = list(theta_s_history)[: policy.theta_s_history_rounds]
    s_names = set(theta_s_specs)
    if policy.allow_theta_s_upload:
        # the full-sync ablation may send Θs, never its site-bound part (the behaviour head models the propensities)
        s_names = {e.name for e in manifest.entries if e.site_bound}
        theta_s = {k: v for k, v in (theta_s or {}).items() if k in s_names}
        history = [{k: v for k, v in h.items() if k in s_names} for h in history]
    arrays = fingerprint_private(theta_s, propensities, policy.min_private_tensor_bytes, history)
    values = PrivateValues.of([theta_s or {}, *history])
    for rname, record in content.items():
        _check_private(str(rname), record, s_names, arrays, values)
    if message_type.startswith(policy.secagg_prefix):
        _check_protocol(content, message_type[len(policy.secagg_prefix):], manifest, policy)
        return
    layout = manifest.specs(FULL) if policy.allow_theta_s_upload else theta_c_specs
    for rname, record in content.items():
        rname = str(rname)
        if isinstance(record, ArrayRecord):
            for key, arr in record.items():
                if policy.secure_only:
                    raise Refusal("clear_in_secure_mode", rname, str(key))
                spec = layout.get(str(key))
                if spec is None:
                    raise Refusal("unlisted_tensor", rname, str(key))
                if tuple(int(x) for x in arr.shape) != spec[0] or dtype_name(arr.dtype) != spec[1]:
                    raise Refusal("layout_mismatch", rname, str(key))
        elif isinstance(record, MetricRecord):
            for key, value in record.items():
                if policy.secure_only:
                    raise Refusal("clear_in_secure_mode", rname, str(key))
                full = f"{rname}/{key}"
                if isinstance(value, list):
                    cap = policy.allowed_metric_lists.get(full)
                    if cap is None or len(value) > cap:
                        raise Refusal("metric_not_allowed", rname, str(key))
                elif full not in policy.allowed_metrics:
                    raise Refusal("metric_not_allowed", rname, str(key))
        elif isinstance(record, ConfigRecord):
            for key, value in record.items():
                if not _config_ok(policy.allowed_config_keys.get(f"{rname}/{key}"), value, policy):
                    raise Refusal("config_not_allowed", rname, str(key))


def _check_private(
    rname: str, record: object, s_names: set[str], arrays: list[PrivateArrays], values: PrivateValues
) -> None:
    """Names and private content of one record, whatever its type and wherever it is allowed."""
    _check_name(rname, s_names, rname, None)
    if isinstance(record, ArrayRecord):
        for key, arr in record.items():
            key = str(key)
            _check_name(key, s_names, rname, key)
            _check_bytes(np.ascontiguousarray(arr.numpy()).tobytes(), arrays, rname, key)
    elif isinstance(record, MetricRecord):
        scalars = []
        for key, value in record.items():
            key = str(key)
            _check_name(key, s_names, rname, key)
            numbers = list(value) if isinstance(value, list) else [value]
            _check_numbers(numbers, arrays, values, rname, key)
            if not isinstance(value, list):
                scalars.append(value)
        # a row or column spread over several scalar metrics, one value each, in insertion order
        _check_numbers(scalars, arrays, PrivateValues(), rname, None)
    elif isinstance(record, ConfigRecord):
        for key, value in record.items():
            key = str(key)
            _check_name(key, s_names, rname, key)
            items = list(value) if isinstance(value, list) else [value]
            for v in items:
                if isinstance(v, bytes):
                    _check_bytes(v, arrays, rname, key)
                elif isinstance(v, str):
                    _check_name(v, s_names, rname, key)
            _check_numbers([v for v in items if isinstance(v, (int, float))], arrays, values, rname, key)
    else:
        raise Refusal("unsupported_record", rname, None)


def _config_ok(rule: ConfigFieldRule | None, value: object, policy: GatePolicy) -> bool:
    """Whether an allow-listed config field holds one value of its declared type and size (lists never)."""
    if rule is None:
        return False
    if rule.type == "bool":
        return type(value) is bool
    if rule.type == "int":
        return type(value) is int and abs(value) <= rule.max_abs
    if rule.type == "str":
        return isinstance(value, str) and len(value) <= min(rule.max_len, policy.max_config_str_len)
    return isinstance(value, bytes) and len(value) <= rule.max_len


def _check_protocol(content: RecordDict, stage: str, manifest: Manifest, policy: GatePolicy) -> None:
    """A secure-aggregation reply is exactly its stage's one field: the evaluation schema, or ``msg`` bytes within the
    stage's bound. A stage with neither (unknown, or retired) is refused, whatever its reply holds."""
    names = [str(n) for n in content.keys()]
    extra = next((n for n in names if n != policy.secagg_record), None)
    if extra is not None or not names:
        raise Refusal("protocol_shape", extra or policy.secagg_record, None)
    record = content[policy.secagg_record]
    if not isinstance(record, ConfigRecord):
        raise Refusal("protocol_shape", policy.secagg_record, None)
    keys = [str(k) for k in record.keys()]
    if stage == policy.secagg_schema_stage:
        if keys != [policy.secagg_field]:
            raise Refusal("protocol_shape", policy.secagg_record, next((k for k in keys if k != policy.secagg_field), None))
        _check_schema(record[policy.secagg_field], policy)
        return
    rule = policy.secagg_replies.get(stage)
    if rule is None:  # no bound, no reply: an unknown stage is never let through
        raise Refusal("protocol_shape", policy.secagg_record, None)
    if keys != [policy.secagg_field]:
        raise Refusal("protocol_shape", policy.secagg_record, next((k for k in keys if k != policy.secagg_field), None))
    value = record[policy.secagg_field]
    words = max(manifest.size(THETA_C), policy.secagg_max_vector_words)
    if not isinstance(value, bytes) or len(value) > rule.max_bytes(words, policy.secagg_max_sites):
        raise Refusal("protocol_shape", policy.secagg_record, policy.secagg_field)


def _check_schema(value: object, policy: GatePolicy) -> None:
    """The evaluation schema a secure evaluation announces (``fcd_secure.federation.secure.eval_vector``: canonical JSON
    ``{"v": 1, "keys": [[name, length], ...]}``, length 0 for a scalar): every name an allow-listed evaluation
    metric, every list within its cap, nothing else."""
    if not isinstance(value, bytes) or len(value) > policy.secagg_schema_max_bytes:
        raise Refusal("protocol_shape", policy.secagg_record, policy.secagg_field)
    try:
        doc = json.loads(value.decode("utf-8"))
        entries = [(k, n) for k, n in doc["keys"]] if isinstance(doc, dict) and doc.get("v") == 1 and set(doc) == {"v", "keys"} else None
    except (ValueError, TypeError, KeyError):
        entries = None
    if entries is None:
        raise Refusal("protocol_shape", policy.secagg_record, policy.secagg_field)
    for name, length in entries:
        full = f"{policy.secagg_schema_record}/{name}"
        if not isinstance(name, str) or type(length) is not int or length < 0:
            raise Refusal("protocol_shape", policy.secagg_record, policy.secagg_field)
        if length == 0 and full not in policy.allowed_metrics:
            raise Refusal("metric_not_allowed", policy.secagg_record, name)
        if length > 0 and length > policy.allowed_metric_lists.get(full, 0):
            raise Refusal("metric_not_allowed", policy.secagg_record, name)

"""What may leave a site: the egress policy, the closed vocabulary of refusals, and the checks of one reply.

A reply may carry only (a positive manifest: everything not listed is refused):

* ArrayRecords whose arrays are Θc tensors by manifest name, with the manifest's shape and dtype (paper §III-B:
  "clients update (Θc, Θs_i) locally but only transmit Θc to the server");
* MetricRecords whose keys are allow-listed aggregate metrics, scalar values only (lists only where allow-listed);
* ConfigRecords only in secure-aggregation protocol messages (``train.secagg_<stage>``: opaque bytes, ints, short
  strings; never floats) or under keys the site allow-lists.

It refuses anything that names a Θs parameter or a propensity (any record, array, metric or config key, and string
values), any tensor or bytes field in which :mod:`~fcd_secure.audit.scanner` finds a current Θs tensor or the
site's propensities (whole or one row, at any offset: a renamed or re-keyed copy), and anything not on the list.

A reply must also answer the instruction it is for (:func:`check_reply_binding`); what may pass is decided by the
*instruction's* type, never by the reply's own label. Inside secure aggregation the masked vector is opaque: keeping
Θs out of it is the secure-aggregation module's job.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from pydantic import BaseModel, ConfigDict, Field

from fcd_secure.audit.entries import RefusalRecord
from fcd_secure.audit.scanner import PrivateArrays, find_private, fingerprint_private
from fcd_secure.manifest import THETA_C, THETA_S, Manifest, dtype_name

#: Message types of the secure-aggregation protocol start with this prefix.
SECAGG_PREFIX = "train.secagg_"

#: The closed vocabulary of refusals: a refused reply leaves as an error whose reason names only the rule.
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

#: The rule a private array found by bytes breaks, by its kind.
_BYTES_RULE = {"theta_s": "theta_s_bytes", "propensity": "propensity"}

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

#: Key names that denote propensities. Matched against every record, array, metric and config key.
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
            "research only: let Θs pass (the paper's 'w/o DSS' full-synchronisation ablation, Table III). The "
            "uploads are recorded as they are, so `fcd audit verify` reports them as violations"
        ),
    )
    secagg_prefix: str = SECAGG_PREFIX
    max_config_str_len: int = Field(default=128, description="longest str value in a protocol ConfigRecord")
    min_private_tensor_bytes: int = Field(
        default=16, description="Θs/propensity tensors shorter than this are matched by name only (too little to fingerprint)"
    )


class Refusal(Exception):
    """Raised by a check: the rule that refused a reply and where it fired (both stay on the site)."""

    def __init__(self, rule: str, record: str, key: str | None = None) -> None:
        super().__init__(rule)
        self.rule, self.record, self.key = rule, record, key

    def to_record(self) -> RefusalRecord:
        """The refusal as the site ledger records it."""
        return RefusalRecord(rule=self.rule, record=self.record, key=self.key)


def _check_name(name: str, theta_s_names: set[str], record: str, key: str | None) -> None:
    if name in theta_s_names or name.split("/")[-1] in theta_s_names:
        raise Refusal("theta_s_name", record, key)
    if PROPENSITY_NAME.search(name):
        raise Refusal("propensity", record, key)


def _check_bytes(data: bytes, private: list[PrivateArrays], record: str, key: str) -> None:
    kind = find_private(data, private)
    if kind is not None:
        raise Refusal(_BYTES_RULE[kind], record, key)


def _allowed(name: str, record: str, allow: Iterable[str]) -> bool:
    full = f"{record}/{name}"
    return any(fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(full, pat) for pat in allow)


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
) -> None:
    """Return quietly if ``content`` may leave the site.

    Args:
        content: the reply's content.
        message_type: the type of the *instruction* being answered (never the reply's own label): it decides
            whether secure-aggregation protocol fields are allowed.
        manifest: the Θc/Θs layout in force.
        policy: the site's egress policy.
        theta_s: the site's current Θs tensors (fingerprinted for this check only).
        propensities: the site's logged propensities, or ``None``.

    Raises:
        Refusal: the first rule the content breaks.
    """
    theta_c_specs, theta_s_specs = manifest.specs(THETA_C), manifest.specs(THETA_S)
    s_names = set() if policy.allow_theta_s_upload else set(theta_s_specs)
    private = fingerprint_private(theta_s, propensities, policy.min_private_tensor_bytes)
    if policy.allow_theta_s_upload:
        private = [p for p in private if p.kind != "theta_s"]
    layout = {**theta_c_specs, **theta_s_specs} if policy.allow_theta_s_upload else theta_c_specs
    secagg = message_type.startswith(policy.secagg_prefix)
    for rname, record in content.items():
        rname = str(rname)
        _check_name(rname, s_names, rname, None)
        if isinstance(record, ArrayRecord):
            for key, arr in record.items():
                key = str(key)
                _check_name(key, s_names, rname, key)
                _check_bytes(np.ascontiguousarray(arr.numpy()).tobytes(), private, rname, key)
                spec = layout.get(key)
                if spec is None:
                    raise Refusal("unlisted_tensor", rname, key)
                if tuple(int(x) for x in arr.shape) != spec[0] or dtype_name(arr.dtype) != spec[1]:
                    raise Refusal("layout_mismatch", rname, key)
        elif isinstance(record, MetricRecord):
            for key, value in record.items():
                key = str(key)
                _check_name(key, s_names, rname, key)
                allow = policy.allowed_metric_lists if isinstance(value, list) else policy.allowed_metrics
                if not _allowed(key, rname, allow):
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

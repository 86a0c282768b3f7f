"""The typed lines of the audit ledgers: what :mod:`~fcd_secure.audit.ledger` writes and :mod:`~fcd_secure.audit.verify`
reads.

One JSON object per line, in the canonical form of :func:`fcd_secure.audit.signing.canonical`. Every line carries the
chain fields of :class:`LedgerLine` (``seq``, ``prev_hash``, ``time``, ``hash``, ``sig``) and a ``kind``:

* ``open`` (:class:`OpenLine`): the writer's role, id and public key; always line 0;
* ``manifest`` (:class:`ManifestLine`): the Θc/Θs layout in force (paper §III-A, Θ = Θc ∪ {Θs_i});
* ``upload`` (:class:`UploadLine`, site): one reply that left the site's egress gate, or was refused there;
* ``receipt`` (:class:`ReceiptLine`, site): the server's signed :class:`Receipt` for an upload, stored verbatim;
* ``received`` (:class:`ReceivedLine`, server): one reply the server received;
* ``checkpoint`` (:class:`CheckpointLine`): the signed close of a round (chain size, head, RFC 6962 Merkle root);
* ``countersign`` (:class:`CountersignLine`, server): the server's signature over a site's checkpoint, which the
  site sent with its next reply (a cosigned tree head, as C2SP tlog-cosignature witnesses do for transparency logs);
* ``countersignature`` (:class:`CountersignatureLine`, site): that server line, stored verbatim by the site;
* ``install`` (:class:`InstallLine`, site): an installation step (``fcd site init``, ``join``, ``preflight``): what
  was set up or checked, by key fingerprints, digests and verdicts (never data).

A site ledger rewritten after the server countersigned its head (e.g. edited and re-signed with the site key that
sits beside it) no longer contains the checkpoint the server signed, which ``fcd audit verify`` reports.

Reading is strict (:func:`parse_line`): a line whose fields have other names or JSON types than these models is not
a ledger line, whatever its signature says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from fcd_secure.manifest import THETA_C, THETA_S, Manifest, ManifestEntry, layout_hash as hash_of_layout
from fcd_secure.anchor_records import PrivacyAnchor

if TYPE_CHECKING:
    from fcd_secure.audit.accounting import MessageFacts

#: Version of the line format, written in every ``open`` line.
SCHEMA = 1
#: Version of the receipt body.
RECEIPT_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- parts of lines ------------------------------------------------------------------------------------------------
class TensorSpec(_Record):
    """One tensor of a manifest line: name, shape and numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


class TensorRecord(_Record):
    """One array of a message: the record that holds it, its key, shape, dtype and data bytes."""

    record: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


class ConfigField(_Record):
    """One ConfigRecord value of a message, by size only (protocol fields are opaque)."""

    record: str
    key: str
    type: str
    len: int


class RefusalRecord(_Record):
    """Which gate rule refused a reply, and where in the content it fired (kept on the site)."""

    rule: str
    record: str
    key: str | None


class Contents(_Record):
    """What a message carries, by names and sizes only (never the values): the content fields of every
    :class:`MessageLine`, and all a :class:`Withheld` records."""

    payload_sha256: str | None
    payload_bytes: int
    records: tuple[str, ...]
    tensors: tuple[TensorRecord, ...]
    metrics: tuple[str, ...]
    metric_lists: dict[str, int]
    config_fields: tuple[ConfigField, ...]


class Withheld(Contents):
    """What a refused reply would have carried (:class:`Contents`; the reply that left instead is the line's own)."""


class Receipt(_Record):
    """The server's signature over what it received: the byte-for-byte other half of a site's upload line.

    ``sig`` is the server's Ed25519 signature over :func:`~fcd_secure.audit.signing.line_hash` of the other fields;
    ``server_key`` / ``server_public_key`` name the key that signed (neither proves anything until pinned).
    """

    v: int = RECEIPT_VERSION
    run_id: int
    node_id: int
    round: int | None
    message_type: str
    reply_to: str
    message_id: str
    payload_bytes: int
    message_bytes: int
    payload_sha256: str | None
    server_seq: int
    server_entry_hash: str
    server_key: str
    server_public_key: str
    time: str
    sig: str

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# -- lines ---------------------------------------------------------------------------------------------------------
class LedgerLine(_Record):
    """Fields every line has: its kind and its place in the signed hash chain.

    ``hash = sha256(canonical(line without hash and sig))``; ``sig = Ed25519(hash bytes)``; ``prev_hash`` is the
    previous line's ``hash`` (:data:`~fcd_secure.audit.signing.GENESIS` for line 0).
    """

    kind: str
    seq: int
    prev_hash: str
    time: str
    hash: str
    sig: str

    #: optional fields a line leaves out when they are ``None`` (the line is hashed exactly as written)
    omit_if_none: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the line, as written to disk."""
        out = self.model_dump(mode="json")
        for key in self.omit_if_none:
            if out.get(key) is None:
                out.pop(key, None)
        return out


class OpenLine(LedgerLine):
    """Line 0: who writes this ledger (``site`` or ``server``) and with which public key."""

    kind: Literal["open"] = "open"
    schema_: int = Field(SCHEMA, alias="schema")
    role: str
    writer_id: str
    public_key: str
    key_fingerprint: str

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class ManifestLine(LedgerLine):
    """The Θc/Θs layout in force from this line on; each part sorted by name, and the names of the site-bound Θs
    entries (``fcd_secure.manifest``) when there are any."""

    kind: Literal["manifest"] = "manifest"
    layout_hash: str
    theta_c: tuple[TensorSpec, ...]
    theta_s: tuple[TensorSpec, ...]
    site_bound: tuple[str, ...] | None = None

    omit_if_none: ClassVar[tuple[str, ...]] = ("site_bound",)

    @staticmethod
    def fields_of(manifest: Manifest) -> dict[str, Any]:
        """The line's content for ``manifest``: the one place a manifest becomes ledger JSON."""

        def part(side: str) -> list[dict[str, Any]]:
            return [{"name": n, "shape": list(shape), "dtype": d} for n, (shape, d) in sorted(manifest.specs(side).items())]

        bound = sorted(e.name for e in manifest.entries if e.site_bound)
        return {"layout_hash": manifest.layout_hash, "theta_c": part(THETA_C), "theta_s": part(THETA_S),
                "site_bound": bound or None}

    def to_manifest(self) -> Manifest:
        """The :class:`~fcd_secure.manifest.Manifest` this line records (its ``layout_hash`` as written; compare it
        with :func:`fcd_secure.manifest.layout_hash` of the entries to check the line)."""
        bound = set(self.site_bound or ())
        entries = [ManifestEntry(name=t.name, shape=t.shape, dtype=t.dtype, part=THETA_C) for t in self.theta_c]
        entries += [ManifestEntry(name=t.name, shape=t.shape, dtype=t.dtype, part=THETA_S, site_bound=t.name in bound)
                    for t in self.theta_s]
        return Manifest(entries=tuple(entries), layout_hash=self.layout_hash)

    def inconsistencies(self) -> list[str]:
        """Why the line's content does not hash to its ``layout_hash`` (empty when it does).

        A line is signed by its writer, so the chain alone cannot show a writer that records one layout's hash beside
        another layout's names (a Θs tensor moved into Θc, a site-bound flag dropped): the hash is recomputed from
        the names, shapes, dtypes and flags the line records, as :func:`fcd_secure.manifest.layout_hash` computes it.
        """
        out = []
        stray = sorted(set(self.site_bound or ()) - {t.name for t in self.theta_s})
        if stray:
            out.append(f"site-bound names {stray[:3]} are not Θs tensors of the line")
        names = [t.name for t in (*self.theta_c, *self.theta_s)]
        if len(set(names)) != len(names):
            out.append("a tensor name appears more than once")
        recomputed = hash_of_layout(self.to_manifest().entries)
        if recomputed != self.layout_hash:
            out.append(f"its entries hash to {recomputed[:12]}, not to the layout {self.layout_hash[:12]} it records")
        return out


class MessageLine(LedgerLine, Contents):
    """What both ends record about one message: where it belongs, its size, and its :class:`Contents`.

    ``payload_bytes`` / ``message_bytes`` / ``payload_sha256`` / ``message_id`` are
    :func:`fcd_secure.audit.accounting.describe_message`'s figures, so the site's and the server's lines reconcile.
    """

    run_id: int
    node_id: int
    round: int | None
    action: str
    reply_to: str
    message_id: str
    message_bytes: int
    is_error: bool

    @staticmethod
    def fields_of(facts: MessageFacts) -> dict[str, Any]:
        """The message fields of a line for ``facts``."""
        return {
            "run_id": facts.run_id,
            "node_id": facts.node_id,
            "round": facts.round,
            "action": facts.message_type,
            "reply_to": facts.reply_to,
            "message_id": facts.message_id,
            "payload_sha256": facts.payload_sha256,
            "payload_bytes": facts.payload_bytes,
            "message_bytes": facts.message_bytes,
            "records": facts.records,
            "tensors": [t.to_json() for t in facts.tensors],
            "metrics": facts.metrics,
            "metric_lists": facts.metric_lists,
            "config_fields": facts.config_fields,
            "is_error": facts.is_error,
        }


class UploadLine(MessageLine):
    """One reply at the site's egress gate.

    ``status``: ``sent`` (left as built), ``refused`` (content withheld, an error reply left instead; ``refusal``
    names the rule and ``withheld`` the content by names and sizes), ``error`` (the handler failed; a generic error
    left; ``handler_error_code`` is the code the handler chose, kept here only). ``declined``: the parts of the
    request the handler refused while it answered the rest (``audit.rules.note_declined``; e.g. a scored round's
    values of a policy pair the site's cohort rules refuse, P70), each by its rule; absent where none.
    """

    kind: Literal["upload"] = "upload"
    site_id: str
    #: any string on disk; verify reports a status other than sent/refused/error as a violation
    status: str
    layout_hash: str | None
    privacy_ledger_hash: str | None
    refusal: RefusalRecord | None = None
    withheld: Withheld | None = None
    handler_error_code: int | None = None
    declined: tuple[RefusalRecord, ...] | None = None
    #: the heads of the site's privacy ledgers when the reply left (:mod:`fcd_secure.privacy.anchor`), so verify can
    #: tell a ledger that disappeared or went backwards; ``None`` when the site keeps no privacy anchor
    privacy_anchors: tuple[PrivacyAnchor, ...] | None = None

    omit_if_none: ClassVar[tuple[str, ...]] = ("refusal", "withheld", "handler_error_code", "declined",
                                               "privacy_anchors")


#: how the server names a node it has not identified yet (its ``hello`` reply is recorded before it says which site
#: it is): ``node:<Flower node id>``; ``federation.messaging.Comm`` writes it, verification resolves it
UNNAMED_NODE_PREFIX = "node:"


class ReceivedLine(MessageLine):
    """One reply the server received (content, refusal or error alike)."""

    kind: Literal["received"] = "received"
    site_id: str | None


class ReceiptLine(LedgerLine):
    """A server receipt stored beside the upload it acknowledges (``for_seq``; ``None`` when the site has none)."""

    kind: Literal["receipt"] = "receipt"
    for_seq: int | None
    receipt: Receipt
    signature_checked_on_arrival: bool | None


class CheckpointLine(LedgerLine):
    """The signed close of ``round``: chain size and head before it, Merkle root, and the round's messages."""

    kind: Literal["checkpoint"] = "checkpoint"
    round: int
    size: int
    head: str
    merkle_root: str
    messages: int
    payload_bytes: int
    message_bytes: int


class CountersignLine(LedgerLine):
    """The server's countersignature of a site's checkpoint (the site's line, verbatim, as it arrived).

    ``writer_id`` and ``site_key_fingerprint`` name the site ledger (its ``open`` line); ``site_id`` is what the
    server calls the site; ``node_id``/``run_id`` the reply that carried the checkpoint.
    """

    kind: Literal["countersign"] = "countersign"
    site_id: str | None
    writer_id: str
    site_key_fingerprint: str
    node_id: int
    run_id: int
    checkpoint: CheckpointLine


class CountersignatureLine(LedgerLine):
    """A server :class:`CountersignLine` stored by the site it countersigns (verbatim, with the server's key)."""

    kind: Literal["countersignature"] = "countersignature"
    countersign: CountersignLine
    server_public_key: str
    signature_checked_on_arrival: bool | None


class InstallLine(LedgerLine):
    """An installation step on a site: ``init`` (keys made), ``join`` (bundle verified and pinned) or ``preflight``
    (its verdict and the checks that failed). ``facts`` are fingerprints, digests, names and verdicts only."""

    kind: Literal["install"] = "install"
    event: Literal["init", "join", "preflight"]
    facts: dict[str, str]


class ExclusionLine(LedgerLine):
    """A site the server leaves out of every later round of the run, from ``round`` on, and why (docs/threats.md P33:
    the site whose absence kept a secure sum within the bounds it broke). The server's word, signed: verify lists it
    as a note, never as a finding against the site."""

    kind: Literal["exclusion"] = "exclusion"
    round: int
    site_id: str
    reason: str


AnyLine = Annotated[
    Union[
        OpenLine, ManifestLine, UploadLine, ReceiptLine, ReceivedLine, CheckpointLine, CountersignLine,
        CountersignatureLine, InstallLine, ExclusionLine,
    ],
    Field(discriminator="kind"),
]
_LINE: TypeAdapter[LedgerLine] = TypeAdapter(AnyLine)


def parse_line(text: str | bytes) -> LedgerLine:
    """The typed line of one JSON text, strictly (no type coercion, no unknown fields).

    Raises:
        pydantic.ValidationError: the text is not JSON, or not a line of a known kind.
    """
    return _LINE.validate_json(text, strict=True)

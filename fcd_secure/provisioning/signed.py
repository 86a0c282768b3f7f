"""Signed documents: what a coordinator hands a site (bundle, roster) and a site hands the coordinator (request).

A document is one JSON object::

    {"format": "fcd-signed/1", "type": "<bundle|roster|enrolment>", "payload": {...},
     "signer": "<hex Ed25519 public key>", "sig": "<base64 Ed25519 signature>"}

The signature is over ``sha256(canonical({"format", "type", "payload", "signer"}))`` (the canonical JSON form of the
audit ledgers, :func:`fcd_secure.audit.signing.canonical`). A reader checks the signer against a fingerprint it
already holds (typed in by the operator, or pinned at join); a document whose bytes changed anywhere is either not
JSON, or its signature no longer verifies.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fcd_secure._io import atomic_write_text
from fcd_secure.audit.signing import canonical, private_key, public_key_bytes, sign_hash, signature_ok
from fcd_secure.errors import FcdError
from fcd_secure.fingerprints import fingerprint

FORMAT = "fcd-signed/1"

#: what a reader is told when the signer is not the key it holds: the expected fingerprint and how to check it out of
#: band, never the fingerprint the document carries (docs/threats.md P54)
MISMATCH_HINT = (
    "signed, but not by the expected key {expected}. Do not copy a fingerprint from this file: ask the signer's operator "
    "to read theirs to you out of band, over a channel you already trust (phone, in person; `fcd consortium init` prints the "
    "coordinator's, `fcd site init` a site's), compare it with {expected}, and ask for a new file if they differ"
)


class SignedDocumentError(FcdError, ValueError):
    """A signed document that cannot be trusted or read; the message names the file and the field."""


def _digest(doc: dict[str, Any]) -> str:
    body = {k: doc[k] for k in ("format", "type", "payload", "signer")}
    return hashlib.sha256(canonical(body)).hexdigest()


def sign_document(doc_type: str, payload: dict[str, Any], key: bytes) -> dict[str, Any]:
    """The signed document of ``payload`` (module docstring), signed with the raw Ed25519 private ``key``."""
    doc = {"format": FORMAT, "type": doc_type, "payload": payload, "signer": public_key_bytes(key).hex()}
    doc["sig"] = sign_hash(private_key(key), _digest(doc))
    return doc


def write_document(path: str | Path, doc: dict[str, Any]) -> Path:
    return atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n")


def read_document(path: str | Path, doc_type: str, expected_fingerprint: str | None) -> dict[str, Any]:
    """The checked payload of the signed document at ``path``.

    Args:
        path: the document file.
        doc_type: the ``type`` it must have.
        expected_fingerprint: the signer's key fingerprint (``SHA256:<hex>``) the reader holds; ``None`` accepts any
            signer whose signature verifies (a self-signed request: proof that the sender holds the key).

    Returns:
        ``{"payload": ..., "signer": <raw public key bytes>, "fingerprint": "SHA256:..."}``.

    Raises:
        SignedDocumentError: unreadable, not a signed document of this type, a signer other than the expected one,
            or a signature that does not verify (the document was changed after signing).
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise SignedDocumentError(f"{path}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SignedDocumentError(f"{path}: not a signed document (not JSON: changed or truncated)") from None
    if not isinstance(doc, dict) or set(doc) != {"format", "type", "payload", "signer", "sig"}:
        raise SignedDocumentError(f"{path}: not a signed document (fields: format, type, payload, signer, sig)")
    if doc["format"] != FORMAT:
        raise SignedDocumentError(f"{path}: field format is {doc['format']!r}, expected {FORMAT!r}")
    if doc["type"] != doc_type:
        raise SignedDocumentError(f"{path}: field type is {doc['type']!r}, expected {doc_type!r}")
    try:
        signer = bytes.fromhex(str(doc["signer"]))
    except ValueError:
        raise SignedDocumentError(f"{path}: field signer is not a hex public key") from None
    fp = fingerprint(signer)
    if expected_fingerprint is not None and fp != expected_fingerprint:
        # the signer's own fingerprint is not printed: an operator could paste it back as the expected one and so
        # skip the out-of-band check that is the only thing tying the key to its holder (docs/threats.md P54)
        raise SignedDocumentError(f"{path}: field signer: {MISMATCH_HINT.format(expected=expected_fingerprint)}")
    if not isinstance(doc["payload"], dict) or not signature_ok(signer, _digest(doc), str(doc["sig"])):
        raise SignedDocumentError(f"{path}: field sig: the signature does not verify (the document was changed after signing)")
    return {"payload": doc["payload"], "signer": signer, "fingerprint": fp}

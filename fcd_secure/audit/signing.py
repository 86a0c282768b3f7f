"""Identity keys, the canonical byte form, hashes, signatures and Merkle roots of the audit ledgers.

Every ledger line and every server receipt is hashed and signed in one byte form (:func:`canonical`): JSON with
sorted keys, no spaces, ASCII only. Identities are raw Ed25519 keys (RFC 8032); an auditor pins a writer by the
fingerprint of its public key (:func:`fcd_secure.fingerprints.fingerprint` of the raw key, ``SHA256:<hex>``, the
form NVFLARE uses for its root CA fingerprint), exported out of band at provisioning.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fcd_secure._io import load_or_create_secret
from fcd_secure.errors import FcdError

#: ``prev_hash`` of the first line of every chain.
GENESIS = "0" * 64


class AuditLedgerError(FcdError, RuntimeError):
    """A ledger cannot be written (wrong key for an existing ledger, unreadable file, ...)."""


# -- keys ----------------------------------------------------------------------------------------------------------
def private_key(raw: bytes | Ed25519PrivateKey) -> Ed25519PrivateKey:
    """The Ed25519 key of 32 raw private bytes (or the key itself).

    Raises:
        AuditLedgerError: ``raw`` is not 32 bytes.
    """
    if isinstance(raw, Ed25519PrivateKey):
        return raw
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 32:
        raise AuditLedgerError("an Ed25519 identity key must be 32 raw bytes")
    return Ed25519PrivateKey.from_private_bytes(bytes(raw))


def _new_raw_key() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def load_or_create_identity_key(path: str | Path) -> bytes:
    """Raw 32-byte Ed25519 private key at ``path``, created from the OS CSPRNG on first use (mode 0600).

    Args:
        path: the key file (e.g. ``<state_dir>/identity_ed25519.key``); its folder is created if needed.

    Returns:
        The 32 raw private-key bytes.

    Raises:
        fcd_secure._io.SecretFileError: the file exists with another size than 32 bytes, or cannot be read.
    """
    return load_or_create_secret(path, 32, make=_new_raw_key)


def public_key_bytes(key: bytes | Ed25519PrivateKey) -> bytes:
    """Raw 32-byte public key of a raw private key."""
    return private_key(key).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


# -- canonical form, hashing, signing ------------------------------------------------------------------------------
def canonical(obj: Any) -> bytes:
    """The one byte form that is hashed and signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def line_hash(obj: dict) -> str:
    """sha256 (hex) of ``canonical(obj)`` without its ``hash`` and ``sig`` fields: what a ledger line or a receipt
    commits to, and what its signature signs."""
    return hashlib.sha256(canonical({k: v for k, v in obj.items() if k not in ("hash", "sig")})).hexdigest()


def sign_hash(key: Ed25519PrivateKey, digest_hex: str) -> str:
    """Base64 Ed25519 signature over the 32 digest bytes."""
    return base64.b64encode(key.sign(bytes.fromhex(digest_hex))).decode("ascii")


def signature_ok(public_key: bytes, digest_hex: str, sig_b64: str) -> bool:
    """Whether ``sig_b64`` is ``public_key``'s signature over the digest (malformed input is ``False``)."""
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes(public_key))
        key.verify(base64.b64decode(sig_b64, validate=True), bytes.fromhex(digest_hex))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def merkle_root(hashes: list[str]) -> str:
    """RFC 6962 §2.1 Merkle tree hash over entry hashes (leaf = sha256(0x00||h), node = sha256(0x01||l||r))."""
    if not hashes:
        return hashlib.sha256(b"").hexdigest()
    level = [hashlib.sha256(b"\x00" + bytes.fromhex(h)).digest() for h in hashes]
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


def utc_now() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")

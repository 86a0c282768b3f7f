"""Key agreement, key derivation and signatures (Bonawitz et al., CCS 2017 §4, "KA" and "SIG").

- X25519 raw 32-byte keys for the two per-round key pairs (c: share encryption, s: pairwise masks).
- HKDF-SHA256 whose ``info`` binds the protocol version, session, round, the *ordered* pair and the purpose,
  so one derived key is used for exactly one stream (a zero CTR nonce is then safe) and nothing derived in
  round r is valid in round r+1 (P5).
- Ed25519 site identity keys: provisioned once per site, their public halves form the configured roster
  that authenticates each round's public keys (P2) and the consistency message (P1, P12).

Never log or ``repr`` anything returned here (P18): secrets are plain ``bytes`` on purpose, so there is no
object whose repr could leak them, and no function in this package logs a key.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .errors import AbortRound, ProtocolError

PROTOCOL_LABEL = b"fcd/secagg/v1"
KEY_BYTES = 32
SIG_BYTES = 64


def _raw_private(key: X25519PrivateKey | Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _raw_public(key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


#: the two private-key classes of ``cryptography`` used here; both have ``generate`` and ``from_private_bytes``
_KeyKind = type[X25519PrivateKey] | type[Ed25519PrivateKey]


def _fresh_pair(kind: _KeyKind) -> tuple[bytes, bytes]:
    """A fresh (private, public) raw pair of ``kind`` from the OS CSPRNG (``generate``)."""
    sk = kind.generate()
    return _raw_private(sk), _raw_public(sk.public_key())


def _public_of(kind: _KeyKind, private_raw: bytes) -> bytes:
    return _raw_public(kind.from_private_bytes(private_raw).public_key())


# -- X25519 ----------------------------------------------------------------------------------------------
def x25519_keypair() -> tuple[bytes, bytes]:
    """A fresh (private, public) raw X25519 pair from the OS CSPRNG."""
    return _fresh_pair(X25519PrivateKey)


def x25519_public(private_raw: bytes) -> bytes:
    return _public_of(X25519PrivateKey, private_raw)


def x25519_agree(private_raw: bytes, peer_public_raw: bytes) -> bytes:
    """Raw shared secret; raises :class:`ProtocolError` for a malformed or low-order peer key."""
    return x25519_agreement(private_raw)(peer_public_raw)


def x25519_agreement(private_raw: bytes) -> Callable[[bytes], bytes]:
    """``agree(peer_public_raw) -> shared secret`` with the private key parsed once (a party agrees with every peer
    in a stage; parsing the key each time cost as much as the exchange itself). Same checks as :func:`x25519_agree`."""
    sk = X25519PrivateKey.from_private_bytes(private_raw)

    def agree(peer_public_raw: bytes) -> bytes:
        if len(peer_public_raw) != KEY_BYTES:
            raise ProtocolError(f"X25519 public key must be {KEY_BYTES} bytes, got {len(peer_public_raw)}")
        try:
            return sk.exchange(X25519PublicKey.from_public_bytes(peer_public_raw))
        except ValueError as exc:  # all-zero shared secret: a small-order point was substituted
            raise AbortRound("peer X25519 public key is invalid (small-order point)") from exc

    return agree


def _u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def _field(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def kdf_info(session_id: bytes, round_id: int, src: str, dst: str, purpose: str) -> bytes:
    """HKDF info binding version, session, round, ordered pair and purpose (length-prefixed, unambiguous)."""
    return b"".join(
        [PROTOCOL_LABEL, _field(session_id), _u64(round_id), _field(src.encode()), _field(dst.encode()), _field(purpose.encode())]
    )


def hkdf(secret: bytes, info: bytes, length: int = 16) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def pair_key(secret: bytes, session_id: bytes, round_id: int, a: str, b: str, purpose: str, length: int = 16) -> bytes:
    """Key for the unordered pair {a, b}, identical on both sides (ids sorted before binding)."""
    lo, hi = (a, b) if a < b else (b, a)
    return hkdf(secret, kdf_info(session_id, round_id, lo, hi, purpose), length)


# -- Ed25519 site identity ---------------------------------------------------------------------------------
def ed25519_keypair() -> tuple[bytes, bytes]:
    """A fresh (private, public) raw Ed25519 pair from the OS CSPRNG."""
    return _fresh_pair(Ed25519PrivateKey)


def ed25519_public(private_raw: bytes) -> bytes:
    return _public_of(Ed25519PrivateKey, private_raw)


def sign(private_raw: bytes, message: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(private_raw).sign(message)


def verify(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    if len(public_raw) != KEY_BYTES or len(signature) != SIG_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


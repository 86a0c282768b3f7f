"""t-out-of-n Shamir sharing of 32-byte secrets (Bonawitz et al., CCS 2017 §3, "SS").

pycryptodome's :class:`Crypto.Protocol.SecretSharing.Shamir` works in GF(2^128) on 16-byte secrets, so a
32-byte secret (an X25519 private key or a self-mask seed, never anything longer: P4) is split as two
16-byte halves with the same share indices. A share is ``(index, 32 bytes)``; indices are 1-based
positions of the sites in the round's ordered roster.
"""

from __future__ import annotations

from Crypto.Protocol.SecretSharing import Shamir

from .errors import AbortRound, ProtocolError

SECRET_BYTES = 32
SHARE_BYTES = 32


def split(secret: bytes, threshold: int, n: int) -> list[tuple[int, bytes]]:
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"only {SECRET_BYTES}-byte secrets are shared")
    if not 1 <= threshold <= n:
        raise ValueError(f"need 1 <= threshold <= n, got t={threshold}, n={n}")
    lo = Shamir.split(threshold, n, secret[:16], ssss=False)
    hi = Shamir.split(threshold, n, secret[16:], ssss=False)
    return [(i, a + b) for (i, a), (j, b) in zip(lo, hi, strict=True) if i == j]


def combine(shares: list[tuple[int, bytes]], threshold: int) -> bytes:
    """Reconstruct from at least ``threshold`` shares with distinct indices (uses exactly ``threshold``)."""
    uniq: dict[int, bytes] = {}
    for idx, sh in shares:
        if len(sh) != SHARE_BYTES:
            raise ProtocolError(f"share must be {SHARE_BYTES} bytes, got {len(sh)}")
        if not 1 <= idx <= 65535:
            raise ProtocolError(f"share index {idx} out of range")
        uniq.setdefault(idx, sh)
    if len(uniq) < threshold:
        raise AbortRound(f"only {len(uniq)} shares, threshold is {threshold}")
    use = sorted(uniq.items())[:threshold]
    lo = Shamir.combine([(i, s[:16]) for i, s in use], ssss=False)
    hi = Shamir.combine([(i, s[16:]) for i, s in use], ssss=False)
    return lo + hi

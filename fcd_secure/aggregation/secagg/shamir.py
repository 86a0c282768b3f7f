"""t-out-of-n Shamir sharing of 32-byte secrets (Bonawitz et al., CCS 2017 §3, "SS").

The field, the polynomial and the byte encoding are exactly those of pycryptodome's
:class:`Crypto.Protocol.SecretSharing.Shamir` (GF(2^128) with x^128 + x^7 + x^2 + x + 1, an element's
integer value with the constant coefficient in the least significant bit, 16-byte big-endian shares,
share indices 1..n): shares made here combine with pycryptodome and vice versa (``tests/test_secagg_
primitives.py`` checks both ways). The arithmetic is our own because pycryptodome's multiplication builds
128-character strings per bit (about 25 µs per product, which made Shamir the largest cost of a round):
here a product is plain integer carry-less arithmetic, and the Lagrange coefficients at x = 0 are computed
once per set of responders and reused for every secret the server reconstructs from that set.

A 32-byte secret (an X25519 private key or a self-mask seed, never anything longer: P4) is split as two
16-byte halves with the same share indices. A share is ``(index, 32 bytes)``; indices are 1-based
positions of the sites in the round's ordered roster.

Not constant-time: the server reconstructs in the open anyway, and a site's split runs on the site.
"""

from __future__ import annotations

import functools
import os

from .errors import AbortRound, ProtocolError

SECRET_BYTES = 32
SHARE_BYTES = 32
_IRR = (1 << 128) | 0x87  # x^128 + x^7 + x^2 + x + 1
_MASK = (1 << 128) - 1


def gf_mul(a: int, b: int) -> int:
    """Product in GF(2^128) (pycryptodome's field)."""
    if a < b:
        a, b = b, a
    r = 0
    while b:  # loop over the smaller operand: a share index has at most a few bits
        if b & 1:
            r ^= a
        a <<= 1
        b >>= 1
    hi = r >> 128
    while hi:  # x^128 = x^7 + x^2 + x + 1
        r = (r & _MASK) ^ hi ^ (hi << 1) ^ (hi << 2) ^ (hi << 7)
        hi = r >> 128
    return r


def _clmul(a: int, b: int) -> int:
    r = 0
    while b:
        if b & 1:
            r ^= a
        a <<= 1
        b >>= 1
    return r


def gf_inv(a: int) -> int:
    """Inverse in GF(2^128) by the extended Euclidean algorithm over GF(2)[x]."""
    if a == 0:
        raise ZeroDivisionError("inverse of zero in GF(2^128)")
    r0, r1, s0, s1 = a, _IRR, 1, 0
    while r1:
        q, r, d1 = 0, r0, r1.bit_length()
        while r.bit_length() >= d1:
            shift = r.bit_length() - d1
            q ^= 1 << shift
            r ^= r1 << shift
        r0, r1 = r1, r
        s0, s1 = s1, s0 ^ _clmul(q, s1)
    return s0


def _split_half(half: bytes, threshold: int, n: int) -> list[int]:
    coeffs = [int.from_bytes(os.urandom(16), "big") for _ in range(threshold - 1)] + [int.from_bytes(half, "big")]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in coeffs:  # Horner, highest degree first (same polynomial layout as pycryptodome)
            y = gf_mul(x, y) ^ c
        shares.append(y)
    return shares


def split(secret: bytes, threshold: int, n: int) -> list[tuple[int, bytes]]:
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"only {SECRET_BYTES}-byte secrets are shared")
    if not 1 <= threshold <= n:
        raise ValueError(f"need 1 <= threshold <= n, got t={threshold}, n={n}")
    if n > 65535:
        raise ValueError("at most 65535 shares")
    lo = _split_half(secret[:16], threshold, n)
    hi = _split_half(secret[16:], threshold, n)
    return [(i + 1, a.to_bytes(16, "big") + b.to_bytes(16, "big")) for i, (a, b) in enumerate(zip(lo, hi))]


@functools.lru_cache(maxsize=64)
def _lagrange_at_zero(indices: tuple[int, ...]) -> tuple[int, ...]:
    """λ_j = Π_{m≠j} x_m / (x_j + x_m) (characteristic 2: minus is plus), once per responder set."""
    out = []
    for j, xj in enumerate(indices):
        num, den = 1, 1
        for m, xm in enumerate(indices):
            if m != j:
                num = gf_mul(num, xm)
                den = gf_mul(den, xj ^ xm)
        out.append(gf_mul(num, gf_inv(den)))
    return tuple(out)


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
    lam = _lagrange_at_zero(tuple(i for i, _ in use))
    lo = hi = 0
    for l_j, (_, sh) in zip(lam, use):
        lo ^= gf_mul(l_j, int.from_bytes(sh[:16], "big"))
        hi ^= gf_mul(l_j, int.from_bytes(sh[16:], "big"))
    return lo.to_bytes(16, "big") + hi.to_bytes(16, "big")

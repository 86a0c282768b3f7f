"""Pseudorandom masks over uint32 words (Bonawitz et al., CCS 2017 §4, "PRG"; docs/threats.md P4, P16).

A mask is the AES-128-CTR keystream of a 128-bit key taken straight from HKDF (:mod:`.keys`), read as
little-endian uint32 words: every word is uniform on Z_{2^32}, with no seed folding, no Mersenne Twister and
no ``numpy.random`` anywhere on this path. Each key is used for one stream only (the HKDF info binds
session, round, pair and purpose), so the all-zero nonce is safe.

The keystream is produced in chunks into one reused buffer and added into (or subtracted from) the
accumulator in place: allocation, not AES, dominates otherwise (``benchmarks/secagg.py`` prints the client seconds). All the masks of one party
are applied chunk by chunk (:meth:`MaskStream.apply_all`): each 256 KiB segment of the accumulator stays in cache
while every keystream is added to it, so the accumulator crosses memory once instead of once per mask.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

CHUNK_WORDS = 1 << 16  # 256 KiB of keystream per step: it and the accumulator segment stay in L2
_ZERO_NONCE = bytes(16)


class MaskStream:
    """Reusable scratch space for expanding masks. Not thread-safe; one per party."""

    def __init__(self, chunk_words: int = CHUNK_WORDS) -> None:
        self._zeros = bytes(4 * chunk_words)
        self._buf = bytearray(4 * chunk_words + 15)  # update_into needs len(data) + block_size - 1
        self._words = np.frombuffer(self._buf, dtype="<u4", count=chunk_words)
        self._chunk = chunk_words

    def apply(self, acc: np.ndarray, key: bytes, sign: int = 1) -> None:
        """acc += sign * PRG(key) (mod 2**32), in place. ``acc`` is a contiguous uint32 vector."""
        self.apply_all(acc, [(key, sign)])

    def apply_all(self, acc: np.ndarray, masks: Iterable[tuple[bytes, int]]) -> None:
        """acc += Σ_k sign_k * PRG(key_k) (mod 2**32), in place, one chunk of ``acc`` at a time.

        Args:
            acc: A 1-d contiguous uint32 vector.
            masks: (16-byte AES key, +1 or -1) per mask.

        Raises:
            TypeError: ``acc`` is not a 1-d contiguous uint32 array.
            ValueError: a key is not 16 bytes or a sign is not ±1.
        """
        if acc.dtype != np.uint32 or not acc.flags.c_contiguous or acc.ndim != 1:
            raise TypeError("mask accumulator must be a 1-d contiguous uint32 array")
        streams = []
        for key, sign in masks:
            if len(key) != 16:
                raise ValueError("mask key must be 16 bytes (AES-128)")
            if sign not in (1, -1):
                raise ValueError("sign must be +1 or -1")
            streams.append((Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE)).encryptor(), np.add if sign == 1 else np.subtract))
        zeros = memoryview(self._zeros)
        d = acc.shape[0]
        for start in range(0, d, self._chunk):
            m = min(self._chunk, d - start)
            seg, src, words = acc[start : start + m], zeros[: 4 * m], self._words[:m]
            for enc, op in streams:  # each CTR stream continues where the previous chunk left it
                enc.update_into(src, self._buf)
                op(seg, words, out=seg)

    def expand(self, key: bytes, length: int) -> np.ndarray:
        """The mask itself as a fresh uint32 array (tests and known-answer vectors)."""
        out = np.zeros(length, dtype=np.uint32)
        self.apply(out, key, 1)
        return out


def pair_sign(me: str, peer: str) -> int:
    """Δ of Bonawitz et al.: the smaller id adds the pairwise mask, the larger subtracts it."""
    return 1 if me < peer else -1

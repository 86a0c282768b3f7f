"""What one site's encoded input and the unmasked sum of n inputs may hold (docs/threats.md P6, P14, P26).

:func:`.encoding.encode` writes, per site, a weight ``n_i`` in [1, max_weight], a clipped count in [0, m + p]
(m metrics, p parameters) and values ``rint(x * f_i)`` with ``|x| <= clip`` and ``f_i = n_i / max_weight *
2**scale_bits``, so ``|word| <= rint(clip * f_i)``. Two checks follow:

* :func:`check_input` — a site refuses to mask a vector that ``encode`` could not have produced (a negative or
  oversized weight, a value outside the clip range), naming the word; this guards the site against a faulty
  trainer or carrier.
* :func:`check_aggregate` — the server checks the unmasked sum of ``n`` vectors against what n such inputs can add
  up to: ``n <= Σ n_i <= n * max_weight``, ``0 <= Σ clipped_i <= n (m + p)`` and, per value,
  ``|Σ_i rint(x_i f_i)| <= clip * 2**scale_bits * Σ n_i / max_weight + n/2`` (each decoded weighted mean within
  ±clip up to the rounding of n sites). A sum outside raises :class:`~.errors.BoundViolation`: the round is
  aborted and the global model stays unchanged.

The server sees only the sum (that is the point of the protocol), so it can neither name the site that broke a
bound nor catch an input that stays inside the sum's slack: a malicious site can move each decoded mean by at
most ``clip`` (and shift Σ n_i within the window above). Per-site range checks without revealing the input need
zero-knowledge range proofs on the masked vectors, which this protocol does not have.
"""

from __future__ import annotations

import math

import numpy as np

from .config import SecAggPolicy
from .encoding import HEADER_WORDS, VectorLayout
from .errors import BoundViolation, EncodingError


def _slot_name(layout: VectorLayout, pos: int) -> str:
    """Name of the value at position ``pos`` after the header: a metric or ``tensor[flat index]``."""
    if pos < len(layout.metrics):
        return f"metric {layout.metrics[pos]!r}"
    pos -= len(layout.metrics)
    for name, shape in layout.tensors:
        k = math.prod(shape)
        if pos < k:
            return f"tensor {name!r}[{pos}]"
        pos -= k
    return f"word {pos + HEADER_WORDS}"


def _outside(values: np.ndarray, limit: int) -> tuple[int, int] | None:
    """(value, position) of the first extreme of an int32 array outside [-limit, limit], else None. Two reductions
    (min, max) over the vector, and a search for the position only when a bound is broken."""
    lo, hi = int(values.min()), int(values.max())
    if lo < -limit:
        return lo, int(np.argmin(values))
    if hi > limit:
        return hi, int(np.argmax(values))
    return None


def check_input(layout: VectorLayout, policy: SecAggPolicy, vector: np.ndarray) -> None:
    """Refuse a site's plaintext vector that :func:`.encoding.encode` could not have produced.

    Args:
        layout: The round's vector layout.
        policy: The site's policy (clip, scale, max_weight).
        vector: The encoded uint32 vector of ``layout.length`` words.

    Raises:
        EncodingError: naming the word: the weight outside [1, max_weight] (negative included), the clipped count
            outside [0, m + p], or a value outside what a clipped input at that weight encodes to.
    """
    v = np.ascontiguousarray(vector, dtype=np.uint32).view(np.int32)
    n = int(v[0])
    if not 1 <= n <= policy.max_weight:
        raise EncodingError(
            f"weight word (sample count) is {n}, outside [1, max_weight={policy.max_weight}]: a negative, zero or "
            "oversized weight is refused (P26)"
        )
    slots = layout.length - HEADER_WORDS
    if not 0 <= int(v[1]) <= slots:
        raise EncodingError(f"clipped-count word is {int(v[1])}, outside [0, {slots}] (P14)")
    limit = int(np.rint(policy.clip * ((n / policy.max_weight) * policy.scale)))
    bad = _outside(v[HEADER_WORDS:], limit)
    if bad is not None:
        val, at = bad
        raise EncodingError(
            f"{_slot_name(layout, at)} encodes {val / (policy.scale * n / policy.max_weight):.6g}, outside the clip "
            f"range ±{policy.clip} (P26)"
        )


def check_aggregate(layout: VectorLayout, policy: SecAggPolicy, total: np.ndarray, n_sites: int) -> None:
    """Check the unmasked sum of ``n_sites`` vectors against what n clipped, site-pinned inputs can add up to.

    Args:
        layout: The round's vector layout.
        policy: The server's policy (the same clip, scale and max_weight every site pinned).
        total: The unmasked uint32 sum.
        n_sites: How many vectors are in the sum (|U3|).

    Raises:
        BoundViolation: with the first broken bound: total weight, clipped count, or a weighted mean outside ±clip.
    """
    v = np.ascontiguousarray(total, dtype=np.uint32).view(np.int32)
    n_total = int(v[0])
    if not n_sites <= n_total <= n_sites * policy.max_weight:
        raise BoundViolation(
            f"total sample count Σn_i = {n_total} is outside [{n_sites}, {n_sites * policy.max_weight}] for "
            f"{n_sites} sites with weights in [1, max_weight={policy.max_weight}]: a site sent a negative, zero or "
            "oversized weight (P26); round aborted, global model unchanged"
        )
    slots = layout.length - HEADER_WORDS
    if not 0 <= int(v[1]) <= n_sites * slots:
        raise BoundViolation(
            f"total clipped count {int(v[1])} is outside [0, {n_sites * slots}] for {n_sites} sites of {slots} values "
            "(P14, P26); round aborted, global model unchanged"
        )
    # Σ_i rint(clip f_i) <= clip * scale * Σ n_i / max_weight + n/2; one part in 2**40 covers float64 rounding
    limit = math.floor((policy.clip * policy.scale * n_total / policy.max_weight + n_sites / 2) * (1 + 2.0**-40))
    bad = _outside(v[HEADER_WORDS:], limit)
    if bad is not None:
        val, at = bad
        mean = val * policy.max_weight / (policy.scale * n_total)
        raise BoundViolation(
            f"decoded weighted mean of {_slot_name(layout, at)} is {mean:.6g}, outside the clip range ±{policy.clip} "
            f"that {n_sites} clipped inputs allow: a site sent a value outside the clip range (P26); round aborted, "
            "global model unchanged"
        )

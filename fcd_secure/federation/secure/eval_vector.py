"""Evaluation sums as a secure-aggregation vector: the server learns consortium totals, never one site's sums.

Federated evaluation sends additive sums (``queries.evaluation``): counts, squared errors, simulated values,
histograms and off-policy sums whose importance weights can be huge (IPW weights are products of 1/propensity over
the horizon; their squares enter the ESS). One fixed-point scale cannot hold both 1e-6 precision on a PEHE sum and
an IPW sum of 1e12, so each value is sent *exactly* as an integer in several digits:

* a value ``S`` (a float sum) becomes the integer ``V = round(S * 2**FRAC_BITS)``;
* ``V`` is written in ``DIGITS`` balanced digits of base ``2**b`` (each in ``[-2**(b-1), 2**(b-1))``), one word each;
* every key also has a *presence* word (1 if the site has the key) and a *finite* word (1 if all its values are
  finite and representable), so a key only some sites have, or a NaN at one site, is reported honestly.

Summing the vectors sums each digit position separately (exact integers, no carries lost: ``n`` digits of magnitude
``<= 2**(b-1)`` fit a word); the server recombines ``Σ V = Σ_j (Σ_i d_ij) 2**(b j)`` in Python integers. So the
decoded totals are the exact sums of the sites' rounded values: **the error of a total is at most
``n_sites * 2**-(FRAC_BITS+1)`` (about ``3e-8`` per site), whatever its magnitude, up to ``|S| < 2**70``** (larger or
non-finite values are reported as non-finite, never wrapped). Any new key of the evaluation dict rides along
without changes: the layout is the sorted union of key names and lengths the sites declare.

The words obey the secure-aggregation input rules (``fcd_secure.aggregation.secagg``): word 0 is the weight, here
the cohort's row count ``n_i`` (at least :data:`~fcd_secure.federation.site_policy.MIN_COHORT_FLOOR`), word 1 (the
clipped count) is 0, and every other word is within what a clipped input of weight ``n_i`` encodes to
(``clip * n_i / max_weight * 2**scale_bits``): the digit base is chosen from the site-pinned policy so that it is.
The masked vector is therefore indistinguishable in form from a Θc update, and the same protocol, checks and
replay guard carry it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fcd_secure.aggregation.secagg import SecAggPolicy, VectorLayout
from fcd_secure.aggregation.secagg.encoding import HEADER_WORDS
from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR
from fcd_secure.errors import FcdError

#: fractional bits of the fixed point: sums are exact to 2**-(FRAC_BITS+1) per site
FRAC_BITS = 24
#: magnitude bits above the binary point: |S| < 2**INT_BITS is representable
INT_BITS = 70
#: the one tensor name of the evaluation vector's layout
TENSOR = "evaluation"


class EvalVectorError(FcdError, ValueError):
    """An evaluation vector that cannot be built or read (a key outside the agreed layout, a too-small cohort)."""


def digit_bits(policy: SecAggPolicy) -> int:
    """The digit width ``b``: the largest with ``2**(b-1)`` within the input bound of a cohort of ``MIN_COHORT_FLOOR`` rows.

    Raises:
        EvalVectorError: the policy's clip/scale leave less than 2 bits per digit.
    """
    bound = math.floor(policy.clip * MIN_COHORT_FLOOR / policy.max_weight * policy.scale)
    if bound < 2:
        raise EvalVectorError(f"the secure-aggregation policy (clip={policy.clip}, scale_bits={policy.scale_bits}, "
                              f"max_weight={policy.max_weight}) leaves no room for evaluation digits")
    return int(math.floor(math.log2(bound))) + 1


def n_digits(policy: SecAggPolicy) -> int:
    return -(-(FRAC_BITS + INT_BITS + 1) // digit_bits(policy))


# -- the layout: keys and lengths ------------------------------------------------------------------------------------
def _is_list(v: object) -> bool:
    return isinstance(v, (list, tuple, np.ndarray))


def schema_of(sums: Mapping[str, object]) -> list[tuple[str, int]]:
    """``[(key, length)]`` of an evaluation dict, sorted by key: a list's length, or 0 for a scalar."""
    return sorted((str(k), len(v) if _is_list(v) else 0) for k, v in sums.items())


def schema_to_bytes(schema: Sequence[tuple[str, int]]) -> bytes:
    """The canonical encoding of a schema (what travels: names and lengths, never values)."""
    return json.dumps({"v": 1, "keys": [[k, int(n)] for k, n in schema]}, separators=(",", ":")).encode()


def schema_from_bytes(data: bytes) -> list[tuple[str, int]]:
    """Parse :func:`schema_to_bytes`.

    Raises:
        EvalVectorError: malformed.
    """
    try:
        doc = json.loads(data.decode())
        keys = [(str(k), int(n)) for k, n in doc["keys"]]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise EvalVectorError(f"malformed evaluation schema ({type(exc).__name__})") from None
    if doc.get("v") != 1 or any(n < 0 or n > 1_000_000 for _, n in keys) or len({k for k, _ in keys}) != len(keys):
        raise EvalVectorError("malformed evaluation schema")
    return sorted(keys)


def union_schema(schemas: Sequence[Sequence[tuple[str, int]]]) -> list[tuple[str, int]]:
    """The sorted union of the sites' schemas.

    Raises:
        EvalVectorError: two sites give one key different lengths.
    """
    merged: dict[str, int] = {}
    for schema in schemas:
        for k, n in schema:
            if merged.setdefault(k, n) != n:
                raise EvalVectorError(f"evaluation key {k!r} has lengths {merged[k]} and {n} at different sites")
    return sorted(merged.items())


@dataclass(frozen=True)
class EvalLayout:
    """Where each key's presence, finite flag and digits sit in the vector."""

    schema: tuple[tuple[str, int], ...]
    digits: int
    bits: int

    @classmethod
    def of(cls, schema: Sequence[tuple[str, int]], policy: SecAggPolicy) -> "EvalLayout":
        return cls(tuple(sorted((str(k), int(n)) for k, n in schema)), n_digits(policy), digit_bits(policy))

    def key_words(self, n: int) -> int:
        """Words of one key of length ``n`` (0: a scalar): presence, finite flag, digits of each value."""
        return 2 + max(n, 1) * self.digits

    @property
    def words(self) -> int:
        return sum(self.key_words(n) for _, n in self.schema)

    def vector_layout(self) -> VectorLayout:
        """The secure-aggregation layout: one tensor of :attr:`words` values (every party builds the same)."""
        return VectorLayout(tensors=((TENSOR, (self.words,)),))


def max_words(scalars: int, list_caps: Sequence[int], policy: SecAggPolicy) -> int:
    """The longest evaluation vector a site may send: every allow-listed scalar and every list at its cap present
    (the egress gate's bound on a masked evaluation input)."""
    digits = n_digits(policy)
    return scalars * (2 + digits) + sum(2 + max(int(n), 1) * digits for n in list_caps)


def _digits(value: int, bits: int, count: int) -> list[int] | None:
    base, half = 1 << bits, 1 << (bits - 1)
    out = []
    for _ in range(count):
        d = value % base
        if d >= half:
            d -= base
        out.append(d)
        value = (value - d) >> bits
    return out if value == 0 else None


def encode_sums(layout: EvalLayout, sums: Mapping[str, object], n_rows: int, policy: SecAggPolicy) -> np.ndarray:
    """One site's evaluation vector (uint32, ``layout.vector_layout().length`` words).

    Args:
        layout: the agreed layout (the union of the sites' schemas).
        sums: the site's evaluation dict (``queries.evaluation.site_metrics``).
        n_rows: the site's cohort size: the vector's weight word.
        policy: the site's secure-aggregation policy (bounds every word).

    Raises:
        EvalVectorError: a key of ``sums`` is not in the layout (or has another length), or ``n_rows`` is outside
            ``[MIN_COHORT_FLOOR, max_weight]``.
    """
    if not MIN_COHORT_FLOOR <= n_rows <= policy.max_weight:
        raise EvalVectorError(f"cohort of {n_rows} rows is outside [{MIN_COHORT_FLOOR}, {policy.max_weight}]")
    lengths = dict(layout.schema)
    for k, n in schema_of(sums):
        if lengths.get(k) != n:
            raise EvalVectorError(f"evaluation key {k!r} (length {n}) is not in the agreed layout")
    body = np.zeros(layout.words, dtype=np.int64)
    pos = 0
    scale = 1 << FRAC_BITS
    for key, n in layout.schema:
        if key in sums:
            raw = sums[key]
            vals = np.asarray(raw if _is_list(raw) else [raw], dtype=np.float64).reshape(-1)
            words: list[int] = []
            ok = bool(np.isfinite(vals).all())
            for v in vals:
                d = _digits(int(round(float(v) * scale)), layout.bits, layout.digits) if ok else None
                if d is None:
                    ok = False
                    break
                words.extend(d)
            body[pos] = 1
            if ok:
                body[pos + 1] = 1
                body[pos + 2 : pos + 2 + len(words)] = words
        pos += layout.key_words(n)
    out = np.empty(HEADER_WORDS + layout.words, dtype=np.uint32)
    out[0] = n_rows
    out[1] = 0
    out[HEADER_WORDS:] = body.astype(np.int32).view(np.uint32)
    return out


def decode_sums(layout: EvalLayout, word_sums: np.ndarray, n_sites: int) -> dict[str, object]:
    """Consortium totals from the per-word sums of the unmasked vector (header excluded).

    Returns:
        ``{key: total}`` (floats, or float arrays for list keys; NaN where some site's value was not finite), with
        ``_sites`` (``n_sites``) and ``_counts`` (``{key: sites that had it}``), as
        :func:`fcd_secure.queries.evaluation.merge_totals` reads them; keys no site had are left out.
    """
    w = [int(x) for x in np.asarray(word_sums, dtype=np.int64)]
    if len(w) != layout.words:
        raise EvalVectorError(f"evaluation sum has {len(w)} words, the layout needs {layout.words}")
    out: dict[str, object] = {}
    counts: dict[str, int] = {}
    pos = 0
    for key, n in layout.schema:
        present, finite = w[pos], w[pos + 1]
        if present > 0:
            vals = []
            for e in range(max(n, 1)):
                start = pos + 2 + e * layout.digits
                total = sum(w[start + j] << (layout.bits * j) for j in range(layout.digits))
                vals.append(total / (1 << FRAC_BITS) if finite == present else float("nan"))
            out[key] = np.asarray(vals, dtype=np.float64) if n > 0 else vals[0]
            counts[key] = present
        pos += layout.key_words(n)
    out["_sites"] = int(n_sites)
    out["_counts"] = counts
    return out


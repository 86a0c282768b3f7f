"""Finding a site's private arrays inside bytes that are about to leave: whole tensors and single rows, at any offset.

What must not leave a site (paper §III-B: only Θc is transmitted; logged propensities are the behaviour policy's
per-patient probabilities, needed only by the site's own off-policy estimates):

* a Θs tensor of the current round or of the last k rounds, or the propensity array (as stored, as float32 and as
  float64), whole: by sha256 of the payload and by containment at any byte offset;
* any single row or column of them (one slice of a Θs matrix, one trajectory's propensities, one step's
  propensities of every patient): a polynomial rolling hash over every window of the payload (Karp & Rabin 1987),
  prefiltered by a bitmap of the low hash bits and confirmed byte for byte, vectorised with numpy in O(payload) per
  row length (:class:`PrivateArrays`, :func:`find_private`);
* any single Θs parameter value carried as a number (a metric or config value): by its float32 and float64 bit
  patterns, and two float32 values packed into one 64-bit number (:class:`PrivateValues`).

Limits: a transformed copy (cast to another type than float32/float64, scaled, permuted) or pieces shorter than a
row are not recognised by bytes; constant tensors and rows (all elements equal) carry one number and are skipped
(they would collide with any constant Θc tensor, e.g. a zero bias); payloads above :data:`MAX_ROW_SCAN_BYTES` get
the whole-tensor check only. Single values are matched for Θs only, and only values with at least 12 significant
mantissa bits (a trained parameter has ~23): a logged propensity takes few distinct values (0.5, 1/k, …) that
legitimate aggregates can equal, so propensities are matched as rows and columns, never value by value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fcd_secure._io import Kept, arrays_sha256

PrivateKind = Literal["theta_s", "propensity"]

#: Odd multiplier of the rolling hash (any odd constant is invertible modulo 2**64).
_R = np.uint64(0x9E3779B97F4A7C15)
_R_INV = np.uint64(pow(int(_R), -1, 2**64))
_BITMAP_SIZE = 1 << 20
_BITMAP_MASK = np.uint64(_BITMAP_SIZE - 1)
#: Payloads above this size are checked for whole private tensors only (the row scan holds ~24 B per payload byte).
MAX_ROW_SCAN_BYTES = 16 * 1024 * 1024


def _powers(base: np.uint64, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    out[0] = 1
    if n > 1:
        out[1:] = base
        np.cumprod(out[1:], out=out[1:])  # wraps modulo 2**64, which is the ring the hash lives in
    return out


class Windows:
    """Rolling hashes of every window of one payload: prefix sums once, any window length in O(n)."""

    def __init__(self, data: bytes) -> None:
        buf = np.frombuffer(data, dtype=np.uint8)
        self.n = buf.size
        with np.errstate(over="ignore"):
            self.prefix = np.concatenate(([np.uint64(0)], np.cumsum(buf.astype(np.uint64) * _powers(_R, self.n), dtype=np.uint64)))
        self.inv = _powers(_R_INV, self.n)

    def hashes(self, length: int) -> np.ndarray:
        """Position-normalised hash of the window starting at each offset (equal windows hash equal)."""
        m = self.n - length + 1
        with np.errstate(over="ignore"):
            return (self.prefix[length:] - self.prefix[:m]) * self.inv[:m]


def _row_hashes(rows: np.ndarray) -> np.ndarray:
    """The same hash for each row of a ``[k, length]`` uint8 matrix, vectorised."""
    with np.errstate(over="ignore"):
        return (rows.astype(np.uint64) * _powers(_R, rows.shape[1])).sum(axis=1, dtype=np.uint64)


@dataclass
class PrivateArrays:
    """Fingerprints of one kind of private array: whole arrays (exact hash and containment) and their rows."""

    kind: PrivateKind
    blobs: list[bytes] = field(default_factory=list)
    hashes: set[str] = field(default_factory=set)
    #: row length -> (sorted row hashes, row bytes matrix in the same order, bitmap prefilter of the hashes)
    rows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def add(self, arr: np.ndarray, min_len: int) -> None:
        """Fingerprint ``arr`` and its rows, unless it is too small or constant to fingerprint."""
        a = np.ascontiguousarray(arr)
        if a.size < 2 or a.nbytes < min_len or np.all(a.reshape(-1) == a.reshape(-1)[0]):
            return
        blob = a.tobytes()
        self.blobs.append(blob)
        self.hashes.add(hashlib.sha256(blob).hexdigest())
        self._add_rows(a, min_len)

    def _add_rows(self, arr: np.ndarray, min_len: int) -> None:
        if arr.ndim < 2:
            return
        flat = arr.reshape(arr.shape[0], -1)
        if flat.shape[1] < 2 or flat[0].nbytes < min_len:
            return
        keep = ~np.all(flat == flat[:, :1], axis=1)  # constant rows carry one number: skipped
        if not keep.any():
            return
        raw = np.ascontiguousarray(flat[keep]).view(np.uint8).reshape(int(keep.sum()), -1)
        hashes = _row_hashes(raw)
        length = raw.shape[1]
        if length in self.rows:
            old_h, old_raw, _ = self.rows[length]
            hashes, raw = np.concatenate([old_h, hashes]), np.concatenate([old_raw, raw])
        order = np.argsort(hashes, kind="stable")
        bitmap = np.zeros(_BITMAP_SIZE, dtype=bool)
        bitmap[(hashes & _BITMAP_MASK).astype(np.intp)] = True
        self.rows[length] = (hashes[order], raw[order], bitmap)

    def found_in(self, data: bytes, digest: str, windows: Windows | None) -> bool:
        """Whether ``data`` (with sha256 ``digest``) is, contains, or contains a row of one of these arrays."""
        if digest in self.hashes:
            return True
        if any(len(blob) <= len(data) and blob in data for blob in self.blobs):
            return True
        return self._row_in(data, windows)

    def _row_in(self, data: bytes, windows: Windows | None) -> bool:
        if not self.rows or windows is None:
            return False
        for length, (keys, raw, bitmap) in self.rows.items():
            if length > windows.n:
                continue
            hashes = windows.hashes(length)
            # one gather against the bitmap rules out almost every window; the rest are looked up
            for pos in np.flatnonzero(bitmap[(hashes & _BITMAP_MASK).astype(np.intp)]):
                j = int(np.searchsorted(keys, hashes[pos]))
                while j < keys.size and keys[j] == hashes[pos]:  # confirm byte for byte (hashes can collide)
                    if data[pos : pos + length] == raw[j].tobytes():
                        return True
                    j += 1
        return False


def _with_columns(group: PrivateArrays, arr: np.ndarray, min_len: int) -> None:
    """Fingerprint ``arr`` with its rows and, for a matrix, its columns (the rows of its transpose)."""
    group.add(arr, min_len)
    if arr.ndim == 2:
        group.add(np.ascontiguousarray(arr.T), min_len)


def fingerprint_private(
    theta_s: Mapping[str, np.ndarray] | None,
    propensities: np.ndarray | None,
    min_len: int,
    theta_s_history: Iterable[Mapping[str, np.ndarray]] = (),
) -> list[PrivateArrays]:
    """Fingerprints of the Θs tensors (current and earlier rounds) and of the propensity array (as stored, float32
    and float64), each with its rows and, for matrices, its columns.

    Each group is built once per content (:func:`_fingerprints`): the gate checks every message of a round against
    the same Θs versions and the same propensities, and a group is a pure function of its arrays' bytes.

    Args:
        theta_s: the site's current Θs tensors by name.
        propensities: the site's logged propensities ``[n, L]``, or ``None``.
        min_len: arrays (and rows) shorter than this many bytes are too little to fingerprint.
        theta_s_history: Θs of earlier rounds (most recent first): a reply must not carry last round's Θs either.
    """
    theta = [np.asarray(arr) for version in [theta_s or {}, *theta_s_history] for arr in version.values()]
    props = [] if propensities is None else [np.ascontiguousarray(np.asarray(propensities))]
    return [_fingerprints("theta_s", theta, min_len), _fingerprints("propensity", props, min_len)]


#: built fingerprint groups by the digest of their arrays' contents (:func:`_fingerprints`); a simulated run's sites
#: each hold their Θs versions and propensities in one process
_GROUPS: Kept[str, PrivateArrays] = Kept(16)


def _fingerprints(kind: PrivateKind, arrays: list[np.ndarray], min_len: int) -> PrivateArrays:
    """The :class:`PrivateArrays` of ``arrays`` (a propensity array also as float32 and float64), each with its
    columns; kept by a SHA-256 of ``kind``, ``min_len`` and every array's dtype, shape and bytes, so an entry is only
    ever served for the same numbers (the digest reads each byte once; the row hashes and bitmaps it saves cost tens
    of times more). The group is read-only once built (:meth:`PrivateArrays.found_in`)."""

    def build() -> PrivateArrays:
        group = PrivateArrays(kind)
        for arr in arrays:
            if kind == "propensity":
                variants = {arr.dtype: arr, np.dtype(np.float32): arr.astype(np.float32),
                            np.dtype(np.float64): arr.astype(np.float64)}.values()
            else:
                variants = (arr,)
            for cand in variants:
                _with_columns(group, cand, min_len)
        return group

    return _GROUPS.get(arrays_sha256(f"{kind}:{int(min_len)}", arrays), build)


#: A float32 bit pattern is informative when it is a normal number with a set bit among the low 12 of its mantissa
#: (at least 12 significant fraction bits): one in 4096 trained values falls short and is not matched.
_LOW_MANTISSA = np.uint32(0xFFF)
_U32 = np.uint64(0xFFFFFFFF)


def _informative32(bits: np.ndarray) -> np.ndarray:
    exp = (bits >> np.uint32(23)) & np.uint32(0xFF)
    return (exp != 0) & (exp != 0xFF) & ((bits & _LOW_MANTISSA) != 0)


@dataclass
class PrivateValues:
    """Single Θs parameter values, as the bit patterns a number that carries one would have.

    ``f32``: float32 bit patterns of every informative value; ``f64``: float64 bit patterns of values that are not
    float32-exact (float64 parameters). Both sorted and unique, for :func:`numpy.isin`.
    """

    f32: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    f64: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))

    @classmethod
    def of(cls, versions: Iterable[Mapping[str, np.ndarray]]) -> "PrivateValues":
        """The values of every floating-point tensor of ``versions`` (Θs now and of earlier rounds)."""
        f32, f64 = [], []
        for version in versions:
            for arr in version.values():
                a = np.asarray(arr)
                if not np.issubdtype(a.dtype, np.floating):
                    continue
                v = a.astype(np.float64).ravel()
                v = v[np.isfinite(v)]
                b32 = v.astype(np.float32).view(np.uint32)
                f32.append(b32[_informative32(b32)])
                inexact = v.astype(np.float32).astype(np.float64) != v
                f64.append(v[inexact].view(np.uint64))
        return cls(
            np.unique(np.concatenate(f32)) if f32 else np.zeros(0, np.uint32),
            np.unique(np.concatenate(f64)) if f64 else np.zeros(0, np.uint64),
        )

    def found_in(self, numbers: Iterable[object]) -> bool:
        """Whether any number carries a Θs value: as a float64, as an exact float32, as two float32 halves of one
        64-bit pattern, or as an integer holding a float32 or float64 bit pattern."""
        floats = [float(x) for x in numbers if isinstance(x, float)]
        ints = [int(x) & 0xFFFF_FFFF_FFFF_FFFF for x in numbers if isinstance(x, int) and not isinstance(x, bool)]
        if not self.f32.size and not self.f64.size:
            return False
        words: list[np.ndarray] = []
        if floats:
            x = np.asarray(floats, dtype=np.float64)
            words.append(x.view(np.uint64))
            with np.errstate(over="ignore", invalid="ignore"):
                as32 = x.astype(np.float32)
            exact = np.isfinite(x) & (as32.astype(np.float64) == x)
            if np.isin(as32[exact].view(np.uint32), self.f32).any():
                return True
        if ints:
            w = np.asarray(ints, dtype=np.uint64)
            words.append(w)
            small = w <= _U32
            if np.isin(w[small].astype(np.uint32), self.f32).any():
                return True
        if not words:
            return False
        w = np.concatenate(words)
        if np.isin(w, self.f64).any():
            return True
        hi, lo = (w >> np.uint64(32)).astype(np.uint32), (w & _U32).astype(np.uint32)
        return bool((np.isin(hi, self.f32) & np.isin(lo, self.f32)).any())


def number_views(numbers: list[object]) -> list[bytes]:
    """The byte forms a list of numbers could carry a private array in: float64, float32, and for integers int64
    and (when they fit) uint32 (float32 bit patterns sent as integers)."""
    nums = [x for x in numbers if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if len(nums) < 2:
        return []
    with np.errstate(over="ignore", invalid="ignore"):
        as64 = np.asarray([float(x) for x in nums], dtype=np.float64)
        out = [as64.tobytes(), as64.astype(np.float32).tobytes()]
    ints = [int(x) for x in nums if isinstance(x, int)]
    if len(ints) == len(nums):
        if all(-(2**63) <= i < 2**63 for i in ints):
            out.append(np.asarray(ints, dtype=np.int64).tobytes())
        if all(0 <= i < 2**32 for i in ints):
            out.append(np.asarray(ints, dtype=np.uint32).tobytes())
    return out


def find_private(data: bytes, private: Iterable[PrivateArrays]) -> PrivateKind | None:
    """The kind of the first private array found in ``data`` (whole, contained, or one row), else ``None``."""
    private = list(private)
    if not data:
        return None
    digest = hashlib.sha256(data).hexdigest()
    windows = Windows(data) if len(data) <= MAX_ROW_SCAN_BYTES and any(g.rows for g in private) else None
    for group in private:
        if group.found_in(data, digest, windows):
            return group.kind
    return None

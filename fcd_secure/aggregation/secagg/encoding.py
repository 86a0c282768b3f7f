"""The vector a site masks: layout from the Θc manifest, fixed point with clipping (docs/threats.md P6, P7, P14, P15).

Word layout of one site's vector (all uint32, arithmetic mod 2**32, two's complement for negatives)::

    [0]            n_i                 the sample count: FedAvg's weight rides *inside* the masked vector (P7)
    [1]            clipped_i           how many of this site's values were clipped; only the sum is revealed (P14)
    [2 : 2+m]      w_i * metric_k      optional site metrics, weighted like Θc, revealed only as a weighted mean
    [2+m : ]       w_i * clip(Θc)      Θc flattened in manifest order, w_i = n_i / max_weight

each real value ``v`` becomes ``round(v * 2**scale_bits)``. The unmasked sum therefore gives
Σ n_i, Σ clipped_i and Σ w_i·x_i, and the server divides: the sample-size-weighted FedAvg of the paper's
DSS (Fed-CausalDiff §III-B: "the server aggregates Θc (FedAvg)"; Table II: sample-size weighted) without any per-site number
in clear. Only tensors whose manifest part is Θc (:data:`fcd_secure.manifest.THETA_C`) and that are on the allowed
list may enter (P15).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure.manifest import THETA_C, THETA_S, Manifest

from .config import SecAggPolicy
from .errors import EncodingError

HEADER_WORDS = 2


@dataclass(frozen=True)
class VectorLayout:
    """Which tensors (names, shapes) and metrics enter the vector, in what order. Built from the manifest."""

    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    metrics: tuple[str, ...] = ()
    private_names: frozenset[str] = frozenset()

    @classmethod
    def from_manifest(
        cls, manifest: Manifest, allowed_names: Iterable[str] | None = None, metrics: Iterable[str] = ()
    ) -> "VectorLayout":
        """The layout of ``manifest``'s Θc entries, in manifest order.

        Args:
            manifest: the Θc/Θs contract; its Θs names are remembered only so that offering one is refused by
                name (P15).
            allowed_names: restricts the shared tensors further; naming a Θs tensor here is refused too.
            metrics: names of site metrics carried (weighted) before Θc in the vector.

        Raises:
            EncodingError: an allowed name is Θs or not in the manifest, or no Θc tensor is left.
        """
        shared = [(e.name, tuple(e.shape)) for e in manifest.select(THETA_C)]
        private = set(manifest.names(THETA_S))
        if allowed_names is not None:
            allowed = list(allowed_names)
            bad = [n for n in allowed if n in private]
            if bad:
                raise EncodingError(f"tensor {bad[0]!r} is site-private ({THETA_S}) and may never be aggregated (P15)")
            known = {n for n, _ in shared}
            unknown = [n for n in allowed if n not in known]
            if unknown:
                raise EncodingError(f"allowed tensor {unknown[0]!r} is not a {THETA_C} entry of the manifest")
            keep = set(allowed)
            shared = [(n, s) for n, s in shared if n in keep]
        if not shared:
            raise EncodingError(f"the layout has no {THETA_C} tensor")
        return cls(tuple(shared), tuple(metrics), frozenset(private))

    @property
    def n_params(self) -> int:
        return int(sum(math.prod(s) for _, s in self.tensors))

    @property
    def offset(self) -> int:
        return HEADER_WORDS + len(self.metrics)

    @property
    def length(self) -> int:
        return self.offset + self.n_params

    @property
    def digest(self) -> bytes:
        """SHA-256 of the canonical layout: every party must agree on it before masking."""
        desc = {"tensors": [[n, list(s)] for n, s in self.tensors], "metrics": list(self.metrics), "v": 1}
        return hashlib.sha256(json.dumps(desc, separators=(",", ":")).encode()).digest()

    def flatten(self, arrays: Mapping[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Θc in manifest order as float64 (written into ``out`` if given); refuses private, unknown, missing,
        misshapen or non-finite input, naming the tensor."""
        names = {n for n, _ in self.tensors}
        for name in arrays:
            if name in self.private_names:
                raise EncodingError(f"tensor {name!r} is site-private ({THETA_S}) and may never be aggregated (P15)")
            if name not in names:
                raise EncodingError(f"tensor {name!r} is not a shared ({THETA_C}) tensor of this layout (P15)")
        flat = np.empty(self.n_params, dtype=np.float64) if out is None else out
        pos = 0
        for name, shape in self.tensors:
            if name not in arrays:
                raise EncodingError(f"tensor {name!r} is missing from the update")
            a = np.asarray(arrays[name])
            if tuple(a.shape) != shape:
                raise EncodingError(f"tensor {name!r} has shape {tuple(a.shape)}, the manifest says {shape}")
            if not np.issubdtype(a.dtype, np.floating):
                raise EncodingError(f"tensor {name!r} has dtype {a.dtype}, expected a float type")
            k = a.size
            flat[pos : pos + k] = a.reshape(-1)
            pos += k
        if not np.isfinite(flat).all():
            bad = int(np.flatnonzero(~np.isfinite(flat))[0])
            for name, shape in self.tensors:
                if bad < math.prod(shape):
                    raise EncodingError(f"tensor {name!r} holds NaN or inf")
                bad -= math.prod(shape)
        return flat

    def unflatten(self, flat: np.ndarray, dtype: Any = np.float64) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        pos = 0
        for name, shape in self.tensors:
            k = math.prod(shape)
            out[name] = flat[pos : pos + k].reshape(shape).astype(dtype, copy=False)
            pos += k
        return out


def theta_hash(layout: VectorLayout, arrays: Mapping[str, np.ndarray]) -> bytes:
    """SHA-256 of the global Θc a site received (layout order, float32 bytes); signed in the consistency
    round so that different models sent to different sites abort the round (P12)."""
    h = hashlib.sha256(layout.digest)
    for name, shape in layout.tensors:
        a = np.ascontiguousarray(np.asarray(arrays[name], dtype=np.float32).reshape(shape))
        h.update(name.encode() + b"\0" + a.tobytes())
    return h.digest()


def _to_signed(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words, dtype=np.uint32).view(np.int32)  # the modular sum as two's complement


def encode(
    layout: VectorLayout,
    policy: SecAggPolicy,
    arrays: Mapping[str, np.ndarray],
    n_samples: int,
    metrics: Mapping[str, float] | None = None,
) -> np.ndarray:
    """One site's plaintext vector (uint32, ``layout.length`` words). See the module docstring."""
    if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer):
        raise EncodingError(f"n_samples must be an integer, got {type(n_samples).__name__}")
    n = int(n_samples)
    if not 1 <= n <= policy.max_weight:
        raise EncodingError(
            f"n_samples={n} is outside [1, max_weight={policy.max_weight}]; raise [secagg] max_weight in the site config"
        )
    metrics = dict(metrics or {})
    if set(metrics) != set(layout.metrics):
        raise EncodingError(f"metrics {sorted(metrics)} do not match the layout's {list(layout.metrics)}")
    mvals = np.array([float(metrics[k]) for k in layout.metrics], dtype=np.float64)
    if not np.isfinite(mvals).all():
        raise EncodingError("a metric is NaN or inf")
    # one float64 work buffer, transformed in place (the vector can be 1e7 values; each pass costs)
    values = np.empty(layout.length - HEADER_WORDS, dtype=np.float64)
    values[: len(mvals)] = mvals
    layout.flatten(arrays, out=values[len(mvals) :])
    clipped = int(np.count_nonzero(values > policy.clip)) + int(np.count_nonzero(values < -policy.clip))
    np.clip(values, -policy.clip, policy.clip, out=values)
    np.multiply(values, (n / policy.max_weight) * policy.scale, out=values)
    np.rint(values, out=values)
    out = np.empty(layout.length, dtype=np.uint32)
    out[0] = n
    out[1] = clipped
    # |value| <= clip * 2**scale_bits < 2**31 (policy validation), so int32 holds it; its bits are the
    # two's-complement word mod 2**32
    out[HEADER_WORDS:] = values.astype(np.int32).view(np.uint32)
    return out


@dataclass(frozen=True)
class Aggregate:
    """What the server learns: the weighted means and totals, nothing per site."""

    theta_c: dict[str, np.ndarray]  # float64
    n_total: int
    n_sites: int
    clipped_fraction: float
    metrics: dict[str, float]
    #: max |decoded − exact weighted mean of the clipped inputs|, per coordinate
    quantisation_bound: float


def decode(layout: VectorLayout, policy: SecAggPolicy, total: np.ndarray, n_sites: int) -> Aggregate:
    """Turn the unmasked modular sum of ``n_sites`` vectors into the weighted FedAvg."""
    if total.shape != (layout.length,):
        raise EncodingError(f"sum has {total.shape} words, layout needs {layout.length}")
    v = _to_signed(total)
    n_total = int(v[0])
    if n_total <= 0:
        raise EncodingError(f"decoded total weight {n_total} is not positive (wrong masks or overflow)")
    factor = policy.max_weight / (policy.scale * n_total)
    vals = v[HEADER_WORDS:] * factor  # int32 words times a float64: one pass to float64
    m = len(layout.metrics)
    return Aggregate(
        theta_c=layout.unflatten(vals[m:]),
        n_total=n_total,
        n_sites=n_sites,
        clipped_fraction=float(v[1]) / float(n_sites * (layout.n_params + m)),
        metrics={k: float(vals[i]) for i, k in enumerate(layout.metrics)},
        quantisation_bound=quantisation_bound(policy, n_sites, n_total),
    )


def quantisation_bound(policy: SecAggPolicy, n_sites: int, n_total: int) -> float:
    """Each site rounds once (error <= 1/2 step); dividing by Σ w_i scales it: n/2 · max_weight / (scale · Σn).

    The decoded values are float64; a caller that casts to float32 adds up to one float32 ulp of the result.
    """
    return n_sites * 0.5 * policy.max_weight / (policy.scale * n_total)


def plaintext_weighted_mean(
    policy: SecAggPolicy, updates: list[tuple[Mapping[str, np.ndarray], int]]
) -> dict[str, np.ndarray]:
    """Reference: Σ n_i clip(x_i) / Σ n_i in float64 (what secure aggregation approximates)."""
    n_total = sum(n for _, n in updates)
    out: dict[str, np.ndarray] = {}
    for name in updates[0][0]:
        acc = sum(np.clip(np.asarray(u[name], np.float64), -policy.clip, policy.clip) * n for u, n in updates)
        out[name] = acc / n_total
    return out

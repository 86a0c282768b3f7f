"""Sample-size-weighted FedAvg of the synchronised parameters (paper Table II, "Aggregation").

DSS (paper §III, "Decoupled synchronisation"): each sampled site i returns its locally trained Θc_i and its
sample count n_i; the server sets ``Θc ← Σ_i n_i Θc_i / Σ_i n_i``. Θs_i never reaches this module in DSS mode;
in the "w/o DSS" ablation the same helpers average every parameter but the site-bound ones (part ``"full"``).

Pure numpy, no Flower import: the plain flow and the tests call it directly; secure aggregation computes the
same weighted sum inside masked vectors (``fcd_secure.aggregation.secagg``) and only divides at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from fcd_secure.errors import FcdError

Arrays = Mapping[str, np.ndarray]


class AggregationError(FcdError, ValueError):
    """Updates that cannot be averaged (no update, mismatched names or shapes, bad weights)."""


def check_same_layout(updates: Sequence[Arrays], reference: Arrays | None = None) -> list[str]:
    """Names (sorted) shared by every update; raise naming the first key or shape that differs."""
    if not updates:
        raise AggregationError("no updates to aggregate")
    ref = reference if reference is not None else updates[0]
    names = sorted(ref)
    for k, upd in enumerate(updates):
        if sorted(upd) != names:
            missing = sorted(set(names) - set(upd))
            extra = sorted(set(upd) - set(names))
            raise AggregationError(f"update {k}: parameter names differ (missing {missing[:3]}, unexpected {extra[:3]})")
        for name in names:
            if np.shape(upd[name]) != np.shape(ref[name]):
                raise AggregationError(
                    f"update {k}: parameter {name!r} has shape {np.shape(upd[name])}, expected {np.shape(ref[name])}"
                )
    return names


def weighted_sum(updates: Sequence[Arrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """``Σ_i w_i · θ_i`` per parameter, accumulated in float64 (order-independent up to float64 rounding)."""
    if len(updates) != len(weights):
        raise AggregationError(f"{len(updates)} updates but {len(weights)} weights")
    names = check_same_layout(updates)
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise AggregationError(f"weights must be finite and non-negative, got {w.tolist()}")
    out: dict[str, np.ndarray] = {}
    for name in names:
        acc = np.zeros(np.shape(updates[0][name]), dtype=np.float64)
        for wi, upd in zip(w, updates):
            arr = np.asarray(upd[name], dtype=np.float64)
            if not np.all(np.isfinite(arr)):
                raise AggregationError(f"parameter {name!r} holds NaN or inf in one update")
            acc += wi * arr
        out[name] = acc
    return out


def finalize(total: Arrays, n_total: float, like: Arrays) -> dict[str, np.ndarray]:
    """Divide a weighted sum by the total weight and cast back to the dtypes of ``like``."""
    if not np.isfinite(n_total) or n_total <= 0:
        raise AggregationError(f"total sample weight must be positive, got {n_total}")
    return {name: (np.asarray(total[name], dtype=np.float64) / n_total).astype(np.asarray(like[name]).dtype) for name in like}


def screen_update(
    arrays: Arrays, n: object, specs: Mapping[str, tuple[tuple[int, ...], str]], max_count: float
) -> str | None:
    """Why one site's clear-text update may not enter the average, or ``None`` if it may (robust plain FedAvg).

    One malicious or broken site must not wreck the round for everyone (docs/threats.md P26): its update is checked on its
    own — exact tensor names, each tensor's shape and dtype as the manifest says (a float64 ``1e300`` would become
    ``inf`` once cast), finite values, and a sample count that is a whole number in ``[1, max_count]`` (a claimed
    ``n = 1e12`` would otherwise replace the model) — so the caller can drop it, name the site and go on.

    Args:
        arrays: the update, keyed by manifest name.
        n: the claimed sample count.
        specs: ``{name: (shape, dtype)}`` of the synchronised part (``Manifest.specs(part)``).
        max_count: the largest sample count a site may weigh with (the consortium's pinned maximum).
    """
    missing = sorted(set(specs) - set(arrays))
    extra = sorted(set(arrays) - set(specs))
    if missing or extra:
        return f"tensor names differ from the manifest (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, (shape, dtype) in specs.items():
        a = np.asarray(arrays[name])
        if tuple(a.shape) != tuple(shape):
            return f"{name} has shape {tuple(a.shape)}, the manifest says {tuple(shape)}"
        if a.dtype.name != dtype:
            return f"{name} has dtype {a.dtype.name}, the manifest says {dtype}"
        if not np.all(np.isfinite(a)):
            return f"{name} holds NaN or inf"
    try:
        count = float(n)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"sample count {n!r} is not a number"
    if not np.isfinite(count) or count != round(count) or not 1 <= count <= max_count:
        return f"sample count {n!r} is not a whole number in [1, {max_count:g}]"
    return None


#: How far one site's update may reach beyond the round's typical update: ``‖Θ_i − Θ_global‖₂`` at most this many times
#: the median of the round's update norms (docs/threats.md P32). Honest local training from one global model moves
#: every site by the same order of magnitude (the same learning rate, epochs and model); a factor of 10 leaves room
#: for heterogeneous sites (non-IID data, a 10× larger site) and none for a model replacement, which must move the
#: global model by the whole distance to its target with weight ``n_m / Σn`` (Bagdasaryan et al., "How to backdoor
#: federated learning", AISTATS 2020, §3.2: the replacement update is scaled by ``Σn / n_m``).
NORM_FACTOR = 10.0
#: A median needs an honest majority to mean anything: below this many screened updates the round's own median cannot
#: tell the outlier from the honest site, and the bound of the last round that had them is used.
MIN_NORM_SITES = 3


def update_norm(arrays: Arrays, reference: Arrays | None = None) -> float:
    """``‖θ − θ_ref‖₂`` over every tensor (``‖θ‖₂`` without a reference), in float64 (a float32 3e38 squares to
    9e76, well inside float64)."""
    total = 0.0
    for name in arrays if reference is None else reference:
        d = np.asarray(arrays[name], np.float64)
        if reference is not None:
            d = d - np.asarray(reference[name], np.float64)
        total += float(np.dot(d.ravel(), d.ravel()))
    return float(np.sqrt(total))


def norm_bound(norms: Sequence[float], reference_norm: float, factor: float = NORM_FACTOR) -> float | None:
    """The largest update norm a site may send this round: ``factor ×`` the median of the round's update norms,
    never below ``factor × 1e-6 (1 + ‖Θ_global‖)`` (a round of near-zero updates does not shut out a site that
    moved a little); ``None`` when fewer than :data:`MIN_NORM_SITES` norms give no honest median.

    The median is the consortium-relative reference (docs/threats.md P32): while fewer than half of the round's
    updates are malicious it lies between two honest norms (Yin et al., "Byzantine-robust distributed learning",
    ICML 2018, use the coordinate-wise median for the same reason), so a malicious site can move the global model by
    at most ``factor × median × n_m / Σn``; one far outside — a finite float32 3e38, a scaled model replacement — is
    dropped and named.
    """
    finite = [float(x) for x in norms if np.isfinite(x)]
    if len(finite) < MIN_NORM_SITES:
        return None
    return float(factor * max(float(np.median(finite)), 1e-6 * (1.0 + reference_norm)))


def fedavg(updates: Sequence[Arrays], n_samples: Sequence[float]) -> tuple[dict[str, np.ndarray], float]:
    """Sample-size-weighted FedAvg: returns ``(Σ n_i θ_i / Σ n_i, Σ n_i)`` with the dtypes of the first update."""
    total = weighted_sum(updates, n_samples)
    n_total = float(np.sum(np.asarray(n_samples, dtype=np.float64)))
    return finalize(total, n_total, updates[0]), n_total

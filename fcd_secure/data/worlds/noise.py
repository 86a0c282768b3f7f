"""Common random numbers (Glasserman & Yao 1992) of the generated worlds: every draw is keyed by the entity, never by
the batch, so the arms of a contrast are paired and a query's numbers do not depend on how it is batched.

- :func:`entity_generators`: each entity's own stream, ``np.random.SeedSequence(entropy).spawn(n)``; a world draws
  everything the entity ever needs from it once (the logged noise among it), the same for every policy simulated;
- :func:`fresh_uniforms`: counter-based U(0, 1) keyed by ``(seed, entity, rollout, step)`` (SplitMix64, Steele et
  al. 2014), for counterfactual rollouts ``r ≥ 1``: the same for every policy and every arm, and independent of
  batch shape and call order;
- :func:`rollout_major`: the noise of R rollouts, rollout 0 the logged noise (so replaying the logged actions
  reproduces the logged data exactly), laid out rollout-major (row ``r * n + i``), the layout every ground-truth
  kernel reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["entity_generators", "fresh_uniforms", "rollout_major", "splitmix64"]


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser (Steele, Lea & Flood 2014) on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def fresh_uniforms(seed: int, entity_ids: np.ndarray, rollouts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Counter-based U(0,1) keyed by (seed, entity, rollout, step): independent of batch shape and call order.

    Args:
        seed: The key (a world keeps its streams apart from another's by salting it).
        entity_ids: Global entity ids ``[n]``.
        rollouts: Rollout indices ``[R]``.
        steps: Absolute step indices ``[S]``.

    Returns:
        float64 ``[n entities, R rollouts, S steps]`` in [0, 1), 53 random bits each.
    """
    sid = np.asarray(entity_ids, dtype=np.uint64)[:, None, None]
    r = np.asarray(rollouts, dtype=np.uint64)[None, :, None]
    t = np.asarray(steps, dtype=np.uint64)[None, None, :]
    with np.errstate(over="ignore"):
        key = splitmix64(np.uint64(seed) ^ np.uint64(0xD1B54A32D192ED03))
        x = splitmix64(key ^ splitmix64(sid * np.uint64(0x9E3779B97F4A7C15) + r))
        x = splitmix64(x ^ (t * np.uint64(0xC2B2AE3D27D4EB4F)))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def entity_generators(entropy: int | list[int], n: int) -> Iterator[np.random.Generator]:
    """One generator per entity, in id order, spawned from ``np.random.SeedSequence(entropy)``: an entity's numbers do
    not depend on how many entities there are or on what the others draw."""
    for kid in np.random.SeedSequence(entropy).spawn(n):
        yield np.random.default_rng(kid)


def rollout_major(logged: np.ndarray, n_rollouts: int, fresh: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The noise of ``n_rollouts`` rollouts, rollout-major (row ``r * n + i``): rollout 0 is ``logged``, rollouts
    ``r ≥ 1`` are ``fresh(np.arange(1, n_rollouts))`` (``[n, R − 1, S]``, keyed by rollout: :func:`fresh_uniforms`).

    Args:
        logged: The entities' logged noise over the steps ``[n, S]``.
        n_rollouts: R.
        fresh: The fresh noise of the given rollouts (called only when R > 1).

    Returns:
        float64 ``[R * n, S]``.
    """
    n, S = logged.shape
    out = np.empty((n, n_rollouts, S))
    out[:, 0, :] = logged
    if n_rollouts > 1:
        out[:, 1:, :] = fresh(np.arange(1, n_rollouts))
    return out.transpose(1, 0, 2).reshape(n_rollouts * n, S)

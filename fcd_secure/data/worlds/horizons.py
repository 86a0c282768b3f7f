"""A rollout's per-entity value at several horizons from one pass: :class:`HorizonSums`.

The value of a policy over the first ``H_i = min(L_i, h)`` steps, ``(1/H_i) Σ_{t<H_i} E[Y^π_it]``, is a prefix mean
of the same rollout for every ``h``: the actions, outcomes and noise of step ``t`` do not depend on how far the
rollout goes on (the policy sees the history, never the horizon). The queries ask each policy's truth at a grid of
horizons (the identified horizons of ``queries.targeted`` and the what-if question's own), so one pass of the longest
horizon answers them all; the running sum is read off after step ``h − 1`` for each ``h``, the same additions in the
same order as a pass of that horizon alone, so every value is bit-for-bit the one that pass gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["HorizonSums"]


class HorizonSums:
    """Running per-row sums of a rollout's expected outcomes, read off at each of ``horizons``.

    Args:
        lengths: each row's valid length ``L_i`` ``[B]`` (rows laid out rollout-major).
        horizons: the horizons wanted (``None``: every valid step, i.e. ``L``).
        L: the steps of the rollout's noise (the longest trajectory).

    Attributes:
        steps: the steps the rollout must run (the longest horizon wanted, at most ``L``).
    """

    def __init__(self, lengths: np.ndarray, horizons: Sequence[int | None], L: int) -> None:
        self._ends = [L if h is None else min(int(h), L) for h in horizons]
        self.steps = max(self._ends, default=0)
        self._lengths = lengths
        self._total = np.zeros(len(lengths))
        self._values: list[np.ndarray | None] = [None] * len(self._ends)
        self._read(0)

    def add(self, t: int, p: np.ndarray) -> None:
        """Step ``t``'s expected outcomes ``[B]`` (counted where ``t`` is a valid step of the row)."""
        self._total += np.where(t < self._lengths, p, 0.0)
        self._read(t + 1)

    def _read(self, done: int) -> None:
        for k, end in enumerate(self._ends):
            if end == done or (done == 0 and end < 0):
                self._values[k] = self._total / np.minimum(self._lengths, end)

    def values(self, R: int, n: int) -> np.ndarray:
        """float64 ``[len(horizons), R, n]``: each horizon's per-row mean, rollout-major rows as ``[R, n]``."""
        if any(v is None for v in self._values):
            raise RuntimeError(f"the rollout stopped before step {self.steps}")
        return np.stack([v.reshape(R, n) for v in self._values])

"""Seeded client sampling (paper Table II: participation rate 5/10 per round).

Sites are ordered by site index (stable across runs and restarts; Flower node ids are random), and each round
``k`` of them are drawn without replacement from a numpy ``Generator`` seeded by the run seed. The generator's
state is saved in the server checkpoint so a resumed run draws the same sites as an uninterrupted one.
"""

from __future__ import annotations

import numpy as np


class ClientSampler:
    def __init__(self, seed: int, n_sites: int, k: int) -> None:
        if not 1 <= k <= n_sites:
            raise ValueError(f"cannot sample {k} of {n_sites} sites per round")
        self.n_sites, self.k = int(n_sites), int(k)
        # a stream of its own, so sampling never shifts when another part of the run draws random numbers
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0x5A4D])))

    def sample(self) -> list[int]:
        """Site indices (sorted) taking part in the next round."""
        return sorted(int(i) for i in self.rng.choice(self.n_sites, size=self.k, replace=False))

    def get_state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state

"""The generated worlds as test cases: what each one declares (dims, actions, contexts) and its tiny world, built once.

Every generated world (DKT-Synth, the tumour world, the carry-over world) is an
:class:`~fcd_secure.data.worlds.world.OracleWorld` and keeps the same contract; ``tests/test_worlds.py`` checks it
once, parametrised by :data:`WORLDS`, and each world's own file checks only its mechanism. A plain module beside the
tests (``from world_cases import ...``), not part of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from types import ModuleType

import numpy as np

from fcd_secure.data import carryover, dkt_synth, tumour
from fcd_secure.data.carryover import truth as carryover_truth
from fcd_secure.data.dkt_synth import truth as dkt_synth_truth
from fcd_secure.data.dkt_synth.generation import ITEM_LABELS
from fcd_secure.data.tumour import truth as tumour_truth
from fcd_secure.data.worlds.config import WorldConfig
from fcd_secure.data.worlds.world import OracleWorld

__all__ = ["ENDOGENOUS", "WORLDS", "Recorder", "WorldCase", "tiny_world"]


@dataclass(frozen=True)
class WorldCase:
    """One generated world as the shared contract tests see it.

    Attributes:
        name: The registered dataset name (``--dataset``; ``fcd_secure.data.sources.SOURCES``).
        package: The world's package: ``generate(config) -> OracleWorld``.
        config: Its config class (``WorldConfig``: ``WORLD``, ``ENTITY``, ``N_ACTIONS``, presets).
        truth: Its ground-truth kernels' module (``MAX_BATCH_ROWS``: entities × rollouts per batch).
        dx: Static covariates per entity.
        actions: The action labels, in action order.
        contexts: The context columns by dynamics, as the registered dataset describes them (endogenous first).
        effect_sd: A floor under the spread of the tiny world's true multi-step effects (they are heterogeneous).
        se_max: A bound on the Monte-Carlo standard error of the tiny world's default policies' values.
    """

    name: str
    package: ModuleType
    config: type[WorldConfig]
    truth: ModuleType
    dx: int
    actions: tuple[str, ...]
    contexts: dict[str, list[str]]
    effect_sd: float
    se_max: float

    @property
    def da(self) -> int:
        """Context columns: the endogenous ones, then the exogenous ones."""
        return len(self.contexts["endogenous"]) + len(self.contexts["exogenous"])

    def __str__(self) -> str:  # the test id
        return self.name


WORLDS = (
    WorldCase("tumour", tumour, tumour.TumourConfig, tumour_truth, dx=4, actions=tuple(tumour.ACTION_LABELS),
              contexts={"endogenous": list(tumour.CONTEXT_NAMES), "exogenous": []}, effect_sd=0.05, se_max=0.01),
    WorldCase("carryover", carryover, carryover.CarryoverConfig, carryover_truth, dx=2,
              actions=tuple(carryover.ACTION_LABELS),
              contexts={"endogenous": list(carryover.CONTEXT_NAMES), "exogenous": []}, effect_sd=0.05, se_max=0.01),
    WorldCase("dkt-synth", dkt_synth, dkt_synth.DKTSynthConfig, dkt_synth_truth, dx=4, actions=tuple(ITEM_LABELS),
              contexts={"endogenous": [], "exogenous": ["step_index_normalised"]}, effect_sd=0.02, se_max=0.02),
)
#: the worlds whose contexts the treatment changes (a rollout generates them)
ENDOGENOUS = tuple(w for w in WORLDS if w.contexts["endogenous"])


@cache
def tiny_world(name: str) -> OracleWorld:
    """The world ``name`` of the "tiny" preset, generated once per test process (every test file that reads it shares
    it; no test changes it)."""
    case = next(w for w in WORLDS if w.name == name)
    return case.package.generate(case.config.from_preset("tiny"))


class Recorder:
    """Replays a plan (or one action) on every rollout row and records what the rollout shows the policy."""

    needs_context = True

    def __init__(self, plan: np.ndarray | int, name: str = "recorder") -> None:
        self.plan, self.name = plan, name
        self.y: np.ndarray | None = None
        self.ctx: np.ndarray | None = None

    def actions(self, t, y_hist, lengths, a_off, a_on, context=None):
        self.y, self.ctx = y_hist.copy(), context.copy()
        if isinstance(self.plan, int):
            return np.full(len(lengths), self.plan, dtype=np.int64)
        return np.tile(self.plan[:, t], len(lengths) // len(self.plan))

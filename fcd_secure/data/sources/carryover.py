"""The carry-over world (issue 42 item 6): an oracle whose confounding runs through the recorded history only and
whose regimens change order with the horizon, generated per site."""

from __future__ import annotations

from fcd_secure.data.carryover import PRESETS, CarryoverConfig, generate
from fcd_secure.data.federated import FederatedData, describe_federated
from fcd_secure.data.sources.base import WORLD_OPTIONS, GeneratedSource


def build_carryover(cfg: CarryoverConfig) -> FederatedData:
    """Generate the carry-over world of ``cfg`` and return its sites; ``FederatedData.oracle`` is the world, and the
    description carries its key figures under ``oracle`` (true ATE, the true values of the paper's four regimens over
    the whole trajectory and over its first step, the naive vs true one-step contrast, each site's case mix and
    practice, γ, regime support)."""
    world = generate(cfg)
    fd = FederatedData(name="carryover", train=list(world.train), test=list(world.test),
                       anchors=tuple(world.anchors), oracle=world)
    fd.description = describe_federated(fd, alpha=cfg.dirichlet_alpha, seed=cfg.seed, preset=cfg.preset,
                                        test_fraction=cfg.test_fraction)
    fd.description["oracle"] = world.describe()
    return fd


SOURCE = GeneratedSource(name="carryover", configure=CarryoverConfig.from_preset, build=build_carryover,
                         presets=tuple(PRESETS), options=WORLD_OPTIONS)

"""DKT-Synth (paper §IV-A, Table I): the semi-synthetic tutoring world with ground truth, generated per site."""

from __future__ import annotations

from fcd_secure.data.dkt_synth import PRESETS, DKTSynthConfig, generate
from fcd_secure.data.federated import FederatedData, describe_federated
from fcd_secure.data.sources.base import WORLD_OPTIONS, GeneratedSource

TABLE_I = {"sequences": 20000, "Lmax": 50, "dx": 4, "da": 1, "n_actions": 50}


def build_dkt_synth(cfg: DKTSynthConfig) -> FederatedData:
    """Generate the DKT-Synth world of ``cfg`` and return its sites; ``FederatedData.oracle`` is the world."""
    world = generate(cfg)
    fd = FederatedData(
        name="dkt-synth", train=list(world.train), test=list(world.test), anchors=tuple(world.anchors), oracle=world
    )
    fd.description = describe_federated(
        fd, table_i=TABLE_I, alpha=cfg.dirichlet_alpha, seed=cfg.seed, preset=cfg.preset,
        test_fraction=cfg.test_fraction
    )
    return fd


SOURCE = GeneratedSource(name="dkt-synth", configure=DKTSynthConfig.from_preset, build=build_dkt_synth, table_i=TABLE_I,
                         presets=tuple(PRESETS), options=WORLD_OPTIONS,
                         unrecorded_confounding="a student's readiness (hidden motivation and mastery, not logged) "
                         "drives both the tutor's choice of item and the student's answer")

"""DKT-Synth (paper §IV-A, Table I): the semi-synthetic tutoring world with ground truth, generated per site."""

from __future__ import annotations

from fcd_secure.data.dkt_synth import PRESETS, DKTSynthConfig, generate
from fcd_secure.data.federated import FederatedData, describe_federated
from fcd_secure.data.sources.base import GeneratedSource
from fcd_secure.data.spec import DataError

TABLE_I = {"sequences": 20000, "Lmax": 50, "dx": 4, "da": 1, "n_actions": 50}


def build_dkt_synth(n_sites: int, alpha: float, seed: int, preset: str, test_fraction: float) -> FederatedData:
    """Generate a DKT-Synth world and return its sites; ``FederatedData.oracle`` is the world (ground truth).

    Raises:
        DataError: The preset does not exist or the sizes are impossible (the config's own message says which).
    """
    try:
        cfg = DKTSynthConfig.from_preset(
            preset, n_sites=n_sites, dirichlet_alpha=alpha, seed=seed, test_fraction=test_fraction
        )
    except ValueError as exc:
        raise DataError(f"DKT-Synth: {exc}", field="preset") from None
    world = generate(cfg)
    fd = FederatedData(
        name="dkt-synth", train=list(world.train), test=list(world.test), anchors=tuple(world.anchors), oracle=world
    )
    fd.description = describe_federated(
        fd, table_i=TABLE_I, alpha=alpha, seed=seed, preset=preset, test_fraction=test_fraction
    )
    return fd


SOURCE = GeneratedSource(name="dkt-synth", build=build_dkt_synth, table_i=TABLE_I, presets=tuple(PRESETS))

"""The tumour world (Geng et al. 2017, as RMSN/CRN/CT use it): a PK-PD oracle with ground truth, generated per site."""

from __future__ import annotations

from fcd_secure.data.federated import FederatedData, describe_federated
from fcd_secure.data.sources.base import WORLD_OPTIONS, GeneratedSource
from fcd_secure.data.tumour import PRESETS, TumourConfig, generate


def build_tumour(cfg: TumourConfig) -> FederatedData:
    """Generate the tumour world of ``cfg`` and return its sites; ``FederatedData.oracle`` is the world (ground truth),
    and the description carries its key figures under ``oracle`` (true ATE, true values of the paper's four
    policies, the naive vs true one-day contrast, each site's case mix and practice, γ, regime support)."""
    world = generate(cfg)
    fd = FederatedData(name="tumour", train=list(world.train), test=list(world.test), anchors=tuple(world.anchors),
                       oracle=world)
    fd.description = describe_federated(fd, alpha=cfg.dirichlet_alpha, seed=cfg.seed, preset=cfg.preset,
                                        test_fraction=cfg.test_fraction)
    fd.description["oracle"] = world.describe()
    return fd


SOURCE = GeneratedSource(name="tumour", configure=TumourConfig.from_preset, build=build_tumour, presets=tuple(PRESETS),
                         options=WORLD_OPTIONS)

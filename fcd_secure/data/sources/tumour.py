"""The tumour world (Geng et al. 2017, as RMSN/CRN/CT use it): a PK-PD oracle with ground truth, generated per site."""

from __future__ import annotations

from fcd_secure.data.federated import FederatedData, describe_federated
from fcd_secure.data.sources.base import GeneratedSource
from fcd_secure.data.spec import DataError
from fcd_secure.data.tumour import PRESETS, TumourConfig, generate


def build_tumour(n_sites: int, alpha: float, seed: int, preset: str, test_fraction: float,
                 gamma: float | None = None) -> FederatedData:
    """Generate a tumour world and return its sites; ``FederatedData.oracle`` is the world (ground truth), and the
    description carries its key figures under ``oracle`` (true ATE, true values of the paper's four policies, the
    naive vs true one-day contrast, each site's case mix and practice, γ).

    Args:
        gamma: Confounding strength γ of the logging policy (Geng et al. 2017); None: the config's default.

    Raises:
        DataError: The preset does not exist or the sizes are impossible (the config's own message says which).
    """
    try:
        extra = {} if gamma is None else {"gamma": gamma}
        cfg = TumourConfig.from_preset(preset, n_sites=n_sites, dirichlet_alpha=alpha, seed=seed,
                                       test_fraction=test_fraction, **extra)
    except ValueError as exc:
        raise DataError(f"tumour: {exc}", field="gamma" if gamma is not None and "gamma" in str(exc) else "preset") from None
    world = generate(cfg)
    fd = FederatedData(name="tumour", train=list(world.train), test=list(world.test), anchors=tuple(world.anchors),
                       oracle=world)
    fd.description = describe_federated(fd, alpha=alpha, seed=seed, preset=preset, test_fraction=test_fraction)
    fd.description["oracle"] = world.describe()
    return fd


SOURCE = GeneratedSource(name="tumour", build=build_tumour, presets=tuple(PRESETS), options=("gamma",))

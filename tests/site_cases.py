"""Every site of a run and the run's untrained simulator, as the query tests start from them. A plain module beside
the tests (``from site_cases import ...``), not part of the package."""

from __future__ import annotations

from typing import Any

from fcd_secure.config import RunConfig, build_config
from fcd_secure.federation import learner
from fcd_secure.model.simulator import Simulator

__all__ = ["sites_and_untrained_model"]


def sites_and_untrained_model(overrides: dict[str, Any], preset: str = "tiny"
                              ) -> tuple[RunConfig, list[learner.SiteData], Simulator]:
    """The run config of ``preset`` with ``overrides``, every site's data (``learner.load_site_data``) and the run's
    simulator before any training, built from site 0's dims as every site builds it (``learner.build_model``)."""
    cfg = build_config(preset, overrides)
    n_sites = cfg.data.n_sites
    data = [learner.load_site_data(cfg, i) for i in range(n_sites)]
    return cfg, data, learner.build_model(cfg, learner.dims_of(data[0].train, n_sites))

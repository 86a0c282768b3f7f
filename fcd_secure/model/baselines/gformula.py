"""The GRU g-formula baseline: Fed-CausalDiff's encoder, decoder and losses, with a deterministic latent transition
K_{t+1} = f(K_t, A_t, T_t) instead of the diffusion (no Phase B noise). It isolates what the stochastic transition
of paper §III-B buys.
"""

from __future__ import annotations

from fcd_secure.model.baselines.fed_causaldiff import FedCausalDiffSimulator
from fcd_secure.model.config import ModelConfig

__all__ = ["GFormulaSimulator", "gformula_config"]


def gformula_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with the diffusion replaced by a deterministic latent transition."""
    return cfg.model_copy(update={"transition": "deterministic"})


class GFormulaSimulator(FedCausalDiffSimulator):
    """Fed-CausalDiff with ``transition='deterministic'``; everything else is inherited."""

    name = "gformula"

    @classmethod
    def configure(cls, cfg: ModelConfig) -> ModelConfig:
        """:func:`gformula_config`."""
        return gformula_config(cfg)

"""Fed-CausalDiff as a :class:`~fcd_secure.model.simulator.Simulator` (paper §III): the network of ``networks.py``,
trained with the local objective of ``training.py``, rolled out by the latent diffusion transition of
``simulate.py``; Θs is :data:`~fcd_secure.model.networks.THETA_S_MODULES`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import dataset_tensors
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.networks import THETA_S_MODULES, FedCausalDiff, unwrap
from fcd_secure.model.simulate import simulate
from fcd_secure.model.simulator import Plan, SimResult, Simulator
from fcd_secure.model.training import make_optimizer, train_local, training_view

__all__ = ["FedCausalDiffSimulator"]


class FedCausalDiffSimulator(Simulator):
    """Fed-CausalDiff: K_t = [K^(c)_t, K^(s)_t], K_{t+1} ~ p_Θ(·|K_t, A_t, do(T_t)), Y_t ~ P_φ(·|K_t, A_t, T_t).

    Args:
        network: a :class:`~fcd_secure.model.networks.FedCausalDiff`, bare or wrapped by Opacus.
    """

    name = "fed_causaldiff"
    theta_s_modules = THETA_S_MODULES

    def __init__(self, network: nn.Module) -> None:
        super().__init__(network, unwrap(network).cfg)

    @classmethod
    def configure(cls, cfg: ModelConfig) -> ModelConfig:
        """The configuration this simulator builds its network with (a subclass may change the transition)."""
        return cfg

    @classmethod
    def from_dims(
        cls, cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, n_endogenous: int = 0
    ) -> "FedCausalDiffSimulator":
        """A fresh network initialised from ``cfg.seed``, with the context head when the data has endogenous
        contexts (see :meth:`Simulator.from_dims`)."""
        return cls(FedCausalDiff.from_dims(cls.configure(cfg), dx, da, n_actions, n_sites, n_endogenous))

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam over every parameter (:func:`~fcd_secure.model.training.make_optimizer`)."""
        return make_optimizer(self.module, self.config)

    def train_site(
        self, ds: SiteDataset, site_index: int | None, n_sites: int, epochs: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """One local round of the paper's local objective (§III-C); propensities are dropped before training unless
        ``config.ipw`` weights the likelihood by them (:func:`~fcd_secure.model.training.training_view`)."""
        return train_local(self.module, training_view(ds, self.config), self.config, site_index, n_sites, epochs=epochs,
                           seed=seed, optimizer=self.optimizer)

    def simulate(
        self,
        ds: SiteDataset,
        plan: Plan,
        n_samples: int,
        seed: int,
        start_t: int = 0,
        horizon: int | None = None,
        anchors: tuple[int, int] | None = None,
        **kw: Any,
    ) -> SimResult:
        """The latent do-simulation (:func:`~fcd_secure.model.simulate.simulate`; ``kw``: sampler, steps, rollout,
        sample_y, chunk_rows)."""
        return simulate(self.module, ds, plan, n_samples, seed, start_t=start_t, horizon=horizon, anchors=anchors, **kw)

    @torch.no_grad()
    def factual_probs(self, ds: SiteDataset) -> np.ndarray:
        """E[Y_t | K_t, A_t, logged T_t] with K_t encoded from the logged history before t, float64 ``[n, L]``."""
        core = unwrap(self.module)
        was = core.training
        core.eval()
        try:
            b = dataset_tensors(ds, 0)
            Kc, Ks = core.encode(b.X, b.A, b.T, b.Y)
            p = core.outcome_mean(torch.cat([Kc, Ks], -1), b.A, b.T)
        finally:
            core.train(was)
        return p.numpy().astype(np.float64)

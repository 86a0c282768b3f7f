"""Causal simulators behind the :class:`~fcd_secure.model.simulator.Simulator` protocol, one module each.

=================  ====================================  ===============================================================
key                class                                 what it is
=================  ====================================  ===============================================================
``fed_causaldiff`` :class:`FedCausalDiffSimulator`       the paper's model (§III): latent diffusion transition, Θc/Θs
``gformula``       :class:`GFormulaSimulator`            the same with a deterministic latent transition (GRU g-formula)
``naive``          :class:`NaiveSimulator`               P(Y_t | X, A_t, T_t, Y_{t−1}), no history, no Θs
=================  ====================================  ===============================================================

A new simulator (the paper's CRN, RCGAN, TimeGAN, FedCM baselines) is one module here with one ``Simulator``
subclass, added to :data:`SIMULATORS`.
"""

from __future__ import annotations

from torch import nn

from fcd_secure.model.baselines.fed_causaldiff import FedCausalDiffSimulator
from fcd_secure.model.baselines.gformula import GFormulaSimulator, gformula_config
from fcd_secure.model.baselines.naive import NaiveOutcomeModel, NaiveSimulator
from fcd_secure.model.simulator import Simulator

__all__ = [
    "SIMULATORS",
    "FedCausalDiffSimulator",
    "GFormulaSimulator",
    "NaiveOutcomeModel",
    "NaiveSimulator",
    "as_simulator",
    "gformula_config",
]

#: Every simulator by its key, in the order reports list them.
SIMULATORS: dict[str, type[Simulator]] = {
    cls.name: cls for cls in (FedCausalDiffSimulator, GFormulaSimulator, NaiveSimulator)
}


def as_simulator(model: nn.Module | Simulator) -> Simulator:
    """``model`` itself if it is a Simulator, else a Fed-CausalDiff network (bare or wrapped by Opacus) as one.

    Raises:
        TypeError: if ``model`` is neither.
    """
    return model if isinstance(model, Simulator) else FedCausalDiffSimulator(model)

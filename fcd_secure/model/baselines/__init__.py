"""Causal simulators behind the :class:`~fcd_secure.model.simulator.Simulator` protocol, one module each.

=================  ====================================  ===============================================================
key                class                                 what it is
=================  ====================================  ===============================================================
``fed_causaldiff`` :class:`FedCausalDiffSimulator`       the paper's model (§III): latent diffusion transition, Θc/Θs
``gformula``       :class:`GFormulaSimulator`            the same with a deterministic latent transition (GRU g-formula)
``naive``          :class:`NaiveSimulator`               P(Y_t | X, A_t, T_t, Y_{t−1}), no history, no Θs
``crn``            :class:`CRNSimulator`                 CRN (Bica et al. 2020, paper ref. [20]): balanced encoder and
                                                         decoder, no Θs
``rcgan``          :class:`RCGANSimulator`               RCGAN (Esteban et al. 2017, ref. [32]), conditional on X, A
                                                         and the actions, no Θs
``timegan``        :class:`TimeGANSimulator`             TimeGAN (Yoon et al. 2019, ref. [8]), conditional, no Θs
``fedcm``          :class:`FedCMSimulator`               FedCM (Rahman & Kocaoglu 2025, ref. [10]): per-mechanism
                                                         conditional GANs; outcome mechanism Θc, treatment Θs
=================  ====================================  ===============================================================

What the baselines share, one module each: ``rollout`` (``SteppedSimulator``, the template that turns a plan into
actions, draws the outcome noise and builds the ``SimResult``), ``sequence`` (the per-step inputs a causal recurrent
model reads, the history summary, the straight-through Bernoulli sampler) and ``fitting`` (one Adam over named
parameter groups, and the step of one group for the adversarial players).

A new simulator is one module here with one ``Simulator`` subclass, added to :data:`SIMULATORS`; a run trains it
with ``model.simulator = "<key>"``. :func:`parameter_counts` prints each one's size for given data dims.
"""

from __future__ import annotations

from fcd_secure.model.baselines.crn import CRNSimulator
from fcd_secure.model.baselines.fed_causaldiff import FedCausalDiffSimulator
from fcd_secure.model.baselines.fedcm import FedCMSimulator
from fcd_secure.model.baselines.gformula import GFormulaSimulator, gformula_config
from fcd_secure.model.baselines.naive import NaiveOutcomeModel, NaiveSimulator
from fcd_secure.model.baselines.rcgan import RCGANSimulator
from fcd_secure.model.baselines.timegan import TimeGANSimulator
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.simulator import Simulator

__all__ = [
    "SIMULATORS",
    "CRNSimulator",
    "FedCMSimulator",
    "FedCausalDiffSimulator",
    "GFormulaSimulator",
    "NaiveOutcomeModel",
    "NaiveSimulator",
    "RCGANSimulator",
    "TimeGANSimulator",
    "gformula_config",
    "get_simulator",
    "parameter_counts",
]

#: Every simulator by its key, in the order reports list them.
SIMULATORS: dict[str, type[Simulator]] = {
    cls.name: cls
    for cls in (FedCausalDiffSimulator, GFormulaSimulator, NaiveSimulator, CRNSimulator, RCGANSimulator,
                TimeGANSimulator, FedCMSimulator)
}


def get_simulator(name: str) -> type[Simulator]:
    """The simulator class of key ``name``.

    Raises:
        ValueError: naming ``model.simulator`` and the known keys.
    """
    if name not in SIMULATORS:
        raise ValueError(f"model.simulator = {name!r} is not a simulator; choose one of {list(SIMULATORS)}")
    return SIMULATORS[name]


def parameter_counts(
    cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, names: tuple[str, ...] | None = None
) -> dict[str, dict[str, int]]:
    """Trainable parameters of each simulator for these dims: ``{name: {"theta_c", "theta_s", "total"}}``."""
    out: dict[str, dict[str, int]] = {}
    for name in names or tuple(SIMULATORS):
        m = SIMULATORS[name].from_dims(cfg, dx, da, n_actions, n_sites).manifest()
        c, s = (sum(e.size for e in m.entries if e.part == p) for p in ("theta_c", "theta_s"))
        out[name] = {"theta_c": c, "theta_s": s, "total": c + s}
    return out


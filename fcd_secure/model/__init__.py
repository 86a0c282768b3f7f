"""fcd_secure.model — the Fed-CausalDiff network (paper §III), its diffusion schedule and samplers, the local
objective, the Θc/Θs manifest, local training and do-simulation, and the simulator protocol the baselines share.

Public API (other layers import from here or from the named module):

* ``ModelConfig`` (config.py); ``FedCausalDiff.from_dims(cfg, dx, da, n_actions, n_sites)`` (networks.py)
* ``build_manifest``, ``get_params``, ``set_params`` (manifest.py; the contract itself is ``fcd_secure.manifest``)
* ``Batch``, ``make_loader``, ``dataset_tensors`` (batch.py); ``batch_loss``, ``train_local`` (training.py)
* ``simulate``, ``simulate_policy``, ``estimate_effects`` (simulate.py, the Fed-CausalDiff rollout)
* ``Simulator``, ``SimResult`` (simulator.py): the protocol of every causal simulator; its implementations —
  Fed-CausalDiff, the GRU g-formula, the naive model — are ``fcd_secure.model.baselines``
"""

from fcd_secure.model.config import ModelConfig

__all__ = [
    "ModelConfig",
    "FedCausalDiff",
    "unwrap",
    "build_manifest",
    "get_params",
    "set_params",
    "Batch",
    "dataset_tensors",
    "make_loader",
    "batch_loss",
    "train_local",
    "simulate",
    "simulate_policy",
    "estimate_effects",
    "SimResult",
    "Simulator",
]



def __getattr__(name: str):
    """The public names beyond ``ModelConfig``, loaded on first use (PEP 562): ``fcd_secure.config``, which needs
    only ``ModelConfig``, and the command line's start-up do not import torch."""
    if name in ("Batch", "dataset_tensors", "make_loader"):
        from fcd_secure.model import batch as module
    elif name in ("build_manifest", "get_params", "set_params"):
        from fcd_secure.model import manifest as module
    elif name in ("FedCausalDiff", "unwrap"):
        from fcd_secure.model import networks as module
    elif name in ("estimate_effects", "simulate", "simulate_policy"):
        from fcd_secure.model import simulate as module
    elif name in ("SimResult", "Simulator"):
        from fcd_secure.model import simulator as module
    elif name in ("batch_loss", "train_local"):
        from fcd_secure.model import training as module
    else:
        raise AttributeError(f"module 'fcd_secure.model' has no attribute {name!r}")
    return getattr(module, name)

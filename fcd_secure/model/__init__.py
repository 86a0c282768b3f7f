"""fcd_secure.model — the Fed-CausalDiff network (paper §III), its diffusion schedule and samplers, the local
objective, the Θc/Θs manifest, local training and do-simulation, and the simulator protocol the baselines share.

Public API (other layers import from here or from the named module):

* ``ModelConfig`` (config.py); ``FedCausalDiff.from_dims(cfg, dx, da, n_actions, n_sites)`` (networks.py)
* ``build_manifest``, ``get_params``, ``set_params`` (manifest.py; the contract itself is ``fcd_secure.manifest``)
* ``Batch``, ``make_loader``, ``dataset_tensors`` (batch.py); ``batch_loss``, ``train_local`` (training.py); the
  loss terms (losses.py); the forward schedule and the samplers (schedule.py, samplers.py); the context head that
  simulates time-varying contexts under an intervention (context.py)
* ``Simulator``, ``SimResult`` (simulator.py): the protocol of every causal simulator and the one way to ask one
  a do-question (``simulate``, ``simulate_policy``, ``estimate_effects``); its implementations — Fed-CausalDiff
  (whose latent rollout is simulate.py), the GRU g-formula, the naive model — are ``fcd_secure.model.baselines``
"""

import sys

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
    "SimResult",
    "Simulator",
]



#: lazily loaded public names → their module (PEP 562)
_LAZY = {
    "batch": ("Batch", "dataset_tensors", "make_loader"),
    "manifest": ("build_manifest", "get_params", "set_params"),
    "networks": ("FedCausalDiff", "unwrap"),
    "simulator": ("SimResult", "Simulator"),
    "training": ("batch_loss", "train_local"),
}


def __getattr__(name: str):
    """The public names beyond ``ModelConfig``, loaded on first use (PEP 562): ``fcd_secure.config``, which needs
    only ``ModelConfig``, and the command line's start-up do not import torch.

    The whole group is bound in the package namespace, so that ``from fcd_secure.model import X`` finds it there
    and does not come back to this hook.
    """
    if name in _LAZY["batch"]:
        import fcd_secure.model.batch  # noqa: F401
    elif name in _LAZY["manifest"]:
        import fcd_secure.model.manifest  # noqa: F401
    elif name in _LAZY["networks"]:
        import fcd_secure.model.networks  # noqa: F401
    elif name in _LAZY["simulator"]:
        import fcd_secure.model.simulator  # noqa: F401
    elif name in _LAZY["training"]:
        import fcd_secure.model.training  # noqa: F401 - bound through sys.modules below
    else:
        raise AttributeError(f"module 'fcd_secure.model' has no attribute {name!r}")
    for mod, names in _LAZY.items():
        if name in names:
            module = sys.modules[f"fcd_secure.model.{mod}"]  # never the package attribute, which may be rebound
            globals().update({n: getattr(module, n) for n in names})
    return globals()[name]

"""DKT-Synth: the semi-synthetic dataset with ground-truth counterfactuals (paper §IV-A, Table I).

- :mod:`.oracle`: the frozen DKT oracle (network, checksummed loading, training recipe).
- :mod:`.world`: ``DKTSynthConfig``, ``generate(cfg) -> DKTSynthWorld`` and the ground-truth API
  (``outcome_probs_do``, ``true_effects``, ``true_policy_value``, ``replay_logged``, ``describe``).
"""

from fcd_secure.data.dkt_synth.oracle import (
    N_ITEMS,
    DKTOracle,
    OracleChecksumError,
    load_oracle,
)
from fcd_secure.data.dkt_synth.world import (
    PRESETS,
    DKTSynthConfig,
    DKTSynthWorld,
    generate,
)

__all__ = [
    "N_ITEMS",
    "PRESETS",
    "DKTOracle",
    "DKTSynthConfig",
    "DKTSynthWorld",
    "OracleChecksumError",
    "generate",
    "load_oracle",
]

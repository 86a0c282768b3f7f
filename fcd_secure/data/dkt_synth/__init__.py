"""DKT-Synth: a semi-synthetic federated tutoring world with exact ground-truth counterfactuals (paper §IV-A).

Paper §IV-A / Table I: DKT-Synth is "derived from a pre-trained LSTM-DKT oracle" with |T| = 50 actions, dx = 4,
da = 1, 20,000 sequences of at most 50 steps. The paper publishes no generator; this package is ours.

Structural model (one student ``i`` at site ``s``; all quantities are known to the simulator only)
-----------------------------------------------------------------------------------------------------
* Latents: ability ``θ_i ~ N(μθ_s, 1)`` and a hidden, site-local confounder ("motivation")
  ``u_i ~ N(μu_s, σu_s²)``. Neither is logged.
* ``X_i`` (dx = 4): ``x1 = θ + N(0, 0.6²)`` (prior-score proxy), ``x2 = 0.5 θ + N(0, 0.8²)`` (pre-test proxy),
  ``x3 ~ N(μx_s, 1)`` (a site-shifted covariate), ``x4 ~ Bernoulli(0.5)`` (a binary covariate).
* Knowledge state ``h_t``: the frozen DKT oracle's LSTM state after the interactions before ``t``;
  ``z_t = head(h_t)`` are its per-item logits.
* ``T_t ∈ {0..49}``: which item the tutor assigns at step ``t`` (the intervenable decision).
* ``Y_t``: correctness, ``P(Y_t = 1 | h_t, T_t = a) = σ(z_t[a] + βθ θ_i + βu u_i)``, realised with the student's
  common random number: ``Y_t = 1[U_it < p_t(a)]``.
* Treatment pathways (both real, both heterogeneous): the assigned item changes the *current* success
  probability (item difficulty vs current mastery, ``z_t[a]``) and *future* mastery through the LSTM update
  ``h_{t+1} = LSTM(h_t, emb(a, Y_t))`` (practice).
* ``A_t`` (da = 1): the normalised step index ``t / (L − 1)``. It is exogenous - not affected by any action,
  and lengths are drawn independently of actions - so a simulator may replay logged future context in rollouts.
* Lengths ``L_i ~ Uniform{min_len..L}`` (default ``min_len = ⌈L/2⌉``), independent of treatment; ``M`` marks the prefix.
* Logging policy: :mod:`.behaviour` (time-varying confounding of strength γ, a propensity floor ε, true
  propensities logged as ``P``).
* Noise: :mod:`.noise` (common random numbers; replaying the logged actions with ``U`` reproduces the logged
  outcomes exactly, float64 throughout). Ground truth is reported as *expected* probabilities averaged over rollouts.

Modules, one job each:

- :mod:`.oracle`: the frozen DKT oracle (network, checksummed loading, training recipe);
- :mod:`.config`: ``DKTSynthConfig`` and ``PRESETS``;
- :mod:`.noise`: the per-student and counter-based random numbers;
- :mod:`.behaviour`: the logging policy and its propensities;
- :mod:`.truth`: the ground-truth kernels (do-probabilities, regimes, policy values, replay);
- :mod:`.generation`: ``generate(cfg) -> DKTSynthWorld``;
- :mod:`.world`: ``DKTSynthWorld``, the object the rest of the code uses (``outcome_probs_do``, ``true_effects``,
  ``true_policy_value``, ``replay_logged``, ``logging_propensities``, ``describe``).

What DKT-Synth shares with the tumour world (the config's common fields and checks, the common-random-number
plumbing, sites, lengths and splits, and the ground-truth interface with its validation and batching) is written
once in :mod:`fcd_secure.data.worlds`; these modules hold DKT-Synth's own mechanism.
"""

from fcd_secure.data.dkt_synth.config import PRESETS, DKTSynthConfig
from fcd_secure.data.dkt_synth.generation import generate
from fcd_secure.data.dkt_synth.oracle import (
    N_ITEMS,
    DKTOracle,
    OracleChecksumError,
    load_oracle,
)
from fcd_secure.data.dkt_synth.world import DKTSynthWorld

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

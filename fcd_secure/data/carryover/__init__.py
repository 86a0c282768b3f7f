"""The carry-over world: a generated clinic whose treatment helps at first and harms when held, so that the order of
treatment regimens at one step is not their order over 30 steps; federated over sites, with exact ground truth for
any treatment sequence (issue 42 item 6).

A third oracle beside DKT-Synth (:mod:`fcd_secure.data.dkt_synth`) and the tumour world (:mod:`fcd_secure.data.tumour`),
built the same way (:mod:`fcd_secure.data.worlds`), with one difference that is its purpose: **the confounding is
through the recorded history only**. The clinic's decision reads the recorded severity and toxicity, the previous
action and the site, nothing hidden, and every action keeps probability ≥ ε = 2 % at every step; so sequential
exchangeability and per-step positivity hold, and the value of every regimen over the whole trajectory is identified
by the g-formula (Robins 1986) even where the product of 30 weights has no effective sample.

Structural model (one patient ``i`` at site ``s``; everything but X, A, T, Y, M, P is known to the simulator only)
-------------------------------------------------------------------------------------------------------------
* Site ``s``: a case mix (a shift of the log untreated severity) and a practice (its own treatment logit shift).
* ``X_i`` (dx = 2): the recorded frailty and response marker, proxies of the toxicity and the benefit per dose.
* Hidden: the untreated severity level μ_i, the benefit per dose r_i, the toxicity per dose κ_i, the baseline b_i.
* ``A_t`` (da = 2): severity S_t and toxicity K_t recorded on the morning of step t. Both **endogenous**.
* ``T_t ∈ {0: none, 1: treat}``.
* Dynamics and outcome: :mod:`.model` (the benefit of a dose persists, toxicity builds up and harms through its
  square; ``Y_t`` = a good step, its probability exact).
* Lengths ``L_i ~ Uniform{min_len..L}``, independent of treatment.
* Logging policy: :mod:`.behaviour`; true propensities logged as ``P`` with a floor ε.
* Noise: :mod:`.noise` (replaying the logged actions reproduces the logged outcomes and contexts bit for bit).

Modules, one job each: :mod:`.model` (the dynamics), :mod:`.config` (``CarryoverConfig``, ``PRESETS``),
:mod:`.noise`, :mod:`.behaviour`, :mod:`.truth` (the ground-truth kernels), :mod:`.generation`
(``generate(cfg) -> CarryoverWorld``), :mod:`.world` (``CarryoverWorld``).
"""

from fcd_secure.data.carryover.config import PRESETS, CarryoverConfig
from fcd_secure.data.carryover.generation import generate
from fcd_secure.data.carryover.model import ACTION_LABELS, CONTEXT_NAMES, N_ACTIONS
from fcd_secure.data.carryover.world import CarryoverWorld

__all__ = ["ACTION_LABELS", "CONTEXT_NAMES", "N_ACTIONS", "PRESETS", "CarryoverConfig", "CarryoverWorld", "generate"]

"""The logging (behaviour) policy π_b of the tumour world: the clinic's choice among the four actions.

As in RMSN/CRN/CT, chemotherapy and radiotherapy are each given with a probability that follows the patient's
recent mean tumour diameter ``D̄_t`` (the mean of the last ``window`` = 15 daily diameters, today's included)::

    p_k(t) = σ( γ / D_max · (D̄_t − D_max / 2) + b_k + b_{s,k} ),     k ∈ {chemo, radio},   D_max = 13 cm

γ is the confounding strength (γ = 0: assignment ignores the history). Because the diameter both drives the
decision and is driven by past treatment and drives future outcomes, it is a time-varying confounder. ``b_k`` is a
global logit shift (chemotherapy is more common than radiotherapy, so that "none" and "chemo" are the two actions
with the most support, the anchors of the paper's four policies) and ``b_{s,k}`` a site's own practice.

The two decisions are independent given the history, so the four actions (none, chemo, radio, both) have
probabilities ``(1 − p_c)(1 − p_r), p_c (1 − p_r), (1 − p_c) p_r, p_c p_r``; with the floor ε every action keeps
propensity ≥ ε: ``π_b = (1 − 4ε) · q + ε``. The logged ``P`` is the true propensity of the taken action.

Deviation: CRN's loop averages the 15 diameters *before* day t; here today's diameter is included, because A_t is
observed before the day's decision (it also defines day 0, where CRN assigns nothing).
"""

from __future__ import annotations

import numpy as np

from fcd_secure.data.tumour.config import TumourConfig
from fcd_secure.data.tumour.pkpd import D_MAX, N_ACTIONS

__all__ = ["action_probs", "recent_mean"]


def recent_mean(diameters: np.ndarray, window: int) -> np.ndarray:
    """``D̄_t``: the mean of the last ``window`` columns of ``diameters`` ``[B, t+1]`` (fewer at the start)."""
    return diameters[:, -window:].mean(axis=1)


def action_probs(cfg: TumourConfig, dbar: np.ndarray, site_chemo: np.ndarray, site_radio: np.ndarray) -> np.ndarray:
    """π_b(· | history) over the four actions (module docstring).

    Args:
        cfg: The world's config (γ, ε, the global shifts).
        dbar: ``D̄_t`` per row ``[B]`` (cm).
        site_chemo: ``b_{s,chemo}`` of each row's site ``[B]``.
        site_radio: ``b_{s,radio}`` of each row's site ``[B]``.

    Returns:
        float64 ``[B, 4]``; each row sums to 1.
    """
    lin = cfg.gamma / D_MAX * (dbar - D_MAX / 2.0)
    pc = 1.0 / (1.0 + np.exp(-(lin + cfg.chemo_bias + site_chemo)))
    pr = 1.0 / (1.0 + np.exp(-(lin + cfg.radio_bias + site_radio)))
    q = np.stack([(1 - pc) * (1 - pr), pc * (1 - pr), (1 - pc) * pr, pc * pr], axis=1)
    return (1.0 - N_ACTIONS * cfg.epsilon) * q + cfg.epsilon

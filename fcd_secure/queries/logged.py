"""What a policy does on a site's *logged* rows: the probability it gives each logged action, and how much of it the
logs follow. Both read the site's own rows (and, for a stochastic policy, its logged propensities) and never leave it;
the question budget (``queries.budget``), the support and every importance weight (``queries.policy_terms``) read
them."""

from __future__ import annotations

import numpy as np

from fcd_secure.data.policy import Policy
from fcd_secure.data.schema import SiteDataset
from fcd_secure.queries.incremental import incremental_target_probs

__all__ = ["logged_support", "target_probs"]


def target_probs(pol: Policy, sub: SiteDataset, a_off: int, a_on: int) -> np.ndarray:
    """π(logged a_t | logged history) at every step of the site's rows, ``[n, L]`` (a stochastic policy's from the
    logged propensities, :func:`~fcd_secure.queries.incremental.incremental_target_probs`)."""
    if pol.stochastic:
        return incremental_target_probs(pol, sub, (a_off, a_on))[0]
    lengths = sub.lengths
    ctx = (lambda t: {"context": sub.A[:, : t + 1]}) if pol.needs_context else (lambda t: {})
    return np.stack([pol.prob(t, sub.Y[:, :t], lengths, a_off, a_on, sub.T[:, t], **ctx(t)) for t in range(sub.L)],
                    axis=1)


def logged_support(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, horizon: int,
                   pi: np.ndarray | None = None) -> np.ndarray:
    """Each entity's share of its valid steps within the first ``horizon`` whose logged actions π could have taken
    at every step so far (π(a_s | h_s) > 0 for all s ≤ t): how much of π the site's logs show, ``[n]``. It needs
    no propensities (the doubly robust ``support`` is the same share where the weights are positive)."""
    H = min(int(horizon), sub.L)
    valid = sub.M[:, :H] > 0
    if pol.stochastic:  # q > 0 wherever π_b > 0, but for a share of 1 ("always k") at a logged a_t ≠ k
        takes = pol.rule.takes(sub.T[:, :H] == pol.shifted_action(a_off, a_on))
    else:
        takes = (target_probs(pol, sub, a_off, a_on) if pi is None else pi)[:, :H] > 0
    follows = np.cumprod(np.where(valid, takes, True), axis=1).astype(bool)
    return (valid & follows).sum(axis=1) / np.maximum(valid.sum(axis=1), 1)

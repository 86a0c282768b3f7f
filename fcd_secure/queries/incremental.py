"""Stochastic policies on a site: the logging-policy model they act through and their importance weights on the
logged steps (the rules are ``data.policy``'s ``kind = "incremental"`` and ``kind = "share"``).

An incremental policy q multiplies the odds of action k by δ (Kennedy 2019, "Nonparametric causal effects based on
incremental propensity score interventions", JASA 114:645-656). Unlike a deterministic policy it keeps every logged
step in play: its weight at a logged step is q(a_t | h_t) / P_t = δ / (δπ_k + 1 − π_k) where a_t = k and
1 / (δπ_k + 1 − π_k) elsewhere, never 0, so its doubly robust value stays supported over many more steps (the weight
products of δ near 1 stay near 1; δ = 1 weighs every step by 1 and the value is the observed mean).

**Where π_k(h_t) comes from** (:func:`incremental_target_probs`): the logs give it exactly where a_t = k (π_k = P_t)
and, for data with two actions, everywhere (π_k = 1 − P_t where a_t ≠ k); elsewhere (a_t ≠ k among more actions) the
site's own model of its logging policy gives it (``evaluation.propensity.HistoryPropensity``, fit on its training
rows, kept on the site), capped at 1 − P_t (the probabilities of a_t and k cannot sum past 1). The counts of each
source are sent as sums (``whatif.pik.<π>.logged`` / ``.model``) and printed with the answer. DKT-Synth (50 items) and
the tumour world (4 actions) both take the model at a_t ≠ k.

**Simulated histories** (the direct-method term: the simulator's rollout under q): the policy draws its actions from
q built on the same site model's π̂(· | simulated history), with a seeded generator (``Policy.with_behaviour``). The
doubly robust value stays consistent when that model is wrong as long as the weights (the logged P where a_t = k)
are right; at a_t ≠ k the weight rests on π̂_k, so an error there is a bias the interval does not show (stated in
the output as the share of steps whose π_k was modelled). An oracle (DKT-Synth, tumour) rolls the policy out on the
world's *true* logging probabilities for its truth.

**Limit**: where the logging policy reads what the record does not hold (DKT-Synth's tutor reads a student's hidden
readiness), π̂_k(h) is the population's level, not the entity's, and the weights at a_t ≠ k are biased; the intervals
then miss (measured in ``benchmarks/incremental.py``; figures in ``docs/whatif.md``). On data whose logging policy reads
only the record the weights are right (the known-answer tests).

**Share policies** (``kind = "share"``; Díaz, Williams, Hoffman & Schenck 2023, JASA 118:846-857: the modified
treatment policy that replaces the natural value of treatment by k with probability s): q = (1 − s)π + s·1{a = k}.
The weight at a logged step is 1 − s + s / P_t where a_t = k and 1 − s elsewhere: the logged propensity of the logged
action is all it reads, for any number of actions, so no π_k is modelled (every step counts as ``logged`` in the
sums, and ``fcd whatif`` says "from the logged propensities alone"). The site's model still drives the simulator's
rollout under q, the direct-method term, which sets the variance of the doubly robust value, not its bias
(``queries.doubly_robust``: Q̂ = V̂, E[w_t | h_t] = 1 for exact weights). What it needs instead is positivity of k: where the
logging policy almost never gives k the share policy still does, the log hardly shows it, and the DR value leans on
the simulator there; the identified horizons' ``weight_mean`` (Σw/n, 1 in expectation) shows how much of q the sample reached.
"""

from __future__ import annotations

import numpy as np

from fcd_secure.data.policy import Policy
from fcd_secure.data.schema import SiteDataset

__all__ = ["PIK_FIELDS", "attach_behaviour", "incremental_target_probs"]

#: the sums of where π_k came from: the logged propensity, or the site's model
PIK_FIELDS = ("logged", "model")
#: the smallest π_k a model may give (a weight 1 / (1 − π_k) stays finite for δ → 0)
PI_FLOOR = 1e-6


def attach_behaviour(policies: list, train: SiteDataset, seed: int) -> list:
    """``policies`` with every stochastic one (``incremental``, ``share``) bound to the site's logging-policy model
    (fit once, on ``train``, only when some policy needs it: their rollouts act through it); the others as they
    are."""
    from fcd_secure.evaluation.propensity import HistoryPropensity  # noqa: PLC0415

    if not any(isinstance(p, Policy) and p.stochastic for p in policies):
        return policies
    model = HistoryPropensity(train.n_actions, train.da).fit(train)
    return [p.with_behaviour(model, seed) if isinstance(p, Policy) and p.stochastic else p for p in policies]


def incremental_target_probs(pol: Policy, sub: SiteDataset, anchors: tuple[int, int]
                             ) -> tuple[np.ndarray, dict[str, float]]:
    """q(logged a_t | h_t) of a stochastic policy (``incremental`` or ``share``) at every step of ``sub`` as P_t times
    the rule's ratio q / π (module docstring), ``[n, L]`` (0 on padding), so that the estimators' weight q / P is the
    ratio itself; and the counts of valid steps whose π_k was logged or modelled (a share policy needs no π_k: every
    step counts as logged, its weight being read off the logged P of the logged action).

    Raises:
        ValueError: ``sub`` has no logged propensities, or π_k must be modelled and the policy has no model bound.
    """
    if sub.P is None:
        raise ValueError(f"{sub.name}: a stochastic policy's weights need the logged propensities")
    a_off, a_on = anchors
    k = pol.shifted_action(a_off, a_on)
    rule = pol.rule
    valid = sub.M > 0
    P = np.where(valid, np.asarray(sub.P, dtype=np.float64), 1.0)
    is_k = sub.T == k
    pi_k = None
    modelled = np.zeros_like(valid)
    if not rule.needs_pi_k:
        pass  # the share policy: q / P = 1 − s + s / P_t or 1 − s, from the log alone
    elif sub.n_actions == 2:
        pi_k = np.where(is_k, P, 1.0 - P)
    else:
        modelled = valid & ~is_k
        pi_k = P.copy()
        if modelled.any():
            if pol.behaviour is None:
                raise ValueError(f"policy {pol.name!r}: pi_k at logged actions other than {k} needs the site's "
                                 "logging-policy model (attach_behaviour)")
            for t in np.flatnonzero(modelled.any(0)):
                rows = modelled[:, t]
                hat = pol.behaviour(int(t), sub.Y[rows, :t], sub.lengths[rows], sub.A[rows, : t + 1])[:, k]
                pi_k[rows, t] = np.clip(hat, PI_FLOOR, 1.0 - P[rows, t])
    pi = np.where(valid, P * rule.ratio(P, pi_k, is_k), 0.0)
    return pi, {"logged": float((valid & ~modelled).sum()), "model": float(modelled.sum())}

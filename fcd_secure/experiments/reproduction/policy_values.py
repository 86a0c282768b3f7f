"""Fig. 2's policy values: a step-wise doubly robust estimate of each target policy on every dataset.

The federated evaluation reports per-decision DR over whole trajectories (and over the first ``ope_horizon`` steps),
whose weights w_{0:t} = Π π/μ vanish for a deterministic policy once one logged action disagrees with it: on every
dataset here the four policies then have little or no logged support, and Diabetes-130 and Statics2011 log no
propensities at all. Fig. 2 therefore also reports the **step-wise DR** (each step a contextual-bandit decision with
the logged history as its context — the setting of OpenBandit, paper ref. [31]; Dudík et al. 2011's DR):

    V̂(π) = Σ_{i,t} M_it [ q̂(h_it, π_it) + 1{a_it = π_it} / μ_it · (r_it − q̂(h_it, a_it)) ] / Σ_{i,t} M_it,

with π_it the policy's action given the logged history, q̂(h, a) the simulator's one-step E[Y_t | logged history
before t, A_t, do(T_t = a)] (its rollout of one step from t), and μ_it the behaviour propensity of the logged action.
Its estimand is the mean outcome when each logged decision is replaced by π's (not the value of following π from
t = 0), on the per-step scale of the paper's policy values.

μ is the logged propensity where the data log one (DKT-Synth, OpenBandit). Elsewhere it is *estimated on the site*:
a softmax regression of the logged action, in three classes {a_off, a_on, any other}, on the decision-time features
of :func:`fcd_secure.evaluation.tstr.step_features` (without the action), fitted on the site's training split and
applied to its test split (only the two anchor classes enter the estimate). Every site computes its sums from its
own data and the sums are pooled, as a site's evaluation sums are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fcd_secure.data.schema import SiteDataset
from fcd_secure.evaluation.tstr import step_features

__all__ = ["anchor_propensities", "one_step_values", "stepwise_dr_sums"]

_L2 = 1e-3
_MIN_MU = 1e-3


def _valid(ds: SiteDataset) -> tuple[np.ndarray, np.ndarray]:
    return np.nonzero(ds.M > 0)


def anchor_propensities(train: SiteDataset, test: SiteDataset, anchors: tuple[int, int]) -> np.ndarray:
    """Estimated μ(a_it | h_it) of the test split's logged actions for a_it ∈ anchors (1 elsewhere), ``[n, L]``.

    A three-class softmax regression (a_off, a_on, other) with an L2 penalty, fitted by L-BFGS on the training split's
    valid steps (deterministic); probabilities are floored at 1e-3.
    """
    a_off, a_on = anchors

    def design(ds: SiteDataset, mean=None, sd=None):
        F, _, _ = step_features(ds)
        if mean is None:
            mean, sd = F.mean(0), F.std(0)
            sd = np.where(sd > 1e-12, sd, 1.0)
        Z = (F - mean) / sd
        return torch.as_tensor(np.concatenate([np.ones((len(Z), 1)), Z], 1), dtype=torch.float64), mean, sd

    def classes(ds: SiteDataset) -> torch.Tensor:
        i, t = _valid(ds)
        a = ds.T[i, t]
        return torch.as_tensor(np.where(a == a_off, 0, np.where(a == a_on, 1, 2)), dtype=torch.long)

    D, mean, sd = design(train)
    y = classes(train)
    W = torch.zeros(D.shape[1], 3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W], lr=1.0, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(D @ W, y) + _L2 * (W[1:] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    Dt, _, _ = design(test, mean, sd)
    with torch.no_grad():
        probs = torch.softmax(Dt @ W, -1).numpy()
    i, t = _valid(test)
    a = test.T[i, t]
    mu = np.ones(test.M.shape)
    mu[i, t] = np.where(a == a_off, probs[:, 0], np.where(a == a_on, probs[:, 1], 1.0))
    return np.maximum(mu, _MIN_MU)


def one_step_values(simulate, ds: SiteDataset, action: int, n_samples: int, seed: int) -> np.ndarray:
    """q̂(h_it, a): the simulator's E[Y_t | logged history before t, do(T_t = action)] at every step, ``[n, L]``."""
    out = np.zeros(ds.M.shape)
    for t in range(ds.L):
        if not (ds.M[:, t] > 0).any():
            break
        out[:, t] = simulate(ds, int(action), n_samples, seed, start_t=t, horizon=1).probs[:, :, 0].mean(1)
    return out


def stepwise_dr_sums(
    simulate,
    factual: np.ndarray,
    train: SiteDataset,
    test: SiteDataset,
    policies: Sequence[Any],
    anchors: tuple[int, int],
    n_samples: int,
    seed: int,
) -> dict[str, Any]:
    """One site's sums of the step-wise DR (module docstring) for each policy.

    Args:
        simulate: the site's model's ``simulate``.
        factual: its ``factual_probs(test)`` (q̂ of the logged actions).
        train: the site's training split (the behaviour model where no propensities are logged).
        test: the site's test split.
        policies: target policies (``name``, ``actions(t, y_hist, lengths, a_off, a_on)``).
        anchors: ``(a_off, a_on)``.
        n_samples: rollouts per one-step value.
        seed: seed of the rollouts.

    Returns:
        ``{"steps": Σ M, "logged_propensities": bool, "<policy>": {"sum": Σ M·DR, "matched": #steps where the logged
        action is π's}}``.
    """
    a_off, a_on = anchors
    if test.P is not None:
        mu = np.where(test.M > 0, np.maximum(test.P.astype(np.float64), _MIN_MU), 1.0)
    else:
        mu = anchor_propensities(train, test, anchors)
    q_off = one_step_values(simulate, test, a_off, n_samples, seed)
    q_on = one_step_values(simulate, test, a_on, n_samples, seed)
    M = test.M > 0
    r = test.Y.astype(np.float64)
    out: dict[str, Any] = {"steps": float(M.sum()), "logged_propensities": test.P is not None}
    for pol in policies:
        act = np.stack([np.asarray(pol.actions(t, test.Y[:, :t], test.lengths, a_off, a_on)) for t in range(test.L)], 1)
        v = np.where(act == a_on, q_on, q_off)
        match = (test.T == act) & M
        dr = v + match / mu * (r - factual)
        out[pol.name] = {"sum": float((dr * M).sum()), "matched": float(match.sum())}
    return out

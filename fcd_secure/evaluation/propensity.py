"""A site's own model of its logging policy, π̂(a | h_t): what an incremental propensity intervention acts through
where the logs do not give the logging probability it needs.

An incremental policy (``data.policy``, ``kind = "incremental"``; Kennedy 2019, JASA 114:645-656) multiplies the
odds of one action k by δ. Its importance weight at a logged step needs π_k(h_t), the logging probability of k at that
history: the logged propensity P_t gives it exactly where a_t = k (and, with two actions, 1 − P_t elsewhere); at a
logged a_t ≠ k among more actions, and on every *simulated* history of a rollout, it has to be modelled. A share
policy (``kind = "share"``) needs it only on the simulated histories: its weights are read off the logged propensity
of the logged action, so there the model sets the variance of the doubly robust value, not its bias.

:class:`HistoryPropensity` is a multinomial logistic regression over the actions on a few features of the history
known at decision time (:func:`history_features`: t, the last outcome, the mean of the last three and of all outcomes
so far, and the contexts at t), with an L2 penalty, fit by L-BFGS on the valid steps of the site's training rows. The
problem is convex and starts at zero, so the fit is deterministic. It is fit and used on the site: its coefficients,
like the propensities it is fit on, never leave it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax

from fcd_secure.data.schema import SiteDataset

__all__ = ["PROPENSITY_FLOOR", "HistoryPropensity", "RecordPropensity", "history_features"]

#: the smallest estimated propensity used as a weight's denominator; steps below it are counted (the overlap check)
PROPENSITY_FLOOR = 0.005
#: steps per unit of the time feature (t / T_SCALE): keeps it on the scale of the outcome features
T_SCALE = 20.0


def history_features(t: int, y_hist: np.ndarray, lengths: np.ndarray, context: np.ndarray | None,
                     da: int) -> np.ndarray:
    """The features of the histories of B rows at step ``t``, ``[B, 5 + da]``: t / 20, whether any outcome is known,
    the last outcome, the mean of the last three and of all outcomes before t (0 without history), and the contexts
    at t (``context[:, -1]``; zeros without). ``y_hist`` holds the outcomes before t, most recent last (a rollout's
    simulated ones, or the logged ``Y[:, :t]``)."""
    B = len(lengths)
    y = np.asarray(y_hist, dtype=np.float64).reshape(B, -1)
    has = y.shape[1] > 0
    last = y[:, -1] if has else np.zeros(B)
    recent = y[:, -3:].mean(1) if has else np.zeros(B)
    mean = y.mean(1) if has else np.zeros(B)
    ctx = (np.asarray(context, dtype=np.float64).reshape(B, -1, da)[:, -1] if context is not None and da
           else np.zeros((B, da)))
    base = np.stack([np.full(B, t / T_SCALE), np.full(B, float(has)), last, recent, mean], axis=1)
    return np.concatenate([base, ctx], axis=1)


class HistoryPropensity:
    """π̂(a | h_t): multinomial logistic regression on :func:`history_features` (module docstring).

    Args:
        n_actions: K, the size of the action set.
        da: context columns.
        l2: the penalty on the coefficients (not on the intercepts), per training step.
        max_iter: the most L-BFGS iterations of :meth:`fit`.
    """

    def __init__(self, n_actions: int, da: int, l2: float = 1e-3, max_iter: int = 500) -> None:
        self.n_actions, self.da, self.l2 = int(n_actions), int(da), float(l2)
        self.max_iter = int(max_iter)  # L-BFGS iterations at most (fewer: a cheaper, more shrunk fit)
        self.coef: np.ndarray | None = None  # [F + 1, K], the first row the intercepts
        self.mean: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    def _design(self, F: np.ndarray) -> np.ndarray:
        return np.concatenate([np.ones((len(F), 1)), (F - self.mean) / self.scale], axis=1)

    def fit(self, ds: SiteDataset) -> "HistoryPropensity":
        """Fit on every valid step of ``ds`` (the site's training rows).

        Raises:
            ValueError: ``ds`` has no valid step, or its dimensions differ from the model's.
        """
        if ds.n_actions != self.n_actions or ds.da != self.da:
            raise ValueError(f"{ds.name}: {ds.n_actions} actions and {ds.da} contexts, the model has "
                             f"{self.n_actions} and {self.da}")
        feats, acts = [], []
        for t in range(ds.L):
            v = ds.M[:, t] > 0
            if v.any():
                feats.append(self._step_features(ds, v, t))
                acts.append(ds.T[v, t])
        if not feats:
            raise ValueError(f"{ds.name}: no valid step to fit a propensity model on")
        F, a = np.concatenate(feats), np.concatenate(acts).astype(np.int64)
        self.mean, sd = F.mean(0), F.std(0)
        self.scale = np.where(sd > 1e-9, sd, 1.0)
        X = self._design(F)
        n, d, K = len(X), X.shape[1], self.n_actions
        onehot = np.zeros((n, K))
        onehot[np.arange(n), a] = 1.0
        pen = np.ones((d, 1))
        pen[0] = 0.0

        def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
            W = w.reshape(d, K)
            lp = log_softmax(X @ W, axis=1)
            nll = -(onehot * lp).sum() / n + 0.5 * self.l2 * (pen * W * W).sum()
            grad = X.T @ (np.exp(lp) - onehot) / n + self.l2 * pen * W
            return float(nll), grad.ravel()

        res = minimize(loss, np.zeros(d * K), jac=True, method="L-BFGS-B", options={"maxiter": self.max_iter})
        self.coef = res.x.reshape(d, K)
        return self

    def _step_features(self, ds: SiteDataset, rows: np.ndarray, t: int) -> np.ndarray:
        """The features of ``rows`` of ``ds`` at step ``t`` (:func:`history_features`)."""
        return history_features(t, ds.Y[rows, :t], ds.lengths[rows], ds.A[rows, : t + 1], self.da)

    def probs(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        """π̂(· | h_t) of B rows, ``[B, K]`` (the signature a bound incremental policy calls).

        Raises:
            RuntimeError: before :meth:`fit`.
        """
        if self.coef is None:
            raise RuntimeError("HistoryPropensity.probs before fit")
        X = self._design(history_features(t, y_hist, lengths, context, self.da))
        return np.exp(log_softmax(X @ self.coef, axis=1))

    __call__ = probs


class RecordPropensity(HistoryPropensity):
    """P̂(a_t | recorded history): the site's model of its logging policy where its table logs no propensities.

    The same multinomial logistic regression with the whole record a decision could read: the history features, the
    static covariates X and the previous action (one-hot; none at t = 0). Where the logging policy reads only the
    record (sequential exchangeability given the recorded history), P̂ estimates the true assignment probability and
    the doubly robust estimators stay consistent; where it reads something unrecorded (a hidden confounder), no model
    of the record can recover it and the answers say so (their assumptions).

    Fit on the site's training rows and applied to its validation and test rows only (:meth:`logged_probs`), so no
    row's propensity comes from a model fitted on it (cross-fitting by the site's own split; Chernozhukov et al.
    2018, "Double/debiased machine learning", Econometrics Journal 21(1)). Its coefficients never leave the site.
    """

    def __init__(self, n_actions: int, da: int, dx: int, l2: float = 1e-2) -> None:
        # a larger penalty than the history model's: with the record's features (statics, the previous action one-hot)
        # a small site's training rows over-fit at 1e-3 (DKT-Synth tiny, 15 students: calibration error 0.025, half
        # the test steps below the floor; 0.015 and 0.38 at 1e-2)
        super().__init__(n_actions, da, l2)
        self.dx = int(dx)

    def _step_features(self, ds: SiteDataset, rows: np.ndarray, t: int) -> np.ndarray:
        prev = np.zeros((int(np.count_nonzero(rows) if rows.dtype == bool else len(rows)), self.n_actions))
        if t > 0:
            prev[np.arange(len(prev)), ds.T[rows, t - 1].astype(np.int64)] = 1.0
        X = np.asarray(ds.X[rows], dtype=np.float64).reshape(len(prev), -1)
        return np.concatenate([super()._step_features(ds, rows, t), X, prev], axis=1)

    def logged_probs(self, ds: SiteDataset) -> np.ndarray:
        """P̂(logged a_t | recorded history) at every step of ``ds``, ``[n, L]`` (1 on padding, as logged P)."""
        if self.coef is None:
            raise RuntimeError("RecordPropensity.logged_probs before fit")
        out = np.ones((ds.n, ds.L))
        for t in range(ds.L):
            v = ds.M[:, t] > 0
            if v.any():
                lp = log_softmax(self._design(self._step_features(ds, v, t)) @ self.coef, axis=1)
                out[v, t] = np.exp(lp[np.arange(int(v.sum())), ds.T[v, t].astype(np.int64)])
        return out

    def calibration(self, ds: SiteDataset, bins: int = 10) -> np.ndarray:
        """Reliability sums of π̂ on ``ds`` (rows it was not fitted on), per row, ``[n, 3, bins]``: over the row's
        valid steps and every action, in ``bins`` equal bins of the predicted probability, the count, Σ π̂ and how many
        were the logged action. A calibrated model's mean prediction equals the observed share in every bin
        (Niculescu-Mizil & Caruana 2005, "Predicting good probabilities with supervised learning", ICML); the sums add
        up over rows and sites."""
        out = np.zeros((ds.n, 3, bins))
        for t in range(ds.L):
            v = np.flatnonzero(ds.M[:, t] > 0)
            if not v.size:
                continue
            probs = np.exp(log_softmax(self._design(self._step_features(ds, v, t)) @ self.coef, axis=1))
            hit = np.zeros_like(probs)
            hit[np.arange(len(v)), ds.T[v, t].astype(np.int64)] = 1.0
            k = np.minimum((probs * bins).astype(np.int64), bins - 1)
            for j, w in enumerate((np.ones_like(probs), probs, hit)):
                np.add.at(out, (np.repeat(v, probs.shape[1]), j, k.ravel()), w.ravel())
        return out

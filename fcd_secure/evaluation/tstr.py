"""Train-on-synthetic, test-on-real (TSTR) utility (paper §IV-C "Metrics", Table IV; Esteban et al. 2017).

One *fixed* predictor g is used for every generator, so that TSTR numbers compare generators and not tuning
effort (RCGAN's protocol, Esteban et al. 2017, paper ref. [32]); TRTR (train-real-test-real) with the same g is the
ceiling and callers print it next to TSTR.

The predictor, :class:`StepPredictor`, predicts the outcome Y_t of every valid step (M = 1) from features known at
decision time t:

* X (static covariates), A_t (time-varying context), the action T_t as a one-hot over min(n_actions, 32) buckets
  (with more than 32 actions, ids are hashed into the buckets with Knuth's fixed multiplicative hash, top bits;
  :func:`action_bucket`), so no embedding has to be learned;
* Y_{t−1} (0 at t = 0), the running mean of Y_{<t} (0 at t = 0), a first-step indicator and the position t.

Continuous features are standardised with the *training* set's mean and s.d. If the real test outcomes are binary,
g is an L2-regularised logistic regression (soft labels in [0, 1] are allowed for training, so a generator may emit
probabilities) fitted by a fixed number of damped Newton (IRLS) steps; otherwise g is ridge regression in closed
form. No randomness is involved: the same data give the same numbers.

The synthetic training set of a simulator is :func:`synthesize`: the real trajectories' X, A, actions and valid-step
mask, with outcomes drawn by the simulator under the *logged* actions (one draw per trajectory), so that synthetic and
real sets differ only in how Y was generated (as many as the real training set, from the same X distribution: Esteban et al.
2017, TSTR; Yoon et al. 2019, TimeGAN).

Reported: ``auc`` (rank AUC of the predicted probability on real binary Y, pooled over valid steps; NaN for
continuous Y) and ``rmse`` (√ mean (ŷ − y)² over valid steps — the probability RMSE for binary Y).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fcd_secure.data.schema import SiteDataset
from fcd_secure.evaluation.metrics import factual_auc, rmse

__all__ = ["StepPredictor", "action_bucket", "step_features", "synthesize", "tstr", "trtr", "utility_report"]

_BUCKET_BITS = 5
_MAX_ACTION_BUCKETS = 1 << _BUCKET_BITS  # 32; a power of two, so the hash's top bits index a bucket
_KNUTH = 2654435761  # ⌊2^32/φ⌋, odd
_RIDGE = 1e-4  # on the mean loss over standardised features: enough to keep separable data finite
_NEWTON_STEPS = 30


def _action_buckets(n_actions: int) -> int:
    return min(n_actions, _MAX_ACTION_BUCKETS)


def action_bucket(T: np.ndarray, n_actions: int) -> np.ndarray:
    """Bucket of each action id (int64, same shape): the id itself when ``n_actions <= 32``, else a hash into 32.

    The hash is Knuth's multiplicative one, fixed and seed-free: the *top* 5 bits of ``(id · 2654435761) mod 2^32``.
    Its low bits would not do: with an odd multiplier they are a permutation of ``id mod 32``, so ids 32 apart (0,
    32, 64, ...) would always share a bucket, which is no hashing at all.
    """
    T = np.asarray(T)
    if n_actions <= _MAX_ACTION_BUCKETS:
        return T.astype(np.int64)
    h = (T.astype(np.uint64) * np.uint64(_KNUTH)) % np.uint64(2**32)
    return (h >> np.uint64(32 - _BUCKET_BITS)).astype(np.int64)


def step_features(ds: SiteDataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-step design matrix of the valid steps of ``ds``.

    Returns ``(F_cont [rows, k], F_onehot [rows, B], y [rows])`` with rows ordered by (trajectory, step).
    """
    n, L = ds.n, ds.L
    valid = ds.M > 0
    Y = ds.Y.astype(np.float64) * valid
    prev = np.zeros_like(Y)
    prev[:, 1:] = Y[:, :-1]
    cum = np.cumsum(Y, axis=1)
    past_sum = np.zeros_like(Y)
    past_sum[:, 1:] = cum[:, :-1]
    t_idx = np.broadcast_to(np.arange(L, dtype=np.float64), (n, L))
    past_mean = np.divide(past_sum, t_idx, out=np.zeros_like(Y), where=t_idx > 0)
    first = (t_idx == 0).astype(np.float64)

    rows_i, rows_t = np.nonzero(valid)
    X = ds.X.astype(np.float64)[rows_i]
    A = ds.A.astype(np.float64)[rows_i, rows_t]
    hist = np.stack([prev[rows_i, rows_t], past_mean[rows_i, rows_t], first[rows_i, rows_t], t_idx[rows_i, rows_t]], axis=1)
    F_cont = np.concatenate([X, A, hist], axis=1)

    B = _action_buckets(ds.n_actions)
    bucket = action_bucket(ds.T[rows_i, rows_t], ds.n_actions)
    F_oh = np.zeros((rows_i.size, B))
    F_oh[np.arange(rows_i.size), bucket] = 1.0
    return F_cont, F_oh, Y[rows_i, rows_t]


@dataclass
class StepPredictor:
    """The fixed TSTR predictor g (module docstring). ``binary`` picks logistic (True) or ridge (False)."""

    binary: bool
    mean_: np.ndarray | None = None
    std_: np.ndarray | None = None
    coef_: np.ndarray | None = None

    def _design(self, ds: SiteDataset, fit: bool) -> tuple[np.ndarray, np.ndarray]:
        F_cont, F_oh, y = step_features(ds)
        if fit:
            self.mean_ = F_cont.mean(axis=0)
            sd = F_cont.std(axis=0)
            self.std_ = np.where(sd > 1e-12, sd, 1.0)
        Z = (F_cont - self.mean_) / self.std_
        return np.concatenate([np.ones((Z.shape[0], 1)), Z, F_oh], axis=1), y

    def fit(self, ds: SiteDataset) -> "StepPredictor":
        """Fit on the valid steps of ``ds`` (ridge, or damped-Newton logistic regression).

        Raises:
            ValueError: for the binary task, outcomes outside [0, 1].
        """
        D, y = self._design(ds, fit=True)
        d = D.shape[1]
        reg = np.full(d, _RIDGE)
        reg[0] = 0.0  # the intercept is not shrunk
        m = D.shape[0]
        if not self.binary:
            A = D.T @ D / m + np.diag(reg)
            self.coef_ = np.linalg.solve(A, D.T @ y / m)
            return self
        if (y < 0).any() or (y > 1).any():
            raise ValueError(f"{ds.name}: training outcomes Y must lie in [0, 1] for the binary TSTR task")
        beta = np.zeros(d)

        def loss(b: np.ndarray) -> float:
            z = D @ b
            # mean cross-entropy with soft labels, log(1 + e^z) computed stably
            return float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(reg * b * b))

        cur = loss(beta)
        for _ in range(_NEWTON_STEPS):
            p = 1.0 / (1.0 + np.exp(-(D @ beta)))
            grad = D.T @ (p - y) / m + reg * beta
            H = (D * (p * (1 - p))[:, None]).T @ D / m + np.diag(reg) + 1e-10 * np.eye(d)
            step = np.linalg.solve(H, grad)
            # damped Newton: halve until the loss does not increase (deterministic, bounded)
            t = 1.0
            for _ in range(30):
                cand = beta - t * step
                new = loss(cand)
                if new <= cur:
                    break
                t *= 0.5
            else:
                break
            beta, improved = cand, cur - new
            cur = new
            if improved < 1e-12:
                break
        self.coef_ = beta
        return self

    def predict(self, ds: SiteDataset) -> tuple[np.ndarray, np.ndarray]:
        """Predictions ŷ and targets y for the valid steps of ``ds`` (probabilities if ``binary``)."""
        if self.coef_ is None:
            raise RuntimeError("StepPredictor.predict called before fit")
        D, y = self._design(ds, fit=False)
        if D.shape[1] != self.coef_.size:
            raise ValueError(f"{ds.name}: feature layout differs from the training set ({D.shape[1]} vs {self.coef_.size} columns)")
        z = D @ self.coef_
        return (1.0 / (1.0 + np.exp(-z)) if self.binary else z), y


def _check_layout(train: SiteDataset, test: SiteDataset) -> None:
    for field in ("dx", "da", "n_actions"):
        a, b = getattr(train, field), getattr(test, field)
        if a != b:
            raise ValueError(f"TSTR: {field} of {train.name} ({a}) differs from {field} of {test.name} ({b})")


def _is_binary(ds: SiteDataset) -> bool:
    return bool(np.isin(ds.Y[ds.M > 0], (0.0, 1.0)).all())


def _train_test(train: SiteDataset, test: SiteDataset) -> dict[str, float]:
    _check_layout(train, test)
    binary = _is_binary(test)
    g = StepPredictor(binary=binary).fit(train)
    y_hat, y = g.predict(test)
    out = {"auc": float("nan"), "rmse": rmse(y_hat, y), "n_train": int(train.M.sum()), "n_test": int(y.size)}
    if binary:
        if np.unique(y).size < 2:
            warnings.warn(f"TSTR: {test.name} has a single outcome class on its valid steps; AUC is NaN", stacklevel=3)
        else:
            out["auc"] = factual_auc(y, y_hat)
    return out


def tstr(synthetic: SiteDataset, real_test: SiteDataset) -> dict[str, float]:
    """TSTR (paper Table IV): train g on ``synthetic`` trajectories, test on ``real_test``.

    Args:
        synthetic: trajectories drawn from a simulator.
        real_test: held-out real trajectories with the same layout.

    Returns:
        ``{"auc", "rmse", "n_train", "n_test"}`` (AUC is NaN for non-binary outcomes or a single class).

    Raises:
        ValueError: if the two layouts (dx, da, n_actions) differ.
    """
    return _train_test(synthetic, real_test)


def trtr(real_train: SiteDataset, real_test: SiteDataset) -> dict[str, float]:
    """The TRTR ceiling: the same g trained on real training trajectories, tested on ``real_test``."""
    return _train_test(real_train, real_test)


def utility_report(synthetic: SiteDataset, real_train: SiteDataset, real_test: SiteDataset) -> dict[str, dict[str, float]]:
    """``{"tstr": tstr(synthetic, real_test), "trtr": trtr(real_train, real_test)}`` for side-by-side printing."""
    return {"tstr": tstr(synthetic, real_test), "trtr": trtr(real_train, real_test)}


def synthesize(simulate: Callable[..., Any], ds: SiteDataset, seed: int) -> SiteDataset:
    """The synthetic counterpart of ``ds``: outcomes drawn by a simulator under the logged actions.

    Args:
        simulate: a simulator's ``simulate(ds, plan, n_samples, seed, start_t=0)`` (``Simulator.simulate``).
        ds: real trajectories (X, A, actions and mask are kept; P is dropped).
        seed: seed of the draw.

    Returns:
        ``ds`` with Y replaced by one simulated draw (0 on padding), named ``<name>-synthetic``.
    """
    res = simulate(ds, ds.T.astype(np.int64), 1, seed, start_t=0)
    y = np.asarray(res.y, dtype=np.float32)[:, 0, :] * (ds.M > 0)
    return replace(ds, Y=y.astype(ds.Y.dtype), P=None, name=f"{ds.name}-synthetic", meta=dict(ds.meta))

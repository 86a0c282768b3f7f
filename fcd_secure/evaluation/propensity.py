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

A consortium may instead fit one behaviour model together (:func:`fit_shared`, the end of this module): the exact
pooled fit of the same objective, by Newton's method on per-site sums that travel only through secure aggregation
(docs/threats.md P67); the sites then use it where they used their own (``federation.learner.with_propensities``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from fcd_secure._io import Kept, arrays_sha256
from fcd_secure.data.schema import SiteDataset
from fcd_secure.errors import FcdError

__all__ = ["MAX_SHARED_COEFS", "PROPENSITY_FLOOR", "SHARED_FIT_LISTS", "SHARED_FIT_SCALARS", "HistoryPropensity",
           "RecordPropensity", "SharedFitError", "SharedFitStep", "check_shared_size", "fit_shared", "history_features",
           "own_intercepts", "shared_fit_sums", "shared_list_caps", "with_own_intercepts"]

#: the smallest estimated propensity used as a weight's denominator; steps below it are counted (the overlap check)
PROPENSITY_FLOOR = 0.005
#: steps per unit of the time feature (t / T_SCALE): keeps it on the scale of the outcome features
T_SCALE = 20.0
#: fitted ``(mean, scale, coef)`` of :meth:`HistoryPropensity.fit_design` by the digest of its settings and data:
#: the sites of a simulated run share one process, each with a few models
_FITS: Kept[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = Kept(64)


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """``scipy.special.log_softmax(x, axis=axis)``, imported at the first call: a ServerApp imports this module with
    the answers' code before its first message and fits nothing until the closing evaluation; the import (with
    ``scipy.optimize`` in :meth:`HistoryPropensity._fit_design`) cost its start 0.5 s of CPU (``python -X importtime``).
    """
    from scipy.special import log_softmax as scipy_log_softmax  # noqa: PLC0415

    return scipy_log_softmax(x, axis=axis)


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

    def training_design(self, ds: SiteDataset) -> tuple[np.ndarray, np.ndarray]:
        """The raw features and the logged actions of every valid step of ``ds``, ``([n, F], [n])``: what :meth:`fit`
        fits on, and what a site's sums for the shared model (:func:`shared_fit_sums`) are taken over.

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
        return np.concatenate(feats), np.concatenate(acts).astype(np.int64)

    def fit(self, ds: SiteDataset) -> "HistoryPropensity":
        """Fit on every valid step of ``ds`` (the site's training rows).

        Raises:
            ValueError: ``ds`` has no valid step, or its dimensions differ from the model's.
        """
        return self.fit_design(*self.training_design(ds))

    def fit_design(self, F: np.ndarray, a: np.ndarray, tol: float | None = None) -> "HistoryPropensity":
        """Fit by L-BFGS on raw features ``F`` and logged actions ``a`` (:meth:`training_design`), z-scored by their
        own mean and standard deviation; ``tol``, where given, is L-BFGS-B's tolerance on the projected gradient and
        on the relative decrease (``gtol``, ``ftol``; scipy's defaults 1e-5 and 2.2e-9 otherwise).

        The fit is a pure function of the model's settings and ``(F, a)`` (a convex problem started at zero), so it
        runs once per process for each: a site asks for the same fit on the same training rows in every evaluation
        round and in several queries of one (the incremental rollouts and the sequential DR's Q-fits,
        ``queries.incremental.attach_behaviour``; the natural course), and each repeat cost a whole L-BFGS run.
        The coefficients are kept by a SHA-256 of the settings and of ``F``'s and ``a``'s dtype, shape and bytes
        (:data:`_FITS`), and each model gets its own copies."""
        settings = repr((type(self).__qualname__, self.n_actions, self.da, self.l2, self.max_iter,
                         getattr(self, "dx", None), tol))
        kept = _FITS.get(arrays_sha256(settings, (F, a)), lambda: self._fit_design(F, a, tol))
        self.mean, self.scale, self.coef = (x.copy() for x in kept)
        return self

    def _fit_design(self, F: np.ndarray, a: np.ndarray, tol: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`fit_design`'s L-BFGS fit: ``(mean, scale, coef)``."""
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

        from scipy.optimize import minimize  # noqa: PLC0415 - at the first fit (log_softmax)

        res = minimize(loss, np.zeros(d * K), jac=True, method="L-BFGS-B",
                       options={"maxiter": self.max_iter, **({} if tol is None else {"gtol": tol, "ftol": tol})})
        self.coef = res.x.reshape(d, K)
        return self.mean, self.scale, self.coef

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

    @staticmethod
    def n_features(n_actions: int, da: int, dx: int) -> int:
        """The features of a step (:meth:`_step_features`): the history's 5 + ``da``, the statics, the previous
        action one-hot."""
        return 5 + int(da) + int(dx) + int(n_actions)

    @classmethod
    def from_shared(cls, n_actions: int, da: int, dx: int, step: "SharedFitStep") -> "RecordPropensity":
        """The consortium's shared model (:func:`fit_shared`) as a site uses it: the pooled z-scoring and the
        coefficients of ``step``.

        Raises:
            SharedFitError: ``step`` carries no coefficients, or their shape is not this model's.
        """
        model = cls(n_actions, da, dx)
        d = cls.n_features(n_actions, da, dx)
        if step.coef is None or step.mean is None or step.scale is None:
            raise SharedFitError("the shared behaviour model carries no coefficients")
        if step.coef.shape != (d + 1, int(n_actions)) or step.mean.shape != (d,) or step.scale.shape != (d,):
            raise SharedFitError(f"the shared behaviour model has {step.coef.shape} coefficients, a site of "
                                 f"{n_actions} actions and {d} features needs {(d + 1, int(n_actions))}")
        if not (np.isfinite(step.coef).all() and np.isfinite(step.mean).all() and (step.scale > 0).all()):
            raise SharedFitError("the shared behaviour model is not finite")
        model.mean, model.scale, model.coef = step.mean, step.scale, step.coef
        if step.own_intercepts:  # the penalty the sites' intercepts were profiled with completes each site's copy
            model.l2 = step.l2
        return model

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


# -- a behaviour model shared by the consortium ----------------------------------------------------------------------
#
# Where a consortium chooses one behaviour model for all its sites, it is the exact pooled fit of the same penalised
# multinomial logistic regression: the objective is a sum over the sites' training steps, so its gradient and
# Hessian at any coefficients are sums of per-site sums, and Newton's method on those sums (Boyd & Vandenberghe 2004,
# "Convex Optimization", §9.5, with backtracking) reaches the pooled optimum. The server learns only the totals
# (through secure aggregation) and the coefficients it computes from them (docs/threats.md P67).

#: the sums a site sends for the shared behaviour model, named by what they are (the egress gate admits exactly
#: these: ``apps.egress``; none names a propensity, ``audit.rules.PROPENSITY_NAME``): the step count and the
#: features' sums and sums of squares (the pooled z-scoring), then at each Newton step the negative log-likelihood,
#: its gradient ``[F + 1, K]`` and the upper triangle of its Hessian, all summed over the site's training steps
SHARED_FIT_SCALARS = ("behaviour_fit.n", "behaviour_fit.loss")
SHARED_FIT_LISTS = ("behaviour_fit.f1", "behaviour_fit.f2", "behaviour_fit.grad", "behaviour_fit.hess")
#: the most coefficients ((features + 1) × actions) of a shared fit: the Hessian's upper triangle is one list of
#: c(c + 1)/2 sums, 20,100 at the cap (the egress gate's bound on every masked evaluation vector grows with it);
#: beyond it a consortium keeps the sites' own models
MAX_SHARED_COEFS = 200


def shared_list_caps() -> dict[str, int]:
    """The longest each list of :data:`SHARED_FIT_LISTS` can be (the egress gate's caps)."""
    return {"behaviour_fit.f1": MAX_SHARED_COEFS, "behaviour_fit.f2": MAX_SHARED_COEFS,
            "behaviour_fit.grad": MAX_SHARED_COEFS,
            "behaviour_fit.hess": MAX_SHARED_COEFS * (MAX_SHARED_COEFS + 1) // 2}


class SharedFitError(FcdError, ValueError):
    """The shared fit cannot run: too many coefficients, or no step at all."""


def check_shared_size(n_actions: int, da: int, dx: int) -> int:
    """The coefficients of a shared :class:`RecordPropensity` of these dimensions; returns their number.

    Raises:
        SharedFitError: more than :data:`MAX_SHARED_COEFS`.
    """
    c = (RecordPropensity.n_features(n_actions, da, dx) + 1) * int(n_actions)
    if c > MAX_SHARED_COEFS:
        raise SharedFitError(f"{c} coefficients ({n_actions} actions); a shared behaviour model has at most "
                             f"{MAX_SHARED_COEFS}")
    return c


@dataclass(frozen=True)
class SharedFitStep:
    """What the server sends the sites at one step of the shared fit: nothing (the moments step), or the pooled
    z-scoring and the current coefficients ``[F + 1, K]`` (a Newton step). ``own_intercepts``: the shared slopes
    with each site's own intercepts (:func:`fit_shared`), where the coefficients' first row is unused."""

    mean: np.ndarray | None = None
    scale: np.ndarray | None = None
    coef: np.ndarray | None = None
    own_intercepts: bool = False
    #: the intercepts' penalty under ``own_intercepts`` (the model's ``l2``)
    l2: float = 0.0

    #: the keys of :meth:`to_json`
    JSON_KEYS = ("mean", "scale", "coef", "own_intercepts", "l2")

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {k: None if v is None else np.asarray(v, np.float64).ravel().tolist()
                                  for k, v in (("mean", self.mean), ("scale", self.scale), ("coef", self.coef))}
        # the site's sums of a profiled step, and its completion of the fitted model, need both
        return {**doc, "own_intercepts": bool(self.own_intercepts), "l2": float(self.l2)}

    @classmethod
    def from_json(cls, doc: dict, n_actions: int) -> "SharedFitStep":
        """The step of :meth:`to_json` (a document without ``own_intercepts`` / ``l2``: one shared model, no
        intercept penalty).

        Raises:
            ValueError: ``own_intercepts`` is not a boolean, or ``l2`` is not a finite number ≥ 0.
        """
        def arr(k: str) -> np.ndarray | None:
            return None if doc.get(k) is None else np.asarray(doc[k], np.float64)

        own, l2 = doc.get("own_intercepts", False), doc.get("l2", 0.0)
        if not isinstance(own, bool):
            raise ValueError(f"own_intercepts: expected true or false, got {own!r}")
        if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not (np.isfinite(l2) and l2 >= 0):
            raise ValueError(f"l2: expected a finite number >= 0, got {l2!r}")
        coef = arr("coef")
        return cls(arr("mean"), arr("scale"), None if coef is None else coef.reshape(-1, int(n_actions)), own,
                   float(l2))


def shared_fit_sums(F: np.ndarray, a: np.ndarray, n_actions: int, step: SharedFitStep) -> dict[str, object]:
    """One site's sums for ``step`` over its training steps (raw features ``F``, logged actions ``a``:
    :meth:`HistoryPropensity.training_design`): at the moments step the count and the features' Σf and Σf², at a
    Newton step the negative log-likelihood, its gradient and its Hessian's upper triangle at ``step.coef`` on the
    features z-scored with the pooled ``step.mean`` / ``step.scale`` (with an intercept column, as the model's own
    design). Sums only: added over the sites they are the pooled ones.

    With ``step.own_intercepts`` the site first fits its own intercepts to the shared slopes (:func:`own_intercepts`,
    kept on the site) and sends the sums of the *profiled* objective, min over its intercepts: its loss at them
    (their penalty included), the slopes' gradient there (the envelope theorem: the intercepts' own gradient is
    zero at their optimum) and the slopes' Hessian of the profile, the Schur complement
    ``H_WW − H_Wb H_bb⁻¹ H_bW`` of the site's Hessian; the intercepts' rows and columns are sent as zeros."""
    F = np.asarray(F, np.float64)
    n, K = len(F), int(n_actions)
    if (F.shape[1] + 1) * K > MAX_SHARED_COEFS:
        raise SharedFitError(f"{(F.shape[1] + 1) * K} coefficients; a shared fit has at most {MAX_SHARED_COEFS}")
    out: dict[str, object] = {"behaviour_fit.n": float(n)}
    if step.coef is None:
        out.update({"behaviour_fit.f1": F.sum(0).tolist(), "behaviour_fit.f2": (F * F).sum(0).tolist()})
        return out
    X = np.concatenate([np.ones((n, 1)), (F - step.mean) / step.scale], axis=1)
    W = np.asarray(step.coef, np.float64)
    extra = 0.0
    if step.own_intercepts:
        b = own_intercepts(X[:, 1:] @ W[1:], a, K, step.l2)
        W = np.concatenate([b[None, :], W[1:]], axis=0)
        extra = 0.5 * n * step.l2 * float(b @ b)
    lp = log_softmax(X @ W, axis=1)
    P = np.exp(lp)
    Y = np.zeros((n, K))
    Y[np.arange(n), a] = 1.0
    d = X.shape[1]
    # H = Σ_i (diag p_i − p_i p_iᵀ) ⊗ x_i x_iᵀ, coefficients flattened as W.ravel() (index j·K + k)
    Z = (X[:, :, None] * P[:, None, :]).reshape(n, d * K)
    H = -(Z.T @ Z)
    for k in range(K):
        H[k::K, k::K] += X.T @ (X * P[:, k : k + 1])
    grad = (X.T @ (P - Y)).ravel()
    if step.own_intercepts:  # the profile over the site's intercepts (the first K coefficients); they stay here
        H[:K, :K] += n * step.l2 * np.eye(K)
        Hbb, Hbw = H[:K, :K], H[:K, K:]
        H[K:, K:] -= Hbw.T @ np.linalg.solve(Hbb, Hbw)
        H[:K, :], H[:, :K], grad[:K] = 0.0, 0.0, 0.0
    out.update({"behaviour_fit.loss": float(-lp[np.arange(n), a].sum()) + extra,
                "behaviour_fit.grad": grad.tolist(),
                "behaviour_fit.hess": H[np.triu_indices(d * K)].tolist()})
    return out


def own_intercepts(offsets: np.ndarray, a: np.ndarray, n_actions: int, l2: float, tol: float = 1e-12) -> np.ndarray:
    """A site's own intercepts ``b`` ``[K]`` to shared slopes: the minimiser of ``Σ_i −log softmax(b + o_i)_{a_i} +
    (n l2 / 2)‖b‖²`` over its steps (``offsets`` ``[n, K]``: the slopes' logits ``x̃_i W``), by Newton's method with
    halving; the penalty keeps it finite where the site never logged an action. Deterministic; never sent."""
    o = np.asarray(offsets, np.float64)
    n, K = len(o), int(n_actions)
    Y = np.zeros((n, K))
    Y[np.arange(n), a] = 1.0

    def f(b: np.ndarray) -> float:
        return float(-(Y * log_softmax(o + b, axis=1)).sum() + 0.5 * n * l2 * b @ b)

    b = np.zeros(K)
    fb = f(b)
    for _ in range(100):
        P = np.exp(log_softmax(o + b, axis=1))
        g = (P - Y).sum(0) + n * l2 * b
        H = np.diag(P.sum(0)) - P.T @ P + n * l2 * np.eye(K)
        delta = -np.linalg.solve(H, g)
        t = 1.0
        while f(b + t * delta) > fb and t > 1e-8:
            t *= 0.5
        b = b + t * delta
        fb = f(b)
        if np.abs(t * delta).max() <= tol:
            break
    return b


def with_own_intercepts(model: HistoryPropensity, F: np.ndarray, a: np.ndarray) -> HistoryPropensity:
    """A site's copy of a shared model fitted with ``own_intercepts`` (:func:`fit_shared`): the shared slopes and
    z-scoring, and the site's own intercepts fitted to them on its training steps (raw features ``F``, logged actions
    ``a``; :func:`own_intercepts`). The copy stays on the site."""
    from copy import copy  # noqa: PLC0415

    X = (np.asarray(F, np.float64) - model.mean) / model.scale
    site = copy(model)
    site.coef = np.concatenate([own_intercepts(X @ model.coef[1:], a, model.n_actions, model.l2)[None, :],
                                model.coef[1:]], axis=0)
    return site


def fit_shared(model: HistoryPropensity, n_features: int, ask: Callable[[SharedFitStep], Mapping[str, object]],
               max_iter: int = 50, step_tol: float = 1e-7, own_intercepts: bool = False) -> int:
    """The pooled fit of ``model``'s penalised objective from the consortium's totals; returns the Newton steps taken.

    ``ask(step)`` returns the totals over the sites of :func:`shared_fit_sums` at ``step`` (through secure
    aggregation in a run; over one site's rows it is the centralised fit). The moments step gives the pooled
    z-scoring (the features' pooled mean and standard deviation, as :meth:`HistoryPropensity.fit_design` takes them
    on one site's rows); Newton's method with backtracking (Armijo, halving) from zero then minimises
    ``−(1/n) Σ log π(a_i | x_i) + (l2 / 2) ‖W‖²`` (intercepts unpenalised), the model's own objective. The intercepts'
    common shift leaves the objective unchanged (a softmax): the step is solved in the complement of that direction,
    so the iterates keep the intercepts summing to zero, as L-BFGS from zero does. Stops when no coefficient would
    move by more than ``step_tol``: the totals' fixed-point encoding (2⁻²⁵ per site and value) moves the gradient by
    about sites · 3e-8 / n, and the step by that over the smallest curvature (at least ``l2``), ~1e-8 at 100 steps
    per site, so a smaller tolerance would chase the encoding's noise.

    ``own_intercepts``: one set of slopes shared by the consortium and each site's own intercepts (a site's own
    practice: a per-site logit shift of each action, which one shared model cannot represent), fitted on the site
    and never sent (:func:`shared_fit_sums`): Newton's method on the slopes of the objective profiled over every
    site's intercepts, each penalised by ``l2`` as the slopes are, which reaches the joint optimum over the slopes
    and all the sites' intercepts; the model's intercept row stays zero, and each site completes its own copy with
    :func:`with_own_intercepts`.

    Raises:
        SharedFitError: the totals hold no step, or the model has more than :data:`MAX_SHARED_COEFS` coefficients.
    """
    K, d = model.n_actions, int(n_features) + 1
    if d * K > MAX_SHARED_COEFS:
        raise SharedFitError(f"{d * K} coefficients; a shared fit has at most {MAX_SHARED_COEFS}")
    tot = ask(SharedFitStep())
    n = float(tot["behaviour_fit.n"])
    if n <= 0:
        raise SharedFitError("the consortium's training rows hold no valid step")
    mean = np.asarray(tot["behaviour_fit.f1"], np.float64) / n
    sd = np.sqrt(np.maximum(np.asarray(tot["behaviour_fit.f2"], np.float64) / n - mean * mean, 0.0))
    model.mean, model.scale = mean, np.where(sd > 1e-9, sd, 1.0)
    pen = np.ones((d, K))
    pen[0] = 0.0
    pen = pen.ravel()
    shift = np.zeros((d, K))
    shift[0] = 1.0 / np.sqrt(K)
    shift = shift.ravel()  # the intercepts' common shift: a null direction of the objective
    iu = np.triu_indices(d * K)

    def at(w: np.ndarray) -> tuple[float, dict]:
        t = ask(SharedFitStep(model.mean, model.scale, w.reshape(d, K), own_intercepts, model.l2))
        return float(t["behaviour_fit.loss"]) / n + 0.5 * model.l2 * float((pen * w * w).sum()), t

    w = np.zeros(d * K)
    f, tot = at(w)
    steps = 0
    for steps in range(1, max_iter + 1):
        g = np.asarray(tot["behaviour_fit.grad"], np.float64) / n + model.l2 * pen * w
        H = np.zeros((d * K, d * K))
        H[iu] = np.asarray(tot["behaviour_fit.hess"], np.float64) / n
        H = H + np.triu(H, 1).T + np.diag(model.l2 * pen)
        if own_intercepts:  # the slopes alone: the intercepts are the sites' (their rows are zeros)
            slopes = pen > 0
            delta = np.zeros(d * K)
            delta[slopes] = -np.linalg.solve(H[np.ix_(slopes, slopes)], g[slopes])
        else:
            H = H + np.outer(shift, shift)
            g = g - shift * (shift @ g)
            delta = -np.linalg.solve(H, g)
            delta -= shift * (shift @ delta)
        if np.abs(delta).max() <= step_tol:
            steps -= 1
            break
        decrement = float(-g @ delta)
        t = 1.0
        while True:
            f_new, tot_new = at(w + t * delta)
            # near the optimum the full step is taken: the totals' fixed-point encoding (±3e-8 per site) is then
            # larger than the decrease the Armijo test asks for
            if decrement < 1e-10 or f_new <= f - 1e-4 * t * decrement or t < 1e-6:
                break
            t *= 0.5
        w, f, tot = w + t * delta, f_new, tot_new
    model.coef = w.reshape(d, K)
    return steps

"""Off-policy evaluation (OPE) of a target policy π from logged sequential data (paper §IV-C, Fig. 2).

Re-implemented from the published formulas (Precup et al. 2000; Jiang & Li 2016; Thomas & Brunskill 2016), in the
estimator layout of obp (Saito et al. 2021) and SCOPE-RL (Kiyohara et al. 2023); no code copied, no runtime
dependency on either. One small class per estimator, obp style.

Data, all shaped [n, L] (n logged trajectories, L steps), i.e. exactly the ``SiteDataset`` arrays:

* ``rewards``  r_{i,t}   the outcome Y_{i,t};
* ``mask``     M_{i,t}   1 on valid steps (a prefix), 0 on padding; padding never contributes;
* ``mu``       μ_{i,t} = π_b(a_{i,t} | h_{i,t})  logged behaviour propensity of the *taken* action, must be in (0, 1];
* ``pi``       π_{i,t} = π(a_{i,t} | h_{i,t})    target probability of the taken action, in [0, 1]
  (0/1 for the deterministic policies Never / Always / Early-on / Late-on);
* ``q_hat``    Q̂_{i,t} ≈ Q^π(h_t, a_t)  model estimate of the return-to-go E[Σ_{t'≥t} γ^{t'−t} r_{t'}] after taking the
  logged a_t and following π afterwards (from the model's do-simulation, the Q̂ of Jiang & Li 2016's DR);
* ``v_hat``    V̂_{i,t} ≈ V^π(h_t) = Σ_a π(a|h_t) Q̂(h_t, a)  model estimate of the return-to-go under π.

Q̂/V̂ are in *un-normalised* reward units over the same horizon and discount as the estimate.

Weights: ρ_t = π_t / μ_t on valid steps (1 on padding), w_{0:t} = Π_{t'≤t} ρ_{t'}, w_{0:−1} = 1. The *final*
cumulative weight w_i = w_{0:L_i−1} drives the support diagnostics of every weighting estimator:
``n_consistent`` = #{i : w_i > 0} (trajectories whose every logged action π could have taken) and
``ess`` = (Σ_i w_i)² / Σ_i w_i² (0 when all weights are 0).

Scale of the value ("normalised per step"): the return of trajectory i is G_i = c_i Σ_t γ^t M_{i,t} r_{i,t} with

* ``normalise="per_step"`` (default): c_i = 1 / Σ_t γ^t M_{i,t}; with γ = 1 this is the per-step average success
  V(π) = E_i[(1/L_i) Σ_t M_{i,t} Y^π_{i,t}] (the paper's §IV-C policy value), the scale of the DKT-Synth oracle values. It treats
  the logged length L_i as exogenous (not changed by π), the usual assumption for fixed-length curricula;
* ``normalise="horizon"``: c_i = 1 / Σ_{t<H} γ^t, one constant for all i (no assumption on lengths);
* ``normalise="none"``: c_i = 1, the plain discounted return.

Zero support (the paper reports "Always" on Diabetes-130 as NaN): a weighting estimator whose final
weights are all zero (or whose ESS is below ``min_ess``) returns ``value = NaN``, sets ``warning`` and emits a
:class:`SupportWarning` — never a made-up number. :class:`DM` needs no support.

Federation: only the site's :class:`OPEResult` (value, ESS, counts and the additive sums below) leaves a site; μ never
does. :func:`combine` pools per-site results exactly: for IPW / PDIS / DM / DR the pooled value is
Σ_s sum_value_s / Σ_s n_s, i.e. the n-weighted mean of the site values; for SNIPW it is
Σ_s sum_value_s / Σ_s sum_weight_s. Both equal the estimate on the concatenated trajectories.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

if TYPE_CHECKING:  # only for annotations; evaluation depends on data, never the reverse
    from fcd_secure.data.policy import PolicyLike
    from fcd_secure.data.schema import SiteDataset

__all__ = [
    "SupportWarning",
    "OPEResult",
    "OPEEstimator",
    "IPW",
    "SNIPW",
    "PDIS",
    "DM",
    "PerDecisionDR",
    "ESTIMATORS",
    "combine",
    "estimate_on_site",
    "target_probs",
]

Normalise = Literal["per_step", "horizon", "none"]


class SupportWarning(UserWarning):
    """The target policy has no (or too little) support in the logged data: the weighting estimate is NaN."""


@dataclass(frozen=True)
class OPEResult:
    """One estimate plus its support diagnostics and the additive sums that let sites be pooled exactly.

    ``sum_value``: Σ_i of the per-trajectory term (Σ_i w_i G_i for IPW/SNIPW, Σ_i V_DR,i for DR, Σ_i c_i V̂_i,0 for DM);
    ``sum_weight`` / ``sum_weight_sq``: Σ_i w_i and Σ_i w_i² of the final cumulative weights (DM: every w_i = 1).
    """

    estimator: str
    value: float
    n: int
    ess: float
    n_consistent: int
    warning: str | None
    sum_value: float
    sum_weight: float
    sum_weight_sq: float

    @property
    def supported(self) -> bool:
        """Whether the estimate has logged support (no ``warning``)."""
        return self.warning is None

    def to_dict(self) -> dict[str, object]:
        """Every field by name."""
        return asdict(self)


# -- validated, padded-safe arrays ----------------------------------------------------------------------------


def _field(name: str, arr: object, shape: tuple[int, ...] | None) -> np.ndarray:
    a = np.asarray(arr, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"OPE input {name!r} must be [n, L], got shape {a.shape}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"OPE input {name!r} has shape {a.shape}, rewards has {shape}")
    return a


def _first_bad(name: str, bad: np.ndarray, arr: np.ndarray, what: str) -> None:
    if bad.any():
        row, step = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"OPE input {name!r} {what} at row {row}, step {step} (value {arr[row, step]!r})")


@dataclass(frozen=True)
class _Prepared:
    n: int
    G: np.ndarray  # [n] normalised discounted return c_i Σ γ^t M r
    c: np.ndarray  # [n] per-trajectory normaliser
    gm: np.ndarray  # [n, L] γ^t M_{i,t}
    r: np.ndarray
    w_cum: np.ndarray | None  # [n, L] w_{0:t}
    w_prev: np.ndarray | None  # [n, L] w_{0:t-1}
    w_final: np.ndarray | None  # [n]
    q: np.ndarray | None
    v: np.ndarray | None


def _prepare(
    rewards: object,
    mask: object,
    mu: object | None,
    pi: object | None,
    q_hat: object | None,
    v_hat: object | None,
    horizon: int | None,
    discount: float,
    normalise: str,
) -> _Prepared:
    r = _field("rewards", rewards, None)
    shape = r.shape
    m = _field("mask", mask, shape)
    if r.shape[0] == 0:
        raise ValueError("OPE: no trajectories (n = 0)")
    if not np.isin(m, (0.0, 1.0)).all():
        _first_bad("mask", ~np.isin(m, (0.0, 1.0)), m, "must be 0/1")
    _first_bad("mask", np.diff(m, axis=1) > 0, m, "must be a prefix of valid steps (a gap ends)")
    if not (0.0 < discount <= 1.0) or not math.isfinite(discount):
        raise ValueError(f"OPE: discount must be in (0, 1], got {discount}")
    if normalise not in ("per_step", "horizon", "none"):
        raise ValueError(f"OPE: normalise must be 'per_step', 'horizon' or 'none', got {normalise!r}")
    if horizon is not None:
        if int(horizon) < 1:
            raise ValueError(f"OPE: horizon must be >= 1, got {horizon}")
        H = min(int(horizon), shape[1])
    else:
        H = shape[1]
    m = m[:, :H]
    empty = m.sum(axis=1) == 0
    if empty.any():
        raise ValueError(f"OPE input 'mask': row {int(np.argmax(empty))} has no valid step within the horizon")
    valid = m > 0

    def clean(name: str, arr: object | None, pad: float) -> np.ndarray | None:
        if arr is None:
            return None
        a = _field(name, arr, shape)[:, :H]
        _first_bad(name, valid & ~np.isfinite(a), a, "holds NaN or inf")
        return np.where(valid, a, pad)  # padding is neutral so that NaN there never propagates

    r = clean("rewards", r, 0.0)  # type: ignore[assignment]
    mu_ = clean("mu", mu, 1.0)
    pi_ = clean("pi", pi, 1.0)
    q = clean("q_hat", q_hat, 0.0)
    v = clean("v_hat", v_hat, 0.0)
    if mu_ is not None:
        _first_bad("mu", valid & ((mu_ <= 0.0) | (mu_ > 1.0)), mu_, "(behaviour propensity) must be in (0, 1]")
    if pi_ is not None:
        _first_bad("pi", valid & ((pi_ < 0.0) | (pi_ > 1.0)), pi_, "(target probability) must be in [0, 1]")

    g = discount ** np.arange(H, dtype=np.float64)
    gm = g[None, :] * m
    if normalise == "per_step":
        c = 1.0 / gm.sum(axis=1)
    elif normalise == "horizon":
        c = np.full(shape[0], 1.0 / g.sum())
    else:
        c = np.ones(shape[0])
    G = c * (gm * r).sum(axis=1)  # type: ignore[operator]

    w_cum = w_prev = w_final = None
    if mu_ is not None and pi_ is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            w_cum = np.cumprod(pi_ / mu_, axis=1)
        w_prev = np.concatenate([np.ones((shape[0], 1)), w_cum[:, :-1]], axis=1)
        w_final = w_cum[:, -1]  # padding has ratio 1, so the last column holds w_{0:L_i-1}
    return _Prepared(shape[0], G, c, gm, r, w_cum, w_prev, w_final, q, v)  # type: ignore[arg-type]


def _support(sum_w: float, sum_w2: float, n_consistent: int, min_ess: float, finite: bool) -> tuple[float, str | None]:
    if not finite:
        return float("nan"), "importance weights overflow float64 (propensities too small over too many steps)"
    ess = (sum_w * sum_w / sum_w2) if sum_w2 > 0 else 0.0
    if n_consistent == 0:
        return 0.0, "no support: no logged trajectory is consistent with the target policy (all cumulative weights are 0)"
    if ess < min_ess * (1 - 1e-12):
        return ess, f"insufficient support: effective sample size {ess:.3g} is below min_ess = {min_ess:g}"
    return ess, None


# -- estimators -----------------------------------------------------------------------------------------------


class OPEEstimator:
    """Base class. Configure once (horizon, discount, normalise, min_ess); call :meth:`estimate` per site/policy.

    ``horizon`` truncates every trajectory to its first H steps; ``discount`` γ ∈ (0, 1] weights step t by γ^t;
    ``normalise`` picks the value scale (module docstring); ``min_ess`` is the ESS below which a weighting estimate
    is declared unsupported (the default 1 means "at least one consistent trajectory", since ESS ≥ 1 whenever any
    weight is positive).
    """

    name: ClassVar[str] = "base"
    needs: ClassVar[tuple[str, ...]] = ()
    self_normalised: ClassVar[bool] = False
    needs_support: ClassVar[bool] = True

    def __init__(
        self,
        *,
        horizon: int | None = None,
        discount: float = 1.0,
        normalise: Normalise = "per_step",
        min_ess: float = 1.0,
    ) -> None:
        if min_ess < 0:
            raise ValueError(f"min_ess must be >= 0, got {min_ess}")
        self.horizon = horizon
        self.discount = float(discount)
        self.normalise = normalise
        self.min_ess = float(min_ess)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(horizon={self.horizon}, discount={self.discount}, "
            f"normalise={self.normalise!r}, min_ess={self.min_ess})"
        )

    def estimate(
        self,
        rewards: object,
        mask: object,
        mu: object | None = None,
        pi: object | None = None,
        q_hat: object | None = None,
        v_hat: object | None = None,
        *,
        horizon: int | None = None,
        discount: float | None = None,
    ) -> OPEResult:
        """Estimate V(π) from logged trajectories (module docstring for the arrays, all ``[n, L]``).

        Args:
            rewards: outcomes r = Y.
            mask: valid steps M.
            mu: logged propensities of the taken actions, in (0, 1] (weighting estimators).
            pi: target probabilities of the taken actions (weighting estimators).
            q_hat: model return-to-go after the logged action (DM / DR).
            v_hat: model return-to-go under π (DM / DR).
            horizon: overrides the constructor's for this call.
            discount: overrides the constructor's for this call.

        Returns:
            The estimate with its support diagnostics and the additive sums :func:`combine` pools.

        Raises:
            ValueError: a missing input this estimator needs, or an input of the wrong shape or range.
        """
        p = self._prepared(rewards, mask, {"mu": mu, "pi": pi, "q_hat": q_hat, "v_hat": v_hat},
                           self.horizon if horizon is None else horizon,
                           self.discount if discount is None else float(discount))
        terms = self._terms(p)
        if p.w_final is not None:
            w = p.w_final
            sum_w, sum_w2, n_cons = float(w.sum()), float((w * w).sum()), int((w > 0).sum())
            finite = bool(np.isfinite(terms).all() and math.isfinite(sum_w2))
        else:  # DM: every trajectory enters with weight 1
            sum_w = sum_w2 = float(p.n)
            n_cons, finite = p.n, bool(np.isfinite(terms).all())
        return _finish(self.name, p.n, float(terms.sum()), sum_w, sum_w2, n_cons, self.min_ess, finite)

    def per_entity(
        self,
        rewards: object,
        mask: object,
        mu: object | None = None,
        pi: object | None = None,
        q_hat: object | None = None,
        v_hat: object | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each trajectory's term of the estimate (``sum_value`` is their sum; arrays as in :meth:`estimate`), and
        each trajectory's share of valid steps within the horizon that still have support (w_{0:t} > 0; 1 for DM).

        The terms stay on the site: their sums (n, Σx, Σx²) give an interval through
        :mod:`fcd_secure.evaluation.intervals`. Self-normalised estimators have no per-trajectory form.

        Raises:
            ValueError: a self-normalised estimator, a missing input, or an input of the wrong shape or range.
        """
        if self.self_normalised:
            raise ValueError(f"{self.name} is self-normalised: its trajectories have no additive terms")
        p = self._prepared(rewards, mask, {"mu": mu, "pi": pi, "q_hat": q_hat, "v_hat": v_hat},
                           self.horizon, self.discount)
        valid = p.gm > 0
        if p.w_cum is None:
            support = np.ones(p.n)
        else:
            support = (valid & (p.w_cum > 0)).sum(axis=1) / valid.sum(axis=1)
        return self._terms(p), support

    def _prepared(
        self, rewards: object, mask: object, given: Mapping[str, object | None], horizon: int | None, discount: float
    ) -> _Prepared:
        """The checked arrays of one call: every input in :attr:`needs` must be given; the others are ignored (not
        even validated), so a caller may pass a full set of arrays to any estimator.

        Raises:
            ValueError: a missing input this estimator needs, or an input of the wrong shape or range.
        """
        missing = [k for k in self.needs if given[k] is None]
        if missing:
            raise ValueError(f"{self.name} needs {', '.join(missing)}")
        used = (given[k] if k in self.needs else None for k in ("mu", "pi", "q_hat", "v_hat"))
        return _prepare(rewards, mask, *used, horizon, discount, self.normalise)

    def _terms(self, p: _Prepared) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


def _finish(
    name: str, n: int, sum_value: float, sum_w: float, sum_w2: float, n_cons: int, min_ess: float, finite: bool
) -> OPEResult:
    cls = ESTIMATORS[name]
    if cls.needs_support:
        ess, warn = _support(sum_w, sum_w2, n_cons, min_ess, finite)
    else:
        ess, warn = (sum_w * sum_w / sum_w2 if sum_w2 > 0 else 0.0), (None if finite else "non-finite model estimates")
    if warn is not None:
        value = float("nan")
        warnings.warn(f"{name}: {warn}", SupportWarning, stacklevel=3)
    elif cls.self_normalised:
        value = sum_value / sum_w
    else:
        value = sum_value / n
    return OPEResult(
        estimator=name,
        value=float(value),
        n=int(n),
        ess=float(ess),
        n_consistent=int(n_cons),
        warning=warn,
        sum_value=float(sum_value),
        sum_weight=float(sum_w),
        sum_weight_sq=float(sum_w2),
    )


class IPW(OPEEstimator):
    """Trajectory-wise importance sampling (TIS; Precup et al. 2000).

    V̂_IPW = (1/n) Σ_i w_{0:L_i−1}^{(i)} · G_i,   G_i = c_i Σ_t γ^t M_{i,t} r_{i,t}.

    Unbiased with correct μ; horizon 1 gives obp's IPW  E_n[ (π(a|x)/π_b(a|x)) r ].
    """

    name = "ipw"
    needs = ("mu", "pi")

    def _terms(self, p: _Prepared) -> np.ndarray:
        return p.w_final * p.G  # type: ignore[operator]


class SNIPW(OPEEstimator):
    """Self-normalised trajectory-wise importance sampling (weighted IS; obp SNIPW for horizon 1).

    V̂_SNIPW = Σ_i w_i G_i / Σ_i w_i,   w_i = w_{0:L_i−1}^{(i)}.

    Consistent and bounded by the range of G, slightly biased for finite n. Σ_i w_i = 0 (no support) is 0/0: NaN.
    """

    name = "snipw"
    needs = ("mu", "pi")
    self_normalised = True

    def _terms(self, p: _Prepared) -> np.ndarray:
        return p.w_final * p.G  # type: ignore[operator]


class PDIS(OPEEstimator):
    """Per-decision importance sampling (Precup et al. 2000; SCOPE-RL "PDIS").

    V̂_PDIS = (1/n) Σ_i c_i Σ_t γ^t M_{i,t} w_{0:t}^{(i)} r_{i,t}.
    """

    name = "pdis"
    needs = ("mu", "pi")

    def _terms(self, p: _Prepared) -> np.ndarray:
        return p.c * (p.gm * p.w_cum * p.r).sum(axis=1)  # type: ignore[operator]


class DM(OPEEstimator):
    """Direct method from the model's value estimate at the first step (the "direct method", Dudík et al. 2011).

    V̂_DM = (1/n) Σ_i c_i V̂(h_{i,0}),   V̂(h_0) = Σ_a π(a|h_0) Q̂(h_0, a) (the model's do-simulated return under π).

    Uses no propensities, hence needs no support; it is as biased as the model.
    """

    name = "dm"
    needs = ("v_hat",)
    needs_support = False

    def _terms(self, p: _Prepared) -> np.ndarray:
        return p.c * p.v[:, 0]  # type: ignore[index]


class PerDecisionDR(OPEEstimator):
    """Per-decision doubly robust estimator (Jiang & Li 2016, paper ref. [9]; Thomas & Brunskill 2016).

    V̂_DR = (1/n) Σ_i c_i Σ_t γ^t M_{i,t} [ w_{0:t} (r_t − Q̂(h_t, a_t)) + w_{0:t−1} V̂(h_t) ],

    equivalently the recursion V_DR^{(t)} = V̂(h_t) + ρ_t (r_t + γ V_DR^{(t+1)} − Q̂(h_t, a_t)), V_DR^{(L)} = 0.

    * Unbiased whenever μ is correct and V̂(h) = Σ_a π(a|h) Q̂(h, a), whatever Q̂ is (each correction term has mean 0).
    * Exact, trajectory by trajectory, when Q̂ = Q^π and rewards/transitions are deterministic given (h_t, a_t).
    * Under zero support (all w_{0:L_i−1} = 0) the formula would collapse to a DM-like number; we return NaN with a
      :class:`SupportWarning` instead, as the paper reports for "Always" on Diabetes-130.
    """

    name = "dr"
    needs = ("mu", "pi", "q_hat", "v_hat")

    def _terms(self, p: _Prepared) -> np.ndarray:
        per_step = p.w_cum * (p.r - p.q) + p.w_prev * p.v  # type: ignore[operator]
        return p.c * (p.gm * per_step).sum(axis=1)

    def step_weights(self, rewards: object, mask: object, mu: object, pi: object) -> tuple[np.ndarray, np.ndarray]:
        """The per-step pieces of the estimate: the cumulative weights w_{0:t} and each step's scale c_i γ^t M_{i,t}
        in the value (0 on padding), both ``[n, H]``; :func:`fcd_secure.evaluation.intervals.unseen_mass_sums`
        bounds with them what the logged sample did not reach of π.

        Raises:
            ValueError: an input of the wrong shape or range (as :meth:`estimate`).
        """
        p = _prepare(rewards, mask, mu, pi, None, None, self.horizon, self.discount, self.normalise)
        return p.w_cum, p.c[:, None] * p.gm  # type: ignore[return-value]


ESTIMATORS: dict[str, type[OPEEstimator]] = {c.name: c for c in (IPW, SNIPW, PDIS, DM, PerDecisionDR)}


def combine(results: Sequence[OPEResult], min_ess: float = 1.0) -> OPEResult:
    """Pool per-site results of one estimator exactly (module docstring, "Federation").

    IPW / PDIS / DM / DR: V = Σ_s sum_value_s / Σ_s n_s (the n-weighted mean of site values); SNIPW:
    V = Σ_s sum_value_s / Σ_s sum_weight_s. ESS and n_consistent are recomputed from the pooled weight sums, so a
    site without support does not make the pool unsupported, and a pool without support is NaN.

    Args:
        results: one result of the same estimator per site.
        min_ess: the ESS below which the pooled weighting estimate is unsupported.

    Raises:
        ValueError: no results, or results of different estimators.
    """
    if not results:
        raise ValueError("combine: no site results")
    names = {r.estimator for r in results}
    if len(names) != 1:
        raise ValueError(f"combine: results come from different estimators {sorted(names)}")
    name = names.pop()
    return _finish(
        name,
        sum(r.n for r in results),
        float(sum(r.sum_value for r in results)),
        float(sum(r.sum_weight for r in results)),
        float(sum(r.sum_weight_sq for r in results)),
        sum(r.n_consistent for r in results),
        min_ess,
        all(math.isfinite(x) for r in results for x in (r.sum_value, r.sum_weight_sq)),
    )


def estimate_on_site(
    estimator: OPEEstimator,
    ds: "SiteDataset",
    pi: object | None = None,
    q_hat: object | None = None,
    v_hat: object | None = None,
) -> OPEResult:
    """Run ``estimator`` on a site's own data: rewards = Y, mask = M, μ = the site-private logged propensities P.

    Args:
        estimator: a configured estimator.
        ds: the site's logged trajectories (P never leaves the site; only the result does).
        pi: target probabilities of the logged actions, ``[n, L]`` (:func:`target_probs`).
        q_hat: model return-to-go after the logged action.
        v_hat: model return-to-go under π.

    Raises:
        ValueError: if the estimator needs propensities and the site has none.
    """
    if "mu" in estimator.needs and ds.P is None:
        raise ValueError(f"{ds.name}: {estimator.name} needs logged propensities, but the site's P is None")
    return estimator.estimate(ds.Y, ds.M, mu=ds.P, pi=pi, q_hat=q_hat, v_hat=v_hat)


def target_probs(policy: "PolicyLike", ds: "SiteDataset", anchors: tuple[int, int]) -> np.ndarray:
    """π(logged a_t | logged history) for every step of ``ds``: float64 [n, L], 0 on padding.

    For the deterministic anchor policies (Never / Always / Early-on / Late-on) this is 1 where the logged action is
    the one the policy would take, else 0 — including every logged action outside the anchor pair {a_off, a_on}.
    """
    a_off, a_on = anchors
    lengths = ds.lengths
    cols = [policy.prob(t, ds.Y[:, :t], lengths, a_off, a_on, ds.T[:, t]) for t in range(ds.L)]
    return np.stack(cols, axis=1).astype(np.float64) * (ds.M > 0)

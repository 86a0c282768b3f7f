"""Per-entity effects with skill: a federated DR-learner of the one-step effect at each decision step.

The DR-learner (Kennedy 2023, "Towards optimal doubly robust estimation of heterogeneous causal effects", EJS; over
time: Frauen, Hess & Feuerriegel, ICLR 2025) regresses the doubly robust pseudo-outcome of every decision step::

    φ_t = μ̂_on(H_t) − μ̂_off(H_t) + 1{T_t = a_on}(Y_t − μ̂_on)/P_t − 1{T_t = a_off}(Y_t − μ̂_off)/P_t

(``queries.targeted``; terms clipped at ±50, ``evaluation.discrepancy``) on features x_t of the history H_t. Since
E[φ_t | H_t] is the true one-step effect τ(H_t) whenever P_t is the logging probability (whatever μ̂ is), the
regression's fit τ̂(H_t) = βᵀx_t targets the per-entity effect, not the model's confounded contrast.

**Cross-fitting.** μ̂ was trained on a site's training rows; the pseudo-outcomes are formed on its *validation* rows
(never trained on), so no row's pseudo-outcome uses a model trained on it (Kennedy 2023 §3); the effects are then
predicted on the test rows.

**Features** (:data:`FEATURES`, fixed so that the egress allow-list is exact): an intercept, the simulator's own
contrast and level, and summaries of the anchor actions' history (how often each anchor was given and answered
correctly before t, the previous step's action and outcome, the running outcome mean, the step position).

**Federated fit in closed form** (:class:`DRLearnerFit`). At every scored round a site sends only the additive sums
of a ridge regression over its validation steps (``drl.fit.*``: n, Σw, Σwφ², XᵀWX, XᵀWφ). The server takes those of
the round the selection chose (:func:`solve`): slopes penalised on the features' pooled standard deviations, λ by
generalised cross-validation (Golub, Heath & Wahba 1979, Technometrics 21(2)) from the same sums. β travels in the
final evaluation's request (``EvaluationRequest.dr_learner_beta``); each site predicts τ̂_t = βᵀx_t on its test steps
and sends ``drl.effect.*`` (:class:`DRLearnerEffects`: ``EffectStats`` against the oracle's one-step truth when there
is one, Στ̂, the residual sums of the intercept) and ``drl.model.*`` (the simulator's own contrast). τ̂ per entity
stays on the site.

**Intercept.** The slopes come from the validation rows alone; the intercept is re-fitted on every held-out
pseudo-outcome: δ = Σ_test(φ − βᵀx) / (test steps + validation steps), the least-squares intercept of both sets of
rows with the slopes held (the validation residuals sum to 0 at β, whose intercept is not penalised);
``summary.json``'s ``dr_learner.intercept.unshifted`` keeps β's own figures beside.

**Held-out check** (truth-free; :func:`heldout_check`). On the test steps with logged propensities the server compares
the squared error of τ̂_t + δ against the pseudo-outcomes with that of a constant c, the test steps' mean φ:
gain = Σ_t [(φ_t − c)² − (φ_t − τ̂_t − δ)²] / #steps + Var(c)·(1 − 2·share), the last term undoing what fitting c, and
δ's share of test rows, on the same φ would give or take. Since E[φ_t | H_t] = τ(H_t), E[gain] = sd²τ − mean
(τ − τ̂ − δ)², the skill score against the constant true ATE times sd²τ, estimated without the truth (the DR loss of
Kennedy 2023; Curth & van der Schaar 2023, "In search of insights, not magic bullets", ICML). Its SE is cluster-robust
over entities (``drl.check.<part>.*``, ``evaluation.intervals.cluster_sums``) plus c's second-order share 2·Var(c)².
τ̂ is **shown** better than the constant when the gain is at least :data:`CHECK_Z` SE above 0, **worse than the
constant** when as far below, else **not shown**. The same check is made of the simulator's own contrast.

**Weights.** w_t = 1 (ordinary least squares): inverse-variance weights (Frauen et al.'s IVW-learner) need the
propensities of both anchors at every step, and a site logs only that of the action it took.

A site without logged propensities (or with fewer validation entities than its cohort floor) sends n = 0; the output
says ``partial`` or ``unavailable``. Measured figures: ``docs/fidelity.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from fcd_secure.evaluation.discrepancy import DEFAULT_CLIP, one_step_dr_terms
from fcd_secure.evaluation.intervals import cluster_pair_names, cluster_sums, linear_cluster_ss
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals

#: the features x_t of the history H_t, in order (feature 0 is the intercept)
FEATURES = ("intercept", "model_contrast", "model_level", "log_past_on", "log_past_off", "log_past_on_correct",
            "log_past_off_correct", "last_on", "last_off", "last_outcome", "past_outcome_mean", "step_fraction")
K = len(FEATURES)
#: the pairs (i ≤ j) of XᵀWX a site sends
PAIRS = tuple((i, j) for i in range(K) for j in range(i, K))
#: the fit sums' scalars besides XᵀWX and XᵀWφ
FIT_SCALARS = ("n", "sw", "syy", "sites")
#: the ridge grid (penalty per unit weight on standardised slopes); λ is chosen on it by GCV
LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
EFFECT_SUMS = ("n", "sse", "sum_hat", "sum_true", "sum_true_sq", "sum_hat_sq", "sum_cross")
#: the test rows' residual sums that re-fit the intercept (module docstring, "Intercept"): Σ(φ_t − βᵀx_t) and the steps
RESID_SUMS = ("resid", "resid_n")
#: the held-out check's per-entity sums (module docstring, "Held-out check"): Σφτ̂, Σφ, Στ̂, Στ̂² and the steps of each
#: test entity, sent as cluster sums (``evaluation.intervals.cluster_sums``) with the entity count ``n``
CHECK_FIELDS = ("u", "v", "w", "q", "m")
#: the parts checked: the DR-learner's τ̂ (``effect``) and the simulator's own contrast (``model``)
CHECK_PARTS = ("effect", "model")
#: per-entity differences count as shown when the held-out gain is at least this many SE above 0 (one-sided 5 %)
CHECK_Z = 1.645


#: the ridge sums of a scored round (``drl.fit.*``)
FIT_NAMES = ([f"drl.fit.{f}" for f in FIT_SCALARS] + [f"drl.fit.xx.{i}.{j}" for i, j in PAIRS]
             + [f"drl.fit.xy.{i}" for i in range(K)])
#: the final evaluation's sums: effects, the intercept's residuals and the held-out check's cluster sums
EFFECT_NAMES = ([f"drl.{part}.{f}" for part in ("effect", "model") for f in EFFECT_SUMS]
                + [f"drl.effect.{f}" for f in RESID_SUMS]
                + [f"drl.check.{part}.{f}" for part in CHECK_PARTS
                   for f in ("n", *CHECK_FIELDS, *(f"{k}.{l}" for k, l in cluster_pair_names(CHECK_FIELDS)))])


# -- a site: features, pseudo-outcomes, sums --------------------------------------------------------------------------
def effect_features(ds, mu_on: np.ndarray, mu_off: np.ndarray, anchors: tuple[int, int]) -> np.ndarray:
    """x_t of every step, ``[n, L, K]`` (:data:`FEATURES`); only the history before t and the model's μ̂(H_t) enter.

    Args:
        ds: the rows (``SiteDataset``).
        mu_on, mu_off: the model's one-step probabilities of the anchors, ``[n, L]``.
        anchors: ``(a_off, a_on)``.
    """
    a_off, a_on = (int(a) for a in anchors)
    n, L = ds.Y.shape
    valid = (ds.M > 0).astype(np.float64)
    Y = np.asarray(ds.Y, dtype=np.float64) * valid
    on, off = (ds.T == a_on) * valid, (ds.T == a_off) * valid

    def before(x: np.ndarray) -> np.ndarray:  # Σ_{s<t} x_s
        return np.cumsum(x, 1) - x

    def previous(x: np.ndarray, first: float) -> np.ndarray:
        return np.concatenate([np.full((n, 1), first), x[:, :-1]], 1)

    t = np.broadcast_to(np.arange(L, dtype=np.float64), (n, L))
    cols = [np.ones((n, L)), mu_on - mu_off, (mu_on + mu_off) / 2, np.log1p(before(on)), np.log1p(before(off)),
            np.log1p(before(on * Y)), np.log1p(before(off * Y)), previous(on, 0.0), previous(off, 0.0),
            previous(Y, 0.5), np.where(t > 0, before(Y) / np.maximum(t, 1.0), 0.5), t / max(L, 1)]
    return np.stack(cols, -1)


def pseudo_outcomes(ds, mu_on: np.ndarray, mu_off: np.ndarray, anchors: tuple[int, int],
                    clip: float = DEFAULT_CLIP) -> np.ndarray:
    """φ_t of every valid step (module docstring), flat in the order of ``ds.M > 0``."""
    a_off, a_on = (int(a) for a in anchors)
    valid = ds.M > 0
    psi = np.clip(one_step_dr_terms(ds.Y, ds.M, ds.T, ds.P, mu_on, mu_off, a_on, a_off), -clip, clip)
    return (mu_on - mu_off)[valid] + psi


def ridge_sums(X: np.ndarray, phi: np.ndarray, w: np.ndarray | None = None) -> dict[str, float]:
    """The additive sums of a weighted ridge regression of ``phi`` on the rows of ``X`` (``drl.fit.*``)."""
    X = np.asarray(X, dtype=np.float64)
    phi = np.asarray(phi, dtype=np.float64)
    w = np.ones(len(phi)) if w is None else np.asarray(w, dtype=np.float64)
    A = (X * w[:, None]).T @ X
    b = (X * w[:, None]).T @ phi
    out = {"drl.fit.n": float(len(phi)), "drl.fit.sw": float(w.sum()), "drl.fit.syy": float((w * phi * phi).sum()),
           "drl.fit.sites": 1.0}
    out.update({f"drl.fit.xx.{i}.{j}": float(A[i, j]) for i, j in PAIRS})
    out.update({f"drl.fit.xy.{i}": float(b[i]) for i in range(K)})
    return out


def empty_fit_sums() -> dict[str, float]:
    """What a site that cannot fit sends: zeros (n = 0, not counted in ``sites``)."""
    return dict.fromkeys(FIT_NAMES, 0.0)


def site_fit_sums(model, data, floor: int, pair: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """A site's ``drl.fit.*`` over its validation rows (cross-fitting: the model never trained on them).

    Args:
        model: the simulator of the scored round (global Θc with the site's Θs).
        data: the site's ``SiteData``.
        floor: the site's cohort floor: fewer validation entities send n = 0 (as ``queries.selection``, P22).
        pair: ``queries.targeted.one_step_pair`` of the validation rows when the caller has it already.
    """
    from fcd_secure.queries.cohort import entity_count  # noqa: PLC0415
    from fcd_secure.queries.targeted import one_step_pair  # noqa: PLC0415

    val = data.validation
    if val is None or val.P is None or entity_count(val) < floor:
        return empty_fit_sums()
    mu_on, mu_off = pair if pair is not None else one_step_pair(model, val, data.anchors)
    X = effect_features(val, mu_on, mu_off, data.anchors)[val.M > 0]
    return ridge_sums(X, pseudo_outcomes(val, mu_on, mu_off, data.anchors))


def site_effect_sums(model, sub, anchors: tuple[int, int], beta: np.ndarray,
                     truth: np.ndarray | None, pair: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """A site's ``drl.effect.*`` and ``drl.model.*`` on its test rows ``sub``: τ̂_t = βᵀx_t and the simulator's own
    contrast, each as ``EffectStats`` against ``truth`` (the oracle's one-step contrast ``[n, L]``), or only n and
    Στ̂ without a truth; with logged propensities also Σ(φ_t − τ̂_t) and the steps (``drl.effect.resid*``), from
    which the server re-fits the intercept (module docstring). Nothing per entity leaves."""
    from fcd_secure.evaluation.metrics import EffectStats  # noqa: PLC0415
    from fcd_secure.queries.targeted import one_step_pair  # noqa: PLC0415

    beta = np.asarray(beta, dtype=np.float64)
    if sub.n == 0 or beta.shape != (K,):
        return {}
    mu_on, mu_off = pair if pair is not None else one_step_pair(model, sub, anchors)
    valid = sub.M > 0
    tau_hat = effect_features(sub, mu_on, mu_off, anchors)[valid] @ beta
    own = (mu_on - mu_off)[valid]
    resid = {}
    if sub.P is not None:  # the test rows' pseudo-outcomes: held out from μ̂'s training as the validation rows are
        phi = pseudo_outcomes(sub, mu_on, mu_off, anchors)
        r = phi - tau_hat
        resid = {"drl.effect.resid": float(r.sum()), "drl.effect.resid_n": float(r.size)}
        entity = np.nonzero(valid)[0]
        resid.update(check_sums("effect", phi, tau_hat, entity, sub.n))
        resid.update(check_sums("model", phi, own, entity, sub.n))
    if truth is None:
        return {"drl.effect.n": float(tau_hat.size), "drl.effect.sum_hat": float(tau_hat.sum()),
                "drl.model.n": float(own.size), "drl.model.sum_hat": float(own.sum()), **resid}
    tau = np.asarray(truth, dtype=np.float64)[valid]
    out = {f"drl.effect.{k}": float(v) for k, v in EffectStats.from_arrays(tau_hat, tau).to_dict().items()}
    out.update({f"drl.model.{k}": float(v) for k, v in EffectStats.from_arrays(own, tau).to_dict().items()})
    return {**out, **resid}


def check_sums(part: str, phi: np.ndarray, hat: np.ndarray, entity: np.ndarray, n: int) -> dict[str, float]:
    """A site's ``drl.check.<part>.*`` (module docstring, "Held-out check"): per test entity Σφτ̂, Σφ, Στ̂, Στ̂² and its
    steps, as cluster sums, and the entity count. ``phi``, ``hat`` and ``entity`` (each step's row) are flat over the
    valid steps; ``n`` the rows."""
    def per(x: np.ndarray) -> np.ndarray:
        return np.bincount(entity, weights=x, minlength=n)

    X = {"u": per(phi * hat), "v": per(phi), "w": per(hat), "q": per(hat * hat), "m": per(np.ones_like(phi))}
    seen = X["m"] > 0
    sums = cluster_sums(f"drl.check.{part}", {k: v[seen] for k, v in X.items()})
    return {f"drl.check.{part}.n": float(seen.sum()), **sums}


def heldout_check(s: dict[str, Any], part: str, delta: float = 0.0, delta_share: float = 0.0,
                  truth: Any | None = None) -> dict[str, Any] | None:
    """The held-out check of one part's per-step effects τ̂_t + δ (module docstring, "Held-out check") from the totals.

    Args:
        s: the consortium's totals.
        part: ``effect`` (the DR-learner) or ``model`` (the simulator's own contrast).
        delta: the shift the server adds to τ̂ (the DR-learner's re-fitted intercept; 0 for the simulator).
        delta_share: the test steps' share of the rows δ was fitted on (test / (test + validation) steps; 0 without
            a shift): δ carries that share of the test pseudo-outcomes' own noise, which the raw gain would credit.
        truth: the part's ``EffectStats`` (τ̂ + δ against the oracle) on the same steps, for ``true_gain``; or None.

    Returns:
        None without check sums (no logged propensities); else ``{"gain", "se", "z", "constant", "constant_se",
        "steps", "entities", "verdict", "rule"}`` and, with a truth on the same steps, ``true_gain`` = sd²τ − PEHE²
        (the skill score times sd²τ: what ``gain`` estimates).
    """
    pre = f"drl.check.{part}"
    if not s.get(f"{pre}.m") or not s.get(f"{pre}.n"):
        return None
    tot = {k: float(s[f"{pre}.{k}"]) for k in CHECK_FIELDS}
    n, m, d = float(s[f"{pre}.n"]), tot["m"], float(delta)
    c = tot["v"] / m  # the constant: the test steps' mean pseudo-outcome, the identified one-step effect
    # Σ_t (φ − c)² − (φ − τ̂ − δ)² = Σ 2φτ̂ + 2(δ − c)φ − 2δτ̂ − τ̂² + c² − δ², linear in the per-entity sums
    coef = {"u": 2.0, "v": 2.0 * (d - c), "w": -2.0 * d, "q": -1.0, "m": c * c - d * d}
    gain_sum = sum(coef[k] * tot[k] for k in CHECK_FIELDS)
    corr = n / max(n - 1.0, 1.0)
    # c is fitted on the φ it is compared on: Σ(φ − c)² falls short of the best constant's by M·(c − E c)², whose
    # mean is M·Var(c); δ, fitted partly on the same φ, gains 2·share·Var(c) per step. Both are added back, so that
    # the gain's expectation is sd²τ − PEHE² (without it: a bias of −Var(c) ≈ −0.001 per step at 300 entities)
    var_c = max(linear_cluster_ss(s, pre, CHECK_FIELDS, {"v": 1.0, "m": -c}), 0.0) * corr / (m * m)
    # cluster-robust over entities, c and δ held; c's error drops out to first order (∂gain/∂c = 0 at c = mean φ) but
    # not to second: the gain holds −(c − E c)², of variance 2·Var(c)² for a normal c, which is all there is where τ̂
    # is nearly constant (without it a constant τ̂ was "shown" in 16-23 % of draws, with it in none of 2,000:
    # benchmarks/heldout_check.py)
    var = max(linear_cluster_ss(s, pre, CHECK_FIELDS, coef) - gain_sum * gain_sum / n, 0.0) * corr
    gain = gain_sum / m + var_c * (1.0 - 2.0 * float(delta_share))
    se = math.sqrt(var / (m * m) + 2.0 * var_c * var_c)
    z = gain / se if se > 0 and math.isfinite(gain) else math.nan
    if not math.isfinite(z):
        verdict = "unavailable"
    else:
        verdict = "shown" if z >= CHECK_Z else "worse than the constant" if z <= -CHECK_Z else "not shown"
    out: dict[str, Any] = {
        "gain": gain, "se": se, "z": z, "constant": c, "constant_se": math.sqrt(var_c), "steps": int(round(m)),
        "entities": int(round(n)), "verdict": verdict,
        "rule": f"the held-out squared error of τ̂ against φ below (shown) or above (worse) that of the constant "
                f"{c:+.4f} by ≥ {CHECK_Z} SE; else not shown"}
    if truth is not None and truth.n == int(round(m)) and math.isfinite(truth.sum_true_sq):
        out["true_gain"] = truth.sd_true() ** 2 - truth.sse / truth.n
    return out


# -- the server: solve, request, merge --------------------------------------------------------------------------------
def fit_totals(totals: dict[str, Any]) -> dict[str, float] | None:
    """The ``drl.fit.*`` of the consortium's totals (None when absent), as stored with a scored round."""
    if not all(k in totals for k in FIT_NAMES):
        return None
    return {k: float(totals[k]) for k in FIT_NAMES}


def _matrices(s: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    A = np.zeros((K, K))
    for i, j in PAIRS:
        A[i, j] = A[j, i] = float(s[f"drl.fit.xx.{i}.{j}"])
    return A, np.array([float(s[f"drl.fit.xy.{i}"]) for i in range(K)])


def ridge_penalty(A: np.ndarray, sw: float, lam: float) -> np.ndarray:
    """The diagonal of the ridge penalty: λ Σw s_j² for the slopes, s_j the pooled weighted s.d. of feature j (from
    XᵀWX: the intercept column gives the means), 0 for the intercept. A feature constant everywhere (or λ = 0 on a
    rank-deficient design) gets a vanishing ridge so that the system stays solvable."""
    mean = A[0] / sw
    var = np.clip(np.diag(A) / sw - mean ** 2, 0.0, None)
    pen = np.maximum(lam * sw * var, 1e-9 * sw)
    pen[0] = 0.0
    return pen


def ridge_solution(A: np.ndarray, b: np.ndarray, sw: float, lam: float) -> np.ndarray:
    """β minimising Σ w(φ − xβ)² + Σ_j pen_j β_j² (:func:`ridge_penalty`) from the sums XᵀWX = ``A``, XᵀWφ = ``b``."""
    return np.linalg.solve(A + np.diag(ridge_penalty(A, sw, lam)), b)


def solve(s: dict[str, float] | None, sites: int, lambdas: tuple[float, ...] = LAMBDAS) -> dict[str, Any]:
    """β from the consortium's fit sums with λ chosen by GCV on :data:`LAMBDAS` (module docstring).

    GCV(λ) = n · RSS(λ) / (n − df(λ))², RSS = Σwφ² − 2βᵀXᵀWφ + βᵀXᵀWXβ and df = tr((XᵀWX + Λ)⁻¹ XᵀWX): all from
    the sums.

    Returns:
        ``{"coverage", "features", "n", "sites_scoring", "sites", "lambda", "df", "gcv", "beta"}``; ``beta`` is None
        (with ``why``) when no site could fit.
    """
    base: dict[str, Any] = {"features": list(FEATURES), "sites": int(sites), "weights": "unit",
                            "lambda_rule": "GCV over " + ", ".join(f"{x:g}" for x in lambdas)}
    n = 0.0 if s is None else float(s["drl.fit.n"])
    scoring = 0 if s is None else int(round(s["drl.fit.sites"]))
    base.update(n=int(n), sites_scoring=scoring)
    if s is None or n <= K or scoring == 0:
        return {**base, "coverage": "unavailable", "beta": None,
                "why": "no site sent validation pseudo-outcomes (no logged propensities, validation rows below the "
                       "cohort floor, or no scored round)"}
    A, b = _matrices(s)
    sw, syy = float(s["drl.fit.sw"]), float(s["drl.fit.syy"])
    best = None
    for lam in lambdas:
        try:
            lhs = A + np.diag(ridge_penalty(A, sw, lam))
            beta = np.linalg.solve(lhs, b)
            df = float(np.trace(np.linalg.solve(lhs, A)))
        except np.linalg.LinAlgError:
            continue
        rss = syy - 2 * beta @ b + beta @ A @ beta
        gcv = n * max(rss, 0.0) / max(n - df, 1.0) ** 2
        if best is None or gcv < best[0] - 1e-15:
            best = (gcv, lam, df, beta)
    if best is None:
        return {**base, "coverage": "unavailable", "beta": None, "why": "the ridge system could not be solved"}
    gcv, lam, df, beta = best
    return {**base, "coverage": "full" if scoring >= sites else "partial", "lambda": lam, "df": df, "gcv": gcv,
            "beta": [float(x) for x in beta]}


def intercept_shift(s: dict[str, Any], fit_steps: int) -> dict[str, Any] | None:
    """The re-fitted intercept's shift δ = Σ_test(φ_t − βᵀx_t) / (test steps + ``fit_steps``): the least-squares
    intercept of the validation and the test rows' pseudo-outcomes together with the slopes held. The validation
    residuals sum to 0 at β because its intercept is not penalised and the fit's weights are 1 (w_t = 1, module
    docstring), so only the test rows' residual sums are needed.

    Returns:
        None where no site sent test residuals (no logged propensities); else ``{"shift", "test_steps",
        "validation_steps"}``, with ``shift`` None and ``why`` where the residual total is not finite.
    """
    n = float(s.get("drl.effect.resid_n") or 0.0)
    if n <= 0:
        return None
    out: dict[str, Any] = {"test_steps": int(round(n)), "validation_steps": max(int(fit_steps), 0)}
    total = float(s.get("drl.effect.resid", math.nan))
    if not math.isfinite(total):
        return {**out, "shift": None, "why": "the test rows' residual sums are not finite: β's own intercept kept"}
    return {**out, "shift": total / (n + out["validation_steps"])}


def merge_effects(s: dict[str, Any], fit_steps: int) -> dict[str, Any] | None:
    """The DR-learner's and the simulator's one-step effect figures from the consortium's totals (PEHE, PEHE₀, sd τ,
    corr, skill against the constant true ATE; only the mean τ̂ without a truth). The DR-learner's are those of
    βᵀx_t + δ, its intercept re-fitted on the ``fit_steps`` validation steps β came from and the test steps
    (:func:`intercept_shift`; module docstring); ``intercept`` says how, with β's own figures beside
    (``unshifted``) and ``coverage`` "partial" where some test steps sent no residuals (no logged propensities)."""
    from fcd_secure.evaluation.metrics import EffectStats  # noqa: PLC0415

    if not s.get("drl.effect.n"):
        return None
    out: dict[str, Any] = {"steps": int(round(float(s["drl.effect.n"])))}
    shift = intercept_shift(s, fit_steps)
    for part, name in (("effect", "dr_learner"), ("model", "simulator")):
        es = EffectStats.from_sums(s, prefix=f"drl.{part}.")
        if es.n == 0:
            continue
        delta, share = 0.0, 0.0  # the server's shift of these effects and its share of test rows (heldout_check)
        if part == "effect" and shift is not None:
            icpt = {**shift, "beta_mean": es.sum_hat / es.n,
                    "coverage": "full" if shift["test_steps"] >= es.n else "partial",
                    "rule": "re-fitted on the validation and test rows' pseudo-outcomes, slopes held"}
            if math.isfinite(es.sse):
                icpt["unshifted"] = {k: v for k, v in es.skill_figures().items() if k in ("pehe", "corr", "skill")}
            if shift["shift"] is not None:
                es = es.shifted(shift["shift"])
                delta = shift["shift"]
                share = shift["test_steps"] / max(shift["test_steps"] + shift["validation_steps"], 1)
            out["intercept"] = icpt
        fig: dict[str, Any] = {"mean_tau_hat": es.sum_hat / es.n}
        if math.isfinite(es.sse):
            fig.update(es.skill_figures())
            fig["mean_tau"] = es.sum_true / es.n
        check = heldout_check(s, part, delta, share, es if math.isfinite(es.sse) else None)
        if check is not None:
            fig["heldout"] = check
        out[name] = fig
    return out


class DRLearnerFit(Query):
    """The ridge sums of a scored round's validation rows (module docstring, "Federated fit"): ``drl.fit.*``."""

    name = "drl.fit"
    quick = True

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return list(FIT_NAMES)

    def applies(self, ctx: SiteContext) -> bool:
        return ctx.request.keep_round is not None

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.queries.selection import validation_pair  # noqa: PLC0415

        return site_fit_sums(ctx.model, ctx.data, ctx.floor, validation_pair(ctx))

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if "select.d1.n" in totals:  # a scored round: the sums stored with it (its β is solved once chosen)
            answer["dr_learner_fit"] = fit_totals(totals)


class DRLearnerEffects(Query):
    """τ̂_t = βᵀx_t on the test rows with the held-out check (module docstring): ``drl.effect|model|check.*``."""

    name = "drl.effect"

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return list(EFFECT_NAMES)

    def applies(self, ctx: SiteContext) -> bool:
        return not ctx.request.quick and ctx.request.dr_learner_beta is not None

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        from fcd_secure.queries.targeted import one_step_terms  # noqa: PLC0415

        truth, pair = one_step_terms(ctx) or (None, None)
        return site_effect_sums(ctx.model, ctx.sub, ctx.data.anchors, np.asarray(ctx.request.dr_learner_beta),
                                truth, pair)

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        dr = merge_effects(totals, ctx.dr_fit_steps)
        if dr is not None:
            answer["dr_learner"] = dr

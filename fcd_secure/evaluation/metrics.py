"""Evaluation metrics of the paper (§IV-C "Metrics", Table III and Table IV), in numpy.

Definitions (Hill 2011; Shalit et al. 2017 and its cfrnet ``cfr/evaluation.py`` convention):

* **PEHE** = √( (1/|S|) Σ_{s∈S} (τ̂_s − τ_s)² ) — the *square root* of the mean squared individual-effect error
  (Hill 2011 defines ε_PEHE without the root; Shalit et al. and the paper's tables use the root).
  For sequences, ``s`` indexes (unit i, anchor t₀) pairs for one horizon; the caller flattens them.
* **ATE absolute error** = | mean τ̂ − mean τ |.  By Cauchy–Schwarz ATE error ≤ PEHE on the same set.
* **Policy value absolute error** = | V̂(π) − V(π) |.
* **Factual AUC** (paper ref. [33]): rank-based ROC AUC of the model's one-step-ahead probability of the factual
  outcome, pooled over valid steps (M = 1).
* **MMD**: biased (V-statistic) maximum mean discrepancy between two samples — the evaluation-side numpy twin of
  the model's differentiable L_align (paper §III, "representation balancing").

Federated evaluation: only aggregates may leave a site, so PEHE / ATE error have additive sufficient statistics
(:class:`EffectStats`) that a server merges into the *exact* pooled numbers, and factual AUC has a binned
histogram form (:class:`AUCStats`) that merges exactly for scores on the bin grid.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "pehe",
    "ate_error",
    "value_error",
    "rmse",
    "factual_auc",
    "mmd",
    "AdditiveSums",
    "effect_flags",
    "EffectStats",
    "NO_EFFECT_LEARNED",
    "NO_PER_ENTITY_SKILL",
    "AUCStats",
    "Summary",
    "summarise",
]


# -- input helpers ---------------------------------------------------------------------------------------------


def _as_float(name: str, x: object) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    return arr


def _paired(name_a: str, a: object, name_b: str, b: object, mask: object | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Flatten two same-shaped arrays, keep entries where ``mask`` is nonzero, and refuse NaN/inf there."""
    a_ = _as_float(name_a, a)
    b_ = _as_float(name_b, b)
    if a_.shape != b_.shape:
        raise ValueError(f"{name_a} has shape {a_.shape}, {name_b} has shape {b_.shape}; they must match")
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != a_.shape:
            raise ValueError(f"mask has shape {m.shape}, {name_a} has shape {a_.shape}; they must match")
        keep = m.astype(bool)
        a_, b_ = a_[keep], b_[keep]
    else:
        a_, b_ = a_.ravel(), b_.ravel()
    if a_.size == 0:
        raise ValueError("no entries left after applying the mask")
    for name, arr in ((name_a, a_), (name_b, b_)):
        if not np.isfinite(arr).all():
            idx = int(np.argwhere(~np.isfinite(arr))[0][0])
            raise ValueError(f"{name} holds NaN or inf (first at kept entry {idx})")
    return a_, b_


# -- effect metrics --------------------------------------------------------------------------------------------


def pehe(tau_hat: object, tau: object, mask: object | None = None) -> float:
    """√PEHE = √( mean_s (τ̂_s − τ_s)² ) over the entries kept by ``mask`` (cfrnet convention, paper Table III).

    Args:
        tau_hat: estimated individual effects.
        tau: true individual effects, same shape.
        mask: entries to keep (same shape, nonzero = kept); None keeps every entry.

    Raises:
        ValueError: shapes differ, nothing is kept, or a value is not finite.
    """
    th, t = _paired("tau_hat", tau_hat, "tau", tau, mask)
    return float(np.sqrt(np.mean((th - t) ** 2)))


def ate_error(tau_hat: object, tau: object, mask: object | None = None) -> float:
    """|ATE error| = | mean τ̂ − mean τ | over the entries kept by ``mask`` (paper Table III, "ATE"); arguments and
    errors as :func:`pehe`."""
    th, t = _paired("tau_hat", tau_hat, "tau", tau, mask)
    return float(abs(th.mean() - t.mean()))


def value_error(v_hat: float, v: float) -> float:
    """|V̂(π) − V(π)|, the policy-value absolute error of Table III. NaN in gives NaN out (no support stays visible)."""
    return float(abs(float(v_hat) - float(v)))


def rmse(y_hat: object, y: object, mask: object | None = None) -> float:
    """√( mean (ŷ − y)² ) over the entries kept by ``mask`` (TSTR-RMSE of Table IV uses it on probabilities)."""
    yh, yy = _paired("y_hat", y_hat, "y", y, mask)
    return float(np.sqrt(np.mean((yh - yy) ** 2)))


#: the skill flags, printed instead of a rank where they hold (``EffectStats.skill_figures``)
NO_PER_ENTITY_SKILL = "no per-entity skill"
NO_EFFECT_LEARNED = "no effect learned"


def effect_flags(pehe: float | None, pehe_zero: float | None, skill: float | None) -> list[str]:
    """The flags that stand where a rank by PEHE would mislead (:meth:`EffectStats.flags`; a table of means over
    seeds applies the same rule to its means): :data:`NO_EFFECT_LEARNED` where PEHE ≥ PEHE₀, :data:`NO_PER_ENTITY_SKILL`
    where the skill is not above 0 or not known."""
    out = []
    if pehe is not None and pehe_zero is not None and math.isfinite(pehe_zero) and pehe >= pehe_zero:
        out.append(NO_EFFECT_LEARNED)
    if skill is None or not (skill > 0.0):
        out.append(NO_PER_ENTITY_SKILL)
    return out


class AdditiveSums:
    """The merge of every additive statistic a site sends (a dataclass of sums): the union of two sets of rows is the
    field-wise sum, so a server that receives one per site (through secure aggregation: only the totals) computes the
    pooled figures exactly. :class:`EffectStats` and ``evaluation.discrepancy.DiscrepancySums`` are such sums."""

    @classmethod
    def empty(cls):
        """No rows: every sum 0 (the identity of :meth:`merge`)."""
        return cls(**{f.name: 0 for f in fields(cls)})

    def merge(self, other):
        """The statistics of the union of both sets of rows."""
        return type(self)(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __add__(self, other):
        return self.merge(other)

    @classmethod
    def merge_all(cls, parts: Iterable):
        """The statistics of the union of ``parts``."""
        out = cls.empty()
        for p in parts:
            out = out.merge(p)
        return out


@dataclass(frozen=True)
class EffectStats(AdditiveSums):
    """Additive sufficient statistics of PEHE, ATE error and the skill figures for one site (or any union of sites).

    ``n`` = |S|, ``sse`` = Σ (τ̂ − τ)², ``sum_hat`` = Σ τ̂, ``sum_true`` = Σ τ, ``sum_true_sq`` = Σ τ²,
    ``sum_hat_sq`` = Σ τ̂², ``sum_cross`` = Σ τ̂τ. Merging adds them, so a server that receives one ``EffectStats``
    per site (through secure aggregation: only the consortium's totals) computes the *exact* pooled figures of the
    union without seeing any individual effect: PEHE = √(sse / n), ATE error = |sum_hat − sum_true| / n.

    PEHE alone does not show skill: on a world whose effects vary little, predicting the true average effect for
    everyone already reaches PEHE = sd τ (the **constant-effect floor**), and predicting no effect at all reaches
    PEHE₀ = √(Σ τ² / n) (the **zero-effect PEHE**). So beside PEHE come (:meth:`skill_figures`): PEHE₀, sd τ,
    corr(τ̂, τ), the ATE ratio mean τ̂ / mean τ, and the skill score 1 − PEHE² / sd²τ against the constant true
    ATE (the R² of the individual effects, as in the CATE literature, e.g. Curth & van der Schaar 2021): > 0 only
    where the model orders entities better than the best constant. The last three sums are NaN for statistics made
    before they existed; the figures that need them are then NaN.
    """

    n: int
    sse: float
    sum_hat: float
    sum_true: float
    sum_true_sq: float = math.nan
    sum_hat_sq: float = math.nan
    sum_cross: float = math.nan

    #: the sums, in order (the keys ``effect.<sum>`` of a site's evaluation reply)
    SUMS = ("n", "sse", "sum_hat", "sum_true", "sum_true_sq", "sum_hat_sq", "sum_cross")

    @classmethod
    def from_arrays(cls, tau_hat: object, tau: object, mask: object | None = None) -> "EffectStats":
        """The statistics of one site's effects (arguments as :func:`pehe`)."""
        th, t = _paired("tau_hat", tau_hat, "tau", tau, mask)
        return cls(n=int(th.size), sse=float(np.sum((th - t) ** 2)), sum_hat=float(th.sum()), sum_true=float(t.sum()),
                   sum_true_sq=float(np.sum(t * t)), sum_hat_sq=float(np.sum(th * th)), sum_cross=float(np.sum(th * t)))

    @classmethod
    def from_sums(cls, sums: Mapping[str, float], prefix: str = "effect.") -> "EffectStats":
        """The statistics from a dict of sums keyed ``<prefix><sum>`` (a site's reply, or the consortium's totals);
        a sum a reply lacks is NaN."""
        vals = {k: float(sums.get(prefix + k, math.nan)) for k in cls.SUMS}
        return cls(**{**vals, "n": int(round(vals["n"]))})

    def _need(self, what: str) -> None:
        if self.n == 0:
            raise ValueError(f"EffectStats.{what}: no effects recorded (n = 0)")

    def pehe(self) -> float:
        """√(sse / n).

        Raises:
            ValueError: if no effect was recorded.
        """
        self._need("pehe")
        return math.sqrt(max(self.sse, 0.0) / self.n)

    def ate_error(self) -> float:
        """|sum_hat − sum_true| / n.

        Raises:
            ValueError: if no effect was recorded.
        """
        self._need("ate_error")
        return abs(self.sum_hat - self.sum_true) / self.n

    def pehe_zero(self) -> float:
        """PEHE₀ = √(Σ τ² / n): the PEHE of predicting no effect for anyone."""
        self._need("pehe_zero")
        return math.sqrt(max(self.sum_true_sq, 0.0) / self.n)

    def sd_true(self) -> float:
        """sd τ = √(Σ τ² / n − (Σ τ / n)²): the PEHE of predicting the true average effect for everyone."""
        self._need("sd_true")
        return math.sqrt(max(self.sum_true_sq / self.n - (self.sum_true / self.n) ** 2, 0.0))

    def sd_hat(self) -> float:
        """sd τ̂, the spread of the estimated effects (0: the model gives everyone the same effect)."""
        self._need("sd_hat")
        return math.sqrt(max(self.sum_hat_sq / self.n - (self.sum_hat / self.n) ** 2, 0.0))

    def corr(self) -> float:
        """Pearson corr(τ̂, τ); NaN when either side does not vary."""
        self._need("corr")
        cov = self.sum_cross / self.n - (self.sum_hat / self.n) * (self.sum_true / self.n)
        den = self.sd_hat() * self.sd_true()
        return cov / den if den > 1e-12 else math.nan

    def ate_ratio(self) -> float:
        """mean τ̂ / mean τ (1: the average effect is right; 0: none learned; < 0: the wrong sign)."""
        self._need("ate_ratio")
        return self.sum_hat / self.sum_true if abs(self.sum_true) > 1e-12 else math.nan

    def skill(self) -> float:
        """1 − PEHE² / sd²τ: the skill against the constant true ATE (> 0: better than the best constant)."""
        self._need("skill")
        var = self.sd_true() ** 2
        return 1.0 - (self.sse / self.n) / var if var > 1e-12 else math.nan

    def flags(self) -> list[str]:
        """What the figures say instead of a rank: :data:`NO_EFFECT_LEARNED` where PEHE is no better than PEHE₀
        (saying "no effect" would do as well), :data:`NO_PER_ENTITY_SKILL` where the skill score is ≤ 0 (the model
        does not order entities better than the constant true ATE)."""
        return effect_flags(self.pehe(), self.pehe_zero(), self.skill())

    def shifted(self, delta: float) -> "EffectStats":
        """The statistics of τ̂ + δ on the same rows, from the sums alone: Σ(τ̂ + δ − τ)² = sse + 2δ(Σ τ̂ − Σ τ) + nδ²,
        Σ(τ̂ + δ) = Σ τ̂ + nδ, Σ(τ̂ + δ)² = Σ τ̂² + 2δ Σ τ̂ + nδ², Σ(τ̂ + δ)τ = Σ τ̂τ + δ Σ τ (a model's intercept
        re-fitted by the server, e.g. ``queries.dr_learner``). Missing sums stay NaN."""
        d, n = float(delta), self.n
        return EffectStats(n=n, sse=self.sse + 2 * d * (self.sum_hat - self.sum_true) + n * d * d,
                           sum_hat=self.sum_hat + n * d, sum_true=self.sum_true, sum_true_sq=self.sum_true_sq,
                           sum_hat_sq=self.sum_hat_sq + 2 * d * self.sum_hat + n * d * d,
                           sum_cross=self.sum_cross + d * self.sum_true)

    def skill_figures(self) -> dict[str, object]:
        """PEHE with what it means beside it: ``pehe``, ``pehe_zero``, ``sd_tau``, ``sd_tau_hat``, ``corr``,
        ``ate_ratio``, ``skill``, ``flags`` (NaN where a sum is missing)."""
        return {"pehe": self.pehe(), "pehe_zero": self.pehe_zero(), "sd_tau": self.sd_true(),
                "sd_tau_hat": self.sd_hat(), "corr": self.corr(), "ate_ratio": self.ate_ratio(),
                "skill": self.skill(), "flags": self.flags()}

    def to_dict(self) -> dict[str, float]:
        """The sums by name."""
        return {k: getattr(self, k) for k in self.SUMS}


# -- factual AUC -----------------------------------------------------------------------------------------------


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank (the Mann–Whitney convention)."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # boundaries of runs of equal values
    change = np.flatnonzero(np.diff(xs)) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [xs.size]))
    avg = (starts + ends + 1) / 2.0  # mean of 1-based ranks start+1 .. end
    ranks_sorted = np.repeat(avg, ends - starts)
    ranks = np.empty_like(ranks_sorted)
    ranks[order] = ranks_sorted
    return ranks


def factual_auc(y_true: object, p_hat: object, mask: object | None = None) -> float:
    """ROC AUC of scores ``p_hat`` for binary ``y_true`` over entries kept by ``mask`` (paper §IV-C "Factual AUC").

    Rank form of the Mann–Whitney statistic: AUC = (Σ_{i: y=1} rank_i − n₁(n₁+1)/2) / (n₁ n₀) with average ranks for
    ties, i.e. P(p⁺ > p⁻) + ½ P(p⁺ = p⁻).

    Args:
        y_true: 0/1 outcomes.
        p_hat: scores, same shape.
        mask: entries to keep (same shape, nonzero = kept); None keeps every entry.

    Raises:
        ValueError: labels that are not 0/1, or one class absent among the kept entries.
    """
    y, p = _paired("y_true", y_true, "p_hat", p_hat, mask)
    if not np.isin(y, (0.0, 1.0)).all():
        bad = float(y[~np.isin(y, (0.0, 1.0))][0])
        raise ValueError(f"factual_auc: y_true must be 0/1, found {bad}")
    pos = y == 1.0
    n1 = int(pos.sum())
    n0 = int(y.size - n1)
    if n1 == 0 or n0 == 0:
        raise ValueError(
            f"factual_auc: AUC is undefined with a single class ({n1} positives, {n0} negatives among kept entries)"
        )
    ranks = _average_ranks(p)
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


@dataclass(frozen=True)
class AUCStats:
    """Per-site histogram of scores by class, mergeable across sites (federated factual AUC).

    Scores in [0, 1] are binned into ``bins`` equal cells; ``pos[k]`` / ``neg[k]`` count positives / negatives in
    cell k. The AUC of the merged histograms counts pairs in different cells exactly and pairs in the same cell as
    ties (½). It therefore equals :func:`factual_auc` on the pooled data whenever no two distinct scores share a
    cell (e.g. scores already rounded to the grid) and is otherwise within the within-cell tie mass of it.
    Only class counts per score cell leave a site, never a (score, label) pair.
    """

    pos: np.ndarray
    neg: np.ndarray

    @classmethod
    def from_scores(cls, y_true: object, p_hat: object, mask: object | None = None, bins: int = 1000) -> "AUCStats":
        """The histograms of one site's scores.

        Args:
            y_true: 0/1 outcomes.
            p_hat: probabilities in [0, 1], same shape.
            mask: entries to keep; None keeps every entry.
            bins: equal cells over [0, 1].

        Raises:
            ValueError: labels that are not 0/1, scores outside [0, 1], or ``bins`` < 1.
        """
        if bins < 1:
            raise ValueError(f"AUCStats: bins must be >= 1, got {bins}")
        y, p = _paired("y_true", y_true, "p_hat", p_hat, mask)
        if not np.isin(y, (0.0, 1.0)).all():
            raise ValueError("AUCStats: y_true must be 0/1")
        if (p < 0).any() or (p > 1).any():
            raise ValueError("AUCStats: p_hat must lie in [0, 1] (probabilities)")
        cell = np.minimum((p * bins).astype(np.int64), bins - 1)
        pos = np.bincount(cell[y == 1.0], minlength=bins).astype(np.int64)
        neg = np.bincount(cell[y == 0.0], minlength=bins).astype(np.int64)
        return cls(pos=pos, neg=neg)

    def merge(self, other: "AUCStats") -> "AUCStats":
        """The histograms of both sites together (same ``bins``)."""
        if self.pos.shape != other.pos.shape:
            raise ValueError(f"AUCStats.merge: bin counts differ ({self.pos.size} vs {other.pos.size})")
        return AUCStats(pos=self.pos + other.pos, neg=self.neg + other.neg)

    __add__ = merge

    def auc(self) -> float:
        """The AUC of the histograms (pairs in one cell count as ties).

        Raises:
            ValueError: if one class is absent.
        """
        n1, n0 = int(self.pos.sum()), int(self.neg.sum())
        if n1 == 0 or n0 == 0:
            raise ValueError(f"AUCStats.auc: AUC is undefined with a single class ({n1} positives, {n0} negatives)")
        neg_below = np.concatenate(([0], np.cumsum(self.neg)[:-1]))
        pairs = float(np.sum(self.pos * (neg_below + 0.5 * self.neg)))
        return pairs / (n1 * n0)


# -- MMD -------------------------------------------------------------------------------------------------------


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    return np.maximum(d, 0.0)


def mmd(
    x: object,
    y: object,
    kernel: str = "rbf",
    bandwidth: float | Sequence[float] | None = None,
    squared: bool = False,
) -> float:
    """Biased (V-statistic) MMD between samples ``x`` [n, d] and ``y`` [m, d].

    MMD²_b = mean k(x, x') + mean k(y, y') − 2 mean k(x, y) (Gretton et al. 2012, eq. 5), which is ≥ 0 and exactly
    0 for identical samples. ``kernel="rbf"``: k(u, v) = Σ_h exp(−‖u − v‖² / (2 h²)) / |H| over bandwidths H
    (``None`` = median heuristic on the pooled sample); ``kernel="linear"``: k(u, v) = uᵀv, so MMD² = ‖x̄ − ȳ‖².

    Args:
        x: sample ``[n, d]`` (1-d is treated as ``[n, 1]``).
        y: sample ``[m, d]``.
        kernel: 'rbf' or 'linear'.
        bandwidth: RBF bandwidth(s); None for the median heuristic.
        squared: return MMD² instead of MMD.

    Raises:
        ValueError: mismatched dims, non-finite values, a bad bandwidth or an unknown kernel.
    """
    xa = _as_float("x", x)
    ya = _as_float("y", y)
    xa = xa[:, None] if xa.ndim == 1 else xa
    ya = ya[:, None] if ya.ndim == 1 else ya
    if xa.ndim != 2 or ya.ndim != 2 or xa.shape[1] != ya.shape[1]:
        raise ValueError(f"mmd: x and y must be [n, d] with the same d, got {xa.shape} and {ya.shape}")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        raise ValueError("mmd: x or y holds NaN or inf")
    if kernel == "linear":
        diff = xa.mean(0) - ya.mean(0)
        m2 = float(diff @ diff)
    elif kernel == "rbf":
        dxx, dyy, dxy = _sq_dists(xa, xa), _sq_dists(ya, ya), _sq_dists(xa, ya)
        if bandwidth is None:
            pooled = np.concatenate([dxx.ravel(), dyy.ravel(), dxy.ravel()])
            med = float(np.median(pooled[pooled > 0])) if (pooled > 0).any() else 1.0
            hs: list[float] = [math.sqrt(med / 2.0)]  # so that 2h² = median squared distance
        else:
            hs = [float(bandwidth)] if np.isscalar(bandwidth) else [float(h) for h in bandwidth]  # type: ignore[union-attr]
        if any(h <= 0 or not math.isfinite(h) for h in hs):
            raise ValueError(f"mmd: bandwidths must be positive and finite, got {hs}")

        def k(d: np.ndarray) -> np.ndarray:
            return sum(np.exp(-d / (2.0 * h * h)) for h in hs) / len(hs)

        m2 = float(k(dxx).mean() + k(dyy).mean() - 2.0 * k(dxy).mean())
    else:
        raise ValueError(f"mmd: unknown kernel {kernel!r} (use 'rbf' or 'linear')")
    m2 = max(m2, 0.0)  # rounding can give −1e-17 for near-identical samples
    return m2 if squared else math.sqrt(m2)


# -- summaries over seeds --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """mean ± s.d. over seeds. ``std`` is the sample s.d. (ddof = 1; 0 for one seed). NaN seeds are counted in
    ``n_nan`` and left out of mean/std, so an unsupported OPE value in one seed stays visible instead of vanishing."""

    mean: float
    std: float
    n: int
    n_nan: int = 0

    def __str__(self) -> str:
        if self.n == 0:
            return "nan"
        s = f"{self.mean:.3f}±{self.std:.3f}"
        return s + (f" ({self.n_nan} NaN)" if self.n_nan else "")

    def to_dict(self) -> dict[str, float]:
        """mean, std, n and n_nan by name."""
        return {"mean": self.mean, "std": self.std, "n": self.n, "n_nan": self.n_nan}


def _summary(values: Sequence[float]) -> Summary:
    arr = np.asarray([float(v) for v in values], dtype=np.float64)
    ok = arr[np.isfinite(arr)]
    n_nan = int(arr.size - ok.size)
    if ok.size == 0:
        return Summary(mean=float("nan"), std=float("nan"), n=0, n_nan=n_nan)
    std = float(ok.std(ddof=1)) if ok.size > 1 else 0.0
    return Summary(mean=float(ok.mean()), std=std, n=int(ok.size), n_nan=n_nan)


def summarise(seeds_results: Sequence[float] | Sequence[Mapping[str, float]]) -> Summary | dict[str, Summary]:
    """Mean ± s.d. over seeds (the "0.057±0.01" cells of Table III).

    Args:
        seeds_results: one value per seed, or one mapping of metric → value per seed.

    Returns:
        ``[0.05, 0.06, ...]`` → one :class:`Summary`; ``[{"pehe": .05, "ate": .04}, ...]`` →
        ``{"pehe": Summary, ...}`` over the keys of the seeds.

    Raises:
        ValueError: no seeds, or a seed whose keys differ from the first seed's (never a silent drop).
    """
    if len(seeds_results) == 0:
        raise ValueError("summarise: no seed results")
    if isinstance(seeds_results[0], Mapping):
        keys = list(seeds_results[0].keys())  # type: ignore[union-attr]
        for i, r in enumerate(seeds_results):
            if not isinstance(r, Mapping) or set(r.keys()) != set(keys):
                raise ValueError(f"summarise: seed {i} has keys {sorted(getattr(r, 'keys', lambda: [])())}, expected {sorted(keys)}")
        return {k: _summary([r[k] for r in seeds_results]) for k in keys}  # type: ignore[index]
    return _summary(seeds_results)  # type: ignore[arg-type]

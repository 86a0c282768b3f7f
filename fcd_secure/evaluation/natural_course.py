"""The natural-course check of a g-formula simulator: its trajectories under the logging policy against the logs.

The parametric g-formula's standard validation (Taubman, Robins, Mittleman & Hernán 2009, "Intervening on risk
factors for coronary heart disease: an application of the parametric g-formula", Int. J. Epidemiol. 38:1599-1611;
the ``natural course`` of the gfoRmula package, McGrath et al. 2020, Patterns 1(3)): simulate every entity from its
start under the policy that generated the data and compare the simulated mean of the outcome at each step with the
observed mean. Under the logging policy the simulated and the observed trajectories estimate the same distribution,
so a gap beyond chance is a defect of the simulator (or of its model of the logging policy), whatever the target
policies ask later. The check needs no propensities at all, only the logging policy's probabilities on *simulated*
histories, which a site has from its own model of it.

Per step t, over the entities whose step t is logged (``M_it = 1``; the logged censoring is taken as given), the
gap d_it = ŷ_it − y_it between the model's expected outcome (averaged over its simulated futures) and the observed
one. The sums ``n_t = Σ_i M_it``, ``Σ_i d_it``, ``Σ_i d_it²`` (and the two means) add over sites, so the merged
per-step gap d̄_t = Σ d / n_t and its standard error s_t / √n_t are exactly those of the pooled logs. Summaries:

* ``max_abs_z`` = max_t |d̄_t| / se_t, read against the Bonferroni critical value over the steps (``z_crit``);
* ``chi2`` = Σ_t z_t² over the steps with a standard error, with its degrees of freedom and p-value; it treats the
  steps as independent, which they are not (one entity contributes to many steps), so it is a screen, not a test;
* ``mean_abs_gap`` = the mean over steps of |d̄_t|, in the outcome's units.

Contexts the simulator generates (endogenous columns) are compared the same way, pooled over the steps per column.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

__all__ = ["STEP_FIELDS", "natural_course_summary", "step_gap_sums"]

#: the per-step sums of the outcome gap (each a list over steps): n, Σd, Σd², Σŷ, Σy
STEP_FIELDS = ("n", "s", "ss", "sim", "obs")


def step_gap_sums(sim_mean: np.ndarray, observed: np.ndarray, mask: np.ndarray, min_n: int = 1
                  ) -> dict[str, np.ndarray]:
    """The per-step sums of the gap between simulated and observed values over the rows of one site.

    Args:
        sim_mean: the model's expected value per row and step (mean over simulated futures), ``[n, H]``.
        observed: the logged values, ``[n, H]``.
        mask: 1 where the step is logged, ``[n, H]``.
        min_n: a step logged for fewer rows sends zeros (no sum about fewer entities than the site's floor).

    Returns:
        ``{field: [H]}`` for every field of :data:`STEP_FIELDS`.
    """
    m = np.asarray(mask, dtype=np.float64)
    sim = np.where(m > 0, np.asarray(sim_mean, dtype=np.float64), 0.0)
    obs = np.where(m > 0, np.asarray(observed, dtype=np.float64), 0.0)
    d = sim - obs
    out = {"n": m.sum(0), "s": d.sum(0), "ss": (d * d).sum(0), "sim": sim.sum(0), "obs": obs.sum(0)}
    few = out["n"] < max(int(min_n), 1)
    return {k: np.where(few, 0.0, v) for k, v in out.items()}


def natural_course_summary(n: np.ndarray, s: np.ndarray, ss: np.ndarray, sim: np.ndarray, obs: np.ndarray,
                           level: float = 0.9) -> dict:
    """The merged check from the consortium's per-step sums (module docstring).

    Returns:
        ``{"steps": [{"t", "n", "simulated", "observed", "gap", "se", "z"}], "max_abs_z", "z_crit", "chi2", "df",
        "p_value", "mean_abs_gap", "n_steps", "passes"}``; ``passes`` is whether ``max_abs_z`` stays below ``z_crit``
        (None when no step has a standard error).
    """
    n, s, ss = (np.asarray(x, dtype=np.float64) for x in (n, s, ss))
    sim, obs = np.asarray(sim, dtype=np.float64), np.asarray(obs, dtype=np.float64)
    rows, zs, gaps = [], [], []
    for t in np.flatnonzero(n > 0):
        k = float(n[t])
        gap = float(s[t] / k)
        se = math.sqrt(max(float(ss[t]) - k * gap * gap, 0.0) / (k - 1) / k) if k > 1 else math.nan
        z = gap / se if se > 0 and math.isfinite(se) else math.nan
        rows.append({"t": int(t), "n": int(round(k)), "simulated": float(sim[t] / k), "observed": float(obs[t] / k),
                     "gap": gap, "se": se if math.isfinite(se) else None, "z": z if math.isfinite(z) else None})
        gaps.append(abs(gap))
        if math.isfinite(z):
            zs.append(z)
    out: dict = {"steps": rows, "n_steps": len(rows),
                 "mean_abs_gap": float(np.mean(gaps)) if gaps else None,
                 "max_abs_z": None, "z_crit": None, "chi2": None, "df": 0, "p_value": None, "passes": None}
    if zs:
        # scipy.stats costs a process about as much to import as the rest of the ServerApp's own modules (python -X
        # importtime): imported where the χ² tail is taken, a deployed ServerApp imports it beside its first
        # messages (apps.server_app.later_imports) instead of before them
        from scipy.stats import chi2 as chi2_dist  # noqa: PLC0415

        z = np.asarray(zs)
        crit = NormalDist().inv_cdf(1 - (1 - level) / (2 * len(zs)))  # Bonferroni over the steps
        chi = float((z * z).sum())
        out.update(max_abs_z=float(np.abs(z).max()), z_crit=float(crit), chi2=chi, df=len(zs),
                   p_value=float(chi2_dist.sf(chi, len(zs))), passes=bool(np.abs(z).max() <= crit))
    return out

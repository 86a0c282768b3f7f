"""The regimen-directed score check of a g-formula simulator: each regimen's pull on the whole trajectory, from the
logs and from the simulator, compared.

The natural course (``evaluation.natural_course``) compares the simulator with the logs under the logging policy
only, so a simulator whose regimens overshoot can pass it (issue 42: on a carry-over world the natural course improves
over training rounds while the regimens' whole-trajectory error grows). This check reads the regimens without their
weight products. Tilt the logging policy P at step t towards regimen π's action, P_δ(a | h_t) ∝ P(a | h_t)·exp(δ·π(a |
h_t)): the derivative of the expected return-to-go at δ = 0 is the covariance of the tilt's score with the return
(the policy-gradient identity, Williams 1992, Machine Learning 8:229; Sutton, McAllester, Singh & Mansour 2000, NIPS
12; for a binary action it is the derivative of Kennedy's incremental propensity-score intervention in log δ, Kennedy
2019, JASA 114:645-656):

    g_π,t = E[(π(A_t | H_t) − Σ_a P(a | H_t) π(a | H_t)) · G_t],    G_t = Σ_{s ≥ t} Y_s / L,

with L the entity's logged steps (so Σ_t g_π,t is the derivative of the per-step value the product reports). Under
sequential exchangeability and per-step positivity, g_π,t is identified from the logs with their propensities, and a
g-formula simulator implies its own value from its natural-course rollouts (actions drawn from P on the simulated
history, G_t from its expected outcomes): a right simulator gives the same g_π,t. The score has mean zero given
H_t, so it needs no weight product and its effective sample does not shrink with the horizon; for a binary action
g_π,t = E[P(1 − P)·(Q_t(H_t, π) − Q_t(H_t, other))]: the simulator's effect of one step's action on the whole
remaining trajectory, which is what carries over into the regimens' values.

Per entity i and step t the paired difference d_it = ū_it − u_it between the simulator's score·return (averaged over
its futures from the same start) and the logged one; the per-step sums (``evaluation.natural_course.step_gap_sums``)
and the per-entity whole-trajectory sums D_i = Σ_t d_it (n, ΣD, ΣD²) add over sites. Summaries per regimen: the
per-step gaps with SEs and the whole-trajectory gap ḡ_π = ΣD / n with its SE and z.
"""

from __future__ import annotations

import math

import numpy as np

from fcd_secure.evaluation.natural_course import natural_course_summary, step_gap_sums

__all__ = ["WHOLE_FIELDS", "centred_returns", "regimen_score_summary", "return_to_go", "score_gap_sums", "tilt_score"]

#: the per-entity whole-trajectory sums: entities, Σ_i D_i, Σ_i D_i²
WHOLE_FIELDS = ("n", "s", "ss")


def return_to_go(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """G_t = Σ_{s ≥ t} M_s·values_s / L over the last axis, L = Σ_s M_s per entity (module docstring).

    Args:
        values: outcomes (logged, or a simulator's expected ones), ``[n, H]`` or ``[n, S, H]``.
        mask: 1 where a step is logged, ``[n, H]``.
    """
    m = np.asarray(mask, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 3:
        m = m[:, None, :]
    mv = np.where(m > 0, v, 0.0)
    g = np.flip(np.cumsum(np.flip(mv, -1), -1), -1)
    return g / np.maximum(m.sum(-1, keepdims=True), 1.0)


def centred_returns(g_sim: np.ndarray, g_obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The returns-to-go less a baseline that is a function of the entity's start only, so that the score's mean is
    unchanged (E[u_t | H_t] = 0) and its variance smaller (the policy-gradient baseline, Williams 1992, §7): each
    simulated future less the mean of the entity's *other* futures (leave one out, so independent of that future),
    the logged return less the mean of all its simulated futures.

    Args:
        g_sim: the simulated returns-to-go, ``[n, S, H]`` (S ≥ 2).
        g_obs: the logged returns-to-go, ``[n, H]``.
    """
    g_sim = np.asarray(g_sim, np.float64)
    S = g_sim.shape[1]
    total = g_sim.sum(1, keepdims=True)
    loo = (total - g_sim) / max(S - 1, 1)
    return g_sim - loo, np.asarray(g_obs, np.float64) - total[:, 0] / S


def tilt_score(took: np.ndarray, pi: np.ndarray, q: np.ndarray) -> np.ndarray:
    """π(A_t | H_t) − Σ_a P(a | H_t) π(a | H_t): the score of the tilt towards π (module docstring).

    Args:
        took: one-hot of the action taken, ``[..., K]``.
        pi: π(a | H_t) for every action, ``[..., K]``.
        q: P(a | H_t) (the logging policy's, or the site's model of it), ``[..., K]``.
    """
    pi = np.asarray(pi, dtype=np.float64)
    return (np.asarray(took, np.float64) * pi).sum(-1) - (np.asarray(q, np.float64) * pi).sum(-1)


def score_gap_sums(sim_terms: np.ndarray, obs_terms: np.ndarray, mask: np.ndarray, min_n: int = 1
                   ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The per-step and the whole-trajectory sums of d_it = sim − obs (module docstring) over one site's rows.

    Args:
        sim_terms: the simulator's score·return per entity and step, averaged over its futures, ``[n, H]``.
        obs_terms: the logged score·return, ``[n, H]``.
        mask: 1 where a step is logged, ``[n, H]``.
        min_n: fewer entities send zeros (the site's cohort floor), per step and for the whole trajectory.

    Returns:
        ``(steps, whole)``: ``step_gap_sums``'s lists and ``{field: float}`` of :data:`WHOLE_FIELDS`.
    """
    steps = step_gap_sums(sim_terms, obs_terms, mask, min_n)
    m = np.asarray(mask, dtype=np.float64) > 0
    d = np.where(m, np.asarray(sim_terms, np.float64) - np.asarray(obs_terms, np.float64), 0.0).sum(1)[m.any(1)]
    whole = {"n": float(d.size), "s": float(d.sum()), "ss": float((d * d).sum())}
    if d.size < max(int(min_n), 1):
        whole = dict.fromkeys(WHOLE_FIELDS, 0.0)
    return steps, whole


def regimen_score_summary(steps: dict[str, np.ndarray], whole: dict[str, float], level: float = 0.9) -> dict:
    """One regimen's merged check from the consortium's sums (module docstring).

    Returns:
        ``natural_course_summary``'s per-step figures of the score gap, and ``gap``, ``se``, ``z`` of the
        whole-trajectory gap (None where fewer than two entities).
    """
    out = natural_course_summary(steps["n"], steps["s"], steps["ss"], steps["sim"], steps["obs"], level)
    n, s, ss = (float(whole[f]) for f in WHOLE_FIELDS)
    gap = se = z = None
    if n > 1:
        gap = s / n
        se = math.sqrt(max(ss - n * gap * gap, 0.0) / (n - 1) / n)
        z = gap / se if se > 0 else None
    out.update(gap=gap, se=se, z=z, entities=int(round(n)))
    return out

"""The per-policy terms of a what-if question on one site, computed once and read by every policy query.

For every policy π of the question (bound to the site's action labels and context columns, thresholds read on the
site's own grid, the question admitted against its differencing budget first, ``queries.budget``):

* the do-simulation of the site's simulator over its test entities from t = 0 (``model.simulate``; endogenous
  contexts generated, exogenous replayed), with common random numbers across policies (one seed);
* each entity's simulated value v_i(π) (the per-step average over the valid steps of the window, per simulated
  future and averaged), and the model's expected outcome per step;
* π(logged a_t | logged history) at every step of the site's rows (``queries.logged.target_probs``; a stochastic policy's from
  the logged propensities, ``queries.incremental``): the numerator of every importance weight.

and once per question the factual rectifier r_i = v̂_i(logged actions) − ȳ_i (the model replaying each entity's logged
actions, minus its observed per-step mean over the same window). The simulated values, the doubly robust values, the
off-policy sums, the identified horizons and the support all read these terms (``queries.policy_values`` and its
parts); nothing here leaves the site.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure.data.policy import Policy, bind_policy, snap_threshold
from fcd_secure.data.schema import SiteDataset
from fcd_secure.queries.base import SiteContext
from fcd_secure.queries.incremental import attach_behaviour
from fcd_secure.queries.logged import target_probs

__all__ = ["HORIZONS", "PolicyRollout", "Rollouts", "bind_question", "horizon_grid", "per_sample_values", "rollouts",
           "true_values"]

#: the horizons a policy value is estimated on (those ≤ the question's horizon and the data's length)
HORIZONS = (1, 2, 3, 5, 10, 20)


def horizon_grid(max_h: int) -> list[int]:
    """The horizons of :data:`HORIZONS` up to ``max_h``."""
    return [h for h in HORIZONS if h <= int(max_h)]


def per_sample_values(sim) -> np.ndarray:
    """Each simulated future's value ``[n, S]`` (the per-step average over valid steps of the window)."""
    denom = np.maximum(sim.mask.sum(1), 1.0)
    return (np.asarray(sim.probs, np.float64) * sim.mask[:, None, :]).sum(2) / denom[:, None]


@dataclass
class PolicyRollout:
    """One bound policy's terms on the site's rows (module docstring)."""

    policy: Policy
    sim: Any
    per_sample: np.ndarray
    _pi: np.ndarray | None = None
    _sub: SiteDataset | None = None
    _anchors: tuple[int, int] = (0, 0)

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def value(self) -> np.ndarray:
        """v_i(π), ``[n]``."""
        return self.per_sample.mean(1)

    @property
    def step_value(self) -> np.ndarray:
        """The model's expected outcome under π at each step from t = 0, ``[n, H]``."""
        return np.asarray(self.sim.probs, dtype=np.float64).mean(1)

    @property
    def pi(self) -> np.ndarray:
        """π(logged a_t | logged history), ``[n, L]`` (computed once)."""
        if self._pi is None:
            self._pi = target_probs(self.policy, self._sub, *self._anchors)
        return self._pi


@dataclass
class Rollouts:
    """The question's terms on one site: every policy's :class:`PolicyRollout` (in the question's order), the
    factual residual, the horizon, how each threshold was read, and what the doubly robust part computed for the
    per-entity file (it never leaves the site)."""

    policies: list[PolicyRollout]
    residual: np.ndarray
    horizon: int
    grid_notes: dict[str, dict[str, Any]]
    contexts: dict[str, list[str]]
    dr: dict[str, np.ndarray] = field(default_factory=dict)
    dr_steps: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def by_name(self, name: str) -> PolicyRollout:
        return next(r for r in self.policies if r.name == name)


def rollouts(ctx: SiteContext) -> Rollouts:
    """The question's :class:`Rollouts` on this site, computed once per evaluation (``ctx.once``).

    Raises:
        DataError: a policy names a label or a context column this site's data does not have.
        Refusal: ``eval_cohort`` (``queries.budget.admit_question``): two policies' cohorts differ by too few entities.
    """
    return ctx.once("policy.rollouts", lambda: _build(ctx))


def bind_question(ctx: SiteContext, policies: list[Policy], rows: SiteDataset, H: int, seed: int,
                  record: Path | None) -> tuple[list[Policy], dict[str, dict[str, Any]]]:
    """The question's policies bound on the site before anything is simulated: every threshold read on the site's own
    grid (P42), the labels and context columns bound to ``rows``, stochastic policies acting through the site's own
    π̂, and the question admitted against its differencing budget (P41; ``record``: the site's record of answered
    cohorts, None to check the question's own policies only). Returns the bound policies and how each threshold was
    read (kept in the site's per-entity file).

    Raises:
        DataError: a policy names a label or a context column the site's data does not have.
        Refusal: ``eval_cohort`` (``queries.budget.admit_question``).
    """
    from fcd_secure.queries.budget import admit_question  # noqa: PLC0415

    bound = []
    grid_notes: dict[str, dict[str, Any]] = {}
    for raw in policies:
        if ctx.questions is not None:
            raw, note = snap_threshold(raw, ctx.data.train, ctx.questions.threshold_grid)
            if note is not None:
                grid_notes[raw.name] = note
        bound.append(bind_policy(raw, rows))
    bound = attach_behaviour(bound, ctx.data.train, seed)
    if ctx.questions is not None:
        admit_question(bound, rows, ctx.data.anchors, H, ctx.questions.min_difference, record)
    return bound, grid_notes


def _build(ctx: SiteContext) -> Rollouts:
    from fcd_secure.queries.budget import QUESTION_SLOT  # noqa: PLC0415

    sub, data, question = ctx.sub, ctx.data, ctx.request.whatif
    H = sub.L if question.horizon is None else question.horizon
    record = None if ctx.site_dir is None else Path(ctx.site_dir) / "slots" / QUESTION_SLOT
    bound, grid_notes = bind_question(ctx, question.policies, sub, H, ctx.seed, record)
    n_samples = ctx.n_samples
    # the factual rectifier: the model's value of the logged actions minus the observed value
    replay = ctx.model.simulate_policy(sub, sub.T[:, :H].copy(), None, n_samples, ctx.seed, horizon=H)
    observed = (sub.Y[:, :H] * sub.M[:, :H]).sum(1) / np.maximum(sub.M[:, :H].sum(1), 1.0)
    residual = per_sample_values(replay).mean(1) - observed
    out: list[PolicyRollout] = []
    contexts: dict[str, list[str]] = {}
    for pol in bound:
        sim = ctx.model.simulate_policy(sub, pol, data.anchors, n_samples, ctx.seed, horizon=question.horizon)
        contexts = sim.contexts
        out.append(PolicyRollout(pol, sim, per_sample_values(sim), _sub=sub,
                                 _anchors=(int(data.anchors[0]), int(data.anchors[1]))))
    return Rollouts(out, residual, H, grid_notes, contexts)


def true_values(ctx: SiteContext, terms: Rollouts, r: PolicyRollout) -> dict[int | None, float]:
    """The oracle's value of ``r``'s policy on the site's whole test split (the caller checks there is an oracle and
    the rows are all of it), keyed by horizon: the question's own (``question.horizon``, None for every valid step)
    and each of :func:`horizon_grid` up to ``terms.horizon``.

    The simulated values' truth and the identified horizons' truths ask the same policy at these horizons; one rollout
    of the longest answers them all (``OracleWorld.true_policy_values_at``, bit for bit the values of a rollout per
    horizon), once per evaluation (``ctx.once``)."""
    data = ctx.data
    horizons = (ctx.request.whatif.horizon, *horizon_grid(terms.horizon))

    def make() -> dict[int | None, float]:
        values = data.oracle.true_policy_values_at(r.policy, data.site_index, "test", horizons)
        return {h: v for h, (v, _se) in zip(horizons, values)}

    return ctx.once(f"policy.truth.{r.name}", make)

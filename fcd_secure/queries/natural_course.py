"""The natural-course check of the simulator (``evaluation.natural_course``), as the consortium's sums.

Each site rolls its entities out from their start (t = 0, only X and A_0 known) under its **logging policy**, as the
simulator would under any target policy, and sends per step the sums of the gap between the simulated and the
observed outcome (``natcourse.y.<field>``, lists over the steps, :data:`~fcd_secure.evaluation.natural_course.STEP_FIELDS`)
and, where the simulator generates endogenous contexts, per column the same sums pooled over the steps
(``natcourse.a.<field>``). The server merges them into the per-step gaps with standard errors, the largest |z| and a
chi-square, and the mean absolute gap: the parametric g-formula's standard validation (Taubman et al. 2009), the one
check of the whole-trajectory values that needs no propensities.

**The logging policy on simulated histories.** A log holds the logging probability of the logged action only
(``P``), not the logging policy's distribution on a history the simulator made up; so the rollout acts through the
site's own model of its logging policy (``evaluation.propensity.HistoryPropensity``, fit on its first training
entities up to :data:`NC_FIT_STEPS` logged steps, as the stochastic policies' rollouts do on all of them,
``queries.incremental``), whether the table logs propensities or not. A gap is then
the simulator's error *or* that model's; a site whose model cannot be fitted (one action, more than
``federation.learner.MAX_BEHAVIOUR_ACTIONS`` actions, no valid step) sends nothing and the answer says on how many
sites the check ran.

**Where it runs.** In a scored round (the round selection's quick evaluation, ``queries.selection``) on the site's
validation rows, so that it is reported per candidate round beside D₁ without reading the test rows; in the full
evaluation on the site's test cohort. The rollout takes :data:`NC_SAMPLES` futures per entity and the evaluation seed
(common random numbers across rounds). A step logged for fewer entities than the site's cohort floor sends zeros.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure.data.policy import draw_actions
from fcd_secure.evaluation.natural_course import STEP_FIELDS, natural_course_summary, step_gap_sums
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.cohort import entity_count

__all__ = ["NC_SAMPLES", "LoggingPolicyPlan", "LoggingRollout", "NaturalCourse", "logging_rollout"]

#: simulated futures per entity of the natural-course rollout
NC_SAMPLES = 4
#: the longest horizon whose steps are sent (list caps of the egress gate)
NC_MAX_STEPS = 256
#: the most endogenous context columns compared
NC_MAX_CONTEXTS = 64
#: the logged training steps the model of the logging policy is fit on (at most; whole entities, the first ones)
NC_FIT_STEPS = 1000
#: its penalty (``evaluation.propensity.RecordPropensity``'s: fewer steps than the history model's usual fit)
NC_L2 = 1e-2
#: its L-BFGS iterations at most: the fit was the check's main cost (DKT-Synth tiny, 50 actions: 1.1 s CPU a site at
#: 500, 0.15 s at 25, with a lower held-out log-loss, 3.28 against 4.44: fewer iterations shrink an over-fit on a few
#: entities; on the default preset's 4343 steps the held-out log-loss is the same, 2.533, at 25 and 500)
NC_FIT_ITER = 25
#: which rows the check ran on: a scored round's validation rows or the full evaluation's test cohort
ROWS_KEY = "natcourse.rows_test"


class LoggingPolicyPlan:
    """The site's logging policy as a rollout plan: at each step it draws a_t ~ π̂_b(· | simulated history) from the
    site's model of its logging policy with its own seeded generator (the same draws in every rollout of one seed).

    It also keeps, for each deterministic regimen of ``targets``, the score of the tilt towards it on the simulated
    history, 1{a_t = π(h_t)} − π̂_b(π(h_t) | h_t) (``evaluation.regimen_scores``), so that the regimen-directed check
    reads the same rollout as the natural course; keeping them draws no random number.

    Args:
        behaviour: ``fn(t, y_hist, lengths, context) -> [B, K]``, the logging policy's probabilities on histories.
        seed: the seed of the draws.
        targets: deterministic policies bound to the rows' vocabulary (``data.policy.bind_policy``).
    """

    name = "natural_course"
    needs_context = True  # the model of the logging policy reads the contexts at t

    def __init__(self, behaviour: Any, seed: int, targets: tuple = ()) -> None:
        self.behaviour = behaviour
        self.rng = np.random.default_rng(int(seed))
        self.targets = tuple(targets)
        #: per call, in the rollout's order: (t, drawn actions [B], scores [B, len(targets)])
        self.calls: list[tuple[int, np.ndarray, np.ndarray]] = []

    def actions(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int,
                context: np.ndarray | None = None) -> np.ndarray:
        q = np.asarray(self.behaviour(t, y_hist, lengths, context), dtype=np.float64)
        a = draw_actions(q, self.rng.random(len(lengths)))
        if self.targets:
            rows = np.arange(len(a))
            scores = np.empty((len(a), len(self.targets)))
            for j, pol in enumerate(self.targets):
                kw = {"context": context} if getattr(pol, "needs_context", False) else {}
                act = np.asarray(pol.actions(t, y_hist, lengths, a_off, a_on, **kw), dtype=np.int64)
                scores[:, j] = (a == act) - q[rows, act]
            self.calls.append((int(t), a, scores))
        return a

    def scores(self, actions: np.ndarray) -> np.ndarray:
        """The kept scores as ``[n, S, H, len(targets)]`` for a rollout from t = 0 whose actions are ``actions``
        ``[n, S, H]``: the calls run chunk by chunk of rows, step by step within a chunk (``model.simulate``), so a
        step that does not follow the one before starts a chunk.

        Raises:
            ValueError: the kept draws are not the rollout's actions (a rollout that called the plan otherwise).
        """
        n, S, H = actions.shape
        if not self.targets:
            return np.zeros((n, S, H, 0))
        chunks: list[list[tuple[np.ndarray, np.ndarray]]] = []
        last = None
        for t, a, sc in self.calls:
            if last is None or t != last + 1:
                chunks.append([])
            chunks[-1].append((a, sc))
            last = t
        if any(len(c) != H for c in chunks):
            raise ValueError("the natural-course rollout called its plan out of step order")
        acts = np.concatenate([np.stack([a for a, _ in c], 1) for c in chunks], 0)
        sc = np.concatenate([np.stack([s for _, s in c], 1) for c in chunks], 0)
        if acts.shape != (n * S, H) or not np.array_equal(acts.reshape(n, S, H), actions):
            raise ValueError("the natural-course plan's kept draws are not the rollout's actions")
        return sc.reshape(n, S, H, len(self.targets))


@dataclass(frozen=True)
class LoggingRollout:
    """A site's natural-course rollout, shared by the checks that read it (``SiteContext.once``).

    Attributes:
        rows: the rows rolled out (the validation rows in a scored round, else the test cohort).
        sim: the simulator's rollout (``SimResult``) over the first ``horizon`` steps.
        horizon: the steps rolled out.
        n_gen: the endogenous context columns the simulator generated (compared by the natural course).
        targets: the names of the regimens whose tilt scores were kept.
        scores: those scores on the simulated histories, ``[n, S, horizon, len(targets)]``.
        scored: whether this is a scored round (validation rows) or the full evaluation (test rows).
    """

    rows: Any
    sim: Any
    horizon: int
    n_gen: int
    targets: tuple[str, ...]
    scores: np.ndarray
    scored: bool


def regimens(ds) -> tuple:
    """The deterministic regimens whose tilt scores the rollout keeps (the shipped four, bound to ``ds``)."""
    from fcd_secure.data.policy import bind_policy, default_policies  # noqa: PLC0415

    return tuple(bind_policy(p, ds) for p in default_policies() if not p.stochastic)


def logging_rollout(ctx: SiteContext, keep_scores: bool = False) -> LoggingRollout | None:
    """The site's rollout under its logging policy (module docstring), once per evaluation; None where the rows are
    fewer than the site's floor or its model of the logging policy cannot be fitted. ``keep_scores``: the plan keeps
    the regimens' tilt scores (``queries.regimen_scores``; 4-11 % more CPU than the rollout alone).

    Raises:
        ValueError: the scores are asked of a rollout already made without them (a query order that cannot share it).
    """
    def make() -> LoggingRollout | None:
        scored = ctx.request.keep_round is not None
        ds = ctx.data.validation if scored else ctx.sub
        if ds is None or entity_count(ds) < ctx.floor:
            return None
        behaviour = behaviour_model(ctx)
        if behaviour is None:
            return None
        H = min(ds.L, NC_MAX_STEPS)
        n_gen = min(_generates_contexts(ctx.model, ds), NC_MAX_CONTEXTS)
        seed = int(ctx.cfg.seed) if scored else ctx.seed  # scored rounds: common random numbers across rounds
        kw = {"keep_contexts": True} if n_gen else {}
        targets = regimens(ds) if keep_scores else ()
        plan = LoggingPolicyPlan(behaviour, seed, targets)
        sim = ctx.model.simulate_policy(ds, plan, ctx.data.anchors, NC_SAMPLES, seed, horizon=H, **kw)
        return LoggingRollout(rows=ds, sim=sim, horizon=H, n_gen=n_gen, targets=tuple(p.name for p in targets),
                              scores=plan.scores(np.asarray(sim.actions)), scored=scored)

    roll = ctx.once("natural_course.rollout", make)
    if keep_scores and roll is not None and not roll.targets:
        raise ValueError("the natural-course rollout was made without the regimens' scores: "
                         "NaturalCourse(keep_scores=True) shares it with the regimen score check")
    return roll


def behaviour_model(ctx: SiteContext):
    """The site's model of its logging policy fit on its training rows (once per evaluation), or None where it cannot
    be fitted (module docstring)."""
    from fcd_secure.evaluation.propensity import HistoryPropensity  # noqa: PLC0415
    from fcd_secure.federation.learner import MAX_BEHAVIOUR_ACTIONS  # noqa: PLC0415

    def make():
        train = ctx.data.train
        # the first training entities up to NC_FIT_STEPS logged steps: the fit's cost grows with the steps
        k = int(np.searchsorted(np.cumsum(train.M.sum(1)), NC_FIT_STEPS)) + 1
        rows = train if k >= train.n else train.subset(np.arange(k))
        acts = np.unique(rows.T[rows.M > 0])
        if acts.size < 2 or train.n_actions > MAX_BEHAVIOUR_ACTIONS:
            return None
        return HistoryPropensity(train.n_actions, train.da, l2=NC_L2, max_iter=NC_FIT_ITER).fit(rows)

    return ctx.once("natural_course.behaviour", make)


def _generates_contexts(model, ds) -> int:
    """How many leading context columns the simulator generates in a rollout (0: every column replayed)."""
    from fcd_secure.data.spec import n_endogenous  # noqa: PLC0415
    from fcd_secure.model.baselines.fed_causaldiff import FedCausalDiffSimulator  # noqa: PLC0415

    return n_endogenous(ds.meta, ds.da) if isinstance(model, FedCausalDiffSimulator) else 0


class NaturalCourse(Query):
    """The simulator under the logging policy against the logs, per step (module docstring): ``natcourse.*``."""

    name = "natural_course"
    quick = True

    def __init__(self, keep_scores: bool = False) -> None:
        #: its rollout keeps the regimens' tilt scores for ``queries.regimen_scores`` (:func:`logging_rollout`)
        self.keep_scores = bool(keep_scores)

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return ["natcourse.sites", ROWS_KEY]

    def lists(self) -> dict[str, int]:
        out = {f"natcourse.y.{f}": NC_MAX_STEPS for f in STEP_FIELDS}
        out.update({f"natcourse.a.{f}": NC_MAX_CONTEXTS for f in STEP_FIELDS})
        return out

    def applies(self, ctx: SiteContext) -> bool:
        # a scored round (beside D₁) or the full evaluation; not the plain quick evaluations of training
        return ctx.request.keep_round is not None or not ctx.request.quick

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        roll = logging_rollout(ctx, self.keep_scores)
        if roll is None:
            return {}
        ds, sim, H, n_gen = roll.rows, roll.sim, roll.horizon, roll.n_gen
        y = step_gap_sums(np.asarray(sim.probs, np.float64).mean(1), ds.Y[:, :H], ds.M[:, :H], ctx.floor)
        out: SiteSums = {f"natcourse.y.{k}": v.tolist() for k, v in y.items()}
        if n_gen:
            # the contexts the rollout used at t ≥ 1 (at t = 0 they are the logged ones), column by column
            gen = np.asarray(sim.context_values, np.float64).mean(1)[:, 1:H, :n_gen]  # [n, H-1, n_gen]
            obs = ds.A[:, 1:H, :n_gen].astype(np.float64)
            m = np.repeat(ds.M[:, 1:H, None], n_gen, axis=2)
            per = [step_gap_sums(gen[:, :, j], obs[:, :, j], m[:, :, j], ctx.floor) for j in range(n_gen)]
            out.update({f"natcourse.a.{k}": [float(p[k].sum()) for p in per] for k in STEP_FIELDS})
        out["natcourse.sites"] = 1.0
        out[ROWS_KEY] = 0.0 if roll.scored else 1.0
        return out

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if "natcourse.y.n" not in totals:
            return
        y = {k: np.asarray(totals[f"natcourse.y.{k}"], np.float64) for k in STEP_FIELDS}
        out = natural_course_summary(y["n"], y["s"], y["ss"], y["sim"], y["obs"], ctx.level)
        sites = int(round(totals["natcourse.sites"]))
        out.update(rows="test" if totals.get(ROWS_KEY, 0.0) > 0 else "validation", sites=sites, sites_of=totals.sites,
                   samples=NC_SAMPLES)
        if "natcourse.a.n" in totals:
            a = {k: np.asarray(totals[f"natcourse.a.{k}"], np.float64) for k in STEP_FIELDS}
            cols = natural_course_summary(a["n"], a["s"], a["ss"], a["sim"], a["obs"], ctx.level)
            out["contexts"] = {"columns": [{**r, "column": r.pop("t")} for r in cols["steps"]],
                               "max_abs_z": cols["max_abs_z"], "mean_abs_gap": cols["mean_abs_gap"]}
        answer["natural_course"] = out

"""What happens under π: simulated policy values with intervals, contrasts to a reference policy, and per-entity
effects that never leave their site (paper §V "do-simulation and policy evaluation").

The question is a :class:`WhatIfRequest` (the policies, the reference, a horizon, the interval's level and
replicates). It travels inside the federated evaluation request (``query.evaluate``, config key ``whatif``), so it
takes exactly the transport of the evaluation sums: every key below is an additive sum over a site's test entities,
and whatever carries the evaluation sums (plain replies, or secure aggregation of the sums) carries these.

On each site (:func:`site_policy_sums`), for every policy π (bound to the site's action labels and context columns):

* the do-simulation of Fed-CausalDiff over the site's test entities from t = 0 for ``horizon`` steps
  (``model.simulate``; endogenous contexts generated, exogenous replayed);
* ``policy.<π>.*``: Σ simulated value, Σ true value (an oracle: DKT-Synth, tumour), n; the OPE sums (IPW, SNIPW,
  per-decision DR on the site's own logged propensities, which never leave; DESIGN trap 5);
* ``whatif.value.<π>.*`` and, for π ≠ reference, ``whatif.diff.<π>.*`` (per-entity v_i(π) − v_i(ref)): n, Σx, Σx²
  and the Monte-Carlo variance of :mod:`fcd_secure.evaluation.intervals` (two sums per quantity, nothing that could
  be solved for one entity's value);
* the **factual rectifier**: the model also replays each entity's *logged* actions, and r_i = v̂_i(logged actions) −
  ȳ_i (the observed per-step mean over the same window) measures the simulator's own error where the truth is
  observed. ``whatif.residual.*`` are its sums and ``whatif.rectified.<π>.*`` those of v_i(π) − r_i: the
  prediction-powered estimate of Angelopoulos et al. (2023, "Prediction-powered inference", Science 382), whose
  interval also covers the model's bias *if* that bias is the same under π as under the logged actions (an
  assumption, not a fact: importance weights would remove it, but deterministic policies rarely have logged support,
  see the OPE estimates). In a contrast the rectifier cancels, so effects have no rectified form;
* the **doubly robust value** (where the site has logged propensities): per entity, the per-decision DR term of
  Jiang & Li (2016, "Doubly robust off-policy value evaluation for reinforcement learning", ICML) with the model's
  per-step outcomes under π as the control variate, DR_i = c_i [Σ_t v̂_it + Σ_t w_{i,0:t} (y_it − v̂_it)]: the
  model's value plus its importance-weighted error on the logged steps that π could have taken — prediction-powered
  inference with importance weights, unbiased for the true value whatever the model's bias as long as the logged
  propensities are right. ``whatif.dr.<π>.*`` (with ``support``: Σ_i the share of entity i's steps still consistent
  with π) and ``whatif.drdiff.<π>.*`` (DR_i(π) − DR_i(ref)) are their sums. Where no logged step follows π the
  weights are zero and DR_i is the model's value again: the interval is then honest only on the supported steps,
  which ``support`` reports (deterministic policies lose support within a few steps on DKT-Synth and the tumour
  world, so short horizons are where this interval covers the truth). For binary outcomes each site also sends the
  two sums of the **unseen-mass bounds** (``whatif.dr.<π>.unseen_lo`` / ``unseen_hi``,
  :func:`fcd_secure.evaluation.intervals.unseen_mass_sums`): the share of π's distribution its logged sample did
  not reach (E[w_{0:t}] = 1 tells how much) times the outcome's range on it, which widens the DR interval where
  heavy weights make the plain one too narrow (the server takes the critical value of Imbens & Manski 2004 for the
  set they leave, :func:`fcd_secure.evaluation.intervals.unseen_bounds`);
* the per-entity values and contrasts are written to ``<site state>/whatif/<query id>.csv`` on the site's own disk
  (with the request beside it) and nowhere else: in deployment they never leave the site.

Before any of this, a site answers only what its policy's ``[questions]`` allow (docs/threats.md P41-P43): a
threshold on a continuous context column is in the table's own units and is read on the site's grid of quantiles of
its training rows (:func:`~fcd_secure.data.policy.snap_threshold`); the question is charged against the site's
differencing budget (:func:`admit_question`: any two policies, in this question or answered before, act differently on
none or at least ``min_difference`` of its entities); and ``whatif.fires.<π>`` says whether a threshold rule fires
on any of the site's rows at all.

On the server (:func:`merge_policy_sums`), from the consortium totals only: each policy's value and its 90 %
interval, each contrast and its interval, the truth beside them where the data has an oracle.

:func:`fcd_secure.engines.whatif_run.run_whatif` asks the question of a finished run: it re-opens the run's state
(the sites' Θs) and ``theta_c.npz`` and runs one evaluation-only round on the simulation engine.

The model side of DR: V̂_t is the model's return-to-go under π from a do-simulation started at t = 0 and Q̂_t = V̂_t.
For the deterministic policies evaluated here Q̂_t only enters the per-decision DR sum multiplied by the weight
w_{0:t}, which is zero unless the logged action equals π's action, so setting Q̂ = V̂ is the model's estimate of
exactly the needed quantity (up to V̂ not being re-conditioned on the logged history at t). For a stochastic
(incremental, share) policy Q̂ = V̂ does not depend on the action, so V̂ = Σ_a π(a | h) Q̂ holds and the per-decision
DR stays unbiased whatever the rollout as long as its weights q / P are exact (each correction term
w_{0:t−1}(w_t − 1)V̂_t has mean 0 because E[w_t | h_t] = Σ_a q(a | h_t) = 1): the simulator's rollout under q, which
draws from the site's π̂, sets only the variance. A share policy's weights are exact whenever the logged propensities
are; an incremental policy's rest on π̂_k at logged a_t ≠ k (``queries.incremental``).
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.audit import Refusal
from fcd_secure.data.cohorts import row_ids
from fcd_secure.data.policy import Policy, ThresholdRule, anchor_labels, bind_policy, load_policy_refs, snap_threshold
from fcd_secure.data.schema import SiteDataset
from fcd_secure.evaluation.intervals import UNSEEN_END_FIELDS, UNSEEN_FIELDS
from fcd_secure.queries.incremental import PIK_FIELDS, attach_behaviour, incremental_target_probs, pik_sums
from fcd_secure.queries.targeted import (
    horizon_diff_sums,
    horizon_grid,
    horizon_sums,
    identified_metric_names,
    in_range,
    merge_identified,
)

if TYPE_CHECKING:  # pragma: no cover - the run config pulls in torch; the request model must not
    from fcd_secure.config import RunConfig
    from fcd_secure.federation.learner import SiteData
    from fcd_secure.federation.site_policy import QuestionPolicy

__all__ = [
    "WHATIF_DIR", "WHATIF_KEY", "WhatIfRequest", "evaluated_policy_names", "merge_policy_sums", "request_from_config",
    "site_policy_sums", "whatif_metric_names",
]

#: key of the request (JSON) in the evaluation config
WHATIF_KEY = "whatif"
#: folder of the per-entity files inside a site's state folder
WHATIF_DIR = "whatif"
#: at most this many policies in one question (the reply's size, and the gate's allow-list, grow with it)
MAX_POLICIES = 32
#: the site's record of the cohorts it answered questions on (``slots/<name>`` of its state folder)
QUESTION_SLOT = "whatif_cohorts.json"
#: the most distinct cohorts a site answers over its lifetime: then its question budget is spent
MAX_ANSWERED_COHORTS = 5000
#: a stochastic policy's weights are compared on a grid of 1/WEIGHT_GRID in log(q/P) (:func:`_logged_plan`)
WEIGHT_GRID = 10.0
#: the refusal rule of a question the budget refuses (``audit.rules.REFUSAL_RULES``)
QUESTION_RULE = "eval_cohort"


class WhatIfRequest(BaseModel):
    """One "what happens under π" question.

    Attributes:
        policies: the policies to simulate (declarative; labels resolved on each site); at most
            :data:`MAX_POLICIES`, so that a reply's size stays bounded.
        reference: the name of the policy every other one is contrasted with.
        horizon: steps from t = 0 over which a value is averaged (None: each trajectory's whole length).
        level: nominal coverage of the intervals.
    """

    model_config = ConfigDict(extra="forbid")

    policies: list[Policy] = Field(min_length=1, max_length=32)
    reference: str
    horizon: int | None = Field(default=None, ge=1)
    level: float = Field(default=0.9, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _names(self) -> "WhatIfRequest":
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"two policies share a name: {names}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not among the policies {names}")
        return self

    @property
    def query_id(self) -> str:
        """A short digest of the question (the same question gives the same id and the same per-entity file)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def to_json(self) -> str:
        """Canonical JSON (what travels in the evaluation config)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "WhatIfRequest":
        """The request from :meth:`to_json`."""
        return cls.model_validate_json(text)


def request_from_config(
    cfg: "RunConfig",
    policies: list[Policy] | None = None,
    reference: str | None = None,
    horizon: int | None = None,
) -> WhatIfRequest:
    """The question a run asks at its end (``[evaluation] policies`` / ``reference`` / ``horizon``), or the one given.

    Args:
        cfg: the run configuration.
        policies: policies instead of the configured ones (default: ``[evaluation] policies``, else the paper's four).
        reference: the reference policy's name (default: the configured one, else the first policy).
        horizon: steps from t = 0 (default: the configured horizon, else whole trajectories).

    Raises:
        DataError: a policy file is missing or invalid.
        ValueError: the reference is not among the policies.
    """
    ev = cfg.evaluation
    pols = policies if policies is not None else load_policy_refs(ev.policies)
    ref = reference or ev.reference or pols[0].name
    return WhatIfRequest(policies=pols, reference=ref, horizon=horizon if horizon is not None else ev.horizon,
                         level=ev.level)


# -- on the site ---------------------------------------------------------------------------------------------------
def _per_sample_values(sim) -> np.ndarray:
    """Each sample's value ``[n, S]`` (the per-step average over valid steps of the window)."""
    denom = np.maximum(sim.mask.sum(1), 1.0)
    return (np.asarray(sim.probs, np.float64) * sim.mask[:, None, :]).sum(2) / denom[:, None]


def site_policy_sums(
    model: Any,
    sub: SiteDataset,
    data: "SiteData",
    cfg: "RunConfig",
    request: WhatIfRequest,
    seed: int,
    n_samples: int,
    all_rows: bool,
    site_dir: Path | None,
    questions: "QuestionPolicy | None" = None,
) -> dict[str, Any]:
    """The sums one site contributes to a what-if question (module docstring); the per-entity file is written to
    ``site_dir/whatif/`` when ``site_dir`` is given.

    Args:
        model: the site's simulator (Θc + its Θs).
        sub: the test rows evaluated.
        data: the site's data (anchors, oracle, index).
        cfg: the run configuration (OPE horizon, outcome kind).
        request: the question.
        seed: the evaluation seed of the site (rollouts share it: common random numbers across policies).
        n_samples: simulated futures per entity.
        all_rows: whether ``sub`` is the site's whole test split (the oracle's per-site truth needs it).
        site_dir: the site's own state folder.
        questions: the site's question budget (``[questions]`` of its policy): thresholds are read on its quantile
            grid and the question is admitted by :func:`admit_question` first; None (a research evaluation without a
            site) answers as asked.

    Returns:
        Floats and lists of floats keyed as in the module docstring.

    Raises:
        DataError: a policy names a label or a context column this site's data does not have.
        Refusal: ``eval_cohort`` (:func:`admit_question`): two policies' cohorts differ by too few entities.
    """
    from fcd_secure.evaluation.intervals import site_sums, unseen_mass_sums  # noqa: PLC0415

    a_off, a_on = data.anchors
    n = float(sub.n)
    oracle = data.oracle
    out: dict[str, Any] = {"anchors.a_off": float(a_off), "anchors.a_on": float(a_on), "anchors.sites": 1.0}
    values: dict[str, np.ndarray] = {}
    contexts: dict[str, list[str]] = {}
    H = sub.L if request.horizon is None else request.horizon
    # the site reads every threshold on its own grid and binds every policy before anything is simulated; the
    # question is admitted against its differencing budget first (P41, P42)
    bound = []
    grid_notes: dict[str, dict[str, Any]] = {}  # how each threshold was read (kept in the site's per-entity file)
    for raw in request.policies:
        if questions is not None:
            raw, note = snap_threshold(raw, data.train, questions.threshold_grid)
            if note is not None:
                grid_notes[raw.name] = note
        bound.append(bind_policy(raw, sub))
    bound = attach_behaviour(bound, data.train, seed)  # stochastic policies act through the site's own π̂
    if questions is not None:
        admit_question(bound, sub, data.anchors, H, questions.min_difference,
                       None if site_dir is None else Path(site_dir) / "slots" / QUESTION_SLOT)
    for pol in bound:
        if isinstance(pol.rule, ThresholdRule):  # P43: a threshold that never fires on this site's rows is reported
            out[f"whatif.fires.{pol.name}"] = 1.0 if _fires(pol, sub, a_off, a_on, H) else 0.0
    # the factual rectifier (module docstring): the model's value of the logged actions minus the observed value
    replay = model.simulate_policy(sub, sub.T[:, :H].copy(), None, n_samples, seed, horizon=H)
    observed = (sub.Y[:, :H] * sub.M[:, :H]).sum(1) / np.maximum(sub.M[:, :H].sum(1), 1.0)
    residual = _per_sample_values(replay).mean(1) - observed
    out.update(site_sums("whatif.residual", residual))
    drs: dict[str, np.ndarray] = {}
    supports: dict[str, np.ndarray] = {}
    dr_steps: dict[str, dict[str, np.ndarray]] = {}
    # the identified answers (queries.targeted): DR values over the first h steps, per horizon of the grid
    grid = horizon_grid(H)
    identified: dict[str, dict[int, np.ndarray]] = {}
    for pol in bound:
        sim = model.simulate_policy(sub, pol, data.anchors, n_samples, seed, horizon=request.horizon)
        contexts = sim.contexts
        per = _per_sample_values(sim)
        v = per.mean(1)
        values[pol.name] = v
        mc = per.var(1, ddof=1) / per.shape[1] if per.shape[1] > 1 else None
        out.update(site_sums(f"whatif.value.{pol.name}", v, mc))
        out.update(site_sums(f"whatif.rectified.{pol.name}", v - residual))
        out.update(support_sums(pol.name, logged_support(pol, sub, a_off, a_on, H)))
        if sub.P is not None and pol.stochastic:
            out.update(pik_sums(pol.name, incremental_target_probs(pol, sub, data.anchors)[1]))
        if sub.P is not None:
            drs[pol.name], supports[pol.name], dr_steps[pol.name] = _dr_per_entity(pol, sub, sim, a_off, a_on)
            truths = ({h: oracle.true_policy_value(pol, data.site_index, "test", horizon=h)[0] for h in grid}
                      if oracle is not None and all_rows else None)
            sums, identified[pol.name] = horizon_sums(
                pol.name, sub, _target_probs(pol, sub, a_off, a_on), np.asarray(sim.probs, dtype=np.float64).mean(1),
                grid, truths)
            out.update(sums)
        out[f"policy.{pol.name}.n"] = n
        out[f"policy.{pol.name}.sim_sum"] = float(v.sum())  # = sim.value · n, in float64 like the interval's sums
        if oracle is not None and all_rows:
            v_true, _se = oracle.true_policy_value(pol, data.site_index, "test", horizon=request.horizon)
            out[f"policy.{pol.name}.true_sum"] = float(v_true) * n
        if sub.P is not None and request.horizon is None:
            out.update(_ope_sums(pol, sub, sim, cfg, a_off, a_on))
    if not all(np.isfinite(d).all() for d in drs.values()):
        drs, supports, dr_steps = {}, {}, {}  # weights past float64 (tiny propensities over many steps): no DR at all
    if cfg.model.outcome != "binary":
        dr_steps = {}  # the unseen-mass bounds need an outcome in [0, 1]
    for name, d in drs.items():
        out.update(site_sums(f"whatif.dr.{name}", d))
        out[f"whatif.dr.{name}.support"] = float(supports[name].sum())
        if name in dr_steps:
            st = dr_steps[name]
            out.update(unseen_mass_sums(f"whatif.dr.{name}", st["w"], st["scale"], st["v_hat"], dr=d))
    ref = values[request.reference]
    for name, v in values.items():
        if name != request.reference:
            out.update(site_sums(f"whatif.diff.{name}", v - ref))
            if name in drs:
                out.update(site_sums(f"whatif.drdiff.{name}", drs[name] - drs[request.reference]))
            if name in identified and request.reference in identified:
                out.update(horizon_diff_sums(name, identified[name], identified[request.reference]))
    out["contexts.generated"] = float(len(contexts.get("generated", [])))
    out["contexts.replayed"] = float(len(contexts.get("replayed", [])))
    if site_dir is not None:
        _write_per_entity(Path(site_dir), request, sub, values, residual, contexts, drs, dr_steps, grid_notes)
    return out


def _logged_plan(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, H: int) -> np.ndarray:
    """The actions ``pol`` takes on each row's *logged* history over the first ``H`` steps, ``[n, H]`` (-1 on
    padding): what decides which of the row's logged steps are consistent with π, so which rows its OPE and DR sums
    read."""
    H = min(int(H), sub.L)
    if pol.stochastic:
        # a stochastic policy weighs every logged step; what sets its rows apart is how much it moves each weight,
        # so its "actions" are the weights on a grid of ~10 % (a row whose weight moves less reads as unchanged: the
        # odds of an action one patient received cannot single that patient out, P41)
        if sub.P is None:
            return np.where(sub.M[:, :H] > 0, 0, -1).astype(np.int64)
        ratio = _target_probs(pol, sub, a_off, a_on)[:, :H] / np.where(sub.M[:, :H] > 0, sub.P[:, :H], 1.0)
        code = np.round(WEIGHT_GRID * np.log(np.maximum(ratio, 1e-300)))
        return np.where(sub.M[:, :H] > 0, code, -1).astype(np.int64)
    plan = pol.plan(sub.Y[:, :H], sub.lengths, a_off, a_on, A=sub.A[:, :H] if pol.needs_context else None)
    return np.where(sub.M[:, :H] > 0, plan, -1).astype(np.int64)


def _fires(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, H: int) -> bool:
    """Whether a threshold rule's condition holds at any valid step of the site's logged rows (P43)."""
    ctx = (lambda t: sub.A[:, : t + 1]) if pol.needs_context else (lambda t: None)
    for t in range(min(int(H), sub.L)):
        valid = sub.M[:, t] > 0
        if valid.any() and (pol.on(t, sub.Y[:, :t], sub.lengths, ctx(t)) & valid).any():
            return True
    return False


def cohort_signature(pol: Policy, sub: SiteDataset, anchors: tuple[int, int], H: int) -> dict[str, str]:
    """The cohort a policy touches on the site's rows: per row (keyed by a digest of its entity id and chunk), a
    digest of the actions the policy takes on that row's logged history. Two policies' sums can differ only through
    the rows whose digests differ (where a row's logged steps stop or start being consistent with π)."""
    plan = _logged_plan(pol, sub, anchors[0], anchors[1], H)
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for i, e in enumerate(row_ids(sub)):
        k = seen.get(e, 0)
        seen[e] = k + 1
        key = hashlib.sha256(f"{e}#{k}".encode()).hexdigest()[:16]
        out[key] = hashlib.sha256(plan[i].tobytes()).hexdigest()[:16]
    return out


def _difference(a: dict[str, str], b: dict[str, str]) -> int:
    """How many rows two cohorts treat differently (a row in only one of them counts)."""
    return sum(1 for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def admit_question(policies: list[Policy], sub: SiteDataset, anchors: tuple[int, int], H: int, min_difference: int,
                   record: Path | None) -> None:
    """Charge a question against the site's differencing budget, or refuse it before anything is computed (P41).

    Every policy's cohort (:func:`cohort_signature`) must equal, or differ by at least ``min_difference`` rows from,
    every other policy's in the question and every cohort the site answered before (``record``, kept in the site's
    state; an identical cohort is free). The admitted cohorts are recorded before the answer leaves; after
    :data:`MAX_ANSWERED_COHORTS` distinct ones the site answers no new cohort.

    What it bounds: the difference of any two answers is a sum over at least ``min_difference`` entities, never one
    patient's 1/P and logged action (the attack of 32 thresholds one patient apart). What it does not bound: a
    linear combination of three or more answers whose cohorts overlap cleverly (Dinur & Nissim 2003, "Revealing
    information while preserving privacy", PODS) — answering many distinct cohorts needs noise, not a rule; the
    lifetime cap on distinct cohorts limits how many such equations exist.

    Raises:
        Refusal: ``eval_cohort`` with key ``policy_difference`` (two policies of the question), ``answered_cohort``
            (a cohort close to one answered before), ``question_budget`` (the record is full) or ``unreadable``.
    """
    sigs = [cohort_signature(p, sub, anchors, H) for p in policies]
    for i in range(len(sigs)):
        for j in range(i):
            if 0 < _difference(sigs[i], sigs[j]) < min_difference:
                raise Refusal(QUESTION_RULE, "config", "policy_difference")
    if record is None:
        return
    with file_lock(record):
        try:
            doc = json.loads(record.read_text()) if record.exists() else {}
        except ValueError:
            raise Refusal(QUESTION_RULE, "record", "unreadable") from None
        answered: list[dict[str, str]] = list(doc.get("cohorts", []))
        new: list[dict[str, str]] = []
        for sig in sigs:
            if sig in answered or sig in new:
                continue
            if any(0 < _difference(sig, old) < min_difference for old in answered):
                raise Refusal(QUESTION_RULE, "config", "answered_cohort")
            new.append(sig)
        if not new:
            return
        if len(answered) + len(new) > MAX_ANSWERED_COHORTS:
            raise Refusal(QUESTION_RULE, "config", "question_budget")
        atomic_write_text(record, json.dumps({"cohorts": answered + new}, separators=(",", ":")))


def logged_support(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, horizon: int) -> np.ndarray:
    """Each entity's share of its valid steps within the first ``horizon`` whose logged actions π could have taken
    at every step so far (π(a_s | h_s) > 0 for all s ≤ t): how much of π the site's logs show, ``[n]``. It needs
    no propensities (the doubly robust ``support`` is the same share where the weights are positive)."""
    H = min(int(horizon), sub.L)
    valid = sub.M[:, :H] > 0
    if pol.stochastic:  # q > 0 wherever π_b > 0, but for a share of 1 ("always k") at a logged a_t ≠ k
        takes = pol.rule.takes(sub.T[:, :H] == pol.shifted_action(a_off, a_on))
    else:
        takes = _target_probs(pol, sub, a_off, a_on)[:, :H] > 0
    follows = np.cumprod(np.where(valid, takes, True), axis=1).astype(bool)
    return (valid & follows).sum(axis=1) / np.maximum(valid.sum(axis=1), 1)


def support_sums(name: str, share: np.ndarray) -> dict[str, float]:
    """One site's support sums of policy ``name``: Σ_i of :func:`logged_support`, and 1 when no logged step of the
    site follows π at all (a count: under secure aggregation the server learns how many sites, not which)."""
    total = float(np.asarray(share, dtype=np.float64).sum())
    return {f"whatif.support.{name}.sum": total, f"whatif.support.{name}.none": 1.0 if total <= 0 else 0.0}


def _target_probs(pol: Policy, sub: SiteDataset, a_off: int, a_on: int) -> np.ndarray:
    """π(logged a_t | logged history) at every step of the site's rows, ``[n, L]`` (a stochastic policy's from the
    logged propensities, :func:`~fcd_secure.queries.incremental.incremental_target_probs`)."""
    if pol.stochastic:
        return incremental_target_probs(pol, sub, (a_off, a_on))[0]
    lengths = sub.lengths
    ctx = (lambda t: {"context": sub.A[:, : t + 1]}) if pol.needs_context else (lambda t: {})
    return np.stack([pol.prob(t, sub.Y[:, :t], lengths, a_off, a_on, sub.T[:, t], **ctx(t)) for t in range(sub.L)],
                    axis=1)


def _dr_per_entity(pol: Policy, sub: SiteDataset, sim, a_off: int, a_on: int
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Each entity's doubly robust value of ``pol`` over the simulated window, its share of supported steps and the
    per-step pieces of the unseen-mass bounds (``w``: w_{0:t}, ``scale``: the step's share of the value, ``v_hat``:
    the model's expected outcome, each ``[n, H]``; module docstring); computed on the site from its own propensities,
    which never leave it."""
    from fcd_secure.evaluation.ope import PerDecisionDR  # noqa: PLC0415

    step_v = np.asarray(sim.probs, dtype=np.float64).mean(1)  # [n, H] the model's expected outcome under π
    H = min(step_v.shape[1], sub.L)
    v_hat = np.zeros((sub.n, sub.L))
    # return-to-go from t = 0's do-simulation: with Q̂ = V̂ the DR term is c_i [V̂_0 + Σ_t w_{0:t} (y_t − v̂_t)]
    v_hat[:, :H] = np.cumsum((step_v[:, :H] * sub.M[:, :H])[:, ::-1], axis=1)[:, ::-1]
    pi = _target_probs(pol, sub, a_off, a_on)
    est = PerDecisionDR(horizon=H)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflowing weights give non-finite terms: the caller then sends no DR
        dr, support = est.per_entity(sub.Y, sub.M, sub.P, pi, q_hat=v_hat, v_hat=v_hat)
        w, scale = est.step_weights(sub.Y, sub.M, sub.P, pi)
    return dr, support, {"w": w, "scale": scale, "v_hat": np.where(scale > 0, step_v[:, :H], 0.0)}


def _ope_sums(pol: Policy, sub: SiteDataset, sim, cfg: "RunConfig", a_off: int, a_on: int) -> dict[str, float]:
    """IPW / SNIPW / per-decision DR sums of one policy on the site's own propensities (full and first-H horizons)."""
    from fcd_secure.evaluation.ope import IPW, SNIPW, PerDecisionDR, estimate_on_site  # noqa: PLC0415

    out: dict[str, float] = {}
    pi = _target_probs(pol, sub, a_off, a_on)
    step_v = np.asarray(sim.probs, dtype=np.float64).mean(1)  # [n, H] expected outcome under π
    H = min(step_v.shape[1], sub.L)
    contrib = step_v[:, :H] * sub.M[:, :H]
    h_ope = cfg.evaluation.ope_horizon
    # the full horizon, and a truncated one where deterministic policies still have logged support
    for suffix, hor in (("", None),) + (((f"_h{h_ope}", h_ope),) if h_ope and h_ope < sub.L else ()):
        Hh = H if hor is None else min(H, hor)
        v_hat = np.zeros((sub.n, sub.L))
        v_hat[:, :Hh] = np.cumsum(contrib[:, :Hh][:, ::-1], axis=1)[:, ::-1]  # return-to-go Σ_{t≤t'<Hh}
        for name, cls in (("ipw", IPW), ("snipw", SNIPW), ("dr", PerDecisionDR)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # support warnings are reported through the merged result
                r = estimate_on_site(cls(horizon=hor), sub, pi=pi, q_hat=v_hat, v_hat=v_hat)
            key = f"ope.{pol.name}.{name}{suffix}"
            out[f"{key}.n"] = float(r.n)
            out[f"{key}.sum_value"] = float(r.sum_value)
            out[f"{key}.sum_weight"] = float(r.sum_weight)
            out[f"{key}.sum_weight_sq"] = float(r.sum_weight_sq)
            out[f"{key}.n_consistent"] = float(r.n_consistent)
            out[f"{key}.finite"] = 1.0 if math.isfinite(r.sum_value) else 0.0
    return out


def _write_per_entity(site_dir: Path, request: WhatIfRequest, sub: SiteDataset, values: dict[str, np.ndarray],
                      residual: np.ndarray, contexts: dict[str, list[str]], drs: dict[str, np.ndarray],
                      dr_steps: dict[str, dict[str, np.ndarray]],
                      grid_notes: dict[str, dict[str, Any]] | None = None) -> Path:
    """``<site_dir>/whatif/<query id>.csv``: one row per entity, its value under each policy, each contrast, the
    factual residual (the model's value of the logged actions minus the observed one) and, with logged
    propensities, each policy's doubly robust value and, for binary outcomes, the per-step pieces of its unseen-mass
    bounds (``dr_scale[t]``, ``dr_w[π][t]``, ``dr_vhat[π][t]``: a cohort's bounds can be rebuilt from them)."""
    import pandas as pd  # noqa: PLC0415

    folder = site_dir / WHATIF_DIR
    folder.mkdir(parents=True, exist_ok=True)
    cols: dict[str, Any] = {"entity": row_ids(sub)}
    ref = values[request.reference]
    for name, v in values.items():
        cols[f"value[{name}]"] = v
    for name, v in values.items():
        if name != request.reference:
            cols[f"effect[{name} - {request.reference}]"] = v - ref
    cols["factual_residual"] = residual
    for name, d in drs.items():
        cols[f"dr[{name}]"] = d
    for i, (name, st) in enumerate(dr_steps.items()):
        if i == 0:  # the steps' shares of the value do not depend on the policy
            cols.update({f"dr_scale[{t}]": st["scale"][:, t] for t in range(st["scale"].shape[1])})
        cols.update({f"dr_w[{name}][{t}]": st["w"][:, t] for t in range(st["w"].shape[1])})
        cols.update({f"dr_vhat[{name}][{t}]": st["v_hat"][:, t] for t in range(st["v_hat"].shape[1])})
    path = folder / f"{request.query_id}.csv"
    atomic_write_text(path, pd.DataFrame(cols).to_csv(index=False, float_format="%.6f"))
    meta = {"request": json.loads(request.to_json()), "rows": sub.n, "contexts": contexts,
            # each threshold as this site read it: asked value, its grid rank, the site's cut point (±inf: beyond it)
            "thresholds": {k: {f: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
                               for f, v in note.items()} for k, note in (grid_notes or {}).items()}}
    atomic_write_text(folder / f"{request.query_id}.json", json.dumps(meta, indent=1))
    return path


# -- on the server -------------------------------------------------------------------------------------------------
def _all_sent(s: dict[str, Any], counts: dict[str, int], sites: int, key: str) -> bool:
    """Whether every site that reported sent ``key``: a truth, a doubly robust sum or a bound summed over part of
    the consortium would describe a partial population."""
    return key in s and counts.get(key, sites) == sites


def _keep_in_range(iv: dict[str, Any], binary: bool, lo: float) -> None:
    """A doubly robust value (``lo`` = 0) or effect (``lo`` = −1) of a binary outcome kept within [lo, 1]; a raw
    estimate outside is named in ``out_of_range`` (``queries.targeted``'s rule for every printed estimate)."""
    if not binary:
        return
    est, low, high = iv.get("estimate"), iv.get("low"), iv.get("high")
    if est is None or not math.isfinite(est):
        return
    iv.update(in_range(est, low, high, lo, 1.0))


def merge_policy_sums(s: dict[str, Any], sites: int, request: WhatIfRequest | None,
                      action_names: list[str] | None = None, binary: bool = True) -> dict[str, Any]:
    """Per-policy results from consortium totals ``s`` (each key summed over the ``sites`` that reported it; per-key
    reporting counts in ``s['_counts']`` where the transport gives them).

    Returns:
        ``{"policies": {name: {...}}, "whatif": {...}, "anchors": {...}, "contexts": {...}}`` (empty when no site
        sent policy sums). Each policy has ``value_sim``, ``value_true`` / ``value_error`` (oracle), its OPE
        estimates (``ipw``, ``snipw``, ``dr``: point estimates), ``interval`` (``fcd_secure.evaluation.intervals
        .Interval`` as a dict), ``rectified`` (the factually rectified value and interval), ``doubly_robust`` (the
        per-entity doubly robust value and its interval, with ``support``, where sites log propensities, and
        ``bounded``: the interval around the set the unseen-mass bounds leave, with the critical value of Imbens &
        Manski, for binary outcomes) and, unless
        it is the reference, ``effect`` (the contrast to the reference with its interval, its doubly robust form
        under ``doubly_robust`` and, with an oracle, its truth); ``identified``: what the logs identify
        (``queries.targeted.merge_identified``: the DR value on each horizon, its support, the answer on the longest
        supported one, and the effect on the longest both policies pass). ``binary``: the outcome is binary (the
        identified estimates are kept in its range). ``factual_residual`` is the mean of
        v̂(logged actions) − observed with its interval: how far the simulator is off where the truth is observed.
    """
    from fcd_secure.evaluation.intervals import interval_from_sums, unseen_bounds  # noqa: PLC0415
    from fcd_secure.evaluation.ope import OPEResult, combine  # noqa: PLC0415

    counts = s.get("_counts", {})
    level = request.level if request is not None else 0.9
    names = list(dict.fromkeys(k.split(".")[1] for k in s if k.startswith("policy.") and k.endswith(".n")))
    if request is not None:
        names = [p.name for p in request.policies if p.name in names] + [x for x in names if x not in
                                                                        {p.name for p in request.policies}]
    per_policy: dict[str, dict[str, Any]] = {}
    for name in names:
        n = s[f"policy.{name}.n"]
        d: dict[str, Any] = {"value_sim": s[f"policy.{name}.sim_sum"] / n}
        # the true value only when every site reported it (a partial truth would bias the error)
        if _all_sent(s, counts, sites, f"policy.{name}.true_sum"):
            d["value_true"] = s[f"policy.{name}.true_sum"] / n
            d["value_error"] = abs(d["value_sim"] - d["value_true"])
        if f"whatif.value.{name}.n" in s:
            d["interval"] = interval_from_sums(s, f"whatif.value.{name}", level).to_dict()
        if f"whatif.rectified.{name}.n" in s:
            d["rectified"] = interval_from_sums(s, f"whatif.rectified.{name}", level).to_dict()
        if f"whatif.fires.{name}" in s:  # a threshold rule: on how many sites it fires at all (P43)
            d["fires_on_sites"] = int(round(s[f"whatif.fires.{name}"]))
            d["never_fires"] = d["fires_on_sites"] == 0  # its 'otherwise' action everywhere
        # doubly robust only when every site sent it (one without propensities would leave a partial population)
        dr_all = _all_sent(s, counts, sites, f"whatif.dr.{name}.n")
        if dr_all:
            iv = interval_from_sums(s, f"whatif.dr.{name}", level)
            d["doubly_robust"] = {**iv.to_dict(), "support": s[f"whatif.dr.{name}.support"] / s[f"whatif.dr.{name}.n"]}
            if _all_sent(s, counts, sites, f"whatif.dr.{name}.unseen_lo"):
                d["doubly_robust"]["bounded"] = unseen_bounds(iv, s, f"whatif.dr.{name}")
            _keep_in_range(d["doubly_robust"], binary, 0.0)
        if f"whatif.diff.{name}.n" in s and request is not None:
            d["effect"] = {"reference": request.reference, **interval_from_sums(s, f"whatif.diff.{name}", level).to_dict()}
            if f"whatif.drdiff.{name}.n" in s and dr_all:
                iv = interval_from_sums(s, f"whatif.drdiff.{name}", level)
                d["effect"]["doubly_robust"] = iv.to_dict()
                ref_key = f"whatif.dr.{request.reference}"
                if all(_all_sent(s, counts, sites, f"{k}.unseen_lo") for k in (f"whatif.dr.{name}", ref_key)):
                    d["effect"]["doubly_robust"]["bounded"] = unseen_bounds(iv, s, f"whatif.dr.{name}", ref_key)
                _keep_in_range(d["effect"]["doubly_robust"], binary, -1.0)
        ests = sorted({k.split(".")[2] for k in s if k.startswith(f"ope.{name}.")}, key=lambda e: (len(e), e))
        for est in ests:  # ipw, snipw, dr, then their truncated-horizon forms (ipw_h2, ...)
            key = f"ope.{name}.{est}"
            if f"{key}.n" not in s:
                continue
            summed = OPEResult(
                estimator=est.split("_h")[0],  # the estimator class; '_h<H>' only names the truncated horizon
                value=float("nan"), n=int(s[f"{key}.n"]), ess=float("nan"), n_consistent=int(s[f"{key}.n_consistent"]),
                warning=None, sum_value=s[f"{key}.sum_value"], sum_weight=s[f"{key}.sum_weight"],
                sum_weight_sq=s[f"{key}.sum_weight_sq"],
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no support is reported in the result's 'warning' field
                pooled = combine([summed])  # the sums are already pooled over sites: combine finishes them
            d[est] = {"value": pooled.value, "ess": pooled.ess, "n_consistent": pooled.n_consistent, "warning": pooled.warning}
            if binary and math.isfinite(pooled.value) and not 0.0 <= pooled.value <= 1.0:
                # a diagnostic estimator (IPW weights are unbounded): flagged, not clipped, never the answer
                d[est]["out_of_range"] = "outside the binary outcome's [0, 1]: unbounded importance weights"
        d["n"] = int(round(n))
        d["n_sites"] = int(counts.get(f"policy.{name}.n", sites))
        if _all_sent(s, counts, sites, f"whatif.support.{name}.sum"):
            d["support"] = s[f"whatif.support.{name}.sum"] / n
            d["n_sites_without_support"] = int(round(s[f"whatif.support.{name}.none"]))
            # logged support at all (queries.targeted's ``identified`` asks more: enough effective entities)
            d["supported"] = d["support"] > 0
            if not d["supported"]:
                _not_identified(d)
        per_policy[name] = d
    if request is not None:
        ref = per_policy.get(request.reference, {})
        for name, d in per_policy.items():
            if "effect" in d and "value_true" in d and "value_true" in ref:
                d["effect"]["true"] = d["value_true"] - ref["value_true"]
            if "effect" in d and (d.get("supported") is False or ref.get("supported") is False):
                _not_identified_effect(d["effect"], name if d.get("supported") is False else request.reference)
    # what the logs identify (queries.targeted): each policy's DR value on its longest supported horizon
    ident = merge_identified(s, list(per_policy), request.reference if request is not None else None, level,
                             binary=binary, all_sent=lambda key: _all_sent(s, counts, sites, key))
    for name, d in per_policy.items():
        if ident.get(name, {}).get("horizons"):
            d["identified"] = ident[name]
            src = {f: s[f"whatif.pik.{name}.{f}"] for f in PIK_FIELDS
                   if _all_sent(s, counts, sites, f"whatif.pik.{name}.{f}")}
            if len(src) == len(PIK_FIELDS) and sum(src.values()) > 0:  # a stochastic policy: where π_k came from
                d["identified"]["pi_k"] = {"logged_share": src["logged"] / sum(src.values()),
                                           "steps": int(sum(src.values()))}
    res: dict[str, Any] = {}
    if "whatif.residual.n" in s:
        res["factual_residual"] = interval_from_sums(s, "whatif.residual", level).to_dict()
    if per_policy:
        res["policies"] = per_policy
        errs = [d["value_error"] for d in per_policy.values() if "value_error" in d]
        if errs:
            res["value_error_mean"] = float(np.mean(errs))
    if request is not None and per_policy:
        res["whatif"] = {"query_id": request.query_id, "reference": request.reference, "horizon": request.horizon,
                         "level": request.level,
                         "per_entity_file": f"<site state>/{WHATIF_DIR}/{request.query_id}.csv (on each site only)"}
    k = s.get("anchors.sites")
    if k:
        anchors = (int(round(s["anchors.a_off"] / k)), int(round(s["anchors.a_on"] / k)))
        res["anchors"] = anchor_labels(anchors, action_names)
    if "contexts.generated" in s and sites:
        res["contexts"] = {"generated": int(round(s["contexts.generated"] / sites)),
                           "replayed": int(round(s["contexts.replayed"] / sites))}
    return res


NOT_IDENTIFIED = ("not identified: no logged step follows this policy, so the data cannot tell its value; only the "
                  "bounds over the outcome's range hold (the model's own value is kept under 'model_only')")


def _not_identified(d: dict[str, Any]) -> None:
    """A policy no logged step follows: its value is not identified by the data. The simulated value and every
    interval around a point (the model's, the rectified, the doubly robust one, which is the model's value again
    when every weight is zero) move to ``model_only``; what stays is the bounded interval (the unseen-mass bounds,
    which then span the outcome's range), where the sites' outcomes allow it."""
    d["model_only"] = {k: d.pop(k) for k in ("value_sim", "interval", "rectified") if k in d}
    d["value_sim"] = None
    d.pop("value_error", None)
    dr = d.get("doubly_robust")
    d["interval"] = dict(dr["bounded"]) if dr and dr.get("bounded") else None
    if dr:
        d["model_only"]["doubly_robust"] = {k: dr[k] for k in ("estimate", "low", "high") if k in dr}
        dr.update({"estimate": None, "low": None, "high": None})
    for est, r in d.items():  # the OPE points (ipw, snipw, dr, their truncated forms): no weight reached π
        if isinstance(r, dict) and "ess" in r and r.get("value") is not None:
            d["model_only"][est] = r["value"]
            r["value"] = None
    d["warning"] = NOT_IDENTIFIED


def _not_identified_effect(eff: dict[str, Any], which: str) -> None:
    """An effect one side of which is not identified: only its bounded interval stays (see :func:`_not_identified`)."""
    eff["model_only"] = {k: eff.get(k) for k in ("estimate", "low", "high")}
    eff.update({"estimate": None, "low": None, "high": None, "supported": False,
                "warning": f"not identified: no logged step follows {which}"})
    dr = eff.get("doubly_robust")
    if dr:
        dr.update({"estimate": None, "low": None, "high": None})


#: the scalars of an evaluation reply that do not depend on the policies (anchor ids, context counts, the residual)
WHATIF_SCALARS = ("anchors.a_off", "anchors.a_on", "anchors.sites", "contexts.generated", "contexts.replayed",
                  "whatif.residual.n", "whatif.residual.sum", "whatif.residual.sumsq")


#: the support sums of one policy (:func:`support_sums`): Σ_i the share of steps the logs follow π; sites with none
SUPPORT_FIELDS = ("sum", "none")


def whatif_metric_names(policy_names: list[str] | tuple[str, ...]) -> list[str]:
    """Every key :func:`site_policy_sums` may add to an evaluation reply besides ``policy.*`` / ``ope.*`` (the
    federation's exact egress allow-list, ``apps.egress``)."""
    names = list(WHATIF_SCALARS)
    for p in policy_names:
        names += [f"whatif.value.{p}.{f}" for f in ("n", "sum", "sumsq", "mc_var")]
        names += [f"whatif.{kind}.{p}.{f}" for kind in ("rectified", "diff", "drdiff") for f in ("n", "sum", "sumsq")]
        names += [f"whatif.dr.{p}.{f}"
                  for f in ("n", "sum", "sumsq", "support", *UNSEEN_FIELDS, *UNSEEN_END_FIELDS)]
        names.append(f"whatif.fires.{p}")  # threshold rules: 1 where the rule fires on the site's rows (P43)
        names += [f"whatif.support.{p}.{f}" for f in SUPPORT_FIELDS]
        names += [f"whatif.pik.{p}.{f}" for f in PIK_FIELDS]  # stochastic policies: where π_k came from
    return names + identified_metric_names(list(policy_names))


def evaluated_policy_names(eval_config: dict | None, cfg: "RunConfig") -> list[str]:
    """The names of the policies an evaluation request asks about: the request's own question, else the run's
    ``[evaluation] policies`` (the paper's four when those cannot be read here)."""
    from fcd_secure.data.policy import DEFAULT_POLICY_NAMES  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415

    raw = (eval_config or {}).get(WHATIF_KEY)
    if raw:
        try:
            return [p.name for p in WhatIfRequest.from_json(str(raw)).policies]
        except ValueError:
            return []  # a malformed question is refused by the handler; nothing of it may leave
    try:
        return [p.name for p in load_policy_refs(cfg.evaluation.policies)]
    except DataError:
        return list(DEFAULT_POLICY_NAMES)


def action_labels(cfg: "RunConfig") -> list[str] | None:
    """The action labels of the run's data as the server may know them without any site's data: a spec's labels
    (``actions`` / ``action_labels``), DKT-Synth's item names, the tumour world's four actions; None otherwise
    (anchors are then shown by id)."""
    from fcd_secure.data.spec import load_spec  # noqa: PLC0415

    d = cfg.data
    if d.dataset == "spec" and d.spec:
        spec = load_spec(d.spec)
        return list(spec.actions or spec.action_labels or []) or None
    if d.dataset == "dkt-synth":
        from fcd_secure.data.dkt_synth.generation import ITEM_LABELS  # noqa: PLC0415

        return list(ITEM_LABELS)
    if d.dataset == "tumour":
        from fcd_secure.data.tumour import ACTION_LABELS  # noqa: PLC0415

        return list(ACTION_LABELS)
    return None


def context_columns(cfg: "RunConfig") -> dict[str, list[str]]:
    """The context columns by how a rollout treats them, as the server may know them without any site's data: a
    spec's ``[[context]]`` columns by ``dynamics``, DKT-Synth's clock, the tumour's volume and diameter; empty
    otherwise (the counts remain)."""
    from fcd_secure.data.spec import load_spec  # noqa: PLC0415

    d = cfg.data
    if d.dataset == "spec" and d.spec:
        spec = load_spec(d.spec)
        gen = [c.name for c in spec.context if c.dynamics == "endogenous"] if cfg.model.use_context else []
        return {"generated_columns": gen, "replayed_columns": [c.name for c in spec.context if c.name not in gen]}
    if d.dataset == "dkt-synth":
        from fcd_secure.data.dkt_synth.generation import CONTEXT_NAMES  # noqa: PLC0415

        return {"generated_columns": [], "replayed_columns": list(CONTEXT_NAMES)}
    if d.dataset == "tumour":
        from fcd_secure.data.tumour import CONTEXT_NAMES as TUMOUR_CONTEXTS  # noqa: PLC0415

        gen = list(TUMOUR_CONTEXTS) if cfg.model.use_context else []  # both endogenous (data/tumour/pkpd.py)
        return {"generated_columns": gen, "replayed_columns": [c for c in TUMOUR_CONTEXTS if c not in gen]}
    return {}


def check_policies(cfg: "RunConfig", policies: list[Policy]) -> None:
    """Bind every policy to the run's action labels and context columns before anything starts (exit 2 early).

    Raises:
        DataError: a label or context column the data does not have (the message names the policy file and field).
    """
    from fcd_secure.federation import learner  # noqa: PLC0415

    if not any(p.labels or p.needs_context for p in policies):
        return  # ids and anchors are checked by the rollouts; only labels and columns need the data's vocabulary
    site = learner.load_site_data(cfg, 0).test
    for p in policies:
        bind_policy(p, site)

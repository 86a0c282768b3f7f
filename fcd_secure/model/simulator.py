"""The simulator protocol: what any causal simulator offers the rest of the system (paper §III, §V).

A causal simulator is built from the data's dimensions and a :class:`~fcd_secure.model.config.ModelConfig`, trained
on one site's data at a time (so that it can be federated), and then asked do-questions: roll out a policy
(:meth:`Simulator.simulate`), estimate individual effects (:meth:`Simulator.estimate_effects`), and give one-step
factual probabilities (:meth:`Simulator.factual_probs`, for the factual AUC). It names its shared and site-local
parameters through the Θc/Θs :class:`~fcd_secure.manifest.Manifest` (paper §III-A "Θ = Θc ∪ {Θs_i}"), which is all
that secure aggregation, the egress gate and the audit read.

The shape follows Flower's ``Strategy`` (an abstract base whose hooks a concrete class fills in) and obp's one class
per estimator: Fed-CausalDiff and each baseline is one subclass in one module of :mod:`fcd_secure.model.baselines`.
What every simulator shares is written here once: the effect definition (:func:`contrast_effects`), the policy
value of a rollout (:meth:`SimResult.from_rollout`), how a plan becomes actions (:func:`plan_fn`) and the
get/set of parameters by part.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Union

import numpy as np
import torch
from torch import nn

from fcd_secure.data.policy import bind_policy
from fcd_secure.data.schema import SiteDataset
from fcd_secure.manifest import Manifest, Part
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.context import ContextBounds
from fcd_secure.model.manifest import build_manifest, get_params, set_params

if TYPE_CHECKING:  # pragma: no cover
    from fcd_secure.data.policy import PolicyLike

__all__ = [
    "ByRow", "FirstThen", "Plan", "PlanFn", "SimResult", "Simulator", "check_window", "context_names", "contrast_effects",
    "effect_window_mask", "plan_fn", "replayed_contexts",
]

#: A plan: a policy (``.name`` and ``.actions(t, y_hist, lengths, a_off, a_on)``), a constant action, actions
#: ``[H]`` or ``[n, H]``, ``fn(t, y_hist, lengths) -> int64[B]``, a :class:`FirstThen` or a :class:`ByRow`.
Plan = Union["PolicyLike", int, np.ndarray, Callable[[int, np.ndarray, np.ndarray], np.ndarray], "FirstThen", "ByRow"]


@dataclass(frozen=True)
class FirstThen:
    """A plan that gives each row its own action at the first simulated step and follows ``then`` afterwards: the
    rollout of Q(h_t, a_t) = E[Σ_{s≥t} Y_s | h_t, do(a_t), then π] from a logged history h_t and its logged action
    (the outcome regression of the sequential doubly robust estimator, Bang & Robins 2005, Biometrics 61:962-973).

    Attributes:
        first: the action of each row of the simulated dataset at the first simulated step, int ``[n]``.
        then: the plan from the second step on (a policy, a constant action, ...; not another ``FirstThen``).
    """

    first: np.ndarray
    then: Any

    @property
    def name(self) -> str:
        return f"first_then_{getattr(self.then, 'name', 'plan')}"

    @property
    def needs_context(self) -> bool:
        return bool(getattr(self.then, "needs_context", False))


@dataclass(frozen=True)
class ByRow:
    """Several plans in one rollout: row i of the simulated dataset follows ``plans[which[i]]``, so that the
    rollouts of several policies from one start step share the simulator's steps (a rollout's cost is its steps, not
    its rows).

    Attributes:
        plans: the plans (policies, :class:`FirstThen`, ...; not another ``ByRow``).
        which: the plan of each row, int ``[n]``.
    """

    plans: tuple
    which: np.ndarray

    name = "by_row"

    @property
    def needs_context(self) -> bool:
        return any(bool(getattr(p, "needs_context", False)) for p in self.plans)
#: A plan normalised by :func:`plan_fn`: ``fn(h, t, y_hist, lengths, rows, context) -> int64[B]``, ``context`` the
#: contexts up to and including t ``[B, h', da]`` (read only by a policy whose ``needs_context`` is true).
PlanFn = Callable[..., np.ndarray]


def plan_fn(plan: Plan, anchors: tuple[int, int] | None, ds: SiteDataset | None = None) -> tuple[PlanFn, str]:
    """Normalise ``plan`` to ``fn(h, t, y_hist, lengths, rows, context=None) -> int64[B]`` and a name.

    A declarative policy (:class:`fcd_secure.data.policy.Policy`) is bound to ``ds``'s action labels and context
    columns first, so that it may name actions by label and read a context column.

    Args:
        plan: see :data:`Plan`.
        anchors: ``(a_off, a_on)``; required for a policy object.
        ds: the dataset the plan runs on (its vocabulary binds a declarative policy).

    Raises:
        ValueError: a policy without anchors, or an action array that is neither [H] nor [n, H].
        DataError: a policy naming a label or context column the dataset does not have.
        TypeError: anything else.
    """
    if isinstance(plan, FirstThen):
        first = np.asarray(plan.first, dtype=np.int64)
        then, _ = plan_fn(plan.then, anchors, ds)

        def fn(h, t, yh, ln, rows, context=None):
            return first[rows] if h == 0 else then(h, t, yh, ln, rows, context)
        return fn, plan.name
    if isinstance(plan, ByRow):
        which = np.asarray(plan.which, dtype=np.int64)
        fns = [plan_fn(p, anchors, ds)[0] for p in plan.plans]

        def by_row(h, t, yh, ln, rows, context=None):
            out = np.zeros(len(rows), dtype=np.int64)
            k = which[rows]
            for j, f in enumerate(fns):
                sel = np.flatnonzero(k == j)
                if sel.size:
                    out[sel] = f(h, t, yh[sel], ln[sel], rows[sel], None if context is None else context[sel])
            return out
        return by_row, plan.name
    if hasattr(plan, "actions") and callable(plan.actions):
        if anchors is None:
            raise ValueError("a policy needs anchors=(a_off, a_on)")
        pol = bind_policy(plan, ds)
        a_off, a_on = anchors
        if getattr(pol, "needs_context", False):
            def fn(h, t, yh, ln, rows, context=None):
                if context is None:
                    raise ValueError(f"policy {pol.name!r} reads a context column: this rollout passes no contexts")
                return np.asarray(pol.actions(t, yh, ln, a_off, a_on, context=context), dtype=np.int64)
        else:
            def fn(h, t, yh, ln, rows, context=None):
                return np.asarray(pol.actions(t, yh, ln, a_off, a_on), dtype=np.int64)
        return fn, str(getattr(plan, "name", "policy"))
    if isinstance(plan, (int, np.integer)):
        return (lambda h, t, yh, ln, rows, context=None: np.full(len(ln), int(plan), dtype=np.int64)), f"always_{int(plan)}"
    if isinstance(plan, np.ndarray):
        arr = plan.astype(np.int64)
        if arr.ndim == 1:
            return (lambda h, t, yh, ln, rows, context=None: np.full(len(ln), arr[h], dtype=np.int64)), "plan"
        if arr.ndim == 2:
            return (lambda h, t, yh, ln, rows, context=None: arr[rows, h]), "plan"
        raise ValueError(f"an action plan must be [H] or [n, H], got shape {arr.shape}")
    if callable(plan):
        return (lambda h, t, yh, ln, rows, context=None: np.asarray(plan(t, yh, ln), dtype=np.int64)), getattr(
            plan, "__name__", "plan")
    raise TypeError(f"cannot use {type(plan).__name__} as a policy or action plan")


def check_window(L: int, start_t: int, horizon: int | None) -> int:
    """The rollout length H for a window starting at ``start_t`` (``horizon`` None: to the end).

    Raises:
        ValueError: if the window does not fit in ``[0, L)``.
    """
    if not 0 <= start_t < L:
        raise ValueError(f"start_t must be in [0, {L}), got {start_t}")
    H = (L - start_t) if horizon is None else int(horizon)
    if not 1 <= H <= L - start_t:
        raise ValueError(f"horizon must be in [1, {L - start_t}] from start_t={start_t}, got {horizon}")
    return H


@dataclass
class SimResult:
    """Outcome trajectories of one simulated policy.

    ``probs[i, s, h]`` is E[Y_{start_t+h} | simulated state] for patient i and sample s; ``y`` the sampled outcome;
    ``mask[i, h]`` the logged valid-step mask over the window. ``value_per_patient[i]`` = mean over samples of
    (1/L_i) Σ_h M·probs — the policy value (per-step average outcome over valid steps). ``value`` is its mean over
    patients, with the between-patient standard error and a normal 95 % interval.

    ``contexts`` says how the rollout obtained each context column: ``{"generated": [...], "replayed": [...]}`` by
    column name (endogenous contexts generated by the model, exogenous ones replayed from the log;
    :mod:`fcd_secure.model.context`). ``context_values`` holds the contexts the rollout used, ``[n, S, H, da]``, when
    it was asked to keep them.
    """

    name: str
    start_t: int
    horizon: int
    probs: np.ndarray
    y: np.ndarray
    actions: np.ndarray
    mask: np.ndarray
    value_per_patient: np.ndarray
    value: float
    se: float
    ci95: tuple[float, float]
    meta: dict[str, Any] = field(default_factory=dict)
    contexts: dict[str, list[str]] = field(default_factory=dict)
    context_values: np.ndarray | None = None

    @classmethod
    def from_rollout(
        cls, name: str, ds: SiteDataset, start_t: int, probs: np.ndarray, y: np.ndarray, actions: np.ndarray,
        meta: dict[str, Any] | None = None, contexts: dict[str, list[str]] | None = None,
        context_values: np.ndarray | None = None,
    ) -> "SimResult":
        """The result of a rollout ``probs``/``y``/``actions`` ``[n, S, H]`` over ``ds`` from ``start_t``.

        The one definition of the policy value every simulator reports. ``contexts`` defaults to every context
        column replayed (:func:`replayed_contexts`).
        """
        n, _, H = probs.shape
        mask = ds.M[:, start_t : start_t + H].astype(np.float32)
        denom = np.maximum(mask.sum(1), 1.0)
        vpp = ((probs * mask[:, None, :]).sum(2) / denom[:, None]).mean(1)
        value = float(vpp.mean())
        se = float(vpp.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        return cls(
            name=name, start_t=start_t, horizon=H, probs=probs, y=y, actions=actions, mask=mask,
            value_per_patient=vpp, value=value, se=se, ci95=(value - 1.96 * se, value + 1.96 * se), meta=dict(meta or {}),
            contexts=dict(contexts) if contexts is not None else replayed_contexts(ds), context_values=context_values,
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able summary (no per-patient arrays)."""
        return {"policy": self.name, "value": self.value, "se": self.se, "ci95": list(self.ci95),
                "start_t": self.start_t, "horizon": self.horizon, "n": int(self.probs.shape[0]),
                "n_samples": int(self.probs.shape[1]), "contexts": self.contexts}


def context_names(ds: SiteDataset) -> list[str]:
    """The name of each context column of ``ds`` (``meta['a_names']``, else ``A[0]``, ``A[1]``, ...)."""
    names = [str(a) for a in (ds.meta.get("a_names") or [])]
    return names if len(names) == ds.da else [f"A[{j}]" for j in range(ds.da)]


def replayed_contexts(ds: SiteDataset) -> dict[str, list[str]]:
    """Every context column of ``ds`` replayed from the log (a simulator without a context model)."""
    return {"generated": [], "replayed": context_names(ds)}


def effect_window_mask(ds: SiteDataset, anchor_step: int, horizon: int) -> np.ndarray:
    """Valid-step mask of the effect window [anchor_step, anchor_step + horizon); rows with none get all ones."""
    m = ds.M[:, anchor_step : anchor_step + horizon].astype(np.float64)
    empty = m.sum(1) == 0
    m[empty] = 1.0
    return m


def contrast_effects(
    simulate: Callable[..., SimResult],
    ds: SiteDataset,
    anchors: tuple[int, int],
    anchor_step: int,
    horizon: int,
    n_samples: int,
    seed: int,
    **kw: Any,
) -> np.ndarray:
    """τ̂_i = mean over h < horizon of (E[Y_{t0+h} | do(a_on …)] − E[Y_{t0+h} | do(a_off …)]), t0 = anchor_step.

    The one effect definition of every simulator, the same as the DKT-Synth oracle's ``true_effects``:
    always-a_on minus always-a_off from the anchor step, the history before t0 as logged. Both arms share their
    random numbers (same ``seed``). The mean runs over the window's valid steps (all steps for a row that has none).

    Args:
        simulate: ``simulate(ds, plan, n_samples, seed, start_t=, horizon=, **kw) -> SimResult``.
        ds: the trajectories to score.
        anchors: ``(a_off, a_on)``.
        anchor_step: t0.
        horizon: window length.
        n_samples: simulated futures per trajectory.
        seed: seed of both arms.
        **kw: passed to ``simulate`` (sampler, steps, rollout, ...).

    Returns:
        τ̂, float64 ``[n]``.
    """
    a_off, a_on = anchors
    on = simulate(ds, int(a_on), n_samples, seed, start_t=anchor_step, horizon=horizon, **kw)
    off = simulate(ds, int(a_off), n_samples, seed, start_t=anchor_step, horizon=horizon, **kw)
    m = effect_window_mask(ds, anchor_step, horizon)
    diff = (on.probs - off.probs).mean(1)  # [n, H]
    return (diff * m).sum(1) / m.sum(1)


class Simulator(ABC):
    """A causal simulator: build, train on a site, name its Θc/Θs parts, roll out policies, estimate effects.

    Subclasses set :attr:`name` and :attr:`theta_s_modules` and implement :meth:`from_dims`,
    :meth:`make_optimizer`, :meth:`train_site`, :meth:`_simulate` and :meth:`factual_probs`; the public
    :meth:`simulate`, effects, policy rollouts and the parameter parts come from this base. The baselines (the naive
    model and the paper's recurrent ones) share one more template,
    :class:`~fcd_secure.model.baselines.rollout.SteppedSimulator`.

    Attributes:
        name: the simulator's key (``fcd train --method``).
        theta_s_modules: top-level sub-modules whose parameters are site-local (Θs); everything else is Θc.
        site_bound_modules: those of them that not even full synchronisation sends (``fcd_secure.manifest``).
        config: the model configuration it was built with.
    """

    name: ClassVar[str]
    theta_s_modules: ClassVar[tuple[str, ...]] = ()
    site_bound_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, module: nn.Module, config: ModelConfig) -> None:
        self._module = module
        self.config = config
        self._optimizer: torch.optim.Optimizer | None = None
        #: the range of each generated context on the rows this simulator's owner trained it on
        #: (:meth:`keep_context_range`); a plain attribute, so in no parameter set, checkpoint or message
        self.context_bounds: ContextBounds | None = None

    # -- building and training -------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def from_dims(
        cls, cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, n_endogenous: int = 0
    ) -> "Simulator":
        """A fresh simulator whose parameters are initialised from ``cfg.seed`` (every site builds the same Θc).

        Args:
            cfg: the model configuration.
            dx: static covariates.
            da: context features per step.
            n_actions: size of the action set.
            n_sites: number of sites (labels of a site discriminator, if any).
            n_endogenous: leading context columns treatment changes (``data.spec.n_endogenous``); a simulator that
                models contexts generates them in rollouts, one that does not ignores this.
        """

    @property
    def module(self) -> nn.Module:
        """The trainable network (what Opacus wraps and a checkpoint saves)."""
        return self._module

    @abstractmethod
    def make_optimizer(self) -> torch.optim.Optimizer:
        """A fresh optimiser over :attr:`module`'s parameters."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimiser whose state persists across :meth:`train_site` calls (made on first use)."""
        if self._optimizer is None:
            self._optimizer = self.make_optimizer()
        return self._optimizer

    @abstractmethod
    def train_site(
        self, ds: SiteDataset, site_index: int | None, n_sites: int, epochs: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """Train on one site's data (one local round), stepping :attr:`optimizer`.

        Args:
            ds: the site's training data (its propensities are never used).
            site_index: the site's label, or None for a pooled dataset with per-row ``meta['site']``.
            n_sites: number of sites.
            epochs: passes over ``ds``.
            seed: seed of all randomness of this call.

        Returns:
            Mean loss parts (``total`` among them), ``n`` and whatever else the simulator reports.
        """

    def keep_context_range(self, ds: SiteDataset) -> None:
        """Keep the range of each generated context over ``ds``, the training rows of whoever rolls this simulator
        out (a site its own, the centralised reference the pooled ones), as ``config.clamp_contexts`` asks
        (:class:`~fcd_secure.model.context.ContextBounds`); a simulator that generates no context, or
        ``clamp_contexts = "off"``, keeps none."""
        kind = self.config.clamp_contexts
        n_endo = self.generated_contexts
        self.context_bounds = None if kind == "off" or not n_endo else ContextBounds.of(ds, n_endo, kind)

    @property
    def generated_contexts(self) -> int:
        """How many leading context columns this simulator generates in a rollout (0: it replays every one)."""
        return 0

    # -- Θc / Θs ---------------------------------------------------------------------------------------------
    def manifest(self) -> Manifest:
        """The Θc/Θs manifest of :attr:`module`."""
        return build_manifest(self.module, self.theta_s_modules, self.site_bound_modules)

    def get_params(self, part: Part) -> dict[str, np.ndarray]:
        """Copies of the parameters of ``part`` (``theta_c``, ``theta_s`` or ``full``), keyed by manifest name."""
        return get_params(self.module, part, self.theta_s_modules, self.site_bound_modules)

    def set_params(self, part: Part, arrays: dict[str, np.ndarray]) -> None:
        """Load ``arrays`` into ``part`` (strict: exactly the part's names and shapes, finite values).

        Raises:
            ManifestError: naming the first tensor that does not match; nothing is written then.
        """
        set_params(self.module, part, arrays, self.theta_s_modules, self.site_bound_modules)

    # -- do-questions ----------------------------------------------------------------------------------------
    def simulate(
        self,
        ds: SiteDataset,
        plan: Plan,
        n_samples: int,
        seed: int,
        start_t: int = 0,
        horizon: int | None = None,
        anchors: tuple[int, int] | None = None,
        **kw: Any,
    ) -> SimResult:
        """Roll out ``plan`` for every trajectory of ``ds`` from ``start_t`` for ``horizon`` steps (the simulator's
        :meth:`_simulate`; the signature and its meaning are written once, here).

        Args:
            ds: trajectories; the history before ``start_t`` is taken as logged.
            plan: a policy, a constant action or an action array (:data:`Plan`).
            n_samples: simulated futures per trajectory.
            seed: seed of all draws; two plans under one seed share their random numbers.
            start_t: first simulated step.
            horizon: steps to simulate (None: to the end).
            anchors: ``(a_off, a_on)`` for a policy plan.
            **kw: simulator-specific options (e.g. sampler, steps); a simulator without options refuses any.
        """
        return self._simulate(ds, plan, n_samples, seed, start_t, horizon, anchors, **kw)

    @abstractmethod
    def _simulate(self, ds: SiteDataset, plan: Plan, n_samples: int, seed: int, start_t: int, horizon: int | None,
                  anchors: tuple[int, int] | None, **kw: Any) -> SimResult:
        """The simulator's rollout (arguments as :meth:`simulate`)."""

    @contextmanager
    def evaluating(self) -> Iterator[nn.Module]:
        """:attr:`module` in eval mode for the block, its mode restored after (rollouts and factual scores)."""
        was = self.module.training
        self.module.eval()
        try:
            yield self.module
        finally:
            self.module.train(was)

    def simulate_policy(
        self, ds: SiteDataset, policy: Plan, anchors: tuple[int, int], n_samples: int, seed: int, **kw: Any
    ) -> SimResult:
        """:meth:`simulate` of a policy over its anchors."""
        return self.simulate(ds, policy, n_samples, seed, anchors=anchors, **kw)

    def estimate_effects(
        self, ds: SiteDataset, anchors: tuple[int, int], anchor_step: int, horizon: int, n_samples: int, seed: int,
        **kw: Any,
    ) -> np.ndarray:
        """Individual effects τ̂ ``[n]`` (:func:`contrast_effects` over :meth:`simulate`)."""
        return contrast_effects(self.simulate, ds, anchors, anchor_step, horizon, n_samples, seed, **kw)

    @abstractmethod
    def factual_probs(self, ds: SiteDataset) -> np.ndarray:
        """One-step-ahead E[Y_t | history before t, A_t, logged T_t] at every step, float64 ``[n, L]`` (padding
        included). The score of the factual AUC (paper §IV-C)."""

    @abstractmethod
    def one_step_probs(self, ds: SiteDataset, action: int) -> np.ndarray:
        """μ̂_a(H_t) = E[Y_t | logged history before t, A_t, do(T_t = a)] at every step t, float64 ``[n, L]``: the
        one-step outcome model of the doubly robust discrepancy D₁ (``evaluation.discrepancy``); only the action at
        t is set, the history before t stays the logged one."""

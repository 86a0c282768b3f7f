"""Treatment policies: declarative TOML files that name actions (paper §IV-A a) "Reference policy family for OPE").

A policy decides, at every step ``t`` of every trajectory, which action to take. Each file is one :class:`Policy`
with a ``rule`` table; every rule evaluates one condition and takes its ``then`` action where the condition holds and
its ``otherwise`` action elsewhere:

- ``kind = "static"``: ``action`` at every step;
- ``kind = "switch"``: ``before`` until step ``at``, ``after`` from step ``at`` on (``unit = "fraction"``: ``at`` is a
  fraction of each trajectory's valid length);
- ``kind = "window"``: ``inside`` for ``start <= t < stop``, ``outside`` elsewhere (``unit = "fraction"``, the
  default, or ``"step"``);
- ``kind = "threshold"``: a rule on the observed (or, in a rollout, simulated) history: ``then`` when the mean of
  the last ``lookback`` values of ``signal`` is ``below`` (or ``above``) ``value`` (in the table's own units: a
  z-scored context column is read back in its units, :func:`context_scales`), else ``otherwise``. The signal is
  ``"outcome"`` (outcomes before t) or ``"context:<column>"`` (a context column up to and including t: A_t is known
  at decision time); ``initial`` decides a step without any outcome history yet (t = 0);
- ``kind = "constant"``: the paper's shorthand over the two anchors, ``on = true`` (a_on) or ``false`` (a_off);
- ``kind = "incremental"``: a *stochastic* policy, the incremental propensity intervention of Kennedy (2019,
  "Nonparametric causal effects based on incremental propensity score interventions", JASA 114:645-656): the
  logging policy with the odds of ``action`` multiplied by ``delta`` at every step (:func:`incremental_probs`).
  δ = 1 is the logging policy itself. It needs the logging policy's probabilities on the history it acts on
  (``behaviour=`` of :meth:`Policy.actions`, or a site-local model bound by :meth:`Policy.with_behaviour`);
- ``kind = "share"``: a *stochastic* policy that gives ``action`` k at a share ``share`` = s of the steps, drawn afresh
  at every step, and leaves the logging policy's own choice at the others: q(a | h) = (1 − s)·π(a | h) + s·1{a = k}
  (:func:`share_probs`). It is the longitudinal modified treatment policy that replaces the *natural value* of
  treatment (what the clinician would have given) by k with probability s: the risk-ratio incremental intervention
  of Díaz, Williams, Hoffman & Schenck (2023, "Nonparametric causal effects based on longitudinal modified treatment
  policies", JASA 118:846-857; Wen, Marcus & Young 2023, Statistical Methods in Medical Research, for interventions
  that depend on the observed treatment process), for binary treatment "multiply the probability of not receiving k
  by 1 − s", written for any number of actions; a stochastic intervention in the sense of Muñoz & van der Laan (2012,
  "Population intervention causal effects based on stochastic interventions", Biometrics 68:541-549). Its weight
  q / π at a logged step is 1 − s + s / P_t where a_t = k and 1 − s elsewhere (:func:`share_ratio`): the logged
  propensity of the logged action is all it needs, so it stays exact when the logging policy read what the record
  does not hold (the odds of ``incremental`` need π_k(h) at every step, which the log holds only where a_t = k). Its
  rollouts act through the logging policy's probabilities like ``incremental``'s.

An action is named by its **label** (a string: the spec's ``actions`` / ``action_labels``, ``meta['action_names']``),
its integer **id**, or an **anchor**: ``"anchor:off"`` / ``"anchor:on"``, the two actions with the most logged
support (:func:`anchor_actions`; the paper evaluates Never, Always, Early-on and Late-on over them). The paper's four
policies are ordinary files in the top-level ``policies/`` folder (:func:`default_policies`), written with anchors.

A policy that names labels or reads a context column is *bound* to a dataset's vocabulary before it runs
(:meth:`Policy.bind`, :func:`bind_policy`); the rollouts of every simulator and the ground truth do it.

Runtime contract (other layers code against it): :class:`PolicyLike`, the one protocol of a target policy
(``name``, ``actions(t, y_hist, lengths, a_off, a_on) -> int64 [B]``, ``prob(...) -> float64 [B]``), which
:class:`Policy` implements. A policy whose ``needs_context`` is true also takes ``context=`` ([B, h, da], the contexts
up to and including t); callers pass it only then, so a policy written in Python keeps the five-argument form. A
policy whose ``needs_behaviour`` is true (``incremental``, ``share``) draws its action and may be passed
``behaviour=`` ([B, K], the logging policy's probabilities on the histories, by a rollout that knows them: an
oracle); without it, it acts through the model bound by :meth:`Policy.with_behaviour`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Protocol, Union, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, ValidationError, model_validator

from fcd_secure.data.paths import policy_dir
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import ANCHOR_PREFIX, DataError, field_path
from fcd_secure.errors import invalid_field

__all__ = [
    "ANCHOR_OFF", "ANCHOR_ON", "DEFAULT_POLICY_NAMES", "Policy", "PolicyLike", "anchor_actions", "anchor_labels", "anchors_from_counts",
    "bind_policy", "context_scales", "default_policies", "snap_threshold", "load_policies", "load_policy", "load_policy_refs", "policy_dir", "regime_support",
    "anchor_regime_support", "incremental_probs", "incremental_ratio", "share_probs", "share_ratio",
]

DEFAULT_POLICY_NAMES = ("never", "always", "early_on", "late_on")
ANCHOR_OFF = f"{ANCHOR_PREFIX}off"
ANCHOR_ON = f"{ANCHOR_PREFIX}on"


@runtime_checkable
class PolicyLike(Protocol):
    """A target policy, as simulators, the DKT-Synth ground truth and OPE estimators use it.

    Rollouts (a simulator's do-simulation, :meth:`DKTSynthWorld.true_policy_value`) call :meth:`actions`;
    importance-weighting estimators call :meth:`prob`. :class:`Policy` implements it; a policy written in Python
    (e.g. a learned one) needs the same three members.
    """

    name: str

    def actions(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int) -> np.ndarray:
        """The action at step ``t`` for each of B rows, int64 [B], given the outcomes before ``t`` (``y_hist`` [B, h])
        and each row's valid length (``lengths`` [B])."""
        ...

    def prob(
        self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int, logged: np.ndarray
    ) -> np.ndarray:
        """π(logged action | history) for each of B rows, float64 [B]."""
        ...


def _check_ref(v: Any) -> Any:
    if isinstance(v, int) and v < 0:
        raise ValueError(f"an action id must be >= 0, got {v}")
    if isinstance(v, str):
        if not v:
            raise ValueError("an action label must not be empty")
        if v.startswith(ANCHOR_PREFIX) and v not in (ANCHOR_OFF, ANCHOR_ON):
            raise ValueError(f"unknown anchor {v!r}; use {ANCHOR_OFF!r} or {ANCHOR_ON!r}")
    return v


#: An action: an id (int), a label (str) or an anchor ("anchor:off" / "anchor:on").
ActionRef = Annotated[Union[StrictInt, str], Field(union_mode="left_to_right")]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def refs(self) -> dict[str, Any]:
        """The rule's action references by field name."""
        return {}

    def condition(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, context: np.ndarray | None,
                  column: int | None) -> np.ndarray:
        raise NotImplementedError

    @model_validator(mode="after")
    def _refs_ok(self) -> "_Rule":
        for v in self.refs().values():
            _check_ref(v)
        return self


class _FieldRule(_Rule):
    """A rule whose actions are fields of its own: the field :attr:`THEN` names is the action where the condition
    holds, the field :attr:`OTHERWISE` names the action elsewhere (one field may be both)."""

    THEN: ClassVar[str]
    OTHERWISE: ClassVar[str]

    def refs(self) -> dict[str, Any]:
        # in the order the rule declares them, so a file's first wrong action is the one reported
        return {f: getattr(self, f) for f in type(self).model_fields if f in (self.THEN, self.OTHERWISE)}

    @property
    def then(self) -> Any:
        return getattr(self, self.THEN)

    @property
    def otherwise(self) -> Any:
        return getattr(self, self.OTHERWISE)


class StaticRule(_FieldRule):
    """``action`` at every step."""

    kind: Literal["static"]
    action: ActionRef

    THEN = OTHERWISE = "action"

    def condition(self, t, y_hist, lengths, context, column):
        return np.ones(len(lengths), dtype=bool)


class ConstantRule(_Rule):
    """The anchor shorthand: a_on (``on = true``) or a_off at every step."""

    kind: Literal["constant"]
    on: bool

    def refs(self) -> dict[str, Any]:
        return {"then": self.then, "otherwise": self.otherwise}

    @property
    def then(self) -> Any:
        return ANCHOR_ON

    @property
    def otherwise(self) -> Any:
        return ANCHOR_OFF

    def condition(self, t, y_hist, lengths, context, column):
        return np.full(len(lengths), self.on, dtype=bool)


class WindowRule(_FieldRule):
    """``inside`` for ``start <= t < stop`` (fractions of each trajectory's length, or step indices), else ``outside``."""

    kind: Literal["window"]
    unit: Literal["fraction", "step"] = "fraction"
    start: float = Field(default=0.0, ge=0.0)
    #: exclusive; omit for "until the end"
    stop: float | None = None
    inside: ActionRef = ANCHOR_ON
    outside: ActionRef = ANCHOR_OFF

    THEN, OTHERWISE = "inside", "outside"

    @model_validator(mode="after")
    def _order(self) -> "WindowRule":
        if self.stop is not None and self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be greater than start ({self.start})")
        if self.unit == "fraction" and (self.start > 1.0 or (self.stop is not None and self.stop > 1.0)):
            raise ValueError("with unit = 'fraction', start and stop must lie in [0, 1]")
        return self

    def condition(self, t, y_hist, lengths, context, column):
        lengths = np.asarray(lengths)
        if self.unit == "fraction":
            lo, hi = self.start * lengths, (np.inf if self.stop is None else self.stop * lengths)
        else:
            lo, hi = np.full(len(lengths), self.start), np.full(len(lengths), np.inf if self.stop is None else self.stop)
        return (t >= lo) & (t < hi)


class SwitchRule(_FieldRule):
    """``before`` for t < ``at``, ``after`` from ``at`` on (a step index, or a fraction of each trajectory's length)."""

    kind: Literal["switch"]
    at: float = Field(ge=0.0)
    unit: Literal["step", "fraction"] = "step"
    before: ActionRef
    after: ActionRef

    THEN, OTHERWISE = "after", "before"

    @model_validator(mode="after")
    def _at(self) -> "SwitchRule":
        if self.unit == "fraction" and self.at > 1.0:
            raise ValueError("with unit = 'fraction', at must lie in [0, 1]")
        return self

    def condition(self, t, y_hist, lengths, context, column):
        lengths = np.asarray(lengths)
        at = self.at * lengths if self.unit == "fraction" else np.full(len(lengths), self.at)
        return t >= at


class ThresholdRule(_Rule):
    """``then`` when the recent mean of ``signal`` crosses ``value`` (a feedback policy on the history), else
    ``otherwise``."""

    kind: Literal["threshold"]
    #: in the table's own units (mg/dL, not z-scores: a standardised column is read back in its units, P43); a site
    #: reads a context threshold on its grid of quantiles (:func:`snap_threshold`), ±inf when beyond its data
    value: float
    when: Literal["below", "above"] = "below"
    lookback: int = Field(default=1, ge=1)
    #: "outcome" (the outcomes before t) or "context:<column name>" (that context column up to and including t)
    signal: str = "outcome"
    then: ActionRef = ANCHOR_ON
    otherwise: ActionRef = ANCHOR_OFF
    #: decision at steps with no outcome history yet (t = 0): true → ``then``, false → ``otherwise``, or an action
    initial: Union[StrictBool, StrictInt, str] = False

    @model_validator(mode="after")
    def _signal(self) -> "ThresholdRule":
        if self.signal != "outcome" and not (self.signal.startswith("context:") and len(self.signal) > len("context:")):
            raise ValueError(f"signal must be 'outcome' or 'context:<column name>', got {self.signal!r}")
        if not isinstance(self.initial, bool):
            _check_ref(self.initial)
        return self

    @property
    def context_column(self) -> str | None:
        """The context column the rule reads, or None for the outcome signal."""
        return self.signal[len("context:"):] if self.signal.startswith("context:") else None

    def refs(self) -> dict[str, Any]:
        out = {"then": self.then, "otherwise": self.otherwise}
        if not isinstance(self.initial, bool):
            out["initial"] = self.initial
        return out

    def condition(self, t, y_hist, lengths, context, column, scale: tuple[float, float] | None = None):
        B = len(lengths)
        if self.context_column is not None:
            if context is None or column is None:
                raise ValueError(f"the rule reads context {self.context_column!r}: pass context= of a bound policy")
            ctx = np.asarray(context, dtype=np.float64).reshape(B, -1, np.shape(context)[-1])
            recent = ctx[:, -self.lookback:, column].mean(axis=1)
            if scale is not None:  # a z-scored column: back to the table's own units, those of ``value``
                recent = recent * scale[1] + scale[0]
        else:
            y_hist = np.asarray(y_hist, dtype=np.float64).reshape(B, -1)
            # the last `lookback` columns, not y_hist[:, t-lookback:t]: a history shorter than t (a rollout from
            # start_t) would make that slice empty, its mean NaN and the rule silently "otherwise"
            recent = y_hist[:, -self.lookback:].mean(axis=1)
        return recent < self.value if self.when == "below" else recent > self.value

    def without_history(self, t: int, y_hist: np.ndarray) -> bool:
        """Whether step ``t`` has no outcome history for an outcome rule (``initial`` decides it)."""
        return self.context_column is None and (t == 0 or np.asarray(y_hist).reshape(np.shape(y_hist)[0], -1).shape[1] == 0)


class _StochasticRule(_Rule):
    """A rule that shifts the logging policy π towards (or away from) one ``action`` k: the policy draws its action
    from q(· | h), built from π(· | h) by :meth:`probs`; its importance weight at a logged step is :meth:`ratio`."""

    action: ActionRef = ANCHOR_ON
    #: whether the weight at a logged a_t ≠ k needs π_k(h_t), which the logs do not hold there
    needs_pi_k: ClassVar[bool] = True

    def refs(self) -> dict[str, Any]:
        return {"action": self.action}

    def probs(self, behaviour: np.ndarray, k: int) -> np.ndarray:
        """q(· | h) over the actions, ``[B, K]``, from the logging policy's probabilities ``behaviour`` ``[B, K]``."""
        raise NotImplementedError

    def ratio(self, P: np.ndarray, pi_k: np.ndarray | None, is_k: np.ndarray) -> np.ndarray:
        """q(a_t | h_t) / π(a_t | h_t) at logged steps, from the logged propensity ``P`` of the logged action, π_k
        (None where :attr:`needs_pi_k` is false) and whether the logged action is k."""
        raise NotImplementedError

    def takes(self, is_k: np.ndarray) -> np.ndarray:
        """Whether q(a | h) > 0 for a logged action a (π(a | h) > 0), given whether a is k."""
        return np.ones(np.shape(is_k), dtype=bool)


class IncrementalRule(_StochasticRule):
    """The logging policy with the odds of ``action`` multiplied by ``delta`` (Kennedy 2019; module docstring)."""

    kind: Literal["incremental"]
    #: the odds multiplier δ > 0 (δ = 1: the logging policy; δ > 1 favours ``action``, δ < 1 avoids it)
    delta: float = Field(gt=0.0, allow_inf_nan=False)

    def probs(self, behaviour: np.ndarray, k: int) -> np.ndarray:
        return incremental_probs(behaviour, k, self.delta)

    def ratio(self, P: np.ndarray, pi_k: np.ndarray | None, is_k: np.ndarray) -> np.ndarray:
        return incremental_ratio(self.delta, pi_k, is_k)


class ShareRule(_StochasticRule):
    """The logging policy's own action, replaced by ``action`` at a share ``share`` of the steps (module docstring)."""

    kind: Literal["share"]
    #: the share s of the steps, drawn afresh at every step, at which ``action`` is given instead of the logging
    #: policy's own choice (s = 1: ``action`` at every step, the static policy)
    share: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    #: q / π at a_t ≠ k is 1 − s whatever π_k is, and at a_t = k it is read off the logged P_t: no π_k needed
    needs_pi_k: ClassVar[bool] = False

    def probs(self, behaviour: np.ndarray, k: int) -> np.ndarray:
        return share_probs(behaviour, k, self.share)

    def ratio(self, P: np.ndarray, pi_k: np.ndarray | None, is_k: np.ndarray) -> np.ndarray:
        return share_ratio(self.share, P, is_k)

    def takes(self, is_k: np.ndarray) -> np.ndarray:
        return np.asarray(is_k, dtype=bool) | (self.share < 1.0)


def draw_actions(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One action per row of the probabilities ``q`` (rows × actions) by the inverse CDF of the row's uniform ``u``:
    the first action whose cumulative probability exceeds ``u``, the last where rounding leaves the sum below it
    (Devroye 1986, *Non-Uniform Random Variate Generation*, §III.2.1)."""
    return np.minimum((np.cumsum(q, axis=1) < u[:, None]).sum(1), q.shape[1] - 1).astype(np.int64)


def incremental_ratio(delta: float, pi_k: np.ndarray, is_k: np.ndarray) -> np.ndarray:
    """q(a | h) / π(a | h) of the incremental intervention: δ / (δπ_k + 1 − π_k) where a = k, 1 / (δπ_k + 1 − π_k)
    elsewhere (Kennedy 2019, eq. 2). Only π_k(h) enters, so the importance weight of a logged action a_t ≠ k needs
    π_k at that history, not the logged propensity of a_t."""
    pi_k = np.asarray(pi_k, dtype=np.float64)
    denom = delta * pi_k + 1.0 - pi_k
    return np.where(np.asarray(is_k, dtype=bool), delta, 1.0) / denom


def incremental_probs(behaviour: np.ndarray, k: int, delta: float) -> np.ndarray:
    """q(· | h) over the actions, ``[B, K]``, from the logging policy's ``behaviour`` ``[B, K]``:
    q_k = δπ_k / (δπ_k + 1 − π_k) and q_j = π_j / (δπ_k + 1 − π_k) for j ≠ k (each row sums to 1 when ``behaviour``'s
    does)."""
    b = np.asarray(behaviour, dtype=np.float64)
    is_k = np.arange(b.shape[1])[None, :] == int(k)
    return b * incremental_ratio(delta, b[:, [int(k)]], is_k)


def share_ratio(share: float, P: np.ndarray, is_k: np.ndarray) -> np.ndarray:
    """q(a | h) / π(a | h) of the share policy q = (1 − s)π + s·1{a = k}: 1 − s + s / π(k | h) where a = k, 1 − s
    elsewhere. Where a = k, π(k | h) is the logged propensity ``P`` of the logged action itself, so the weight of
    every logged step is read off the log, for any number of actions and whatever the logging policy read."""
    P = np.asarray(P, dtype=np.float64)
    return np.where(np.asarray(is_k, dtype=bool), 1.0 - share + share / P, 1.0 - share)


def share_probs(behaviour: np.ndarray, k: int, share: float) -> np.ndarray:
    """q(· | h) = (1 − s)·π(· | h) + s·1{· = k}, ``[B, K]``, from the logging policy's ``behaviour`` ``[B, K]``."""
    q = (1.0 - share) * np.asarray(behaviour, dtype=np.float64)
    q[:, int(k)] += share
    return q


Rule = Annotated[
    Union[StaticRule, SwitchRule, WindowRule, ThresholdRule, ConstantRule, IncrementalRule, ShareRule],
    Field(discriminator="kind"),
]
RULE_KINDS = ("static", "switch", "window", "threshold", "constant", "incremental", "share")


class Policy(BaseModel):
    """A policy over a dataset's actions (module docstring): deterministic, or stochastic (``incremental``,
    ``share``)."""

    model_config = ConfigDict(extra="forbid")

    #: letters, digits, '_' and '-' (the name keys the policy's numbers in reports and evaluation sums)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
    description: str = ""
    rule: Rule

    _labels: dict[str, int] | None = PrivateAttr(default=None)
    _n_actions: int | None = PrivateAttr(default=None)
    _column: int | None = PrivateAttr(default=None)
    _scale: tuple[float, float] | None = PrivateAttr(default=None)
    _source: str | None = PrivateAttr(default=None)
    #: a stochastic rule's logging-policy model ``fn(t, y_hist, lengths, context) -> [B, K]`` and its sampler seed
    _behaviour: Any = PrivateAttr(default=None)
    _seed: int = PrivateAttr(default=0)
    _rng: Any = PrivateAttr(default=None)

    # -- vocabulary ------------------------------------------------------------------------------------------
    @property
    def source(self) -> str | None:
        """The file the policy was read from (errors name it)."""
        return self._source

    @property
    def needs_context(self) -> bool:
        """Whether the policy reads a context column (callers then pass ``context=``)."""
        if self.stochastic:
            return True  # the logging-policy model it acts through reads the context at t
        return isinstance(self.rule, ThresholdRule) and self.rule.context_column is not None

    @property
    def stochastic(self) -> bool:
        """Whether the policy draws its action from a shift of the logging policy (``incremental``, ``share``):
        π(a | h) is then a probability built from the logging policy's, not a 0 or 1 of a rule."""
        return isinstance(self.rule, _StochasticRule)

    #: a rollout that knows the logging policy's true probabilities passes them as ``behaviour=`` (an oracle)
    needs_behaviour = stochastic

    def shifted_action(self, a_off: int, a_on: int) -> int:
        """The action k a stochastic policy shifts the logging policy towards (or away from): the one whose odds an
        incremental policy multiplies, the one a share policy gives at its share of the steps."""
        if not isinstance(self.rule, _StochasticRule):
            raise ValueError(f"policy {self.name!r} is not stochastic")
        return self._id(self.rule.action, a_off, a_on)

    @property
    def behaviour(self) -> Any:
        """The logging-policy model bound by :meth:`with_behaviour` (None when unbound)."""
        return self._behaviour

    def with_behaviour(self, behaviour: Any, seed: int) -> "Policy":
        """A copy that acts through ``behaviour(t, y_hist, lengths, context) -> [B, K]``, a model of the logging
        policy (a site's own, fit on its training rows; it never leaves the site), drawing its actions with a
        generator seeded by ``seed`` (restarted by every :meth:`bind`, so each rollout draws the same way)."""
        out = self.model_copy()
        out._source, out._behaviour, out._seed = self._source, behaviour, int(seed)
        out._rng = np.random.default_rng(out._seed)
        return out

    @property
    def uses_anchors(self) -> bool:
        """Whether the policy names an anchor (its actions then depend on the data's two best-supported actions)."""
        return any(v in (ANCHOR_OFF, ANCHOR_ON) for v in self.rule.refs().values())

    @property
    def labels(self) -> list[str]:
        """The action labels the policy names (to check against a dataset before anything runs)."""
        return [v for v in self.rule.refs().values() if isinstance(v, str) and v not in (ANCHOR_OFF, ANCHOR_ON)]

    def bind(self, action_names: Sequence[str] | None = None, context_names: Sequence[str] | None = None,
             n_actions: int | None = None, context_scales: Mapping[int, tuple[float, float]] | None = None
             ) -> "Policy":
        """This policy with its labels and its context column resolved against a dataset's vocabulary.

        Args:
            action_names: label of each action id (``meta['action_names']``).
            context_names: name of each context column (``meta['a_names']``).
            n_actions: size of the action set (ids are checked against it; default ``len(action_names)``).
            context_scales: ``{column: (mean, std)}`` of the context columns the data holds as z-scores
                (:func:`context_scales`): a threshold on one of them is compared in the table's own units.

        Returns:
            A bound copy (the policy itself is not changed).

        Raises:
            DataError: a label that is not an action of the dataset, an id outside the action set, or a context
                column the dataset does not have; the message names the policy's file and field.
        """
        out = self.model_copy()
        out._source = self._source
        out._rng = np.random.default_rng(self._seed)
        names = None if action_names is None else [str(a) for a in action_names]
        size = n_actions if n_actions is not None else (None if names is None else len(names))
        labels = None if names is None else {a: i for i, a in enumerate(names)}
        for field, ref in self.rule.refs().items():
            where = f"rule.{field}"
            if isinstance(ref, int) and size is not None and ref >= size:
                raise DataError(f"action id {ref} is outside the dataset's {size} actions", file=self._source,
                                field=where)
            if isinstance(ref, str) and ref not in (ANCHOR_OFF, ANCHOR_ON):
                if labels is None:
                    raise DataError(f"names action {ref!r} by label, but the dataset has no action labels",
                                    file=self._source, field=where)
                if ref not in labels:
                    shown = ", ".join(repr(a) for a in names[:12]) + (" …" if len(names) > 12 else "")
                    raise DataError(f"action {ref!r} is not a label of this dataset (labels: {shown})",
                                    file=self._source, field=where)
        out._labels = labels
        out._n_actions = size
        col = self.rule.context_column if isinstance(self.rule, ThresholdRule) else None
        if col is not None:
            cols = None if context_names is None else [str(c) for c in context_names]
            if cols is None or col not in cols:
                raise DataError(f"reads context column {col!r}, which the dataset does not have"
                                + ("" if cols is None else f" (context columns: {', '.join(cols)})"),
                                file=self._source, field="rule.signal")
            out._column = cols.index(col)
            out._scale = None if context_scales is None else context_scales.get(out._column)
        return out

    def _id(self, ref: Any, a_off: int, a_on: int) -> int:
        if isinstance(ref, bool):  # the threshold rule's boolean ``initial`` is resolved by the caller
            raise TypeError("a boolean is not an action")
        if isinstance(ref, int):
            return int(ref)
        if ref == ANCHOR_ON:
            return int(a_on)
        if ref == ANCHOR_OFF:
            return int(a_off)
        if self._labels is None:
            raise ValueError(f"policy {self.name!r} names action {ref!r} by label: bind it to the dataset's action "
                             "labels first (Policy.bind / bind_policy)")
        return self._labels[ref]

    # -- decisions -------------------------------------------------------------------------------------------
    def on(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
        """Whether the rule's condition holds at step ``t`` (its ``then`` action is taken): bool [B].

        ``y_hist`` is [B, h]: the outcomes (simulated or observed) of the steps *before* ``t``, oldest first and the
        most recent (step t−1) last. It may be the whole history (h = t) or only its recent part (h < t, e.g. a
        rollout that started at some ``start_t`` and carries only what it simulated): the threshold rule reads its
        last ``lookback`` columns, never absolute step indices. ``context`` is [B, h', da], the contexts up to and
        including step t (most recent last). ``lengths`` [B] is the valid length of each trajectory (steps at or
        beyond it are padding; the value there is defined but irrelevant).
        """
        lengths = np.asarray(lengths)
        r = self.rule
        if isinstance(r, _StochasticRule):
            raise ValueError(f"policy {self.name!r} is stochastic: it has no condition (use actions or action_probs)")
        if isinstance(r, ThresholdRule) and r.without_history(t, y_hist):
            init = r.initial
            if isinstance(init, bool):
                return np.full(len(lengths), init, dtype=bool)
            return np.zeros(len(lengths), dtype=bool)  # an explicit initial action: the caller's `actions` takes it
        if isinstance(r, ThresholdRule):
            return np.asarray(r.condition(t, y_hist, lengths, context, self._column, self._scale), dtype=bool)
        return np.asarray(r.condition(t, y_hist, lengths, context, self._column), dtype=bool)

    def action_probs(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int,
                     context: np.ndarray | None = None, behaviour: np.ndarray | None = None) -> np.ndarray:
        """A stochastic policy's q(· | h_t), ``[B, K]``: the rule's shift (:func:`incremental_probs`,
        :func:`share_probs`) of ``behaviour`` (the logging policy's probabilities on these histories, when the caller
        knows them: an oracle) or of the bound model's.

        Raises:
            ValueError: not a stochastic policy, or no ``behaviour`` and no bound model.
        """
        r = self.rule
        if not isinstance(r, _StochasticRule):
            raise ValueError(f"policy {self.name!r} is deterministic: use actions()")
        if behaviour is None:
            if self._behaviour is None:
                raise ValueError(f"policy {self.name!r} shifts the logging policy: it needs the logging "
                                 "policy's probabilities (behaviour=) or a model of them (Policy.with_behaviour)")
            behaviour = self._behaviour(t, y_hist, lengths, context)
        return r.probs(behaviour, self._id(r.action, a_off, a_on))

    def actions(
        self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int, context: np.ndarray | None = None,
        behaviour: np.ndarray | None = None,
    ) -> np.ndarray:
        """The action id at step ``t`` for each of B trajectories: int64 [B] (``then`` where :meth:`on`, else
        ``otherwise``; anchors resolve to ``a_off`` / ``a_on``). A stochastic policy draws it from
        :meth:`action_probs` with its seeded generator.

        Raises:
            ValueError: a label of an unbound policy, or a context rule without ``context``.
        """
        lengths = np.asarray(lengths)
        r = self.rule
        if isinstance(r, _StochasticRule):
            q = self.action_probs(t, y_hist, lengths, a_off, a_on, context, behaviour)
            if self._rng is None:
                self._rng = np.random.default_rng(self._seed)
            return draw_actions(q, self._rng.random(len(lengths)))
        if isinstance(r, ThresholdRule) and r.without_history(t, y_hist) and not isinstance(r.initial, bool):
            return np.full(len(lengths), self._id(r.initial, a_off, a_on), dtype=np.int64)
        cond = self.on(t, y_hist, lengths, context)
        then, other = self._id(r.then, a_off, a_on), self._id(r.otherwise, a_off, a_on)
        return np.where(cond, np.int64(then), np.int64(other)).astype(np.int64)

    def prob(
        self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int, logged: np.ndarray,
        context: np.ndarray | None = None, behaviour: np.ndarray | None = None,
    ) -> np.ndarray:
        """π(logged action | history): 1.0 where the logged action equals the policy's, else 0.0 (float64 [B]); a
        stochastic policy's q(logged | h) from :meth:`action_probs`. (Off-policy estimates of a stochastic policy
        take the logged propensities instead: ``queries.incremental``.)"""
        if self.stochastic:
            q = self.action_probs(t, y_hist, lengths, a_off, a_on, context, behaviour)
            return q[np.arange(len(q)), np.asarray(logged, dtype=np.int64)]
        return (self.actions(t, y_hist, lengths, a_off, a_on, context) == np.asarray(logged)).astype(np.float64)

    def plan(self, Y: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int, A: np.ndarray | None = None) -> np.ndarray:
        """Actions for every step given a full outcome matrix ``Y`` [B, L] (history at t = ``Y[:, :t]``) and, for a
        context rule, the contexts ``A`` [B, L, da] (at t: ``A[:, :t+1]``): int64 [B, L]."""
        Y = np.asarray(Y)
        ctx = (lambda t: A[:, : t + 1]) if (self.needs_context and A is not None) else (lambda t: None)
        return np.stack([self.actions(t, Y[:, :t], lengths, a_off, a_on, ctx(t)) for t in range(Y.shape[1])], axis=1)


def bind_policy(policy: Any, ds: SiteDataset | None = None, *, action_names: Sequence[str] | None = None,
                context_names: Sequence[str] | None = None, n_actions: int | None = None) -> Any:
    """``policy`` bound to a dataset's vocabulary if it is a :class:`Policy` (any other plan is returned as is).

    Args:
        policy: a :class:`Policy`, or anything a rollout accepts (a Python policy, an action, a plan).
        ds: the dataset whose ``meta['action_names']`` / ``meta['a_names']`` / ``n_actions`` to use.
        action_names: labels instead of ``ds``'s.
        context_names: context column names instead of ``ds``'s.
        n_actions: size of the action set instead of ``ds``'s.

    Raises:
        DataError: as :meth:`Policy.bind`.
    """
    if not isinstance(policy, Policy):
        return policy
    scales = None
    if ds is not None:
        action_names = action_names if action_names is not None else ds.meta.get("action_names")
        context_names = context_names if context_names is not None else ds.meta.get("a_names")
        n_actions = n_actions if n_actions is not None else ds.n_actions
        scales = context_scales(ds)
    return policy.bind(action_names, context_names, n_actions, scales)


def context_scales(ds: SiteDataset) -> dict[int, tuple[float, float]]:
    """``{context column: (mean, std)}`` of the columns ``ds`` holds as z-scores (``meta['standardization']``)."""
    std = ds.meta.get("standardization")
    if not std:
        return {}
    return {int(c): (float(m), float(s)) for c, m, s in zip(std["a_cols"], std["a_mean"], std["a_std"])}


def snap_threshold(policy: Any, train: SiteDataset, grid: int) -> tuple[Any, dict[str, Any] | None]:
    """A threshold rule on a continuous context column read on the site's own grid (P42): the threshold's rank among
    the column's values on the site's training rows (valid steps, the table's units) is rounded to a multiple of
    ``1/grid`` and the threshold becomes that quantile; rank 0 or 1 becomes −inf / +inf (beyond the site's data: the
    rule never fires, or always). 32 nearby thresholds are then at most ``grid + 1`` cut points, none placed between
    two patients by the asker. Any other policy is returned as is.

    Returns:
        ``(policy, note)``: the (copied) policy and ``{"value", "rank", "snapped"}`` (kept on the site), or None.
    """
    if not isinstance(policy, Policy) or not isinstance(policy.rule, ThresholdRule):
        return policy, None
    col_name = policy.rule.context_column
    names = [str(a) for a in (train.meta.get("a_names") or [])]
    if col_name is None or col_name not in names:
        return policy, None  # the outcome signal (few values), or a column bind will name as missing
    col = names.index(col_name)
    if col not in [int(c) for c in train.meta.get("a_continuous", [])]:
        return policy, None
    x = np.asarray(train.A[train.M > 0][:, col], dtype=np.float64)
    mean, sd = context_scales(train).get(col, (0.0, 1.0))
    x = np.sort(x * sd + mean)
    if x.size == 0:
        return policy, None
    v = float(policy.rule.value)
    rank = float(np.searchsorted(x, v, side="right")) / x.size  # share of the site's values at or below v
    q = round(rank * grid) / grid
    snapped = -np.inf if q <= 0 else (np.inf if q >= 1 else float(np.quantile(x, q)))
    out = policy.model_copy(update={"rule": policy.rule.model_copy(update={"value": snapped})})
    out._source = policy._source
    return out, {"value": v, "rank": q, "snapped": snapped}


def anchor_actions(ds: SiteDataset | list[SiteDataset]) -> tuple[int, int]:
    """(a_off, a_on): the two actions with the most logged valid steps (paper §IV-A).

    a_off is the most supported action, a_on the second (labels are nominal, as in the paper); ties go to the smaller
    id. A list of sites is pooled (in a deployment this is one action histogram per site, summed).

    Args:
        ds: One dataset or a list of sites (the training sites).

    Returns:
        ``(a_off, a_on)``.

    Raises:
        DataError: No dataset, or fewer than two actions are logged.
    """
    sets = ds if isinstance(ds, list) else [ds]
    if not sets:
        raise DataError("anchor_actions: no datasets")
    n_actions = max(d.n_actions for d in sets)
    counts = np.zeros(n_actions, dtype=np.int64)
    for d in sets:
        counts += np.bincount(d.T[d.M > 0], minlength=n_actions)[:n_actions]
    return anchors_from_counts(counts, sets[0].name)


def anchors_from_counts(counts: Sequence[float] | np.ndarray, name: str = "data") -> tuple[int, int]:
    """(a_off, a_on) from a histogram of logged valid steps per action: the rule of :func:`anchor_actions`.

    A consortium whose sites each hold only their own table applies it to the histogram summed over sites under
    secure aggregation (``fcd_secure.data.moments``), so every site binds the paper's policies to the same two
    actions.

    Raises:
        DataError: fewer than two actions are logged.
    """
    c = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64)
    if c.size < 2:
        raise DataError(f"{name}: fewer than two actions are logged; no binary anchor subset exists")
    order = np.argsort(-c, kind="stable")
    if c[order[1]] <= 0:
        raise DataError(f"{name}: fewer than two actions are logged; no binary anchor subset exists")
    return int(order[0]), int(order[1])


def regime_support(T: np.ndarray, M: np.ndarray, action: int, start: int, horizon: int) -> dict[str, int]:
    """How many logged trajectories follow the static regime "always ``action``" from ``start`` for 1 step and for
    the whole ``horizon``: the data a model has to learn that regime's effect from.

    An effect averaged over ``horizon`` steps of one action (PEHE and ATE of the anchor contrast) is identified
    from logs only where such runs occur (positivity over the regime, Robins, Hernán & Brumback 2000); where none
    does, every estimate of it, a simulator's included, is an extrapolation from shorter runs.

    Args:
        T: Logged actions ``[n, L]``.
        M: Valid-step mask ``[n, L]``.
        action: The regime's action.
        start: First step of the regime.
        horizon: Steps of the regime.

    Returns:
        ``{"n": trajectories reaching start + horizon, "first_step": following it at start, "whole": for every
        step of the window}``.
    """
    T, M = np.asarray(T), np.asarray(M) > 0
    win = slice(start, start + horizon)
    reach = M[:, win].sum(1) == horizon
    follows = (T[:, win] == action) & M[:, win]
    return {"n": int(reach.sum()), "first_step": int((reach & follows[:, 0]).sum()),
            "whole": int((reach & follows.all(1)).sum())}


def anchor_regime_support(
    T: np.ndarray, M: np.ndarray, anchors: tuple[int, int], start: int, horizon: int
) -> dict[str, dict[str, int]]:
    """:func:`regime_support` of "always a_off" and "always a_on" (``anchors = (a_off, a_on)``): the support of the
    anchor contrast that PEHE and the ATE measure over ``horizon`` steps from ``start``."""
    return {name: regime_support(T, M, a, start, horizon) for name, a in zip(("a_off", "a_on"), anchors)}


def anchor_labels(anchors: tuple[int, int], action_names: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``{"a_off": {"id", "label"}, "a_on": {...}}``: the anchors as ``fcd data describe``, ``fcd run`` and
    ``summary.json`` show them (the label is the id as text when the data has no labels)."""
    names = list(action_names or [])

    def one(a: int) -> dict[str, Any]:
        return {"id": int(a), "label": str(names[a]) if a < len(names) else str(a)}

    return {"a_off": one(anchors[0]), "a_on": one(anchors[1])}


def load_policy(path: str | Path) -> Policy:
    """Read one policy TOML file (format in ``policies/README.md``).

    Raises:
        DataError: The file is missing, does not parse or does not validate; the message names the file and the
            bad field (e.g. ``rule.start``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("policy file not found", file=path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"does not parse as TOML: {exc}", file=path) from None
    try:
        pol = Policy.model_validate(raw)
    except ValidationError as exc:
        at, msg = invalid_field(exc, Policy)
        # drop the tags pydantic inserts (rule.window.start -> rule.start, rule.static.action.str -> rule.action) so
        # the field reads like the file
        loc = tuple(p for i, p in enumerate(at)
                    if not (i == 1 and at[0] == "rule" and p in RULE_KINDS)
                    and p not in ("int", "str", "bool"))
        raise DataError(msg, file=path, field=field_path(loc)) from None
    pol._source = str(path)
    return pol


def load_policies(folder: str | Path) -> list[Policy]:
    """Every ``*.toml`` policy in ``folder``, sorted by file name.

    Raises:
        DataError: The folder is missing, a file is invalid, or two files share a policy name.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("policy folder not found", file=folder)
    return _unique([load_policy(p) for p in sorted(folder.glob("*.toml"))], folder)


def _unique(policies: list[Policy], where: str | Path | None) -> list[Policy]:
    seen: set[str] = set()
    for p in policies:
        if p.name in seen:
            raise DataError(f"two policy files are named '{p.name}'", file=p.source or where, field="name")
        seen.add(p.name)
    return policies


def default_policies() -> list[Policy]:
    """The paper's four policies, in order never, always, early_on, late_on (:func:`policy_dir`)."""
    return [load_policy(policy_dir() / f"{name}.toml") for name in DEFAULT_POLICY_NAMES]


def load_policy_refs(refs: Sequence[str | Path]) -> list[Policy]:
    """Policies named on the command line or in ``[evaluation] policies``: a ``.toml`` path, or the name of a
    shipped policy (``never``, ``always``, ...). An empty list gives :func:`default_policies`.

    Raises:
        DataError: a missing or invalid file, an unknown shipped name, or two policies with one name.
    """
    if not refs:
        return default_policies()
    out: list[Policy] = []
    for ref in refs:
        text = str(ref)
        if text.endswith(".toml") or "/" in text or Path(text).is_file():
            out.append(load_policy(text))
            continue
        shipped = policy_dir() / f"{text}.toml"
        if not shipped.is_file():
            names = sorted(p.stem for p in policy_dir().glob("*.toml"))
            raise DataError(f"no such policy file, and no shipped policy of that name (shipped: {', '.join(names)})",
                            file=text)
        out.append(load_policy(shipped))
    return _unique(out, None)

"""The typed records of one policy's answer (read by ``queries.answers``): intervals, the doubly robust value, the
effect against the reference, the off-policy diagnostics, the identified horizons, where π_k came from, and the base
:class:`Record` every typed part of the answer shares (``from_json`` tolerant of absent parts, ``to_json`` writing
back the keys it reads). The estimands are those of ``queries.policy_values``, ``queries.doubly_robust``,
``queries.off_policy`` and ``queries.targeted``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from fcd_secure._format import MISSING, fmt

__all__ = [
    "NOT_IDENTIFIED", "DoublyRobust", "Effect", "HorizonAnswer", "IdentifiedAnswer", "Interval", "OffPolicy",
    "PiSource", "PolicyAnswer", "Record", "SequentialDR", "interval_text", "part",
]

#: the cell of a value or effect the logged data cannot identify (``queries.policy_values``: support 0)
NOT_IDENTIFIED = "not identified"
#: the off-policy estimators each policy carries (``queries.off_policy``), over whole trajectories and the first 2 steps
OPE_KEYS = ("ipw", "snipw", "dr", "ipw_h2", "snipw_h2", "dr_h2")


def part(d: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    """``d[key]`` when it is a non-empty object, else None (the part is absent)."""
    v = (d or {}).get(key)
    return v if isinstance(v, Mapping) and v else None


def _tuple(v: Any) -> tuple | None:
    return None if v is None else tuple(v)


class Record:
    """A typed part of the answer. Field metadata ``key`` names a JSON key that differs from the field's name;
    ``json=False`` marks a field that is not a JSON key of its part (a policy's name, the off-policy map, whose
    entries are the part's own keys)."""

    def to_json(self) -> dict[str, Any]:
        """The keys this record reads, as the answer's JSON spells them (absent parts left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is None or not f.metadata.get("json", True):
                continue
            out[f.metadata.get("key", f.name)] = _json(v)
        return out


def _json(v: Any) -> Any:
    if is_dataclass(v) and isinstance(v, Record):
        return v.to_json()
    if isinstance(v, tuple):
        return [_json(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _json(x) for k, x in v.items()}
    return v


def interval_text(iv: "Interval | None") -> str:
    """``0.446–0.545`` (an en dash, three decimals), or ``n/a`` where the interval is absent."""
    if iv is None or iv.low is None or iv.high is None:
        return MISSING
    return f"{iv.low:.3f}–{iv.high:.3f}"


@dataclass(frozen=True)
class Interval(Record):
    """An estimate with its interval over entities (``evaluation.intervals``: normal, at ``level``)."""

    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    se: float | None = None
    n: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Interval | None":
        if not d:
            return None
        return cls(**cls._interval(d))

    @staticmethod
    def _interval(d: Mapping[str, Any]) -> dict[str, Any]:
        return {k: d.get(k) for k in ("estimate", "low", "high", "level", "se", "n")}

    @property
    def text(self) -> str:
        return interval_text(self)


@dataclass(frozen=True)
class DoublyRobust(Interval):
    """A per-decision doubly robust value or contrast (``queries.doubly_robust``) and its interval widened by the
    unseen mass (``bounded``); ``support``: the share of steps the logged data follows."""

    support: float | None = None
    bounded: Interval | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "DoublyRobust | None":
        if not d:
            return None
        return cls(**cls._interval(d), support=d.get("support"), bounded=Interval.from_json(part(d, "bounded")))


@dataclass(frozen=True)
class Effect(Interval):
    """A policy's simulated contrast to the reference (``queries.policy_values``), its truth on an oracle, whether
    the logs identify it (``supported`` False: not), and its doubly robust contrast."""

    reference: str | None = None
    true: float | None = None
    supported: bool | None = None
    doubly_robust: DoublyRobust | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Effect | None":
        if not d:
            return None
        return cls(**cls._interval(d), reference=d.get("reference"), true=d.get("true"), supported=d.get("supported"),
                   doubly_robust=DoublyRobust.from_json(part(d, "doubly_robust")))

    @property
    def not_identified(self) -> bool:
        return self.supported is False


@dataclass(frozen=True)
class OffPolicy(Record):
    """One off-policy estimate (``queries.off_policy``): IPW, SNIPW or per-decision DR, with its ESS."""

    value: float | None = None
    ess: float | None = None
    n_consistent: int | None = None
    warning: str | None = None
    out_of_range: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "OffPolicy | None":
        if not d:
            return None
        return cls(value=d.get("value"), ess=d.get("ess"), n_consistent=d.get("n_consistent"),
                   warning=d.get("warning"), out_of_range=d.get("out_of_range"))


@dataclass(frozen=True)
class HorizonAnswer(Interval):
    """A doubly robust value or effect over the first ``horizon`` steps (``queries.targeted``): its ESS, whether the
    logs reach the whole policy there (``reached``), whether it is identified (``supported``), the raw estimate when
    it left the outcome's range (``out_of_range``)."""

    horizon: int | None = None
    ess: float | None = None
    reached: bool | None = None
    supported: bool | None = None
    true: float | None = None
    reference: str | None = None
    out_of_range: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "HorizonAnswer | None":
        if not d:
            return None
        return cls(**cls._interval(d), horizon=d.get("horizon"), ess=d.get("ess"), reached=d.get("reached"),
                   supported=d.get("supported"), true=d.get("true"), reference=d.get("reference"),
                   out_of_range=d.get("out_of_range"))

    @property
    def same_steps(self) -> bool:
        """An effect of two policies that act alike on every step of the horizon (exactly zero, no spread)."""
        return self.se == 0 and self.estimate == 0


@dataclass(frozen=True)
class PiSource(Record):
    """Where a stochastic policy's π_k came from (``queries.pi_source``): the share of steps read from the logged
    propensities (the rest from the sites' own propensity models)."""

    logged_share: float
    steps: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "PiSource | None":
        return None if not d else cls(logged_share=d["logged_share"], steps=d["steps"])


@dataclass(frozen=True)
class IdentifiedAnswer(Record):
    """What the logs identify of a policy (``queries.targeted``): its value on the longest supported horizon
    (``answer``, None: not identified, ``why``), its effect against the reference on the longest horizon both pass,
    every horizon tried, and where its π_k came from."""

    answer: HorizonAnswer | None = None
    effect: HorizonAnswer | None = None
    horizons: tuple[HorizonAnswer, ...] = ()
    why: str | None = None
    pi_k: PiSource | None = None
    #: the declared unrecorded confounding's mark (``queries.declared``): no horizon is identified then
    not_identified: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "IdentifiedAnswer | None":
        if not d:
            return None
        return cls(answer=HorizonAnswer.from_json(part(d, "answer")),
                   effect=HorizonAnswer.from_json(part(d, "effect")),
                   horizons=tuple(HorizonAnswer.from_json(r) for r in d.get("horizons") or ()), why=d.get("why"),
                   pi_k=PiSource.from_json(part(d, "pi_k")), not_identified=d.get("not_identified"))

    @property
    def best_ess(self) -> float:
        """The largest ESS over the horizons tried (what a not-identified policy reached)."""
        return max((r.ess or 0.0 for r in self.horizons), default=0.0)

    @property
    def reached_in_part(self) -> bool:
        """Whether the logs reach only part of the policy at some horizon (the reason it is not identified)."""
        return any(r.reached is False for r in self.horizons)


@dataclass(frozen=True)
class SequentialDR(Interval):
    """A policy's sequential doubly robust value (``queries.sequential_dr``) and its support: the Kish ESS and mean of
    the weight products through the horizon, whether the rule shows the value (``supported``; False: the estimate
    is withheld and ``why`` says why)."""

    horizon: int | None = None
    ess: float | None = None
    weight_mean: float | None = None
    reached: bool | None = None
    supported: bool | None = None
    why: str | None = None
    #: the declared unrecorded confounding's mark (``queries.declared``)
    not_identified: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "SequentialDR | None":
        if not d:
            return None
        return cls(**cls._interval(d), horizon=d.get("horizon"), ess=d.get("ess"), weight_mean=d.get("weight_mean"),
                   reached=d.get("reached"), supported=d.get("supported"), why=d.get("why"),
                   not_identified=d.get("not_identified"))

    @property
    def withheld(self) -> bool:
        """The value is not shown as an answer: too little support (``why``) or a declared unrecorded confounder."""
        return self.estimate is None or self.not_identified is not None


@dataclass(frozen=True)
class PolicyAnswer(Record):
    """One policy's answer to a what-if question (``queries.policy_values`` and its parts)."""

    name: str = field(default="", metadata={"json": False})
    value_sim: float | None = None
    interval: Interval | None = None
    value_true: float | None = None
    value_error: float | None = None
    rectified: Interval | None = None
    doubly_robust: DoublyRobust | None = None
    effect: Effect | None = None
    ope: Mapping[str, OffPolicy] = field(default_factory=dict, metadata={"json": False})
    support: float | None = None
    supported: bool | None = None
    n: int | None = None
    n_sites: int | None = None
    n_sites_without_support: int | None = None
    sites_without_support: tuple[str, ...] | None = None
    never_fires: bool | None = None
    identified: IdentifiedAnswer | None = None
    sequential_dr: SequentialDR | None = None

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> "PolicyAnswer":
        return cls(
            name=name, value_sim=d.get("value_sim"), interval=Interval.from_json(part(d, "interval")),
            value_true=d.get("value_true"), value_error=d.get("value_error"),
            rectified=Interval.from_json(part(d, "rectified")),
            doubly_robust=DoublyRobust.from_json(part(d, "doubly_robust")),
            effect=Effect.from_json(part(d, "effect")),
            ope={k: OffPolicy.from_json(d[k]) for k in OPE_KEYS if part(d, k)}, support=d.get("support"),
            supported=d.get("supported"), n=d.get("n"), n_sites=d.get("n_sites"),
            n_sites_without_support=d.get("n_sites_without_support"),
            sites_without_support=_tuple(d.get("sites_without_support")), never_fires=d.get("never_fires"),
            identified=IdentifiedAnswer.from_json(part(d, "identified")),
            sequential_dr=SequentialDR.from_json(part(d, "sequential_dr")),
        )

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), **{k: v.to_json() for k, v in self.ope.items()}}

    @property
    def model_only(self) -> bool:
        """No logged step follows the policy (support 0): its value is the model's alone, not identified."""
        return self.supported is False

    @property
    def value_cell(self) -> str:
        """The simulated value, or "not identified" where no logged step follows the policy."""
        return NOT_IDENTIFIED if self.model_only else fmt(self.value_sim, ".3f")

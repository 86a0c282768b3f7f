"""The merged answer read back as typed records: what every renderer (run table, ``fcd whatif``, HTML report) reads.

The queries' merges (``queries.registry``) write the answer as one JSON object: ``summary.json`` and
``fcd whatif --json``'s ``data``. That JSON is the contract on disk and on the wire and stays as the merges write it;
this module is its one typed reading. Each record is built from its part with ``from_json`` and is tolerant of absent
parts (an older run folder, a run on data without an oracle or without logged propensities, a quick evaluation):
a part that is not there is ``None``, never a ``KeyError`` in a renderer. :meth:`Record.to_json` writes back the keys
a record reads, under their JSON names, so a test can check that the typed reading loses nothing it declares.

The texts two renderers print alike (an interval ``0.446–0.545``, the "not identified" cell, a held-out verdict, the
one-step effect's sentence) are written here, once, beside the record they describe.

The estimands are those of the modules that merge them: simulated values and their intervals
(``queries.policy_values``), the doubly robust values with unseen-mass bounds (``queries.doubly_robust``, Thomas &
Brunskill 2016, "Data-efficient off-policy policy evaluation", ICML), IPW / SNIPW / per-decision DR diagnostics
(``queries.off_policy``, Precup, Sutton & Singh 2000, "Eligibility traces for off-policy policy evaluation", ICML),
the identified horizons and the one-step effect (``queries.targeted``; AIPW, Robins, Rotnitzky & Zhao 1994,
"Estimation of regression coefficients when some regressors are not always observed", JASA), the DR-learner
(``queries.dr_learner``, Kennedy 2023, "Towards optimal doubly robust estimation of heterogeneous causal effects",
EJS), the truth-free round selection (``queries.selection``) and the coverage of the sites
(``queries.evaluation.coverage``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fcd_secure._format import MISSING
from fcd_secure.queries.policy_answers import Interval, PolicyAnswer, Record, part

__all__ = [
    "Coverage", "DRLearner", "DRLearnerFigures", "EffectSkill", "EffectSupport", "EvaluationAnswer", "HeldOutCheck",
    "HorizonBounds", "UnrecordedConfounding",
    "NaturalCourse", "OneStepEffect", "Propensities", "Selection", "WhatIfSettings",
]


@dataclass(frozen=True)
class OneStepEffect(Interval):
    """The identified one-step effect of a_on vs a_off at every decision step (``queries.targeted.OneStep``): the
    doubly robust estimate, the simulator's own contrast (``model``), the truth on an oracle."""

    model: float | None = None
    true: float | None = None
    steps: int | None = None
    entities: int | None = None
    out_of_range: Mapping[str, Any] | None = None
    #: the declared unrecorded confounding's mark (``queries.declared``): the estimate is not an answer then
    not_identified: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "OneStepEffect | None":
        if not d:
            return None
        return cls(**cls._interval(d), model=d.get("model"), true=d.get("true"), steps=d.get("steps"),
                   entities=d.get("entities"), out_of_range=d.get("out_of_range"),
                   not_identified=d.get("not_identified"))

    def sentence(self, interval_word: str) -> str:
        """``-0.088 (90% <interval_word> -0.116 to -0.060; 20379 steps of 900 entities); the simulator alone says
        -0.007; truth -0.082``: the estimate as the run table, ``fcd whatif`` and the HTML report state it."""
        text = (f"{self.estimate:+.3f} ({self.level:.0%} {interval_word} {self.low:+.3f} to {self.high:+.3f}; "
                f"{self.steps} steps of {self.entities} entities); the simulator alone says {self.model:+.3f}")
        return text + (f"; truth {self.true:+.3f}" if self.true is not None else "")


@dataclass(frozen=True)
class UnrecordedConfounding(Record):
    """The unrecorded confounding the user declared (``queries.declared``): the words, where they were declared, the
    mark every weighted answer carries and what is shown instead."""

    declared: str = ""
    by: str = ""
    not_identified: str = ""
    shown: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "UnrecordedConfounding | None":
        if not d:
            return None
        return cls(declared=d.get("declared", ""), by=d.get("by", ""), not_identified=d.get("not_identified", ""),
                   shown=d.get("shown", ""))

    def line(self) -> str:
        """What the weighted answers are, as every renderer says it."""
        return (f"what the logs would identify: {self.not_identified}, declared by {self.by}; they rest on no "
                f"unrecorded confounder, so nothing is ranked; shown instead: {self.shown}")


#: ``answer["propensities"]["model"]`` where the sites' estimates are the consortium's shared behaviour model
#: (``evaluation.behaviour_model = "shared"``), and how every renderer names that source
SHARED_MODEL, SHARED_SOURCE = "shared", "estimated (one shared model, secure sums)"
#: the same for shared slopes with each site's own intercepts (``evaluation.behaviour_model = "shared_slopes"``)
SHARED_SLOPES_MODEL = "shared_slopes"
SHARED_SLOPES_SOURCE = "estimated (shared slopes by secure sums, each site's own intercepts)"
#: every ``answer["propensities"]["model"]`` (the run's ``evaluation.behaviour_model`` where it is shared) and its
#: source's words; a model not here is the sites' own
SHARED_SOURCES = {SHARED_MODEL: SHARED_SOURCE, SHARED_SLOPES_MODEL: SHARED_SLOPES_SOURCE}

def horizon_phrase(horizon: int | None) -> str:
    """A question's horizon as every headline says it: ``whole trajectories`` or ``the first h steps``."""
    return "whole trajectories" if horizon is None else f"the first {horizon} steps"


#: the three kinds of answer (``queries.kinds``, which decides them; here because the typed answer reads them back)
CHECKED, G_COMPUTATION, EXTRAPOLATION = "checked by weighting", "g-computation by the simulator", "extrapolation"
#: a g-computation ranking's '>' needs the pair's simulated difference above this many times the natural course's mean
#: |gap| (:meth:`EvaluationAnswer.simulated_ranking`). Not tuned: that gap bounds the simulator's value error under the
#: logging policy (the value is a mean over steps, so its error is at most the mean of the per-step |gaps|), and the
#: difference of two values can be off by the sum of their two errors. Chosen by a rule fixed before fresh runs
#: (docs/benchmarks.md, "A ranking that says what the simulator's own error allows").
RANK_MARGIN_NC = 2.0
#: the title of the simulator's whole-trajectory numbers wherever they are printed, by their kind: never a bare table
#: (``{horizon}``: the horizon the question asked, :attr:`EvaluationAnswer.horizon_text`)
SIMULATOR_TITLES = {
    EXTRAPOLATION: "Extrapolation: the simulator over {horizon}, beyond what the logs identify; not ranked",
    G_COMPUTATION: "G-computation by the simulator: {horizon}, checked without the truth by the natural course",
}


@dataclass(frozen=True)
class Propensities(Record):
    """Where the weighted answers' propensities came from (``queries.propensities.PropensitySource``): per-site counts
    of logged / estimated / none, the share of test steps below the floor, the sites' models' calibration error, and
    the assumptions every weighted answer rests on."""

    source: str = "none"
    sites: Mapping[str, int] = field(default_factory=dict)
    floor: float | None = None
    below_floor_share: float | None = None
    calibration_error: float | None = None
    assumptions: tuple[str, ...] = ()
    #: the sites without propensities and why (their hello; ``apps.server_loop.name_sites_without_propensities``)
    missing_at: Mapping[str, str] | None = None
    #: a key of :data:`SHARED_SOURCES` where the estimating sites used the consortium's shared behaviour model, else
    #: None
    model: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Propensities | None":
        if not d:
            return None
        return cls(source=d.get("source", "none"), sites=dict(d.get("sites") or {}), floor=d.get("floor"),
                   below_floor_share=d.get("below_floor_share"), calibration_error=d.get("calibration_error"),
                   assumptions=tuple(d.get("assumptions") or ()), missing_at=dict(d["missing_at"]) if d.get("missing_at") is not None else None,
                   model=d.get("model"))

    def line(self) -> str:
        """``propensities: logged at 4 of 4 sites; ...``: what the weighted answers stand on, as every renderer says
        it."""
        total = sum(self.sites.values())
        estimated = SHARED_SOURCES.get(self.model or "", "estimated by the sites' own models")
        parts = [f"{word} at {self.sites[key]} of {total} sites" for key, word in
                 (("logged", "logged"), ("estimated", estimated), ("none", "none"))
                 if self.sites.get(key)]
        text = "propensities: " + "; ".join(parts)
        if self.calibration_error is not None:
            text += f" (calibration error {self.calibration_error:.3f})"
        if self.below_floor_share is not None and self.floor is not None:
            text += f"; {self.below_floor_share:.0%} of test steps below {self.floor:g}"
        if self.missing_at:
            text += "; without propensities: " + ", ".join(f"{site} ({why})" for site, why in self.missing_at.items())
        if self.assumptions:
            text += "; the weighted answers assume " + ", ".join(self.assumptions)
        return text


@dataclass(frozen=True)
class Sensitivity(Record):
    """The one-step effect's bounds under the marginal sensitivity model (``queries.sensitivity``): per Γ the bounds
    and their interval, the smallest Γ that could reverse the sign."""

    estimand: str = ""
    model: str = ""
    bounds: tuple[Mapping[str, float], ...] = ()
    sign_at_1: int = 0
    gamma_sign_change: float | None = None
    gamma_max: float = 10.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Sensitivity | None":
        if not d:
            return None
        return cls(estimand=d.get("estimand", ""), model=d.get("model", ""), bounds=tuple(d.get("bounds") or ()),
                   sign_at_1=int(d.get("sign_at_1", 0)), gamma_sign_change=d.get("gamma_sign_change"),
                   gamma_max=float(d.get("gamma_max", 10.0)))

    def verdict(self) -> str:
        """``the sign holds up to Γ = 1.75`` (or why not), as every renderer says it."""
        if self.sign_at_1 == 0:
            return "its interval already contains 0 at Γ = 1 (no unrecorded confounder needed to reverse it)"
        if self.gamma_sign_change is None:
            return f"no unrecorded confounder up to Γ = {self.gamma_max:g} could reverse its sign"
        return (f"an unrecorded confounder of strength Γ = {self.gamma_sign_change:g} could reverse its sign "
                "(its bounds' interval then contains 0)")

    def lines(self) -> list[str]:
        """One line per reported Γ: ``Γ = 1.5: −0.041 to +0.012 (90 % −0.060 to +0.031)``."""
        return [f"Γ = {b['gamma']:g}: {b['low']:+.3f} to {b['high']:+.3f} (with sampling error {b['low_ci']:+.3f} to "
                f"{b['high_ci']:+.3f})" + ("  ← no unrecorded confounder" if b["gamma"] == 1 else "")
                for b in self.bounds]


def _gamma_cell(b: Mapping[str, Any]) -> str:
    """``0.412–0.655``: the bounds with their sampling error at one Γ (``unbounded``: the weights overflowed)."""
    return "unbounded" if b.get("unbounded") else f"{b['low_ci']:.3f}–{b['high_ci']:.3f}"


def _tuple_or_none(v: Any) -> tuple | None:
    return None if v is None else tuple(v)


@dataclass(frozen=True)
class HorizonBounds(Record):
    """The policy values' and effects' bounds at the horizon asked under the marginal sensitivity model at every step
    (``queries.sensitivity.HorizonSensitivity``): per policy and per effect the bounds at each reported Γ, each
    effect's smallest Γ that could reverse its sign, the ranking at Γ = 1 and the smallest Γ that could change it."""

    estimand: str = ""
    model: str = ""
    level: float = 0.9
    horizon: int | None = None
    values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    effects: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    ranking: tuple[str, ...] = ()
    ranking_tied_at_1: bool = False
    #: the policies whose values are withheld (too little support): no ranking then
    ranking_withheld: tuple[str, ...] | None = None
    gamma_ranking_change: float | None = None
    gamma_max: float = 10.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "HorizonBounds | None":
        if not d:
            return None
        return cls(estimand=d.get("estimand", ""), model=d.get("model", ""), level=d.get("level", 0.9),
                   horizon=d.get("horizon"), values=dict(d.get("values") or {}), effects=dict(d.get("effects") or {}),
                   ranking=tuple(d.get("ranking") or ()), ranking_tied_at_1=bool(d.get("ranking_tied_at_1", False)),
                   ranking_withheld=_tuple_or_none(d.get("ranking_withheld")),
                   gamma_ranking_change=d.get("gamma_ranking_change"), gamma_max=float(d.get("gamma_max", 10.0)))

    @property
    def horizon_text(self) -> str:
        return horizon_phrase(self.horizon)

    def ranking_verdict(self) -> str:
        """``the ranking a > b > c holds up to Γ < 1.5`` (or why not), as every renderer says it."""
        if self.ranking_withheld:
            return (f"no ranking: the values of {', '.join(self.ranking_withheld)} are withheld (too few logged "
                    "entities follow them through the horizon)")
        order = " > ".join(self.ranking)
        if self.ranking_tied_at_1:
            return f"the ranking {order} is not settled even at Γ = 1 (two policies' intervals meet)"
        if self.gamma_ranking_change is None:
            return f"the ranking {order} holds for every Γ up to {self.gamma_max:g}"
        return f"the ranking {order} could change at Γ = {self.gamma_ranking_change:g}"

    def effect_verdict(self, name: str) -> str:
        """The smallest Γ that could reverse the sign of ``name``'s effect against the reference."""
        e = self.effects.get(name) or {}
        if e.get("withheld"):
            return "withheld: " + e["withheld"]
        if e.get("sign_at_1", 0) == 0:
            return "sign open at Γ = 1"
        flip = e.get("gamma_sign_change")
        return f"sign holds for every Γ up to {self.gamma_max:g}" if flip is None else f"sign could reverse at Γ = {flip:g}"

    @property
    def gammas(self) -> list[float]:
        """The reported Γ values, in order."""
        first = next((v for v in self.values.values() if v.get("bounds")), {})
        return [b["gamma"] for b in first.get("bounds", ())]

    def rows(self) -> list[tuple[str, list[str], str]]:
        """One row per value and per effect: its label, its bounds' cell at each reported Γ ("withheld" where the
        value is), its verdict."""
        def cells(d: Mapping[str, Any]) -> list[str]:
            return ["withheld"] * len(self.gammas) if d.get("withheld") else [_gamma_cell(b) for b in d.get("bounds", ())]

        out = [(f"value {name}", cells(v), "") for name, v in self.values.items()]
        for name, e in self.effects.items():
            out.append((f"{name} − {e.get('reference')}", cells(e), self.effect_verdict(name)))
        return out

    def lines(self) -> list[str]:
        """The rows as lines: ``value never: Γ = 1: 0.487–0.574; Γ = 1.25: ...``, then the ranking's verdict."""
        out = [f"{label}: " + "; ".join(f"Γ = {g:g}: {c}" for g, c in zip(self.gammas, cells))
               + (f" ({verdict})" if verdict else "") for label, cells, verdict in self.rows()]
        return out + [f"ranking over {self.horizon_text}: {self.ranking_verdict()}"]


@dataclass(frozen=True)
class HeldOutCheck(Record):
    """The DR-learner's truth-free held-out check (``queries.dr_learner.heldout_check``): the gain in squared error
    per step over one constant, its z (gain / SE), the verdict, the steps it covers."""

    gain: float | None = None
    se: float | None = None
    z: float | None = None
    verdict: str | None = None
    steps: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "HeldOutCheck | None":
        if not d:
            return None
        return cls(gain=d.get("gain"), se=d.get("se"), z=d.get("z"), verdict=d.get("verdict"), steps=d.get("steps"))

    def cell(self, steps: int | None) -> str:
        """``-0.0064 (z -2.3): worse``, "(partial)" where it covers fewer than ``steps`` steps (sites without logged
        propensities send no check sums), or "unavailable"."""
        if self.verdict == "unavailable" or self.z is None or not math.isfinite(self.z):
            return "unavailable"
        short = {"worse than the constant": "worse"}.get(self.verdict or "", self.verdict)
        part = " (partial)" if steps and (self.steps if self.steps is not None else steps) < steps else ""
        return f"{self.gain:+.4f} (z {self.z:+.1f}): {short}{part}"  # z, not ± SE: the verdict is one-sided


@dataclass(frozen=True)
class DRLearnerFigures(Record):
    """One set of per-entity effects (the DR-learner's, or the simulator's own contrast) against the oracle's truth,
    or its mean where there is no truth, with its held-out check."""

    corr: float | None = None
    skill: float | None = None
    pehe: float | None = None
    sd_tau: float | None = None
    mean_tau_hat: float | None = None
    heldout: HeldOutCheck | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "DRLearnerFigures | None":
        if not d:
            return None
        return cls(corr=d.get("corr"), skill=d.get("skill"), pehe=d.get("pehe"), sd_tau=d.get("sd_tau"),
                   mean_tau_hat=d.get("mean_tau_hat"), heldout=HeldOutCheck.from_json(part(d, "heldout")))

    @property
    def has_truth(self) -> bool:
        return self.corr is not None or self.skill is not None


@dataclass(frozen=True)
class DRLearner(Record):
    """The federated DR-learner's per-entity one-step effects (``queries.dr_learner``): whether β was fitted
    (``fitted``, from ``beta``), the share of sites it covers, the test steps, its figures beside the simulator's."""

    fitted: bool = field(default=False, metadata={"json": False})
    coverage: str | None = None
    steps: int | None = None
    dr_learner: DRLearnerFigures | None = None
    simulator: DRLearnerFigures | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "DRLearner | None":
        if not d:
            return None
        return cls(fitted=d.get("beta") is not None, coverage=d.get("coverage"), steps=d.get("steps"),
                   dr_learner=DRLearnerFigures.from_json(part(d, "dr_learner")),
                   simulator=DRLearnerFigures.from_json(part(d, "simulator")))


@dataclass(frozen=True)
class EffectSkill(Record):
    """The skill figures beside PEHE (``evaluation.metrics.EffectStats.skill_figures``): the zero-effect PEHE₀, the
    constant-effect floor sd τ, corr(τ̂, τ), the ATE ratio, the skill against the constant true ATE, flags."""

    pehe_zero: float | None = None
    sd_tau: float | None = None
    corr: float | None = None
    ate_ratio: float | None = None
    skill: float | None = None
    flags: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "EffectSkill | None":
        if not d:
            return None
        return cls(pehe_zero=d.get("pehe_zero"), sd_tau=d.get("sd_tau"), corr=d.get("corr"),
                   ate_ratio=d.get("ate_ratio"), skill=d.get("skill"), flags=tuple(d.get("flags") or ()))


@dataclass(frozen=True)
class EffectSupport(Record):
    """How many entities followed each anchor regime (``queries.effects``): the paper's PEHE and ATE error are
    extrapolation where the logs barely follow them."""

    a_off: int
    a_on: int
    n: int
    label: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "EffectSupport | None":
        return None if not d else cls(a_off=d["a_off"], a_on=d["a_on"], n=d["n"], label=d["label"])

    @property
    def extrapolation(self) -> bool:
        return self.label == "extrapolation"


@dataclass(frozen=True)
class LateRounds(Record):
    """The run's policies' simulated values in each scored round of its second half, on the sites' validation rows
    (``queries.round_values``): what a ranking's ``>`` must agree with. ``horizon``: the run's ``[evaluation]
    horizon`` they were simulated at (None: whole trajectories); ``rounds``: round (a string) → policy → value."""

    horizon: int | None = None
    rows: str | None = None
    rounds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "LateRounds | None":
        if not d or not d.get("rounds"):
            return None
        return cls(horizon=d.get("horizon"), rows=d.get("rows"),
                   rounds={str(k): dict(v) for k, v in d["rounds"].items()})

    def agree(self, hi: str, lo: str) -> bool | None:
        """Whether every late round that valued both policies puts ``hi`` above ``lo``; None where none valued both."""
        pairs = [(v[hi], v[lo]) for v in self.rounds.values()
                 if isinstance(v.get(hi), (int, float)) and isinstance(v.get(lo), (int, float))
                 and math.isfinite(v[hi]) and math.isfinite(v[lo])]
        return None if not pairs else all(a > b for a, b in pairs)

    def names(self) -> str:
        """``rounds 20, 25, 30`` as the ranking line names them."""
        return "rounds " + ", ".join(sorted(self.rounds, key=int))


@dataclass(frozen=True)
class Selection(Record):
    """The round the answers come from (``queries.selection``): the round, the rule, its criterion's coverage of the
    sites, the reason in words."""

    round: int | None = None
    rule: str | None = None
    coverage: str | None = None
    reason: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Selection | None":
        if not d:
            return None
        return cls(round=d.get("round"), rule=d.get("rule"), coverage=d.get("coverage"), reason=d.get("reason"))


@dataclass(frozen=True)
class NaturalCourse(Record):
    """The simulator under the logging policy against the logs (``queries.natural_course``): the largest per-step
    |z| of the outcome gap and its Bonferroni critical value, the chi-square over the steps, the mean absolute gap,
    which rows (``validation`` in a scored round, ``test`` in the full evaluation) and on how many sites."""

    max_abs_z: float | None = None
    z_crit: float | None = None
    chi2: float | None = None
    df: int | None = None
    p_value: float | None = None
    mean_abs_gap: float | None = None
    n_steps: int | None = None
    passes: bool | None = None
    rows: str | None = None
    sites: int | None = None
    sites_of: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "NaturalCourse | None":
        if not d:
            return None
        return cls(**{f: d.get(f) for f in ("max_abs_z", "z_crit", "chi2", "df", "p_value", "mean_abs_gap", "n_steps",
                                             "passes", "rows", "sites", "sites_of")})

    def cell(self) -> str:
        """``gap 0.044, max |z| 1.35 (crit 2.61), χ² 7.0/11: consistent (test rows, 4 of 4 sites)``."""
        if self.mean_abs_gap is None:
            return MISSING
        text = f"gap {self.mean_abs_gap:.3f}"
        if self.max_abs_z is not None:
            text += (f", max |z| {self.max_abs_z:.2f} (crit {self.z_crit:.2f}), χ² {self.chi2:.1f}/{self.df}: "
                     + ("consistent" if self.passes else "MISFIT"))
        return text + f" ({self.rows} rows, {self.sites} of {self.sites_of} sites)"

    def short(self) -> str:
        """``0.044, 1.35 (crit 2.61): consistent``: the run table's cell (the whole sentence is :meth:`cell`)."""
        if self.mean_abs_gap is None:
            return MISSING
        if self.max_abs_z is None:
            return f"{self.mean_abs_gap:.3f}"
        return (f"{self.mean_abs_gap:.3f}, {self.max_abs_z:.1f} (crit {self.z_crit:.1f}): "
                + ("consistent" if self.passes else "MISFIT"))


@dataclass(frozen=True)
class Coverage(Record):
    """Which sites the answers cover (``queries.evaluation.coverage``), and the warning naming those left out."""

    sites_asked: tuple[str, ...] = ()
    sites_covered: tuple[str, ...] = ()
    n_sites_covered: int | None = None
    n_entities: int | None = None
    declined: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    complete: bool | None = None
    warning: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Coverage | None":
        if not d:
            return None
        return cls(sites_asked=tuple(d.get("sites_asked") or ()), sites_covered=tuple(d.get("sites_covered") or ()),
                   n_sites_covered=d.get("n_sites_covered"), n_entities=d.get("n_entities"),
                   declined=tuple(d.get("declined") or ()), failed=tuple(d.get("failed") or ()),
                   complete=d.get("complete"), warning=d.get("warning"))


@dataclass(frozen=True)
class WhatIfSettings(Record):
    """The question's settings as the answer echoes them: the level of its intervals, the reference policy, the
    horizon."""

    level: float = 0.9
    reference: str | None = None
    horizon: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "WhatIfSettings":
        d = d or {}
        return cls(level=d.get("level", 0.9), reference=d.get("reference"), horizon=d.get("horizon"))


@dataclass(frozen=True)
class EvaluationAnswer(Record):
    """The merged answer of an evaluation (``queries.registry.merge``): the oracle's effect figures, the factual AUC,
    the one-step effect, the DR-learner, each policy's answer, the round selection, the coverage."""

    pehe: float | None = None
    ate_error: float | None = None
    value_error_mean: float | None = None
    factual_auc: float | None = None
    effect_skill: EffectSkill | None = None
    effect_support: EffectSupport | None = None
    one_step: OneStepEffect | None = field(default=None, metadata={"key": "one_step_effect"})
    sensitivity: Sensitivity | None = None
    #: the bounds of the values and effects at the horizon asked (``queries.sensitivity.HorizonSensitivity``)
    sensitivity_horizon: HorizonBounds | None = None
    #: what kind each answer is and what it rests on (``queries.kinds``)
    kinds: Mapping[str, Mapping[str, Any]] | None = None
    dr_learner: DRLearner | None = None
    policies: Mapping[str, PolicyAnswer] = field(default_factory=dict)
    whatif: WhatIfSettings = field(default_factory=WhatIfSettings)
    selection: Selection | None = None
    coverage: Coverage | None = None
    propensities: Propensities | None = None
    model_only: bool = False
    natural_course: NaturalCourse | None = None
    unrecorded_confounding: UnrecordedConfounding | None = None
    #: the late rounds' values of the run's policies (``queries.round_values``), where the run scored rounds
    late_rounds: LateRounds | None = field(default=None, metadata={"key": "round_values"})

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "EvaluationAnswer":
        d = d or {}
        return cls(
            pehe=d.get("pehe"), ate_error=d.get("ate_error"), value_error_mean=d.get("value_error_mean"),
            factual_auc=d.get("factual_auc"), effect_skill=EffectSkill.from_json(part(d, "effect_skill")),
            effect_support=EffectSupport.from_json(part(d, "effect_support")),
            one_step=OneStepEffect.from_json(part(d, "one_step_effect")),
            sensitivity=Sensitivity.from_json(part(d, "sensitivity")),
            sensitivity_horizon=HorizonBounds.from_json(part(d, "sensitivity_horizon")),
            kinds=d.get("kinds"),
            dr_learner=DRLearner.from_json(part(d, "dr_learner")),
            policies={k: PolicyAnswer.from_json(k, v) for k, v in (d.get("policies") or {}).items()},
            whatif=WhatIfSettings.from_json(part(d, "whatif")), selection=Selection.from_json(part(d, "selection")),
            coverage=Coverage.from_json(part(d, "coverage")),
            propensities=Propensities.from_json(part(d, "propensities")),
            model_only=bool(d.get("model_only", False)),
            natural_course=NaturalCourse.from_json(part(d, "natural_course")),
            unrecorded_confounding=UnrecordedConfounding.from_json(part(d, "unrecorded_confounding")),
            late_rounds=LateRounds.from_json(part(d, "round_values")),
        )

    @classmethod
    def of(cls, answer: "EvaluationAnswer | Mapping[str, Any] | None") -> "EvaluationAnswer":
        """The typed answer, whether given typed or as the merged JSON."""
        return answer if isinstance(answer, EvaluationAnswer) else cls.from_json(answer)

    @property
    def level(self) -> float:
        return self.whatif.level

    @property
    def reference(self) -> str | None:
        return self.whatif.reference

    def kind_lines(self) -> list[str]:
        """One line per kind of answer (``queries.kinds``): ``checked by weighting — rests on ...; propensities ...``."""
        out = []
        for kind, d in (self.kinds or {}).items():
            parts = ([d["identified"]] if d.get("identified") else []) + [
                "rests on " + ", ".join(d.get("assumptions", ()))]
            for key, word in (("propensities", "propensities"), ("positivity", "positivity measured"),
                              ("unrecorded_confounding", "unrecorded confounding"), ("checked_by", "checked by"),
                              ("shown", "shown instead")):
                if d.get(key):
                    parts.append(f"{word}: {d[key]}")
            if d.get("ranked") is False:
                parts.append("never ranked")
            elif d.get("ranked") is True:
                parts.append("ranked at the horizon asked where the logs follow every policy at some step")
            out.append(f"{kind} — " + "; ".join(parts))
        return out

    @property
    def simulator_kind(self) -> str:
        """The kind of the simulator's whole-trajectory numbers (``queries.kinds``): g-computation where it decided so
        (natural course consistent with the logs, the sites' propensities, no unrecorded confounder declared), else
        extrapolation."""
        kinds = self.kinds or {}
        return G_COMPUTATION if G_COMPUTATION in kinds and EXTRAPOLATION not in kinds else EXTRAPOLATION

    @property
    def horizon_text(self) -> str:
        """The horizon the simulator's values average over, as every headline says it."""
        return horizon_phrase(self.whatif.horizon)

    @property
    def simulator_title(self) -> str:
        """The title of the simulator's table, by :attr:`simulator_kind`, with its horizon."""
        return SIMULATOR_TITLES[self.simulator_kind].format(horizon=self.horizon_text)

    def simulated_ranking_line(self) -> str | None:
        """The ranking's sentence as every renderer prints it, or why there is none; None where the numbers are
        extrapolation (nothing to say: the title says "not ranked")."""
        if self.simulator_kind != G_COMPUTATION:
            return None
        ranking = self.simulated_ranking()
        if ranking is not None:
            late = self.checked_rounds
            rounds = ""
            if late is not None:
                valued = {p for v in late.rounds.values() for p in v}
                unchecked = [p for p in self.policies if p not in valued]
                rounds = (f", and {late.names()} order it alike on the {late.rows or 'validation'} rows"
                          + (f" ({', '.join(unchecked)}: not valued there, not checked)" if unchecked else ""))
            return (f"ranking over {self.horizon_text} (g-computation; highest value first; '>' where the pair is "
                    f"apart by its interval and by more than {RANK_MARGIN_NC:g}× the natural course's mean |gap| "
                    f"{self.rank_margin / RANK_MARGIN_NC:.3f}{rounds}; '≈' where it is not): {ranking}")
        unseen = [name for name, p in self.policies.items() if p.model_only]
        return (f"no ranking over {self.horizon_text}: " + (
            f"no logged step follows {', '.join(unseen)}, so its value is not identified" if unseen
            else "a policy has no simulated value"))

    @property
    def checked_rounds(self) -> LateRounds | None:
        """The late rounds a ranking's pairs are checked against (:meth:`simulated_ranking`): the run's, where they
        were simulated at the horizon this answer asks; None elsewhere (a question at another horizon, a run that
        scored no round)."""
        late = self.late_rounds
        return late if late is not None and late.horizon == self.whatif.horizon else None

    @property
    def rank_margin(self) -> float:
        """The least simulated difference a ranking's '>' needs: :data:`RANK_MARGIN_NC` × the natural course's mean
        |gap| (infinite where the answer has none or it is not finite: then no pair is apart)."""
        gap = self.natural_course.mean_abs_gap if self.natural_course is not None else None
        if gap is None or not math.isfinite(float(gap)):
            return math.inf  # no measured error: no pair is apart (and the answer is not g-computation anyway)
        return RANK_MARGIN_NC * float(gap)

    def simulated_ranking(self) -> str | None:
        """The policies ordered by the simulator's value, highest first, where those values are g-computation (never
        where they are extrapolation: issue 42 item 4): ``a 0.85 > b 0.81 ≈ c 0.80``. ``>`` where the pair is
        apart on both counts, ``≈`` otherwise:

        * sampling: for a pair with the reference, the other's effect interval (the paired contrast) excludes 0; for
          any other pair, the two values' intervals over entities are disjoint (no paired contrast is computed, and
          disjoint marginal intervals are the conservative test);
        * the simulator's own error, which those intervals omit: the difference exceeds :attr:`rank_margin`, twice
          the natural course's mean |gap| (:data:`RANK_MARGIN_NC`). Without it 9 of 111 '>' over 45 answers on issue
          42's worlds ordered a pair against the truth, all on carry-over; with it 2 of 91 (docs/benchmarks.md);
        * the round that was picked: where the run scored rounds (:attr:`checked_rounds`, ``queries.round_values``),
          every round of its second half orders the pair the same way on the validation rows.

        None where the numbers are extrapolation, a value is missing, or the logs never follow some policy (its value
        is not identified)."""
        pols = list(self.policies.items())
        if self.simulator_kind != G_COMPUTATION or len(pols) < 2 or any(
                p.value_sim is None or p.model_only for _, p in pols):
            return None
        pols.sort(key=lambda kv: -kv[1].value_sim)
        ref = self.reference
        late = self.checked_rounds

        def apart(hi: tuple[str, PolicyAnswer], lo: tuple[str, PolicyAnswer]) -> bool:
            (hn, h), (ln, low) = hi, lo
            e = h.effect if ln == ref else low.effect if hn == ref else None
            if h.value_sim - low.value_sim <= self.rank_margin:
                return False
            if late is not None and late.agree(hn, ln) is False:
                return False
            if e is not None and e.low is not None and e.high is not None:
                return e.low > 0 if ln == ref else e.high < 0
            return (h.interval is not None and low.interval is not None and h.interval.low is not None
                    and low.interval.high is not None and low.interval.high < h.interval.low)

        text = f"{pols[0][0]} {pols[0][1].value_sim:.3f}"
        for a, b in zip(pols, pols[1:]):
            text += (" > " if apart(a, b) else " ≈ ") + f"{b[0]} {b[1].value_sim:.3f}"
        return text

    @property
    def horizon_asked(self) -> int | None:
        """The horizon the question asked (the identified answers' longest horizon tried: the whole trajectory unless
        the question set one), or None without identified answers."""
        return max((r.horizon for p in self.identified.values() for r in p.identified.horizons
                    if r.horizon is not None), default=None)

    @property
    def ranked_at_asked(self) -> bool:
        """Whether the identified values may be ranked: every policy is answered at the horizon asked (a ranking is
        printed only there; issue 42 item 4)."""
        asked = self.horizon_asked
        answers = [p.identified.answer for p in self.identified.values()]
        return self.unrecorded_confounding is None and asked is not None and bool(answers) and all(a is not None and a.horizon == asked for a in answers)

    def horizon_caption(self) -> str:
        """Whether the identified table answers the question at its horizon, as every renderer says it."""
        asked = self.horizon_asked
        if self.unrecorded_confounding is not None:
            return f"{self.unrecorded_confounding.not_identified}: no policy is ranked on these numbers"
        if self.ranked_at_asked:
            return f"every policy answered at the horizon asked (h = {asked}): these values can be ranked"
        return (f"h below {asked} is a shorter question than the one asked (the first h of {asked} steps): not a "
                f"ranking at the horizon asked; policies are ranked only where every one is answered at h = {asked}")

    @property
    def identified(self) -> dict[str, PolicyAnswer]:
        """The policies with an identified part (sites that log propensities), in the answer's order."""
        return {k: p for k, p in self.policies.items() if p.identified is not None}

    @property
    def doubly_robust(self) -> dict[str, PolicyAnswer]:
        """The policies with a doubly robust value, in the answer's order."""
        return {k: p for k, p in self.policies.items() if p.doubly_robust is not None}

"""Truth-free federated model selection: which evaluated round's model the run answers with.

On confounded logs the model that fits best is the most confounded (measured on DKT-Synth: corr 0.85 between the
factual AUC and the ATE bias), so a round is never chosen by fit alone. Every evaluated round each site scores the
model on its **validation rows** (``SiteData.validation``: a share of its training split, never trained on) with

* the one-step doubly robust discrepancy D₁ (``evaluation.discrepancy``): the AIPW correction of the model's one-step
  contrast of the anchor actions with the site's logged propensities, whose mean is, without any truth, the model's
  one-step effect error (Robins, Rotnitzky & Zhao 1994; the "learned confounding" alarm of the run table);
* the validation fit: the mean factual log-loss (binary outcomes) or squared error (continuous), the tie-breaker;
* over :data:`DH_HORIZON` steps, the same correction of the model's contrast of the anchor regimes from t = 0, D_h
  (``evaluation.discrepancy.horizon_dr_terms``), with its support check: the smaller per-arm effective sample size of
  the weight products. D_h takes part in the rule only where every scored round's is supported (ESS ≥
  ``queries.targeted.MIN_SUPPORT_ESS``); on logs that rarely repeat an action (DKT-Synth: a two-step regime has a few
  followers) it is printed as unsupported and left out.

A site sends only additive sums (``select.*``, :data:`KEYS`) in its evaluation reply, so they take the evaluation's
transport (secure aggregation in secure mode): never a per-step term, a prediction or a propensity. A site that logs
no propensities, or whose validation rows are fewer than its evaluation cohort floor, sends n = 0 and counts in
``select.sites`` as not scoring; the criterion is then *partial* (some sites) or *unavailable* (none).

**Paired differences.** Every candidate is scored on the same validation steps, so most of ψ's noise (the outcome
over the propensity) is common to all of them: the standard error of the *difference* of two rounds' D₁ is far
smaller than either round's own SE (measured about 10× on the glucose world of issue 42). A site therefore keeps each
scored round's per-step terms ψ on its own disk (:class:`KeptTerms`, never sent) and, in every scored round r, adds
the sums of ψ_r − ψ_k over its validation steps for each earlier kept round k (``select.pair.n|s|ss``, lists indexed
by round, :data:`PAIR_CAP` rounds): the server reads the paired SE of any two rounds without any per-step value.

The rule (:func:`choose_round`, stated in ``summary.json``): first, where some evaluated round's whole-horizon
natural course (``queries.natural_course``, on the same validation rows) passed, the rounds whose check failed are
left out — a model that fails the parametric g-formula's standard validation is not answered with when one that
passes exists (Taubman et al. 2009; McGrath et al. 2020); where every checked round failed, none is left out and the
reason says so. Then the candidates are the evaluated rounds whose D₁ is
within one standard error **of the paired difference** from the smallest D₁ (the one-SE rule of Breiman et al. 1984,
applied to a discrepancy instead of a prediction error; the marginal SE where a pair was not kept, and the output
says so) — and, where D_h is supported in every scored round, whose D_h is within one SE of the smallest D_h too
(when no round is within both, D₁'s candidates, and the output says so). Among them, the truth-free criterion
decides, **never the validation fit** (on confounded logs the best fit is the most confounded): the smaller
whole-horizon natural-course gap where every candidate has one, else the smaller supported D_h, else the smaller D₁;
exact ties go to the later round. With no D₁ anywhere, the last round, and the output says why. Every site then
answers with its own Θs of the chosen round (kept on the site, :class:`KeptParams`).
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure._io import atomic_write_bytes, npz_bytes
from fcd_secure.evaluation.discrepancy import (
    DEFAULT_CLIP,
    DiscrepancySums,
    HorizonDiscrepancySums,
    horizon_dr_terms,
    one_step_dr_terms,
)
from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.cohort import entity_count

#: the horizon of the multi-step discrepancy D_h (module docstring)
DH_HORIZON = 2
#: simulated futures per validation entity for D_h's outcome model (its mean is the model's expected outcome)
DH_SAMPLES = 4
#: the sums of D_h (``select.dh.<field>``, fields of ``evaluation.discrepancy.HorizonDiscrepancySums``)
DH_FIELDS = ("n", "s", "ss", "clipped", "sw_on", "sww_on", "sw_off", "sww_off")
#: the keys a site adds to its evaluation sums
KEYS = ("select.d1.n", "select.d1.s", "select.d1.ss", "select.d1.clipped", "select.fit.n", "select.fit.s",
        "select.sites") + tuple(f"select.dh.{f}" for f in DH_FIELDS)
#: an alarm when a round's D₁ is this many standard errors away from zero
ALARM_SE = 3.0
#: rounds whose paired D₁ sums a site keeps (``select.pair.*`` are lists indexed by round number, round < this)
PAIR_CAP = 128
#: the paired sums (module docstring): steps, Σ(ψ_r − ψ_k), Σ(ψ_r − ψ_k)² for every earlier kept round k
PAIR_LISTS = ("select.pair.n", "select.pair.s", "select.pair.ss")


def restored_round(selection: dict[str, Any] | None, rounds: int) -> int | None:
    """The round whose Θs the sites restore to answer (``EvaluationRequest.restore_round``): the selected round, or
    None where the answers come from the last round's parameters (the last round chosen, or ``select = "last"``)."""
    if not selection or selection.get("rule") == "last" or int(selection["round"]) == int(rounds):
        return None
    return int(selection["round"])


def validation_pair(ctx: SiteContext) -> tuple[np.ndarray, np.ndarray] | None:
    """The model's one-step predictions on the site's validation rows, computed once for the selection's D₁ and the
    DR-learner's fit (``queries.dr_learner``); None where the site cannot score them."""
    from fcd_secure.queries.targeted import one_step_pair  # noqa: PLC0415

    def make():
        val = ctx.data.validation
        scored = val is not None and val.P is not None and entity_count(val) >= ctx.floor
        return one_step_pair(ctx.model, val, ctx.data.anchors) if scored else None

    return ctx.once("validation.pair", make)


class Selection(Query):
    """The truth-free selection sums of a scored round (module docstring): ``select.*``."""

    name = "select"
    quick = True

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return list(KEYS)

    def lists(self) -> dict[str, int]:
        return dict.fromkeys(PAIR_LISTS, PAIR_CAP)

    def applies(self, ctx: SiteContext) -> bool:
        return ctx.request.keep_round is not None

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        # D_h's simulated futures take the run's seed: common random numbers across rounds
        kept = None if ctx.site_dir is None else KeptTerms(ctx.site_dir / "selection_terms")
        return site_selection_sums(ctx.model, ctx.data, ctx.cfg.model.outcome == "binary", ctx.floor,
                                   seed=int(ctx.cfg.seed), pair=validation_pair(ctx), kept=kept,
                                   round_id=ctx.request.keep_round)

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        if "select.d1.n" in totals:
            score = RoundScore.from_totals(ctx.round_id, totals, totals.sites)
            nc = answer.get("natural_course") or {}  # merged just before (queries.natural_course)
            if score is not None and nc.get("mean_abs_gap") is not None:
                score = dataclasses.replace(score, nc=float(nc["mean_abs_gap"]), nc_passes=nc.get("passes"))
            answer["selection"] = score.as_row() if score is not None else None


def site_selection_sums(model, data, binary: bool, floor: int, seed: int = 0,
                        pair: tuple[np.ndarray, np.ndarray] | None = None, kept: "KeptTerms | None" = None,
                        round_id: int | None = None) -> dict[str, Any]:
    """A site's ``select.*`` sums over its validation rows (module docstring); zeros when it cannot score.

    Args:
        model: the simulator being scored (global Θc with the site's Θs).
        data: the site's ``SiteData`` (its ``validation`` rows, its anchors).
        binary: the outcome is binary (log-loss) or continuous (squared error).
        floor: the site's evaluation cohort floor: fewer validation entities send nothing (P22).
        seed: the seed of D_h's simulated futures (the same in every round: common random numbers across rounds).
        pair: ``queries.targeted.one_step_pair`` of the validation rows when the caller has it already.
        kept: the site's store of earlier rounds' terms ψ (module docstring); None sends no paired sums.
        round_id: the scored round (the index of its terms in ``kept``).
    """
    out = dict.fromkeys(KEYS, 0.0)
    val = data.validation
    if val is None or entity_count(val) < floor:
        return out
    valid = val.M > 0
    p = model.factual_probs(val)[valid]
    y = val.Y[valid].astype(np.float64)
    if binary:
        q = np.clip(p, 1e-6, 1 - 1e-6)
        fit = -(y * np.log(q) + (1 - y) * np.log(1 - q))
    else:
        fit = (y - p) ** 2
    out["select.fit.n"] = float(fit.size)
    out["select.fit.s"] = float(fit.sum())
    if val.P is None:
        return out
    from fcd_secure.queries.targeted import one_step_pair  # noqa: PLC0415

    a_off, a_on = (int(a) for a in data.anchors)
    mu_on, mu_off = pair if pair is not None else one_step_pair(model, val, data.anchors)
    terms = one_step_dr_terms(val.Y, val.M, val.T, val.P, mu_on, mu_off, a_on, a_off)
    d = DiscrepancySums.from_terms(terms)
    out.update({"select.d1.n": float(d.n), "select.d1.s": d.s, "select.d1.ss": d.ss,
                "select.d1.clipped": float(d.clipped), "select.sites": 1.0})
    if kept is not None and round_id is not None and 0 <= int(round_id) < PAIR_CAP:
        out.update(kept.paired_sums(int(round_id), np.clip(terms, -DEFAULT_CLIP, DEFAULT_CLIP)))
    out.update(_dh_sums(model, val, (a_off, a_on), seed))
    return out


def _dh_sums(sim, val, anchors: tuple[int, int], seed: int) -> dict[str, float]:
    """The ``select.dh.*`` sums of one site's validation rows (module docstring); zeros where a weight product
    overflows (it then sends no D_h, and the merged D_h counts as unavailable only if no site sent one)."""
    from fcd_secure.data.policy import default_policies  # noqa: PLC0415

    a_off, a_on = anchors
    h = min(DH_HORIZON, val.L)
    pols = {p.name: p for p in default_policies()}
    v = {name: np.asarray(sim.simulate_policy(val, pols[name], anchors, DH_SAMPLES, seed, horizon=h).probs,
                          dtype=np.float64).mean(1) for name in ("always", "never")}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        psi, w_on, w_off = horizon_dr_terms(val.Y, val.M, val.T, val.P, v["always"], v["never"], a_on, a_off, h)
    if not (np.isfinite(psi).all() and np.isfinite(w_on).all() and np.isfinite(w_off).all()):
        return {f"select.dh.{f}": 0.0 for f in DH_FIELDS}
    sums = HorizonDiscrepancySums.from_terms(psi, w_on, w_off)
    return {f"select.dh.{f}": float(getattr(sums, f)) for f in DH_FIELDS}


@dataclass(frozen=True)
class RoundScore:
    """The consortium's selection figures of one evaluated round (from the summed ``select.*``)."""

    round: int
    d1: float
    se: float
    mean: float
    n: int
    clipped_share: float
    fit: float
    sites_scoring: int
    sites: int
    dh: float = math.nan
    dh_se: float = math.nan
    dh_ess: float = 0.0
    #: paired sums against earlier rounds: ``{round k: (n, Σ(ψ_r − ψ_k), Σ(ψ_r − ψ_k)²)}`` (module docstring)
    pairs: dict[int, tuple[int, float, float]] = field(default_factory=dict)
    #: the whole-horizon natural-course gap where the run measured it (``queries.natural_course``), else NaN
    nc: float = math.nan
    #: whether that check passed (the outcome's largest |z| within its Bonferroni critical value); None: not measured
    nc_passes: bool | None = None

    def paired_se(self, other: "RoundScore") -> float:
        """The standard error of D₁(self) − D₁(other) from the paired sums of the later round (NaN where that round
        kept no pair with the earlier one)."""
        late, early = (self, other) if self.round >= other.round else (other, self)
        if late.round == early.round:
            return 0.0
        got = late.pairs.get(early.round)
        if not got or got[0] < 2:
            return math.nan
        n, s, ss = got
        mean = s / n
        var = max(ss / n - mean * mean, 0.0) * n / (n - 1)
        return math.sqrt(var / n)

    @classmethod
    def from_totals(cls, rnd: int, totals: dict[str, Any], sites: int) -> "RoundScore | None":
        if "select.d1.n" not in totals:
            return None
        d = DiscrepancySums(n=int(round(totals["select.d1.n"])), s=float(totals["select.d1.s"]),
                            ss=float(totals["select.d1.ss"]), clipped=int(round(totals["select.d1.clipped"])))
        n_fit = float(totals.get("select.fit.n", 0.0))
        dh = dh_se = math.nan
        dh_ess = 0.0
        if all(f"select.dh.{f}" in totals for f in DH_FIELDS):
            hs = HorizonDiscrepancySums(**{f: (int(round(totals[f"select.dh.{f}"])) if f in ("n", "clipped")
                                              else float(totals[f"select.dh.{f}"])) for f in DH_FIELDS})
            dh, dh_se, dh_ess = hs.discrepancy().d1(), hs.discrepancy().se(), hs.ess()
        pairs: dict[int, tuple[int, float, float]] = {}
        if all(k in totals for k in PAIR_LISTS):
            pn, ps, pss = (np.asarray(totals[k], dtype=np.float64) for k in PAIR_LISTS)
            # a pair counts only where every scoring site kept it (its steps are then all of D₁'s steps)
            pairs = {k: (int(round(pn[k])), float(ps[k]), float(pss[k])) for k in range(min(len(pn), PAIR_CAP))
                     if pn[k] > 0 and int(round(pn[k])) == d.n}
        return cls(round=int(rnd), d1=d.d1(), se=d.se(), mean=d.mean(), n=d.n, clipped_share=d.clipped_share(),
                   fit=float(totals["select.fit.s"]) / n_fit if n_fit else math.nan,
                   sites_scoring=int(round(totals.get("select.sites", 0.0))), sites=int(sites),
                   dh=dh, dh_se=dh_se, dh_ess=dh_ess, pairs=pairs)

    @classmethod
    def from_row(cls, row: dict[str, Any], rnd: int | None = None) -> "RoundScore":
        """The score of a round from its :meth:`as_row` dict (``rounds.json``'s ``selection``), the round id
        replaced by ``rnd`` when given; a missing or null figure reads NaN (0 for the D_h ESS)."""
        def get(key: str, default: float = math.nan) -> Any:
            v = row.get(key)
            return default if v is None else v

        return cls(round=int(row["round"] if rnd is None else rnd), d1=get("d1"), se=get("d1_se"),
                   mean=get("d1_mean"), n=int(get("d1_steps", 0)), clipped_share=get("d1_clipped_share"),
                   fit=get("validation_fit"), sites_scoring=int(get("sites_scoring", 0)), sites=int(get("sites", 0)),
                   dh=get("dh"), dh_se=get("dh_se"), dh_ess=get("dh_ess", 0.0),
                   pairs={int(k): (int(v[0]), float(v[1]), float(v[2])) for k, v in (row.get("d1_pairs") or {}).items()},
                   nc=get("nc_gap"), nc_passes=row.get("nc_passes"))

    @classmethod
    def from_round(cls, row: dict[str, Any]) -> "RoundScore":
        """The score of a scored round from its ``rounds.json`` row: its ``selection``, with the verdict of the
        round's own ``natural_course`` where that selection row predates the flag (a run resumed across versions)."""
        sel = row["selection"]
        if sel.get("nc_passes") is None:
            sel = {**sel, "nc_passes": (row.get("natural_course") or {}).get("passes")}
        return cls.from_row(sel)

    @property
    def dh_supported(self) -> bool:
        """D_h has a value and both anchor regimes keep ``queries.targeted.MIN_SUPPORT_ESS`` effective entities."""
        from fcd_secure.queries.targeted import MIN_SUPPORT_ESS  # noqa: PLC0415

        return bool(math.isfinite(self.dh) and math.isfinite(self.dh_se) and self.dh_ess >= MIN_SUPPORT_ESS)

    @property
    def alarm(self) -> bool:
        """D₁ more than :data:`ALARM_SE` standard errors from zero: the model's one-step effect disagrees with the
        logs beyond chance (learned confounding)."""
        return bool(np.isfinite(self.se) and self.se > 0 and self.d1 > ALARM_SE * self.se)

    @property
    def coverage(self) -> str:
        """``full`` (every evaluated site scored), ``partial`` or ``unavailable`` (none)."""
        if self.sites_scoring == 0 or self.n == 0:
            return "unavailable"
        return "full" if self.sites_scoring >= self.sites else "partial"

    def as_row(self) -> dict[str, Any]:
        return {"round": self.round, "d1": _f(self.d1), "d1_se": _f(self.se), "d1_mean": _f(self.mean),
                "d1_steps": self.n, "d1_clipped_share": _f(self.clipped_share), "validation_fit": _f(self.fit),
                "sites_scoring": self.sites_scoring, "sites": self.sites, "coverage": self.coverage,
                "alarm": self.alarm, "dh": _f(self.dh), "dh_se": _f(self.dh_se), "dh_ess": _f(self.dh_ess),
                "dh_horizon": DH_HORIZON, "dh_supported": self.dh_supported,
                "d1_pairs": {str(k): [n, s, ss] for k, (n, s, ss) in sorted(self.pairs.items())},
                "nc_gap": _f(self.nc), "nc_passes": self.nc_passes}


def _f(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def choose_round(scores: list[RoundScore], last_round: int, unit: str = "round",
                 name: str = "round {}", natural_course_gate: bool = True) -> dict[str, Any]:
    """The round the run answers with, under the rule of the module docstring, and why.

    Args:
        natural_course_gate: leave out the rounds whose natural course failed where another's passed (the module
            docstring's first step); False only to compare the rule without it (``benchmarks/horizon.py``).

    Returns:
        ``{"rule", "round", "reason", "coverage", "candidates": [rounds within one SE], "scores": [rows]}``; the
        reason calls the candidates ``unit`` and names one with ``name`` (:func:`choose_run`: runs #1..#n).
    """
    rows = [s.as_row() for s in scores]
    usable = [s for s in scores if s.coverage != "unavailable" and math.isfinite(s.d1)]
    if not usable:
        return {"rule": "last", "round": int(last_round), "coverage": "unavailable", "candidates": [],
                "reason": "no evaluated round had a D1 (no site could score: validation entities below its cohort floor, or "
                          "no logged propensities): "
                          "the last round is kept", "scores": rows}
    gate_note = ""
    if natural_course_gate:
        usable, gate_note = _natural_course_gate(usable, unit, name)
    cands, best, paired = _d1_window(usable)
    rule, dh_note = "d1-paired-one-se", gate_note
    if not paired:
        dh_note += f"; marginal SE (no paired sums kept for some {unit}s)"
    with_dh = all(s.dh_supported for s in usable)
    if with_dh:  # D_h joins only where every round's is supported (module docstring)
        dh_cands, dh_best = _one_se(usable, "dh", "dh_se")
        both = [s for s in cands if s in dh_cands]
        if both:
            cands, rule = both, "d1-paired-and-dh-one-se"
            dh_note += f"; D{DH_HORIZON} {dh_best.dh:.4f} smallest at {name.format(dh_best.round)}, also within one SE"
        else:
            dh_note += f"; no {unit} within one SE of both D1 and D{DH_HORIZON}: D1's candidates kept"
    elif any(s.dh_supported for s in usable) or any(math.isfinite(s.dh) for s in usable):
        dh_note += f"; D{DH_HORIZON} left out: not supported in every {unit} (an anchor regime's ESS below 20)"
    # never the validation fit (module docstring): natural course, else a supported D_h, else D1 itself
    if all(math.isfinite(s.nc) for s in cands):
        key, by = (lambda s: (s.nc, -s.round)), "the smallest whole-horizon natural-course gap"
    elif with_dh:
        key, by = (lambda s: (s.dh, -s.round)), f"the smallest D{DH_HORIZON}"
    else:
        key, by = (lambda s: (s.d1, -s.round)), "the smallest D1"
    pick = min(cands, key=key)
    coverage = "full" if all(s.coverage == "full" for s in usable) else "partial"
    return {"rule": rule, "round": pick.round, "coverage": coverage,
            "candidates": [s.round for s in cands],
            "reason": f"D1 {pick.d1:.4f} ± {pick.se:.4f} (smallest {best.d1:.4f} at {name.format(best.round)}); "
                      f"{by} among {len(cands)} {unit}(s) within one paired SE" + dh_note,
            "scores": rows}


def _natural_course_gate(scores: list[RoundScore], unit: str, name: str) -> tuple[list[RoundScore], str]:
    """The rounds whose natural course passed where at least one did (module docstring), and what the reason adds:
    a model that fails the parametric g-formula's own validation is not the one to answer with when another passes
    it (Taubman et al. 2009; McGrath et al. 2020, gfoRmula)."""
    passed = [s for s in scores if s.nc_passes is True]
    failed = [s for s in scores if s.nc_passes is False]
    if not failed:
        return scores, ""
    if not passed:
        return scores, f"; the natural course failed in every {unit} checked: none left out"
    kept = [s for s in scores if s.nc_passes is not False]  # a round never checked is not one that failed
    return kept, ("; left out, their natural course failed: " + ", ".join(name.format(s.round) for s in failed))


def _d1_window(scores: list[RoundScore]) -> tuple[list[RoundScore], RoundScore, bool]:
    """The rounds whose D₁ is within one SE of the paired difference from the smallest D₁ (module docstring), that
    round, and whether every comparison had its paired sums (else that round's marginal SE was used)."""
    best = min(scores, key=lambda s: (s.d1, -s.round))
    cands, paired = [], True
    for s in scores:
        se = s.paired_se(best)
        if not math.isfinite(se):
            paired = False
            se = best.se if math.isfinite(best.se) else 0.0
        if s.d1 - best.d1 <= se:
            cands.append(s)
    return cands, best, paired


def _one_se(scores: list[RoundScore], value: str, se: str) -> tuple[list[RoundScore], RoundScore]:
    """The rounds whose ``value`` is within one ``se`` of the smallest (ties to the later round), and that round."""
    best = min(scores, key=lambda s: (getattr(s, value), -s.round))
    width = getattr(best, se)
    bound = getattr(best, value) + (width if math.isfinite(width) else 0.0)
    return [s for s in scores if getattr(s, value) <= bound], best


def choose_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Which of several finished runs on the same data and seed (hence the same validation rows) to answer with:
    :func:`choose_round`'s rule over each run's selected round, so that outcome-model variants (the diffusion
    transition, the deterministic one, the latent or the encoder rollout, another simulator, another recipe) are
    chosen by the same truth-free criterion as a run's rounds (the natural-course gate included: a run whose chosen
    round failed its natural course is left out where another's passed); two rollouts of one network have
    equal fits, and a supported D_h tells them apart. A site keeps its D₁ terms per run, so no pair spans two runs:
    the window across runs takes the marginal SE, and the reason says so.

    Args:
        rows: each run's selected round as :meth:`RoundScore.as_row` gives it (``rounds.json``'s ``selection``).

    Returns:
        ``{"rule", "run": index or None, "candidates": [indices], "coverage", "reason"}`` (indices from 0; the reason
        numbers the runs #1..#n); ``run`` is None when no run has a D₁ (no site could score): the criterion cannot
        choose, and the reason says so.
    """
    # runs #1..#n in the reason; a row's paired sums are against the earlier rounds of its own run (keyed by that
    # run's round numbers), never against another run, so across runs the window takes the marginal SE
    scores = [dataclasses.replace(RoundScore.from_row(r, i + 1), pairs={}) for i, r in enumerate(rows)]
    got = choose_round(scores, len(rows), unit="run", name="run #{}")
    if got["rule"] == "last":
        return {"rule": "unavailable", "run": None, "candidates": [], "coverage": "unavailable",
                "reason": "no run has a D1 (no site scored its validation rows: no logged propensities, or fewer "
                          "validation entities than a site's cohort floor): the criterion cannot choose"}
    return {"rule": got["rule"], "run": got["round"] - 1, "candidates": [c - 1 for c in got["candidates"]],
            "coverage": got["coverage"],
            "reason": got["reason"]}


class KeptTerms:
    """A site's per-step D₁ terms ψ of every scored round (``<site state>/selection_terms``; never sent): the paired
    sums of the module docstring."""

    def __init__(self, folder: str | Path) -> None:
        self.dir = Path(folder)

    def path(self, rnd: int) -> Path:
        return self.dir / f"round_{int(rnd):06d}.npy"

    def paired_sums(self, rnd: int, terms: np.ndarray) -> dict[str, list[float]]:
        """Keep round ``rnd``'s clipped ``terms`` and return the ``select.pair.*`` lists: entry k holds the sums of
        ψ_rnd − ψ_k for every earlier kept round k < ``rnd`` whose terms cover the same steps (zeros elsewhere)."""
        terms = np.asarray(terms, dtype=np.float64).ravel()
        n, s, ss = (np.zeros(PAIR_CAP) for _ in range(3))
        for k in range(min(int(rnd), PAIR_CAP)):
            p = self.path(k)
            if not p.exists():
                continue
            old = np.load(p)
            if old.shape != terms.shape:  # another validation split (a new cohort): no pair
                continue
            diff = terms - old
            n[k], s[k], ss[k] = diff.size, diff.sum(), (diff * diff).sum()
        self.dir.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.save(buf, terms)
        atomic_write_bytes(self.path(rnd), buf.getvalue())
        return {"select.pair.n": n.tolist(), "select.pair.s": s.tolist(), "select.pair.ss": ss.tolist()}


class KeptParams:
    """Parameters kept per scored round: a site's own Θs (``<site state>/slots/selection_theta_s``, never leaves
    the site) and the server's global Θc (``<state root>/_server/selection``), so that the run answers with the
    chosen round's model."""

    def __init__(self, folder: str | Path) -> None:
        self.dir = Path(folder)

    def path(self, rnd: int) -> Path:
        return self.dir / f"round_{int(rnd):06d}.npz"

    def keep(self, rnd: int, theta_s: dict[str, np.ndarray] | None) -> None:
        """Keep ``theta_s`` for round ``rnd`` (``None``: a site that had not trained yet, whose Θs is the initial
        one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        arrays = {f"theta_s/{k}": np.asarray(v) for k, v in (theta_s or {}).items()}
        arrays["__initial__"] = np.asarray([theta_s is None], dtype=np.uint8)
        atomic_write_bytes(self.path(rnd), npz_bytes(arrays))

    def load(self, rnd: int) -> dict[str, np.ndarray] | None:
        """The parameters kept for ``rnd`` (``None``: the initial ones).

        Raises:
            FileNotFoundError: the site kept nothing for that round.
        """
        p = self.path(rnd)
        if not p.exists():
            raise FileNotFoundError(f"{p}: nothing was kept for round {rnd}")
        with np.load(p) as z:
            if bool(z["__initial__"][0]):
                return None
            return {k[len("theta_s/"):]: z[k].copy() for k in z.files if k.startswith("theta_s/")}

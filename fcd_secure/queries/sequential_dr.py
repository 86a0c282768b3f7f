"""The sequential doubly robust value of each policy: the simulator's Q̂ conditioned on every logged history, corrected
step by step with the propensities.

The per-decision doubly robust estimator (Jiang & Li 2016, "Doubly robust off-policy value evaluation for
reinforcement learning", ICML; Thomas & Brunskill 2016, "Data-efficient off-policy policy evaluation for
reinforcement learning", ICML), here with the outcome regressions of the sequential doubly robust estimator (Bang &
Robins 2005, "Doubly robust estimation in missing data and causal inference models", Biometrics 61:962-973; the
iterated conditional expectations of LTMLE, van der Laan & Gruber 2012, Int. J. Biostat. 8(1)), per entity::

    DR_i = c_i [ V̂(h_0) + Σ_t ρ_{0:t} (y_t − Q̂(h_t, a_t) + V̂(h_{t+1})) ],   ρ_{0:t} = Π_{s≤t} π(a_s | h_s) / P_s,

c_i = 1 / (valid steps of i) (the project's per-step value), V̂(h_T) = 0. Unlike ``queries.doubly_robust``, whose
control variate is the simulator's rollout from t = 0 whatever happened since, here

* V̂(h_t) = E_sim[Σ_{s≥t} M_s Y_s | logged h_t, π from t]: the simulator rolled out under π from each logged history
  h_t (the encoder reads the logged steps before t, ``Simulator.simulate(start_t=t)``);
* Q̂(h_t, a_t) = the same rollout with the logged a_t at t and π after (``model.simulator.FirstThen``); for a
  deterministic π, Q̂(h_t, a_t) enters only where a_t = π(h_t), where it equals V̂(h_t), so no second rollout is made.

**Double robustness.** With the right propensities every correction term has mean zero, whatever Q̂ (the weights
make the logged steps the policy's); with the right Q̂ (the true iterated conditional expectations) every
y_t − Q̂(h_t, a_t) + V̂(h_{t+1}) has mean zero given (h_t, a_t), whatever the weights. Either makes DR_i unbiased
for the policy's value, and the interval is the normal one over entities from the sums of DR_i, DR_i²: its standard
error is that of the influence function DR_i − V (``tests/test_sequential_dr.py`` shows both sides on a world whose
Q is exact).

**Cost.** A rollout is made from h_t only for the entities still following π (ρ_{0:t−1} > 0; all of them for a
stochastic π), with :data:`SDR_SAMPLES` futures each, and the rollouts of every policy from one step are one call of
the simulator (``model.simulator.ByRow``), so the check costs about Σ_t (H − t) simulated steps whatever the number
of policies; the rollout from h_0 is the question's own (``queries.policy_terms``). :data:`SDR_LOOKAHEAD` can cap the
steps simulated from each h_t (the rest of Q̂'s return-to-go is then the rollout's from t = 0: still a Q̂, so the
estimator stays consistent with right propensities). ``whatif.sdr.<π>.*`` (n, Σ, Σ²) are its sums, on sites that
log or estimate propensities (every site must send them, or the value is left out: a partial population).

**Where the logs barely follow π the number is withheld.** The corrections carry the weight products ρ_{0:t}; where
few logged entities follow π through the horizon nearly every ρ is 0, DR_i is the simulator's V̂(h_0) again, and the
interval over entities measures the spread of the simulator's predictions, not its error: on DKT-Synth, where 1–4 %
of logged steps follow each policy, the intervals were 0.01 wide and missed the truth by 0.27. The rule is the one of
the identified horizons (``queries.targeted``, :func:`~fcd_secure.queries.targeted.support_of`), read on the weight
products to each entity's last step within the horizon (``whatif.sdr.<π>.sw``, ``.sww``): the value is shown only
where their effective sample size (Σw)²/Σw² (Kish 1965, "Survey Sampling", §8.2) is at least
:data:`~fcd_secure.queries.targeted.MIN_SUPPORT_ESS` = 20 *and* their mean is not significantly below 1 (exact
inverse-probability weights average 1, Cole & Hernán 2008, Am. J. Epidemiol. 168:656-664: a shortfall is the share
of π's distribution no logged entity reached). Elsewhere the answer keeps the support figures and the reason
(``why``) and withholds the estimate (``withheld``, never printed as an answer): what the logs say there is the
bounded interval of ``queries.doubly_robust``.

**The support first.** The weight products need only π, the logged actions and ``P``, not the simulator, so a site
computes them before any history-conditioned rollout. Where none of its entities follows π through the horizon
(every final weight product 0: the site's Σw = 0) its history rollouts for π are skipped, and its Q̂(h_t, ·) and
V̂(h_t) are the return-to-go of the rollout from t = 0 (``v0``, the question's own): a function of the history that
does not vary with a_t, so V̂ = E_π Q̂ still holds and, with the right propensities, every correction term keeps
mean zero (the estimator and its interval stay consistent, as for :data:`SDR_LOOKAHEAD`; only the double robustness
against a wrong P is lost on that site). The site says so (``whatif.sdr.<π>.q0`` = 1). Such a site adds 0 to Σw,
so the consortium's value is shown only where the other sites' entities carry the support alone; where every site
skips (DKT-Synth over the whole trajectory: Σw = 0 on every site, 55 % of the checks' CPU was these rollouts,
docs/benchmarks.md) the value is withheld whatever Q̂ would say. A withheld value whose Q̂ was the rollout from t = 0
on any site keeps no ``withheld`` estimate, SE or SD: with every weight product 0 it is the simulator's own
extrapolation (issue 42: "extrapolation, never ranked"), which the simulated values already report.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure.evaluation.intervals import interval_from_sums, site_sums
from fcd_secure.queries.base import MergeContext, SiteContext, SiteSums, Totals
from fcd_secure.queries.doubly_robust import keep_in_range
from fcd_secure.queries.policy_terms import Rollouts
from fcd_secure.queries.policy_values import SUM_FIELDS, PolicyPart
from fcd_secure.queries.targeted import MIN_SUPPORT_ESS, final_weights, support_of

__all__ = ["SDR_SAMPLES", "HistoryQ", "SequentialDR", "history_q", "sdr_history_q", "sequential_dr_per_entity",
           "start_q", "support_first_q"]

#: simulated futures per entity and history of the history-conditioned rollouts
SDR_SAMPLES = 2
#: steps simulated from each logged history h_t; beyond them Q̂'s return-to-go is the rollout's from t = 0
#: (None: to the horizon)
SDR_LOOKAHEAD: int | None = None


def history_q(model, sub, policies: Sequence[Any], pis: Sequence[np.ndarray], anchors: tuple[int, int], H: int,
              n_samples: int, seed: int, v0: Sequence[np.ndarray] | None = None, lookahead: int | None = None
              ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Q̂(h_t, a_t) and V̂(h_t) of the simulator at every logged history of ``sub`` within the first ``H`` steps, for
    each policy (module docstring): ``[(q_hat, v_hat)]``, each ``[n, L]`` return-to-go over the logged valid steps up
    to H; 0 where not needed (the entity stopped following π, or the step is padding). The rollouts of every policy
    from one step t are one call of the simulator (``model.simulator.ByRow``): its cost is the number of steps
    simulated, Σ_t min(lookahead, H − t), not the number of policies or rows.

    Args:
        model: the simulator.
        sub: the site's rows (with its propensities ``P``).
        policies: the bound policies π.
        pis: π(logged a_t | logged h_t) of each, ``[n, L]``.
        anchors: ``(a_off, a_on)``.
        H: the horizon.
        n_samples: simulated futures per entity and history.
        seed: the rollouts' seed.
        v0: each policy's expected outcome per step from t = 0, ``[n, ≥H]``, when the caller has it (then V̂(h_0)
            is read from it, and the steps beyond ``lookahead`` too).
        lookahead: simulate at most this many steps from each h_t; the rest of the return-to-go is v0's (needs v0).
    """
    from fcd_secure.model.simulator import ByRow, FirstThen  # noqa: PLC0415

    n, L = sub.n, sub.L
    valid = sub.M[:, :H] > 0
    P = np.where(sub.M > 0, np.asarray(sub.P, np.float64), 1.0)[:, :H]
    w_prev = []
    for pi in pis:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            w = np.cumprod(np.where(valid, pi[:, :H] / P, 1.0), axis=1)
        w_prev.append(np.concatenate([np.ones((n, 1)), w[:, :-1]], axis=1))
    out = [(np.zeros((n, L)), np.zeros((n, L))) for _ in policies]
    stochastic = [bool(getattr(p, "stochastic", False)) for p in policies]
    steps = H if lookahead is None or v0 is None else max(int(lookahead), 1)
    M = sub.M[:, :H].astype(np.float64)
    tails = [np.asarray(v, np.float64)[:, :H] * M for v in v0] if v0 is not None else None

    def to_go(probs: np.ndarray, rows: np.ndarray, t: int, k: int) -> np.ndarray:
        h = probs.shape[-1]
        got = (np.asarray(probs, np.float64).mean(1) * M[rows, t:t + h]).sum(1)
        return got if tails is None else got + tails[k][rows, t + h:].sum(1)

    for t in range(H):
        rows_of = [np.flatnonzero(valid[:, t] & (wp[:, t] > 0)) for wp in w_prev]
        # what each policy needs simulated from h_t: V̂ (π from t; from v0 at t = 0) and, for a stochastic π, Q̂
        # (the logged a_t, then π); a deterministic π's Q̂(h_t, a_t) is V̂(h_t) wherever ρ_{0:t} > 0
        jobs = [(k, "v", rows) for k, rows in enumerate(rows_of) if rows.size and not (t == 0 and v0 is not None)]
        jobs += [(k, "q", rows) for k, rows in enumerate(rows_of) if rows.size and stochastic[k]]
        if t == 0 and v0 is not None:
            for k, rows in enumerate(rows_of):
                out[k][1][rows, 0] = tails[k][rows].sum(1)
        if jobs:
            stacked = sub.subset(np.concatenate([rows for _, _, rows in jobs]))
            first = stacked.T[:, t]
            plans = tuple(policies[k] if kind == "v" else FirstThen(first, policies[k]) for k, kind, _ in jobs)
            which = np.repeat(np.arange(len(jobs)), [rows.size for _, _, rows in jobs])
            sim = model.simulate(stacked, ByRow(plans, which), n_samples, seed, start_t=t,
                                 horizon=min(steps, H - t), anchors=anchors)
            at = 0
            for k, kind, rows in jobs:
                got = to_go(sim.probs[at:at + rows.size], rows, t, k)
                at += rows.size
                out[k][0 if kind == "q" else 1][rows, t] = got
        for k, rows in enumerate(rows_of):
            if not stochastic[k]:
                out[k][0][rows, t] = out[k][1][rows, t]  # Q̂(h_t, a_t) = V̂(h_t) where a_t = π(h_t)
    return out


def start_q(v0: np.ndarray, M: np.ndarray, H: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Q̂ and V̂ from the rollout from t = 0 alone (module docstring, "The support first"): at every logged step t < H
    the return-to-go Σ_{s≥t} M_s v0_s of that rollout, the same for Q̂(h_t, ·) and V̂(h_t), ``[n, L]`` each (0 beyond
    H)."""
    m = np.asarray(M, np.float64)[:, :H]
    tail = np.asarray(v0, np.float64)[:, :H] * m
    v = np.zeros((m.shape[0], L))
    v[:, :H] = np.cumsum(tail[:, ::-1], axis=1)[:, ::-1] * (m > 0)
    return v.copy(), v


@dataclass(frozen=True)
class HistoryQ:
    """Q̂ and V̂ of every policy of a question on one site (:func:`support_first_q`).

    Attributes:
        horizon: the horizon H of the question on this site.
        qv: ``[(q_hat, v_hat)]`` per policy, ``[n, L]`` each.
        weights: per policy, each entity's weight product through H (:func:`~fcd_secure.queries.targeted.final_weights`),
            ``[n]``: computed first, to decide ``from_start``, and read again by the value's support sums.
    """

    horizon: int
    qv: list[tuple[np.ndarray, np.ndarray]]
    weights: list[np.ndarray]

    @property
    def from_start(self) -> list[bool]:
        """Per policy, whether its Q̂ is the rollout from t = 0 (:func:`followed_by_none`)."""
        return [followed_by_none(w) for w in self.weights]


def followed_by_none(weights: np.ndarray) -> bool:
    """No entity follows the policy through the horizon: every weight product is 0 (its history rollouts are
    skipped, module docstring). A non-finite weight product counts as followed."""
    return bool(np.isfinite(weights).all() and float(weights.sum()) <= 0.0)


def support_first_q(model, sub, policies: Sequence[Any], pis: Sequence[np.ndarray], anchors: tuple[int, int], H: int,
                    n_samples: int, seed: int, v0: Sequence[np.ndarray], lookahead: int | None = None) -> HistoryQ:
    """The weight products first, then :func:`history_q` for the policies some entity of ``sub`` follows through
    ``H`` steps; :func:`start_q` for the others (module docstring, "The support first"). A non-finite weight product
    counts as followed (the caller then sends nothing for the policy)."""
    weights = [final_weights(sub, pi, H) for pi in pis]
    keep = [k for k, w in enumerate(weights) if not followed_by_none(w)]
    got = history_q(model, sub, [policies[k] for k in keep], [pis[k] for k in keep], anchors, H, n_samples, seed,
                    v0=[v0[k] for k in keep], lookahead=lookahead) if keep else []
    by_k = dict(zip(keep, got))
    qv = [by_k[k] if k in by_k else start_q(v0[k], sub.M, H, sub.L) for k in range(len(pis))]
    return HistoryQ(H, qv, weights)


def sequential_dr_per_entity(Y: np.ndarray, M: np.ndarray, P: np.ndarray, pi: np.ndarray, q_hat: np.ndarray,
                             v_hat: np.ndarray, horizon: int) -> np.ndarray:
    """DR_i of the module docstring over the first ``horizon`` steps, ``[n]`` (the per-decision doubly robust
    estimator of ``evaluation.ope`` with history-conditioned Q̂ and V̂)."""
    from fcd_secure.evaluation.ope import PerDecisionDR  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflowing weights give non-finite terms: the caller then sends nothing
        dr, _support = PerDecisionDR(horizon=horizon).per_entity(Y, M, P, pi, q_hat=q_hat, v_hat=v_hat)
    return dr


class SequentialDR(PolicyPart):
    """The sequential doubly robust value of each policy (module docstring): ``whatif.sdr.<π>.*``."""

    name = "sequential_dr"

    def names(self, policy_names: Sequence[str], ope_horizon: int | None) -> list[str]:
        return [f"whatif.sdr.{p}.{f}" for p in policy_names for f in (*SUM_FIELDS, "sw", "sww", "q0")]

    def site_sums(self, ctx: SiteContext, terms: Rollouts) -> SiteSums:
        sub = ctx.sub
        if sub.P is None:
            return {}
        got = sdr_history_q(ctx, terms)
        H = got.horizon
        out: SiteSums = {}
        for r, (q_hat, v_hat), wf, q0 in zip(terms.policies, got.qv, got.weights, got.from_start):
            dr = sequential_dr_per_entity(sub.Y, sub.M, sub.P, r.pi, q_hat, v_hat, H)
            if not (np.isfinite(dr).all() and np.isfinite(wf).all()):
                return {}  # weights past float64: no sequential DR at all
            out.update(site_sums(f"whatif.sdr.{r.name}", dr))
            out.update({f"whatif.sdr.{r.name}.sw": float(wf.sum()), f"whatif.sdr.{r.name}.sww": float((wf * wf).sum()),
                        f"whatif.sdr.{r.name}.q0": 1.0 if q0 else 0.0})
        return out

    def merge_policy(self, s: Totals, ctx: MergeContext, name: str, d: dict[str, Any]) -> None:
        key = f"whatif.sdr.{name}"
        if not s.all_sent(f"{key}.n"):
            return
        sdr = interval_from_sums(s, key, ctx.level).to_dict()
        keep_in_range(sdr, ctx.binary, 0.0)
        sdr["horizon"] = ctx.question.horizon if ctx.question is not None else None
        if d.get("supported") is False:
            # no logged step follows π: every weight is 0 and DR_i is the simulator's V̂(h_0) again
            # (``queries.policy_values.not_identified``)
            d.setdefault("model_only", {})["sequential_dr"] = {k: sdr[k] for k in ("estimate", "low", "high")}
            sdr.update({"estimate": None, "low": None, "high": None, "supported": False,
                        "why": "no logged step follows the policy"})
        elif s.all_sent(f"{key}.sw"):
            sup = support_of(s, key, sdr["n"])
            sdr.update(sup)
            q0 = int(round(float(s.get(f"{key}.q0", 0.0))))
            if q0:
                sdr["q_from_start_sites"] = q0  # sites whose Q̂ is the rollout from t = 0 (module docstring)
            if not sup["supported"]:
                why = withheld_why(sup)
                if q0:
                    # every weight product of those sites is 0: the number would be the simulator's extrapolation
                    sdr.update({"withheld": None, "se": None, "sd": None})
                    why += (f"; on {q0} of {s.sites} sites no entity follows it through the horizon, so their "
                            "history-conditioned rollouts were not run")
                else:
                    sdr["withheld"] = {k: sdr[k] for k in ("estimate", "low", "high")}
                sdr.update({"estimate": None, "low": None, "high": None, "why": why})
        d["sequential_dr"] = sdr


def withheld_why(sup: dict[str, Any]) -> str:
    """Why a sequential DR value is withheld (module docstring), in the reader's words."""
    if sup["ess"] < MIN_SUPPORT_ESS:
        return (f"only {sup['ess']:.0f} effective entities (Kish ESS of the weight products) follow the policy through "
                f"the horizon, below {MIN_SUPPORT_ESS:g}: the value would be the simulator's own")
    return (f"the logs reach only part of the policy: the mean weight product is {sup['weight_mean']:.2f} ± "
            f"{sup['weight_se']:.2f} (1 where every history the policy leads to was logged)")


def sdr_history_q(ctx: SiteContext, terms: Rollouts) -> HistoryQ:
    """:func:`support_first_q` of every policy of the question on this site, computed once per evaluation (the
    sequential DR value and its sensitivity bounds, ``queries.sensitivity``, read the same Q̂ and V̂)."""
    sub = ctx.sub
    H = min(terms.horizon, sub.L)
    anchors = (int(ctx.data.anchors[0]), int(ctx.data.anchors[1]))
    pols = terms.policies
    return ctx.once("sdr.history_q", lambda: support_first_q(
        ctx.model, sub, [r.policy for r in pols], [r.pi for r in pols], anchors, H, SDR_SAMPLES, ctx.seed,
        v0=[r.step_value for r in pols], lookahead=SDR_LOOKAHEAD))

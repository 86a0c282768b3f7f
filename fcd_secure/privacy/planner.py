"""Privacy accounting arithmetic: ε of a DP-SGD history and σ planned once for a site's whole use.

Accounting model (Abadi et al. 2016; Opacus 1.6 accountants): every DP-SGD step is a Poisson-subsampled Gaussian
mechanism with rate q and noise multiplier σ; a site's history is the list of segments ``(σ, q, steps)`` over *all*
rounds and runs on its dataset, composed sequentially. Opacus' accountants take exactly that list, so the ledger
(``ledger.py``) stores it and this module turns it into ε.

Why σ is planned once: Opacus' ``make_private_with_epsilon`` derives σ assuming a zero starting point and ignores
what was spent before, so calling it every round overspends (a cap of ε = 8 ends near ε = 25 after 20 rounds).
Here σ is the smallest noise multiplier such that the *existing* history plus the whole planned use stays under
the cap, and it is then fixed for that plan.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable, Sequence

import numpy as np
from opacus.accountants import PRVAccountant, RDPAccountant, create_accountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.analysis.prv import Domain, PoissonSubsampledGaussianPRV

from fcd_secure._io import Kept

#: above this σ a plan is pointless (the update is noise); planning gives up and the ledger refuses instead.
SIGMA_MAX = 1000.0
#: PRV's ε error bar (Opacus' default); PRV returns the upper end of the interval (Gopi et al. 2021).
PRV_EPS_ERROR = 0.01

Segment = tuple[float, float, int]


def opacus_history(segments: Iterable[Sequence[float]]) -> list[Segment]:
    """Segments in Opacus' accountant format, consecutive equal (σ, q) merged as Opacus itself does."""
    out: list[Segment] = []
    for sigma, q, steps in segments:
        sigma, q, steps = float(sigma), float(q), int(steps)
        if steps <= 0:
            continue
        if out and out[-1][0] == sigma and out[-1][1] == q:
            out[-1] = (sigma, q, out[-1][2] + steps)
        else:
            out.append((sigma, q, steps))
    return out


def epsilon(segments: Iterable[Sequence[float]], delta: float, accountant: str = "prv") -> float:
    """ε at ``delta`` of a DP-SGD history (add/remove-one adjacency, Poisson sampling); 0 for no steps."""
    history = opacus_history(segments)
    if not history:
        return 0.0
    return _epsilon(tuple(history), float(delta), accountant)


#: one step's RDP at each of Opacus' default orders, by (σ, q) (:func:`_rdp_per_step`)
_RDP_STEP: Kept[tuple[float, float], np.ndarray] = Kept(1024)


def _rdp_per_step(sigma: float, q: float) -> np.ndarray:
    """``compute_rdp(q, σ, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)`` (Mironov, Talwar and Zhang 2019,
    "Rényi Differential Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530; Opacus'
    ``accountants.analysis.rdp``), once per process for each (σ, q). Opacus returns ``rdp * steps`` of this very
    array, and a history's segments keep their (σ, q) while planning tries σ after σ for the next one: each
    evaluation then costs the new segment's series alone (the fractional orders' series dominate the cost)."""
    return _RDP_STEP.get((sigma, q), lambda: rdp_analysis.compute_rdp(
        q=q, noise_multiplier=sigma, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS))


def _rdp_epsilon(history: tuple[Segment, ...], delta: float) -> float:
    """``RDPAccountant.get_epsilon(delta)`` of ``history``, bit for bit: the same per-segment RDP vectors
    (``rdp * steps``, :func:`_rdp_per_step`), summed in the history's order as Opacus sums them, converted by
    Opacus' own ``get_privacy_spent`` at the same orders."""
    rdp = sum([_rdp_per_step(sigma, q) * steps for sigma, q, steps in history])
    eps, _ = rdp_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


class _KeptRdpPRVAccountant(PRVAccountant):
    """Opacus' PRV accountant (Gopi, Lee and Wutschitz 2021, "Numerical Composition of Differential Privacy",
    NeurIPS), whose discretisation domain is bounded by RDP ε's (Opacus' ``compute_safe_domain_size``, the paper's
    remark 5.6): the same bound from the RDP vectors :func:`_rdp_per_step` keeps, so the same domain and ε bit for
    bit. That bound is most of a PRV ε's cost (Opacus 1.6: ~80 %), and it recomputes every segment's RDP series,
    twice for each (σ, q), at every σ the planner tries."""

    def _get_domain(self, prvs: list[PoissonSubsampledGaussianPRV], num_self_compositions: list[int],
                    eps_error: float, delta_error: float) -> Domain:
        total = sum(num_self_compositions)
        history = tuple((p.noise_multiplier, p.sample_rate, n) for p, n in zip(prvs, num_self_compositions))
        bound = _rdp_epsilon(history, delta_error / 4)
        for sigma, q, _ in history:
            bound = max(bound, _rdp_epsilon(((sigma, q, 1),), delta_error / (8 * total)))
        half = max(bound, eps_error) + 3
        mesh_size = eps_error / np.sqrt(total * np.log(12 / delta_error) / 2)
        return Domain.create_aligned(-half, half, mesh_size)


@functools.lru_cache(maxsize=4096)
def _epsilon(history: tuple[Segment, ...], delta: float, accountant: str) -> float:
    # pure function of its arguments; planning and reports ask for the same histories many times
    with warnings.catch_warnings():
        # PRV bounds its domain with RDP internally and warns about the optimal RDP order; the ε it returns is PRV's.
        warnings.simplefilter("ignore")
        if accountant == "rdp":
            return _rdp_epsilon(history, delta)
        acc = _KeptRdpPRVAccountant() if accountant == "prv" else create_accountant(accountant)
        acc.history = list(history)
        if accountant == "prv":
            return float(acc.get_epsilon(delta, eps_error=PRV_EPS_ERROR))
        return float(acc.get_epsilon(delta))


def epsilon_curve(segments: Sequence[Sequence[float]], delta: float, accountant: str = "prv") -> list[float]:
    """ε after each segment in turn (the ε-over-rounds curve of the report)."""
    return [epsilon(segments[: i + 1], delta, accountant) for i in range(len(segments))]


def sample_rate(n_site: int, batch_size: int) -> float:
    """Poisson rate q exactly as Opacus computes it: ``1 / len(DataLoader(ds, batch_size))``.

    Opacus derives q from the loader's length, not from B/N; planning with B/N would account a different q than
    the one the optimizer's hook records when N is not a multiple of B.
    """
    if n_site < 1 or batch_size < 1:
        raise ValueError(f"dp: need n_site ≥ 1 and batch_size ≥ 1, got n_site={n_site}, batch_size={batch_size}")
    return 1.0 / math.ceil(n_site / batch_size)


def steps_per_epoch(n_site: int, batch_size: int) -> int:
    """Poisson draws in one local epoch: ``len(loader)``, each an independent DP-SGD step."""
    return math.ceil(n_site / batch_size)


def plan_noise_multiplier(
    *,
    epsilon_cap: float,
    delta: float,
    q: float,
    planned_steps: int,
    accountant: str = "prv",
    history: Sequence[Sequence[float]] = (),
    tolerance: float = 0.01,
    sigma_max: float = SIGMA_MAX,
) -> float:
    """Smallest σ (to ``tolerance`` in ε) such that ``history + [(σ, q, planned_steps)]`` has ε ≤ ``epsilon_cap``.

    With an empty history this is Opacus' ``get_noise_multiplier(..., steps=planned_steps)``; with a history it
    plans the rest of the budget without ever re-starting the count. Raises ``ValueError`` if even σ = ``sigma_max``
    cannot fit (the budget is spent): the caller must refuse rather than train.
    """
    if planned_steps < 1:
        raise ValueError(f"dp: planned_steps must be ≥ 1, got {planned_steps}")
    base = list(history)

    def eps_at(sigma: float) -> float:
        return epsilon(base + [(sigma, q, planned_steps)], delta, accountant)

    if epsilon(base, delta, accountant) >= epsilon_cap:
        raise ValueError(f"the budget is already spent (ε cap {epsilon_cap:g})")
    if eps_at(sigma_max) > epsilon_cap:
        raise ValueError(
            f"no noise multiplier ≤ {sigma_max:g} keeps ε ≤ {epsilon_cap:g} for {planned_steps} more steps "
            f"(ε spent so far {epsilon(base, delta, accountant):.3f})"
        )
    # bracket [lo, hi] with ε(lo) > cap ≥ ε(hi), moving by factors of two from σ = 1
    hi = min(1.0, sigma_max)
    e_hi = eps_at(hi)
    if e_hi > epsilon_cap:
        while e_hi > epsilon_cap:
            lo, e_lo = hi, e_hi
            hi = min(2 * hi, sigma_max)
            e_hi = eps_at(hi)
    else:
        lo, e_lo = hi, e_hi
        while e_lo <= epsilon_cap:
            if epsilon_cap - e_lo <= tolerance:
                return float(lo)
            hi, e_hi = lo, e_lo
            lo = lo / 2
            e_lo = eps_at(lo)
    # Illinois (regula falsi) on log σ: ε(σ) is smooth and monotone, so this needs a handful of evaluations
    # where plain bisection needs a dozen (each one a full PRV/RDP computation).
    side = 0
    for _ in range(60):
        if epsilon_cap - e_hi <= tolerance or hi - lo < 1e-4 * hi:
            break
        la, lb = math.log(lo), math.log(hi)
        fa, fb = e_lo - epsilon_cap, e_hi - epsilon_cap
        x = lb - fb * (lb - la) / (fb - fa) if math.isfinite(fa) and fb != fa else (la + lb) / 2
        x = min(max(x, la + 0.01 * (lb - la)), lb - 0.01 * (lb - la))
        mid = math.exp(x)
        e_mid = eps_at(mid)
        if e_mid <= epsilon_cap:
            hi, e_hi = mid, e_mid
            if side == 1:
                e_lo = epsilon_cap + (e_lo - epsilon_cap) / 2
            side = 1
        else:
            lo, e_lo = mid, e_mid
            if side == -1:
                e_hi = epsilon_cap + (e_hi - epsilon_cap) / 2
            side = -1
    return float(hi)

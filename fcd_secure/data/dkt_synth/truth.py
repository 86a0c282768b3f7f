"""Ground truth of DKT-Synth: the structural model run forward under interventions (exact, or Monte Carlo with CRN).

Outcome model: ``P(Y_t = 1 | h_t, T_t = a) = σ(z_t[a] + βθ θ_i + βu u_i)`` with ``z_t = head(h_t)`` the frozen
oracle's logits after the interactions before ``t``, realised as ``Y_t = 1[U_it < p_t(a)]``; the knowledge state
absorbs ``(a, Y_t)`` (practice). These kernels work on arrays of students; :class:`~.world.DKTSynthWorld` picks the
students (site, split, rows), validates the query and cuts large queries into batches of at most
:data:`MAX_BATCH_ROWS` rows (:class:`~fcd_secure.data.worlds.world.OracleWorld`).

Batches of rollouts are laid out rollout-major: row ``b = r * n + i`` (:func:`~.noise.rollout_noise`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fcd_secure.data.dkt_synth.oracle import N_ITEMS, DKTOracle
from fcd_secure.data.policy import PolicyLike
from fcd_secure.data.worlds.horizons import HorizonSums

__all__ = ["MAX_BATCH_ROWS", "do_probs", "do_probs_along", "factual_probs", "factual_state", "policy_values", "regime_probs", "replay"]

State = tuple[torch.Tensor, torch.Tensor]

#: rows (students x rollouts) per LSTM batch: large enough to vectorise, small enough to stay in cache/RAM
MAX_BATCH_ROWS = 16384


def factual_state(oracle: DKTOracle, T: np.ndarray, Y: np.ndarray, t: int) -> State:
    """Oracle state after the logged interactions before ``t`` (padding steps are absorbed but never used).

    Args:
        oracle: The frozen oracle.
        T: Logged actions ``[n, L]``.
        Y: Logged outcomes ``[n, L]``.
        t: The step whose state is wanted.
    """
    state = oracle.init_state(len(T))
    T_t = torch.from_numpy(T)
    Y_t = torch.from_numpy(Y.astype(np.int64))
    with torch.no_grad():
        for s in range(t):
            state = oracle.step(state, T_t[:, s], Y_t[:, s])
    return state


def do_probs(oracle: DKTOracle, state: State, offset: torch.Tensor, a: np.ndarray) -> np.ndarray:
    """``σ(z[a] + βθ θ + βu u)`` per student at ``state``: P(Y = 1 | the history ``state`` holds, do(T = a)).

    Args:
        oracle: The frozen oracle.
        state: Oracle state of the n students.
        offset: ``βθ θ + βu u`` per student ``[n]``.
        a: One action per student, int64 ``[n]``.
    """
    with torch.no_grad():
        z = oracle.logits(state).gather(1, torch.from_numpy(a.copy())[:, None])[:, 0]
        return torch.sigmoid(z + offset).numpy()


def do_probs_along(oracle: DKTOracle, T: np.ndarray, Y: np.ndarray, offset: torch.Tensor,
                   actions: list[int]) -> np.ndarray:
    """:func:`do_probs` of each of ``actions`` at every step along the logged history, from one walk of it (a
    :func:`factual_state` per step would walk ``t`` steps for each ``t``); the same numbers as step by step.

    Returns:
        float64 ``[n, L, len(actions)]`` (padding steps are computed too; the caller masks them).
    """
    n, L = T.shape
    out = np.empty((n, L, len(actions)))
    T_t = torch.from_numpy(T)
    Y_t = torch.from_numpy(Y.astype(np.int64))
    state = oracle.init_state(n)
    with torch.no_grad():
        for t in range(L):
            for k, a in enumerate(actions):
                out[:, t, k] = do_probs(oracle, state, offset, np.full(n, a, dtype=np.int64))
            state = oracle.step(state, T_t[:, t], Y_t[:, t])
    return out


def factual_probs(
    oracle: DKTOracle, T: np.ndarray, Y: np.ndarray, offset: torch.Tensor, items: list[int], t_end: int
) -> np.ndarray:
    """Success probabilities of ``items`` at every step ``t < t_end`` given the factual history.

    Returns:
        float64 ``[n, L, len(items)]``, NaN from ``t_end`` on.
    """
    n, L = T.shape
    out = np.full((n, L, len(items)), np.nan)
    T_t = torch.from_numpy(T)
    Y_t = torch.from_numpy(Y.astype(np.int64))
    off = offset[:, None]
    idx = torch.tensor(items)
    state = oracle.init_state(n)
    with torch.no_grad():
        for t in range(t_end):
            out[:, t, :] = torch.sigmoid(oracle.logits(state)[:, idx] + off).numpy()
            state = oracle.step(state, T_t[:, t], Y_t[:, t])
    return out


def regime_probs(
    oracle: DKTOracle, state: State, offset: torch.Tensor, plan: np.ndarray, noise: np.ndarray
) -> np.ndarray:
    """E[Y_{start+h} | state at start, do(T_{start+h} = plan[:, h])], averaged over rollouts.

    Args:
        oracle: The frozen oracle.
        state: Oracle state of the n students at the start step.
        offset: ``βθ θ + βu u`` per student ``[n]``.
        plan: Actions ``[n, H]``.
        noise: Outcome noise ``[R * n, H]``, rollout-major (:func:`~.noise.rollout_noise`).

    Returns:
        float64 ``[n, H]``: the expected success probability at each step, mean over the R rollouts.
    """
    n, H = plan.shape
    R = noise.shape[0] // n
    h0, c0 = state
    state = (h0.repeat(R, 1), c0.repeat(R, 1))
    off = offset.repeat(R)
    noise_b = torch.from_numpy(noise)
    plan_b = torch.from_numpy(np.array(plan, dtype=np.int64)).repeat(R, 1)
    out = np.empty((n, H))
    with torch.no_grad():
        for h in range(H):
            a = plan_b[:, h]
            p = torch.sigmoid(oracle.logits(state).gather(1, a[:, None])[:, 0] + off)
            out[:, h] = p.reshape(R, n).mean(0).numpy()
            y = (noise_b[:, h] < p).long()
            state = oracle.step(state, a, y)
    return out


def policy_values(
    oracle: DKTOracle,
    policy: PolicyLike,
    offset: torch.Tensor,
    lengths: np.ndarray,
    noise: np.ndarray,
    anchors: tuple[int, int],
    horizons: Sequence[int | None] = (None,),
    contexts: np.ndarray | None = None,
    behaviour=None,
) -> np.ndarray:
    """Per-student value ``(1/H_i) Σ_{t<H_i} E[Y^π_it]`` of ``policy`` from t = 0 (H_i = min(L_i, horizon)), one
    per rollout, at each of ``horizons`` from one rollout (:class:`~fcd_secure.data.worlds.horizons.HorizonSums`).

    The policy sees ``(t, y_hist[B, t], lengths[B], a_off, a_on)`` with B = students × rollouts (rollout-major), and
    ``context=contexts[:, :t+1]`` when its ``needs_context`` is true; outcomes are sampled with ``noise``, the value
    uses the expected success probabilities.

    Args:
        oracle: The frozen oracle.
        policy: Anything with ``actions(t, y_hist, lengths, a_off, a_on) -> int64 [B]``.
        offset: ``βθ θ + βu u`` per student ``[n]``.
        lengths: Valid length per student ``[n]``.
        noise: Outcome noise ``[R * n, L]``, rollout-major.
        anchors: ``(a_off, a_on)``.
        horizons: Steps from t = 0 that each value averages (None: every valid step).
        contexts: The contexts ``[n, L, da]`` a context-reading policy sees (exogenous here: replayed).
        behaviour: ``behaviour(z) -> [B, K]``, the tutor's true item probabilities from the oracle's logits, passed
            as ``behaviour=`` to a policy whose ``needs_behaviour`` is true (an incremental or share intervention: it
            shifts these true probabilities, ``Policy.action_probs``).

    Returns:
        float64 ``[len(horizons), R, n]``.

    Raises:
        ValueError: The policy returned a wrong shape or an action outside ``[0, K)``.
    """
    n = len(lengths)
    RN, L = noise.shape
    R = RN // n
    noise_b = torch.from_numpy(noise)
    lengths_b = np.tile(lengths, R)
    off = offset.repeat(R)
    state = oracle.init_state(RN)
    y_hist = np.zeros((RN, L), dtype=np.float32)
    a_off, a_on = anchors
    sums = HorizonSums(lengths_b, horizons, L)
    ctx = None
    if getattr(policy, "needs_context", False):
        if contexts is None:
            raise ValueError(f"policy {getattr(policy, 'name', policy)!r} reads a context column: pass contexts")
        ctx = np.tile(np.asarray(contexts, dtype=np.float32), (R, 1, 1))
    with torch.no_grad():
        for t in range(sums.steps):
            kw = {} if ctx is None else {"context": ctx[:, : t + 1]}
            if behaviour is not None and getattr(policy, "needs_behaviour", False):
                kw["behaviour"] = behaviour(oracle.logits(state))
            a_np = np.asarray(policy.actions(t, y_hist[:, :t], lengths_b, a_off, a_on, **kw), dtype=np.int64)
            if a_np.shape != (RN,) or ((a_np < 0) | (a_np >= N_ITEMS)).any():
                raise ValueError(f"policy {getattr(policy, 'name', policy)!r} returned bad actions at t={t}")
            a = torch.from_numpy(np.array(a_np))
            p = torch.sigmoid(oracle.logits(state).gather(1, a[:, None])[:, 0] + off)
            sums.add(t, p.numpy())
            y = (noise_b[:, t] < p).long()
            y_hist[:, t] = y.numpy()
            state = oracle.step(state, a, y)
    return sums.values(R, n)


def replay(oracle: DKTOracle, T: np.ndarray, U: np.ndarray, offset: torch.Tensor) -> np.ndarray:
    """Outcomes from re-simulating the logged actions ``T`` [n, L] with the stored noise ``U`` [n, L].

    Returns:
        float32 ``[n, L]`` (padding steps are simulated too; the caller masks them).
    """
    n, L = T.shape
    T_t = torch.from_numpy(T)
    U_t = torch.from_numpy(U)
    state = oracle.init_state(n)
    out = np.zeros((n, L), dtype=np.float32)
    with torch.no_grad():
        for t in range(L):
            p = torch.sigmoid(oracle.logits(state).gather(1, T_t[:, t : t + 1])[:, 0] + offset)
            y = (U_t[:, t] < p).long()
            out[:, t] = y.numpy()
            state = oracle.step(state, T_t[:, t], y)
    return out

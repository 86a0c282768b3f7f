"""DKT-Synth: a semi-synthetic federated tutoring world with exact ground-truth counterfactuals.

Paper §IV-A / Table I: DKT-Synth is "derived from a pre-trained LSTM-DKT oracle" with |T| = 50 actions,
dx = 4, da = 1, 20,000 sequences of at most 50 steps. The paper publishes no generator; this module is ours
(design from ``../shared/research/causal-anchors.md`` §2.3, adapted to a 50-item action).

Structural model (one student ``i`` at site ``s``; all quantities are known to the simulator only)
-----------------------------------------------------------------------------------------------------
* Latents: ability ``θ_i ~ N(μθ_s, 1)`` and a hidden, site-local confounder ("motivation")
  ``u_i ~ N(μu_s, σu_s²)``. Neither is logged.
* ``X_i`` (dx = 4): ``x1 = θ + N(0, 0.6²)`` (prior-score proxy), ``x2 = 0.5 θ + N(0, 0.8²)`` (pre-test proxy),
  ``x3 ~ N(μx_s, 1)`` (a site-shifted covariate), ``x4 ~ Bernoulli(0.5)`` (a binary covariate).
* Knowledge state ``h_t``: the frozen DKT oracle's LSTM state after the interactions before ``t``;
  ``z_t = head(h_t)`` are its per-item logits.
* ``T_t ∈ {0..49}``: which item the tutor assigns at step ``t`` (the intervenable decision).
* ``Y_t``: correctness, ``P(Y_t = 1 | h_t, T_t = a) = σ(z_t[a] + βθ θ_i + βu u_i)``, realised with the student's
  common random number: ``Y_t = 1[U_it < p_t(a)]``.
* Treatment pathways (both real, both heterogeneous): the assigned item changes the *current* success
  probability (item difficulty vs current mastery, ``z_t[a]``) and *future* mastery through the LSTM update
  ``h_{t+1} = LSTM(h_t, emb(a, Y_t))`` (practice).
* ``A_t`` (da = 1): the normalised step index ``t / (L − 1)``. It is exogenous - not affected by any action,
  and lengths are drawn independently of actions - so a simulator may replay logged future context in rollouts.
* Lengths ``L_i ~ Uniform{min_len..L}`` (default ``min_len = ⌈L/2⌉``), independent of treatment; ``M`` marks the prefix.

Logging policy (time-varying confounding, strength γ)
-----------------------------------------------------
``π_b(a | H_t, θ_i, u_i, s) = (1 − K ε) · softmax_a(ℓ_t(a)) + ε`` with
``ℓ_t(a) = base_a + b_{s,a} + γ · d_a · r_it`` where ``d_a`` is the item's standardised difficulty (from the
oracle's reference population), ``r_it = c · tanh(r̃_it / c)`` with ``r̃_it = u_i + logit(mean_a m_t(a)) − logit(m_ref)``
the student's bounded "readiness" (hidden motivation plus current hidden mastery ``m_t(a) = σ(z_t[a] + βθ θ_i)``;
the cap ``c`` keeps every anchor a few per cent of support, so IPW stays usable), ``base_a`` a boost for two
designated items (so that the two anchors carry roughly 15-35 % of the logged steps each) and ``b_{s,a}`` a site-specific logging bias.
Ready students are given harder items: because the same ``u_i`` and mastery raise ``Y``, the naive contrast between
items is confounded. The tutor also never assigns an item the student already masters
(``m_t(a) ≥ mastery_cutoff``): with ``ε = 0`` this gives true zero-propensity cases (DESIGN trap 5, research note
§3.4); with ``ε > 0`` every action keeps propensity ≥ ε (``ε ≤ 1/K``; 0.02 would be the uniform policy at K = 50).
The logged ``P`` is the true propensity of the taken action.

Common random numbers (DESIGN trap 6)
-------------------------------------
Every student's uniform streams are drawn once from ``np.random.SeedSequence(seed).spawn(n_students)``:
``U[i, t]`` decides outcomes, ``V[i, t]`` the logged action. Counterfactual rollout ``r = 0`` re-uses ``U``; rollouts
``r ≥ 1`` use fresh uniforms from a counter-based hash of ``(seed, student, r, t)`` - the same for every policy and
every arm, so contrasts are paired. Ground truth is reported as *expected* probabilities averaged over rollouts.
Replaying the logged actions with ``U`` reproduces the logged outcomes exactly (float64 throughout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fcd_secure.data.dkt_synth.oracle import N_ITEMS, DKTOracle, load_oracle
from fcd_secure.data.schema import SiteDataset

Split = Literal["train", "test"]

PRESETS: dict[str, dict[str, Any]] = {
    # tests: generation + ground truth in about a second
    "tiny": dict(n_students=300, max_len=12, anchor_step=2, horizon=4, n_rollouts=8),
    # the main federated run (10 sites): ~2,400 training sequences of <= 30 steps. Horizon 10: practising the
    # harder anchor costs correctness now and pays later (per-step effect ~ -0.10, 0.0, +0.04, ... +0.12), so a
    # 10-step window gives a clearly non-zero ATE (~0.06) whose sign a one-step model gets wrong.
    "default": dict(n_students=3000, max_len=30, anchor_step=5, horizon=10, n_rollouts=32),
    # paper Table I: 20,000 sequences, L = 50
    "paper": dict(n_students=20000, max_len=50, anchor_step=10, horizon=10, n_rollouts=32),
}


class DKTSynthConfig(BaseModel):
    """Everything that determines a DKT-Synth world. Same config (incl. seed) -> the same numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = Field("default", description="name of the preset the config was built from (provenance only)")
    seed: int = Field(0, ge=0)
    n_students: int = Field(3000, ge=2)
    max_len: int = Field(30, ge=2, description="L: steps per sequence at most")
    min_len: int | None = Field(None, ge=1, description="shortest sequence; default ceil(L/2)")
    n_sites: int = Field(10, ge=1)
    dirichlet_alpha: float = Field(10.0, gt=0, description="site-size proportions ~ Dirichlet(alpha) (paper: 10)")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    gamma: float = Field(1.5, ge=0, description="confounding strength of the logging policy")
    epsilon: float = Field(0.002, ge=0, description="propensity floor per action, 0 <= eps <= 1/50")
    readiness_cap: float = Field(1.0, gt=0, description="readiness r is squashed to (-cap, cap) by cap*tanh(r/cap)")
    mastery_cutoff: float = Field(0.97, gt=0, le=1, description="the tutor skips items mastered beyond this")
    beta_theta: float = Field(0.8, description="weight of ability in the outcome logit")
    beta_u: float = Field(1.0, description="weight of the hidden confounder in the outcome logit")
    boost_hard: float = Field(3.5, description="base logit of the designated harder item (an anchor candidate)")
    boost_easy: float = Field(3.9, description="base logit of the designated easier item (an anchor candidate)")
    site_item_bias_sd: float = Field(0.2, ge=0)
    site_anchor_tilt_sd: float = Field(0.4, ge=0, description="site-specific tilt between the two designated items")
    anchor_step: int = Field(5, ge=0, description="t0 of true_effects")
    horizon: int = Field(10, ge=1, description="steps averaged by true_effects")
    n_rollouts: int = Field(32, ge=1)
    oracle_path: str | None = Field(None, description="weights file (default: the shipped, checksummed oracle)")

    @model_validator(mode="after")
    def _check(self) -> "DKTSynthConfig":
        if self.epsilon > 1.0 / N_ITEMS:
            raise ValueError(f"epsilon={self.epsilon} exceeds 1/{N_ITEMS}: a per-action floor above that is impossible")
        lo = self.resolved_min_len
        if lo > self.max_len:
            raise ValueError(f"min_len={lo} exceeds max_len={self.max_len}")
        if self.anchor_step >= lo:
            raise ValueError(f"anchor_step={self.anchor_step} must be < min_len={lo} so every student reaches it")
        if self.anchor_step + self.horizon > self.max_len:
            raise ValueError(f"anchor_step + horizon = {self.anchor_step + self.horizon} exceeds max_len={self.max_len}")
        per_site_min = 2
        if self.n_students < per_site_min * self.n_sites:
            raise ValueError(f"n_students={self.n_students} is too few for {self.n_sites} sites (>= 2 each)")
        return self

    @property
    def resolved_min_len(self) -> int:
        return self.min_len if self.min_len is not None else math.ceil(self.max_len / 2)

    @classmethod
    def from_preset(cls, name: str = "default", **overrides: Any) -> "DKTSynthConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown DKT-Synth preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(preset=name, **{**PRESETS[name], **overrides})


class PolicyLike(Protocol):
    def actions(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int) -> np.ndarray: ...


# -- noise -------------------------------------------------------------------------------------------------
def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def fresh_uniforms(seed: int, student_ids: np.ndarray, rollouts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Counter-based U(0,1) keyed by (seed, student, rollout, step): independent of batch shape and call order."""
    sid = np.asarray(student_ids, dtype=np.uint64)[:, None, None]
    r = np.asarray(rollouts, dtype=np.uint64)[None, :, None]
    t = np.asarray(steps, dtype=np.uint64)[None, None, :]
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed) ^ np.uint64(0xD1B54A32D192ED03))
        x = _splitmix64(key ^ _splitmix64(sid * np.uint64(0x9E3779B97F4A7C15) + r))
        x = _splitmix64(x ^ (t * np.uint64(0xC2B2AE3D27D4EB4F)))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # [n, R, S]


# -- reference population: item difficulty from the oracle itself ----------------------------------------
def reference_profile(model: DKTOracle, n: int = 2000, steps: int = 15, seed: int = 0) -> dict[str, np.ndarray]:
    """Mean success per item under uniformly random practice (steps 5..14): the oracle's own difficulty scale."""
    g = torch.Generator().manual_seed(seed)
    state = model.init_state(n)
    acc = torch.zeros(N_ITEMS, dtype=torch.float64)
    with torch.no_grad():
        for t in range(steps):
            p = torch.sigmoid(model.logits(state))
            if t >= 5:
                acc += p.mean(0)
            a = torch.randint(0, N_ITEMS, (n,), generator=g)
            y = (torch.rand(n, generator=g, dtype=torch.float64) < p.gather(1, a[:, None])[:, 0]).long()
            state = model.step(state, a, y)
    mean = (acc / (steps - 5)).numpy()
    lg = np.log(mean / (1 - mean))
    return {"mean_success": mean, "difficulty": -(lg - lg.mean()) / lg.std(), "m_ref": float(mean.mean())}


def behaviour_probs(
    cfg: DKTSynthConfig,
    z: torch.Tensor,
    theta: torch.Tensor,
    u: torch.Tensor,
    item_const: torch.Tensor,
    difficulty: torch.Tensor,
    logit_ref: float,
) -> torch.Tensor:
    """π_b(· | H_t) over the K items, shape [B, K] (module docstring, "Logging policy").

    ``z`` oracle logits [B, K]; ``theta``/``u`` per-row latents [B]; ``item_const`` = base_a + b_{s,a} per row [B, K].
    """
    K = z.shape[1]
    mastery = torch.sigmoid(z + cfg.beta_theta * theta[:, None])
    mbar = mastery.mean(1).clamp(1e-6, 1 - 1e-6)
    ready = u + torch.log(mbar / (1 - mbar)) - logit_ref
    # bounded readiness keeps overlap (every anchor keeps a few % of support) while γ sets the confounding
    ready = cfg.readiness_cap * torch.tanh(ready / cfg.readiness_cap)
    logits = item_const + cfg.gamma * difficulty[None, :] * ready[:, None]
    skip = mastery >= cfg.mastery_cutoff
    skip &= ~skip.all(dim=1, keepdim=True)  # never leave the tutor without an item
    logits = logits.masked_fill(skip, float("-inf"))
    return (1.0 - K * cfg.epsilon) * torch.softmax(logits, dim=1) + cfg.epsilon


@dataclass
class DKTSynthWorld:
    """A generated world: per-site datasets plus the structural model to answer do-queries (module docstring)."""

    cfg: DKTSynthConfig
    oracle: DKTOracle
    oracle_card: dict
    train: list[SiteDataset]
    test: list[SiteDataset]
    anchors: tuple[int, int]
    #: per-student latents and noise, indexed by global student id
    site_of: np.ndarray
    theta: np.ndarray
    u: np.ndarray
    lengths: np.ndarray
    U: np.ndarray
    T_all: np.ndarray
    Y_all: np.ndarray
    P_all: np.ndarray
    site_params: dict[str, np.ndarray]
    designated: tuple[int, int]
    profile: dict[str, np.ndarray]

    n_actions: int = N_ITEMS

    # -- small helpers -----------------------------------------------------------------------------------
    @property
    def anchor_step(self) -> int:
        return self.cfg.anchor_step

    @property
    def horizon(self) -> int:
        return self.cfg.horizon

    @property
    def n_sites(self) -> int:
        return self.cfg.n_sites

    @property
    def L(self) -> int:
        return self.cfg.max_len

    def student_ids(self, site: int | None, split: Split, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
        """Global student ids of ``rows`` of ``world.<split>[site]`` (all sites concatenated when ``site`` is None)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if site is None:
            if rows is not None:
                raise ValueError("rows needs a site")
            return np.concatenate([self.student_ids(s, split) for s in range(self.n_sites)])
        if not 0 <= site < self.n_sites:
            raise ValueError(f"site must be in [0, {self.n_sites}), got {site}")
        ids = (self.train if split == "train" else self.test)[site].meta["student_ids"]
        if rows is None:
            return ids
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(ids)):
            raise ValueError(f"rows out of range for {split} site {site} with {len(ids)} rows")
        return ids[rows]

    def _offset(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.cfg.beta_theta * self.theta[ids] + self.cfg.beta_u * self.u[ids])

    def _factual_state(self, ids: np.ndarray, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Oracle state after the logged interactions before ``t`` (padding steps are absorbed but never used)."""
        state = self.oracle.init_state(len(ids))
        T = torch.from_numpy(self.T_all[ids])
        Y = torch.from_numpy(self.Y_all[ids].astype(np.int64))
        with torch.no_grad():
            for s in range(t):
                state = self.oracle.step(state, T[:, s], Y[:, s])
        return state

    # -- ground truth --------------------------------------------------------------------------------------
    def outcome_probs_do(
        self, site: int, split: Split, rows: np.ndarray | list[int] | None, t: int, a: int | np.ndarray
    ) -> np.ndarray:
        """P(Y_t = 1 | factual history before t, do(T_t = a)) per row; NaN where step t is padding (t ≥ L_i).

        Exact (no Monte Carlo). ``a`` is one action or one per row.
        """
        ids = self.student_ids(site, split, rows)
        if not 0 <= t < self.L:
            raise ValueError(f"t must be in [0, {self.L}), got {t}")
        a_arr = np.asarray(a, dtype=np.int64)
        if a_arr.ndim not in (0, 1) or (a_arr.ndim == 1 and a_arr.shape != ids.shape):
            raise ValueError(f"a must be one action or one per row ({len(ids)}), got shape {a_arr.shape}")
        a_arr = np.broadcast_to(a_arr, ids.shape)
        if ((a_arr < 0) | (a_arr >= N_ITEMS)).any():
            raise ValueError(f"action out of range [0, {N_ITEMS})")
        state = self._factual_state(ids, t)
        with torch.no_grad():
            z = self.oracle.logits(state).gather(1, torch.from_numpy(a_arr.copy())[:, None])[:, 0]
            p = torch.sigmoid(z + self._offset(ids)).numpy()
        return np.where(t < self.lengths[ids], p, np.nan)

    def regime_outcome_probs(
        self,
        site: int | None,
        split: Split,
        rows: np.ndarray | list[int] | None,
        start: int,
        plan: np.ndarray | list[int],
        n_rollouts: int | None = None,
    ) -> np.ndarray:
        """E[Y_{start+h} | factual history before start, do(T_{start+h} = plan[h])], shape [n, H].

        ``plan`` is [H] (same for every row) or [n, H]. Expected probabilities averaged over rollouts (CRN for
        rollout 0, counter-based fresh noise after). Steps beyond a student's length are NaN.
        """
        ids = self.student_ids(site, split, rows)
        R = int(n_rollouts or self.cfg.n_rollouts)
        plan = np.asarray(plan, dtype=np.int64)
        H = plan.shape[-1]
        if plan.ndim == 1:
            plan = np.broadcast_to(plan, (len(ids), H))
        if plan.shape != (len(ids), H) or start < 0 or start + H > self.L:
            raise ValueError(f"plan must be [H] or [n={len(ids)}, H] with start + H <= L={self.L}")
        if ((plan < 0) | (plan >= N_ITEMS)).any():
            raise ValueError(f"plan holds actions outside [0, {N_ITEMS})")
        out = np.concatenate(
            [self._regime_chunk(c, start, plan[k], R) for k, c in _chunks(ids, R)], axis=0
        )
        steps = np.arange(start, start + H)
        valid = steps[None, :] < self.lengths[ids][:, None]
        return np.where(valid, out, np.nan)

    def _regime_chunk(self, ids: np.ndarray, start: int, plan: np.ndarray, R: int) -> np.ndarray:
        n, H = plan.shape
        steps = np.arange(start, start + H)
        noise = np.empty((n, R, H))
        noise[:, 0, :] = self.U[ids][:, start : start + H]
        if R > 1:
            noise[:, 1:, :] = fresh_uniforms(self.cfg.seed, ids, np.arange(1, R), steps)
        # batch layout: row b = r * n + i (rollout-major)
        h0, c0 = self._factual_state(ids, start)
        state = (h0.repeat(R, 1), c0.repeat(R, 1))
        off = self._offset(ids).repeat(R)
        noise_b = torch.from_numpy(noise.transpose(1, 0, 2).reshape(R * n, H))
        plan_b = torch.from_numpy(np.array(plan, dtype=np.int64)).repeat(R, 1)
        out = np.empty((n, H))
        with torch.no_grad():
            for h in range(H):
                a = plan_b[:, h]
                p = torch.sigmoid(self.oracle.logits(state).gather(1, a[:, None])[:, 0] + off)
                out[:, h] = p.reshape(R, n).mean(0).numpy()
                y = (noise_b[:, h] < p).long()
                state = self.oracle.step(state, a, y)
        return out

    def true_effects(
        self,
        site: int | None,
        split: Split = "test",
        rows: np.ndarray | list[int] | None = None,
        anchor: int | None = None,
        horizon: int | None = None,
        n_rollouts: int | None = None,
    ) -> np.ndarray:
        """τ_i = mean over valid h < horizon of E[Y_{t0+h} | H_t0, do(a_on)^H] − E[Y_{t0+h} | H_t0, do(a_off)^H].

        The "always-minus-never effect at an anchor step over a horizon" (research note §5, PEHE/ATE inputs);
        ``t0 = anchor`` (default ``world.anchor_step``), H = ``horizon`` (default ``world.horizon``); averaged over the
        steps that lie inside each student's sequence (presets guarantee all of them do).
        """
        t0 = self.anchor_step if anchor is None else int(anchor)
        H = self.horizon if horizon is None else int(horizon)
        a_off, a_on = self.anchors
        on = self.regime_outcome_probs(site, split, rows, t0, np.full(H, a_on), n_rollouts)
        off = self.regime_outcome_probs(site, split, rows, t0, np.full(H, a_off), n_rollouts)
        return _nanmean_rows(on - off)

    def true_policy_value(
        self,
        policy: PolicyLike,
        site: int | None = None,
        split: Split = "test",
        n_rollouts: int | None = None,
    ) -> tuple[float, float]:
        """V(π) = E_i[(1/L_i) Σ_t M_it E[Y^π_it]] from t = 0, and its Monte Carlo standard error across rollouts.

        Research note §5 ("per-step average success"). The policy sees ``(t, y_hist[B, t], lengths[B], a_off, a_on)``
        with B = students × rollouts; outcomes are sampled with CRN (rollout 0) and counter-based noise (r ≥ 1),
        the value uses expected success probabilities.
        """
        per = self.policy_value_per_rollout(policy, site, split, n_rollouts)
        value = float(per.mean())
        se = float(per.std(ddof=1) / math.sqrt(len(per))) if len(per) > 1 else float("nan")
        return value, se

    def policy_value_per_rollout(
        self, policy: PolicyLike, site: int | None = None, split: Split = "test", n_rollouts: int | None = None
    ) -> np.ndarray:
        """V(π) computed separately on each rollout, shape [R] (rows are laid out rollout-major: b = r * n + i)."""
        ids = self.student_ids(site, split)
        R = int(n_rollouts or self.cfg.n_rollouts)
        v = np.concatenate([self._policy_chunk(policy, c, R) for _, c in _chunks(ids, R)], axis=1)
        return v.mean(axis=1)

    def _policy_chunk(self, policy: PolicyLike, ids: np.ndarray, R: int) -> np.ndarray:
        """Per-student values [R, n] of one chunk of students."""
        n, L = len(ids), self.L
        noise = np.empty((n, R, L))
        noise[:, 0, :] = self.U[ids]
        if R > 1:
            noise[:, 1:, :] = fresh_uniforms(self.cfg.seed, ids, np.arange(1, R), np.arange(L))
        noise_b = torch.from_numpy(noise.transpose(1, 0, 2).reshape(R * n, L))
        lengths_b = np.tile(self.lengths[ids], R)
        off = self._offset(ids).repeat(R)
        state = self.oracle.init_state(R * n)
        y_hist = np.zeros((R * n, L), dtype=np.float32)
        a_off, a_on = self.anchors
        total = np.zeros(R * n)
        with torch.no_grad():
            for t in range(L):
                a_np = np.asarray(policy.actions(t, y_hist[:, :t], lengths_b, a_off, a_on), dtype=np.int64)
                if a_np.shape != (R * n,) or ((a_np < 0) | (a_np >= N_ITEMS)).any():
                    raise ValueError(f"policy {getattr(policy, 'name', policy)!r} returned bad actions at t={t}")
                a = torch.from_numpy(np.array(a_np))
                p = torch.sigmoid(self.oracle.logits(state).gather(1, a[:, None])[:, 0] + off)
                total += np.where(t < lengths_b, p.numpy(), 0.0)
                y = (noise_b[:, t] < p).long()
                y_hist[:, t] = y.numpy()
                state = self.oracle.step(state, a, y)
        return (total / lengths_b).reshape(R, n)

    def replay_logged(self, site: int, split: Split) -> np.ndarray:
        """Outcomes from re-simulating the logged actions with the stored noise U ([n, L], 0 on padding)."""
        ids = self.student_ids(site, split)
        T = torch.from_numpy(self.T_all[ids])
        U = torch.from_numpy(self.U[ids])
        off = self._offset(ids)
        state = self.oracle.init_state(len(ids))
        out = np.zeros((len(ids), self.L), dtype=np.float32)
        with torch.no_grad():
            for t in range(self.L):
                p = torch.sigmoid(self.oracle.logits(state).gather(1, T[:, t : t + 1])[:, 0] + off)
                y = (U[:, t] < p).long()
                out[:, t] = y.numpy()
                state = self.oracle.step(state, T[:, t], y)
        return out * (np.arange(self.L)[None, :] < self.lengths[ids][:, None])

    def logging_propensities(
        self, site: int | None, split: Split, items: list[int] | tuple[int, ...] | None = None
    ) -> np.ndarray:
        """The behaviour policy's true probabilities of ``items`` (default: the anchors) at every step, [n, L, k].

        Recomputed along the factual history; NaN on padding. With ``epsilon = 0`` some are exactly 0 (no support).
        """
        ids = self.student_ids(site, split)
        items = list(self.anchors if items is None else items)
        T = torch.from_numpy(self.T_all[ids])
        Y = torch.from_numpy(self.Y_all[ids].astype(np.int64))
        theta, u = torch.from_numpy(self.theta[ids]), torch.from_numpy(self.u[ids])
        const = torch.from_numpy(self.site_params["item_const"][self.site_of[ids]])
        d = torch.from_numpy(self.profile["difficulty"])
        idx = torch.tensor(items)
        out = np.full((len(ids), self.L, len(items)), np.nan)
        state = self.oracle.init_state(len(ids))
        with torch.no_grad():
            for t in range(self.L):
                z = self.oracle.logits(state)
                pi = behaviour_probs(self.cfg, z, theta, u, const, d, self.site_params["logit_ref"])
                out[:, t, :] = pi[:, idx].numpy()
                state = self.oracle.step(state, T[:, t], Y[:, t])
        valid = np.arange(self.L)[None, :] < self.lengths[ids][:, None]
        return np.where(valid[:, :, None], out, np.nan)

    # -- summaries -----------------------------------------------------------------------------------------
    def anchor_contrasts(self, split: Split = "train", t: int | None = None) -> dict[str, float]:
        """Naive, IPW (true propensities) and true one-step a_on − a_off contrasts from the logged data.

        With ``t`` given, only that step; otherwise pooled over every valid (i, t). The truth is the mean of
        ``outcome_probs_do(a_on) − outcome_probs_do(a_off)`` over the same (i, t) cells.
        """
        a_off, a_on = self.anchors
        ids = self.student_ids(None, split)
        T, Y, P = self.T_all[ids], self.Y_all[ids], self.P_all[ids]
        valid = np.arange(self.L)[None, :] < self.lengths[ids][:, None]
        if t is not None:
            valid = valid & (np.arange(self.L)[None, :] == t)
        probs = self._factual_probs(ids, [a_off, a_on], t_end=(self.L if t is None else t + 1))
        on, off = valid & (T == a_on), valid & (T == a_off)
        n_cells = valid.sum()
        naive = Y[on].mean() - Y[off].mean() if on.any() and off.any() else float("nan")
        # Hajek (self-normalised) IPW per arm: E[Y(a)] over the same cells, weights 1/π_b(a | H_t)
        ipw = (Y * on / P).sum() / (on / P).sum() - (Y * off / P).sum() / (off / P).sum()
        true = (probs[..., 1] - probs[..., 0])[valid].mean()
        return {"naive": float(naive), "ipw": float(ipw), "true": float(true), "cells": int(n_cells),
                "n_on": int(on.sum()), "n_off": int(off.sum())}

    def _factual_probs(self, ids: np.ndarray, items: list[int], t_end: int | None = None) -> np.ndarray:
        """[n, L, k] success probabilities of ``items`` at every step given the factual history (NaN after t_end)."""
        t_end = self.L if t_end is None else t_end
        out = np.full((len(ids), self.L, len(items)), np.nan)
        T = torch.from_numpy(self.T_all[ids])
        Y = torch.from_numpy(self.Y_all[ids].astype(np.int64))
        off = self._offset(ids)[:, None]
        idx = torch.tensor(items)
        state = self.oracle.init_state(len(ids))
        with torch.no_grad():
            for t in range(t_end):
                out[:, t, :] = torch.sigmoid(self.oracle.logits(state)[:, idx] + off).numpy()
                state = self.oracle.step(state, T[:, t], Y[:, t])
        return out

    def true_policy_values(
        self, policies: list[PolicyLike] | None = None, split: Split = "test", n_rollouts: int | None = None
    ) -> dict[str, dict[str, float]]:
        """``{name: {"value", "se"}}`` for the given policies (default: Never / Always / Early-on / Late-on)."""
        if policies is None:
            from fcd_secure.data.policy import default_policies

            policies = default_policies()
        out = {}
        for pol in policies:
            v, se = self.true_policy_value(pol, None, split, n_rollouts)
            out[str(getattr(pol, "name", type(pol).__name__))] = {"value": v, "se": se}
        return out

    def describe(self, n_rollouts: int | None = None, policy_values: bool = False) -> dict[str, Any]:
        """Sizes, anchors and their logged shares, γ, ε, naive vs IPW vs true contrasts, true ATE (and policy values)."""
        a_off, a_on = self.anchors
        ids = self.student_ids(None, "train")
        valid = np.arange(self.L)[None, :] < self.lengths[ids][:, None]
        T = self.T_all[ids]
        tau = self.true_effects(None, "test", n_rollouts=n_rollouts)
        by_site = []
        for ds in self.train:
            tv = ds.T[ds.M > 0]
            by_site.append({"a_off": float((tv == a_off).mean()), "a_on": float((tv == a_on).mean())})
        extra = {"true_policy_values_test": self.true_policy_values(n_rollouts=n_rollouts)} if policy_values else {}
        pi = self.logging_propensities(None, "train")
        support = {
            name: {
                "p01": float(np.nanquantile(pi[..., k], 0.01)),
                "median": float(np.nanmedian(pi[..., k])),
                "zero_cells": int((pi[..., k] == 0).sum()),
            }
            for k, name in enumerate(("a_off", "a_on"))
        }
        return {
            "preset": self.cfg.preset,
            "seed": self.cfg.seed,
            "n_sites": self.n_sites,
            "n_train": [d.n for d in self.train],
            "n_test": [d.n for d in self.test],
            "max_len": self.L,
            "mean_len": float(self.lengths.mean()),
            "n_actions": self.n_actions,
            "anchors": {"a_off": a_off, "a_on": a_on},
            "anchor_share_train": {"a_off": float((T[valid] == a_off).mean()), "a_on": float((T[valid] == a_on).mean())},
            "anchor_share_train_by_site": by_site,
            "anchor_propensity_train": support,
            "gamma": self.cfg.gamma,
            "epsilon": self.cfg.epsilon,
            "min_logged_propensity": float(self.P_all[ids][valid].min()),
            "mean_logged_y": float(self.Y_all[ids][valid].mean()),
            "anchor_step": self.anchor_step,
            "horizon": self.horizon,
            "one_step_contrast_train": self.anchor_contrasts("train"),
            "true_ate_test": float(np.mean(tau)),
            "true_effect_sd_test": float(np.std(tau)),
            "oracle_test_auc": self.oracle_card.get("test_auc"),
            **extra,
        }


#: rows (students x rollouts) per LSTM batch: large enough to vectorise, small enough to stay in cache/RAM
MAX_BATCH_ROWS = 16384


def _chunks(ids: np.ndarray, R: int):
    """(slice, ids[slice]) pieces so that len(piece) * R <= MAX_BATCH_ROWS. Noise is keyed per student, so
    chunking never changes a student's numbers."""
    step = max(1, MAX_BATCH_ROWS // max(R, 1))
    for s in range(0, len(ids), step):
        yield slice(s, s + step), ids[s : s + step]


def _nanmean_rows(a: np.ndarray) -> np.ndarray:
    out = np.full(a.shape[0], np.nan)
    ok = (~np.isnan(a)).any(axis=1)
    out[ok] = np.nanmean(a[ok], axis=1)
    return out


# -- generation ------------------------------------------------------------------------------------------
def _site_sizes(rng: np.random.Generator, n: int, n_sites: int, alpha: float) -> np.ndarray:
    """Dirichlet(α) proportions turned into sizes that sum to n, with at least 2 students per site."""
    prop = rng.dirichlet(np.full(n_sites, alpha))
    spare = n - 2 * n_sites
    raw = prop * spare
    sizes = np.floor(raw).astype(np.int64)
    rest = spare - sizes.sum()
    sizes[np.argsort(-(raw - sizes), kind="stable")[:rest]] += 1
    return sizes + 2


def generate(cfg: DKTSynthConfig | None = None) -> DKTSynthWorld:
    """Generate a DKT-Synth world (module docstring). Deterministic given ``cfg`` (including ``cfg.seed``)."""
    cfg = cfg or DKTSynthConfig()
    oracle, card = load_oracle(cfg.oracle_path)
    K, L, N, S = N_ITEMS, cfg.max_len, cfg.n_students, cfg.n_sites
    lo = cfg.resolved_min_len
    profile = reference_profile(oracle)
    ranking = np.argsort(profile["mean_success"], kind="stable")  # hardest first
    designated = (int(ranking[int(0.2 * K)]), int(ranking[int(0.8 * K)]))  # (harder item, easier item)

    # site-level parameters: their own stream, so they do not depend on n_students
    site_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))
    sizes = _site_sizes(site_rng, N, S, cfg.dirichlet_alpha)
    site_params = {
        "mu_theta": site_rng.normal(0.0, 0.3, S),
        "mu_u": site_rng.normal(0.0, 0.5, S),
        "sd_u": site_rng.uniform(0.5, 1.5, S),
        "mu_x3": site_rng.normal(0.0, 0.5, S),
        "item_bias": site_rng.normal(0.0, cfg.site_item_bias_sd, (S, K)),
        "anchor_tilt": site_rng.normal(0.0, cfg.site_anchor_tilt_sd, S),
        "sizes": sizes,
    }
    site_of = np.repeat(np.arange(S), sizes)

    # per-student streams (CRN): drawn once, reused by every policy
    kids = np.random.SeedSequence(cfg.seed).spawn(N)
    normals = np.empty((N, 5))
    unif = np.empty((N, 2 + 2 * L))
    for i, kid in enumerate(kids):
        g = np.random.default_rng(kid)
        normals[i] = g.standard_normal(5)
        unif[i] = g.random(2 + 2 * L)
    sp = site_params
    theta = sp["mu_theta"][site_of] + normals[:, 0]
    u = sp["mu_u"][site_of] + sp["sd_u"][site_of] * normals[:, 1]
    X = np.stack(
        [
            theta + 0.6 * normals[:, 2],
            0.5 * theta + 0.8 * normals[:, 3],
            sp["mu_x3"][site_of] + normals[:, 4],
            (unif[:, 0] < 0.5).astype(np.float64),
        ],
        axis=1,
    )
    lengths = lo + np.floor(unif[:, 1] * (L - lo + 1)).astype(np.int64)
    U = unif[:, 2 : 2 + L].copy()
    V = unif[:, 2 + L :]

    # logging policy pieces (module docstring)
    base = np.zeros(K)
    base[designated[0]] = cfg.boost_hard
    base[designated[1]] = cfg.boost_easy
    site_bias = sp["item_bias"].copy()
    site_bias[:, designated[0]] += sp["anchor_tilt"]
    site_bias[:, designated[1]] -= sp["anchor_tilt"]
    item_const = base[None, :] + site_bias  # [S, K]
    pol_const = torch.from_numpy(item_const[site_of])  # [N, K]
    d = torch.from_numpy(profile["difficulty"])
    logit_ref = math.log(profile["m_ref"] / (1 - profile["m_ref"]))
    theta_t, u_t = torch.from_numpy(theta), torch.from_numpy(u)
    off = torch.from_numpy(cfg.beta_theta * theta + cfg.beta_u * u)

    T = np.zeros((N, L), dtype=np.int64)
    Y = np.zeros((N, L), dtype=np.float64)
    P = np.ones((N, L), dtype=np.float64)
    state = oracle.init_state(N)
    with torch.no_grad():
        for t in range(L):
            z = oracle.logits(state)
            pi = behaviour_probs(cfg, z, theta_t, u_t, pol_const, d, logit_ref)
            cdf = pi.cumsum(1)
            # inverse-CDF draw; zero-probability items have zero-width intervals and are never chosen
            v = torch.from_numpy(V[:, t])[:, None] * cdf[:, -1:]
            a = (cdf <= v).sum(1).clamp(max=K - 1)
            p_taken = pi.gather(1, a[:, None])[:, 0]
            p = torch.sigmoid(z.gather(1, a[:, None])[:, 0] + off)
            y = (torch.from_numpy(U[:, t]) < p).long()
            T[:, t], Y[:, t], P[:, t] = a.numpy(), y.numpy(), p_taken.numpy()
            state = oracle.step(state, a, y)

    M = (np.arange(L)[None, :] < lengths[:, None]).astype(np.float32)
    T = T * M.astype(np.int64)
    Y = Y * M
    P = np.where(M > 0, P, 1.0)
    A = (np.arange(L, dtype=np.float32)[None, :, None] / max(L - 1, 1)) * M[:, :, None]

    # train/test split per site, then anchors = the two most-logged actions over all training steps
    split_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 2]))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    train_ids, test_ids = [], []
    for s in range(S):
        ids = starts[s] + split_rng.permutation(sizes[s])
        n_test = min(max(1, int(round(cfg.test_fraction * sizes[s]))), sizes[s] - 1)
        test_ids.append(np.sort(ids[:n_test]))
        train_ids.append(np.sort(ids[n_test:]))
    all_train = np.concatenate(train_ids)
    counts = np.bincount(T[all_train][M[all_train] > 0], minlength=K)
    order = np.lexsort((np.arange(K), -counts))
    anchors = (int(order[0]), int(order[1]))

    feature_names = ["prior_score_proxy", "pretest_proxy", "site_covariate", "binary_covariate"]

    def site_ds(s: int, ids: np.ndarray, split: str) -> SiteDataset:
        return SiteDataset(
            X=X[ids].astype(np.float32),
            A=A[ids],
            T=T[ids],
            Y=Y[ids].astype(np.float32),
            M=M[ids],
            P=P[ids].astype(np.float32),
            n_actions=K,
            name=f"dkt_synth/site{s}/{split}",
            meta={
                "dataset": "dkt_synth",
                "site": s,
                "split": split,
                "student_ids": ids,
                "x_names": feature_names,
                "a_names": ["step_index_normalised"],
                "preset": cfg.preset,
                "seed": cfg.seed,
            },
        )

    return DKTSynthWorld(
        cfg=cfg,
        oracle=oracle,
        oracle_card=card,
        train=[site_ds(s, train_ids[s], "train") for s in range(S)],
        test=[site_ds(s, test_ids[s], "test") for s in range(S)],
        anchors=anchors,
        site_of=site_of,
        theta=theta,
        u=u,
        lengths=lengths,
        U=U,
        T_all=T,
        Y_all=Y,
        P_all=P,
        site_params={**site_params, "item_const": item_const, "logit_ref": logit_ref},
        designated=designated,
        profile=profile,
    )

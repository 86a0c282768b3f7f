"""The DKT-Synth world object: per-site datasets plus the hidden structural model that answers do-queries.

:func:`~fcd_secure.data.dkt_synth.generation.generate` builds a :class:`DKTSynthWorld`; the rest of the code uses its
sites (``train``, ``test``, ``anchors``) and its ground truth. The queries name students by site, split and row
(:meth:`DKTSynthWorld.student_ids`) and are answered by the kernels of :mod:`.truth` (outcome model) and
:mod:`.behaviour` (logging propensities), with the noise of :mod:`.noise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fcd_secure.data.dkt_synth import truth
from fcd_secure.data.dkt_synth.behaviour import logging_probs_along
from fcd_secure.data.dkt_synth.config import DKTSynthConfig, Split
from fcd_secure.data.dkt_synth.noise import rollout_noise
from fcd_secure.data.dkt_synth.oracle import N_ITEMS, DKTOracle
from fcd_secure.data.policy import PolicyLike, anchor_regime_support, bind_policy, default_policies
from fcd_secure.data.schema import SiteDataset

__all__ = ["DKTSynthWorld", "clock_context"]


def clock_context(valid: np.ndarray) -> np.ndarray:
    """DKT-Synth's one context column A_t = t / (L − 1) on valid steps, 0 on padding: float32 ``[n, L, 1]`` from the
    valid-step mask ``[n, L]``. Exogenous: no action changes the clock."""
    L = valid.shape[1]
    return (np.arange(L, dtype=np.float32)[None, :, None] / max(L - 1, 1)) * np.asarray(valid, np.float32)[:, :, None]


@dataclass
class DKTSynthWorld:
    """A generated world: per-site datasets plus the structural model to answer do-queries (package docstring).

    Per-student arrays are indexed by the global student id (``meta['student_ids']`` of each site dataset).
    """

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
        """Global student ids of ``rows`` of ``world.<split>[site]`` (all sites concatenated when ``site`` is None).

        Raises:
            ValueError: Bad split, site or rows (``rows`` needs a site).
        """
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
        """``βθ θ_i + βu u_i``: the student's constant shift of every outcome logit."""
        return torch.from_numpy(self.cfg.beta_theta * self.theta[ids] + self.cfg.beta_u * self.u[ids])

    def _valid(self, ids: np.ndarray) -> np.ndarray:
        return np.arange(self.L)[None, :] < self.lengths[ids][:, None]

    # -- ground truth --------------------------------------------------------------------------------------
    def outcome_probs_do(
        self, site: int, split: Split, rows: np.ndarray | list[int] | None, t: int, a: int | np.ndarray
    ) -> np.ndarray:
        """P(Y_t = 1 | factual history before t, do(T_t = a)) per row; NaN where step t is padding (t ≥ L_i).

        Exact (no Monte Carlo).

        Args:
            site: Site index.
            split: "train" or "test".
            rows: Rows of that site's dataset (None: all).
            t: The step.
            a: One action, or one per row.

        Raises:
            ValueError: ``t``, ``a`` or the rows are out of range.
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
        state = truth.factual_state(self.oracle, self.T_all[ids], self.Y_all[ids], t)
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

        Expected probabilities averaged over rollouts (the logged noise for rollout 0, counter-based fresh noise
        after: :mod:`.noise`). Steps beyond a student's length are NaN.

        Args:
            site: Site index, or None for all sites.
            split: "train" or "test".
            rows: Rows of the site's dataset (None: all).
            start: First intervened step.
            plan: Actions ``[H]`` (same for every row) or ``[n, H]``.
            n_rollouts: Monte Carlo rollouts (default ``cfg.n_rollouts``).

        Raises:
            ValueError: The plan's shape or actions are out of range.
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
        steps = np.arange(start, start + H)
        parts = []
        for k, c in truth.chunks(ids, R):
            state = truth.factual_state(self.oracle, self.T_all[c], self.Y_all[c], start)
            noise = rollout_noise(self.cfg.seed, self.U[c][:, start : start + H], c, R, steps)
            parts.append(truth.regime_probs(self.oracle, state, self._offset(c), plan[k], noise))
        out = np.concatenate(parts, axis=0)
        valid = steps[None, :] < self.lengths[ids][:, None]
        return np.where(valid, out, np.nan)

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

        The always-minus-never effect at an anchor step over a horizon (the input of PEHE and ATE error);
        ``t0 = anchor`` (default ``world.anchor_step``), H = ``horizon`` (default ``world.horizon``); averaged over the
        steps that lie inside each student's sequence (presets guarantee all of them do).

        Returns:
            float64 ``[n]``.
        """
        t0 = self.anchor_step if anchor is None else int(anchor)
        H = self.horizon if horizon is None else int(horizon)
        a_off, a_on = self.anchors
        on = self.regime_outcome_probs(site, split, rows, t0, np.full(H, a_on), n_rollouts)
        off = self.regime_outcome_probs(site, split, rows, t0, np.full(H, a_off), n_rollouts)
        return truth.nanmean_rows(on - off)

    def true_policy_value(
        self,
        policy: PolicyLike,
        site: int | None = None,
        split: Split = "test",
        n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> tuple[float, float]:
        """V(π) = E_i[(1/H_i) Σ_{t<H_i} E[Y^π_it]] from t = 0 (per-step average success over the first
        H_i = min(L_i, horizon) steps; every valid step by default), and its Monte Carlo SE.

        The policy sees ``(t, y_hist[B, t], lengths[B], a_off, a_on)`` with B = students × rollouts; outcomes are
        sampled with the logged noise (rollout 0) and counter-based noise (r ≥ 1), the value uses expected success
        probabilities. A declarative policy is bound to the world's action labels (``item k``) and context column.

        Returns:
            ``(value, standard error across rollouts)``; the SE is NaN with one rollout.
        """
        per = self.policy_value_per_rollout(policy, site, split, n_rollouts, horizon)
        value = float(per.mean())
        se = float(per.std(ddof=1) / math.sqrt(len(per))) if len(per) > 1 else float("nan")
        return value, se

    def policy_value_per_rollout(
        self, policy: PolicyLike, site: int | None = None, split: Split = "test", n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> np.ndarray:
        """V(π) computed separately on each rollout, shape [R] (rows are laid out rollout-major: b = r * n + i)."""
        return self.policy_values_per_student(policy, site, split, n_rollouts, horizon).mean(axis=1)

    def policy_values_per_student(
        self, policy: PolicyLike, site: int | None = None, split: Split = "test", n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> np.ndarray:
        """Each student's true value of ``policy`` per rollout, float64 ``[R, n]`` (students in ``student_ids``
        order; see :meth:`true_policy_value`)."""
        ids = self.student_ids(site, split)
        R = int(n_rollouts or self.cfg.n_rollouts)
        steps = np.arange(self.L)
        policy = bind_policy(policy, self.train[0])
        parts = []
        for _, c in truth.chunks(ids, R):
            noise = rollout_noise(self.cfg.seed, self.U[c], c, R, steps)
            off = self._offset(c)
            parts.append(truth.policy_values(self.oracle, policy, off, self.lengths[c], noise, self.anchors,
                                             horizon=horizon, contexts=clock_context(self._valid(c))))
        return np.concatenate(parts, axis=1)

    def replay_logged(self, site: int, split: Split) -> np.ndarray:
        """Outcomes from re-simulating the logged actions with the stored noise U ([n, L], 0 on padding)."""
        ids = self.student_ids(site, split)
        out = truth.replay(self.oracle, self.T_all[ids], self.U[ids], self._offset(ids))
        return out * self._valid(ids)

    def logging_propensities(
        self, site: int | None, split: Split, items: list[int] | tuple[int, ...] | None = None
    ) -> np.ndarray:
        """The behaviour policy's true probabilities of ``items`` (default: the anchors) at every step, [n, L, k].

        Recomputed along the factual history; NaN on padding. With ``epsilon = 0`` some are exactly 0 (no support).
        """
        ids = self.student_ids(site, split)
        out = logging_probs_along(
            self.oracle, self.cfg, self.T_all[ids], self.Y_all[ids], self.theta[ids], self.u[ids],
            self.site_params["item_const"][self.site_of[ids]], self.profile["difficulty"],
            self.site_params["logit_ref"], list(self.anchors if items is None else items),
        )
        return np.where(self._valid(ids)[:, :, None], out, np.nan)

    # -- summaries -----------------------------------------------------------------------------------------
    def anchor_contrasts(self, split: Split = "train", t: int | None = None) -> dict[str, float]:
        """Naive, IPW (true propensities) and true one-step a_on − a_off contrasts from the logged data.

        With ``t`` given, only that step; otherwise pooled over every valid (i, t). The truth is the mean of
        ``outcome_probs_do(a_on) − outcome_probs_do(a_off)`` over the same (i, t) cells.
        """
        a_off, a_on = self.anchors
        ids = self.student_ids(None, split)
        T, Y, P = self.T_all[ids], self.Y_all[ids], self.P_all[ids]
        valid = self._valid(ids)
        if t is not None:
            valid = valid & (np.arange(self.L)[None, :] == t)
        t_end = self.L if t is None else t + 1
        probs = truth.factual_probs(self.oracle, T, self.Y_all[ids], self._offset(ids), [a_off, a_on], t_end)
        on, off = valid & (T == a_on), valid & (T == a_off)
        n_cells = valid.sum()
        naive = Y[on].mean() - Y[off].mean() if on.any() and off.any() else float("nan")
        # Hajek (self-normalised) IPW per arm: E[Y(a)] over the same cells, weights 1/π_b(a | H_t)
        ipw = (Y * on / P).sum() / (on / P).sum() - (Y * off / P).sum() / (off / P).sum()
        true = (probs[..., 1] - probs[..., 0])[valid].mean()
        return {"naive": float(naive), "ipw": float(ipw), "true": float(true), "cells": int(n_cells),
                "n_on": int(on.sum()), "n_off": int(off.sum())}

    def true_policy_values(
        self, policies: list[PolicyLike] | None = None, split: Split = "test", n_rollouts: int | None = None
    ) -> dict[str, dict[str, float]]:
        """``{name: {"value", "se"}}`` for the given policies (default: Never / Always / Early-on / Late-on)."""
        out = {}
        for pol in default_policies() if policies is None else policies:
            v, se = self.true_policy_value(pol, None, split, n_rollouts)
            out[str(getattr(pol, "name", type(pol).__name__))] = {"value": v, "se": se}
        return out

    def describe(self, n_rollouts: int | None = None, policy_values: bool = False) -> dict[str, Any]:
        """Sizes, anchors and their logged shares, γ, ε, naive vs IPW vs true contrasts, true ATE (and policy values).

        Returns:
            Plain JSON-able numbers (``fcd data describe``, docs).
        """
        a_off, a_on = self.anchors
        ids = self.student_ids(None, "train")
        valid = self._valid(ids)
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
            "regime_support_train": anchor_regime_support(T, valid, (a_off, a_on), self.anchor_step, self.horizon),
            "true_ate_test": float(np.mean(tau)),
            "true_effect_sd_test": float(np.std(tau)),
            "oracle_test_auc": self.oracle_card.get("test_auc"),
            **extra,
        }

"""The tumour world object: per-site datasets plus the hidden PK-PD model that answers do-queries.

:func:`~fcd_secure.data.tumour.generation.generate` builds a :class:`TumourWorld`; the rest of the code uses its sites
(``train``, ``test``, ``anchors``) and its ground truth, through the same interface as
:class:`~fcd_secure.data.dkt_synth.world.DKTSynthWorld` (``anchor_step``, ``horizon``, ``true_effects``,
``true_policy_value``, ``replay_logged``, ``logging_propensities``, ``describe``). The queries name patients by site,
split and row (:meth:`TumourWorld.patient_ids`) and are answered by the kernels of :mod:`.truth` with the noise of
:mod:`.noise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure.data.policy import PolicyLike, anchor_regime_support, bind_policy, default_policies
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.tumour import truth
from fcd_secure.data.tumour.behaviour import action_probs, recent_mean
from fcd_secure.data.tumour.config import Split, TumourConfig
from fcd_secure.data.tumour.noise import rollout_normals
from fcd_secure.data.tumour.pkpd import (
    ACTION_LABELS,
    N_ACTIONS,
    STAGES,
    V_DEATH,
    PatientParams,
    diameter_of,
    response_prob,
    volume_of,
)

__all__ = ["TumourWorld"]


@dataclass
class TumourWorld:
    """A generated world: per-site datasets plus the PK-PD model to answer do-queries (package docstring).

    Per-patient arrays are indexed by the global patient id (``meta['entity']`` of each site dataset).
    """

    cfg: TumourConfig
    train: list[SiteDataset]
    test: list[SiteDataset]
    anchors: tuple[int, int]
    #: per-patient latents, noise and the logged trajectory, indexed by global patient id
    site_of: np.ndarray
    stage: np.ndarray
    patient_type: np.ndarray
    params: PatientParams
    lengths: np.ndarray
    Z: np.ndarray
    #: logged volumes V_0..V_L (V_{t+1} follows day t's action) and chemotherapy concentration after day t's dose
    V_all: np.ndarray
    C_all: np.ndarray
    T_all: np.ndarray
    Y_all: np.ndarray
    P_all: np.ndarray
    site_params: dict[str, np.ndarray]

    n_actions: int = N_ACTIONS

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

    @property
    def v_response(self) -> float:
        """The response volume: a tumour of ``cfg.response_diameter`` cm across."""
        return float(volume_of(self.cfg.response_diameter))

    def patient_ids(self, site: int | None, split: Split, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
        """Global patient ids of ``rows`` of ``world.<split>[site]`` (all sites concatenated when ``site`` is None).

        Raises:
            ValueError: Bad split, site or rows (``rows`` needs a site).
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if site is None:
            if rows is not None:
                raise ValueError("rows needs a site")
            return np.concatenate([self.patient_ids(s, split) for s in range(self.n_sites)])
        if not 0 <= site < self.n_sites:
            raise ValueError(f"site must be in [0, {self.n_sites}), got {site}")
        ids = (self.train if split == "train" else self.test)[site].meta["entity"]
        if rows is None:
            return ids
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(ids)):
            raise ValueError(f"rows out of range for {split} site {site} with {len(ids)} rows")
        return ids[rows]

    def _ids(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """``ids`` as int64 global patient ids.

        Raises:
            ValueError: An id outside ``[0, n_patients)``.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.n_patients):
            raise ValueError(f"patient ids must lie in [0, {self.cfg.n_patients})")
        return ids

    def _valid(self, ids: np.ndarray) -> np.ndarray:
        return np.arange(self.L)[None, :] < self.lengths[ids][:, None]

    def _state(self, ids: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        """``(V_t, C_{t-1})`` after the logged history before day ``t``."""
        return self.V_all[ids, t], (self.C_all[ids, t - 1] if t > 0 else np.zeros(len(ids)))

    def _check_plan(self, ids: np.ndarray, start: int, plan: np.ndarray | list[int]) -> np.ndarray:
        plan = np.asarray(plan, dtype=np.int64)
        H = plan.shape[-1]
        if plan.ndim == 1:
            plan = np.broadcast_to(plan, (len(ids), H))
        if plan.shape != (len(ids), H) or start < 0 or start + H > self.L:
            raise ValueError(f"plan must be [H] or [n={len(ids)}, H] with start + H <= L={self.L}")
        if ((plan < 0) | (plan >= N_ACTIONS)).any():
            raise ValueError(f"plan holds actions outside [0, {N_ACTIONS})")
        return plan

    # -- ground truth --------------------------------------------------------------------------------------
    def outcome_probs_do(
        self, site: int, split: Split, rows: np.ndarray | list[int] | None, t: int, a: int | np.ndarray
    ) -> np.ndarray:
        """P(Y_t = 1 | factual history before t, do(T_t = a)) per row; NaN where day t is padding. Exact.

        Raises:
            ValueError: ``t``, ``a`` or the rows are out of range.
        """
        ids = self.patient_ids(site, split, rows)
        if not 0 <= t < self.L:
            raise ValueError(f"t must be in [0, {self.L}), got {t}")
        a_arr = np.asarray(a, dtype=np.int64)
        if a_arr.ndim not in (0, 1) or (a_arr.ndim == 1 and a_arr.shape != ids.shape):
            raise ValueError(f"a must be one action or one per row ({len(ids)}), got shape {a_arr.shape}")
        a_arr = np.broadcast_to(a_arr, ids.shape)
        if ((a_arr < 0) | (a_arr >= N_ACTIONS)).any():
            raise ValueError(f"action out of range [0, {N_ACTIONS})")
        V, C = self._state(ids, t)
        p = response_prob(self.params.take(ids), V, C, a_arr, self.cfg.noise_sd, self.v_response)
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

        Averaged over rollouts (the logged noise for rollout 0, counter-based fresh noise after: :mod:`.noise`).
        Days beyond a patient's length are NaN.

        Raises:
            ValueError: The plan's shape or actions are out of range.
        """
        return self.regime_outcome_probs_of(self.patient_ids(site, split, rows), start, plan, n_rollouts)

    def regime_outcome_probs_of(
        self, ids: np.ndarray, start: int, plan: np.ndarray | list[int], n_rollouts: int | None = None
    ) -> np.ndarray:
        """:meth:`regime_outcome_probs` of the patients with global ids ``ids``."""
        ids = self._ids(ids)
        R = int(n_rollouts or self.cfg.n_rollouts)
        plan = self._check_plan(ids, start, plan)
        H = plan.shape[1]
        steps = np.arange(start, start + H)
        parts = []
        for k, c in truth.chunks(ids, R):
            V, C = self._state(c, start)
            noise = rollout_normals(self.cfg.seed, self.Z[c][:, start : start + H], c, R, steps)
            parts.append(truth.regime(self.params.take(c), V, C, plan[k], noise, self.cfg.noise_sd,
                                      self.v_response)[0])
        out = np.concatenate(parts, axis=0) if parts else np.empty((0, H))
        valid = steps[None, :] < self.lengths[ids][:, None]
        return np.where(valid, out, np.nan)

    def counterfactual_volumes(self, ids: np.ndarray, start: int, plan: np.ndarray | list[int]) -> np.ndarray:
        """The counterfactual volumes (cm³) of patients ``ids`` under ``plan`` from day ``start``:
        ``V_start, ..., V_{start+H}``, float64 [n, H+1].

        Unit-level, with each patient's own logged noise (the CRN convention of RMSN/CRN/CT's τ-step-ahead
        counterfactuals): with the logged actions as the plan this is the logged volume path. Days beyond a
        patient's length are simulated as well (lengths do not depend on treatment).

        Raises:
            ValueError: The plan's shape or actions (or an id) are out of range.
        """
        ids = self._ids(ids)
        plan = self._check_plan(ids, start, plan)
        V, C = self._state(ids, start)
        noise = self.Z[ids][:, start : start + plan.shape[1]]
        return truth.regime(self.params.take(ids), V, C, plan, noise, self.cfg.noise_sd, self.v_response)[1]

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

        The always-minus-never effect at an anchor day over a horizon (the input of PEHE and ATE error);
        ``t0 = anchor`` (default ``world.anchor_step``), H = ``horizon`` (default ``world.horizon``).

        Returns:
            float64 ``[n]``.
        """
        return self.effects_of(self.patient_ids(site, split, rows), anchor, horizon, n_rollouts)

    def effects_of(
        self, ids: np.ndarray, anchor: int | None = None, horizon: int | None = None, n_rollouts: int | None = None
    ) -> np.ndarray:
        """:meth:`true_effects` of the patients with global ids ``ids``."""
        t0 = self.anchor_step if anchor is None else int(anchor)
        H = self.horizon if horizon is None else int(horizon)
        a_off, a_on = self.anchors
        on = self.regime_outcome_probs_of(ids, t0, np.full(H, a_on), n_rollouts)
        off = self.regime_outcome_probs_of(ids, t0, np.full(H, a_off), n_rollouts)
        return truth.nanmean_rows(on - off)

    def true_policy_value(
        self,
        policy: PolicyLike,
        site: int | None = None,
        split: Split = "test",
        n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> tuple[float, float]:
        """V(π) = E_i[(1/H_i) Σ_{t<H_i} E[Y^π_it]] from day 0 (the share of days the tumour is within the response
        size, over the first H_i = min(L_i, horizon) days), and its Monte Carlo SE.

        A declarative policy is bound to the world's action labels (none, chemo, radio, both) and context columns;
        a policy that reads a context sees the volumes and diameters simulated under itself.

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
        """V(π) computed separately on each rollout, shape [R]."""
        return self.policy_values_per_patient(policy, site, split, n_rollouts, horizon).mean(axis=1)

    def policy_values_per_patient(
        self, policy: PolicyLike, site: int | None = None, split: Split = "test", n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> np.ndarray:
        """Each patient's true value of ``policy`` per rollout, float64 ``[R, n]`` (patients in ``patient_ids``
        order; see :meth:`true_policy_value`)."""
        return self.policy_values_of(policy, self.patient_ids(site, split), n_rollouts, horizon)

    def policy_values_of(
        self, policy: PolicyLike, ids: np.ndarray, n_rollouts: int | None = None, horizon: int | None = None
    ) -> np.ndarray:
        """:meth:`policy_values_per_patient` of the patients with global ids ``ids``, float64 ``[R, n]``."""
        ids = self._ids(ids)
        R = int(n_rollouts or self.cfg.n_rollouts)
        steps = np.arange(self.L)
        policy = bind_policy(policy, self.train[0])
        parts = []
        for _, c in truth.chunks(ids, R):
            noise = rollout_normals(self.cfg.seed, self.Z[c], c, R, steps)
            parts.append(truth.policy_values(self.params.take(c), self.V_all[c, 0], policy, self.lengths[c], noise,
                                             self.anchors, self.cfg.noise_sd, self.v_response, horizon=horizon))
        return np.concatenate(parts, axis=1) if parts else np.empty((R, 0))

    def replay_logged(self, site: int, split: Split) -> np.ndarray:
        """Outcomes from re-simulating the logged actions with the stored noise ([n, L], 0 on padding)."""
        ids = self.patient_ids(site, split)
        Y, _ = truth.replay(self.params.take(ids), self.V_all[ids, 0], self.T_all[ids], self.Z[ids],
                            self.cfg.noise_sd, self.v_response)
        return Y * self._valid(ids)

    def logging_propensities(
        self, site: int | None, split: Split, actions: list[int] | tuple[int, ...] | None = None
    ) -> np.ndarray:
        """The behaviour policy's true probabilities of ``actions`` (default: the anchors) on every day, [n, L, k].

        Recomputed along the factual history (the logged diameters); NaN on padding.
        """
        ids = self.patient_ids(site, split)
        sp = self.site_params
        D = diameter_of(self.V_all[ids, : self.L])
        out = np.stack([
            action_probs(self.cfg, recent_mean(D[:, : t + 1], self.cfg.window), sp["chemo_shift"][self.site_of[ids]],
                         sp["radio_shift"][self.site_of[ids]])
            for t in range(self.L)
        ], axis=1)[:, :, list(self.anchors if actions is None else actions)]
        return np.where(self._valid(ids)[:, :, None], out, np.nan)

    # -- summaries -----------------------------------------------------------------------------------------
    def anchor_contrasts(self, split: Split = "train", t: int | None = None) -> dict[str, float]:
        """Naive, IPW (true propensities) and true one-day a_on − a_off contrasts from the logged data.

        With ``t`` given, only that day; otherwise pooled over every valid (i, t). The truth is the mean of
        ``P(Y_t | history, do(a_on)) − P(Y_t | history, do(a_off))`` over the same (i, t) cells.
        """
        a_off, a_on = self.anchors
        ids = self.patient_ids(None, split)
        T, Y, P = self.T_all[ids], self.Y_all[ids], self.P_all[ids]
        valid = self._valid(ids)
        if t is not None:
            valid = valid & (np.arange(self.L)[None, :] == t)
        rows, days = np.nonzero(valid)
        pid = ids[rows]
        V = self.V_all[pid, days]
        C = np.where(days > 0, self.C_all[pid, np.maximum(days - 1, 0)], 0.0)
        prm = self.params.take(pid)
        p_on = response_prob(prm, V, C, np.full(len(pid), a_on), self.cfg.noise_sd, self.v_response)
        p_off = response_prob(prm, V, C, np.full(len(pid), a_off), self.cfg.noise_sd, self.v_response)
        on, off = valid & (T == a_on), valid & (T == a_off)
        naive = Y[on].mean() - Y[off].mean() if on.any() and off.any() else float("nan")
        # Hajek (self-normalised) IPW per arm: E[Y(a)] over the same cells, weights 1/π_b(a | H_t)
        ipw = (Y * on / P).sum() / (on / P).sum() - (Y * off / P).sum() / (off / P).sum()
        return {"naive": float(naive), "ipw": float(ipw), "true": float((p_on - p_off).mean()),
                "cells": int(valid.sum()), "n_on": int(on.sum()), "n_off": int(off.sum())}

    def true_policy_values(
        self, policies: list[PolicyLike] | None = None, split: Split = "test", n_rollouts: int | None = None
    ) -> dict[str, dict[str, float]]:
        """``{name: {"value", "se"}}`` for the given policies (default: Never / Always / Early-on / Late-on)."""
        out = {}
        for pol in default_policies() if policies is None else policies:
            v, se = self.true_policy_value(pol, None, split, n_rollouts)
            out[str(getattr(pol, "name", type(pol).__name__))] = {"value": v, "se": se}
        return out

    def describe(self, n_rollouts: int | None = None, policy_values: bool = True) -> dict[str, Any]:
        """Sizes, anchors and their logged shares, γ, ε, each site's case mix and practice, naive vs IPW vs true
        one-day contrasts, the true ATE and (by default) the true values of the paper's four policies.

        Returns:
            Plain JSON-able numbers (``fcd data describe --json`` shows them under ``oracle``).
        """
        a_off, a_on = self.anchors
        ids = self.patient_ids(None, "train")
        valid = self._valid(ids)
        T = self.T_all[ids]
        tau = self.true_effects(None, "test", n_rollouts=n_rollouts)
        sites = []
        for s, ds in enumerate(self.train):
            pid = np.concatenate([ds.meta["entity"], self.test[s].meta["entity"]])
            tv = ds.T[ds.M > 0]
            sites.append({
                "site": s,
                "stage_share": {k: float((self.stage[pid] == i).mean()) for i, k in enumerate(STAGES)},
                "mean_initial_diameter_cm": float(diameter_of(self.V_all[pid, 0]).mean()),
                "action_share": {k: float((tv == i).mean()) for i, k in enumerate(ACTION_LABELS)},
                "chemo_shift": float(self.site_params["chemo_shift"][s]),
                "radio_shift": float(self.site_params["radio_shift"][s]),
            })
        extra = {"true_policy_values_test": self.true_policy_values(n_rollouts=n_rollouts)} if policy_values else {}
        pi = self.logging_propensities(None, "train")
        support = {
            name: {"p01": float(np.nanquantile(pi[..., k], 0.01)), "median": float(np.nanmedian(pi[..., k]))}
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
            "action_labels": list(ACTION_LABELS),
            "anchors": {"a_off": a_off, "a_on": a_on, "a_off_label": ACTION_LABELS[a_off],
                        "a_on_label": ACTION_LABELS[a_on]},
            "action_share_train": {k: float((T[valid] == i).mean()) for i, k in enumerate(ACTION_LABELS)},
            "anchor_propensity_train": support,
            "gamma": self.cfg.gamma,
            "epsilon": self.cfg.epsilon,
            "min_logged_propensity": float(self.P_all[ids][valid].min()),
            "response_diameter_cm": self.cfg.response_diameter,
            "mean_logged_y": float(self.Y_all[ids][valid].mean()),
            "mean_volume_normalised": float((self.V_all[ids, : self.L][valid] / V_DEATH).mean()),
            "anchor_step": self.anchor_step,
            "horizon": self.horizon,
            "one_step_contrast_train": self.anchor_contrasts("train"),
            "regime_support_train": anchor_regime_support(T, valid, (a_off, a_on), self.anchor_step, self.horizon),
            "true_ate_test": float(np.mean(tau)),
            "true_effect_sd_test": float(np.std(tau)),
            "sites": sites,
            **extra,
        }

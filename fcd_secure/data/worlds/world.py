"""The ground-truth interface of a generated world: :class:`OracleWorld`, per-site datasets plus the hidden structural
model that answers do-queries.

The rest of the code uses a world's sites (``train``, ``test``, ``anchors``) and its ground truth through this class
only. The queries name entities by site, split and row (:meth:`OracleWorld.entity_ids`) or by global id (the
``*_of`` methods); this class validates them, cuts large queries into batches (:func:`chunks`: noise is keyed per
entity, so batching never changes a number) and lays out the rollouts; a world supplies the kernels, its own
mechanism (the abstract methods of :class:`OracleWorld`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure._io import Kept, arrays_sha256
from fcd_secure.data.policy import Policy, PolicyLike, anchor_regime_support, bind_policy, default_policies
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.worlds.config import Split, WorldConfig

__all__ = ["OracleWorld", "chunks", "nanmean_rows"]

#: entries of each per-world memo of the truth (:meth:`OracleWorld.effects_of`: a few sites' test rows × a few
#: windows; :meth:`OracleWorld.true_policy_values_at`: a few sites × a few policies)
_KEPT = 64


def chunks(ids: np.ndarray, n_rollouts: int, max_rows: int) -> Iterator[tuple[slice, np.ndarray]]:
    """``(slice, ids[slice])`` pieces with ``len(piece) * n_rollouts <= max_rows`` (at least one entity each).

    Noise is keyed per entity (:mod:`.noise`), so chunking never changes an entity's numbers.
    """
    step = max(1, max_rows // max(n_rollouts, 1))
    for s in range(0, len(ids), step):
        yield slice(s, s + step), ids[s : s + step]


def nanmean_rows(a: np.ndarray) -> np.ndarray:
    """Row means ignoring NaN; NaN for an all-NaN row (no warning)."""
    out = np.full(a.shape[0], np.nan)
    ok = (~np.isnan(a)).any(axis=1)
    out[ok] = np.nanmean(a[ok], axis=1)
    return out


@dataclass
class OracleWorld(ABC):
    """A generated world: per-site datasets plus the structural model to answer do-queries (module docstring).

    Per-entity arrays are indexed by the global entity id (``meta['entity']`` of each site dataset). A world adds its
    latents and noise as fields and defines the kernels (the abstract methods below: its own mechanism); the queries,
    their validation and batching, and the summaries are this class's.
    """

    cfg: WorldConfig
    train: list[SiteDataset]
    test: list[SiteDataset]
    anchors: tuple[int, int]
    #: per-entity arrays, indexed by global id: site, length, and the logged actions, outcomes and propensities
    site_of: np.ndarray
    lengths: np.ndarray
    T_all: np.ndarray
    Y_all: np.ndarray
    P_all: np.ndarray
    site_params: dict[str, np.ndarray]

    # the config's numbers that the queries and their callers read, under the names they use
    anchor_step = property(lambda self: self.cfg.anchor_step, doc="t0 of :meth:`true_effects` (``cfg.anchor_step``).")
    horizon = property(lambda self: self.cfg.horizon, doc="The steps :meth:`true_effects` averages (``cfg.horizon``).")
    n_sites = property(lambda self: self.cfg.n_sites, doc="The number of sites (``cfg.n_sites``).")
    L = property(lambda self: self.cfg.max_len, doc="Steps per trajectory at most (``cfg.max_len``).")
    n_actions = property(lambda self: self.cfg.N_ACTIONS, doc="|T|: the world's number of actions.")

    # -- the kernels a world defines (its own mechanism) ---------------------------------------------------
    @property
    @abstractmethod
    def _max_batch_rows(self) -> int:
        """Entities × rollouts per batch (the world's ``truth.MAX_BATCH_ROWS``, read at call time)."""

    @abstractmethod
    def _do_probs(self, ids: np.ndarray, t: int, a: np.ndarray) -> np.ndarray:
        """``P(Y_t = 1 | factual history before t, do(T_t = a))`` ``[n]``, exact (validated ``t`` and ``a``)."""

    @abstractmethod
    def _rollout_noise(self, ids: np.ndarray, n_rollouts: int, start: int, stop: int) -> np.ndarray:
        """The noise of steps ``[start, stop)``, rollout-major ``[R * n, stop − start]``: the logged noise in rollout
        0, counter-based fresh noise after (:func:`~.noise.rollout_major`)."""

    @abstractmethod
    def _regime_probs(self, ids: np.ndarray, start: int, plan: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """``E[Y_{start+h} | factual history before start, do(plan[:, h])]`` ``[n, H]``, averaged over the rollouts
        of ``noise``."""

    @abstractmethod
    def _policy_values(self, policy: PolicyLike, ids: np.ndarray, noise: np.ndarray,
                       horizons: Sequence[int | None]) -> np.ndarray:
        """Each entity's value of the bound ``policy`` from t = 0 per rollout of ``noise`` at each of ``horizons``
        (None: all L steps), from one rollout, ``[len(horizons), R, n]``."""

    @abstractmethod
    def _replay(self, ids: np.ndarray) -> np.ndarray:
        """The outcomes of the logged actions re-simulated with the logged noise ``[n, L]`` (padding included)."""

    @abstractmethod
    def _logging_probs(self, ids: np.ndarray, actions: list[int]) -> np.ndarray:
        """The behaviour policy's probabilities of ``actions`` along the factual history ``[n, L, k]`` (padding
        included)."""

    @abstractmethod
    def _one_step_contrasts(self, ids: np.ndarray, valid: np.ndarray, t: int | None) -> np.ndarray:
        """The true ``P(Y_t | history, do(a_on)) − P(Y_t | history, do(a_off))`` of each ``valid`` cell, row-major."""

    @abstractmethod
    def _describe_actions(self, T: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        """The anchors and the logged actions' shares (``T``, ``valid``: the training sites') for :meth:`_describe`."""

    @abstractmethod
    def _describe_world(self) -> dict[str, Any]:
        """The world's own entries at the end of :meth:`_describe`."""

    # -- which entities ------------------------------------------------------------------------------------
    def entity_ids(self, site: int | None, split: Split, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
        """Global entity ids of ``rows`` of ``world.<split>[site]`` (all sites concatenated when ``site`` is None).

        Raises:
            ValueError: Bad split, site or rows (``rows`` needs a site).
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if site is None:
            if rows is not None:
                raise ValueError("rows needs a site")
            return np.concatenate([self.entity_ids(s, split) for s in range(self.n_sites)])
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
        """``ids`` as int64 global entity ids.

        Raises:
            ValueError: An id outside ``[0, n_entities)``.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = self.cfg.n_entities
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"{self.cfg.ENTITY} ids must lie in [0, {n})")
        return ids

    def _valid(self, ids: np.ndarray) -> np.ndarray:
        return np.arange(self.L)[None, :] < self.lengths[ids][:, None]

    def _check_plan(self, ids: np.ndarray, start: int, plan: np.ndarray | list[int]) -> np.ndarray:
        """``plan`` as int64 ``[n, H]`` (one plan ``[H]`` is broadcast to every entity).

        Raises:
            ValueError: The plan's shape, its window or its actions are out of range.
        """
        plan = np.asarray(plan, dtype=np.int64)
        H = plan.shape[-1]
        if plan.ndim == 1:
            plan = np.broadcast_to(plan, (len(ids), H))
        if plan.shape != (len(ids), H) or start < 0 or start + H > self.L:
            raise ValueError(f"plan must be [H] or [n={len(ids)}, H] with start + H <= L={self.L}")
        if ((plan < 0) | (plan >= self.n_actions)).any():
            raise ValueError(f"plan holds actions outside [0, {self.n_actions})")
        return plan

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
        ids = self.entity_ids(site, split, rows)
        if not 0 <= t < self.L:
            raise ValueError(f"t must be in [0, {self.L}), got {t}")
        a_arr = np.asarray(a, dtype=np.int64)
        if a_arr.ndim not in (0, 1) or (a_arr.ndim == 1 and a_arr.shape != ids.shape):
            raise ValueError(f"a must be one action or one per row ({len(ids)}), got shape {a_arr.shape}")
        a_arr = np.broadcast_to(a_arr, ids.shape)
        if ((a_arr < 0) | (a_arr >= self.n_actions)).any():
            raise ValueError(f"action out of range [0, {self.n_actions})")
        return np.where(t < self.lengths[ids], self._do_probs(ids, t, a_arr), np.nan)

    def outcome_probs_do_along(
        self, site: int, split: Split, rows: np.ndarray | list[int] | None, actions: Sequence[int]
    ) -> np.ndarray:
        """:meth:`outcome_probs_do` at every step ``t < L`` for each of ``actions``: float64 ``[n, L, len(actions)]``,
        NaN on padding. Exact; the same numbers as :meth:`outcome_probs_do` step by step, from one pass along each
        history where the world walks one (:meth:`_do_probs_along`).

        Raises:
            ValueError: an action or the rows are out of range.
        """
        ids = self.entity_ids(site, split, rows)
        acts = [int(a) for a in actions]
        if any(not 0 <= a < self.n_actions for a in acts):
            raise ValueError(f"action out of range [0, {self.n_actions})")
        return np.where(self._valid(ids)[:, :, None], self._do_probs_along(ids, acts), np.nan)

    def _do_probs_along(self, ids: np.ndarray, actions: list[int]) -> np.ndarray:
        """:meth:`_do_probs` at every step for each action, ``[n, L, len(actions)]`` (padding included); a world
        whose state at ``t`` is walked from the start overrides this to walk once."""
        return np.stack([np.stack([self._do_probs(ids, t, np.full(len(ids), a, dtype=np.int64)) for a in actions],
                                  axis=-1) for t in range(self.L)], axis=1)

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

        Expected outcome probabilities averaged over rollouts (the logged noise for rollout 0, counter-based fresh
        noise after: :mod:`.noise`). Steps beyond an entity's length are NaN.

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
        return self.regime_outcome_probs_of(self.entity_ids(site, split, rows), start, plan, n_rollouts)

    def regime_outcome_probs_of(
        self, ids: np.ndarray, start: int, plan: np.ndarray | list[int], n_rollouts: int | None = None
    ) -> np.ndarray:
        """:meth:`regime_outcome_probs` of the entities with global ids ``ids``."""
        ids = self._ids(ids)
        R = int(n_rollouts or self.cfg.n_rollouts)
        plan = self._check_plan(ids, start, plan)
        H = plan.shape[1]
        steps = np.arange(start, start + H)
        parts = [self._regime_probs(c, start, plan[k], self._rollout_noise(c, R, start, start + H))
                 for k, c in chunks(ids, R, self._max_batch_rows)]
        out = np.concatenate(parts, axis=0) if parts else np.empty((0, H))
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
        steps that lie inside each entity's trajectory (presets guarantee all of them do).

        Returns:
            float64 ``[n]``.
        """
        return self.effects_of(self.entity_ids(site, split, rows), anchor, horizon, n_rollouts)

    def effects_of(
        self, ids: np.ndarray, anchor: int | None = None, horizon: int | None = None, n_rollouts: int | None = None
    ) -> np.ndarray:
        """:meth:`true_effects` of the entities with global ids ``ids``.

        Computed once per process for each (entities, anchor step, horizon, rollouts, anchors): the truth is a fixed
        function of the world (its latents and counter-based noise, :mod:`.noise`) and these, and a run asks it of
        the same test rows at every evaluated round; each call gets its own copy."""
        ids = self._ids(ids)
        t0 = self.anchor_step if anchor is None else int(anchor)
        H = self.horizon if horizon is None else int(horizon)
        R = int(n_rollouts or self.cfg.n_rollouts)
        a_off, a_on = self.anchors

        def compute() -> np.ndarray:
            on = self.regime_outcome_probs_of(ids, t0, np.full(H, a_on), R)
            off = self.regime_outcome_probs_of(ids, t0, np.full(H, a_off), R)
            return nanmean_rows(on - off)

        key = (arrays_sha256("ids", [ids]), t0, H, R, int(a_off), int(a_on))
        return self._kept("_effects_memo").get(key, compute).copy()

    def true_policy_value(
        self,
        policy: PolicyLike,
        site: int | None = None,
        split: Split = "test",
        n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> tuple[float, float]:
        """V(π) = E_i[(1/H_i) Σ_{t<H_i} E[Y^π_it]] from t = 0 (the mean expected outcome over the first
        H_i = min(L_i, horizon) steps; every valid step by default), and its Monte Carlo SE.

        The policy sees ``(t, y_hist[B, t], lengths[B], a_off, a_on)`` with B = entities × rollouts (and the contexts
        when it reads them: the world's ``_policy_values`` says which); outcomes are sampled with the logged noise
        (rollout 0) and counter-based noise (r ≥ 1), the value uses expected outcome probabilities. A declarative
        policy is bound to the world's action labels and context columns.

        Returns:
            ``(value, standard error across rollouts)``; the SE is NaN with one rollout.
        """
        return self.true_policy_values_at(policy, site, split, (horizon,), n_rollouts)[0]

    def true_policy_values_at(
        self,
        policy: PolicyLike,
        site: int | None,
        split: Split,
        horizons: Sequence[int | None],
        n_rollouts: int | None = None,
    ) -> list[tuple[float, float]]:
        """:meth:`true_policy_value` at each of ``horizons``, from one rollout of the longest
        (:class:`~.horizons.HorizonSums`: each value is the one a rollout of its own horizon gives, bit for bit).

        Computed once per process for each (entities, policy, rollouts, horizons, anchors) when the policy is a
        deterministic :class:`~fcd_secure.data.policy.Policy`, whose content (its JSON) is all it acts on: a run asks
        the same truth of the same test rows for every policy at every evaluated round. A stochastic policy acts
        through a bound logging-policy model and a Python policy through its own code, neither of which has a
        content key, so those are computed on every call."""
        ids = self.entity_ids(site, split)
        R = int(n_rollouts or self.cfg.n_rollouts)
        hs = tuple(None if h is None else int(h) for h in horizons)

        def compute() -> tuple[tuple[float, float], ...]:
            out = []
            for values in self.policy_values_over(policy, ids, R, hs):
                per = values.mean(axis=1)
                se = float(per.std(ddof=1) / math.sqrt(len(per))) if len(per) > 1 else float("nan")
                out.append((float(per.mean()), se))
            return tuple(out)

        if not isinstance(policy, Policy) or policy.stochastic:
            return list(compute())
        key = (arrays_sha256("ids", [ids]), policy.model_dump_json(), R, hs, tuple(int(a) for a in self.anchors))
        return list(self._kept("_values_memo").get(key, compute))

    def _kept(self, name: str) -> Kept:
        """This world's memo ``name`` (:data:`_KEPT` entries), made on first use: the truth is a fixed function of
        the world, so a memo lives as long as the world object does."""
        return self.__dict__.setdefault(name, Kept(_KEPT))

    def policy_value_per_rollout(
        self, policy: PolicyLike, site: int | None = None, split: Split = "test", n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> np.ndarray:
        """V(π) computed separately on each rollout, shape [R] (rows are laid out rollout-major: b = r * n + i)."""
        return self.policy_values_per_entity(policy, site, split, n_rollouts, horizon).mean(axis=1)

    def policy_values_per_entity(
        self, policy: PolicyLike, site: int | None = None, split: Split = "test", n_rollouts: int | None = None,
        horizon: int | None = None,
    ) -> np.ndarray:
        """Each entity's true value of ``policy`` per rollout, float64 ``[R, n]`` (entities in ``entity_ids``
        order; see :meth:`true_policy_value`)."""
        return self.policy_values_of(policy, self.entity_ids(site, split), n_rollouts, horizon)

    def policy_values_of(
        self, policy: PolicyLike, ids: np.ndarray, n_rollouts: int | None = None, horizon: int | None = None
    ) -> np.ndarray:
        """:meth:`policy_values_per_entity` of the entities with global ids ``ids``, float64 ``[R, n]``."""
        return self.policy_values_over(policy, ids, n_rollouts, (horizon,))[0]

    def policy_values_over(
        self, policy: PolicyLike, ids: np.ndarray, n_rollouts: int | None, horizons: Sequence[int | None]
    ) -> np.ndarray:
        """:meth:`policy_values_of` at each of ``horizons`` from one rollout per batch, float64
        ``[len(horizons), R, n]``."""
        ids = self._ids(ids)
        R = int(n_rollouts or self.cfg.n_rollouts)
        policy = bind_policy(policy, self.train[0])
        parts = [self._policy_values(policy, c, self._rollout_noise(c, R, 0, self.L), horizons)
                 for _, c in chunks(ids, R, self._max_batch_rows)]
        return np.concatenate(parts, axis=2) if parts else np.empty((len(horizons), R, 0))

    def replay_logged(self, site: int, split: Split) -> np.ndarray:
        """Outcomes from re-simulating the logged actions with the stored noise ([n, L], 0 on padding)."""
        ids = self.entity_ids(site, split)
        return self._replay(ids) * self._valid(ids)

    def logging_propensities(
        self, site: int | None, split: Split, actions: list[int] | tuple[int, ...] | None = None
    ) -> np.ndarray:
        """The behaviour policy's true probabilities of ``actions`` (default: the anchors) at every step, [n, L, k].

        Recomputed along the factual history; NaN on padding.
        """
        ids = self.entity_ids(site, split)
        out = self._logging_probs(ids, list(self.anchors if actions is None else actions))
        return np.where(self._valid(ids)[:, :, None], out, np.nan)

    # -- summaries -----------------------------------------------------------------------------------------
    def anchor_contrasts(self, split: Split = "train", t: int | None = None) -> dict[str, float]:
        """Naive, IPW (true propensities) and true one-step a_on − a_off contrasts from the logged data.

        With ``t`` given, only that step; otherwise pooled over every valid (i, t). The truth is the mean of
        ``P(Y_t | history, do(a_on)) − P(Y_t | history, do(a_off))`` over the same (i, t) cells.
        """
        a_off, a_on = self.anchors
        ids = self.entity_ids(None, split)
        T, Y, P = self.T_all[ids], self.Y_all[ids], self.P_all[ids]
        valid = self._valid(ids)
        if t is not None:
            valid = valid & (np.arange(self.L)[None, :] == t)
        true = self._one_step_contrasts(ids, valid, t)
        on, off = valid & (T == a_on), valid & (T == a_off)
        naive = Y[on].mean() - Y[off].mean() if on.any() and off.any() else float("nan")
        # Hajek (self-normalised) IPW per arm: E[Y(a)] over the same cells, weights 1/π_b(a | H_t)
        ipw = (Y * on / P).sum() / (on / P).sum() - (Y * off / P).sum() / (off / P).sum()
        return {"naive": float(naive), "ipw": float(ipw), "true": float(true.mean()), "cells": int(valid.sum()),
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

    @abstractmethod
    def describe(self, n_rollouts: int | None = None, policy_values: bool = False) -> dict[str, Any]:
        """The world's key figures as plain JSON-able numbers (:meth:`_describe`; a world sets whether the true
        policy values are included by default)."""

    def _describe(self, n_rollouts: int | None, policy_values: bool) -> dict[str, Any]:
        """What every world's ``describe`` reports, with the world's own entries in their places (plain JSON-able
        numbers; the entries' order is part of the output). A world may extend :meth:`_support_figures` and
        :meth:`_describe_outcomes`."""
        a_off, a_on = self.anchors
        ids = self.entity_ids(None, "train")
        valid = self._valid(ids)
        T = self.T_all[ids]
        tau = self.true_effects(None, "test", n_rollouts=n_rollouts)
        extra = {"true_policy_values_test": self.true_policy_values(n_rollouts=n_rollouts)} if policy_values else {}
        pi = self.logging_propensities(None, "train")
        return {
            "preset": self.cfg.preset,
            "seed": self.cfg.seed,
            "n_sites": self.n_sites,
            "n_train": [d.n for d in self.train],
            "n_test": [d.n for d in self.test],
            "max_len": self.L,
            "mean_len": float(self.lengths.mean()),
            "n_actions": self.n_actions,
            **self._describe_actions(T, valid),
            "anchor_propensity_train": {name: self._support_figures(pi[..., k])
                                        for k, name in enumerate(("a_off", "a_on"))},
            "gamma": self.cfg.gamma,
            "epsilon": self.cfg.epsilon,
            "min_logged_propensity": float(self.P_all[ids][valid].min()),
            **self._describe_outcomes(ids, valid),
            "anchor_step": self.anchor_step,
            "horizon": self.horizon,
            "one_step_contrast_train": self.anchor_contrasts("train"),
            "regime_support_train": anchor_regime_support(T, valid, (a_off, a_on), self.anchor_step, self.horizon),
            "true_ate_test": float(np.mean(tau)),
            "true_effect_sd_test": float(np.std(tau)),
            **self._describe_world(),
            **extra,
        }

    def _labelled_actions(self, T: np.ndarray, valid: np.ndarray, labels: tuple[str, ...]) -> dict[str, Any]:
        """:meth:`_describe_actions` of a world whose every action has a label (``labels``, by id): the labels, the
        anchors by id and label, and each action's share of the logged valid steps."""
        a_off, a_on = self.anchors
        return {
            "action_labels": list(labels),
            "anchors": {"a_off": a_off, "a_on": a_on, "a_off_label": labels[a_off], "a_on_label": labels[a_on]},
            "action_share_train": {k: float((T[valid] == i).mean()) for i, k in enumerate(labels)},
        }

    def _labelled_sites(self, labels: tuple[str, ...], case_mix: Callable[[np.ndarray], dict[str, Any]],
                        practice: tuple[str, ...]) -> dict[str, Any]:
        """:meth:`_describe_world`'s per-site entries of a world whose every action has a label (``labels``, by id):
        each site's case mix (``case_mix(ids)`` of its train and test entities' global ids), its logged actions'
        shares, and its practice (the ``site_params`` named in ``practice``), in that order."""
        sites = []
        for s, ds in enumerate(self.train):
            ids = np.concatenate([ds.meta["entity"], self.test[s].meta["entity"]])
            tv = ds.T[ds.M > 0]
            sites.append({
                "site": s,
                **case_mix(ids),
                "action_share": {k: float((tv == i).mean()) for i, k in enumerate(labels)},
                **{name: float(self.site_params[name][s]) for name in practice},
            })
        return {"sites": sites}

    def _support_figures(self, pi: np.ndarray) -> dict[str, float]:
        """How much logged support an anchor has: the 1st percentile and the median of its propensity (NaN-padded)."""
        return {"p01": float(np.nanquantile(pi, 0.01)), "median": float(np.nanmedian(pi))}

    def _describe_outcomes(self, ids: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        """The logged outcomes' entries of :meth:`_describe`."""
        return {"mean_logged_y": float(self.Y_all[ids][valid].mean())}

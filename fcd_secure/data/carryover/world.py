"""The carry-over world object: per-site datasets plus the hidden structural model that answers do-queries.

:func:`~fcd_secure.data.carryover.generation.generate` builds a :class:`CarryoverWorld`; the rest of the code uses its
sites (``train``, ``test``, ``anchors``) and its ground truth through the interface every generated world shares
(:class:`~fcd_secure.data.worlds.world.OracleWorld`: ``true_effects``, ``true_policy_value``, ``replay_logged``,
``logging_propensities``, ``describe``). What is the carry-over world's own is here: a patient's state on a step,
the kernels of :mod:`.truth` and the clinic's propensities (:mod:`.behaviour`), with the uniforms of :mod:`.noise`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure.data.carryover import truth
from fcd_secure.data.carryover.behaviour import action_probs
from fcd_secure.data.carryover.config import CarryoverConfig
from fcd_secure.data.carryover.model import ACTION_LABELS, PatientParams, good_step_prob
from fcd_secure.data.carryover.noise import rollout_uniforms
from fcd_secure.data.policy import PolicyLike, default_policies
from fcd_secure.data.worlds.world import OracleWorld

__all__ = ["CarryoverWorld"]


@dataclass
class CarryoverWorld(OracleWorld):
    """A generated world: per-site datasets plus the structural model to answer do-queries (package docstring).

    Per-patient arrays are indexed by the global patient id (``meta['entity']`` of each site dataset).
    """

    cfg: CarryoverConfig
    #: per-patient hidden parameters, recorded covariates and per-step uniforms, indexed by global patient id
    params: PatientParams
    X_all: np.ndarray
    U: np.ndarray
    #: logged severity and toxicity S_0..S_L, K_0..K_L (S_{t+1} follows step t's action)
    S_all: np.ndarray
    K_all: np.ndarray

    #: the interface's names in the carry-over world's words
    patient_ids = OracleWorld.entity_ids
    policy_values_per_patient = OracleWorld.policy_values_per_entity

    def _practice(self, ids: np.ndarray) -> np.ndarray:
        return self.site_params["practice_shift"][self.site_of[ids]]

    # -- the kernels of the shared interface ---------------------------------------------------------------
    @property
    def _max_batch_rows(self) -> int:
        return truth.MAX_BATCH_ROWS  # read at call time: a test may lower it

    def _do_probs(self, ids: np.ndarray, t: int, a: np.ndarray) -> np.ndarray:
        return good_step_prob(self.cfg, self.params.take(ids), self.S_all[ids, t], self.K_all[ids, t], a)

    def _rollout_noise(self, ids: np.ndarray, n_rollouts: int, start: int, stop: int) -> np.ndarray:
        """The uniforms of steps ``[start, stop)``, ``[R * n, stop − start, 3]``: the logged ones in rollout 0,
        fresh after."""
        return rollout_uniforms(self.cfg.seed, self.U[ids][:, start:stop], ids, n_rollouts, np.arange(start, stop))

    def _regime_probs(self, ids: np.ndarray, start: int, plan: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return truth.regime(self.cfg, self.params.take(ids), self.S_all[ids, start], self.K_all[ids, start], plan,
                            noise)

    def _policy_values(self, policy: PolicyLike, ids: np.ndarray, noise: np.ndarray,
                       horizons: Sequence[int | None]) -> np.ndarray:
        """The share of good steps; a policy that reads a context sees the severity and toxicity simulated under
        itself (endogenous), a stochastic one (incremental, share) the true logging probabilities on them."""
        R = noise.shape[0] // max(len(ids), 1)
        practice = np.tile(self._practice(ids), R)

        def behaviour(S: np.ndarray, K: np.ndarray, prev: np.ndarray) -> np.ndarray:
            return action_probs(self.cfg, S, K, prev, practice)

        return truth.policy_values(self.cfg, self.params.take(ids), self.S_all[ids, 0], self.K_all[ids, 0], policy,
                                   self.lengths[ids], noise, self.anchors, horizons, behaviour)

    def _replay(self, ids: np.ndarray) -> np.ndarray:
        Y, _, _ = truth.replay(self.cfg, self.params.take(ids), self.S_all[ids, 0], self.K_all[ids, 0],
                               self.T_all[ids], self.U[ids])
        return Y

    def _logging_probs(self, ids: np.ndarray, actions: list[int]) -> np.ndarray:
        """Along the logged severity, toxicity and previous action."""
        T = self.T_all[ids]
        prev = np.concatenate([np.zeros((len(ids), 1), dtype=np.int64), T[:, :-1]], axis=1)
        practice = self._practice(ids)
        return np.stack([action_probs(self.cfg, self.S_all[ids, t], self.K_all[ids, t], prev[:, t], practice)
                         for t in range(self.L)], axis=1)[:, :, actions]

    def _one_step_contrasts(self, ids: np.ndarray, valid: np.ndarray, t: int | None) -> np.ndarray:
        a_off, a_on = self.anchors
        rows, steps = np.nonzero(valid)
        pid = ids[rows]
        prm, S, K = self.params.take(pid), self.S_all[pid, steps], self.K_all[pid, steps]
        return (good_step_prob(self.cfg, prm, S, K, np.full(len(pid), a_on))
                - good_step_prob(self.cfg, prm, S, K, np.full(len(pid), a_off)))

    # -- summaries -----------------------------------------------------------------------------------------
    def regimen_values(self, horizons: tuple[int, ...] = (1,), split: str = "test", n_rollouts: int | None = None
                       ) -> dict[str, dict[str, float]]:
        """The true values of the paper's four regimens (never, always, early_on, late_on) over the first h steps of
        each trajectory, per h: ``{"h=<h>": {name: value}}`` (``true_policy_value(..., horizon=h)``)."""
        return {f"h={h}": {p.name: self.true_policy_value(p, None, split, n_rollouts, horizon=h)[0]
                           for p in default_policies()} for h in horizons}

    def describe(self, n_rollouts: int | None = None, policy_values: bool = True) -> dict[str, Any]:
        """Sizes, anchors and their logged shares, γ, ε, each site's case mix and practice, naive vs IPW vs true
        one-step contrasts, the true ATE and (by default) the true values of the paper's four regimens over the whole
        trajectory and over its first step, where their order differs.

        Returns:
            Plain JSON-able numbers (``fcd data describe --json`` shows them under ``oracle``).
        """
        out = self._describe(n_rollouts, policy_values)
        if policy_values:
            out["true_policy_values_first_step_test"] = self.regimen_values((1,), n_rollouts=n_rollouts)["h=1"]
        return out

    def _describe_actions(self, T: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        return self._labelled_actions(T, valid, ACTION_LABELS)

    def _describe_outcomes(self, ids: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        return {
            **super()._describe_outcomes(ids, valid),
            "mean_severity": float(self.S_all[ids, : self.L][valid].mean()),
            "mean_toxicity": float(self.K_all[ids, : self.L][valid].mean()),
        }

    def _describe_world(self) -> dict[str, Any]:
        """Each site's case mix (over its train and test patients) and practice."""
        return self._labelled_sites(ACTION_LABELS, lambda pid: {
            "mean_untreated_severity": float(self.params.mu[pid].mean()),
        }, ("casemix_shift", "practice_shift"))

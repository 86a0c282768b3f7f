"""The DKT-Synth world object: per-site datasets plus the hidden structural model that answers do-queries.

:func:`~fcd_secure.data.dkt_synth.generation.generate` builds a :class:`DKTSynthWorld`; the rest of the code uses its
sites (``train``, ``test``, ``anchors``) and its ground truth through the interface every generated world shares
(:class:`~fcd_secure.data.worlds.world.OracleWorld`: validation, batching, policy values, summaries). The queries
name students by site, split and row (:meth:`DKTSynthWorld.student_ids`); what is DKT-Synth's own is here: the
kernels of :mod:`.truth` (outcome model) and :mod:`.behaviour` (logging propensities), with the noise of
:mod:`.noise`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fcd_secure.data.dkt_synth import truth
from fcd_secure.data.dkt_synth.behaviour import behaviour_probs, logging_probs_along
from fcd_secure.data.dkt_synth.config import DKTSynthConfig
from fcd_secure.data.dkt_synth.noise import rollout_noise
from fcd_secure.data.dkt_synth.oracle import DKTOracle
from fcd_secure.data.policy import PolicyLike
from fcd_secure.data.worlds.world import OracleWorld

__all__ = ["DKTSynthWorld", "clock_context"]


def clock_context(valid: np.ndarray) -> np.ndarray:
    """DKT-Synth's one context column A_t = t / (L − 1) on valid steps, 0 on padding: float32 ``[n, L, 1]`` from the
    valid-step mask ``[n, L]``. Exogenous: no action changes the clock."""
    L = valid.shape[1]
    return (np.arange(L, dtype=np.float32)[None, :, None] / max(L - 1, 1)) * np.asarray(valid, np.float32)[:, :, None]


@dataclass
class DKTSynthWorld(OracleWorld):
    """A generated world: per-site datasets plus the structural model to answer do-queries (package docstring).

    Per-student arrays are indexed by the global student id (``meta['entity']`` of each site dataset).
    """

    cfg: DKTSynthConfig
    oracle: DKTOracle
    oracle_card: dict
    #: per-student latents and noise, indexed by global student id
    theta: np.ndarray
    u: np.ndarray
    U: np.ndarray
    designated: tuple[int, int]
    profile: dict[str, np.ndarray]

    #: the interface's names in DKT-Synth's words
    student_ids = OracleWorld.entity_ids
    policy_values_per_student = OracleWorld.policy_values_per_entity

    def _offset(self, ids: np.ndarray) -> torch.Tensor:
        """``βθ θ_i + βu u_i``: the student's constant shift of every outcome logit."""
        return torch.from_numpy(self.cfg.beta_theta * self.theta[ids] + self.cfg.beta_u * self.u[ids])

    # -- the kernels of the shared interface ---------------------------------------------------------------
    @property
    def _max_batch_rows(self) -> int:
        return truth.MAX_BATCH_ROWS  # read at call time: a test may lower it

    def _do_probs(self, ids: np.ndarray, t: int, a: np.ndarray) -> np.ndarray:
        """``σ(z_t[a] + βθ θ_i + βu u_i)`` after the logged history before ``t``."""
        state = truth.factual_state(self.oracle, self.T_all[ids], self.Y_all[ids], t)
        return truth.do_probs(self.oracle, state, self._offset(ids), a)

    def _do_probs_along(self, ids: np.ndarray, actions: list[int]) -> np.ndarray:
        """One walk along the logged history (the LSTM state at ``t`` needs every step before it)."""
        return truth.do_probs_along(self.oracle, self.T_all[ids], self.Y_all[ids], self._offset(ids), actions)

    def _rollout_noise(self, ids: np.ndarray, n_rollouts: int, start: int, stop: int) -> np.ndarray:
        """The outcome uniforms of steps ``[start, stop)``: the logged ``U`` in rollout 0, fresh after."""
        return rollout_noise(self.cfg.seed, self.U[ids][:, start:stop], ids, n_rollouts, np.arange(start, stop))

    def _regime_probs(self, ids: np.ndarray, start: int, plan: np.ndarray, noise: np.ndarray) -> np.ndarray:
        state = truth.factual_state(self.oracle, self.T_all[ids], self.Y_all[ids], start)
        return truth.regime_probs(self.oracle, state, self._offset(ids), plan, noise)

    def _policy_values(self, policy: PolicyLike, ids: np.ndarray, noise: np.ndarray,
                       horizons: Sequence[int | None]) -> np.ndarray:
        """Per-step success from t = 0; a context-reading policy sees the clock (exogenous: replayed as logged), an
        stochastic one (incremental, share) the tutor's true item probabilities on the simulated history."""
        R = noise.shape[0] // max(len(ids), 1)
        tile = (lambda x: torch.from_numpy(np.tile(x, (R,) + (1,) * (x.ndim - 1)))) if len(ids) else None
        theta, u = tile(self.theta[ids]), tile(self.u[ids])
        const = tile(self.site_params["item_const"][self.site_of[ids]])
        d = torch.from_numpy(self.profile["difficulty"])

        def behaviour(z: torch.Tensor) -> np.ndarray:
            return behaviour_probs(self.cfg, z, theta, u, const, d, self.site_params["logit_ref"]).numpy()

        return truth.policy_values(self.oracle, policy, self._offset(ids), self.lengths[ids], noise, self.anchors,
                                   horizons=horizons, contexts=clock_context(self._valid(ids)), behaviour=behaviour)

    def _replay(self, ids: np.ndarray) -> np.ndarray:
        return truth.replay(self.oracle, self.T_all[ids], self.U[ids], self._offset(ids))

    def _logging_probs(self, ids: np.ndarray, actions: list[int]) -> np.ndarray:
        """With ``epsilon = 0`` some are exactly 0 (the tutor skips mastered items: no support)."""
        return logging_probs_along(
            self.oracle, self.cfg, self.T_all[ids], self.Y_all[ids], self.theta[ids], self.u[ids],
            self.site_params["item_const"][self.site_of[ids]], self.profile["difficulty"],
            self.site_params["logit_ref"], actions,
        )

    def _one_step_contrasts(self, ids: np.ndarray, valid: np.ndarray, t: int | None) -> np.ndarray:
        a_off, a_on = self.anchors
        t_end = self.L if t is None else t + 1
        probs = truth.factual_probs(self.oracle, self.T_all[ids], self.Y_all[ids], self._offset(ids), [a_off, a_on],
                                    t_end)
        return (probs[..., 1] - probs[..., 0])[valid]

    # -- summaries -----------------------------------------------------------------------------------------
    def describe(self, n_rollouts: int | None = None, policy_values: bool = False) -> dict[str, Any]:
        """Sizes, anchors and their logged shares, γ, ε, naive vs IPW vs true contrasts, true ATE (and policy values).

        Returns:
            Plain JSON-able numbers (``fcd data describe``, docs).
        """
        return self._describe(n_rollouts, policy_values)

    def _describe_actions(self, T: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        a_off, a_on = self.anchors
        by_site = []
        for ds in self.train:
            tv = ds.T[ds.M > 0]
            by_site.append({"a_off": float((tv == a_off).mean()), "a_on": float((tv == a_on).mean())})
        return {
            "anchors": {"a_off": a_off, "a_on": a_on},
            "anchor_share_train": {"a_off": float((T[valid] == a_off).mean()), "a_on": float((T[valid] == a_on).mean())},
            "anchor_share_train_by_site": by_site,
        }

    def _support_figures(self, pi: np.ndarray) -> dict[str, float]:
        # with ε = 0 the tutor's skip rule leaves cells with no support at all: count them
        return {**super()._support_figures(pi), "zero_cells": int((pi == 0).sum())}

    def _describe_world(self) -> dict[str, Any]:
        return {"oracle_test_auc": self.oracle_card.get("test_auc")}

"""The tumour world object: per-site datasets plus the hidden PK-PD model that answers do-queries.

:func:`~fcd_secure.data.tumour.generation.generate` builds a :class:`TumourWorld`; the rest of the code uses its sites
(``train``, ``test``, ``anchors``) and its ground truth through the interface every generated world shares
(:class:`~fcd_secure.data.worlds.world.OracleWorld`: ``anchor_step``, ``horizon``, ``true_effects``,
``true_policy_value``, ``replay_logged``, ``logging_propensities``, ``describe``). The queries name patients by site,
split and row (:meth:`TumourWorld.patient_ids`); what is the tumour world's own is here: the PK-PD state of a patient,
the kernels of :mod:`.truth` and the clinic's propensities (:mod:`.behaviour`), with the noise of :mod:`.noise`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcd_secure.data.policy import PolicyLike
from fcd_secure.data.tumour import truth
from fcd_secure.data.tumour.behaviour import action_probs, recent_mean
from fcd_secure.data.tumour.config import TumourConfig
from fcd_secure.data.tumour.noise import rollout_normals
from fcd_secure.data.tumour.pkpd import (
    ACTION_LABELS,
    STAGES,
    V_DEATH,
    PatientParams,
    diameter_of,
    response_prob,
    volume_of,
)
from fcd_secure.data.worlds.world import OracleWorld

__all__ = ["TumourWorld"]


@dataclass
class TumourWorld(OracleWorld):
    """A generated world: per-site datasets plus the PK-PD model to answer do-queries (package docstring).

    Per-patient arrays are indexed by the global patient id (``meta['entity']`` of each site dataset).
    """

    cfg: TumourConfig
    #: per-patient latents and noise, indexed by global patient id
    stage: np.ndarray
    patient_type: np.ndarray
    params: PatientParams
    Z: np.ndarray
    #: logged volumes V_0..V_L (V_{t+1} follows day t's action) and chemotherapy concentration after day t's dose
    V_all: np.ndarray
    C_all: np.ndarray

    #: the interface's names in the tumour world's words
    patient_ids = OracleWorld.entity_ids
    policy_values_per_patient = OracleWorld.policy_values_per_entity

    @property
    def v_response(self) -> float:
        """The response volume: a tumour of ``cfg.response_diameter`` cm across."""
        return float(volume_of(self.cfg.response_diameter))

    def _state(self, ids: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        """``(V_t, C_{t-1})`` after the logged history before day ``t``."""
        return self.V_all[ids, t], (self.C_all[ids, t - 1] if t > 0 else np.zeros(len(ids)))

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

    # -- the kernels of the shared interface ---------------------------------------------------------------
    @property
    def _max_batch_rows(self) -> int:
        return truth.MAX_BATCH_ROWS  # read at call time: a test may lower it

    def _do_probs(self, ids: np.ndarray, t: int, a: np.ndarray) -> np.ndarray:
        V, C = self._state(ids, t)
        return response_prob(self.params.take(ids), V, C, a, self.cfg.noise_sd, self.v_response)

    def _rollout_noise(self, ids: np.ndarray, n_rollouts: int, start: int, stop: int) -> np.ndarray:
        """The volume noise of days ``[start, stop)``: the logged ``z`` in rollout 0, fresh after."""
        return rollout_normals(self.cfg.seed, self.Z[ids][:, start:stop], ids, n_rollouts, np.arange(start, stop))

    def _regime_probs(self, ids: np.ndarray, start: int, plan: np.ndarray, noise: np.ndarray) -> np.ndarray:
        V, C = self._state(ids, start)
        return truth.regime(self.params.take(ids), V, C, plan, noise, self.cfg.noise_sd, self.v_response)[0]

    def _policy_values(self, policy: PolicyLike, ids: np.ndarray, noise: np.ndarray,
                       horizons: Sequence[int | None]) -> np.ndarray:
        """The share of days the tumour is within the response size; a policy that reads a context sees the volumes
        and diameters simulated under itself (endogenous), a stochastic one (incremental, share) the true logging
        probabilities on them."""
        R = noise.shape[0] // max(len(ids), 1)
        sp = self.site_params
        chemo, radio = (np.tile(sp[k][self.site_of[ids]], R) for k in ("chemo_shift", "radio_shift"))

        def behaviour(V_hist: np.ndarray) -> np.ndarray:  # the logging policy on the simulated diameters
            return action_probs(self.cfg, recent_mean(diameter_of(V_hist), self.cfg.window), chemo, radio)

        return truth.policy_values(self.params.take(ids), self.V_all[ids, 0], policy, self.lengths[ids], noise,
                                   self.anchors, self.cfg.noise_sd, self.v_response, horizons=horizons,
                                   behaviour=behaviour)

    def _replay(self, ids: np.ndarray) -> np.ndarray:
        Y, _ = truth.replay(self.params.take(ids), self.V_all[ids, 0], self.T_all[ids], self.Z[ids],
                            self.cfg.noise_sd, self.v_response)
        return Y

    def _logging_probs(self, ids: np.ndarray, actions: list[int]) -> np.ndarray:
        """Along the logged diameters."""
        sp = self.site_params
        D = diameter_of(self.V_all[ids, : self.L])
        return np.stack([
            action_probs(self.cfg, recent_mean(D[:, : t + 1], self.cfg.window), sp["chemo_shift"][self.site_of[ids]],
                         sp["radio_shift"][self.site_of[ids]])
            for t in range(self.L)
        ], axis=1)[:, :, actions]

    def _one_step_contrasts(self, ids: np.ndarray, valid: np.ndarray, t: int | None) -> np.ndarray:
        a_off, a_on = self.anchors
        rows, days = np.nonzero(valid)
        pid = ids[rows]
        V = self.V_all[pid, days]
        C = np.where(days > 0, self.C_all[pid, np.maximum(days - 1, 0)], 0.0)
        prm = self.params.take(pid)
        p_on = response_prob(prm, V, C, np.full(len(pid), a_on), self.cfg.noise_sd, self.v_response)
        p_off = response_prob(prm, V, C, np.full(len(pid), a_off), self.cfg.noise_sd, self.v_response)
        return p_on - p_off

    # -- summaries -----------------------------------------------------------------------------------------
    def describe(self, n_rollouts: int | None = None, policy_values: bool = True) -> dict[str, Any]:
        """Sizes, anchors and their logged shares, γ, ε, each site's case mix and practice, naive vs IPW vs true
        one-day contrasts, the true ATE and (by default) the true values of the paper's four policies.

        Returns:
            Plain JSON-able numbers (``fcd data describe --json`` shows them under ``oracle``).
        """
        return self._describe(n_rollouts, policy_values)

    def _describe_actions(self, T: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        return self._labelled_actions(T, valid, ACTION_LABELS)

    def _describe_outcomes(self, ids: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
        return {
            "response_diameter_cm": self.cfg.response_diameter,
            **super()._describe_outcomes(ids, valid),
            "mean_volume_normalised": float((self.V_all[ids, : self.L][valid] / V_DEATH).mean()),
        }

    def _describe_world(self) -> dict[str, Any]:
        """Each site's case mix (over its train and test patients) and practice."""
        return self._labelled_sites(ACTION_LABELS, lambda pid: {
            "stage_share": {k: float((self.stage[pid] == i).mean()) for i, k in enumerate(STAGES)},
            "mean_initial_diameter_cm": float(diameter_of(self.V_all[pid, 0]).mean()),
        }, ("chemo_shift", "radio_shift"))

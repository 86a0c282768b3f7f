"""Generate a carry-over world: sites, patients, the logged data and everything the ground truth needs.

Order of the draws (each from its own stream, so none depends on another's size):

1. sites: each patient's site by the project's Dirichlet rule
   (:func:`~fcd_secure.data.worlds.generation.assign_sites`, seed ``seed``), then the site-level parameters (their own
   stream): a case-mix shift ``m_s`` of the log untreated severity (a site with ``m_s > 0`` sees sicker patients) and
   the site's practice shift ``b_s`` of the logging policy's logit (:mod:`.behaviour`);
2. patients: each patient's own stream (:func:`~.noise.patient_streams`) gives the hidden parameters and the
   recorded covariates (:func:`patients`), the length and the per-step uniforms;
3. logging: the behaviour policy (:mod:`.behaviour`) and the structural model (:mod:`.model`) run step by step;
4. split: per site, the project's train/test rule, then the anchors by the project's rule
   (:func:`~fcd_secure.data.worlds.generation.sites_and_anchors`).

As in the other worlds the site is a cause of the data (its case mix and practice), so it is drawn before any
patient exists, with one key class (:func:`~fcd_secure.data.worlds.generation.assign_sites` says why).
"""

from __future__ import annotations

import numpy as np

from fcd_secure.data.carryover.behaviour import action_probs
from fcd_secure.data.carryover.config import CarryoverConfig
from fcd_secure.data.carryover.model import (
    ACTION_LABELS,
    CONTEXT_NAMES,
    FEATURE_NAMES,
    N_ACTIONS,
    PatientParams,
    step,
)
from fcd_secure.data.carryover.noise import patient_streams
from fcd_secure.data.carryover.world import CarryoverWorld
from fcd_secure.data.worlds.generation import assign_sites, lengths_from_uniforms, mask_padding, sites_and_anchors

__all__ = ["generate", "patients"]

_SALT_SITES = 0x7A3E_0C02
#: log-scale spreads of the hidden parameters: untreated severity μ, the response r (its recorded marker's part and
#: the hidden rest), the toxicity κ (the recorded frailty's part and the hidden rest), and the baseline logit b
MU_SD, R_MARKER_SD, R_HIDDEN_SD, KAPPA_FRAILTY_SD, KAPPA_HIDDEN_SD, B_SD = 0.3, 0.25, 0.15, 0.3, 0.15, 0.3


def _site_parameters(cfg: CarryoverConfig) -> dict[str, np.ndarray]:
    """Site-level case mix and practice, from their own stream (independent of ``n_patients``); ``site_spread``
    scales the draws after drawing, so the stream is the same whatever the spread."""
    rng = np.random.default_rng(np.random.SeedSequence([_SALT_SITES, cfg.seed]))
    casemix = cfg.site_spread * rng.normal(0.0, cfg.site_casemix_sd, cfg.n_sites)
    practice = cfg.site_spread * rng.normal(0.0, cfg.site_practice_sd, cfg.n_sites)
    return {"casemix_shift": casemix, "practice_shift": practice}


def patients(cfg: CarryoverConfig, z: np.ndarray, casemix: np.ndarray) -> tuple[PatientParams, np.ndarray]:
    """The hidden parameters and the recorded covariates X ``[n, 2]`` (frailty, response marker) of every patient
    from their static normals ``z`` ``[n, 6]`` (:data:`~.noise.N_STATIC_NORMALS`) and their site's case-mix shift."""
    prm = PatientParams(
        mu=cfg.severity_level * np.exp(casemix + MU_SD * z[:, 0]),
        r=cfg.dose_response * np.exp(R_MARKER_SD * z[:, 1] + R_HIDDEN_SD * z[:, 2]),
        kappa=cfg.toxicity_per_dose * np.exp(KAPPA_FRAILTY_SD * z[:, 3] + KAPPA_HIDDEN_SD * z[:, 4]),
        b=cfg.baseline_logit + B_SD * z[:, 5],
    )
    return prm, np.stack([z[:, 3], z[:, 1]], axis=1)


def generate(cfg: CarryoverConfig | None = None) -> CarryoverWorld:
    """Generate a carry-over world (package and module docstrings).

    Args:
        cfg: The world's config (default: the "default" preset's sizes with seed 0).

    Returns:
        The world; deterministic given ``cfg`` (seed included).
    """
    cfg = cfg or CarryoverConfig()
    N, L, S_ = cfg.n_patients, cfg.max_len, cfg.n_sites

    # 1. sites, then their parameters
    site_of = assign_sites(cfg)
    sp = _site_parameters(cfg)
    sp["sizes"] = np.bincount(site_of, minlength=S_)

    # 2. patients: per-patient streams (common random numbers), drawn once, reused by every policy
    streams = patient_streams(cfg.seed, N, L)
    prm, X = patients(cfg, streams.static, sp["casemix_shift"][site_of])
    lengths = lengths_from_uniforms(cfg, streams.length)

    # 3. the logged data under the behaviour policy; a patient starts untreated, at its own untreated severity
    practice = sp["practice_shift"][site_of]
    Sev, Tox = np.empty((N, L + 1)), np.empty((N, L + 1))
    Sev[:, 0], Tox[:, 0] = prm.mu, 0.0
    T = np.zeros((N, L), dtype=np.int64)
    Y = np.zeros((N, L))
    P = np.ones((N, L))
    prev = np.zeros(N, dtype=np.int64)
    rows = np.arange(N)
    for t in range(L):
        pi = action_probs(cfg, Sev[:, t], Tox[:, t], prev, practice)
        # inverse-CDF draw with the patient's own uniform
        a = np.minimum((np.cumsum(pi, axis=1) <= streams.v[:, [t]]).sum(1), N_ACTIONS - 1)
        Sev[:, t + 1], Tox[:, t + 1], _, Y[:, t] = step(cfg, prm, Sev[:, t], Tox[:, t], a, streams.u[:, t])
        T[:, t], P[:, t], prev = a, pi[rows, a], a
    M, T, Y, P = mask_padding(lengths, T, Y, P)
    A = np.stack([Sev[:, :L], Tox[:, :L]], axis=-1) * M[:, :, None]

    # 4. per-site train/test split and the anchors (the project's rules)
    train, test, anchors = sites_and_anchors(
        cfg, site_of, {"X": X, "A": A.astype(np.float32), "T": T, "Y": Y, "M": M, "P": P}, dataset="carryover",
        n_actions=N_ACTIONS,
        # treatment changes both: rollouts simulate them
        columns={"x_names": list(FEATURE_NAMES), "a_names": list(CONTEXT_NAMES),
                 "a_dynamics": ["endogenous", "endogenous"], "action_names": list(ACTION_LABELS)},
        extra_meta={"gamma": cfg.gamma},
    )
    return CarryoverWorld(
        cfg=cfg,
        train=train,
        test=test,
        anchors=anchors,
        site_of=site_of,
        lengths=lengths,
        T_all=T,
        Y_all=Y,
        P_all=P,
        site_params=sp,
        params=prm,
        X_all=X,
        U=streams.u,
        S_all=Sev,
        K_all=Tox,
    )

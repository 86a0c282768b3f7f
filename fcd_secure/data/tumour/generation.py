"""Generate a tumour world: sites, patients, the logged data and everything the ground truth needs.

Order of the draws (each from its own stream, so none depends on another's size):

1. sites: each patient's site by the project's Dirichlet rule
   (:func:`~fcd_secure.data.worlds.generation.assign_sites`, seed ``seed``), then the site-level parameters (their own
   stream): a case-mix tilt ``κ_s`` of the stage distribution, ``π_s(k) ∝ π(k) · exp(κ_s (k − 2))`` over stages
   I..IV (k = 0..4; κ_s > 0 sees later stages, hence larger tumours), and the site's chemo/radio practice shifts
   ``b_{s,k}`` of the logging policy (:mod:`.behaviour`);
2. patients: each patient's own stream (:func:`~.noise.patient_streams`) gives stage (from the site's case mix),
   initial diameter, patient type, the PK-PD parameters, length and the daily volume and action noise;
3. logging: the behaviour policy (:mod:`.behaviour`) and the PK-PD model (:mod:`.pkpd`) run day by day;
4. split: per site, the project's train/test rule, then the anchors by the project's rule
   (:func:`~fcd_secure.data.worlds.generation.sites_and_anchors`).

The steps every generated world shares are :mod:`fcd_secure.data.worlds.generation`'s. As in DKT-Synth the site is a
cause of the data (its case mix and practice), so it is drawn before any patient exists, with one key class
(:func:`~fcd_secure.data.worlds.generation.assign_sites` says why).
"""

from __future__ import annotations

import numpy as np

from fcd_secure.data.tumour.behaviour import action_probs, recent_mean
from fcd_secure.data.tumour.config import TumourConfig
from fcd_secure.data.tumour.noise import patient_streams
from fcd_secure.data.tumour.pkpd import (
    ACTION_LABELS,
    ALPHA_MEAN,
    BETA_C_MEAN,
    BETA_C_SD,
    CONTEXT_NAMES,
    N_ACTIONS,
    STAGE_COUNTS,
    STAGE_DIAMETER,
    TYPE_BOOST,
    PatientParams,
    day,
    diameter_of,
    normal_cdf,
    normal_ppf,
    observed_contexts,
    volume_of,
)
from fcd_secure.data.tumour.world import TumourWorld
from fcd_secure.data.worlds.generation import assign_sites, lengths_from_uniforms, mask_padding, sites_and_anchors

__all__ = ["FEATURE_NAMES", "generate"]

#: X: the patient type (one-hot; types 1 and 3 respond more to radio- and chemotherapy) and the stage at diagnosis
#: (I..IV as 0, 0.25, ..., 1): what the clinic knows on day 0
FEATURE_NAMES = ["patient_type_1", "patient_type_2", "patient_type_3", "stage"]
_SALT_SITES = 0x7A3E_0002


def _site_parameters(cfg: TumourConfig) -> dict[str, np.ndarray]:
    """Site-level case mix and practice, from their own stream (independent of ``n_patients``); ``site_spread``
    scales the draws after drawing, so the stream is the same whatever the spread."""
    S, k = cfg.n_sites, cfg.site_spread
    rng = np.random.default_rng(np.random.SeedSequence([_SALT_SITES, cfg.seed]))
    tilt = k * rng.normal(0.0, cfg.site_casemix_sd, S)
    chemo = k * rng.normal(0.0, cfg.site_practice_sd, S)
    radio = k * rng.normal(0.0, cfg.site_practice_sd, S)
    w = STAGE_COUNTS[None, :] * np.exp(tilt[:, None] * (np.arange(len(STAGE_COUNTS))[None, :] - 2.0))
    return {"casemix_tilt": tilt, "stage_probs": w / w.sum(1, keepdims=True), "chemo_shift": chemo,
            "radio_shift": radio}


def _truncated_normal(u: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw of N(0, 1) truncated to [lo, hi] from uniforms ``u`` (one per row)."""
    a, b = normal_cdf(lo), normal_cdf(hi)
    return normal_ppf(np.clip(a + u * (b - a), 1e-300, 1.0 - 1e-16))


def _patients(cfg: TumourConfig, static: np.ndarray, alpha_rho: np.ndarray, stage_probs: np.ndarray):
    """Stage, patient type, initial diameter, PK-PD parameters and length of every patient (module docstring).

    Args:
        cfg: The world's config.
        static: Each patient's static uniforms ``[n, 5]`` (:data:`~.noise.N_STATIC_UNIFORMS`).
        alpha_rho: Each patient's accepted (α, ρ) ``[n, 2]``.
        stage_probs: Each patient's site's stage distribution ``[n, 5]``.
    """
    cdf = np.cumsum(stage_probs, axis=1)
    stage = np.minimum((cdf < static[:, [0]] * cdf[:, -1:]).sum(1), len(STAGE_COUNTS) - 1)
    mu, sd, lo, hi = STAGE_DIAMETER[stage].T
    d0 = np.exp(mu + sd * _truncated_normal(static[:, 1], (np.log(lo) - mu) / sd, (np.log(hi) - mu) / sd))
    ptype = 1 + np.minimum(np.floor(static[:, 2] * 3).astype(np.int64), 2)
    bc = _truncated_normal(static[:, 3], np.full(len(stage), -BETA_C_MEAN / BETA_C_SD), np.full(len(stage), np.inf))
    params = PatientParams(
        rho=alpha_rho[:, 1].copy(),
        alpha=alpha_rho[:, 0] + TYPE_BOOST * ALPHA_MEAN * (ptype == 1),
        beta_c=BETA_C_MEAN + BETA_C_SD * bc + TYPE_BOOST * BETA_C_MEAN * (ptype == 3),
    )
    return stage, ptype, d0, params, lengths_from_uniforms(cfg, static[:, 4])


def generate(cfg: TumourConfig | None = None) -> TumourWorld:
    """Generate a tumour world (package and module docstrings).

    Args:
        cfg: The world's config (default: the "default" preset's sizes with seed 0).

    Returns:
        The world; deterministic given ``cfg`` (seed included).
    """
    cfg = cfg or TumourConfig()
    N, L, S = cfg.n_patients, cfg.max_len, cfg.n_sites
    v_resp = float(volume_of(cfg.response_diameter))

    # 1. sites, then their parameters
    site_of = assign_sites(cfg)
    sp = _site_parameters(cfg)
    sp["sizes"] = np.bincount(site_of, minlength=S)

    # 2. patients: per-patient streams (common random numbers), drawn once, reused by every policy
    streams = patient_streams(cfg.seed, N, L)
    stage, ptype, d0, params, lengths = _patients(cfg, streams.static, streams.alpha_rho, sp["stage_probs"][site_of])

    # 3. the logged data under the behaviour policy
    chemo_shift, radio_shift = sp["chemo_shift"][site_of], sp["radio_shift"][site_of]
    V = np.empty((N, L + 1))
    V[:, 0] = volume_of(d0)
    D = np.empty((N, L))
    Cs = np.empty((N, L))
    T = np.zeros((N, L), dtype=np.int64)
    Y = np.zeros((N, L))
    P = np.ones((N, L))
    C = np.zeros(N)
    rows = np.arange(N)
    for t in range(L):
        D[:, t] = diameter_of(V[:, t])
        pi = action_probs(cfg, recent_mean(D[:, : t + 1], cfg.window), chemo_shift, radio_shift)
        cdf = np.cumsum(pi, axis=1)
        # inverse-CDF draw with the patient's own uniform
        a = np.minimum((cdf <= streams.v[:, [t]] * cdf[:, -1:]).sum(1), N_ACTIONS - 1)
        V[:, t + 1], C, _, Y[:, t] = day(params, V[:, t], C, a, streams.z[:, t], cfg.noise_sd, v_resp)
        T[:, t], P[:, t], Cs[:, t] = a, pi[rows, a], C
    M, T, Y, P = mask_padding(lengths, T, Y, P)
    A = observed_contexts(V[:, :L]) * M[:, :, None]
    X = np.concatenate([np.eye(3)[ptype - 1], (stage / 4.0)[:, None]], axis=1)

    # 4. per-site train/test split and the anchors (the project's rules)
    train, test, anchors = sites_and_anchors(
        cfg, site_of, {"X": X, "A": A, "T": T, "Y": Y, "M": M, "P": P}, dataset="tumour", n_actions=N_ACTIONS,
        # treatment changes the tumour: rollouts simulate both contexts
        columns={"x_names": FEATURE_NAMES, "a_names": CONTEXT_NAMES, "a_dynamics": ["endogenous", "endogenous"],
                 "action_names": ACTION_LABELS},
        extra_meta={"gamma": cfg.gamma},
    )
    return TumourWorld(
        cfg=cfg,
        train=train,
        test=test,
        anchors=anchors,
        site_of=site_of,
        stage=stage,
        patient_type=ptype,
        params=params,
        lengths=lengths,
        Z=streams.z,
        V_all=V,
        C_all=Cs,
        T_all=T,
        Y_all=Y,
        P_all=P,
        site_params=sp,
    )

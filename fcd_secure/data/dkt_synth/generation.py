"""Generate a DKT-Synth world: sites, students, the logged data and everything the ground truth needs.

Order of the draws (each from its own stream, so none depends on another's size; the steps every generated world
shares are :mod:`fcd_secure.data.worlds.generation`'s):

1. sites: each student's site by the project's Dirichlet rule with one key class
   (:func:`~fcd_secure.data.worlds.generation.assign_sites`, which says why), then the site-level parameters
   (``SeedSequence([seed, 1])``): site-shifted ability, confounder and covariate means, site-specific logging bias;
2. students: each student's own stream (:func:`~.noise.student_streams`) gives latents, covariates, length and the
   outcome/action noise;
3. logging: the behaviour policy (:mod:`.behaviour`) run along the oracle, step by step;
4. split: per site, the project's train/test rule, then the anchors by the project's rule
   (:func:`~fcd_secure.data.worlds.generation.sites_and_anchors`).
"""

from __future__ import annotations

import numpy as np
import torch

from fcd_secure.data.dkt_synth.behaviour import (
    behaviour_probs,
    designated_items,
    item_constants,
    reference_logit,
    reference_profile,
)
from fcd_secure.data.dkt_synth.config import DKTSynthConfig
from fcd_secure.data.dkt_synth.noise import student_streams
from fcd_secure.data.dkt_synth.oracle import N_ITEMS, load_oracle
from fcd_secure.data.dkt_synth.world import DKTSynthWorld, clock_context
from fcd_secure.data.worlds.generation import assign_sites, lengths_from_uniforms, mask_padding, sites_and_anchors

__all__ = ["CONTEXT_NAMES", "FEATURE_NAMES", "ITEM_LABELS", "generate"]

FEATURE_NAMES = ["prior_score_proxy", "pretest_proxy", "site_covariate", "binary_covariate"]
#: the action labels (policies may name items by them)
ITEM_LABELS = [f"item {k}" for k in range(N_ITEMS)]
#: the one context column, A_t = t / (L − 1) (:func:`~.world.clock_context`)
CONTEXT_NAMES = ["step_index_normalised"]


def _site_parameters(cfg: DKTSynthConfig) -> dict[str, np.ndarray]:
    """Site-level latent means and logging biases, from their own stream (independent of ``n_students``).

    ``site_spread`` scales every draw's distance from its centre after the draw, so the stream (and every world with
    the default spread of 1) stays the same whatever the spread."""
    S, K, k = cfg.n_sites, N_ITEMS, cfg.site_spread
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))
    return {
        "mu_theta": k * rng.normal(0.0, 0.3, S),
        "mu_u": k * rng.normal(0.0, 0.5, S),
        "sd_u": rng.uniform(0.5, 1.5, S) ** k,  # an s.d. spreads on the log scale: positive at any spread
        "mu_x3": k * rng.normal(0.0, 0.5, S),
        "item_bias": k * rng.normal(0.0, cfg.site_item_bias_sd, (S, K)),
        "anchor_tilt": k * rng.normal(0.0, cfg.site_anchor_tilt_sd, S),
    }


def generate(cfg: DKTSynthConfig | None = None) -> DKTSynthWorld:
    """Generate a DKT-Synth world (package and module docstrings).

    Args:
        cfg: The world's config (default: the "default" preset's sizes with seed 0).

    Returns:
        The world; deterministic given ``cfg`` (seed included).

    Raises:
        OracleChecksumError: The oracle weights do not match their recorded SHA-256.
        FileNotFoundError: The oracle weights are missing.
    """
    cfg = cfg or DKTSynthConfig()
    oracle, card = load_oracle(cfg.oracle_path)
    K, L, N, S = N_ITEMS, cfg.max_len, cfg.n_students, cfg.n_sites
    profile = reference_profile(oracle)
    designated = designated_items(profile)

    # 1. sites, then their parameters
    site_of = assign_sites(cfg)
    sp = _site_parameters(cfg)
    sp["sizes"] = np.bincount(site_of, minlength=S)

    # 2. students: per-student streams (common random numbers), drawn once, reused by every policy
    normals, unif = student_streams(cfg.seed, N, L)
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
    lengths = lengths_from_uniforms(cfg, unif[:, 1])
    U = unif[:, 2 : 2 + L].copy()
    V = unif[:, 2 + L :]

    # 3. the logged data under the behaviour policy
    item_const = item_constants(cfg, designated, sp["item_bias"], sp["anchor_tilt"])  # [S, K]
    pol_const = torch.from_numpy(item_const[site_of])  # [N, K]
    d = torch.from_numpy(profile["difficulty"])
    logit_ref = reference_logit(profile)
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
    M, T, Y, P = mask_padding(lengths, T, Y, P)
    A = clock_context(M)

    # 4. per-site train/test split and the anchors (the project's rules)
    train, test, anchors = sites_and_anchors(
        cfg, site_of, {"X": X, "A": A, "T": T, "Y": Y, "M": M, "P": P}, dataset="dkt_synth", n_actions=K,
        # the clock is exogenous: no action changes it, so rollouts replay it
        columns={"x_names": FEATURE_NAMES, "a_names": CONTEXT_NAMES, "a_dynamics": ["exogenous"],
                 "action_names": ITEM_LABELS},
    )
    return DKTSynthWorld(
        cfg=cfg,
        oracle=oracle,
        oracle_card=card,
        train=train,
        test=test,
        anchors=anchors,
        site_of=site_of,
        theta=theta,
        u=u,
        lengths=lengths,
        U=U,
        T_all=T,
        Y_all=Y,
        P_all=P,
        site_params={**sp, "item_const": item_const, "logit_ref": logit_ref},
        designated=designated,
        profile=profile,
    )

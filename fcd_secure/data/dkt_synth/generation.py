"""Generate a DKT-Synth world: sites, students, the logged data and everything the ground truth needs.

Order of the draws (each from its own stream, so none depends on another's size):

1. sites: each student's site by the project's Dirichlet rule
   (:func:`~fcd_secure.data.partition.dirichlet_assignment`, seed ``seed``), then the site-level parameters
   (``SeedSequence([seed, 1])``);
2. students: each student's own stream (:func:`~.noise.student_streams`) gives latents, covariates, length and the
   outcome/action noise;
3. logging: the behaviour policy (:mod:`.behaviour`) run along the oracle, step by step;
4. split: per site, the project's train/test rule (:func:`~fcd_secure.data.partition.site_splits`, the seeds of
   every federated dataset), then the anchors by the project's rule
   (:func:`~fcd_secure.data.policy.anchor_actions` on the training sites).

Why the site draw uses one key class where the real datasets use an outcome-rate key (label skew): here the site
is a *cause* of the data (site-shifted ability, confounder and covariate means, site-specific logging bias), so it
is drawn before any student exists and there is no outcome to key on; the heterogeneity between sites comes from
the site parameters instead. With one class the rule is Dirichlet(α) site sizes over exchangeable students, with
the project's minimum site size.
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
from fcd_secure.data.partition import dirichlet_assignment, site_splits
from fcd_secure.data.policy import anchor_actions
from fcd_secure.data.schema import SiteDataset

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
    lo = cfg.resolved_min_len
    profile = reference_profile(oracle)
    designated = designated_items(profile)

    # 1. sites, then their parameters
    site_of = dirichlet_assignment(np.zeros(N, dtype=np.int64), S, cfg.dirichlet_alpha, cfg.seed, unit="students")
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
    lengths = lo + np.floor(unif[:, 1] * (L - lo + 1)).astype(np.int64)
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
    M = (np.arange(L)[None, :] < lengths[:, None]).astype(np.float32)
    T = T * M.astype(np.int64)
    Y = Y * M
    P = np.where(M > 0, P, 1.0)
    A = clock_context(M)

    # 4. per-site train/test split and the anchors (the project's rules)
    splits = site_splits(site_of, S, cfg.test_fraction, cfg.seed)

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
                "x_names": FEATURE_NAMES,
                "a_names": list(CONTEXT_NAMES),
                "a_dynamics": ["exogenous"],  # the clock: no action changes it, so rollouts replay it
                "action_names": list(ITEM_LABELS),
                "preset": cfg.preset,
                "seed": cfg.seed,
            },
        )

    train = [site_ds(s, tr, "train") for s, (tr, _) in enumerate(splits)]
    test = [site_ds(s, te, "test") for s, (_, te) in enumerate(splits)]
    return DKTSynthWorld(
        cfg=cfg,
        oracle=oracle,
        oracle_card=card,
        train=train,
        test=test,
        anchors=anchor_actions(train),
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

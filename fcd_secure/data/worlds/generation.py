"""The generation steps the worlds share: sites, lengths, the padding mask, and the per-site datasets and anchors.

A world's ``generate`` draws, in this order and each from its own stream (so none depends on another's size):

1. sites: each entity's site (:func:`assign_sites`), then the world's site-level parameters (its own stream);
2. entities: each entity's own stream (:func:`~.noise.entity_generators`) gives its latents, covariates, length
   (:func:`lengths_from_uniforms`) and its outcome and action noise;
3. logging: the world's behaviour policy run along its structural model, step by step; then :func:`mask_padding`;
4. split: :func:`sites_and_anchors`, per site the project's train/test rule and then the project's anchors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fcd_secure.data.partition import dirichlet_assignment, site_splits
from fcd_secure.data.policy import anchor_actions
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.worlds.config import WorldConfig

__all__ = ["assign_sites", "lengths_from_uniforms", "mask_padding", "sites_and_anchors"]


def assign_sites(cfg: WorldConfig) -> np.ndarray:
    """Each entity's site (int64 ``[n]``) by the project's Dirichlet rule
    (:func:`~fcd_secure.data.partition.dirichlet_assignment`, seed ``cfg.seed``) with one key class.

    Why one key class where the real datasets use an outcome-rate key (label skew): in a generated world the site is a
    *cause* of the data (site-shifted latents or case mix, a site's own logging practice), so it is drawn before any
    entity exists and there is no outcome to key on; the heterogeneity between sites comes from the site parameters
    instead. With one class the rule is Dirichlet(α) site sizes over exchangeable entities, with the project's minimum
    site size.
    """
    n = cfg.n_entities
    return dirichlet_assignment(np.zeros(n, dtype=np.int64), cfg.n_sites, cfg.dirichlet_alpha, cfg.seed,
                                unit=f"{cfg.ENTITY}s")


def lengths_from_uniforms(cfg: WorldConfig, u: np.ndarray) -> np.ndarray:
    """Lengths ``L_i ~ Uniform{min_len..L}`` (int64) from each entity's uniform ``u`` in [0, 1).

    Drawn independently of treatment: every arm of a counterfactual has the entity's length, and a rollout may use
    it whatever the policy.
    """
    lo = cfg.resolved_min_len
    return np.minimum(lo + np.floor(u * (cfg.max_len - lo + 1)).astype(np.int64), cfg.max_len)


def mask_padding(
    lengths: np.ndarray, T: np.ndarray, Y: np.ndarray, P: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(M, T, Y, P)``: the valid-step mask (float32 ``[n, L]``) and the logged actions, outcomes and propensities
    with padding set to 0 (``T``, ``Y``) and 1 (``P``).

    The generators simulate every step of ``[0, L)``; steps past an entity's length are dropped here.
    """
    M = (np.arange(T.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
    return M, T * M.astype(np.int64), Y * M, np.where(M > 0, P, 1.0)


def sites_and_anchors(
    cfg: WorldConfig,
    site_of: np.ndarray,
    logged: Mapping[str, np.ndarray],
    *,
    dataset: str,
    n_actions: int,
    columns: Mapping[str, Sequence[str]],
    extra_meta: Mapping[str, Any] | None = None,
) -> tuple[list[SiteDataset], list[SiteDataset], tuple[int, int]]:
    """Per site the project's train/test split (:func:`~fcd_secure.data.partition.site_splits`, the seeds of every
    federated dataset), then the anchors by the project's rule (:func:`~fcd_secure.data.policy.anchor_actions` on the
    training sites).

    Args:
        cfg: The world's config (sites, test fraction, seed, preset).
        site_of: Each entity's site ``[N]``.
        logged: ``X`` ``[N, dx]``, ``A`` ``[N, L, da]``, ``T``, ``Y``, ``M``, ``P`` ``[N, L]``, indexed by global id.
        dataset: The world's dataset name (``meta['dataset']``, the prefix of each site's name).
        n_actions: |T|.
        columns: ``x_names``, ``a_names``, ``a_dynamics`` and ``action_names`` (copied into each site's meta).
        extra_meta: Meta entries after the provenance (``preset``, ``seed``).

    Returns:
        ``(train, test, anchors)``.
    """
    X, A, T, Y, M, P = (logged[k] for k in ("X", "A", "T", "Y", "M", "P"))
    # the global id of each row (one trajectory per entity) is its entity; its name, what a per-entity file shows and
    # what the site's splits are keyed by (data.cohorts.row_ids), is the id written out
    names = [str(i) for i in range(len(site_of))]

    def site_ds(s: int, ids: np.ndarray, split: str) -> SiteDataset:
        return SiteDataset(
            X=X[ids].astype(np.float32),
            A=A[ids],
            T=T[ids],
            Y=Y[ids].astype(np.float32),
            M=M[ids],
            P=P[ids].astype(np.float32),
            n_actions=n_actions,
            name=f"{dataset}/site{s}/{split}",
            meta={
                "dataset": dataset,
                "site": s,
                "split": split,
                "entity": ids,
                "entity_names": names,
                **{k: list(v) for k, v in columns.items()},
                "preset": cfg.preset,
                "seed": cfg.seed,
                **(extra_meta or {}),
            },
        )

    # keyed by each entity's global id (data.cohorts), which its sites' row ids repeat
    splits = site_splits(site_of, cfg.n_sites, cfg.test_fraction, cfg.seed)
    train = [site_ds(s, tr, "train") for s, (tr, _) in enumerate(splits)]
    test = [site_ds(s, te, "test") for s, (_, te) in enumerate(splits)]
    return train, test, anchor_actions(train)

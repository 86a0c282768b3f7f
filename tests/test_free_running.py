"""The free-running loss (``model.free_running_steps``, model/free_running.py): it measures the error the simulator
makes on its own contexts k steps ahead, which compounds, where the one-step context loss sees only one step's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcd_secure.audit.allowlist import TRAIN_METRICS
from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import Batch
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.context import l_context
from fcd_secure.model.free_running import l_free_running, step_weights
from fcd_secure.model.networks import FedCausalDiff
from fcd_secure.model.training import batch_loss, dataset_tensors

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_SITES = 2
LEVEL = 0.7  # the constant endogenous context of every row


def constant_context_site(n: int = 5, L: int = 6, seed: int = 0) -> SiteDataset:
    """Full-length rows whose one (endogenous) context column stays at LEVEL."""
    rng = np.random.default_rng(seed)
    return SiteDataset(
        X=rng.normal(size=(n, 2)).astype(np.float32),
        A=np.full((n, L, 1), LEVEL, dtype=np.float32),
        T=rng.integers(0, 2, size=(n, L)).astype(np.int64),
        Y=rng.integers(0, 2, size=(n, L)).astype(np.float32),
        M=np.ones((n, L), dtype=np.float32),
        n_actions=2,
        name="constant",
    )


def cfg_of(**kw) -> ModelConfig:
    base = dict(k_causal=2, k_site=2, hidden=6, action_emb=3, mlp_hidden=6, time_emb=4, diffusion_steps=6,
                sampler_steps=2, cf_sampler_steps=2, cf_horizon=2, transition="deterministic", ipw="off")
    base.update(kw)
    return ModelConfig(**base)


def drifting_model(cfg: ModelConfig, ds: SiteDataset, drift: float) -> FedCausalDiff:
    """A network whose context head adds ``drift`` every step (Â_{t+1} = A_t + drift) and whose transition and decoder
    do not read the context, so that only the contexts' own error differs between two drifts."""
    torch.manual_seed(0)
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES, n_endogenous=1)
    k, da = cfg.k, ds.da
    with torch.no_grad():
        model.context_head.net[-1].bias[0] = drift  # b; the rate m stays 0 (the affine head's zero start)
        model.decoder[0].weight[:, k:k + da] = 0.0  # decoder input [K, A]
        for net in (model.eps_c, model.eps_s):  # deterministic transition input [x_n, K, A, ...]
            net[0].weight[:, 2 * k:2 * k + da] = 0.0
        model.trunk.weight_ih_l0[:, ds.dx:ds.dx + da] = 0.0  # encoder input [X, A_t, emb(T_{t-1}), Y_{t-1}, 1{t=0}]
    return model


def free_and_context(model: FedCausalDiff, ds: SiteDataset) -> tuple[float, float]:
    batch = Batch.of(dataset_tensors(ds, site_index=0))
    with torch.no_grad():
        Kc, Ks, h = model.encode_states(batch.X, batch.A, batch.T, batch.Y)
        K = torch.cat([Kc, Ks], -1)
        return float(l_free_running(model, K, h, batch).mean()), float(l_context(model, K, batch).mean())


@pytest.mark.parametrize(("rollout", "stride"), [("latent", 1), ("latent", 2), ("encoder", 1)])
@pytest.mark.parametrize(("discount", "factor"), [(1.0, (1 + 4 + 9) / 3), (0.5, (4 * 1 + 2 * 4 + 1 * 9) / 7)])
def test_a_one_step_context_error_compounds_in_the_free_running_loss(discount, factor, rollout, stride):
    """A head that drifts by δ per step is off by rδ after r steps of its own contexts: L_free (k = 3) grows by
    Σ_r w_r (rδ)², the one-step L_context by δ² only (from every start step, every second one, or through the
    encoder from t = 0)."""
    ds = constant_context_site()
    # the outcome first: its decoder does not read the drifting contexts, so only the context term moves
    cfg = cfg_of(free_running_steps=3, free_running_discount=discount, free_running_stride=stride, rollout=rollout,
                 outcome_reads_contexts=False)
    delta = 0.1
    free0, ctx0 = free_and_context(drifting_model(cfg, ds, 0.0), ds)
    free1, ctx1 = free_and_context(drifting_model(cfg, ds, delta), ds)
    assert ctx0 == pytest.approx(0.0, abs=1e-10)
    assert ctx1 == pytest.approx(delta**2, rel=1e-4)
    assert free1 - free0 == pytest.approx(factor * delta**2, rel=1e-4)


def test_step_weights_sum_to_one_and_discount_the_far_steps():
    torch.testing.assert_close(step_weights(3, 1.0), torch.full((3,), 1 / 3))
    torch.testing.assert_close(step_weights(3, 0.5), torch.tensor([4 / 7, 2 / 7, 1 / 7]))


def test_the_loss_is_off_by_default_and_its_part_stays_on_the_site():
    """Default k = 0 adds nothing (the run's objective is unchanged); on, its part is reported locally but is not a
    train metric the egress gate lets out (no new figure leaves a site)."""
    ds = constant_context_site()
    assert ModelConfig().free_running_steps == 0
    batch = dataset_tensors(ds, site_index=0)
    off = cfg_of()
    on = cfg_of(free_running_steps=2)
    torch.manual_seed(1)
    _, parts_off = batch_loss(FedCausalDiff.from_dims(off, ds.dx, ds.da, 2, N_SITES, 1), batch, off, N_SITES)
    torch.manual_seed(1)
    _, parts_on = batch_loss(FedCausalDiff.from_dims(on, ds.dx, ds.da, 2, N_SITES, 1), batch, on, N_SITES)
    assert "free" not in parts_off
    assert parts_on["free"] > 0
    assert "free" not in TRAIN_METRICS


def test_a_horizon_longer_than_the_trajectories_is_cut_to_them():
    ds = constant_context_site(L=3)
    cfg = cfg_of(free_running_steps=10)
    model = drifting_model(cfg, ds, 0.1)
    free, _ = free_and_context(model, ds)
    assert np.isfinite(free)


def test_through_the_encoder_without_endogenous_contexts_the_loss_is_zero():
    """Every context replayed: an encoder rollout under the logged actions re-reads the logged history (L_recon
    again), so L_free adds nothing there."""
    ds = constant_context_site()
    cfg = cfg_of(free_running_steps=3, rollout="encoder")
    torch.manual_seed(0)
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES, n_endogenous=0)
    batch = Batch.of(dataset_tensors(ds, site_index=0))
    Kc, Ks, h = model.encode_states(batch.X, batch.A, batch.T, batch.Y)
    assert float(l_free_running(model, torch.cat([Kc, Ks], -1), h, batch).abs().sum()) == 0.0


def test_a_run_from_before_the_keys_resumes_and_the_loss_is_in_the_training_hash():
    """Off, the loss's keys leave the training hash as it was before they existed (such a run's checkpoint resumes);
    on, every one of them changes it. A full model dump without them (and without ``context_head``) still reads
    back as a run from before ``context_head`` existed."""
    from fcd_secure.config import RunConfig
    from fcd_secure.model.config import FREE_RUNNING_KEYS

    base = RunConfig.model_validate({})
    off = RunConfig.model_validate({"model": {"free_running_discount": 0.5, "free_running_stride": 3}})
    assert off.training_hash() == base.training_hash()
    on = {RunConfig.model_validate({"model": {"free_running_steps": 5, **kw}}).training_hash()
          for kw in ({}, {"free_running_discount": 0.5}, {"free_running_stride": 2}, {"lambda_free_running": 2.0})}
    assert len(on) == 4 and base.training_hash() not in on
    old = {k: v for k, v in ModelConfig().model_dump().items() if k not in {"context_head", *FREE_RUNNING_KEYS}}
    assert ModelConfig.model_validate(old).context_head == "direct"

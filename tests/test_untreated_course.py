"""What L_free feeds forward (``model.free_running_outcome``): with ``'drawn'`` the simulator's own outcome draws,
as a rollout feeds them, so that the decoder is trained on the simulated history's outcome/context pairs. On the
tumour world a decoder trained on logged outcomes only kept a drawn Y = 1 after the generated tumour had grown past
the response size, part of why the untreated course ("never") came out too high (docs/benchmarks.md, issue 42, "The
untreated course"; measured there: not a fix, off by default)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcd_secure.config import RunConfig
from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import Batch
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.free_running import fed_outcome, l_free_running
from fcd_secure.model.networks import FedCausalDiff
from fcd_secure.model.training import dataset_tensors

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_SITES = 2


def untreated_site(n: int = 6, L: int = 5) -> SiteDataset:
    """Rows logged with no response at any step (Y = 0) and one endogenous context."""
    rng = np.random.default_rng(0)
    return SiteDataset(
        X=rng.normal(size=(n, 2)).astype(np.float32),
        A=rng.uniform(0.2, 0.8, size=(n, L, 1)).astype(np.float32),
        T=np.zeros((n, L), dtype=np.int64),
        Y=np.zeros((n, L), dtype=np.float32),
        M=np.ones((n, L), dtype=np.float32),
        n_actions=2,
        name="untreated",
    )


def cfg_of(**kw) -> ModelConfig:
    base = dict(k_causal=2, k_site=2, hidden=6, action_emb=3, mlp_hidden=6, time_emb=4, diffusion_steps=6,
                sampler_steps=2, cf_sampler_steps=2, cf_horizon=2, transition="deterministic", ipw="off",
                free_running_steps=4)
    base.update(kw)
    return ModelConfig(**base)


def sure_responder(cfg: ModelConfig, ds: SiteDataset) -> FedCausalDiff:
    """A network whose outcome model says P(Y = 1) = 1 at every step, whatever the state: its draws are all 1, where
    the log says 0."""
    torch.manual_seed(0)
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES, n_endogenous=1)
    with torch.no_grad():
        model.decoder[-1].weight.zero_()
        model.decoder[-1].bias.fill_(30.0)
    return model


def outcomes_fed(cfg: ModelConfig) -> list[float]:
    """The outcomes the context head and the encoder read at each step of L_free (recorded by forward hooks)."""
    ds = untreated_site()
    model = sure_responder(cfg, ds)
    seen: list[float] = []
    hooks = [model.context_head.register_forward_hook(lambda m, args, out: seen.append(float(args[3].detach().mean()))),
             model.trunk.register_forward_hook(
                 lambda m, args, out: seen.append(float(args[0][:, -1, -2].detach().mean())) if args[0].shape[1] == 1 else None)]
    batch = Batch.of(dataset_tensors(ds, site_index=0))
    Kc, Ks, h = model.encode_states(batch.X, batch.A, batch.T, batch.Y)
    loss = l_free_running(model, torch.cat([Kc, Ks], -1), h, batch)
    for hk in hooks:
        hk.remove()
    assert torch.isfinite(loss).all()
    return seen


@pytest.mark.parametrize("rollout", ["encoder", "latent"])
def test_drawn_outcomes_are_the_models_own_where_logged_ones_are_the_logs(rollout):
    """The model is sure of a response, the log shows none: 'logged' feeds the context head (and the encoder) the
    log's 0 at every step, 'drawn' the model's own 1, as its rollout would."""
    logged = outcomes_fed(cfg_of(rollout=rollout))
    drawn = outcomes_fed(cfg_of(rollout=rollout, free_running_outcome="drawn"))
    assert len(logged) == len(drawn) >= 4
    assert logged == [0.0] * len(logged)
    assert drawn == [1.0] * len(drawn)


def test_a_drawn_outcome_is_a_draw_of_the_outcome_model():
    """Bernoulli of the decoder's probability (here σ(logit) = 0.3 everywhere), no gradient; 'logged' is the log."""
    ds = untreated_site(n=4000, L=2)
    cfg = cfg_of(free_running_outcome="drawn")
    model = sure_responder(cfg, ds)
    with torch.no_grad():
        model.decoder[-1].bias.fill_(float(np.log(0.3 / 0.7)))
    b = Batch.of(dataset_tensors(ds, site_index=0))
    K = torch.cat(model.encode(b.X, b.A, b.T, b.Y), -1)
    torch.manual_seed(3)
    y = fed_outcome(model, K[:, 0], b.A[:, 0], b.T[:, 0], b.Y[:, 0])
    assert set(np.unique(y.numpy())) <= {0.0, 1.0} and not y.requires_grad
    assert float(y.mean()) == pytest.approx(0.3, abs=0.03)  # 4000 draws: SD 0.007
    logged = b.Y[:, 0]
    assert fed_outcome(FedCausalDiff.from_dims(cfg_of(), ds.dx, ds.da, 2, N_SITES, 1), K[:, 0], b.A[:, 0], b.T[:, 0],
                       logged) is logged


def test_the_setting_is_in_the_training_hash_only_where_the_loss_is_on():
    """Off by default ('logged', the loss as it was); with L_free on, 'drawn' is another objective (another hash);
    with L_free off it changes nothing (a run from before the key resumes)."""
    assert ModelConfig().free_running_outcome == "logged"
    base = RunConfig.model_validate({}).training_hash()
    assert RunConfig.model_validate({"model": {"free_running_outcome": "drawn"}}).training_hash() == base
    on = RunConfig.model_validate({"model": {"free_running_steps": 5}}).training_hash()
    drawn = RunConfig.model_validate({"model": {"free_running_steps": 5, "free_running_outcome": "drawn"}})
    assert drawn.training_hash() != on

"""The deterministic transition's rollout is a Monte-Carlo g-formula: each simulated step conditions on the
outcomes drawn before it (Robins 1986; Taubman et al. 2009, Int J Epidemiol 38:1599), not on a mean path
(``ModelConfig.rollout_kind``, ``model.simulate``). Issue 42 item 3: the latent rollout of the deterministic
transition under-stated always − never on the tumour and carry-over worlds (docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcd_secure.config import build_config
from fcd_secure.model import ModelConfig
from fcd_secure.model.baselines import GFormulaSimulator
from tests.test_model_core import TINY, make_ds

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_auto_rollout_is_the_encoder_for_the_deterministic_transition_only():
    assert ModelConfig().rollout == "auto" and ModelConfig().rollout_kind == "latent"  # the paper's, diffusion
    assert ModelConfig(transition="deterministic").rollout_kind == "encoder"
    # an explicit choice is kept
    assert ModelConfig(transition="deterministic", rollout="latent").rollout_kind == "latent"
    assert ModelConfig(rollout="encoder").rollout_kind == "encoder"
    # a diffusion run's 'auto' trains and rolls out as 'latent' did: its checkpoint still resumes
    auto, latent = (build_config("tiny", {"model": {"rollout": r}}) for r in ("auto", "latent"))
    assert auto.training_hash() == latent.training_hash()
    det = build_config("tiny", {"model": {"transition": "deterministic"}})
    assert det.training_hash() != det.model_copy(
        update={"model": det.model.model_copy(update={"rollout": "latent"})}).training_hash()


def test_the_deterministic_transition_conditions_each_step_on_the_drawn_history():
    # Y_t depends on Y_{t-1} (make_ds): a g-formula draws Y_{t-1} and predicts Y_t given the draw
    ds = make_ds(n=12, L=6)
    sim = GFormulaSimulator.from_dims(GFormulaSimulator.configure(TINY), ds.dx, ds.da, ds.n_actions, 3)
    sim.train_site(ds, 0, 3, epochs=2, seed=0)
    r = sim.simulate(ds, 1, n_samples=6, seed=3)
    n, S, H = r.probs.shape
    # the probability of every simulated step is the model's one-step prediction after the drawn history: the
    # encoder reading (X, A, the simulated actions, the drawn outcomes) as if they had been logged
    X = torch.as_tensor(ds.X).repeat_interleave(S, 0)
    A = torch.as_tensor(ds.A[:, :H]).repeat_interleave(S, 0)
    T = torch.as_tensor(r.actions.reshape(n * S, H))
    Y = torch.as_tensor(r.y.reshape(n * S, H))
    core = sim.module
    with torch.no_grad():
        Kc, Ks = core.encode(X, A, T, Y)
        expect = core.outcome_mean(torch.cat([Kc, Ks], -1), A, T).numpy().reshape(n, S, H)
    np.testing.assert_allclose(r.probs, expect, rtol=0, atol=1e-5)
    assert r.meta["rollout"] == "encoder"
    # and the draws matter: two futures of one patient that drew different outcomes differ afterwards
    assert (r.probs[:, :, 1:].std(1) > 1e-4).any()
    # the latent rollout of the same model keeps one path per patient whatever was drawn (a mean state)
    flat = sim.simulate(ds, 1, n_samples=6, seed=3, rollout="latent")
    assert np.allclose(flat.probs.std(1), 0.0, atol=1e-6)

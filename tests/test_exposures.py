"""The encoder's treatment-history features (``model.exposure_decays``): the decayed counts of the actions taken
before each step, computed from the logs in training and advanced step by step in a rollout, the same numbers both
ways (a rollout that fed its encoder other features than training did would answer from another model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcd_secure.model import ModelConfig
from fcd_secure.model.networks import FedCausalDiff
from tests.test_model_core import TINY

DECAYS = (0.5, 1.0)


def _model(decays=DECAYS) -> FedCausalDiff:
    return FedCausalDiff.from_dims(TINY.model_copy(update={"exposure_decays": decays}), dx=2, da=2, n_actions=3,
                                   n_sites=2, n_endogenous=1)


def test_the_features_are_the_decayed_counts_of_earlier_actions():
    T = torch.tensor([[2, 0, 0, 1, 2]])
    e = _model().exposures(T).view(1, 5, 2, 3)  # [B, L, decay, action]
    assert torch.all(e[:, 0] == 0)  # nothing was given before the first step
    # λ = 0.5 at t = 3 (actions 2, 0, 0 before it): a0 = 0.5 + 1, a2 = 0.25
    assert torch.allclose(e[0, 3, 0], torch.tensor([1.5, 0.0, 0.25]))
    assert torch.allclose(e[0, 4, 1], torch.tensor([2.0, 1.0, 1.0]))  # λ = 1: the counts of T_0..T_3
    assert _model(()).exposures(T).shape == (1, 5, 0)


def test_a_rollout_advances_the_features_as_training_computes_them():
    torch.manual_seed(0)
    m = _model().eval()
    B, L = 4, 6
    X, A = torch.randn(B, 2), torch.randn(B, L, 2)
    T, Y = torch.randint(0, 3, (B, L)), torch.randint(0, 2, (B, L)).float()
    with torch.no_grad():
        Kc, Ks, _ = m.encode_states(X, A, T, Y)
        K, state = m.encode_prefix(X, A, T, Y, 1)
        for t in range(1, L - 1):  # replaying the logged steps through the rollout's encoder gives training's K
            K, state = m.encode_step(state, X, A[:, t + 1], T[:, t], Y[:, t])
            assert torch.allclose(K, torch.cat([Kc, Ks], -1)[:, t + 1], atol=1e-5)
        # the same from t = 0 with the free-running loss's start state
        h = m.encode_states(X, A, T, Y)[2]
        K0, s0 = m.encode_step(m.start_state(h[:, 0]), X, A[:, 1], T[:, 0], Y[:, 0])
        assert torch.allclose(K0, torch.cat([Kc, Ks], -1)[:, 1], atol=1e-5)


def test_the_features_change_what_the_encoder_reads_and_bad_decays_are_refused():
    assert _model().trunk.input_size == _model(()).trunk.input_size + 2 * 3
    with pytest.raises(ValueError, match="exposure_decays"):
        ModelConfig(exposure_decays=(0.0,))
    with pytest.raises(ValueError, match="exposure_decays"):
        ModelConfig(exposure_decays=(1.5,))
    assert np.isclose(ModelConfig(exposure_decays=[0.5]).exposure_decays[0], 0.5)

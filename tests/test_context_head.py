"""The context head's forms (model/context.py, ``ModelConfig.context_head``): the affine head starts as carry
forward, a trained affine head beats carrying the context forward one step and several steps ahead on a toy whose
marker grows geometrically, and the form is a model setting (Θc shapes the same at every site, the training hash)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fcd_secure.config import RunConfig
from fcd_secure.data.preprocess import build_dataset
from fcd_secure.data.spec import DatasetSpec
from fcd_secure.model import FedCausalDiff, ModelConfig, train_local
from fcd_secure.model.context import FORMS
from fcd_secure.model.manifest import build_manifest
from tests.test_model_context import kept_range

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L = 6
SPEC = DatasetSpec.model_validate({
    "name": "growth-toy", "entity": "pid", "time": "t", "action": "arm", "actions": ["rest", "dose"],
    "outcome": "y", "max_len": L, "static": [{"name": "x", "kind": "continuous"}],
    "context": [{"name": "marker", "kind": "continuous"}],
})


def growth_table(n: int, seed: int) -> pd.DataFrame:
    """marker_{t+1} = marker_t · (1.25 − 0.45·[arm_t = dose]) + noise: growth and kill proportional to the level
    (the shape of the tumour's PK-PD model), so carrying the marker forward is wrong by 25 % a step untreated."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n):
        x = rng.normal()
        m = float(np.exp(0.3 * x + 0.2 * rng.normal()))
        for t in range(L):
            dose = rng.random() < 0.5
            y = int(rng.random() < 1 / (1 + np.exp(-(m - 1.5))))
            rows.append({"pid": e, "t": t, "x": x, "marker": m, "arm": "dose" if dose else "rest", "y": y})
            m = m * (1.25 - 0.45 * dose) + 0.01 * rng.normal()
    return pd.DataFrame(rows)


def small_cfg(**kw) -> ModelConfig:
    base = dict(hidden=16, mlp_hidden=32, k_causal=4, k_site=2, diffusion_steps=10, sampler_steps=2, time_emb=8,
                use_cf=False, use_align=False, use_dis=False, batch_size=32, lr=5e-3, seed=0, ipw="off",
                transition="deterministic")
    base.update(kw)
    return ModelConfig(**base)


def head_inputs(da: int = 3, n_actions: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(5, 7, 6, generator=g), torch.rand(5, 7, da, generator=g) + 0.1,
            torch.randint(0, n_actions, (5, 7), generator=g), torch.randint(0, 2, (5, 7), generator=g).float())


def test_an_untrained_affine_head_carries_every_context_forward_exactly():
    cfg = ModelConfig(k_causal=4, k_site=2)
    model = FedCausalDiff.from_dims(cfg, dx=2, da=3, n_actions=4, n_sites=2, n_endogenous=2)
    K, A, T, Y = head_inputs()
    with torch.no_grad():
        out = model.next_context(K, A, T, Y)
    assert out.shape == (5, 7, 2)
    torch.testing.assert_close(out, A[..., :2], rtol=0, atol=0)  # bit for bit: the change starts at exactly 0


def test_the_direct_head_does_not_start_as_carry_forward_and_the_earlier_modules_do_not_see_the_form():
    built = {f: FedCausalDiff.from_dims(ModelConfig(k_causal=4, k_site=2, context_head=f, outcome_reads_contexts=False), 2, 3, 4, 2, 2)
             for f in FORMS}
    K, A, T, Y = head_inputs()
    with torch.no_grad():
        assert not torch.allclose(built["direct"].next_context(K, A, T, Y), A[..., :2], atol=1e-3)
    # the modules built before the head start the same in every form (the head and the propensity head built after
    # it draw according to the head's shapes)
    ref = dict(built["direct"].named_parameters())
    for name, p in built["affine"].named_parameters():
        if not name.startswith(("context_head.", "propensity_head.")):
            torch.testing.assert_close(p, ref[name], rtol=0, atol=0, msg=name)
    # the affine head reads A only through the skip and reads out a change and a rate per endogenous column; the
    # manifest says so to every site
    shapes = {f: {e.name: e.shape for e in build_manifest(m).entries} for f, m in built.items()}
    H, k, E = ModelConfig().mlp_hidden, 6, ModelConfig().action_emb
    # (the outcome first: the head reads Y_t, the last input column; drawn before the outcome it reads no Y_t)
    assert shapes["direct"]["context_head.net.0.weight"] == (H, k + 3 + E + 1)
    assert shapes["affine"]["context_head.net.0.weight"] == (H, k + E + 1)
    first = FedCausalDiff.from_dims(ModelConfig(k_causal=4, k_site=2, context_head="affine"), 2, 3, 4, 2, 2)
    assert {e.name: e.shape for e in build_manifest(first).entries}["context_head.net.0.weight"] == (H, k + E)
    assert shapes["affine"]["context_head.net.2.weight"] == (4, H)
    assert shapes["direct"]["context_head.net.2.weight"] == (2, H)


def test_a_generated_context_keeps_its_sign_and_grows_at_most_geometrically():
    """Whatever the head's weights, the affine factor 1 + tanh m lies in (0, 2) ([0, 2] in float32) and the change
    does not read A: an extreme context one step on is at most 2·A + |b|, with b bounded by the head's bounded
    inputs."""
    model = FedCausalDiff.from_dims(ModelConfig(k_causal=4, k_site=2), 2, 3, 4, 2, 2)
    with torch.no_grad():
        for p in model.context_head.parameters():
            p.normal_(0.0, 1.0)
    K, A, T, Y = head_inputs()
    K = torch.tanh(K)
    with torch.no_grad():
        b = model.next_context(K, torch.zeros_like(A), T, Y)  # A = 0: the additive part alone
        for scale in (1.0, 1e3, 1e6):
            out = model.next_context(K, A * scale, T, Y)
            ratio = (out - b) / (A[..., :2] * scale)
            assert ((ratio >= 0) & (ratio <= 2 + 1e-4)).all(), (scale, ratio.min(), ratio.max())


def test_the_form_is_a_model_setting_in_the_training_hash():
    hashes = {f: RunConfig.model_validate({"model": {"context_head": f}}).training_hash() for f in FORMS}
    assert len(set(hashes.values())) == len(FORMS)
    assert RunConfig().model.context_head == "affine"
    with pytest.raises(ValueError, match="context_head"):
        ModelConfig(context_head="multiplicative")


def test_a_run_folder_written_before_the_key_reads_back_with_the_direct_head(tmp_path):
    """A run folder's config.toml is a full dump: one without ``model.context_head`` trained the direct head, so its
    Θc still loads; a hand-written partial model section takes the default."""
    cfg = RunConfig.model_validate({"model": {"lr": 1e-3}})
    old = cfg.model_dump(mode="json")
    del old["model"]["context_head"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    assert RunConfig.load(path).model.context_head == "direct"
    assert RunConfig.load(path).training_hash() != cfg.training_hash()
    assert cfg.model.context_head == "affine"


@pytest.fixture(scope="module")
def growth():
    torch.set_num_threads(1)
    train, test = build_dataset(SPEC, growth_table(300, 0)), build_dataset(SPEC, growth_table(120, 1))
    cfg = small_cfg()
    model = FedCausalDiff.from_dims(cfg, train.dx, train.da, train.n_actions, 1, n_endogenous=1)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for e in range(15):
        train_local(model, train, cfg, 0, 1, epochs=1, seed=e, optimizer=opt)
    return test, model


def test_a_trained_affine_head_beats_carry_forward_one_step_ahead(growth):
    test, model = growth
    X, A, T, Y = (torch.as_tensor(v) for v in (test.X, test.A, test.T, test.Y))
    model.eval()
    with torch.no_grad():
        K = torch.cat(model.encode(X, A, T.long(), Y), dim=-1)
        pred = model.next_context(K[:, :-1], A[:, :-1], T[:, :-1].long(), Y[:, :-1])[..., 0].numpy()
    truth, carried = test.A[:, 1:, 0], test.A[:, :-1, 0]
    pair = (test.M[:, :-1] * test.M[:, 1:]) > 0
    mse = float(np.mean((pred - truth)[pair] ** 2))
    cf = float(np.mean((carried - truth)[pair] ** 2))
    # measured here: affine 0.0021·cf, direct 0.018·cf (the bound also separates the forms)
    assert mse < 0.006 * cf, (mse, cf)


def test_a_trained_affine_head_beats_carry_forward_over_a_rollout(growth):
    test, model = growth
    # the logged actions as the plan: the logged marker is the truth (its noise is 1 % of a step's change)
    sim = kept_range(model, test).simulate(test, test.T.astype(np.int64), n_samples=2, seed=0, horizon=L,
                                           keep_contexts=True)
    gen = sim.context_values[..., 0].mean(axis=1)  # [n, L]
    ok = test.M[:, -1] > 0
    truth = test.A[ok, -1, 0]
    err = float(np.sqrt(np.mean((gen[ok, -1] - truth) ** 2)))
    cf = float(np.sqrt(np.mean((test.A[ok, 0, 0] - truth) ** 2)))
    # measured here: affine 0.057·cf, direct 0.13·cf
    assert err < 0.09 * cf, (err, cf)

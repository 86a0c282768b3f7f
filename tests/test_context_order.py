"""The order of a simulated step (``ModelConfig.outcome_reads_contexts``, model/context.py): the step's endogenous
contexts drawn first, p(A_{t+1} | H_t, do(T_t)), and the outcome read from them, P(Y_t | H_t, do(T_t), A_{t+1}) —
both factorisations of the g-formula's step (Robins 1986; Taubman et al. 2009). On a world whose outcome is a
function of the next context (as the tumour's Y_t = 1[d_{t+1} <= 3 cm]) the decoder is trained on the logged
A_{t+1}, reads the drawn Â_{t+1} in a rollout, and the drawn outcome then agrees with the drawn context. Issue 42
item 3 (docs/benchmarks.md, "The untreated course")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fcd_secure.config import build_config
from fcd_secure.data.preprocess import build_dataset
from fcd_secure.data.spec import DatasetSpec
from fcd_secure.model import FedCausalDiff, ModelConfig, train_local
from fcd_secure.model.batch import dataset_tensors
from fcd_secure.model.free_running import l_free_running
from fcd_secure.model.losses import teacher_contexts
from tests.test_model_context import kept_range
from tests.test_model_core import TINY, make_ds

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L = 6
THRESHOLD = 0.5  # Y_t = 1[marker_{t+1} > THRESHOLD]

SPEC = DatasetSpec.model_validate({
    "name": "threshold-toy", "entity": "pid", "time": "t", "action": "arm", "actions": ["rest", "dose"],
    "outcome": "y", "max_len": L, "static": [{"name": "x", "kind": "continuous"}],
    "context": [{"name": "marker", "kind": "continuous"}, {"name": "clock", "kind": "continuous", "dynamics": "exogenous"}],
})

CFG = ModelConfig(hidden=16, mlp_hidden=32, k_causal=4, k_site=2, action_emb=4, use_cf=False, use_align=False,
                  use_dis=False, batch_size=40, lr=1e-2, seed=0, transition="deterministic",
                  outcome_reads_contexts=True)


def threshold_table(n: int = 120, seed: int = 0) -> pd.DataFrame:
    """marker_{t+1} = 0.6·marker_t + 1.2·[dose] − 0.3 + noise and Y_t = 1[marker_{t+1} > 0.5]: the outcome is a
    function of the next endogenous context, as the tumour's is of the next diameter."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n):
        x = rng.normal()
        m = 0.5 * x + 0.3 * rng.normal()
        for t in range(L):
            dose = bool(rng.random() < 0.5)
            m_next = 0.6 * m + 1.2 * dose - 0.3 + 0.3 * rng.normal()
            rows.append({"pid": e, "t": t, "x": x, "marker": m, "clock": t / (L - 1), "arm": "dose" if dose else "rest",
                         "y": int(m_next > THRESHOLD)})
            m = m_next
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def trained():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a module fixture runs before the function-scoped one_torch_thread
    ds = build_dataset(SPEC, threshold_table())
    model = FedCausalDiff.from_dims(CFG, ds.dx, ds.da, ds.n_actions, 1, n_endogenous=1)
    train_local(model, ds, CFG, 0, 1, epochs=10, seed=0)
    torch.set_num_threads(before)
    return ds, model


def test_the_setting_changes_nothing_without_endogenous_contexts_and_off_keeps_the_hash():
    ds = make_ds(n=8, L=4)  # no endogenous context (DKT-Synth's case)
    on = FedCausalDiff.from_dims(TINY.model_copy(update={"outcome_reads_contexts": True}), ds.dx, ds.da, ds.n_actions, 3)
    off = FedCausalDiff.from_dims(TINY.model_copy(update={"outcome_reads_contexts": False}), ds.dx, ds.da, ds.n_actions, 3)
    assert not on.outcome_reads_contexts
    a, b = on.state_dict(), off.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # on is the default; off is the model from before the key, whose runs keep their training hash: another model
    base = build_config("tiny")
    assert base.model.outcome_reads_contexts
    assert build_config("tiny", {"model": {"outcome_reads_contexts": True}}).training_hash() == base.training_hash()
    assert build_config("tiny", {"model": {"outcome_reads_contexts": False}}).training_hash() != base.training_hash()


def test_a_run_folder_written_before_the_key_reads_back_with_the_outcome_first():
    # a run folder's config.toml is a complete dump: one written before the key trained the outcome first and must
    # resume as that model, while a hand-written partial section takes the default
    dump = build_config("tiny").model.model_dump()
    dump.pop("outcome_reads_contexts")
    assert ModelConfig.model_validate(dump).outcome_reads_contexts is False
    assert ModelConfig.model_validate({"hidden": 16}).outcome_reads_contexts is True


def test_training_feeds_the_decoder_the_logged_next_context(trained):
    ds, model = trained
    assert model.outcome_reads_contexts and not model.context_head.reads_outcome
    b = dataset_tensors(ds, 0)
    with torch.no_grad():
        Kc, Ks = model.encode(b.X, b.A, b.T, b.Y)
        K = torch.cat([Kc, Ks], -1)
        after = torch.cat([b.A[:, 1:], torch.zeros_like(b.A[:, :1])], 1)
        known = b.M * torch.cat([b.M[:, 1:], torch.zeros_like(b.M[:, :1])], 1)
        nxt = teacher_contexts(model, K, b.A, b.T, after, known)
        gen = model.next_context(K, b.A, b.T, None)
    # teacher forcing: the logged A_{t+1} wherever step t+1 is logged, the head's own Â_{t+1} at the last step
    assert known[:, :-1].sum() > 0 and (known[:, -1] == 0).all()
    torch.testing.assert_close(nxt[:, :-1, 0][known[:, :-1] > 0], b.A[:, 1:, 0][known[:, :-1] > 0])
    torch.testing.assert_close(nxt[:, -1], gen[:, -1])
    # the decoder reads it: a next marker above the threshold against one below moves P(Y_t = 1) across 1/2
    with torch.no_grad():
        hi = torch.sigmoid(model.decode(K, b.A, b.T, torch.full_like(gen, 2.0))[..., 0])
        lo = torch.sigmoid(model.decode(K, b.A, b.T, torch.full_like(gen, -1.0))[..., 0])
    valid = b.M > 0
    assert hi[valid].mean() > 0.8 and lo[valid].mean() < 0.2


def test_a_rollout_draws_the_contexts_first_and_its_outcome_agrees_with_them(trained):
    ds, model = trained
    # dose every other step: the marker swings across the threshold (cycle 1.125 / 0.375), so the link is tested
    # on both sides of it
    alternate = np.arange(L) % 2
    sim = kept_range(model, ds).simulate(ds, alternate, n_samples=3, seed=5, keep_contexts=True)
    n, S, H = sim.probs.shape
    drawn = sim.context_values[..., 0]  # [n, S, H]: A_h as the rollout used it (A_0 logged, then generated)
    # each step's probability is the decoder's at the simulated history and the step's drawn Â_{t+1}
    X = torch.as_tensor(ds.X).repeat_interleave(S, 0)
    A = torch.as_tensor(sim.context_values.reshape(n * S, H, ds.da))
    T = torch.as_tensor(sim.actions.reshape(n * S, H))
    Y = torch.as_tensor(sim.y.reshape(n * S, H))
    with torch.no_grad():
        Kc, Ks = model.encode(X, A, T, Y)
        p = torch.sigmoid(model.decode(torch.cat([Kc, Ks], -1)[:, :-1], A[:, :-1], T[:, :-1],
                                       A[:, 1:, :1])[..., 0]).numpy().reshape(n, S, H - 1)
    np.testing.assert_allclose(sim.probs[:, :, :-1], p, rtol=0, atol=1e-5)
    # and the world's link holds between the drawn outcome and the drawn next marker on (almost) every step
    above = drawn[:, :, 1:] > THRESHOLD
    assert 0.2 < above.mean() < 0.8
    agree = (sim.y[:, :, :-1] == above).mean()
    assert agree > 0.9, agree


def test_the_free_running_loss_runs_with_the_contexts_first(trained):
    # L_free's outcome term reads the generated next context (the rollout's order); its gradient reaches the decoder
    ds, _ = trained
    cfg = CFG.model_copy(update={"free_running_steps": 3})
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, 1, n_endogenous=1)
    b = dataset_tensors(ds, 0)
    Kc, Ks, h = model.encode_states(b.X, b.A, b.T, b.Y)
    loss = l_free_running(model, torch.cat([Kc, Ks], -1), h, b)
    assert torch.isfinite(loss).all() and float(loss.detach().sum()) > 0
    loss.sum().backward()
    assert model.decoder[0].weight.grad.abs().sum() > 0 and model.context_head.net[-1].weight.grad.abs().sum() > 0

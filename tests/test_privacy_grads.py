"""Our model is DP-correct under Opacus: per-sample gradients equal an explicit per-sample computation.

Issue 6 item 4. Opacus computes per-sample gradients with hooks on the leaf layers; that is only the gradient
of one record's loss if nothing in the model or the loss couples records of a batch (dp-anchors §1.2, §2).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.networks import FedCausalDiff
from fcd_secure.model.training import batch_loss, dataset_tensors

N_SITES = 3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_site(n: int = 6, L: int = 4, seed: int = 0) -> SiteDataset:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, L + 1, size=n)
    M = (np.arange(L)[None, :] < lengths[:, None]).astype(np.float32)
    return SiteDataset(
        X=rng.normal(size=(n, 2)).astype(np.float32),
        A=(rng.normal(size=(n, L, 1)) * M[..., None]).astype(np.float32),
        T=(rng.integers(0, 3, size=(n, L)) * M).astype(np.int64),
        Y=(rng.integers(0, 2, size=(n, L)) * M).astype(np.float32),
        M=M,
        n_actions=3,
        name="tiny",
    )


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(
        k_causal=2, k_site=2, hidden=6, action_emb=3, mlp_hidden=6, time_emb=4, diffusion_steps=6,
        sampler_steps=2, cf_sampler_steps=2, cf_horizon=2, diff_samples=2, dp_mode=True, align_under_dp="reference",
    )
    base.update(kw)
    return ModelConfig(**base)


def hooked(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]):
    """Opacus hooks mode on ``model`` (noise 0, huge C): returns the DP optimizer after one backward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    engine = PrivacyEngine(accountant="rdp")
    hooks, dp_opt, _ = engine.make_private(
        module=model, optimizer=opt, data_loader=DataLoader(TensorDataset(*batch), batch_size=len(batch[0])),
        noise_multiplier=0.0, max_grad_norm=1e6, poisson_sampling=False, grad_sample_mode="hooks", wrap_model=False,
    )
    return hooks, dp_opt


def rows(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad_sample.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_rows_are_single_record_gradients(got: dict[str, torch.Tensor], ref: torch.nn.Module,
                                            batch: tuple[torch.Tensor, ...], cfg: ModelConfig) -> None:
    """Opacus' per-sample rows ``got`` equal the gradient of each record's loss alone, computed on ``ref`` (a copy of
    the model before hooks): row i = ∇ℓ_i (the batch *mean*'s per-sample parts scaled back by B)."""
    names = [n for n, _ in ref.named_parameters()]
    for i in range(len(batch[0])):
        li, _ = batch_loss(ref, tuple(t[i : i + 1] for t in batch), cfg, N_SITES)
        grads = torch.autograd.grad(li, list(ref.parameters()), allow_unused=True)
        for name, g in zip(names, grads):
            g = torch.zeros_like(got[name][i]) if g is None else g
            torch.testing.assert_close(got[name][i], g, rtol=1e-4, atol=1e-6, msg=f"{name}, record {i}")


def hooked_rows_are_single_record_gradients(cfg: ModelConfig, ds: SiteDataset, terms: set[str],
                                            n_endogenous: int = 0) -> dict[str, torch.Tensor]:
    """Builds the model on ``ds`` (torch seed 0; a context head's last layer set away from the affine form's zero
    start, so that its first layer gets a gradient too), takes one hooked backward of the batch loss, whose parts
    must include ``terms``, and asserts that every parameter has per-sample rows and that they equal single-record
    gradients. Returns the rows, for the caller's own checks on them."""
    torch.manual_seed(0)
    batch = dataset_tensors(ds, site_index=1)
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES, n_endogenous=n_endogenous)
    if model.context_head is not None:
        with torch.no_grad():
            model.context_head.net[-1].weight.normal_(0.0, 0.5)
    ref = copy.deepcopy(model)
    hooks, _ = hooked(model, batch)
    loss, parts = batch_loss(model, batch, cfg, N_SITES)
    assert terms <= set(parts)
    loss.backward()
    got = rows(model)
    hooks.cleanup()
    assert set(got) == {n for n, _ in ref.named_parameters()}, "some parameters have no per-sample gradient"
    assert_rows_are_single_record_gradients(got, ref, batch, cfg)
    return got


def test_per_sample_gradients_equal_a_loop_of_single_record_batches():
    """Every term on (recon, transition, dis with GRL, cf rollout, per-sample align), encoder included."""
    # the deterministic transition makes the loss a function of the record alone, so B=1 forwards are comparable
    got = hooked_rows_are_single_record_gradients(tiny_cfg(transition="deterministic"), tiny_site(),
                                                  {"recon", "diff", "dis", "cf", "align"})
    # the encoder (DPGRU trunk) really gets a per-sample gradient from every record, not zeros that match
    trunk = got["trunk.weight_ih_l0"].flatten(1).norm(dim=1)
    assert (trunk > 0).all()


@pytest.mark.parametrize("first", [False, True], ids=["outcome-first", "contexts-first"])
@pytest.mark.parametrize("form", ["affine", "direct"])
def test_the_context_head_keeps_per_sample_gradients_in_every_form(form, first):
    """L_context is per sample in every form of the head (model/context.py) and in either order of a step
    (``outcome_reads_contexts``: the decoder then reads the logged or the head's detached contexts): Opacus' rows
    equal single-record gradients, the head's own parameters included."""
    cfg = tiny_cfg(transition="deterministic", context_head=form, outcome_reads_contexts=first)
    got = hooked_rows_are_single_record_gradients(cfg, tiny_site(seed=5), {"context"}, n_endogenous=1)
    head = got["context_head.net.0.weight"].flatten(1).norm(dim=1)
    assert (head > 0).any()


@pytest.mark.parametrize("first", [False, True], ids=["outcome-first", "contexts-first"])
@pytest.mark.parametrize("rollout", ["latent", "encoder"])
def test_the_free_running_loss_keeps_per_sample_gradients(rollout, first):
    """L_free (model/free_running.py) rolls every start step forward on the record's own axis, or the encoder one
    step at a time: Opacus' rows equal single-record gradients with the loss on, the context head fed back through
    its own outputs and the encoder's repeated steps included."""
    cfg = tiny_cfg(transition="deterministic", free_running_steps=3, rollout=rollout, outcome_reads_contexts=first)
    hooked_rows_are_single_record_gradients(cfg, tiny_site(seed=7), {"free"}, n_endogenous=1)


@pytest.mark.parametrize("align", ["reference", "batch_mmd"])
def test_one_record_changes_only_its_own_row_under_diffusion(align):
    """With the diffusion transition (random n, ε per row): changing record j leaves every other row unchanged.

    The batch MMD form is the negative control: it couples records, so the same check must fail for it.
    """
    cfg = tiny_cfg(dp_mode=(align == "reference"), lambda_align=5.0)
    assert cfg.align_form == align
    ds = tiny_site(seed=3)
    batch = dataset_tensors(ds, site_index=0)
    j = 2
    other = list(batch)
    other[0] = other[0].clone()
    other[0][j] += 3.0  # a different X for record j only
    other[3] = other[3].clone()
    other[3][j] = 1.0 - other[3][j] * ds.M[j]
    base = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES)

    def grad_rows(b):
        m = copy.deepcopy(base)
        hooks, _ = hooked(m, b)
        torch.manual_seed(11)  # same diffusion steps and noise for both datasets
        loss, _ = batch_loss(m, tuple(b), cfg, N_SITES)
        loss.backward()
        out = rows(m)
        total = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        hooks.cleanup()
        return out, total

    r1, total = grad_rows(batch)
    r2, _ = grad_rows(other)
    for name, g in total.items():  # the rows add up to the batch gradient (C is never reached here)
        torch.testing.assert_close(r1[name].sum(0) / ds.n, g, rtol=1e-4, atol=1e-6)
    diff = max(float((r1[n][i] - r2[n][i]).abs().max()) for n in r1 for i in range(ds.n) if i != j)
    own = max(float((r1[n][j] - r2[n][j]).abs().max()) for n in r1)
    assert own > 1e-4, "record j's own gradient should change"
    if align == "reference":
        assert diff < 1e-6, f"record {j} moved another record's per-sample gradient by {diff}"
    else:
        assert diff > 1e-4, "the batch MMD should couple records (negative control)"

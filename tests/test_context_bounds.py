"""Generated contexts kept in the range a site's patients had (``model.clamp_contexts``; model/context.py
``ContextBounds``): the parametric g-formula's truncation of a simulated covariate to its observed range (Taubman et
al. 2009; McGrath et al. 2020, gfoRmula). A rollout's generated contexts never leave the site's training range, the
range is taken from the site's own training rows and is in nothing the site sends (issue 42, carry-over world:
the context head pushed severity below its floor of 0; docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcd_secure.data.preprocess import build_dataset
from fcd_secure.model import FedCausalDiff, ModelConfig
from fcd_secure.model.baselines import FedCausalDiffSimulator
from fcd_secure.model.context import ContextBounds
from tests.test_model_context import SPEC, marker_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(hidden=8, mlp_hidden=8, k_causal=2, k_site=2, diffusion_steps=4, sampler_steps=2, time_emb=4,
             transition="deterministic")


def drifting(clamp: str, step: float) -> tuple[FedCausalDiffSimulator, object]:
    """An untrained simulator on the marker table whose affine context head adds ``step`` to the marker at every
    simulated step (its last layer's b), so that a long enough rollout leaves any finite range."""
    ds = build_dataset(SPEC, marker_table(60))
    net = FedCausalDiff.from_dims(ModelConfig(**SMALL, clamp_contexts=clamp), ds.dx, ds.da, ds.n_actions, 1,
                                  n_endogenous=1)
    with torch.no_grad():
        net.context_head.net[-1].bias[0] = step  # b of the marker; m stays 0: Â_{t+1} = A_t + step
    return FedCausalDiffSimulator(net), ds


def generated(sim: FedCausalDiffSimulator, ds) -> np.ndarray:
    """The marker the rollout generated (every step after the observed t = 0), ``[n, S, H-1]``."""
    return sim.simulate(ds, 1, n_samples=2, seed=0, keep_contexts=True).context_values[:, :, 1:, 0]


@pytest.mark.parametrize("step", [2.0, -2.0])
def test_a_rollout_never_leaves_the_training_range_and_without_the_clamp_it_does(step):
    sim, ds = drifting("range", step)
    sim.keep_context_range(ds)
    valid = ds.M.astype(bool)
    lo, hi = ds.A[valid][:, 0].min(), ds.A[valid][:, 0].max()
    np.testing.assert_array_equal(sim.context_bounds.low, [lo])
    np.testing.assert_array_equal(sim.context_bounds.high, [hi])
    got = generated(sim, ds)
    assert got.min() >= lo and got.max() <= hi
    # the clamp is what holds it: the same model unclamped leaves the range, and where it does the clamp sits on
    # the bound it crossed
    free, _ = drifting("off", step)
    free.keep_context_range(ds)
    assert free.context_bounds is None
    loose = generated(free, ds)
    out = (loose > hi) if step > 0 else (loose < lo)
    assert out.mean() > 0.5
    np.testing.assert_array_equal(got[out], hi if step > 0 else lo)
    # inside the range nothing is moved
    np.testing.assert_array_equal(got[(loose >= lo) & (loose <= hi)], loose[(loose >= lo) & (loose <= hi)])


def test_the_floor_keeps_the_minimum_only():
    for step in (2.0, -2.0):
        sim, ds = drifting("floor", step)
        sim.keep_context_range(ds)
        lo = ds.A[ds.M.astype(bool)][:, 0].min()
        assert np.isposinf(sim.context_bounds.high).all()
        got = generated(sim, ds)
        assert got.min() >= lo
        if step > 0:  # no ceiling: a course that drives the marker past anything logged is followed
            assert got.max() > ds.A[..., 0].max()


def test_a_clamped_rollout_without_a_kept_range_is_refused_and_padding_is_not_a_value():
    sim, ds = drifting("range", 1.0)
    with pytest.raises(ValueError, match="keep_context_range"):
        sim.simulate(ds, 1, n_samples=1, seed=0)
    # the range is over the valid steps only: the zeros of padded steps are not a patient's value
    short = ds.M.copy()
    short[:, 3:] = 0
    A = ds.A.copy()
    A[:, 3:, 0] = -99.0
    from dataclasses import replace

    b = ContextBounds.of(replace(ds, A=A, M=short), 1, "range")
    assert b.low[0] == ds.A[:, :3, 0].min() and b.high[0] == ds.A[:, :3, 0].max()
    with pytest.raises(ValueError, match="unknown context bounds"):
        ContextBounds.of(ds, 1, "off")


def test_a_site_keeps_its_own_range_and_sends_it_nowhere(tmp_path):
    """Through the site (``SiteRuntime``) on the tiny carry-over world: the model the site evaluates with holds the
    range of its own training rows; the range is no parameter (not in Θc, Θs or the checkpointed state), and the
    evaluation sums the site replies with carry the same names as without the clamp and none of the bounds' values
    (the audit's value scanner, ``audit.scanner.PrivateValues``)."""
    from fcd_secure.apps.site import SiteRuntime, default_site_id
    from fcd_secure.audit.scanner import PrivateValues
    from fcd_secure.config import build_config
    from fcd_secure.experiments.evaluate import full_eval_config
    from fcd_secure.manifest import FULL, THETA_C
    from fcd_secure.queries.evaluation import site_metrics
    from fcd_secure.queries.natural_course import NaturalCourse

    sums, bounds = {}, None
    for clamp in ("off", "range"):
        cfg = build_config("tiny", {"seed": 0, "data": {"dataset": "carryover", "n_sites": 2},
                                    "federation": {"clients_per_round": 2},
                                    "model": {"transition": "deterministic", "clamp_contexts": clamp}})
        rt = SiteRuntime(cfg, default_site_id(0), 0, str(tmp_path / clamp))
        theta = rt.model.get_params(THETA_C)
        model = rt.load_for_eval(theta, THETA_C)
        if clamp == "range":
            train = rt.data.train
            n_endo = model.generated_contexts
            assert n_endo >= 1
            bounds = model.context_bounds
            expect = ContextBounds.of(train, n_endo, "range")
            np.testing.assert_array_equal(bounds.low, expect.low)
            np.testing.assert_array_equal(bounds.high, expect.high)
            # no parameter or buffer holds it: neither what a round sends (Θc, or Θc and Θs without DSS) nor what
            # the site checkpoints
            state = model.module.state_dict()
            assert set(model.get_params(FULL)) <= set(state)
            private = PrivateValues.of([{"low": bounds.low, "high": bounds.high}])  # its informative values
            assert private.f32.size  # (a floor of exactly 0 carries nothing and is skipped)
            assert not private.found_in([float(x) for v in state.values() for x in v.detach().numpy().ravel()])
        sums[clamp] = site_metrics(model, rt.data, cfg, full_eval_config(cfg), queries=(NaturalCourse(),))
    assert set(sums["range"]) == set(sums["off"])  # no new key: no new channel
    numbers = [float(x) for v in sums["range"].values() for x in np.ravel(np.asarray(v, dtype=np.float64))]
    assert not private.found_in(numbers)
    # the check bites: a reply that carried a bound would be caught
    assert private.found_in(numbers + [float(bounds.high.max())])

"""The contract every generated world keeps (:class:`~fcd_secure.data.worlds.world.OracleWorld`), checked once per
world (``tests/world_cases.py``): the sites' layout by the project's rules, replay of the logs with the logged noise,
the logged propensities and their floor, seeds, batching that changes no number, the one-step truth in closed form,
policy values that add up over sites, config errors, ``describe``, and the registered dataset's actions and contexts.
Each world's own mechanism is tested in its own file (``test_tumour.py``, ``test_carryover.py``,
``test_dkt_synth.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError
from policy_cases import policy
from world_cases import ENDOGENOUS, WORLDS, Recorder, WorldCase, tiny_world

from fcd_secure.data.partition import dirichlet_assignment, site_splits
from fcd_secure.data.policy import ANCHOR_ON, anchor_actions, default_policies
from fcd_secure.data.registry import load_federated
from fcd_secure.data.sources import SOURCES, GeneratedSource
from fcd_secure.data.spec import DataError, context_dynamics

pytestmark = pytest.mark.usefixtures("one_torch_thread")

every_world = pytest.mark.parametrize("case", WORLDS, ids=str)
#: the tests of contexts that a rollout generates: the worlds whose treatment changes them
endogenous_worlds = pytest.mark.parametrize("case", ENDOGENOUS, ids=str)


def test_every_generated_dataset_is_a_case():
    """A new generated world joins this contract by its entry in ``world_cases.WORLDS``."""
    assert {w.name for w in WORLDS} == {s.name for s in SOURCES if isinstance(s, GeneratedSource)}


# -- generator contract --------------------------------------------------------------------------------------
@every_world
def test_world_layout_and_contract(case: WorldCase):
    world = tiny_world(case.name)
    cfg = world.cfg
    assert world.n_actions == len(case.actions) and len(world.train) == len(world.test) == cfg.n_sites == 10
    ids = np.concatenate([d.meta["entity"] for d in world.train + world.test])
    assert np.array_equal(np.sort(ids), np.arange(cfg.n_entities))  # splits are disjoint and cover everyone
    for s, (tr, te) in enumerate(zip(world.train, world.test)):
        for ds in (tr, te):
            assert ds.n >= 1 and ds.dx == case.dx and ds.da == case.da and ds.L == cfg.max_len and ds.P is not None
            assert ds.meta["action_names"] == list(case.actions)
            assert ds.meta["a_names"] == case.contexts["endogenous"] + case.contexts["exogenous"]
            assert context_dynamics(ds.meta, ds.da) == (["endogenous"] * len(case.contexts["endogenous"])
                                                        + ["exogenous"] * len(case.contexts["exogenous"]))
            assert (world.site_of[ds.meta["entity"]] == s).all()
            valid = ds.M > 0
            assert ds.lengths.min() >= cfg.max_len // 2 and ds.lengths.max() <= cfg.max_len
            assert (ds.P[valid] >= cfg.epsilon).all() and (ds.P[valid] <= 1).all()
            assert (ds.A[~valid] == 0).all() and (ds.Y[~valid] == 0).all() and (ds.T[~valid] == 0).all()
            assert set(np.unique(ds.Y)) <= {0.0, 1.0}
    assert world.anchors == anchor_actions(world.train)
    # site sizes vary (Dirichlet) but none is empty
    sizes = np.array([tr.n + te.n for tr, te in zip(world.train, world.test)])
    assert sizes.min() >= 2 and sizes.max() > sizes.min()


@every_world
def test_sites_splits_and_anchors_follow_the_projects_rules(case: WorldCase):
    """One Dirichlet rule, one per-site train/test rule, one anchor rule for every dataset (no private copies)."""
    world = tiny_world(case.name)
    cfg = world.cfg
    site_of = dirichlet_assignment(np.zeros(cfg.n_entities, dtype=np.int64), cfg.n_sites, cfg.dirichlet_alpha, cfg.seed)
    assert np.array_equal(world.site_of, site_of)
    assert np.bincount(site_of).min() >= max(2, int(0.1 * cfg.n_entities / cfg.n_sites))  # the project's minimum
    for s, (tr, te) in enumerate(site_splits(site_of, cfg.n_sites, cfg.test_fraction, cfg.seed)):
        assert np.array_equal(world.train[s].meta["entity"], tr)
        assert np.array_equal(world.test[s].meta["entity"], te)
    assert world.anchors == anchor_actions(world.train)


# -- common random numbers -----------------------------------------------------------------------------------
@every_world
def test_replay_of_logged_actions_reproduces_logged_outcomes_exactly(case: WorldCase):
    world = tiny_world(case.name)
    for s in range(world.n_sites):
        for split, sets in (("train", world.train), ("test", world.test)):
            assert np.array_equal(world.replay_logged(s, split), sets[s].Y)


@every_world
def test_rollout_zero_with_the_logged_actions_regenerates_the_logged_outcomes_and_contexts(case: WorldCase):
    """Rollout 0 uses the logged noise, so following the logged actions regenerates the logged outcomes, and the
    contexts the policy is shown are the logged ones (generated anew where they are endogenous)."""
    world = tiny_world(case.name)
    ids = world.entity_ids(None, "test")
    logged = Recorder(world.T_all[ids])
    per = world.policy_values_of(logged, ids, n_rollouts=1).mean(axis=1)
    M = world._valid(ids)
    L = world.L
    assert np.array_equal(logged.y[:, : L - 1][M[:, :-1]], world.Y_all[ids][:, :-1][M[:, :-1]])
    A = np.concatenate([d.A for d in world.test])
    assert np.array_equal(logged.ctx[M], A[M])
    assert 0 < per[0] < 1


@every_world
def test_same_seed_same_data_and_truth_different_seed_different_data(case: WorldCase):
    world = tiny_world(case.name)
    again = case.package.generate(case.config.from_preset("tiny"))
    other = case.package.generate(case.config.from_preset("tiny", seed=1))
    for a, b in zip(world.train + world.test, again.train + again.test):
        for key in ("X", "A", "T", "Y", "M", "P"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key
    assert np.array_equal(world.true_effects(None, "test"), again.true_effects(None, "test"))
    never = default_policies()[0]
    assert np.array_equal(world.policy_value_per_rollout(never), again.policy_value_per_rollout(never))
    assert not np.array_equal(world.train[0].X, other.train[0].X)
    assert not np.array_equal(world.T_all, other.T_all) and not np.array_equal(world.Y_all, other.Y_all)


@every_world
def test_chunked_batches_give_the_same_truth(case: WorldCase, monkeypatch):
    """Counter-based noise is keyed per entity: cutting a query into many small batches changes no number."""
    world = tiny_world(case.name)
    early = next(p for p in default_policies() if p.name == "early_on")
    whole_tau, whole_v = world.true_effects(None, "test"), world.policy_value_per_rollout(early)
    monkeypatch.setattr(case.truth, "MAX_BATCH_ROWS", 40)
    assert np.allclose(world.true_effects(None, "test"), whole_tau, atol=1e-12)
    assert np.allclose(world.policy_value_per_rollout(early), whole_v, atol=1e-12)


# -- the logging policy ----------------------------------------------------------------------------------------
@every_world
def test_logged_propensities_are_the_policy_probabilities(case: WorldCase):
    """The behaviour policy's probabilities of every action, recomputed along the logged history, sum to one, give
    back the logged propensity of the action taken, and keep the floor ε everywhere."""
    world = tiny_world(case.name)
    pi = world.logging_propensities(None, "train", actions=list(range(world.n_actions)))
    ids = world.entity_ids(None, "train")
    valid = world._valid(ids)
    assert np.allclose(pi.sum(-1)[valid], 1.0)
    taken = np.take_along_axis(pi, world.T_all[ids][:, :, None], axis=2)[..., 0]
    assert np.array_equal(taken[valid], world.P_all[ids][valid])
    assert np.nanmin(pi) >= world.cfg.epsilon


# -- ground truth ----------------------------------------------------------------------------------------------
@every_world
def test_one_step_truth_is_exact_and_each_rows_truth_is_its_own(case: WorldCase):
    world = tiny_world(case.name)
    a_off, a_on = world.anchors
    t0 = world.anchor_step
    one = world.true_effects(2, "test", anchor=t0, horizon=1)
    exact = world.outcome_probs_do(2, "test", None, t0, a_on) - world.outcome_probs_do(2, "test", None, t0, a_off)
    assert np.allclose(one, exact, atol=1e-12)  # one step needs no Monte Carlo
    tau = world.true_effects(None, "test")
    assert tau.shape == (sum(d.n for d in world.test),) and np.isfinite(tau).all()
    assert tau.std() > case.effect_sd  # heterogeneous
    assert not np.allclose(world.true_effects(None, "test", horizon=1), tau, atol=1e-3)  # multi-step ≠ one-step
    # counter-based noise: a row's truth does not depend on which other rows are in the batch
    site3 = world.true_effects(3, "test")
    start = sum(d.n for d in world.test[:3])
    assert np.allclose(site3, tau[start : start + len(site3)], atol=1e-12)
    assert np.allclose(world.true_effects(3, "test", rows=[1]), site3[1:2], atol=1e-12)


@every_world
def test_policy_values_add_up_over_sites_and_name_actions_by_label(case: WorldCase):
    world = tiny_world(case.name)
    policies = {p.name: p for p in default_policies()}
    assert set(policies) == {"never", "always", "early_on", "late_on"}
    values = {n: world.true_policy_value(p) for n, p in policies.items()}
    for v, se in values.values():
        assert 0 < v < 1 and 0 < se < case.se_max
    assert abs(values["always"][0] - values["never"][0]) > 3 * (values["always"][1] + values["never"][1])
    # per-site values, weighted by site size, add up to the pooled value (noise is keyed per entity)
    sizes = np.array([d.n for d in world.test])
    by_site = np.array([world.true_policy_value(policies["early_on"], site=s)[0] for s in range(world.n_sites)])
    assert (by_site * sizes).sum() / sizes.sum() == pytest.approx(values["early_on"][0], abs=1e-12)
    with pytest.raises(DataError, match="not a label"):
        world.true_policy_value(policy("bad", {"kind": "static", "action": "surgery"}))


@every_world
def test_do_probabilities_along_the_history_are_the_step_by_step_ones_bit_for_bit(case: WorldCase):
    """``outcome_probs_do_along`` (the one-step truth of ``queries.targeted``) walks each history once; every step's
    number is :meth:`outcome_probs_do`'s at that step, NaN on padding."""
    world = tiny_world(case.name)
    a_off, a_on = world.anchors
    along = world.outcome_probs_do_along(2, "test", [0, 2, 3], (a_off, a_on))
    assert along.shape == (3, world.L, 2)
    for t in range(world.L):
        for k, a in enumerate((a_off, a_on)):
            assert np.array_equal(along[:, t, k], world.outcome_probs_do(2, "test", [0, 2, 3], t, a), equal_nan=True)
    with pytest.raises(ValueError, match="out of range"):
        world.outcome_probs_do_along(2, "test", None, (world.n_actions,))


@every_world
def test_policy_values_at_several_horizons_are_each_horizons_own_rollout_bit_for_bit(case: WorldCase):
    """One rollout of the longest horizon answers every shorter one (``OracleWorld.true_policy_values_at``, what the
    queries ask): the same additions in the same order as a rollout per horizon, for a deterministic policy and a
    stochastic one (its generator restarts at every bind, so it draws the same way in both)."""
    world = tiny_world(case.name)
    ids = world.entity_ids(1, "test")
    horizons = (None, 1, 3, world.L + 5)
    stochastic = policy("inc", {"kind": "incremental", "delta": 2.0, "action": ANCHOR_ON}).with_behaviour(None, seed=7)
    for pol in (default_policies()[2], stochastic):
        together = world.policy_values_over(pol, ids, 4, horizons)
        assert together.shape == (len(horizons), 4, len(ids))
        for k, h in enumerate(horizons):
            assert np.array_equal(together[k], world.policy_values_of(pol, ids, 4, horizon=h))
        assert world.true_policy_values_at(pol, 1, "test", horizons)[1] == world.true_policy_value(pol, 1, horizon=1)


# -- config, describe and the registered dataset -----------------------------------------------------------------
@every_world
def test_config_errors_name_the_field(case: WorldCase):
    cfg = case.config
    with pytest.raises(ValidationError, match="epsilon"):  # a floor above 1/|T| is impossible
        cfg.from_preset("tiny", epsilon=1.0 / cfg.N_ACTIONS + 0.05)
    with pytest.raises(ValidationError, match="anchor_step"):
        cfg.from_preset("tiny", anchor_step=6)
    with pytest.raises(ValidationError, match=f"n_{cfg.ENTITY}s"):
        cfg.from_preset("tiny", **{f"n_{cfg.ENTITY}s": 10})
    with pytest.raises(ValueError, match=f"unknown {cfg.WORLD} preset"):
        cfg.from_preset("huge")
    with pytest.raises(ValidationError):
        cfg.from_preset("tiny", no_such_field=1)


@every_world
def test_describe_is_plain_json_and_counts_everyone(case: WorldCase):
    world = tiny_world(case.name)
    d = world.describe(policy_values=True)
    json.dumps(d)  # plain JSON-able numbers for `--json` output
    assert (d["anchors"]["a_off"], d["anchors"]["a_on"]) == world.anchors
    assert sum(d["n_train"]) + sum(d["n_test"]) == world.cfg.n_entities and len(d["n_train"]) == world.n_sites
    assert d["true_ate_test"] == pytest.approx(float(np.mean(world.true_effects(None, "test"))), abs=1e-12)
    assert set(d["true_policy_values_test"]) == {"never", "always", "early_on", "late_on"}
    assert d["min_logged_propensity"] >= world.cfg.epsilon


@endogenous_worlds
def test_registered_dataset_carries_the_oracle_and_endogenous_contexts(case: WorldCase):
    fd = load_federated(case.name, n_sites=4, seed=3, preset="tiny")
    assert fd.name == case.name and fd.n_sites == 4 and fd.anchors == (0, 1)
    assert fd.oracle.cfg.seed == 3 and fd.oracle.cfg.n_sites == 4
    assert fd.description["contexts"] == case.contexts
    assert fd.description["oracle"]["true_ate_test"] == pytest.approx(float(fd.oracle.true_effects(None).mean()))
    with pytest.raises(DataError, match="unknown preset"):
        load_federated(case.name, preset="huge")
    with pytest.raises(DataError, match=f"n_{case.config.ENTITY}s"):
        load_federated(case.name, n_sites=200, preset="tiny")


@endogenous_worlds
def test_a_run_names_the_worlds_actions_and_generates_its_contexts(case: WorldCase):
    """What the server shows for ``fcd run --dataset <world>`` before any site answers, and the label check that
    turns a policy naming an action the world does not have into exit 2 before the engine starts."""
    from fcd_secure.config import build_config
    from fcd_secure.queries.vocabulary import action_labels, bind_policies, context_columns

    cfg = build_config("tiny", {"data": {"dataset": case.name}})
    assert action_labels(cfg) == list(case.actions)
    assert context_columns(cfg) == {"generated_columns": case.contexts["endogenous"], "replayed_columns": []}
    off = build_config("tiny", {"data": {"dataset": case.name}, "model": {"use_context": False}})
    assert context_columns(off) == {"generated_columns": [], "replayed_columns": case.contexts["endogenous"]}
    treat, none, signal = case.actions[-1], case.actions[0], f"context:{case.contexts['endogenous'][-1]}"
    bind_policies(cfg, [policy("treat_daily", {"kind": "static", "action": treat}),
                        policy("by_context", {"kind": "threshold", "signal": signal, "when": "above", "value": 0.23,
                                              "then": treat, "otherwise": none})])
    with pytest.raises(DataError, match="surgery"):
        bind_policies(cfg, [policy("bad", {"kind": "static", "action": "surgery"})])


@endogenous_worlds
def test_gamma_of_the_run_config_reaches_the_generator(case: WorldCase):
    """``data.gamma`` (``fcd run --gamma``) is the confounding strength the world is generated with: a federated γ
    sweep runs through ``fcd run``; the default stays the generator's."""
    from fcd_secure.cli.resolve import RunOptions, resolve_config
    from fcd_secure.config import build_config
    from fcd_secure.federation import learner

    weak = build_config("tiny", {"data": {"dataset": case.name, "gamma": 0.0}})
    default = build_config("tiny", {"data": {"dataset": case.name}})
    fd0, fd2 = learner.load_federated(weak), learner.load_federated(default)
    assert fd0.oracle.cfg.gamma == 0.0 and fd0.description["oracle"]["gamma"] == 0.0
    assert fd2.oracle.cfg.gamma == case.config.model_fields["gamma"].default and default.data.gamma is None
    assert not np.array_equal(fd0.train[0].P, fd2.train[0].P)  # the logging policy changed, not just a label
    assert learner.data_key(weak) != learner.data_key(default)  # no cached default-γ world answers a γ = 0 run
    assert weak.training_hash() != default.training_hash()  # a default-γ checkpoint never resumes a γ = 0 run
    assert resolve_config(RunOptions(preset="tiny", dataset=case.name, gamma=3.5)).data.gamma == 3.5
    c0, c2 = fd0.description["oracle"]["one_step_contrast_train"], fd2.description["oracle"]["one_step_contrast_train"]
    assert abs(c0["naive"] - c0["true"]) < abs(c2["naive"] - c2["true"])

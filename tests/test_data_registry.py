"""load_federated / load_spec_federated and `fcd data describe --json`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fcd_secure.cli.data import app
from fcd_secure.data.registry import (
    DATASETS,
    PAPER_TABLE_I,
    get_source,
    load_federated,
    load_pooled,
    load_spec_federated,
)
from fcd_secure.data.sources import SOURCES
from fcd_secure.data.spec import DataError

runner = CliRunner()
REAL = ["statics2011", "assistments2009", "diabetes130", "obd"]


def test_load_federated_real_sites_split_and_scaling(shared_data):
    fd = load_federated("statics2011", n_sites=5, alpha=10.0, seed=1, data_dir=shared_data)
    assert fd.n_sites == 5 and len(fd.test) == 5 and fd.oracle is None
    assert sum(d.n for d in fd.train + fd.test) == 1127
    for tr, te in zip(fd.train, fd.test):
        assert tr.n > 0 and te.n > 0
        assert set(tr.meta["entity"].tolist()).isdisjoint(te.meta["entity"].tolist())
    # continuous X z-scored with the pooled *training* statistics; test reuses them
    cont = fd.train[0].meta["x_continuous"]
    Xtr = np.concatenate([d.X[:, cont] for d in fd.train])
    np.testing.assert_allclose(Xtr.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(Xtr.std(0), 1, atol=1e-3)
    assert fd.test[0].meta["standardization"] == fd.train[0].meta["standardization"]
    a_off, a_on = fd.anchors
    assert a_off != a_on and 0 <= min(a_off, a_on) and max(a_off, a_on) < 1224
    again = load_federated("statics2011", n_sites=5, alpha=10.0, seed=1, data_dir=shared_data)
    for a, b in zip(fd.train, again.train):
        np.testing.assert_array_equal(a.X, b.X)
        np.testing.assert_array_equal(a.T, b.T)
    other = load_federated("statics2011", n_sites=5, alpha=10.0, seed=2, data_dir=shared_data)
    assert [d.n for d in other.train] != [d.n for d in fd.train] or any(
        not np.array_equal(a.T, b.T) for a, b in zip(fd.train, other.train)
    )


def _assert_entities_unsplit(fd):
    """Every entity (student/patient, chunks included) sits on exactly one site and on one side of train/test."""
    where: dict[int, set[int]] = {}
    train_e, test_e = set(), set()
    for i, (tr, te) in enumerate(zip(fd.train, fd.test)):
        for d, side in ((tr, train_e), (te, test_e)):
            ents = d.meta["entity"].tolist()
            side.update(ents)
            for e in ents:
                where.setdefault(int(e), set()).add(i)
    multi = sorted(e for e, s in where.items() if len(s) > 1)
    assert not multi, f"{len(multi)} entities on more than one site, e.g. {multi[:5]}"
    assert test_e and train_e.isdisjoint(test_e), f"{len(train_e & test_e)} test entities also in training"
    return where


def test_real_loader_keeps_each_student_on_one_site(shared_data):
    # the paper's setting (10 sites, alpha = 10); Statics2011 cuts 243 of its 333 students into chunks of 200
    fd = load_federated("statics2011", n_sites=10, alpha=10.0, seed=0, data_dir=shared_data)
    where = _assert_entities_unsplit(fd)
    assert len(where) == 333 and sum(d.n for d in fd.train + fd.test) == 1127
    # the pooled z-score statistics are a simulation shortcut, and describe says so
    assert any("per-site or securely aggregated" in note for note in fd.description["notes"])


def test_spec_dirichlet_split_keeps_chunked_entities_whole(long_case):
    from conftest import GOOD_SPEC, make_long_table

    # max_len 2 with overflow = "chunk": entities of up to 6 steps become up to 3 trajectories each
    spec = GOOD_SPEC.replace('site = "hospital"\n', "").replace("max_len = 4\n", 'max_len = 2\noverflow = "chunk"\n')
    spec_path, table = long_case(make_long_table(n_entities=90), spec)
    fd = load_spec_federated(spec_path, table, n_sites=5, alpha=10.0, seed=0)
    n = sum(d.n for d in fd.train + fd.test)
    where = _assert_entities_unsplit(fd)
    assert len(where) == 90 and n > 150  # chunking really happened


def test_preset_tiny_subsamples(shared_data):
    fd = load_federated("assistments2009", n_sites=3, preset="tiny", data_dir=shared_data)
    assert sum(d.n for d in fd.train + fd.test) == 300


@pytest.mark.parametrize("name, lmax, kept", [("statics2011", 50, 1500), ("obd", 20, None), ("dkt-synth", 30, 1500)])
def test_preset_small_reaches_the_cohort_floor_at_nearly_every_site(shared_data, name, lmax, kept):
    """``small`` (``fcd reproduce --preset quick``): Open Bandit and Statics2011 cut into shorter chunks than Table I's
    Lmax, so that 10 sites' test splits reach the evaluation's cohort floor; a run config accepts it."""
    from fcd_secure.config import build_config
    from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR

    fd = load_federated(name, n_sites=10, alpha=10.0, seed=0, preset="small", data_dir=shared_data)
    assert fd.train[0].L == lmax and all(int(d.lengths.max()) <= lmax for d in fd.train + fd.test)
    assert kept is None or sum(d.n for d in fd.train + fd.test) == kept
    assert sum(t.n >= MIN_COHORT_FLOOR for t in fd.test) >= 8
    assert build_config("tiny", {"data": {"dataset": name, "preset": "small"}}).data.preset == "small"
    if name != "dkt-synth":  # the other presets keep Table I's Lmax
        assert load_federated(name, n_sites=3, preset="tiny", data_dir=shared_data).train[0].L == fd.description[
            "table_i"]["Lmax"]


def test_one_source_per_dataset_declares_name_table_and_presets():
    assert DATASETS == tuple(src.name for src in SOURCES) == ("dkt-synth", "statics2011", "assistments2009",
                                                              "diabetes130", "obd", "tumour", "carryover")
    assert set(PAPER_TABLE_I) == {"dkt-synth", "statics2011", "diabetes130", "obd"}  # ASSISTments is not in Table I
    for src in SOURCES:
        assert get_source(src.name.upper()) is src and "tiny" in src.presets and "default" in src.presets
        assert src.table_i is None or set(src.table_i) == {"sequences", "Lmax", "dx", "da", "n_actions"}
    with pytest.raises(DataError, match="no pooled file"):
        load_pooled("dkt-synth")
    with pytest.raises(DataError, match="unknown preset") as exc:
        load_federated("dkt-synth", preset="huge")
    assert exc.value.field == "preset"


def test_unknown_dataset_and_preset(shared_data):
    with pytest.raises(DataError, match="unknown dataset"):
        load_federated("mnist")
    with pytest.raises(DataError, match="unknown preset"):
        load_federated("obd", preset="huge", data_dir=shared_data)


def test_describe_json_covers_every_dataset(shared_data):
    # --dataset all is the default; preset tiny: 300 trajectories per real dataset, DKT-Synth's tiny world
    res = runner.invoke(app, ["describe", "--json", "--preset", "tiny", "--data-dir", str(shared_data)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["data"]
    assert sorted(out) == sorted(DATASETS)
    for name in DATASETS:
        d = out[name]
        assert d["n_sites"] == 10 and len(d["sites"]) == 10 and d["sequences"] == 300
        assert all(s["train"] > 0 and s["test"] > 0 for s in d["sites"])
        assert d["n_actions"] >= d["actions_used"] >= 2
        assert 0 < d["outcome_rate"] < 1
        # anchors are the two best-supported actions of the *training* sites; these shares pool train and test,
        # so their order may differ when the two are close (Statics2011)
        assert d["anchors"]["share_off"] > 0 and d["anchors"]["share_on"] > 0
        assert d["table_i"] == PAPER_TABLE_I.get(name)
    assert out["diabetes130"]["n_actions"] == 32 and "n_actions" in out["diabetes130"]["differs_from_table_i"]
    assert out["statics2011"]["n_actions"] == 1224 and out["statics2011"]["Lmax"] == 200
    assert out["obd"]["has_propensity"] is True and out["diabetes130"]["has_propensity"] is False
    assert out["dkt-synth"]["n_actions"] == 50 and out["dkt-synth"]["has_propensity"] is True
    for world in ("dkt-synth", "tumour", "carryover"):  # the generated worlds add their truth figures, regime support included
        sup = out[world]["oracle"]["regime_support_train"]
        assert set(sup) == {"a_off", "a_on"} and all(v["n"] > 0 for v in sup.values())


def test_describe_unknown_dataset_is_usage_error():
    res = runner.invoke(app, ["describe", "-d", "mnist"])
    assert res.exit_code == 2


def test_describe_bad_data_dir_exits_1(tmp_path):
    res = runner.invoke(app, ["describe", "-d", "obd", "--json", "--data-dir", str(tmp_path)])
    assert res.exit_code == 1
    env = json.loads(res.stdout)
    assert env["status"] == "error" and env["exit_code"] == 1 and "obd" in env["message"]
    assert "open_bandit_dataset" in env["data"]["obd"]["error"]


@pytest.fixture
def broken_oracle(tmp_path, monkeypatch):
    """Point DKT-Synth at a real copy of the oracle weights whose recorded SHA-256 is wrong (or at no file)."""
    from fcd_secure.data.dkt_synth import oracle

    weights = tmp_path / "dkt_oracle.pt"
    weights.write_bytes(oracle.ORACLE_WEIGHTS.read_bytes())
    (tmp_path / "dkt_oracle.pt.sha256").write_text("0" * 64 + "  dkt_oracle.pt\n")

    def use(kind: str):
        monkeypatch.setattr(oracle, "ORACLE_WEIGHTS", weights if kind == "checksum" else tmp_path / "missing.pt")

    return use


@pytest.mark.parametrize("kind, needle", [("checksum", "SHA-256 mismatch"), ("missing", "not found")])
def test_describe_reports_a_bad_oracle_and_still_describes_the_rest(shared_data, broken_oracle, kind, needle):
    broken_oracle(kind)
    args = ["describe", "-d", "dkt-synth", "-d", "statics2011", "--preset", "tiny", "--data-dir", str(shared_data)]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 1, res.output
    assert not isinstance(res.exception, (RuntimeError, OSError)), res.exception
    out = json.loads(res.stdout)["data"]
    assert needle in out["dkt-synth"]["error"]
    assert "error" not in out["statics2011"] and out["statics2011"]["sequences"] == 300
    # the table view: the error in the dataset's row, the other dataset's per-site table still printed
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "dkt-synth failed: " in res.stdout and needle in res.stdout
    assert "statics2011: 10 sites" in res.stdout


def test_spec_federated_sites_from_column(long_case):
    spec, table = long_case()
    fd = load_spec_federated(spec, table, seed=0, test_fraction=0.25)
    assert fd.n_sites == 3
    assert [d.name for d in fd.train] == ["toy/site0/train", "toy/site1/train", "toy/site2/train"]
    assert sum(d.n for d in fd.train + fd.test) == 12
    assert fd.description["has_propensity"] is True


def test_spec_federated_dirichlet_without_site_column(long_case):
    from conftest import GOOD_SPEC, make_long_table

    df = make_long_table(n_entities=60)
    spec, table = long_case(df, GOOD_SPEC.replace('site = "hospital"\n', ""))
    a = load_spec_federated(spec, table, n_sites=4, alpha=10.0, seed=0)
    b = load_spec_federated(spec, table, n_sites=4, alpha=10.0, seed=0)
    assert a.n_sites == 4 and [d.n for d in a.train] == [d.n for d in b.train]
    assert sum(d.n for d in a.train + a.test) == 60


def test_dkt_synth_branch():
    fd = load_federated("dkt-synth", n_sites=3, alpha=10.0, seed=0, preset="tiny")
    assert fd.oracle is not None and fd.n_sites == 3 and len(fd.test) == 3
    assert fd.anchors == tuple(fd.oracle.anchors)
    assert fd.description["table_i"] == PAPER_TABLE_I["dkt-synth"]
    assert "dkt-synth" in DATASETS


def test_registry_split_equals_partition_then_train_test_split(long_case):
    from conftest import GOOD_SPEC, make_long_table

    from fcd_secure.data.partition import dirichlet_partition, train_test_split
    from fcd_secure.data.preprocess import dataset_from_files

    spec, table = long_case(make_long_table(n_entities=80), GOOD_SPEC.replace('site = "hospital"\n', ""))
    fd = load_spec_federated(spec, table, n_sites=4, alpha=1.0, seed=5, test_fraction=0.3)
    _, pooled = dataset_from_files(spec, table)
    for i, site in enumerate(dirichlet_partition(pooled, 4, 1.0, seed=5)):
        tr, te = train_test_split(site, 0.3, seed=5 * 1_000_003 + i)
        np.testing.assert_array_equal(tr.meta["entity"], fd.train[i].meta["entity"])
        np.testing.assert_array_equal(te.meta["entity"], fd.test[i].meta["entity"])
        np.testing.assert_array_equal(te.T, fd.test[i].T)


def test_the_config_knows_the_generated_worlds_and_their_options_as_the_registry_does():
    from fcd_secure.config import GENERATED_WORLDS, WORLD_KEYS
    from fcd_secure.data.sources import SOURCES
    from fcd_secure.data.sources.base import WORLD_OPTIONS, GeneratedSource

    generated = {s.name: s for s in SOURCES if isinstance(s, GeneratedSource)}
    assert set(GENERATED_WORLDS) == set(generated)
    assert set(WORLD_KEYS) == set(WORLD_OPTIONS) and all(set(s.options) == set(WORLD_KEYS) for s in generated.values())


@pytest.mark.parametrize("dataset", ["dkt-synth", "tumour", "carryover"])
def test_site_spread_of_the_run_config_scales_how_much_the_sites_differ(dataset):
    """``data.site_spread`` (``fcd run --site-spread``) multiplies every site-level spread of a generated world: 1 is the
    world as before (the same logged data), 0 makes the sites alike but for their size, 3 makes them three times as
    far apart; the world is a training input, so a checkpoint never resumes across it."""
    from fcd_secure.cli.resolve import RunOptions, resolve_config
    from fcd_secure.config import ConfigError, build_config
    from fcd_secure.federation import learner

    cfgs = {k: build_config("tiny", {"data": {"dataset": dataset} | ({} if k is None else {"site_spread": k})})
            for k in (None, 1.0, 0.0, 3.0)}
    fds = {k: learner.load_federated(c) for k, c in cfgs.items()}
    np.testing.assert_array_equal(fds[1.0].train[0].T, fds[None].train[0].T)
    np.testing.assert_array_equal(fds[1.0].train[0].Y, fds[None].train[0].Y)
    sp = {k: fd.oracle.site_params for k, fd in fds.items()}
    keys = [k for k in sp[None] if k not in ("sizes", "item_const", "logit_ref", "stage_probs")]
    assert keys
    for key in keys:
        scale = np.log if key == "sd_u" else np.asarray  # the confounder's s.d. spreads on the log scale
        base = scale(np.asarray(sp[None][key], dtype=np.float64))
        np.testing.assert_allclose(scale(sp[0.0][key]), 0.0, atol=1e-12)
        np.testing.assert_allclose(scale(sp[3.0][key]), 3.0 * base)
    assert not np.allclose(fds[3.0].train[0].P, fds[None].train[0].P)  # the sites log differently, not a label
    assert len({learner.data_key(c) for c in cfgs.values()}) == 4
    assert cfgs[3.0].training_hash() != cfgs[None].training_hash()
    assert resolve_config(RunOptions(preset="tiny", dataset=dataset, site_spread=2.0)).data.site_spread == 2.0
    with pytest.raises(ConfigError, match="site_spread"):
        build_config("tiny", {"data": {"dataset": "statics2011", "site_spread": 2.0}})


@pytest.mark.parametrize("world, field", [
    ({"gamma": -1.0}, "gamma"),  # the field's own bound
    ({"effect_horizon": 0}, "effect_horizon"),
    ({"effect_horizon": 11}, "effect_horizon"),  # across fields: anchor step 2 + 11 > 12 steps
])
def test_a_bad_world_option_names_itself(world, field):
    from fcd_secure.data.registry import check_world

    for name in ("dkt-synth", "tumour", "carryover"):
        with pytest.raises(DataError) as err:
            check_world(name, world, preset="tiny")
        assert err.value.field == field and f"{field} = " in str(err.value)

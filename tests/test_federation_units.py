"""Fast federation tests without Ray: FedAvg, site state and checkpoints, sampler, config, guard mod, accounting."""

from __future__ import annotations

import json

import numpy as np
import pytest


from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fcd_secure.aggregation.fedavg import AggregationError, fedavg  # noqa: E402
from fcd_secure.audit import message_bytes, payload_bytes, tree_bytes  # noqa: E402
from fcd_secure.config import ConfigError, RunConfig, build_config  # noqa: E402
from fcd_secure.apps.guard import GUARD_ERROR_REASON, guard_mod  # noqa: E402
from fcd_secure.apps.mods import client_mods  # noqa: E402
from fcd_secure.federation.records import arrays_to_record, record_to_arrays  # noqa: E402
from fcd_secure.federation.sampler import ClientSampler  # noqa: E402
from fcd_secure.federation.state import ServerCheckpoint, SiteState, StateError  # noqa: E402


# -- FedAvg --------------------------------------------------------------------------------------------------
def test_fedavg_is_sample_size_weighted_and_keeps_dtype():
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([0.0], np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32), "b": np.array([4.0], np.float32)}
    avg, n = fedavg([a, b], [1, 3])
    assert n == 4
    np.testing.assert_allclose(avg["w"], [2.5, 5.0])
    np.testing.assert_allclose(avg["b"], [3.0])
    assert avg["w"].dtype == np.float32


def test_fedavg_refuses_mismatched_updates():
    with pytest.raises(AggregationError, match="shape"):
        fedavg([{"w": np.zeros(2)}, {"w": np.zeros(3)}], [1, 1])
    with pytest.raises(AggregationError, match="names differ"):
        fedavg([{"w": np.zeros(2)}, {"v": np.zeros(2)}], [1, 1])
    with pytest.raises(AggregationError, match="NaN"):
        fedavg([{"w": np.array([np.nan])}, {"w": np.zeros(1)}], [1, 1])
    with pytest.raises(AggregationError, match="positive"):
        fedavg([{"w": np.zeros(1)}], [0])


# -- site state ----------------------------------------------------------------------------------------------
def test_site_state_commit_and_replay_of_an_unconfirmed_round(tmp_path):
    st = SiteState(tmp_path, "site-00")
    assert st.load() is None and st.begin_round(1) is None
    st.commit(1, "L", {"s": np.array([1.0])}, b"opt1", b"rng1")
    st.commit(2, "L", {"s": np.array([2.0])}, b"opt2", b"rng2")
    # normal next round: train from the latest state
    assert st.begin_round(3).theta_s["s"][0] == 2.0
    # the server crashed before confirming round 2 and replays it: train from the state before round 2
    again = st.begin_round(2)
    assert again.last_round == 1 and again.theta_s["s"][0] == 1.0 and again.optimizer_state == b"opt1"
    st.commit(2, "L", {"s": np.array([2.5])}, b"opt2b", None)
    assert st.load().theta_s["s"][0] == 2.5
    assert st.begin_round(2).theta_s["s"][0] == 1.0  # the snapshot before round 2 is kept across replays
    with pytest.raises(StateError, match="only the last round"):
        st.begin_round(1)
    with pytest.raises(StateError, match="layout"):
        st.check_layout("OTHER")
    assert not list(tmp_path.glob("site-00/.*.tmp"))  # atomic writes leave no temp files


def test_identity_key_is_created_once_and_site_ids_are_checked(tmp_path):
    st = SiteState(tmp_path, "site-01")
    k1 = st.identity_private_key()
    assert len(k1) == 32 and SiteState(tmp_path, "site-01").identity_private_key() == k1
    assert SiteState(tmp_path, "site-02").identity_private_key() != k1
    for bad in ("../x", "", "_server", "a/b"):
        with pytest.raises(StateError):
            SiteState(tmp_path, bad)


def test_server_checkpoint_roundtrip(tmp_path):
    ck = ServerCheckpoint(tmp_path)
    s = ClientSampler(7, 10, 5)
    s.sample()
    ck.save(4, {"a.w": np.arange(3, dtype=np.float32)}, s.get_state(), "H", extra={"history": [{"round": 4}]})
    rnd, theta, sstate, h, extra = ck.load()
    assert rnd == 4 and h == "H" and extra["history"][0]["round"] == 4
    np.testing.assert_array_equal(theta["a.w"], np.arange(3, dtype=np.float32))
    s2 = ClientSampler(7, 10, 5)
    s2.set_state(sstate)
    assert s2.sample() == s.sample()


def test_sampler_is_seeded_and_samples_k_distinct_sites():
    a, b = ClientSampler(3, 10, 5), ClientSampler(3, 10, 5)
    draws = [a.sample() for _ in range(20)]
    assert draws == [b.sample() for _ in range(20)]
    assert all(len(set(d)) == 5 and all(0 <= i < 10 for i in d) for d in draws)
    assert len({tuple(d) for d in draws}) > 1
    assert ClientSampler(4, 10, 5).sample() != draws[0] or ClientSampler(5, 10, 5).sample() != draws[0]


# -- config --------------------------------------------------------------------------------------------------
def test_config_roundtrip_and_errors_name_the_field(tmp_path):
    cfg = build_config("tiny", {"seed": 3, "federation": {"rounds": 4}})
    p = tmp_path / "c.toml"
    p.write_text(cfg.to_toml())
    again = RunConfig.load(p)
    assert again == cfg and again.training_hash() == cfg.training_hash()
    assert build_config("tiny", {"federation": {"rounds": 9}}).training_hash() == build_config("tiny").training_hash()
    assert build_config("tiny", {"federation": {"sync": "full"}}).training_hash() != build_config("tiny").training_hash()
    p.write_text('[federation]\nroundz = 3\n')
    with pytest.raises(ConfigError, match=r"c.toml: field federation.roundz"):
        RunConfig.load(p)
    with pytest.raises(ConfigError, match="clients_per_round"):
        build_config("tiny", {"data": {"n_sites": 3}})


def test_config_has_a_secagg_section_written_to_config_toml(tmp_path):
    from fcd_secure.aggregation.secagg import SecAggPolicy

    cfg = build_config("tiny")
    assert cfg.secagg == SecAggPolicy()  # the defaults of the policy itself
    assert "[secagg]" in cfg.to_toml() and "[secagg.deadlines]" in cfg.to_toml()
    p = tmp_path / "c.toml"
    p.write_text(cfg.to_toml().replace("min_sites = 4", "min_sites = 5"))
    again = RunConfig.load(p)
    assert again.secagg.min_sites == 5
    assert again.training_hash() != cfg.training_hash()  # the policy changes the aggregated numbers
    later = build_config("tiny", {"secagg": {"deadlines": {"unmask": 5.0}}})
    assert later.training_hash() == cfg.training_hash()  # a deadline only decides who is late
    p.write_text("[secagg]\nmin_sites = 2\n")
    with pytest.raises(ConfigError, match=r"c.toml: field secagg.min_sites"):
        RunConfig.load(p)


def test_state_root_is_the_state_dir_else_under_the_run_folder(tmp_path):
    assert build_config("tiny", {"state_dir": str(tmp_path / "s")}).state_root() == tmp_path / "s"
    assert build_config("tiny", {"out": str(tmp_path / "run")}).state_root() == tmp_path / "run" / "state"
    assert build_config("tiny").state_root() is None


# -- guard mod -------------------------------------------------------------------------------------------------
@pytest.fixture()
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield


def _call(app: ClientApp, message_type: str) -> Message:
    msg = Message(RecordDict({"config": ConfigRecord({"x": 1})}), 5, message_type)
    msg.metadata.__dict__["_message_id"] = "m1"
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    return app(msg, ctx)


def test_guard_mod_hides_exception_text(task_identity):
    secret = "patient_id=12345 diagnosis=E11.9"
    app = ClientApp(mods=[guard_mod])

    @app.train()
    def boom(msg, ctx):
        raise KeyError(secret)

    @app.query("fine")
    def fine(msg, ctx):
        return Message(RecordDict({"ok": ConfigRecord({"v": 1})}), reply_to=msg)

    reply = _call(app, "train")
    assert reply.has_error() and not reply.has_content()
    assert reply.error.reason == GUARD_ERROR_REASON
    assert "12345" not in reply.error.reason and "KeyError" not in reply.error.reason
    assert secret.encode() not in b"".join(o.deflate() for o in __import__(
        "flwr.supercore.inflatable.inflatable_object", fromlist=["x"]).get_all_nested_objects(reply).values())
    assert _call(app, "query.fine").content["ok"]["v"] == 1  # a working handler is untouched
    # negative control: without the guard, Flower's runtime would see the exception (and put its text in the reply)
    bare = ClientApp()
    bare.train()(boom)
    with pytest.raises(KeyError, match="12345"):
        _call(bare, "train")
    mods = client_mods(None)
    assert len(mods) == 2 and mods[-1] is guard_mod  # innermost: the audit egress gate wraps it


# -- accounting ------------------------------------------------------------------------------------------------
def test_byte_accounting_counts_serialized_arrays(task_identity):
    small = {"w": np.zeros(10, np.float32)}
    big = {"w": np.zeros(10_010, np.float32)}
    m_small = Message(RecordDict({"u": arrays_to_record(small)}), 1, "train")
    m_big = Message(RecordDict({"u": arrays_to_record(big)}), 1, "train")
    ps, ws = payload_bytes(m_small), message_bytes(m_small)
    pb, wb = payload_bytes(m_big), message_bytes(m_big)
    assert 40_000 <= pb - ps <= 40_016  # the extra float32 payload (+ a longer shape in the npy header)
    assert ws > ps and wb > pb  # the whole message adds its metadata
    assert tree_bytes(m_big.content) == pb
    assert json.dumps(record_to_arrays(arrays_to_record(small))["w"].tolist()) == json.dumps([0.0] * 10)


def test_global_parameters_travel_packed_and_come_back_exactly():
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fcd_secure.federation.records import GLOBAL_DATA, GLOBAL_INDEX, global_to_record, record_to_global

    rng = np.random.default_rng(0)
    theta = {f"layer{i}.weight": rng.normal(size=(3, i + 1)).astype(np.float32) for i in range(20)}
    theta["scalar"] = np.array(2.5, np.float64)
    theta["empty"] = np.zeros((0, 4), np.float32)
    packed = global_to_record(theta)
    back = record_to_global(packed)
    assert set(back) == set(theta)
    for name, arr in theta.items():
        assert back[name].dtype == arr.dtype and back[name].shape == arr.shape
        assert back[name].tobytes() == arr.tobytes()
    # every object is one request on every Flower hop: packed, the parameters are one object, however many tensors
    objects = get_all_nested_objects(RecordDict({"g": packed}))
    assert len(objects) == 2  # the RecordDict and the packed record
    assert len(get_all_nested_objects(RecordDict({"g": arrays_to_record(theta)}))) > 40
    # a malformed record from the server is refused, not half-read
    bad_index = global_to_record({"w": np.zeros(4, np.float32)})
    data = bad_index[GLOBAL_DATA]
    with pytest.raises(ValueError, match="does not match"):
        record_to_global(ConfigRecord({GLOBAL_INDEX: bad_index[GLOBAL_INDEX], GLOBAL_DATA: data[:8]}))
    with pytest.raises(ValueError, match="left over"):
        record_to_global(ConfigRecord({GLOBAL_INDEX: bad_index[GLOBAL_INDEX], GLOBAL_DATA: data + data}))
    with pytest.raises(ValueError, match="not JSON"):
        record_to_global(ConfigRecord({GLOBAL_INDEX: b"\xff{", GLOBAL_DATA: data}))
    with pytest.raises(ValueError, match="must be bytes"):
        record_to_global(ConfigRecord({GLOBAL_INDEX: "[]", GLOBAL_DATA: b""}))
    with pytest.raises(ValueError, match="expected a record"):
        record_to_global(arrays_to_record(theta))


def test_the_next_rounds_sites_are_read_without_drawing_them():
    """The round loop reads the next round's sites (a secure flow sets that round's keys up ahead) without
    changing what the sampler draws, so a run's cohorts and its checkpointed sampler state stay those of a run that
    never looked ahead."""
    from fcd_secure.apps.server_app import _peek_next

    a, b = ClientSampler(3, 10, 4), ClientSampler(3, 10, 4)
    order = list(range(100, 110))
    for _ in range(3):
        peeked = _peek_next(a, order)
        assert peeked == [order[i] for i in a.sample()] == [order[i] for i in b.sample()]
    assert a.get_state() == b.get_state()

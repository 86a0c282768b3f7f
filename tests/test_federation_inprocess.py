"""The in-process engine (``engines.inprocess``): the same ServerApp round loop and ClientApp as Flower's simulation
engine, without Ray — the same global parameters bit for bit, error replies for a failing ClientApp, and copies (not
shared objects) crossing the grid."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from fcd_secure.config import build_config
from fcd_secure.engines.inprocess import InProcessGrid, run_inprocess, run_rounds
from fcd_secure.engines.simulation import run_simulated


def _cfg(out):
    return build_config("tiny", {
        "data": {"n_sites": 3}, "federation": {"clients_per_round": 2, "rounds": 2, "eval_every": 1, "secure_aggregation": False},
        "model": {"simulator": "crn"}, "evaluation": {"n_samples": 1, "max_rows": 8}, "out": str(out),
    })


@pytest.mark.slow
def test_same_numbers_as_flowers_simulation_engine(tmp_path, one_torch_thread):
    a = run_inprocess(_cfg(tmp_path / "inprocess"))
    b = run_simulated(_cfg(tmp_path / "ray"))
    assert sorted(a.theta) == sorted(b.theta)
    assert all(np.array_equal(a.theta[k], b.theta[k]) for k in a.theta)
    for ra, rb in zip(a.history, b.history):
        assert ra["sites"] == rb["sites"] and ra["uplink_bytes"] == rb["uplink_bytes"]
        assert ra["pehe"] == rb["pehe"] and ra["factual_auc"] == rb["factual_auc"]
    assert a.final_eval["pehe"] == b.final_eval["pehe"]
    assert (tmp_path / "inprocess" / "summary.json").exists()


@pytest.mark.slow
def test_same_numbers_as_flowers_simulation_engine_with_secure_aggregation(tmp_path, one_torch_thread):
    # the configuration test_deployment.py's secure deployment is compared with (4 sites, all sampled, 1 round,
    # secure aggregation): its reference may then be the in-process engine instead of a Ray start. The masks are
    # fresh random numbers each run, but they cancel exactly in the field, so the unmasked fixed-point sum and hence
    # Θc are the same bits on both engines.
    def cfg(out):
        return build_config("tiny", {
            "seed": 0, "data": {"n_sites": 4},
            "federation": {"clients_per_round": 4, "rounds": 1, "eval_every": 0, "secure_aggregation": True},
            "out": str(out),
        })

    a = run_inprocess(cfg(tmp_path / "inprocess"))
    b = run_simulated(cfg(tmp_path / "ray"))
    assert sorted(a.theta) == sorted(b.theta)
    assert all(np.array_equal(a.theta[k], b.theta[k]) for k in a.theta)
    (ra,), (rb,) = a.history, b.history
    assert ra["sites"] == rb["sites"] and ra["n_total"] == rb["n_total"] and ra["uplink_bytes"] == rb["uplink_bytes"]
    # the rounds alone (the deployment tests' reference): the same Θc and round, no closing evaluation, no run folder
    theta, (rc,) = run_rounds(cfg(tmp_path / "rounds"))
    assert sorted(theta) == sorted(a.theta) and all(np.array_equal(theta[k], a.theta[k]) for k in a.theta)
    assert rc["sites"] == ra["sites"] and rc["n_total"] == ra["n_total"]
    assert not (tmp_path / "rounds").exists()


def _grid(handler) -> InProcessGrid:
    app = ClientApp()
    app.query("probe")(handler)
    grid = InProcessGrid(app, 2)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    return grid


def test_a_failing_clientapp_answers_with_an_error_reply():
    def boom(msg, context):
        raise RuntimeError("site failure")

    grid = _grid(boom)
    node = list(grid.get_node_ids())[0]
    ids = list(grid.push_messages([Message(RecordDict({"c": ConfigRecord({"x": 1})}), node, "query.probe")]))
    (reply,) = grid.pull_messages(ids)
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "site failure" in reply.error.reason and reply.metadata.reply_to_message_id == ids[0]
    assert list(grid.pull_messages(ids)) == []  # a reply is delivered once


def test_messages_cross_as_copies_with_the_node_context():
    seen = {}

    def echo(msg, context):
        seen["partition"] = context.node_config["partition-id"]
        msg.content["c"]["x"] = 99  # a site mutating what it received must not reach the server's object
        return Message(RecordDict({"c": ConfigRecord({"y": 2})}), reply_to=msg)

    grid = _grid(echo)
    node = list(grid.get_node_ids())[1]
    sent = Message(RecordDict({"c": ConfigRecord({"x": 1})}), node, "query.probe")
    (reply,) = grid.send_and_receive([sent])
    assert sent.content["c"]["x"] == 1 and reply.content["c"]["y"] == 2
    assert seen["partition"] == 1 and reply.metadata.src_node_id == node

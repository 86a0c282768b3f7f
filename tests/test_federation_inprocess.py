"""The in-process engine (``engines.inprocess``): the same ServerApp round loop and ClientApp as Flower's simulation
engine, without Ray — the same global parameters bit for bit, error replies for a failing ClientApp, and copies (not
shared objects) crossing the grid. The engines are compared on one secure run (one Ray start): plain FedAvg runs the
same ServerApp and ClientApp code with fewer message kinds, all of which (float parameters, evaluation replies) the
secure run's messages already carry across both grids."""

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
    # One Ray start serves every claim about the two engines (two configurations cost 24 + 31 s, this one ~31 s):
    # secure aggregation (its key exchange, masked uploads and unmasking cross the grid; test_deployment.py's
    # secure deployment takes the in-process engine as its reference), a sample of 4 of 5 sites (the same sites on
    # both engines: node ids map to the same partitions), the round's evaluation and the closing one (the float
    # parameters cross the grid to the sites, as they cross it both ways in plain FedAvg, and the evaluation
    # messages come back). max_rows = 8 keeps every site above the evaluation's cohort floor (all 5 are evaluated);
    # two policies instead of the paper's four halve the closing evaluation's rollouts.
    return build_config("tiny", {
        "seed": 0, "data": {"n_sites": 5},
        "federation": {"clients_per_round": 4, "rounds": 1, "eval_every": 1, "secure_aggregation": True},
        "evaluation": {"n_samples": 1, "max_rows": 8, "policies": ["never", "always"]}, "out": str(out),
    })


@pytest.mark.slow
def test_same_numbers_as_flowers_simulation_engine_with_secure_aggregation(tmp_path, one_torch_thread):
    # The masks are fresh random numbers each run, but they cancel exactly in the field, so the unmasked fixed-point
    # sum and hence Θc are the same bits on both engines.
    a = run_inprocess(_cfg(tmp_path / "inprocess"))
    b = run_simulated(_cfg(tmp_path / "ray"))
    assert sorted(a.theta) == sorted(b.theta)
    assert all(np.array_equal(a.theta[k], b.theta[k]) for k in a.theta)
    (ra,), (rb,) = a.history, b.history
    assert len(ra["sites"].split()) == 4  # a sample, not every site
    assert ra["sites"] == rb["sites"] and ra["n_total"] == rb["n_total"] and ra["uplink_bytes"] == rb["uplink_bytes"]
    assert np.isfinite(ra["pehe"]) and ra["pehe"] == rb["pehe"] and ra["factual_auc"] == rb["factual_auc"]
    assert a.final_eval["sites_evaluated"] == b.final_eval["sites_evaluated"] == 5
    assert np.isfinite(a.final_eval["pehe"]) and a.final_eval["pehe"] == b.final_eval["pehe"]
    assert (tmp_path / "inprocess" / "summary.json").exists()
    # the rounds alone (the deployment tests' reference): the same Θc and round, no closing evaluation, no run folder
    theta, (rc,) = run_rounds(_cfg(tmp_path / "rounds"))
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

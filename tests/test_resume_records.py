"""A site that missed rounds stays in the run's records after a resume (issue 45 item 3).

Measured on the hospital deployment: a site killed mid-run, the run resumed from the coordinator's checkpoint;
``summary.json`` of the resumed run said ``site_errors: []`` (the errors lived only in the first process's memory),
``rounds.csv`` kept only the round in which the site answered with an error (not the one in which it sent nothing),
and ``fcd server run`` warned about a Flower node number in "round 4" of a 3-round run.

Here the same ServerApp round loop runs on the in-process grid (``engines.inprocess``: the Message API with the real
ClientApp), with one site that sends nothing in round 2; the server crashes after round 3 before its checkpoint and a
second process resumes from round 2's checkpoint. What a deployment adds (processes, TLS) is not what this item is
about: the records are written by the ServerApp alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pandas as pd
import pytest
from conftest import CHEAP_EVALUATION
from flwr.app import Message

from fcd_secure._flower.internals import SUPERLINK_NODE_ID, TaskIdentity
from fcd_secure.apps.client_app import make_client_app
from fcd_secure.apps.outputs import write_run_folder
from fcd_secure.apps.server_app import run_federation
from fcd_secure.cli.server import missed_steps, run_warnings
from fcd_secure.config import build_config
from fcd_secure.engines.inprocess import InProcessGrid
from fcd_secure.engines.simulation import quiet_flower_env, write_simulated_policies

SITES, ROUNDS, SILENT_SITE, SILENT_ROUND = 3, 3, 2, 2


class SilentSiteGrid(InProcessGrid):
    """The in-process grid with one site that sends nothing in one training round (a killed SuperNode whose
    messages the SuperLink keeps until the server stops waiting)."""

    def __init__(self, *args, silent: int | None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.silent = None if silent is None else self._node_ids[silent]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        keep = [m for m in messages if not (int(m.metadata.dst_node_id) == self.silent
                                            and m.metadata.group_id == str(SILENT_ROUND))]
        ids = iter(super().push_messages(keep))
        return [next(ids) if m in keep else f"lost-{i}" for i, m in enumerate(messages)]


def _run(cfg, silent: int | None):
    quiet_flower_env()
    write_simulated_policies(cfg)
    grid = SilentSiteGrid(make_client_app(cfg), cfg.data.n_sites, silent=silent)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    result = run_federation(grid, cfg)
    write_run_folder(cfg.out, cfg, result)
    return result


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume-records")
    # the claims are the records of the rounds, not the closing evaluation's answers: that one cheap (conftest)
    over = {"seed": 0, "data": {"n_sites": SITES}, "state_dir": str(base / "state"), "evaluation": CHEAP_EVALUATION,
            "federation": {"rounds": ROUNDS, "clients_per_round": SITES, "eval_every": 0, "secure_aggregation": False,
                           "round_timeout_s": 3.0, "crash_after_round": ROUNDS}}
    with pytest.raises(Exception, match="simulated server crash after round 3"):
        _run(build_config("tiny", {**over, "out": str(base / "first")}), silent=SILENT_SITE)
    over["federation"] = {**over["federation"], "crash_after_round": None}
    out = base / "resumed"
    _run(build_config("tiny", {**over, "out": str(out)}), silent=None)
    return out


def test_a_resumed_run_keeps_the_rounds_a_site_missed_by_name(resumed):
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from_round"] == ROUNDS - 1
    missed = [e for e in summary["site_errors"] if e["site_id"] == f"site-0{SILENT_SITE}"]
    assert [(e["round"], e["action"], e["error"]) for e in missed] == [(SILENT_ROUND, "train", "no_reply")]
    assert not [e for e in summary["site_errors"] if e["site_id"].startswith("node")]
    rounds = pd.read_csv(resumed / "rounds.csv").set_index("round")
    assert rounds.loc[SILENT_ROUND, "site_errors"] == f"site-0{SILENT_SITE}:no_reply"
    assert rounds.loc[SILENT_ROUND, "participants"] == SITES - 1
    assert rounds["site_errors"].isna().sum() == ROUNDS - 1  # the other rounds: every site answered
    assert missed_steps(summary) == {f"site-0{SILENT_SITE}": [f"round(s) {SILENT_ROUND}"]}
    assert any(w.startswith(f"site site-0{SILENT_SITE} failed in round(s) 2;") for w in run_warnings(summary, resumed))


def test_the_final_evaluation_is_named_not_numbered():
    summary = {"rounds": 3, "site_errors": [
        {"round": 0, "action": "query.hello", "site_id": "hospital1", "error": "internal"},
        {"round": 2, "action": "train", "site_id": "hospital1", "error": "no_reply"},
        {"round": 4, "action": "query.evaluate", "site_id": "hospital1", "error": "internal"}]}
    assert missed_steps(summary) == {"hospital1": ["the setup (round 0)", "round(s) 2", "the final evaluation"]}

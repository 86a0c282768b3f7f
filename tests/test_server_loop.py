"""The one server loop (``apps.server_loop.ServerLoop``) as the what-if question runs it: no training round, so the
finished run's checkpoint and ``rounds.csv`` stay as they were; the question continues the run's audit ledger with
the next round numbers; a Θc that is not the model's is refused before any question reaches a site.

The run is trained and asked on the in-process engine (``engines.inprocess``: the same ServerApp loop and ClientApp
as Flower's simulation engine, pinned to it in ``test_federation_inprocess.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from fcd_secure.apps.client_app import make_client_app
from fcd_secure.apps.server_loop import server_audit
from fcd_secure.apps.whatif_app import WhatIfError, WhatIfLoop, next_round
from fcd_secure.config import build_config
from fcd_secure.data.policy import load_policy_refs
from fcd_secure.engines.inprocess import InProcessGrid, run_inprocess
from fcd_secure.engines.whatif_run import open_run
from fcd_secure.federation.records import EVALUATE_MESSAGE_TYPE
from fcd_secure.queries.request import WhatIfRequest

SITES = 2


def _grid(cfg) -> InProcessGrid:
    grid = InProcessGrid(make_client_app(cfg), SITES)
    # the server's task identity, which Flower's Message constructor reads (as engines.inprocess sets it)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    return grid


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny 1-round run (plain aggregation) and its re-opened config and Θc."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("loop") / "run"
    run_inprocess(build_config("tiny", {
        "data": {"n_sites": SITES, "test_fraction": 0.2},
        "federation": {"clients_per_round": SITES, "rounds": 1, "eval_every": 0, "secure_aggregation": False},
        "evaluation": {"n_samples": 1, "max_rows": 8},
        "out": str(out),
    }))
    cfg, theta = open_run(out)
    return out, cfg, theta


def test_the_what_if_loop_trains_nothing_and_continues_the_runs_ledger(finished):
    out, cfg, theta = finished
    checkpoint = out / "state" / "_server" / "checkpoint.npz"
    kept = {p: p.read_bytes() for p in (checkpoint, out / "rounds.csv", out / "config.toml")}
    first = next_round(server_audit(cfg))
    assert first > cfg.federation.rounds  # the training run's rounds, its final evaluation and receipts came first
    request = WhatIfRequest(policies=load_policy_refs(["never", "always"]), reference="never")

    answer = WhatIfLoop(_grid(cfg), cfg, theta, request).run()

    assert answer["round"] == first
    assert {p: p.read_bytes() for p in kept} == kept  # no checkpoint, no rounds.csv line, no config rewritten
    audit = server_audit(cfg)
    assert next_round(audit) == first + 2  # the question's round and the closing receipts' round
    asked = [e for e in audit.ledger.entries() if getattr(e, "round", None) == first]
    assert any(getattr(e, "action", None) == EVALUATE_MESSAGE_TYPE for e in asked)


def test_a_theta_that_is_not_the_models_is_refused_before_a_question_is_sent(finished):
    _out, cfg, theta = finished
    name = sorted(theta)[0]
    wrong = {**theta, name: np.zeros((*np.shape(theta[name]), 2), dtype=np.float32)}
    before = next_round(server_audit(cfg))
    request = WhatIfRequest(policies=load_policy_refs(["never", "always"]), reference="never")
    with pytest.raises(WhatIfError, match=name):
        WhatIfLoop(_grid(cfg), cfg, wrong, request).run()
    asked = [e for e in server_audit(cfg).ledger.entries() if getattr(e, "round", None) == before]
    assert not any(getattr(e, "action", None) == EVALUATE_MESSAGE_TYPE for e in asked)


def test_a_deployed_serverapps_later_imports_run_beside_it_and_a_failing_one_fails_the_runs_own_import(
        tmp_path, monkeypatch):
    """``apps.server_app.import_in_background``: the imports run in a thread the caller need not wait for; one that
    fails is reported by the thread, leaves nothing behind, and the run's own import of it raises the same error."""
    import importlib
    import sys
    import threading

    from fcd_secure.apps.server_app import import_in_background, later_imports

    later_imports()  # every module it names exists
    (tmp_path / "fcd_later_probe.py").write_text("import time\ntime.sleep(0.2)\nLOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fcd_later_probe", raising=False)
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_type))

    def load() -> None:
        import fcd_later_probe  # noqa: F401
        import fcd_later_missing_module  # noqa: F401

    thread = import_in_background(load)
    assert thread.daemon
    assert importlib.import_module("fcd_later_probe").LOADED  # waits for the thread's import under way, or does it
    thread.join(60)
    assert not thread.is_alive() and reported == [ModuleNotFoundError]
    assert "fcd_later_missing_module" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="fcd_later_missing_module"):
        importlib.import_module("fcd_later_missing_module")
    monkeypatch.delitem(sys.modules, "fcd_later_probe")

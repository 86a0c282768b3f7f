"""The deployment's wait and wake-up plumbing (``_flower.wake``, ``_flower.waits``): a site's executor is
woken by its SuperNode instead of polling, idle polls scale with the consortium, and the ServerApp's grid is asked
less often and pushes more at once on the Deployment Engine only."""

from __future__ import annotations

import os
import stat
import time

import pytest

from fcd_secure._flower import waits as flower_waits
from fcd_secure._flower.wake import WakeError, WakeReader, notify


def test_a_wake_up_ends_the_wait_at_once_and_every_pending_one_is_consumed(tmp_path):
    pipe = tmp_path / "exec.wake"
    reader = WakeReader(pipe)
    try:
        assert stat.S_ISFIFO(pipe.lstat().st_mode) and stat.S_IMODE(pipe.lstat().st_mode) == 0o600
        t0 = time.perf_counter()
        assert reader.wait(0.2) is False  # nothing came: the wait times out
        assert time.perf_counter() - t0 >= 0.15
        for _ in range(5):
            notify(pipe)
        t0 = time.perf_counter()
        assert reader.wait(5.0) is True
        assert time.perf_counter() - t0 < 1.0
        assert reader.wait(0.05) is False  # the five wake-ups were one
    finally:
        reader.close()


def test_a_missing_pipe_or_an_absent_reader_is_not_an_error(tmp_path):
    notify(tmp_path / "nobody-here")  # no pipe
    os.mkfifo(tmp_path / "no-reader", 0o600)
    notify(tmp_path / "no-reader")  # a pipe nobody reads: the executor's fallback poll finds the task


def test_the_executor_refuses_a_path_that_is_not_a_pipe(tmp_path):
    planted = tmp_path / "exec.wake"
    planted.write_text("not a pipe")
    with pytest.raises(WakeError, match="not a named pipe"):
        WakeReader(planted)


def test_the_supernode_loop_wakes_the_executor_only_after_storing_a_message(tmp_path, monkeypatch):
    from flwr.supernode import start_client_internal as loop

    results = iter([None, 42])
    # the stand-in answers as Flower's function does: None for an empty pull, the run id once a message is stored
    monkeypatch.setattr(loop, "_pull_and_store_message", lambda **_kw: next(results))
    reader = WakeReader(tmp_path / "exec.wake")
    try:
        flower_waits.wake_executor_on_messages(str(tmp_path / "exec.wake"))
        flower_waits.wake_executor_on_messages(str(tmp_path / "exec.wake"))  # idempotent: still one wrapper
        assert loop._pull_and_store_message() is None
        assert reader.wait(0.05) is False
        assert loop._pull_and_store_message() == 42
        assert reader.wait(1.0) is True
    finally:
        reader.close()


def test_idle_polls_keep_the_whole_consortium_within_the_superlinks_request_budget():
    for n in (1, 4, 10, 40):
        poll = flower_waits.idle_poll_s(n)
        assert poll >= flower_waits.IDLE_POLL_S
        assert n / poll <= flower_waits.SUPERLINK_PULLS_PER_S + 1e-9
    assert flower_waits.idle_poll_s(4) == flower_waits.IDLE_POLL_S  # small consortia keep the short wait


def test_the_server_pulls_replies_less_often_only_over_http():
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid
    from flwr.superlink.grid.http_grid import HttpGrid

    http = HttpGrid.__new__(HttpGrid)  # not connected: only its type is read
    memory = InMemoryGrid.__new__(InMemoryGrid)
    assert flower_waits.grid_poll_s(memory, 0.02) == 0.02
    assert flower_waits.grid_poll_s(http, 0.02) == flower_waits.HTTP_GRID_POLL_S
    assert flower_waits.grid_poll_s(http, 1.0) == 1.0  # a slower configured poll is kept


def test_the_serverapp_grid_pushes_eight_objects_at_once(tmp_path):
    """``shorten_grid_backoff`` makes the ServerApp's ``HttpGrid`` push up to ``GRID_TRANSFERS`` objects at once
    (Flower: 2, and never more than the CPU count). Run in a fresh interpreter: the patch is process-wide."""
    import json
    import subprocess
    import sys

    script = tmp_path / "push.py"
    script.write_text(
        "import json, threading, time\n"
        "from flwr.app import ConfigRecord, RecordDict\n"
        "from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects\n"
        "from flwr.superlink.grid import http_grid\n"
        "from fcd_secure._flower import waits as flower_waits\n"
        "def widest(push):\n"
        "    objs = get_all_nested_objects(RecordDict({f'r{i}': ConfigRecord({'x': i}) for i in range(16)}))\n"
        "    lock, now, most = threading.Lock(), [0], [0]\n"
        "    def push_one(obj_id, content):\n"
        "        with lock:\n"
        "            now[0] += 1; most[0] = max(most[0], now[0])\n"
        "        time.sleep(0.05)\n"
        "        with lock:\n"
        "            now[0] -= 1\n"
        "    push(objs, push_object_fn=push_one)\n"
        "    return most[0]\n"
        "before = widest(http_grid.push_objects)\n"
        "flower_waits.shorten_grid_backoff()\n"
        "print(json.dumps([before, widest(http_grid.push_objects)]))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before <= 2
    assert after == flower_waits.GRID_TRANSFERS

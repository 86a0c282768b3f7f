"""The same app under Flower's Deployment Engine: a real SuperLink and 3 SuperNodes on 127.0.0.1.

Checks that one DSS round gives the same Θc as the simulation engine for the same seed, and that every process
started is gone afterwards (they are stopped by PID / process group, also when the test fails).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest


from fcd_secure.config import build_config  # noqa: E402

pytestmark = pytest.mark.deployment


def _cfg(out):
    return build_config(
        "tiny",
        {
            "seed": 0,
            "data": {"n_sites": 3},
            "federation": {"clients_per_round": 2, "rounds": 1, "eval_every": 0, "secure_aggregation": False},
            "out": str(out),
        },
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def _theta(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_deployment_engine_matches_simulation(tmp_path):
    from fcd_secure.federation.deployment import LocalDeployment
    from fcd_secure.federation.simulation import run_simulated

    dep = LocalDeployment(_cfg(tmp_path / "dep-run"), workdir=tmp_path / "dep")
    try:
        dep.start()
        pids = dep.pids()
        assert len(pids) == 4 and all(_alive(p) for p in pids)  # SuperLink + 3 SuperNodes
        summary = dep.run(timeout_s=420)
    finally:
        dep.stop()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in dep.pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in dep.pids()), "a deployment process survived stop()"

    assert summary["rounds"] == 1 and summary["engine"] == "flower"
    assert summary["uplink_bytes"] > 0
    # node config carried the site identity: the per-site state lives under the site ids, not Flower node ids
    assert sorted(p.name for p in (tmp_path / "dep" / "site-state").iterdir() if p.name.startswith("site-")) == [
        "site-00", "site-01", "site-02"
    ]
    sim = run_simulated(_cfg(tmp_path / "sim-run"))
    got = _theta(tmp_path / "dep-run" / "theta_c.npz")
    want = _theta(tmp_path / "sim-run" / "theta_c.npz")
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)

"""Errors that name their real cause before any work starts (issue 45 item 6), each through the real ``fcd`` command
in a fresh process (the exit code and the words a shell sees).

* a key typo in a policy file names the bad key and the closest valid one (not "Field required (and 1 more)");
* a typo is refused before torch or Flower is imported (``python -X importtime`` lists every module a process
  imports: Python docs, "Command line and environment", ``-X importtime``), so the refusal takes about a second,
  not the 10-20 s those imports cost on two busy cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: the modules whose import is the "heavy work" a typo must not wait for
HEAVY = ("torch", "flwr", "opacus", "pandas", "ray")


def fcd(*args: object, env: dict | None = None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, set[str], float]:
    """``fcd ARGS`` in a fresh interpreter under ``-X importtime``: the finished process (stderr without the import
    lines), the top-level packages it imported, and its wall time in seconds."""
    full = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(PROJECT_ROOT), **(env or {})}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "fcd_secure.cli.main", *map(str, args)],
                         capture_output=True, text=True, cwd=PROJECT_ROOT, env=full, timeout=timeout)
    wall = time.perf_counter() - t0
    lines = res.stderr.splitlines()
    imported = {ln.rsplit("|", 1)[1].strip().split(".")[0] for ln in lines if ln.startswith("import time:")}
    imported.discard("imported package")  # the header line
    res.stderr = "\n".join(ln for ln in lines if not ln.startswith("import time:"))
    return res, imported, wall


def _policy(tmp_path: Path, text: str, name: str = "typo.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, key, close",
    [
        ('name = "p"\n[rule]\nkind = "static"\nacton = "anchor:on"\n', "rule.acton", "action"),
        ('name = "p"\ndescripton = "x"\n[rule]\nkind = "static"\naction = "anchor:on"\n', "descripton", "description"),
        ('name = "p"\n[rule]\nkind = "window"\nunit = "fraction"\nstrat = 0.0\nstop = 0.5\ninside = "anchor:on"\n'
         'outside = "anchor:off"\n', "rule.strat", "start"),
    ],
)
def test_policy_key_typo_names_the_key_and_the_closest_valid_one(tmp_path, text, key, close):
    pol = _policy(tmp_path, text)
    out = tmp_path / "run"
    res, imported, wall = fcd("run", "--preset", "tiny", "--policy", pol, "--out", out, "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    env = json.loads(res.stdout)
    assert env["data"]["field"] == key, env
    bad = key.rsplit(".", 1)[-1]
    assert f"unknown key '{bad}'; did you mean '{close}'?" in env["message"], env["message"]
    assert "Field required" not in env["message"] and "more)" not in env["message"]
    assert not imported & set(HEAVY), f"imported before the typo was refused: {sorted(imported & set(HEAVY))}"
    assert not out.exists()
    print(f"policy typo refused in {wall:.1f} s")


@pytest.mark.parametrize(
    "args, words",
    [
        (("run", "--preset", "tiny", "--set", "modle.hidden=3", "--out", "OUT"), "did you mean model.hidden?"),
        (("run", "--dataset", "dkt-sinth", "--out", "OUT"), "did you mean 'dkt-synth'?"),
        (("run", "--preset", "tiyn", "--out", "OUT"), "unknown preset 'tiyn'"),
        (("run", "--preset", "tiny", "--set", "model.simulator=fed_causaldif", "--out", "OUT"), "is not a simulator"),
        (("deploy", "--preset", "tiyn", "--out", "OUT"), "unknown preset 'tiyn'"),
        (("deploy", "--set", "modle.hidden=3", "--out", "OUT"), "did you mean model.hidden?"),
        (("train", "--preset", "tiny", "--method", "naiv"), "unknown method(s) ['naiv']"),
        (("ablate", "--preset", "tiyn", "--out", "OUT"), "unknown preset 'tiyn'"),
        (("ablate", "--preset", "tiny", "--variant", "dsss", "--out", "OUT"), "unknown variant(s) ['dsss']"),
        (("reproduce", "--preset", "quik", "--out", "OUT"), "unknown reproduction preset 'quik'"),
        (("reproduce", "--method", "crnn", "--out", "OUT"), "unknown dataset(s) or method(s) ['crnn']"),
    ],
)
def test_typos_are_refused_before_torch_or_flower_is_imported(tmp_path, args, words):
    res, imported, wall = fcd(*(tmp_path / "out" if a == "OUT" else a for a in args))
    assert res.returncode == 2, res.stdout + res.stderr
    assert words in res.stdout + res.stderr, res.stdout + res.stderr
    assert not imported & set(HEAVY), f"imported before the typo was refused: {sorted(imported & set(HEAVY))}"
    assert not (tmp_path / "out").exists()
    print(f"{' '.join(args)} refused in {wall:.1f} s")


def test_a_policy_typo_in_a_whatif_is_refused_before_torch_or_flower_is_imported(tmp_path):
    pol = _policy(tmp_path, 'name = "p"\n[rule]\nkind = "static"\nacton = "anchor:on"\n')
    res, imported, _ = fcd("whatif", tmp_path / "some-run", "--policy", pol, "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "unknown key 'acton'; did you mean 'action'?" in json.loads(res.stdout)["message"]
    assert not imported & set(HEAVY), f"imported before the typo was refused: {sorted(imported & set(HEAVY))}"


def test_simulator_keys_are_the_simulators():
    """The torch-free table the config validates against is exactly the simulator classes, DP flag included."""
    from fcd_secure.model.baselines import SIMULATORS, FedCausalDiffSimulator
    from fcd_secure.model.config import SIMULATOR_KEYS

    assert list(SIMULATOR_KEYS) == list(SIMULATORS)
    assert SIMULATOR_KEYS == {k: issubclass(c, FedCausalDiffSimulator) for k, c in SIMULATORS.items()}


# -- the consortium's trajectory floor, where the site's table is first read -----------------------------------------
@pytest.fixture
def small_site(tmp_path):
    """``(spec, table)``: a valid table of 10 trajectories (the consortium default floor is 50)."""
    from conftest import GOOD_SPEC, make_long_table

    spec, table = tmp_path / "spec.toml", tmp_path / "small.csv"
    spec.write_text(GOOD_SPEC)
    make_long_table(10).to_csv(table, index=False)
    return spec, table


def test_data_validate_counts_each_site_against_the_floor(small_site, tmp_path):
    spec, table = small_site
    res, _, _ = fcd("data", "validate", "--spec", spec, "--table", table)
    assert res.returncode == 0, res.stdout + res.stderr  # a table for `fcd run` may be small: a warning
    assert "warning" in res.stdout and "the consortium needs at least 50 per site" in res.stdout, res.stdout
    res, _, _ = fcd("data", "validate", "--spec", spec, "--table", table, "--min-trajectories", "4", "--json")
    assert res.returncode == 1, res.stdout
    env = json.loads(res.stdout)
    assert "trajectories; the consortium needs at least 4 per site" in env["message"], env
    assert env["message"].startswith(f"{table}: site h"), env["message"]  # names the file and the site
    res, _, _ = fcd("data", "validate", "--spec", spec, "--table", table, "--min-trajectories", "2", "--json")
    env = json.loads(res.stdout)
    assert res.returncode == 0 and env["data"]["below_floor"] == {}, env
    assert sum(env["data"]["trajectories"].values()) == 10


def test_site_init_refuses_a_table_below_the_floor_before_making_keys(small_site, tmp_path):
    spec, table = small_site
    home = tmp_path / "site"
    res, _, _ = fcd("site", "init", "--spec", spec, "--table", table, "--home", home, "--site-id", "h0", "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    msg = json.loads(res.stdout)["message"]
    assert "10 trajectories; the consortium needs at least 50 per site" in msg and str(table) in msg, msg
    assert "--min-trajectories" in json.loads(res.stdout)["hint"]
    assert not home.exists(), "nothing is made for a refused table"


def _consortium_and_site(spec: Path, table: Path, root: Path, port: object, floor: int) -> tuple[Path, Path, str]:
    """``fcd consortium init`` (trajectory floor ``floor``) and ``fcd site init`` (its floor 5) in ``root``; returns
    the coordinator's home, the site's home and its identity fingerprint."""
    co, home = root / "co", root / "site"
    res, _, _ = fcd("consortium", "init", "--home", co, "--id", "demo", "--spec", spec, "--port", port,
                    "--min-trajectories", floor, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    res, _, _ = fcd("site", "init", "--spec", spec, "--table", table, "--home", home, "--site-id", "h0",
                    "--min-trajectories", "5", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["data"]["trajectories"] == 10
    return co, home, json.loads(res.stdout)["data"]["identity_fingerprint"]


def test_add_site_refuses_a_request_below_the_consortium_floor(small_site, tmp_path):
    # the site's operator passed a lower floor than the consortium's: the coordinator's check is the one that counts
    co, home, fp = _consortium_and_site(*small_site, tmp_path, 9, 50)
    res, _, _ = fcd("consortium", "add-site", home / "enrolment_request.json", "--home", co, "--fingerprint", fp,
                    "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    msg = json.loads(res.stdout)["message"]
    assert "site 'h0' brings 10 trajectories; the consortium needs at least 50 per site" in msg, msg
    assert not (co / "bundles" / "h0.json").exists()


# -- a second coordinator on a port in use ---------------------------------------------------------------------------
@pytest.mark.deployment
def test_server_start_on_a_port_in_use_names_the_port_before_registering(small_site, superlink, tmp_path):
    """Another consortium's SuperLink (the entry point `fcd server start` runs, its own TLS) holds 127.0.0.1:PORT;
    a second consortium on that port is refused naming it, before any process starts or any key is registered."""
    port, _ca, _key = superlink  # the session's shared SuperLink (conftest)
    co, home, fp = _consortium_and_site(*small_site, tmp_path, port, 5)
    res, _, _ = fcd("consortium", "add-site", home / "enrolment_request.json", "--home", co, "--fingerprint", fp)
    assert res.returncode == 0, res.stdout + res.stderr
    (co / "pki" / "ca.key").rename(tmp_path / "ca.key.offline")
    res, _, wall = fcd("server", "start", "--home", co, "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    env = json.loads(res.stdout)
    assert f"127.0.0.1:{port}: port {port} is in use by another process" in env["message"], env
    assert "no site was registered" in env["message"] and "registration" not in env["message"]
    assert not (co / "server" / "run" / "logs" / "register.log").exists(), "a key was sent to the other SuperLink"
    assert not (co / "server" / "run" / "pids.json").exists(), "a SuperLink was started"
    print(f"port in use refused in {wall:.1f} s")


# -- a question every site declines ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished tiny run of 2 sites, 1 round, on the in-process engine (``summary.json`` records it, so the `fcd
    whatif` of this test asks it in process too: the claim is the declined sites' names, not the engine)."""
    import torch

    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("declined") / "run"
    run_inprocess(build_config("tiny", {
        "data": {"n_sites": 2, "test_fraction": 0.2},
        "federation": {"clients_per_round": 2, "rounds": 1, "eval_every": 0, "secure_aggregation": False},
        "evaluation": {"n_samples": 2, "max_rows": None},
        "out": str(out),
    }))
    return out


@pytest.mark.slow
def test_a_declined_question_names_the_sites_and_the_rule(trained_run, tmp_path):
    """A question every site declines names each site and the rule; a question without threshold policies gets no
    hint about thresholds. `always` against `always` but a_off from step 11: the two differ only on the test rows
    12 steps long (6 on site-00, 5 on site-01), fewer than the sites' min_difference (20), so both decline (P41)."""
    pol = _policy(tmp_path, 'name = "on_until_11"\n[rule]\nkind = "switch"\nat = 11\nbefore = "anchor:on"\n'
                  'after = "anchor:off"\n')
    res, _, wall = fcd("whatif", trained_run, "--policy", "always", "--policy", pol, "--json", timeout=900)
    assert res.returncode == 1, res.stdout + res.stderr[-3000:]
    env = json.loads(res.stdout)
    assert env["error_code"] == "RUN_FAILED"
    assert ("no site answered the question: site-00, site-01 declined it under rule 'eval_cohort' (an evaluation "
            "the site's cohort rules refuse") in env["message"], env
    assert "threshold" not in env["hint"] and "ledger" in env["hint"], env["hint"]
    print(f"declined question answered in {wall:.1f} s")

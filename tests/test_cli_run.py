"""`fcd run` as a user runs it: the installed entry point in a fresh process, output piped at 80 columns.

Two real tiny runs, shared by every test here: run A from options (a fresh process), and run B from A's
``config.toml`` alone (the engine is not in the config, and B must still equal A bit for bit), in the test's own
process through the same command group (``cli_cases.fcd_here``): B's claim is the config's, not the process's. Both
are on the in-process engine (``--engine inprocess``): the same ServerApp, ClientApp and messages as Flower's
simulation engine, bit for bit (``test_federation_inprocess.py`` pins the two engines' parameters on a secure run, whose messages carry every kind a plain run sends), without a
Ray start per run. They show that progress survives a pipe (one line per round, no carriage returns), that
``rounds.csv`` is written as rounds end, that the header, the table and ``summary.json`` carry the DP setting, that
the tables fit 80 columns, and that a config re-runs its run exactly without touching the old run's folder. The
README's command on Flower's simulation engine (Ray) is run from the command line once in the suite, by
:func:`test_a_killed_run_stops_cleanly_and_resumes_from_its_last_round`: its progress on a pipe under Ray's logging,
its signal handling and its resume on the other engine. The tests that read runs A and B form one xdist group: the
two runs happen once, on one worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_cases import fcd_here
from conftest import CHEAP_EVALUATION

from fcd_secure.apps.outputs import ROUND_COLUMNS

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
#: the tests that read runs A and B (a module-scoped fixture) run on one xdist worker
shared_runs = pytest.mark.xdist_group("cli-run-a-b")


#: the console script's entry point (``fcd = fcd_secure.cli.main:main``) in a fresh process
FCD = [sys.executable, "-m", "fcd_secure.cli.main"]


def fcd(*args, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """``fcd`` in a fresh process, stdout and stderr piped, an 80-column terminal size."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(PROJECT_ROOT), "COLUMNS": "80"}
    return subprocess.run([*FCD, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def load_theta(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    # the closing evaluation cheap (conftest.CHEAP_EVALUATION): these tests read the CLI's lines, files and Θc, and
    # B's equality with A, never a policy's value
    cheap = [a for k, v in CHEAP_EVALUATION.items() for a in ("--set", f"evaluation.{k}={json.dumps(v)}")]
    a = fcd("run", "--preset", "tiny", "--rounds", ROUNDS, "--sites", "3", "--clients-per-round", "2",
            "--no-secure-aggregation", "--eval-every", "2", "--seed", "3", "--set", "evaluation.level=0.8",
            "--set", "federation.eval_every=1", *cheap, "--engine", "inprocess", "--out", "A", cwd=base)
    assert a.returncode == 0, a.stderr[-3000:]
    before = tree_digest(base / "A")
    # B in this process (the same command group; A's fresh process already showed the entry point): a re-run from a
    # config is about the config, and a second interpreter would add ~7 s of imports (cli_cases)
    b = fcd_here("run", "--config", base / "A" / "config.toml", "--engine", "inprocess", "--out", base / "B",
                 columns=80)
    assert b.returncode == 0, b.stderr[-3000:]
    return base, a, b, before


@shared_runs
def test_progress_survives_a_pipe_one_line_per_round(runs):
    _, a, _, _ = runs
    assert "\r" not in a.stderr and "\x1b[" not in a.stderr + a.stdout  # no carriage-return redraws, no colours
    lines = a.stderr.splitlines()
    assert lines[0].startswith("fcd run dkt-synth (tiny): 3 sites, 2/round, 3 rounds")
    assert "DP off (no DP guarantee)" in lines[0]
    per_round = [ln for ln in lines if ln.startswith("round ")]
    assert [ln.split(" ")[1] for ln in per_round] == [f"{r}/{ROUNDS}" for r in range(1, ROUNDS + 1)]
    assert "PEHE" in per_round[1] and "PEHE" not in per_round[0]  # evaluated every 2 rounds and at the end


@shared_runs
def test_rounds_csv_has_one_row_per_round_in_fixed_columns(runs):
    base, _, _, _ = runs
    rounds = pd.read_csv(base / "A" / "rounds.csv")
    assert tuple(rounds.columns) == ROUND_COLUMNS
    assert rounds["round"].tolist() == [1, 2, 3] and (rounds["participants"] == 2).all()
    assert rounds["pehe"].notna().tolist() == [False, True, True]


@shared_runs
def test_tables_fit_80_columns_and_say_there_is_no_dp(runs):
    base, a, _, _ = runs
    width = max(len(line) for line in a.stdout.splitlines())
    assert width <= 80, a.stdout
    assert "no DP guarantee" in a.stdout and "Extrapolation" in a.stdout
    # DKT-Synth declares its hidden readiness (queries.declared): the run says what the logs would identify is not
    # identified, and ranks nothing on it
    assert "what the logs would identify: not identified (declared unrecorded confounding" in " ".join(a.stdout.split())
    assert f"run folder: {base / 'A'}" in a.stdout.replace("\n", "") or "run folder: A" in a.stdout
    summary = json.loads((base / "A" / "summary.json").read_text())
    assert summary["dp"]["enabled"] is False and "no DP guarantee" in summary["dp"]["guarantee"]
    assert summary["site_ids"] == ["site-00", "site-01", "site-02"] and summary["site_errors"] == []


@shared_runs
def test_a_config_file_reruns_its_run_exactly_and_leaves_the_old_run_alone(runs):
    base, _, b, before = runs
    assert tree_digest(base / "A") == before, "the re-run wrote into the old run's folder"
    a_sum = json.loads((base / "A" / "summary.json").read_text())
    b_sum = json.loads((base / "B" / "summary.json").read_text())
    assert b_sum["rounds"] == ROUNDS and b_sum["seed"] == 3 and b_sum["n_sites"] == 3
    assert (a_sum["engine"], b_sum["engine"]) == ("flower-inprocess", "flower-inprocess")
    assert "engine" not in (base / "A" / "config.toml").read_text()  # B's engine came from its own command line
    for key in ("pehe", "ate_error", "factual_auc", "value_error_mean", "uplink_bytes"):
        assert b_sum[key] == a_sum[key], key
    theta_a, theta_b = load_theta(base / "A" / "theta_c.npz"), load_theta(base / "B" / "theta_c.npz")
    assert set(theta_a) == set(theta_b)
    for name in theta_a:
        np.testing.assert_array_equal(theta_a[name], theta_b[name], err_msg=name)
    # B has its own state (keys, ledgers), not A's
    assert (base / "B" / "state" / "_server" / "audit").is_dir()
    assert "state_dir" not in (base / "B" / "config.toml").read_text()
    # the per-round numbers (not timings, nor bytes that carry random node ids, receipts or signatures)
    same = ["round", "sites", "participants", "failures", "aborted", "n_total", "train_loss", "uplink_bytes",
            "uplink_formula_bytes", "cum_uplink_bytes", "pehe", "ate_error", "factual_auc"]
    pd.testing.assert_frame_equal(pd.read_csv(base / "A" / "rounds.csv")[same],
                                  pd.read_csv(base / "B" / "rounds.csv")[same])


@shared_runs
def test_set_reaches_the_run_config_under_the_named_options(runs):
    """``--set evaluation.level=0.8`` is in the run's config.toml; ``--set federation.eval_every=1`` gave way to
    ``--eval-every 2`` (named options come after --set)."""
    import tomllib

    base, _, _, _ = runs
    written = tomllib.loads((base / "A" / "config.toml").read_text())
    assert written["evaluation"]["level"] == 0.8 and written["federation"]["eval_every"] == 2
    assert tomllib.loads((base / "B" / "config.toml").read_text())["evaluation"]["level"] == 0.8


@shared_runs
def test_options_given_with_a_config_override_only_what_they_name(runs, tmp_path):
    from fcd_secure.cli.resolve import RunOptions, resolve_config

    base, _, _, _ = runs
    file = base / "A" / "config.toml"
    cfg = resolve_config(RunOptions(config_file=file, rounds=7))
    assert cfg.federation.rounds == 7 and cfg.preset == "tiny" and cfg.data.n_sites == 3
    assert cfg.federation.clients_per_round == 2 and cfg.federation.secure_aggregation is False
    assert cfg.model.hidden == 16 and cfg.seed == 3  # the file's, not the default preset's
    assert cfg.state_dir is None and cfg.out != str(base / "A")
    # re-running into the old folder is refused before anything starts
    res = fcd_here("run", "--config", file, "--out", base / "A", columns=80)
    assert res.returncode == 2 and "already holds a run" in res.stderr and "--resume" in res.stderr


@pytest.mark.slow
def test_a_killed_run_stops_cleanly_and_resumes_from_its_last_round(tmp_path):
    """`kill PID` (SIGTERM) during a long run on the simulation engine (where Ray takes the signal handler), the
    README's command as a user types it, piped (the suite's one ``fcd run`` on Ray): progress is one line per round
    with no carriage returns or colours, rounds.csv
    already holds the finished rounds (it is appended as each ends), the run stops at its next wait and exits 130
    saying how to continue, without a traceback; --resume continues from that round (on the in-process engine: the
    state on disk is the engine's neither, and a second Ray start would add nothing to the claim)."""
    import signal
    import time

    # a user's shell: no FLWR_LOG_LEVEL that in-process tests of this session may have set in os.environ
    env = {**{k: v for k, v in os.environ.items() if k != "FLWR_LOG_LEVEL"},
           "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(PROJECT_ROOT), "COLUMNS": "80"}
    args = ["run", "--preset", "tiny", "--rounds", "60", "--sites", "3", "--clients-per-round", "2",
            "--no-secure-aggregation", "--eval-every", "0", "--out", "K"]
    proc = subprocess.Popen([*FCD, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    csv = tmp_path / "K" / "rounds.csv"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if csv.exists() and len(csv.read_text().splitlines()) >= 2:  # header + round 1, while the run goes on
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        done = len(csv.read_text().splitlines()) - 1
        assert done >= 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    # the signal reached our handler although ray.init had replaced it (the main thread takes it back once the sites
    # are connected), so the run stopped at its next wait instead of under Ray's teardown
    assert "stopping after the tasks in hand" in err
    assert "interrupted after round" in err and "fcd run --resume K" in err
    assert "Traceback" not in err and out == ""
    # the README's command on Ray, piped: one progress line per finished round, no carriage-return redraws and no
    # colours from Ray's or Flower's logging
    assert "\r" not in err and "\x1b[" not in err
    lines = err.splitlines()
    assert lines[0].startswith("fcd run dkt-synth (tiny): 3 sites, 2/round, 60 rounds") and "DP off" in lines[0]
    last = int(pd.read_csv(csv)["round"].max())
    per_round = [ln.split(" ")[1] for ln in lines if ln.startswith("round ")]
    assert per_round == [f"{r}/60" for r in range(1, last + 1)], per_round
    # the resume reads only the state on disk: in this process (cli_cases), sparing a fresh interpreter's imports
    res = fcd_here("run", "--resume", tmp_path / "K", "--rounds", last + 1, "--engine", "inprocess", columns=80)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming from round {last}" in res.stderr
    assert pd.read_csv(csv)["round"].tolist() == list(range(1, last + 2))
    assert json.loads((tmp_path / "K" / "summary.json").read_text())["resumed_from_round"] == last

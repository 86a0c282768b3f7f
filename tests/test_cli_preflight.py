"""`fcd run` with bad input: exit 2 before any engine starts, the file and column (or field) named, nothing written.

Every case here fails on a run that starts its engine first: it would end 20–50 s later in "a site did not answer
hello" (exit 1) with a half-written run folder. One case goes through the installed entry point in a fresh process
(the exit code a shell sees); the others run in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GOOD_SPEC, make_long_table
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.data import policy as policy_module

runner = CliRunner()
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _run(*args, out: Path) -> object:
    return runner.invoke(app, ["run", "--preset", "tiny", "--rounds", "1", *map(str, args), "--out", str(out), "--json"])


def _bad_input(res, out: Path, *needles: str) -> dict:
    assert res.exit_code == 2, res.output
    env = json.loads(res.stdout)
    assert (env["status"], env["error_code"]) == ("error", "BAD_INPUT"), env
    for needle in needles:
        assert needle in env["message"], (needle, env["message"])
    assert "hello" not in env["message"]
    assert not out.exists(), "bad input must write nothing (no run folder, no keys, no ledgers)"
    return env


@pytest.fixture
def table(tmp_path):
    """``(spec, table)`` of a valid long table with a site column (3 hospitals, 120 patients: enough test rows at each
    for the tiny preset's split)."""
    spec = tmp_path / "spec.toml"
    spec.write_text(GOOD_SPEC)
    path = tmp_path / "table.csv"
    make_long_table(n_entities=120).to_csv(path, index=False)
    return spec, path


def test_bad_table_names_file_column_and_row_like_data_validate(table, tmp_path):
    spec, path = table
    df = make_long_table(n_entities=30)
    df.loc[5, "y"] = 7
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    out = tmp_path / "run"
    env = _bad_input(_run("--spec", spec, "--table", bad, out=out), out, str(bad), "column 'y'", "row 5")
    assert (env["data"]["file"], env["data"]["column"], env["data"]["row"]) == (str(bad), "y", 5)
    validate = runner.invoke(app, ["data", "validate", "--spec", str(spec), "--table", str(bad), "--json"])
    assert json.loads(validate.stdout)["message"] == env["message"]  # one validator, one message


def test_site_column_decides_the_sites(table, tmp_path):
    spec, path = table
    out = tmp_path / "run"
    _bad_input(_run("--spec", spec, "--table", path, "--sites", "10", out=out), out, str(path), "column 'hospital'", "3 sites",
               "--sites is 10")
    # secure aggregation needs more sites than the table has
    df = make_long_table(n_entities=30)
    df["hospital"] = df["hospital"].replace({"h2": "h1"})
    two = tmp_path / "two.csv"
    df.to_csv(two, index=False)
    _bad_input(_run("--spec", spec, "--table", two, out=out), out, "column 'hospital'", "2 sites", "secure aggregation")
    assert runner.invoke(app, ["run", "--spec", str(spec), "--table", str(path), "--clients-per-round", "4", "--json",
                               "--out", str(out)]).exit_code == 2
    assert not out.exists()


def test_sites_and_clients_per_round_follow_the_table(table, tmp_path):
    from fcd_secure.cli.preflight import check_run
    from fcd_secure.cli.resolve import RunOptions, resolve_config
    from fcd_secure.config import build_config

    spec, path = table
    minimum = build_config("tiny").secagg.min_sites
    df = make_long_table(n_entities=200)
    df["hospital"] = [f"h{int(p[1:]) % minimum}" for p in df["pid"]]
    wide = tmp_path / "wide.csv"
    df.to_csv(wide, index=False)
    opts = RunOptions(preset="tiny", spec=(spec, wide), out=tmp_path / "never")
    cfg = check_run(resolve_config(opts), opts)
    # the table's sites; per round the secure minimum, not half of them
    assert cfg.data.n_sites == minimum and cfg.federation.clients_per_round == minimum
    opts = RunOptions(preset="tiny", spec=(spec, path), secure=False, out=tmp_path / "never")
    cfg = check_run(resolve_config(opts), opts)
    assert (cfg.data.n_sites, cfg.federation.clients_per_round) == (3, 1)
    assert not (tmp_path / "never").exists()


def test_absurd_max_len_is_refused_before_allocating(table, tmp_path):
    _, path = table
    spec = tmp_path / "huge.toml"
    spec.write_text(GOOD_SPEC.replace("max_len = 4", "max_len = 2000000000"))
    out = tmp_path / "run"
    env = _bad_input(_run("--spec", spec, "--table", path, out=out), out, str(spec), "max_len", "TiB")
    assert env["data"]["field"] == "max_len"


def test_unknown_dataset_and_missing_data_folder(tmp_path):
    out = tmp_path / "run"
    _bad_input(_run("--dataset", "mnist", out=out), out, "unknown dataset 'mnist'")
    _bad_input(_run("--dataset", "statics2011", "--data-dir", tmp_path / "nowhere", out=out), out,
               str(tmp_path / "nowhere"))


def test_out_that_is_a_file_or_another_run(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    for out in (afile, afile / "run"):
        res = _run("--no-secure-aggregation", out=out)
        assert res.exit_code == 2 and str(afile) in json.loads(res.stdout)["message"], res.output
    assert afile.read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.toml").write_text("seed = 0\n")
    res = _run(out=other)
    env = json.loads(res.stdout)
    assert res.exit_code == 2 and "already holds a run" in env["message"] and "--resume" in env["hint"]
    assert sorted(p.name for p in other.iterdir()) == ["config.toml"]


def test_a_malformed_policy_is_bad_input_naming_the_file(tmp_path, monkeypatch):
    folder = tmp_path / "policies"
    folder.mkdir()
    for name in policy_module.DEFAULT_POLICY_NAMES:
        (folder / f"{name}.toml").write_text((policy_module.policy_dir() / f"{name}.toml").read_text())
    (folder / "late_on.toml").write_text('name = "late_on"\n[rule\n')
    monkeypatch.setattr(policy_module, "policy_dir", lambda: folder)
    out = tmp_path / "run"
    _bad_input(_run(out=out), out, str(folder / "late_on.toml"), "TOML")


def test_a_config_file_with_a_typo_names_the_file_and_field(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[federation]\nrounds = 3\nrouns = 4\n")
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--config", str(cfg), "--out", str(out), "--json"])
    assert res.exit_code == 2
    env = json.loads(res.stdout)
    assert str(cfg) in env["message"] and "federation.rouns" in env["message"]
    assert not out.exists()


def test_the_shell_sees_exit_2_and_a_named_folder_within_seconds(tmp_path):
    """The installed entry point in a fresh process, no engine: a missing data folder is named, exit 2."""
    fcd = Path(sys.executable).with_name("fcd")
    if not fcd.exists():
        pytest.skip("the fcd console script is not installed in this environment")
    missing = tmp_path / "no-data"
    out = tmp_path / "run"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(PROJECT_ROOT), "FCD_DATA_DIR": str(missing)}
    t0 = time.perf_counter()
    proc = subprocess.run([str(fcd), "run", "--dataset", "diabetes130", "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    elapsed = time.perf_counter() - t0
    print(f"bad-input run failed after {elapsed:.1f} s")  # benchmarks/cli_startup.py reports it too
    assert proc.returncode == 2, proc.stderr
    assert str(missing) in proc.stderr and "FCD_DATA_DIR" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []

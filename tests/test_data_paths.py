"""Where the real datasets are read from: one rule (``--data-dir``, then ``$FCD_DATA_DIR``, then ../shared/data),
honoured by the API and by ``fcd run``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fcd_secure.data import paths
from fcd_secure.data.paths import DATA_DIR_ENV, default_data_dir
from fcd_secure.data.registry import check_available, load_federated
from fcd_secure.data.spec import DataError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_dirs(tmp_path, shared_data):
    """``(holding, empty)``: a folder holding a link to the real statics2011 folder, and an empty folder."""
    holding, empty = tmp_path / "data", tmp_path / "empty"
    holding.mkdir()
    empty.mkdir()
    (holding / "statics2011").symlink_to(shared_data / "statics2011", target_is_directory=True)
    return holding, empty


def test_explicit_folder_then_environment_then_shared(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(b))
    assert default_data_dir(a) == a  # --data-dir wins over the environment
    assert default_data_dir() == b
    monkeypatch.delenv(DATA_DIR_ENV)
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text("")  # a source checkout
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.setattr(paths, "PROJECT_ROOT", root)
    assert default_data_dir() == tmp_path / "shared" / "data"
    # an installed package (no pyproject.toml beside it) has no default folder, even where ../shared/data exists:
    # its "project root" is site-packages, and the folder would resolve inside the virtual environment
    (root / "pyproject.toml").unlink()
    with pytest.raises(DataError, match="installed package has no default folder"):
        default_data_dir()


def test_a_missing_folder_is_named_never_skipped(tmp_path, monkeypatch):
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match="--data-dir") as exc:
        default_data_dir(missing)
    assert exc.value.file == str(missing)
    # a wrong $FCD_DATA_DIR is an error, even though ../shared/data may exist
    monkeypatch.setenv(DATA_DIR_ENV, str(missing))
    with pytest.raises(DataError, match=DATA_DIR_ENV) as exc:
        default_data_dir()
    assert exc.value.file == str(missing)
    # nothing set and no ../shared/data: the message lists what was tried
    monkeypatch.delenv(DATA_DIR_ENV)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text("")
    monkeypatch.setattr(paths, "PROJECT_ROOT", tmp_path / "project")
    with pytest.raises(DataError) as exc:
        default_data_dir()
    msg = str(exc.value)
    assert "--data-dir" in msg and DATA_DIR_ENV in msg and str(tmp_path / "shared" / "data") in msg


def test_load_federated_and_check_follow_the_environment(data_dirs, monkeypatch):
    holding, empty = data_dirs
    monkeypatch.setenv(DATA_DIR_ENV, str(holding))
    assert check_available("statics2011") == holding / "statics2011"
    fd = load_federated("statics2011", n_sites=3, preset="tiny")
    assert fd.n_sites == 3 and sum(d.n for d in fd.train + fd.test) == 300
    assert check_available("dkt-synth") is None  # generated: reads no folder
    monkeypatch.setenv(DATA_DIR_ENV, str(empty))
    for call in (lambda: check_available("statics2011"), lambda: load_federated("statics2011", preset="tiny")):
        with pytest.raises(DataError, match="statics2011") as exc:
            call()
        assert str(empty) in str(exc.value)


def _fcd_run(data_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """`fcd run` on Statics2011 (tiny, one round, 3 sites, the in-process engine: the claim is where the data is read
    from) with $FCD_DATA_DIR = data_dir.

    It runs a copy of this checkout's package in ``out.parent/project``, which has no ``../shared/data`` next to it,
    so the run can only find the data through $FCD_DATA_DIR."""
    fcd = Path(sys.executable).with_name("fcd")
    if not fcd.exists():
        pytest.skip("the fcd console script is not installed in this environment")
    project = out.parent / "project"
    if not project.exists():
        for part in ("fcd_secure", "policies"):
            shutil.copytree(PROJECT_ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__"))
    assert not (project.parent / "shared" / "data").exists()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(out.parent)),
        "FLWR_TELEMETRY_ENABLED": "0",
        "PYTHONPATH": str(project),
        DATA_DIR_ENV: str(data_dir),
    }
    args = ["run", "--dataset", "statics2011", "--preset", "tiny", "--rounds", "1", "--no-secure-aggregation",
            "--sites", "3", "--engine", "inprocess", "--out", str(out), "--json"]
    return subprocess.run([str(fcd), *args], capture_output=True, text=True, env=env, timeout=600, cwd=out.parent)


@pytest.mark.slow
def test_fcd_run_reads_the_folder_named_by_FCD_DATA_DIR(data_dirs, tmp_path):
    holding, _ = data_dirs
    res = _fcd_run(holding, tmp_path / "run")
    # Statics2011 logs no propensities and too many items for a site's model of them: the answer is the
    # simulator's alone, which the run says with exit 8 (MODEL_ONLY_ANSWER)
    assert res.returncode == 8, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "statics2011"


def test_fcd_run_with_an_empty_FCD_DATA_DIR_fails_naming_it(data_dirs, tmp_path):
    """Checked before the engine starts: exit 2 naming the folder, nothing written (no run folder)."""
    _, empty = data_dirs
    res = _fcd_run(empty, tmp_path / "run")
    assert res.returncode == 2, res.stderr[-3000:]  # bad input
    assert str(empty) in res.stdout + res.stderr
    assert "hello" not in res.stdout + res.stderr
    assert not (tmp_path / "run").exists()

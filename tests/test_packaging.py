"""The wheel a user installs works outside the source tree: it carries the policies and the DKT oracle, its ``fcd``
runs a tiny federation from a fresh virtual environment, and it has no default data folder inside that environment.

One test (it builds a wheel and runs one tiny round in process: about a minute). The fresh environment sees the
project's virtual environment's packages through a ``.pth`` file (the equivalent of ``--system-site-packages`` on top
of it), so nothing is downloaded; the wheel itself is installed with ``--no-deps``.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("fcd_secure", "policies", "pyproject.toml", "setup.py", "README.md")


def _sh(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


@pytest.mark.slow
def test_wheel_installs_outside_the_tree_and_runs(tmp_path):
    # build from a clean copy: a stale build/ in the checkout could slip removed modules into the wheel
    src = tmp_path / "src"
    for name in SOURCES:
        p = PROJECT_ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(p, src / name)
    dist = tmp_path / "dist"
    built = _sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src],
                timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("fcd_secure-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    policies = {f"fcd_secure/policies/{p.name}" for p in (PROJECT_ROOT / "policies").glob("*.toml")}
    assert policies and policies <= names, sorted(policies - names)
    for f in ("fcd_secure/data/oracle/dkt_oracle.pt", "fcd_secure/data/oracle/dkt_oracle.pt.sha256",
              "fcd_secure/data/oracle/dkt_oracle.json", "fcd_secure/cli/main.py", "fcd_secure/cli/envelope.py"):
        assert f in names, f
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fcd = fcd_secure.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()
    assert not any(n.startswith(("tests/", "policies/")) for n in names)

    venv = tmp_path / "venv"
    made = _sh([sys.executable, "-m", "venv", "--without-pip", venv], timeout=300)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    purelib = _sh([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    project_site = sysconfig.get_paths()["purelib"]
    # the project's packages (torch, flwr, ...) are visible; its editable fcd_secure finder is not processed
    Path(purelib, "_project_venv.pth").write_text(project_site + "\n" + "\n".join(site.getsitepackages()) + "\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "FLWR_TELEMETRY_ENABLED": "0",
           "COLUMNS": "80"}
    inst = _sh([py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], env=env, timeout=600)
    assert inst.returncode == 0, inst.stderr[-3000:]

    where = tmp_path / "elsewhere"
    where.mkdir()
    probe = _sh([py, "-c", "import fcd_secure, fcd_secure.data.paths as p; print(fcd_secure.__file__); "
                 "print(p.policy_dir()); print(p.is_source_checkout())"], env=env, cwd=where, timeout=300)
    assert probe.returncode == 0, probe.stderr
    module, pol, checkout = probe.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(pol) == Path(module).parent / "policies"
    assert checkout == "False"
    nodata = _sh([py, "-c", "from fcd_secure.data.paths import default_data_dir; default_data_dir()"], env=env,
                 cwd=where, timeout=300)
    assert nodata.returncode != 0 and "installed package has no default folder" in nodata.stderr
    assert str(venv) not in nodata.stderr.split("DataError")[-1]  # never a folder inside the environment

    fcd = venv / "bin" / "fcd"
    assert _sh([fcd, "--version"], env=env, cwd=where).stdout.strip().startswith("fcd ")
    # the in-process engine: the claim is the installed package (its entry point, policies, data rule), not Ray's start
    run = _sh([fcd, "run", "--preset", "tiny", "--rounds", "1", "--sites", "3", "--no-secure-aggregation",
               "--eval-every", "0", "--engine", "inprocess", "--out", "run", "--json"], env=env, cwd=where, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    env_json = json.loads(run.stdout)
    summary = env_json["data"]
    assert env_json["status"] == "ok" and summary["rounds"] == 1
    assert summary["failed_sites_final_eval"] == [] and set(summary["policies"]) == {
        "never", "always", "early_on", "late_on"}
    assert (where / "run" / "summary.json").is_file() and not (PROJECT_ROOT / "run").exists()
    assert "\r" not in run.stderr and "round 1/1" in run.stderr

    # the installed policies are what the run evaluates: without them, `fcd run` is bad input naming the file
    shutil.rmtree(Path(pol))
    gone = _sh([fcd, "run", "--preset", "tiny", "--rounds", "1", "--out", "run2"], env=env, cwd=where, timeout=600)
    assert gone.returncode == 2 and "never.toml" in gone.stderr, gone.stderr[-2000:]
    assert not (where / "run2").exists()

"""Issue 32, items 2 and 3: every answer says which sites and how many entities it covers, names a site that
declined or failed (stdout and JSON, exit 7 when an answer covers fewer sites than the run), and no answer about a
policy the logs never follow comes out as a point with a narrow interval.

One real tiny run (the installed entry point in a fresh process, Flower's simulation engine) on a user's table of
four hospitals: one has too few patients for its evaluation cohort (it declines), and no hospital ever logs the
action ``metformin``. Then ``fcd whatif`` asks the same run again. The tests that read them form one xdist group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GOOD_SPEC, make_long_table
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.queries.evaluation import coverage

PROJECT_ROOT = Path(__file__).resolve().parents[1]
shared = pytest.mark.xdist_group("answer-coverage")
METFORMIN = 'name = "metformin_only"\ndescription = "metformin at every step"\n[rule]\nkind = "static"\naction = "metformin"\n'


def fcd(*args, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(PROJECT_ROOT), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "fcd_secure.cli.main", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=cwd)


def write_table(folder: Path) -> tuple[Path, Path]:
    """Three hospitals of ~63 patients and one of 12 (its test split stays below the cohort floor of 20); the
    action metformin is never logged (replaced by insulin)."""
    df = make_long_table(n_entities=200, seed=1)
    ents = list(df["pid"].unique())
    df["hospital"] = df["pid"].map({e: (f"h{i % 3}" if i >= 12 else "h3") for i, e in enumerate(ents)})
    df["drug"] = df["drug"].replace({"metformin": "insulin"})
    spec, table = folder / "spec.toml", folder / "table.csv"
    spec.write_text(GOOD_SPEC)
    df.to_csv(table, index=False)
    return spec, table


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    base = tmp_path_factory.mktemp("coverage")
    spec, table = write_table(base)
    (base / "metformin.toml").write_text(METFORMIN)
    run = fcd("run", "--preset", "tiny", "--rounds", "1", "--spec", spec, "--table", table, "--no-secure-aggregation",
              "--dp-epsilon", "8", "-p", "never", "-p", "metformin.toml", "--out", "run", cwd=base)
    what = fcd("whatif", "run", "-p", "never", "-p", "metformin.toml", "--json", cwd=base)
    return base, run, what


@shared
def test_a_run_that_leaves_a_site_out_names_it_and_exits_7(asked):
    base, run, _ = asked
    assert run.returncode == 7, run.stderr[-3000:]
    assert "WARNING: the answers cover 3 of 4 sites" in run.stdout and "site-03 (declined" in run.stdout
    summary = json.loads((base / "run" / "summary.json").read_text())
    cov = summary["coverage"]
    assert cov["sites_covered"] == ["site-00", "site-01", "site-02"] and cov["declined"] == ["site-03"]
    assert cov["complete"] is False and cov["n_entities"] == summary["policies"]["never"]["n"] > 0
    assert all(d["n_sites"] == 3 for d in summary["policies"].values())
    assert "error: the answers cover 3 of 4 sites" in run.stderr


@shared
def test_a_policy_no_logged_step_follows_is_not_identified(asked):
    base, run, _ = asked
    d = json.loads((base / "run" / "summary.json").read_text())["policies"]["metformin_only"]
    assert d["identified"] is False and d["support"] == 0.0 and d["value_sim"] is None
    assert d["n_sites_without_support"] == 3 and d["sites_without_support"] == ["site-00", "site-01", "site-02"]
    # what is left is the bounds over the outcome's range, never a point with a narrow interval
    assert (d["interval"]["low"], d["interval"]["high"]) == (0.0, 1.0)
    assert d["doubly_robust"]["estimate"] is None and d["effect"]["estimate"] is None
    assert all(r["value"] is None for k, r in d.items() if isinstance(r, dict) and "ess" in r)
    assert "value_sim" in d["model_only"]  # the model's extrapolation is kept, labelled as the model's only
    line = next(x for x in run.stdout.splitlines() if x.strip().startswith("│ metformin_only"))
    assert "not identified" in line and "0.000–1.000" in line
    assert "metformin_only: not identified" in run.stdout


@shared
def test_whatif_says_what_it_covers_too(asked):
    _, _, what = asked
    assert what.returncode == 7, what.stderr[-3000:]
    env = json.loads(what.stdout)
    assert (env["exit_code"], env["error_code"]) == (7, "INCOMPLETE_ANSWER")
    assert "site-03" in env["message"] and env["data"]["coverage"]["declined"] == ["site-03"]
    assert env["data"]["policies"]["metformin_only"]["identified"] is False


def test_data_validate_reports_actions_a_site_never_logs(tmp_path):
    spec, table = write_table(tmp_path)
    res = CliRunner().invoke(app, ["data", "validate", "--spec", str(spec), "--table", str(table), "--json"])
    assert res.exit_code == 0, res.output
    absent = json.loads(res.stdout)["data"]["actions_absent"]
    assert absent["all sites"] == ["metformin"] and "metformin" in absent["h3"]
    res = CliRunner().invoke(app, ["data", "validate", "--spec", str(spec), "--table", str(table)])
    assert "no site logs metformin" in res.stdout


def test_coverage_names_every_site_left_out():
    full = coverage(["a", "b", "c"], [], [], 90)
    assert full["complete"] and full["warning"] is None and full["n_entities"] == 90
    part = coverage(["a", "b", "c"], ["c"], ["b"], 40)
    assert part["sites_covered"] == ["a"] and not part["complete"]
    assert "cover 1 of 3 sites (40 test entities)" in part["warning"]
    assert "b (declined" in part["warning"] and "c (failed" in part["warning"]
    none = coverage(["a", "b", "c", "d"], [], ["d"], None, aborted=True)
    assert none["sites_covered"] == [] and none["n_entities"] is None and "a (no sum revealed)" in none["warning"]

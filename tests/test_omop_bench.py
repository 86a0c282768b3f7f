"""``benchmarks/omop.py --quick``: the OMOP extraction benchmark runs and prints its figures (reading the cohort
from CSV, DuckDB and, where the server binaries are installed, PostgreSQL)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fcd_secure.data.paths import PROJECT_ROOT
from pg_server import postgres_bin


@pytest.mark.slow
def test_the_quick_benchmark_prints_time_and_memory_for_each_form():
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "FLWR_TELEMETRY_ENABLED": "0"}
    res = subprocess.run([sys.executable, str(PROJECT_ROOT / "benchmarks" / "omop.py"), "--quick"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "persons form" in res.stdout and "peak MB" in res.stdout
    forms = ["csv", "duckdb"] + (["postgresql"] if postgres_bin() is not None else [])
    for n in (100, 300):
        for form in forms:
            # persons, form, rows (50 steps each), seconds, peak MB, +MB
            line = rf"^\s+{n} {form}\s+{n * 50}\s+\d+\.\d\d\s+\d+\s+-?\d+$"
            assert re.search(line, res.stdout, re.M), (form, n, res.stdout)

"""The hospital path with an OMOP CDM database (issue 46): a consortium whose spec is a cohort spec, a site
installed on its DuckDB CDM, and ``fcd site preflight`` checking the database (connection, CDM tables and columns,
concept ids) before anything starts, green and red."""

from __future__ import annotations

import duckdb

from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import site as site_cli
from test_hospital_install import TLSListener, free_port, invoke
from test_omop import fcd


def test_a_site_on_its_cdm_installs_and_preflight_checks_the_database_first(tmp_path):
    res = fcd("data", "export", "--dataset", "tumour", "--preset", "tiny", "--sites", "2", "--format", "omop",
              "--out", "omop", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    cohort, db = tmp_path / "omop" / "cohort.toml", tmp_path / "omop" / "site0.duckdb"
    port = free_port()
    code, env = invoke(consortium_cli.app, ["init", "--home", str(tmp_path / "co"), "--id", "demo", "--spec",
                                            str(cohort), "--port", str(port), "--min-trajectories", "5"])
    assert code == 0, env
    cfp = env["data"]["coordinator_fingerprint"]
    home = tmp_path / "site0"
    code, env = invoke(site_cli.app, ["init", "--spec", str(cohort), "--table", str(db), "--home", str(home),
                                      "--site-id", "h0"])
    assert code == 0, env
    code, added = invoke(consortium_cli.app, ["add-site", str(home / "enrolment_request.json"), "--home",
                                              str(tmp_path / "co"), "--fingerprint", env["data"]["identity_fingerprint"]])
    assert code == 0, added
    code, env = invoke(site_cli.app, ["join", str(tmp_path / "co" / "bundles" / "h0.json"), "--home", str(home),
                                      "--coordinator-fingerprint", cfp])
    assert code == 0, env

    def preflight() -> dict:
        listener = TLSListener(tmp_path / "co" / "pki", port)
        try:
            _, out = invoke(site_cli.app, ["preflight", "--home", str(home), "--timeout", "2"])
        finally:
            listener.close()
        return {c["name"]: c for c in out["data"]["checks"]}

    checks = preflight()
    assert checks["database"]["status"] == "ok", checks
    assert "CDM tables and columns" in checks["database"]["message"]
    assert checks["table"]["status"] == "ok" and checks["spec"]["status"] == "ok", checks
    assert {n for n, c in checks.items() if c["status"] == "fail"} == set(), checks

    con = duckdb.connect(str(db))
    con.execute("drop table death")
    con.close()
    checks = preflight()
    assert checks["database"]["status"] == "fail", checks
    assert "CDM table 'death' is missing" in checks["database"]["message"]

"""``fcd site service``: the unit runs as a dedicated service user (never silently as whoever wrote it, often root),
and a site home or table that the unit's private /tmp would hide from the service is named in a warning."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from conftest import GOOD_SPEC, make_long_table
from typer.testing import CliRunner

from fcd_secure.cli import site as site_cli


def _site(root: Path, name: str = "s") -> Path:
    table, spec, home = root / f"{name}.csv", root / f"{name}-spec.toml", root / f"{name}-home"
    make_long_table(20, seed=1).to_csv(table, index=False)
    spec.write_text(GOOD_SPEC)
    res = CliRunner().invoke(site_cli.app, ["init", "--spec", str(spec), "--table", str(table), "--home", str(home),
                                            "--site-id", "h0", "--min-trajectories", "5", "--json"])
    assert res.exit_code == 0, res.output
    return home


def _service(*args: str):
    return CliRunner().invoke(site_cli.app, ["service", *args])


def test_the_unit_runs_as_a_dedicated_user_and_root_is_refused(tmp_path):
    home = _site(tmp_path)
    res = _service("--home", str(home), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    unit = Path(data["unit"]).read_text()
    assert "User=fcd-site\n" in unit and "User=root" not in unit and data["user"] == "fcd-site"
    res = _service("--home", str(home), "--user", "hospital-svc", "--json")
    assert "User=hospital-svc\n" in Path(json.loads(res.stdout)["data"]["unit"]).read_text()
    refused = _service("--home", str(home), "--user", "root", "--json")
    assert refused.exit_code == 2 and "root" in refused.stdout


def test_a_home_or_table_under_tmp_is_named_as_hidden_by_the_private_tmp(tmp_path):
    with tempfile.TemporaryDirectory(dir="/tmp") as t:  # a site installed under /tmp
        home = _site(Path(t))
        res = _service("--home", str(home), "--json")
        assert res.exit_code == 0, res.output
        warnings = json.loads(res.stdout)["data"]["warnings"]
        assert any("site home" in w and "PrivateTmp" in w for w in warnings)
        assert any("table" in w for w in warnings)
        human = _service("--home", str(home))
        assert "warning:" in human.output and "PrivateTmp" in " ".join(human.output.split())
    with tempfile.TemporaryDirectory(dir=Path.home()) as t:  # a site installed where the service can see it
        home = _site(Path(t), "elsewhere")
        assert json.loads(_service("--home", str(home), "--json").stdout)["data"]["warnings"] == []

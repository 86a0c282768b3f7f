"""`fcd data describe --spec SPEC --table TABLE`: a user's own table described like the built-in datasets, with the anchor
actions of the paper's policies by id and label, and the contexts by how a rollout treats them."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fcd_secure.cli.main import app


def test_describe_spec_prints_anchors_and_contexts(long_case):
    spec, table = long_case()
    r = CliRunner().invoke(app, ["data", "describe", "--spec", str(spec), "--table", str(table), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["data"]["toy"]
    an = d["anchors"]
    assert {an["a_off_name"], an["a_on_name"]} <= {"none", "insulin", "metformin"}
    assert an["a_off_name"] == ["none", "insulin", "metformin"][an["a_off"]]
    # the spec leaves both contexts at the default: endogenous (lab and its missing indicator, the ward one-hot)
    assert d["contexts"]["exogenous"] == [] and "lab" in d["contexts"]["endogenous"]
    assert d["n_sites"] == 3
    r = CliRunner(env={"COLUMNS": "100"}).invoke(app, ["data", "describe", "--spec", str(spec), "--table", str(table)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"a_off = {an['a_off']} ({an['a_off_name']}), a_on = {an['a_on']} ({an['a_on_name']})" in text
    assert "generated under an intervention (endogenous): lab" in text


def test_describe_spec_bad_table_names_the_file(long_case, tmp_path):
    spec, table = long_case()
    r = CliRunner().invoke(app, ["data", "describe", "--spec", str(spec), "--table", str(tmp_path / "missing.csv")])
    assert r.exit_code == 2 and "missing.csv" in " ".join(r.output.split())  # a file that is not there: bad input

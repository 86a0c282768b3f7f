"""The encoded data layout a consortium pins: declared categorical levels and always-written missing indicators make
every site's encoding the same whatever its own table holds, and preflight compares the site's layout with the
consortium's digest before any run."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from conftest import GOOD_SPEC, make_long_table
from test_hospital_install import TLSListener, free_port, invoke

from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import site as site_cli
from fcd_secure.data.preprocess import build_dataset, encoded_layout, layout_digest, spec_layout
from fcd_secure.data.spec import DataError, DatasetSpec, load_spec
from fcd_secure.provisioning.consortium import ConsortiumConfig
from fcd_secure.provisioning.site_install.preflight import _check_layout

DECLARED_SPEC = GOOD_SPEC.replace('kind = "categorical"\n', 'kind = "categorical"\nlevels = ["a", "b", "c"]\n')


def load_spec_text(text: str) -> DatasetSpec:
    return DatasetSpec.model_validate(tomllib.loads(text))


def _one_site(df, site: str):
    return df[df["hospital"] == site].reset_index(drop=True)


def test_declared_levels_give_every_site_the_spec_layout():
    df = make_long_table(30)
    # a site that never saw ward "c" and has no missing lab value: today's pitfall
    h0 = _one_site(df, "h0")
    h0 = h0[h0["ward"] != "c"].reset_index(drop=True)
    h1 = _one_site(df, "h1")
    assert h0["lab"].notna().all() and set(h0["ward"]) == {"a", "b"}
    spec = load_spec_text(DECLARED_SPEC)
    l0 = encoded_layout(build_dataset(spec, h0, "h0.csv").meta)
    l1 = encoded_layout(build_dataset(spec, h1, "h1.csv").meta)
    assert l0 == l1 == spec_layout(spec)
    assert l0["a_names"] == ["lab", "lab__missing", "ward=a", "ward=b", "ward=c"]
    # the indicator is written even where this table has no missing value (it is all zeros then)
    ds0 = build_dataset(spec, h0, "h0.csv")
    assert np.all(ds0.A[..., 1] == 0)
    # without declared levels the two sites' encodings differ, and the spec alone cannot say what they are
    loose = load_spec_text(GOOD_SPEC)
    assert encoded_layout(build_dataset(loose, h0, "h0.csv").meta) != encoded_layout(build_dataset(loose, h1, "h1.csv").meta)
    assert spec_layout(loose) is None


def test_value_outside_declared_levels_is_named():
    df = make_long_table(12)
    df.loc[5, "ward"] = "icu"
    with pytest.raises(DataError) as exc:
        build_dataset(load_spec_text(DECLARED_SPEC), df, "visits.csv")
    err = exc.value
    assert (err.column, err.row, err.line) == ("ward", 5, 7)
    assert "'icu'" in str(err) and "context[1].levels" in str(err)


def test_levels_only_on_categorical_columns(tmp_path):
    bad = tmp_path / "spec.toml"
    bad.write_text(GOOD_SPEC.replace('name = "age"\nkind = "continuous"\n', 'name = "age"\nkind = "continuous"\nlevels = ["x"]\n'))
    with pytest.raises(DataError) as exc:
        load_spec(bad)
    assert "static[0]" in str(exc.value) and "only categorical columns have levels" in str(exc.value)
    with pytest.raises(ValueError, match="unique"):
        DatasetSpec.model_validate({"entity": "e", "time": "t", "action": "a", "outcome": "y", "n_actions": 2,
                                    "static": [{"name": "w", "kind": "categorical", "levels": ["a", "a"]}]})


def _consortium(tmp: Path, spec_text: str) -> tuple[Path, Path, int]:
    """A consortium with one enrolled, joined site holding only the rows of hospital h0 that never visit ward c."""
    (tmp / "spec.toml").write_text(spec_text)
    port = free_port()
    code, env = invoke(consortium_cli.app, ["init", "--home", str(tmp / "co"), "--id", "demo", "--spec",
                                            str(tmp / "spec.toml"), "--port", str(port), "--min-trajectories", "3"])
    assert code == 0, env
    cfp = env["data"]["coordinator_fingerprint"]
    df = make_long_table(30)
    table = tmp / "h0.csv"
    df[(df["hospital"] == "h0") & (df["ward"] != "c")].to_csv(table, index=False)
    home = tmp / "site"
    code, env = invoke(site_cli.app, ["init", "--spec", str(tmp / "spec.toml"), "--table", str(table), "--home",
                                      str(home), "--site-id", "h0", "--min-trajectories", "3"])
    assert code == 0, env
    code, added = invoke(consortium_cli.app, ["add-site", str(home / "enrolment_request.json"), "--home",
                                              str(tmp / "co"), "--fingerprint", env["data"]["identity_fingerprint"]])
    assert code == 0, added
    code, env = invoke(site_cli.app, ["join", str(tmp / "co" / "bundles" / "h0.json"), "--home", str(home),
                                      "--coordinator-fingerprint", cfp])
    assert code == 0, env
    return tmp / "co", home, port


def _preflight(co: Path, home: Path, port: int) -> dict:
    listener = TLSListener(co / "pki", port)
    try:
        _code, env = invoke(site_cli.app, ["preflight", "--home", str(home), "--timeout", "2"])
    finally:
        listener.close()
    return {c["name"]: c for c in env["data"]["checks"]}


def test_consortium_pins_the_layout_and_preflight_checks_it(tmp_path):
    co, home, port = _consortium(tmp_path, DECLARED_SPEC)
    terms = tomllib.loads((co / "consortium.toml").read_text())["data"]
    assert terms["layout_sha256"] == layout_digest(spec_layout(load_spec_text(DECLARED_SPEC)))
    checks = _preflight(co, home, port)
    assert checks["layout"]["status"] == "ok", checks["layout"]
    assert {n for n, c in checks.items() if c["status"] == "fail"} == set(), checks

    # a site whose encoding differs from the pinned one (another release's encoder, an edited pin) is red, naming
    # the part that differs
    cfg = ConsortiumConfig.from_toml((co / "consortium.toml").read_text(), "consortium.toml")
    spec = load_spec_text(DECLARED_SPEC)
    other = spec_layout(load_spec_text(DECLARED_SPEC.replace('levels = ["a", "b", "c"]', 'levels = ["c", "b", "a"]')))
    check = _check_layout(other, spec, cfg)
    assert check.status == "fail" and "a_names" in check.message, check


def test_undeclared_levels_leave_the_layout_unpinned_and_say_so(tmp_path):
    co, home, port = _consortium(tmp_path, GOOD_SPEC)
    assert "layout_sha256" not in tomllib.loads((co / "consortium.toml").read_text())["data"]
    checks = _preflight(co, home, port)
    assert checks["layout"]["status"] == "warn", checks["layout"]
    assert "context[1].levels" in checks["layout"]["message"]

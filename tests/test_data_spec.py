"""`fcd data validate`: a spec maps a long table to SiteDataset; every bad input exits non-zero, names the
file/column/row (or spec field), and writes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GOOD_SPEC, make_long_table
from typer.testing import CliRunner

from fcd_secure.cli.data import app
from fcd_secure.data.npz import load_npz
from fcd_secure.data.preprocess import Standardizer, build_dataset, dataset_from_files
from fcd_secure.data.spec import DataError, load_spec

runner = CliRunner()


def _validate(spec, table, out, *extra):
    return runner.invoke(app, ["validate", "--spec", str(spec), "--table", str(table), "--out", str(out), *extra])


def _assert_rejected(result, out, *needles):
    assert result.exit_code == 1, result.output
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    assert not out.exists()
    assert not list(out.parent.glob("*.npz*")), "a partial output file was left behind"


def test_valid_table_summary_and_roundtrip(long_case, tmp_path):
    spec, table = long_case()
    out = tmp_path / "built.npz"
    res = _validate(spec, table, out, "--json")
    assert res.exit_code == 0, res.output
    env = json.loads(res.stdout)
    assert env["status"] == "ok" and env["exit_code"] == 0 and env["error_code"] is None
    summary = env["data"]
    df = make_long_table()
    assert summary["entities"] == df["pid"].nunique()
    assert summary["steps"] == len(df) - summary["dropped_steps"]
    assert summary["sites"] == ["h0", "h1", "h2"]
    ds = load_npz(out)
    _, ref = dataset_from_files(spec, table)
    # the site is told what the default model.ipw = 'auto' makes of its table
    assert summary["has_propensity"] == (ref.P is not None)
    assert summary["local_objective"] == ("propensity-weighted (ipw step)" if ref.P is not None
                                          else "unweighted (no propensities)")
    for k in ("X", "A", "T", "Y", "M", "P"):
        np.testing.assert_array_equal(getattr(ds, k), getattr(ref, k))
    assert ds.meta["action_names"] == ["none", "insulin", "metformin"]
    np.testing.assert_array_equal(ds.meta["entity"], ref.meta["entity"])


def test_unwritable_out_folder_is_a_clear_error_and_writes_nothing(long_case, tmp_path):
    spec, table = long_case()
    out = tmp_path / "no_such_folder" / "toy.npz"
    res = _validate(spec, table, out, "--json")
    _assert_rejected(res, out, "cannot write the dataset", str(out))
    env = json.loads(res.stdout)
    assert env["status"] == "error" and env["exit_code"] == 1 and env["error_code"] == "DATA_INVALID"
    assert env["data"]["file"] == str(out)
    assert not out.parent.exists() and not list(tmp_path.rglob("*.npz*"))
    # human output: the same message on stderr, exit 1, no traceback
    res = _validate(spec, table, out)
    _assert_rejected(res, out, "cannot write the dataset")
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_human_summary_exit_0(long_case):
    spec, table = long_case()
    res = runner.invoke(app, ["validate", "--spec", str(spec), "--table", str(table)])
    assert res.exit_code == 0
    assert "sequences" in res.stdout and "ok" in res.stdout


def test_usage_error_exits_2(long_case):
    _, table = long_case()
    res = runner.invoke(app, ["validate", str(table)])
    assert res.exit_code == 2


def test_misnamed_column(long_case, tmp_path):
    df = make_long_table().rename(columns={"drug": "drugs"})
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "'drug'", "'action'", "drugs",
                     str(table))


def test_nan_outcome_names_row(long_case, tmp_path):
    df = make_long_table()
    df.loc[7, "y"] = np.nan
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'y'", "row 7", "line 9")


def test_inf_static_names_row(long_case, tmp_path):
    df = make_long_table()
    df.loc[5, "age"] = np.inf
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'age'", "row 5", "inf")


def test_nan_in_context_without_indicator_is_rejected(long_case, tmp_path):
    spec, table = long_case(spec=GOOD_SPEC.replace('missing = "indicator"\n', ""))
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'lab'", "row 3",
                     "context[0].missing")


def test_action_not_in_vocabulary(long_case, tmp_path):
    df = make_long_table()
    df.loc[11, "drug"] = "aspirin"
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'drug'", "row 11",
                     "aspirin")


def test_action_id_out_of_range(long_case, tmp_path):
    df = make_long_table()
    df["drug"] = df["drug"].map({"none": 0, "insulin": 1, "metformin": 2})
    df.loc[9, "drug"] = 3
    spec_text = GOOD_SPEC.replace('actions = ["none", "insulin", "metformin"]', "n_actions = 3")
    spec, table = long_case(df, spec_text)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'drug'", "row 9",
                     "out of range [0, 3)")


def test_time_not_increasing(long_case, tmp_path):
    df = make_long_table()
    rows = df.index[df["pid"] == "p005"]
    df.loc[rows[3], "visit"] = df.loc[rows[1], "visit"]  # goes back in time
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'visit'",
                     f"row {rows[3]}", "p005")


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.2])
def test_propensity_outside_unit_interval(long_case, tmp_path, bad):
    df = make_long_table()
    df.loc[4, "p"] = bad
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'p'", "row 4",
                     "(0, 1]")


def test_declared_site_without_rows_is_empty_site(long_case, tmp_path):
    spec_text = GOOD_SPEC.replace('site = "hospital"', 'site = "hospital"\nsites = ["h0", "h1", "h2", "h3"]')
    spec, table = long_case(spec=spec_text)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "h3", "empty site",
                     "column 'hospital'")


def test_site_changing_within_entity(long_case, tmp_path):
    df = make_long_table()
    rows = df.index[df["pid"] == "p004"]
    df.loc[rows[2], "hospital"] = "h2" if df.loc[rows[0], "hospital"] != "h2" else "h0"
    spec, table = long_case(df)
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "column 'hospital'",
                     f"row {rows[2]}")


def test_spec_that_does_not_parse(long_case, tmp_path):
    spec, table = long_case(spec="name = \"x\"\nentity = [unclosed\n")
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", str(spec), "does not parse")


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s.replace("max_len = 4", "max_len = 0"), "max_len"),
        (lambda s: s.replace('kind = "categorical"', 'kind = "ordinal"'), "context[1].kind"),
        # a key typo names the bad key, with the valid key it is closest to in the message
        (lambda s: s.replace('outcome = "y"', 'outcme = "y"'), "outcme"),
    ],
)
def test_invalid_spec_names_field(long_case, tmp_path, edit, field):
    spec, table = long_case(spec=edit(GOOD_SPEC))
    res = _validate(spec, table, tmp_path / "o.npz", "--json")
    assert res.exit_code == 1
    env = json.loads(res.stdout)
    err = env["data"]
    assert env["status"] == "error" and err["file"] == str(spec)
    assert err["field"] == field or err["field"].startswith(field)
    if field == "outcme":
        assert "unknown key 'outcme'; did you mean 'outcome'?" in env["message"], env["message"]
    assert not (tmp_path / "o.npz").exists()


def test_yaml_spec_and_parquet_table(long_case, tmp_path):
    spec_toml, table = long_case(suffix=".parquet")
    import tomllib

    import yaml

    spec_yaml = tmp_path / "spec.yaml"
    spec_yaml.write_text(yaml.safe_dump(tomllib.loads(spec_toml.read_text())))
    assert load_spec(spec_yaml) == load_spec(spec_toml)
    _, ds = dataset_from_files(spec_yaml, table)
    assert ds.n == make_long_table()["pid"].nunique()


def test_encoding_truncation_and_meta():
    df = make_long_table()
    spec = load_spec_text(GOOD_SPEC)
    ds = build_dataset(spec, df, "mem.csv")
    # X: age (continuous), female (binary); A: lab, its missing indicator, 3 one-hot wards
    assert ds.meta["x_names"] == ["age", "female"] and ds.meta["x_continuous"] == [0]
    assert ds.meta["a_names"] == ["lab", "lab__missing", "ward=a", "ward=b", "ward=c"]
    assert ds.L == 4 and ds.n == 12
    lens = df.groupby("pid", sort=True).size().to_numpy()
    assert ds.meta["truncated_entities"] == int((lens > 4).sum())
    assert ds.meta["dropped_steps"] == int(np.maximum(lens - 4, 0).sum())
    np.testing.assert_array_equal(ds.lengths, np.minimum(lens, 4))
    # one-hot rows sum to 1 on valid steps, 0 on padding
    onehot = ds.A[:, :, 2:5].sum(axis=2)
    np.testing.assert_array_equal(onehot, ds.M)
    # the one missing lab value is flagged and filled with 0
    flagged = np.argwhere(ds.A[:, :, 1] == 1)
    assert len(flagged) == 1
    e, t = flagged[0]
    assert ds.A[e, t, 0] == 0.0
    # action ids follow the declared vocabulary
    first = df.groupby("pid", sort=True).first()
    np.testing.assert_array_equal(ds.T[:, 0], first["drug"].map({"none": 0, "insulin": 1, "metformin": 2}).to_numpy())
    np.testing.assert_array_equal(ds.meta["site"], first["hospital"].map({"h0": 0, "h1": 1, "h2": 2}).to_numpy())


def test_chunk_mode_and_large_categorical_ids():
    df = make_long_table()
    df["ward"] = [f"w{i % 15}" for i in range(len(df))]  # 15 levels > one_hot_max = 10: one integer-id column
    spec = load_spec_text(GOOD_SPEC.replace("max_len = 4", 'max_len = 4\noverflow = "chunk"'))
    ds = build_dataset(spec, df, "mem.csv")
    lens = df.groupby("pid", sort=True).size().to_numpy()
    assert ds.n == int(np.ceil(lens / 4).sum())
    assert int(ds.M.sum()) == len(df) and ds.meta["dropped_steps"] == 0
    col = ds.meta["a_names"].index("ward")
    assert ds.meta["a_categorical"] == {col: 16}
    vals = ds.A[:, :, col][ds.M > 0]
    assert vals.min() >= 1 and vals.max() <= 15 and np.allclose(vals, np.round(vals))


def test_sort_by_time_option_accepts_unsorted_rows():
    df = make_long_table().sample(frac=1.0, random_state=3).reset_index(drop=True)
    with pytest.raises(DataError, match="time does not increase"):
        build_dataset(load_spec_text(GOOD_SPEC), df, "mem.csv")
    ds = build_dataset(load_spec_text(GOOD_SPEC + "\n"), df.sort_values(["pid", "visit"]), "mem.csv")
    shuffled = build_dataset(load_spec_text("sort_by_time = true\n" + GOOD_SPEC), df, "mem.csv")
    np.testing.assert_array_equal(ds.Y, shuffled.Y)
    np.testing.assert_array_equal(ds.T, shuffled.T)


def test_standardizer_uses_training_statistics_only():
    ds = build_dataset(load_spec_text(GOOD_SPEC), make_long_table(), "mem.csv")
    train, test = ds.subset(np.arange(8)), ds.subset(np.arange(8, 12))
    std = Standardizer.fit(train)
    tr, te = std.apply(train), std.apply(test)
    assert abs(tr.X[:, 0].mean()) < 1e-5 and abs(tr.X[:, 0].std() - 1) < 1e-4
    # test is shifted by the *training* mean: its ages are all older, so its mean stays clearly positive
    assert te.X[0, 0] == pytest.approx((test.X[0, 0] - std.x_mean[0]) / std.x_std[0], rel=1e-5)
    assert te.X[:, 0].mean() > 1.0
    # padding of A stays 0, and the binary column is untouched
    assert (te.A[te.M == 0] == 0).all()
    np.testing.assert_array_equal(te.X[:, 1], test.X[:, 1])
    with pytest.raises(DataError, match="already standardised"):
        std.apply(tr)


def load_spec_text(text: str):
    import tomllib

    from fcd_secure.data.spec import DatasetSpec

    return DatasetSpec.model_validate(tomllib.loads(text))


def test_header_only_table_is_rejected(long_case, tmp_path):
    spec, table = long_case(make_long_table().iloc[:0])
    _assert_rejected(_validate(spec, table, tmp_path / "o.npz"), tmp_path / "o.npz", "no rows", str(table))


def test_parquet_table_errors_name_row_without_csv_line(long_case, tmp_path):
    df = make_long_table()
    df.loc[2, "y"] = 3
    spec, table = long_case(df, suffix=".parquet")
    res = _validate(spec, table, tmp_path / "o.npz", "--json")
    assert res.exit_code == 1
    err = json.loads(res.stdout)["data"]
    assert (err["column"], err["row"], err["line"]) == ("y", 2, None)
    assert not (tmp_path / "o.npz").exists()


def test_installed_fcd_command_exit_codes(long_case, tmp_path):
    """The real entry point (`fcd data validate`, registered by cli/main.py) exits 1 on bad data and writes nothing.

    One subprocess only: the console script imports every CLI module (torch, Flower), seconds of CPU each time."""
    import subprocess
    import sys
    from pathlib import Path

    fcd = Path(sys.executable).with_name("fcd")
    if not fcd.exists():
        pytest.skip("the fcd console script is not installed in this environment")
    df = make_long_table()
    df.loc[6, "p"] = 2.0
    spec, table = long_case(df)
    env = {"FLWR_TELEMETRY_ENABLED": "0", "PATH": "/usr/bin:/bin"}
    out = tmp_path / "never.npz"
    bad = subprocess.run([str(fcd), "data", "validate", "--spec", str(spec), "--table", str(table), "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert "column 'p'" in bad.stderr and "row 6" in bad.stderr
    assert not out.exists()

"""The run configuration as a user meets it: layers (defaults < file < preset < options named), a config file that
re-runs its run, `fcd config show` with every key's description, and docs/config.md kept current."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fcd_secure.cli.config import DOCS_COMMAND, reference_markdown
from fcd_secure.cli.envelope import CliError
from fcd_secure.cli.main import app
from fcd_secure.cli.resolve import RunOptions, resolve_config
from fcd_secure.config import PRESETS, RunConfig, build_config, describe_fields
from fcd_secure.apps.outputs import ROUND_COLUMNS, RoundsLog, config_for_folder, write_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_docs_config_md_is_current():
    text = (PROJECT_ROOT / "docs" / "config.md").read_text()
    assert text == reference_markdown(), f"docs/config.md is stale: run `{DOCS_COMMAND}`"


def test_every_key_of_the_run_sections_is_described():
    own = ("seed", "preset", "data.", "federation.", "evaluation.", "dp.", "state_dir", "out")
    missing = [r["key"] for r in describe_fields() if r["key"].startswith(own) and not r["description"]]
    assert missing == []


def test_config_show_is_a_commented_toml_that_resolves_to_the_same_config(tmp_path):
    res = runner.invoke(app, ["config", "show", "--preset", "tiny"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "# global communication rounds\nrounds = 2" in text and "[federation]" in text
    shown = tmp_path / "shown.toml"
    shown.write_text(text)
    again = resolve_config(RunOptions(config_file=shown))
    want = resolve_config(RunOptions(preset="tiny"))
    assert again.model_dump(exclude={"out"}) == want.model_dump(exclude={"out"})


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_written_config_reads_back_equal(tmp_path, preset):
    cfg = build_config(preset, {"seed": 5, "dp": {"enabled": True, "epsilon": 3.0}})
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert RunConfig.load(path) == cfg


def test_layers_file_then_preset_then_named_options(tmp_path):
    path = tmp_path / "c.toml"
    base = build_config("tiny", {"federation": {"rounds": 3, "clients_per_round": 2, "secure_aggregation": False},
                                 "data": {"n_sites": 4}, "seed": 9, "out": "old", "state_dir": "old/state"})
    path.write_text(base.to_toml())
    cfg = resolve_config(RunOptions(config_file=path))
    # the file re-runs as it is: no default preset (40 rounds), no default secure aggregation, its own seed
    assert (cfg.federation.rounds, cfg.federation.clients_per_round, cfg.federation.secure_aggregation) == (3, 2, False)
    assert cfg.seed == 9 and cfg.preset == "tiny" and cfg.model.hidden == 16
    assert cfg.state_dir is None and cfg.out != "old"  # the old run's folders are not the re-run's
    cfg = resolve_config(RunOptions(config_file=path, rounds=5, seed=1))
    assert (cfg.federation.rounds, cfg.seed, cfg.federation.clients_per_round) == (5, 1, 2)
    cfg = resolve_config(RunOptions(config_file=path, preset="default"))
    # an explicit preset is an option like any other: it sets the keys it names, over the file
    assert cfg.federation.rounds == 40 and cfg.data.preset == "default" and cfg.preset == "default"
    # without a file: the default preset, secure aggregation on, half the sites per round but at least the minimum
    cfg = resolve_config(RunOptions(sites=4))
    assert cfg.preset == "default" and cfg.federation.secure_aggregation is True
    assert cfg.federation.clients_per_round == max(2, cfg.secagg.min_sites)
    assert resolve_config(RunOptions(sites=10, secure=False)).federation.clients_per_round == 5


def test_resume_continues_in_the_run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = build_config("tiny", {"federation": {"crash_after_round": 2, "secure_aggregation": False,
                                                "clients_per_round": 2}, "out": str(run)})
    write_config(run, cfg.model_copy(update={"state_dir": str(run / "state")}))
    assert "state_dir" not in (run / "config.toml").read_text()  # the folder's own state is implied
    resumed = resolve_config(RunOptions(resume=run, rounds=4))
    assert resumed.out == str(run) and resumed.state_dir == str(run / "state")
    assert resumed.federation.rounds == 4 and resumed.federation.crash_after_round is None
    with pytest.raises(CliError, match="not a run folder"):
        resolve_config(RunOptions(resume=tmp_path))
    with pytest.raises(CliError, match="leave out --out"):
        resolve_config(RunOptions(resume=run, out=tmp_path / "elsewhere"))
    kept = config_for_folder(cfg.model_copy(update={"state_dir": str(tmp_path / "shared-state")}))
    assert kept.state_dir == str(tmp_path / "shared-state")  # a state folder elsewhere is part of the config


def test_rounds_log_appends_one_line_per_round(tmp_path):
    log = RoundsLog(tmp_path)
    log.start([])
    assert (tmp_path / "rounds.csv").read_text().splitlines() == [",".join(ROUND_COLUMNS)]
    log.append({"round": 1, "sites": "site-00 site-02", "participants": 2, "pehe": None, "train_loss": 1.5})
    log.append({"round": 2, "sites": "site-01 site-02", "participants": 2, "pehe": 0.1})
    lines = (tmp_path / "rounds.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith("1,site-00 site-02,2,") and lines[2].startswith("2,")
    log.start([{"round": 1, "participants": 2}])  # a resumed run starts from its checkpoint's history
    assert len((tmp_path / "rounds.csv").read_text().splitlines()) == 2


def test_a_config_file_that_does_not_name_secure_aggregation_aggregates_securely(tmp_path):
    """Secure by default on every path: the command line, a preset, and a hand-written file that leaves the key out
    (a user's file must not silently fall back to plain FedAvg)."""
    path = tmp_path / "mine.toml"
    path.write_text('preset = "tiny"\n\n[federation]\nrounds = 3\n')
    assert resolve_config(RunOptions(config_file=path)).federation.secure_aggregation is True
    assert resolve_config(RunOptions(preset="tiny")).federation.secure_aggregation is True
    assert resolve_config(RunOptions(config_file=path, secure=False)).federation.secure_aggregation is False

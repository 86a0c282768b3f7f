"""One command line (issue 41 item 7): one option name per concept in every command, repeated options instead of
comma lists, the old spellings still read with a deprecation note, ``--set KEY=VALUE`` for any config key, and
``fcd train`` running the centralised reference without a flag.

Read from the click tree of ``fcd_secure.cli.main:app`` (what ``--help`` shows) and from real invocations.
"""

from __future__ import annotations

import json

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.cli.renamed import RENAMED, rewrite
from fcd_secure.cli.resolve import RunOptions, resolve_config
from fcd_secure.config import ConfigError, parse_value, settings_overrides

ROOT_CMD = get_command(app)
runner = CliRunner()


def _commands(cmd: click.Command = ROOT_CMD, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    if isinstance(cmd, click.Group):
        out: dict[tuple[str, ...], click.Command] = {}
        for name, sub in cmd.commands.items():
            out.update(_commands(sub, path + (name,)))
        return out
    return {path: cmd}


COMMANDS = _commands()


def _visible(cmd: click.Command) -> dict[str, click.Option]:
    """The long option names a user sees in ``--help`` of ``cmd``, each with its option."""
    return {name: p for p in cmd.params if isinstance(p, click.Option) and not p.hidden
            for name in (*p.opts, *p.secondary_opts) if name.startswith("--")}


#: spellings no command may show, and the name each concept has everywhere instead
FORBIDDEN = {
    # a number of sites
    "--n-sites": "--sites", "--n-site": "--sites", "--num-sites": "--sites", "--nsites": "--sites",
    # trajectories at one site (fcd privacy plan)
    "--n-trajectories": "--trajectories", "--n": "--trajectories",
    # the DP parameters of a run
    "--epsilon": "--dp-epsilon", "--eps": "--dp-epsilon", "--dp-eps": "--dp-epsilon", "--delta": "--dp-delta",
    "--clip": "--dp-clip",
    # seeds
    "--first-seed": "--seed", "--random-seed": "--seed", "--seed-start": "--seed", "--n-seeds": "--seeds",
    # where a command writes
    "--output": "--out", "--out-dir": "--out", "--outdir": "--out", "--output-dir": "--out", "--run-dir": "--out",
    # data and state folders
    "--datadir": "--data-dir", "--data-root": "--data-dir", "--statedir": "--state-dir", "--state": "--state-dir",
    # machine output
    "--as-json": "--json", "--json-output": "--json",
    # lists: the option is repeated, singular
    "--policies": "--policy", "--methods": "--method", "--variants": "--variant", "--datasets": "--dataset",
    "--tables": "--table",
    # the answers' settings
    "--confidence": "--level", "--alpha-level": "--level", "--steps-ahead": "--horizon",
    # fcd train is the centralised reference
    "--centralised": "(none)", "--centralized": "(none)",
}


def test_there_are_commands_to_walk():
    assert len(COMMANDS) >= 25


def test_no_command_shows_a_forbidden_spelling():
    found = {f"fcd {' '.join(path)} {name}": FORBIDDEN[name]
             for path, cmd in COMMANDS.items() for name in _visible(cmd) if name in FORBIDDEN}
    assert not found, found


def test_one_dp_epsilon_option_and_a_dp_switch_is_never_an_epsilon():
    """ε is --dp-epsilon wherever a command takes it; ``fcd server run --dp/--no-dp`` only turns DP on or off."""
    with_eps = {path for path, cmd in COMMANDS.items() if "--dp-epsilon" in _visible(cmd)}
    assert {("run",), ("deploy",), ("privacy", "plan")} <= with_eps
    for path, cmd in COMMANDS.items():
        opt = _visible(cmd).get("--dp")
        assert opt is None or opt.is_flag, f"fcd {' '.join(path)} --dp takes a value: that is --dp-epsilon"


def test_no_option_takes_a_comma_list():
    """A list is the option repeated (``--method a --method b``), never a comma list."""
    comma = [f"fcd {' '.join(path)} {name}" for path, cmd in COMMANDS.items() for name, opt in _visible(cmd).items()
             if "comma" in (opt.help or "").lower()]
    assert not comma, comma


@pytest.mark.parametrize("path, option", [(("train",), "--method"), (("ablate",), "--variant"),
                                          (("reproduce",), "--dataset"), (("reproduce",), "--method"),
                                          (("run",), "--policy"), (("run",), "--set"), (("deploy",), "--set"),
                                          (("config", "show"), "--set"), (("train",), "--set"),
                                          (("ablate",), "--set")], ids=str)
def test_list_options_are_repeatable(path, option):
    assert _visible(COMMANDS[path])[option].multiple


def test_every_renamed_option_names_a_command_and_its_new_option():
    for path, renamed in RENAMED.items():
        assert path in COMMANDS, path
        visible = _visible(COMMANDS[path])
        for r in renamed:
            assert r.old not in visible, f"fcd {' '.join(path)} still shows {r.old}"
            assert r.new is None or r.new in visible, f"fcd {' '.join(path)} has no {r.new}"
            assert r.split == (r.new is not None and visible[r.new].multiple), r


# -- the old spellings -------------------------------------------------------------------------------------------
def test_an_old_spelling_still_works_and_says_once_what_to_use():
    new = runner.invoke(app, ["privacy", "plan", "--trajectories", "2048", "--dp-epsilon", "8", "--dp-delta", "1e-5",
                              "--json"])
    old = runner.invoke(app, ["privacy", "plan", "--n-site", "2048", "--epsilon=8", "--delta", "1e-5", "--json"])
    assert new.exit_code == old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(new.stdout)
    assert new.stderr == ""
    assert old.stderr.splitlines() == [
        "note: --n-site is deprecated; use --trajectories",
        "note: --epsilon is deprecated; use --dp-epsilon",
        "note: --delta is deprecated; use --dp-delta",
    ]


def test_an_old_comma_list_becomes_the_repeated_option():
    res = runner.invoke(app, ["ablate", "--preset", "tiny", "--variants", "nope,dss,worse", "--json"])
    assert res.exit_code == 2
    env = json.loads(res.stdout)
    assert env["error_code"] == "USAGE" and "['nope', 'worse']" in env["message"]  # dss was read as a variant
    assert res.stderr.strip() == "note: --variants is deprecated; use --variant once per value"


def test_the_value_of_another_option_is_never_rewritten():
    """``--out --datasets`` names a folder called ``--datasets``: only an option in option position is renamed."""
    params = COMMANDS[("reproduce",)].params
    notes: list[str] = []
    args = rewrite(("reproduce",), ["--out", "--datasets", "--datasets=a,b", "--methods", "x", "--", "--methods"],
                   params, notes.append)
    assert args == ["--out", "--datasets", "--dataset", "a", "--dataset", "b", "--method", "x", "--", "--methods"]
    assert len(notes) == 2


def test_a_command_without_renamed_options_parses_its_words_as_given():
    assert rewrite(("run",), ["--seed", "1", "--n-sites", "3"], COMMANDS[("run",)].params) == [
        "--seed", "1", "--n-sites", "3"]  # click refuses --n-sites for fcd run: it never had it


# -- repeated options ----------------------------------------------------------------------------------------------
def test_repeated_options_are_each_read():
    res = runner.invoke(app, ["reproduce", "--out", "never", "--preset", "tiny", "--dataset", "dkt-synth",
                              "--dataset", "mnist", "--method", "fed_causaldiff", "--method", "gpt", "--json"])
    assert res.exit_code == 2, res.output
    env = json.loads(res.stdout)
    assert "['mnist', 'gpt']" in env["message"], env  # dkt-synth and fed_causaldiff were read and accepted


def test_fcd_train_runs_the_centralised_reference_without_a_flag():
    res = runner.invoke(app, ["train", "--preset", "tiny", "--sites", "4", "--epochs", "1", "--samples", "1",
                              "--method", "naive", "--method", "gformula", "--json"])
    assert res.exit_code == 0, res.output
    env = json.loads(res.stdout.strip().splitlines()[-1])
    assert env["status"] == "ok" and list(env["data"]["runs"][0]["methods"]) == ["naive", "gformula"]
    assert "centralised reference" in env["message"]


def test_fcd_train_help_says_it_is_the_centralised_reference():
    res = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "centralised reference" in res.output and "--centralised" not in res.output
    assert "--method" in res.output and "--methods" not in res.output


def test_the_old_centralised_flag_is_accepted_and_does_nothing():
    res = runner.invoke(app, ["train", "--centralised", "--preset", "tiny", "--method", "nope", "--json"])
    assert res.exit_code == 2 and "unknown method" in json.loads(res.stdout)["message"]
    assert res.stderr.startswith("note: --centralised is deprecated; leave it out")


# -- --set KEY=VALUE -------------------------------------------------------------------------------------------------
def test_set_sets_nested_keys_in_the_resolved_config():
    res = runner.invoke(app, ["config", "show", "--preset", "tiny", "--set", "model.hidden=32",
                              "--set", "federation.eval_every=2", "--set", 'evaluation.policies=["never", "always"]',
                              "--set", "evaluation.quick_max_rows=null", "--set", "data.dataset=tumour",
                              "--set", "secagg.deadlines.train=30", "--json"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.stdout)["data"]["config"]
    assert cfg["model"]["hidden"] == 32 and cfg["federation"]["eval_every"] == 2
    assert cfg["evaluation"]["policies"] == ["never", "always"] and cfg["evaluation"]["quick_max_rows"] is None
    assert cfg["data"]["dataset"] == "tumour" and cfg["secagg"]["deadlines"]["train"] == 30
    assert cfg["model"]["mlp_hidden"] == 16  # the rest of the preset stays


def test_set_comes_after_the_preset_and_the_file_and_before_the_named_options(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text(resolve_config(RunOptions(preset="tiny", seed=5)).to_toml())
    cfg = resolve_config(RunOptions(config_file=file, settings=["seed=6", "federation.rounds=9", "model.hidden=8"],
                                    rounds=3))
    assert cfg.seed == 6 and cfg.model.hidden == 8  # over the file's
    assert cfg.federation.rounds == 3  # the named option wins
    cfg = resolve_config(RunOptions(preset="tiny", settings=["model.hidden=8", "model.hidden=12"]))
    assert cfg.model.hidden == 12  # the last of a key set twice


def test_set_of_the_run_folder_is_the_run_folder(tmp_path):
    assert resolve_config(RunOptions(settings=[f"out={tmp_path / 'r'}"])).out == str(tmp_path / "r")
    assert resolve_config(RunOptions(settings=["out=x"], out=tmp_path / "o")).out == str(tmp_path / "o")


def test_set_of_the_number_of_sites_moves_the_sites_per_round_as_sites_does():
    assert resolve_config(RunOptions(settings=["data.n_sites=6"])).federation.clients_per_round == \
        resolve_config(RunOptions(sites=6)).federation.clients_per_round == 4  # the secure minimum, above N/2


@pytest.mark.parametrize("setting, named", [
    ("model.hiden=32", ["model.hiden", "model.hidden"]),
    ("federation.evalevery=2", ["federation.evalevery", "federation.eval_every"]),
    ("model=3", ["model", "section"]),
    ("model.hidden", ["KEY=VALUE"]),
])
def test_set_refuses_an_unknown_key_naming_it_and_the_closest(setting, named, tmp_path):
    res = runner.invoke(app, ["run", "--preset", "tiny", "--set", setting, "--out", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 2, res.output
    env = json.loads(res.stdout)
    assert env["error_code"] == "BAD_INPUT" and all(word in env["message"] for word in named), env["message"]
    assert not (tmp_path / "r").exists()  # refused before any work


@pytest.mark.parametrize("setting, key", [("model.hidden=abc", "model.hidden"), ("federation.rounds=0",
                                          "federation.rounds"), ("federation.sync=half", "federation.sync")])
def test_set_refuses_a_bad_value_naming_the_key(setting, key, tmp_path):
    out = ["--out", str(tmp_path / "r")]
    for command in (["run", *out], ["deploy", *out], ["train"], ["ablate", *out]):
        res = runner.invoke(app, [*command, "--preset", "tiny", "--set", setting])
        assert res.exit_code == 2, (command, res.output)
        assert key in res.stderr and "Traceback" not in res.output, res.stderr
        assert not (tmp_path / "r").exists()


def test_set_values_are_json_then_toml_then_text():
    assert [parse_value(v) for v in ("32", "0.5", "true", "null", '["a"]', "'x'", "{a = 1}", "tumour", "")] == [
        32, 0.5, True, None, ["a"], "x", {"a": 1}, "tumour", ""]
    assert settings_overrides(["model.hidden=32", "seed = 4"]) == {"model": {"hidden": 32}, "seed": 4}
    with pytest.raises(ConfigError, match="did you mean model.hidden"):
        settings_overrides(["model.hiden=1"])

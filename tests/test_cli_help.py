"""One command line: read from ``--help`` of every command (Typer's own help, as a user sees it).

* a table of one's own is named the same way everywhere: ``--spec SPEC --table TABLE``;
* a short flag means the same thing in every command that has it;
* every command where randomness enters takes ``--seed``;
* every ``fcd …`` invocation in the README names a command that exists and options that command has.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from fcd_secure.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
ROOT_CMD = get_command(app)

#: commands where randomness enters, and so take --seed (a split, an initialisation, sampling, training, rollouts)
SEEDED = {("run",), ("deploy",), ("train",), ("ablate",), ("reproduce",), ("data", "describe"), ("server", "run")}
#: commands with randomness that is not theirs to seed, and why
NOT_SEEDED = {
    ("whatif",): "its rollouts use the seed recorded in the run folder: the same question gives the same numbers",
    ("consortium", "init"): "keys come from the OS CSPRNG, never from a seed",
    ("site", "init"): "keys come from the OS CSPRNG, never from a seed",
}
#: commands that read a user's own table (they take --spec and --table); consortium init takes a spec only
TABLE_READERS = {("run",), ("deploy",), ("data", "validate"), ("data", "describe"), ("site", "init")}


def _commands(cmd: click.Command = ROOT_CMD, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    if isinstance(cmd, click.Group):
        out = {}
        for name, sub in cmd.commands.items():
            out.update(_commands(sub, path + (name,)))
        return out
    return {path: cmd}


COMMANDS = _commands()


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


def _options(path: tuple[str, ...]) -> set[str]:
    """The option names ``--help`` shows for ``path`` (long and short)."""
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", _help(path)))


def test_there_are_commands_to_check():
    assert len(COMMANDS) >= 25


@pytest.mark.parametrize("path", sorted(TABLE_READERS))
def test_a_table_of_ones_own_is_spec_and_table_everywhere(path):
    opts = _options(path)
    assert {"--spec", "--table"} <= opts, f"fcd {' '.join(path)} lacks --spec/--table"
    assert "SPEC TABLE" not in _help(path)


def test_every_command_with_spec_reads_a_table_or_is_named_as_spec_only():
    with_spec = {p for p in COMMANDS if "--spec" in _options(p)}
    assert with_spec - TABLE_READERS == {("consortium", "init")}


def test_the_old_two_value_spec_is_refused_naming_the_new_form(tmp_path):
    spec, table = tmp_path / "s.toml", tmp_path / "t.csv"
    spec.write_text("")
    table.write_text("")
    for argv in (["run", "--spec", str(spec), str(table)], ["data", "validate", "--spec", str(spec), str(table)],
                 ["data", "describe", "--spec", str(spec), str(table)]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert "--table" in res.output, res.output


def test_a_short_flag_means_one_thing_in_every_command():
    meaning: dict[str, set[str]] = {}
    for path, cmd in COMMANDS.items():
        for param in cmd.params:
            shorts = [o for o in param.opts + param.secondary_opts if re.fullmatch(r"-[a-zA-Z]", o)]
            longs = [o for o in param.opts if o.startswith("--")]
            for s in shorts:
                meaning.setdefault(s, set()).add(longs[0] if longs else param.name)
    clashes = {s: m for s, m in meaning.items() if len(m) > 1}
    assert not clashes, clashes


@pytest.mark.parametrize("path", sorted(SEEDED))
def test_every_command_where_randomness_enters_takes_a_seed(path):
    assert "--seed" in _options(path), f"fcd {' '.join(path)} has no --seed"


def test_the_seed_table_covers_every_command_that_has_a_seed():
    seeded = {p for p in COMMANDS if "--seed" in _options(p)}
    assert seeded == SEEDED
    assert not (set(NOT_SEEDED) & SEEDED)


def _readme_invocations() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split(";"):
                words = part.split("#")[0].split()
                if words and words[0] in ("fcd", ".venv/bin/fcd"):
                    out.append(words[1:])
    return out


def test_every_readme_invocation_names_a_command_and_its_options():
    calls = _readme_invocations()
    assert len(calls) >= 15
    problems = []
    for words in calls:
        path: tuple[str, ...] = ()
        for w in words:
            if (*path, w) in COMMANDS or any(p[: len(path) + 1] == (*path, w) for p in COMMANDS):
                path = (*path, w)
            else:
                break
        if path not in COMMANDS:
            problems.append(f"no command: fcd {' '.join(words)}")
            continue
        opts = _options(path)
        for w in words:
            flag = w.strip("[]").split("=")[0]
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in opts:
                problems.append(f"fcd {' '.join(path)} has no option {flag}")
    assert not problems, problems

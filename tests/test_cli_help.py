"""One command line: read from ``--help`` of every command (Typer's own help, as a user sees it).

* a table of one's own is named the same way everywhere: ``--spec SPEC --table TABLE``;
* a short flag means the same thing in every command that has it;
* every command where randomness enters takes ``--seed``, and the value reaches the computation (the others are
  listed, with why, in ``NOT_SEEDED``);
* every ``fcd …`` invocation in the README (bash blocks and inline code) names a command that exists and options
  that command has.
"""

from __future__ import annotations

import inspect

import re
from pathlib import Path

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from fcd_secure.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
ROOT_CMD = get_command(app)

#: commands where randomness enters, and so take --seed (a split, an initialisation, sampling, training, rollouts);
#: test_the_seed_reaches_the_computation checks that each one's --seed gets where it is used
SEEDED = {("run",), ("deploy",), ("train",), ("ablate",), ("reproduce",), ("data", "describe"), ("data", "export"),
          ("server", "run")}
#: every other command, and why it takes no seed (test_every_command_is_in_the_seed_table keeps the two complete):
#:
#: =========================  ============================================================================================
#: command                    why no --seed
#: =========================  ============================================================================================
#: whatif                     rollouts use the seed recorded in the run folder (the sites rebuild their split from it;
#:                            common random numbers across policies): the same question gives the same numbers
#: consortium init            makes keys and certificates: the OS CSPRNG, never a seed
#: site init                  checks the table (no split) and makes keys: the OS CSPRNG, never a seed
#: data validate              reads and encodes one table, no split
#: config show                prints a config (its `seed` key included); nothing is drawn
#: privacy report / plan      reads ledgers / computes σ deterministically
#: privacy acknowledge-reset  records an operator's reason
#: audit verify/fingerprints  reads ledgers, checks signatures
#: report                     reads a run folder (summary, ledgers), writes one HTML file
#: consortium add-site        verifies a request and signs a bundle
#: site join/preflight/...    verify, check, write a unit, start or stop processes
#: server start/stop/status   start, stop or look at processes
#: =========================  ============================================================================================
NOT_SEEDED = {
    ("whatif",): "its rollouts use the seed recorded in the run folder: the same question gives the same numbers",
    ("consortium", "init"): "keys come from the OS CSPRNG, never from a seed",
    ("site", "init"): "keys come from the OS CSPRNG, never from a seed",
    ("data", "validate"): "reads and encodes one table; no split",
    ("config", "show"): "prints a config; nothing is drawn",
    ("privacy", "report"): "reads ledgers",
    ("privacy", "plan"): "computes sigma deterministically",
    ("privacy", "acknowledge-reset"): "records a reason",
    ("audit", "verify"): "reads ledgers, checks signatures",
    ("audit", "collect"): "copies the sites' current evidence files; nothing is drawn",
    ("audit", "fingerprints"): "reads ledgers",
    ("report",): "reads a run folder, writes one HTML file",
    ("select",): "reads finished run folders, trains and samples nothing",
    ("consortium", "add-site"): "verifies a request, signs a bundle (keys: OS CSPRNG)",
    ("site", "join"): "verifies a bundle",
    ("site", "preflight"): "checks readiness",
    ("site", "service"): "writes a systemd unit",
    ("site", "start"): "starts processes",
    ("site", "stop"): "stops processes",
    ("site", "migrate"): "re-keys privacy ledgers with a fresh random secret; no training or sampling",
    ("site", "status"): "looks at processes",
    ("server", "start"): "starts the SuperLink",
    ("server", "stop"): "stops processes",
    ("server", "status"): "looks at processes",
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


@pytest.mark.parametrize("path", [("run",), ("whatif",)], ids=" ".join)
def test_the_policy_help_names_every_shipped_policy(path):
    """``--policy`` takes a shipped policy by name; its help lists them, and a new file in ``policies/`` is named."""
    from fcd_secure.data.policy import policy_dir  # noqa: PLC0415

    words = set(re.findall(r"[\w-]+", _help(path)))
    missing = sorted(f.stem for f in policy_dir().glob("*.toml") if f.stem not in words)
    assert not missing, f"fcd {' '.join(path)} --help does not name the shipped {missing}"


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
                 ["data", "describe", "--spec", str(spec), str(table)], ["deploy", "--spec", str(spec), str(table)],
                 ["data", "validate", str(table), "--spec", str(spec)]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert "--table" in res.output, res.output


def test_one_without_the_other_is_refused():
    for argv, missing in ((["data", "validate"], "--spec and --table are missing"),
                          (["data", "validate", "--spec", "s.toml"], "--table is missing"),
                          (["run", "--table", "t.csv"], "--spec is missing")):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert missing in res.output, res.output


def test_a_repeated_table_is_refused_not_cut_to_its_last(tmp_path):
    """`--table a.csv --table b.csv` once kept b.csv alone (click's rule for a repeated option): a run then stopped with
    "names 1 sites ... run with --no-secure-aggregation", advice to drop a protection for a mistake in the command."""
    spec = tmp_path / "s.toml"
    spec.write_text("")
    tables = []
    for i in range(2):
        tables += ["--table", str(tmp_path / f"site{i}.csv")]
        (tmp_path / f"site{i}.csv").write_text("")
    for argv in (["run", "--spec", str(spec), *tables], ["data", "validate", "--spec", str(spec), *tables],
                 ["data", "describe", "--spec", str(spec), *tables], ["deploy", "--spec", str(spec), *tables]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert "--table given 2 times" in res.output and "site column" in res.output, res.output


@pytest.mark.parametrize("path", sorted(TABLE_READERS))
def test_the_usage_line_shows_no_hidden_argument(path):
    usage = _help(path).splitlines()[0]
    assert "EXTRA" not in usage and "..." not in usage, usage


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


def test_every_command_is_in_the_seed_table():
    """A new command must be put in SEEDED or NOT_SEEDED (with why): the README's seed sentence stays true."""
    assert set(COMMANDS) == SEEDED | set(NOT_SEEDED), set(COMMANDS) ^ (SEEDED | set(NOT_SEEDED))


class _Stop(Exception):
    """Raised by a stand-in once it has seen the seed: nothing heavy runs."""


def _seed_cases(tmp: Path, monkeypatch) -> tuple[dict, dict[tuple[str, ...], tuple[list[str], str, list[int]]]]:
    """What the stand-ins saw (filled by the call), and per seeded command: its argv with --seed, the key its
    stand-in files the seed under, and the seed(s) it must see.

    Each stand-in replaces the function the command hands its seed to (looked up when the command runs)."""
    seen: dict = {}

    def catch(key, value):
        seen[key] = value
        raise _Stop

    import fcd_secure.cli.run as run_cli
    import fcd_secure.cli.server as server_cli
    import fcd_secure.data.registry as registry
    import fcd_secure.engines.deployment as deployment
    import fcd_secure.experiments.ablation as ablation
    import fcd_secure.experiments.centralised as centralised
    import fcd_secure.experiments.reproduction as reproduction
    import fcd_secure.provisioning.server as provisioning_server

    monkeypatch.setattr(run_cli, "execute_run", lambda cfg, as_json, *engine: catch("run", [cfg.seed]))
    monkeypatch.setattr(deployment, "LocalDeployment", lambda cfg, **kw: catch("deploy", [cfg.seed]))
    monkeypatch.setattr(centralised, "run_centralised_seeds",
                        lambda cfg, seeds, *a, **kw: catch("train", [cfg.seed, *seeds]))
    monkeypatch.setattr(ablation, "run_ablation", lambda base, chosen, seeds, *a, **kw: catch("ablate", list(seeds)))
    monkeypatch.setattr(reproduction, "run_reproduction", lambda p, seeds, *a, **kw: catch("reproduce", list(seeds)))
    real_load = registry.load_federated

    def load_federated(name, **kw):  # `fcd data describe` draws here; a run's preflight loads its data here too
        for command in ("describe", "export"):
            if any(frame.function == command for frame in inspect.stack()):
                catch(command, [kw["seed"]])
        return real_load(name, **kw)

    monkeypatch.setattr(registry, "load_federated", load_federated)
    monkeypatch.setattr(server_cli, "_co", lambda home: object())
    monkeypatch.setattr(server_cli, "_refuse_below_minimum", lambda co, out, **kw: None)
    monkeypatch.setattr(provisioning_server, "submit_run", lambda co, out, **kw: catch("server", [kw["seed"]]))
    tiny = ["--preset", "tiny", "--rounds", "1", "--sites", "4"]
    return seen, {
        ("run",): (["run", *tiny, "--seed", "7", "--out", str(tmp / "run")], "run", [7]),
        ("deploy",): (["deploy", *tiny, "--seed", "7", "--out", str(tmp / "deploy")], "deploy", [7]),
        ("train",): (["train", *tiny, "--seed", "7", "--seeds", "2"], "train", [7, 7, 8]),
        ("ablate",): (["ablate", *tiny, "--seed", "7", "--seeds", "2", "--out", str(tmp / "ablate")], "ablate", [7, 8]),
        ("reproduce",): (["reproduce", "--preset", "tiny", "--seed", "7", "--seeds", "2", "--dataset", "dkt-synth",
                          "--out", str(tmp / "repro")], "reproduce", [7, 8]),
        ("data", "describe"): (["data", "describe", "--dataset", "dkt-synth", "--seed", "7"], "describe", [7]),
        ("data", "export"): (["data", "export", "--out", str(tmp / "tables"), "--seed", "7"], "export", [7]),
        ("server", "run"): (["server", "run", "--home", str(tmp), "--out", str(tmp / "srv"), "--seed", "7"], "server",
                            [7]),
    }


@pytest.mark.parametrize("path", sorted(SEEDED))
def test_the_seed_reaches_the_computation(path, tmp_path, monkeypatch):
    """--seed is not decoration: the value given arrives where the command draws (the run config's seed, or the
    list of seeds an experiment runs)."""
    seen, cases = _seed_cases(tmp_path, monkeypatch)
    assert set(cases) == SEEDED
    argv, key, expected = cases[path]
    monkeypatch.setenv("FCD_DEBUG", "1")  # the stand-in's _Stop propagates instead of becoming an INTERNAL error
    res = CliRunner().invoke(app, argv)
    assert isinstance(res.exception, _Stop), (argv, res.output, res.exception)
    assert seen[key] == expected, (argv, seen)


def _readme_invocations(doc: str = "README.md") -> list[list[str]]:
    """Every ``fcd …`` in the README (or ``doc``): the lines of its bash blocks, and its inline code spans
    (`fcd run --gamma 0`)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split(";"):
                words = part.split("#")[0].split()
                if words and words[0] in ("fcd", ".venv/bin/fcd"):
                    out.append(words[1:])
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        words = span.split()
        if words and words[0] in ("fcd", ".venv/bin/fcd"):
            out.append(words[1:])
    return out


#: options of `fcd` itself (before any command)
ROOT_OPTIONS = {"--help", "--version", "--install-completion", "--show-completion"}


@pytest.mark.parametrize("doc, least", [("README.md", 40), ("docs/hospital.md", 20)])
def test_every_readme_invocation_names_a_command_and_its_options(doc, least):
    """The README's commands, and the hospital path's (an operator follows docs/hospital.md to the letter)."""
    calls = _readme_invocations(doc)
    assert len(calls) >= least
    problems = []
    for words in calls:
        if words and (words[0] in ROOT_OPTIONS or words[0].startswith("<")):  # fcd --version; fcd <command> --help
            assert words[0] in ROOT_OPTIONS or words[0] == "<command>", words
            continue
        path: tuple[str, ...] = ()
        for w in words:
            if (*path, w) in COMMANDS or any(p[: len(path) + 1] == (*path, w) for p in COMMANDS):
                path = (*path, w)
            else:
                break
        if path not in COMMANDS:
            problems.append(f"no command: fcd {' '.join(words)}")
            continue
        # the docs show the current spellings only (an old one still works, with a note: fcd_secure.cli.renamed)
        opts = _options(path)
        for w in words:
            flag = w.strip("[]").split("=")[0]
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in opts:
                problems.append(f"fcd {' '.join(path)} has no option {flag}")
    assert not problems, problems

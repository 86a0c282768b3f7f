"""The command line's contract: one JSON envelope for every ``--json`` command (errors included) on stdout, human
errors on stderr, ``--version``, shell completion, help that never cuts an option name at 80 columns, and a start-up
that imports nothing heavy (``benchmarks/cli_startup.py`` prints the times)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

import fcd_secure
from fcd_secure.cli.envelope import ENVELOPE_KEYS, ERROR_CODES, CliError
from fcd_secure.cli.main import app

PROJECT_ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out += _commands(cmd, prefix + (name,))
        else:
            out.append((prefix + (name,), cmd))
    return out


ROOT = typer.main.get_command(app)
COMMANDS = _commands(ROOT)
JSON_COMMANDS = [path for path, cmd in COMMANDS if any("--json" in p.opts for p in cmd.params)]


def _envelope(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, f"stdout must be exactly one JSON document, got {text!r}"
    env = json.loads(lines[0])
    assert set(env) == ENVELOPE_KEYS, env
    assert env["schema_version"] == "1"
    return env


def test_every_command_with_json_is_known_here():
    # new --json commands join the envelope test below automatically; this pins the ones of this package
    assert {("run",), ("train",), ("ablate",), ("deploy",), ("data", "validate"), ("data", "describe"),
            ("privacy", "report"), ("privacy", "plan"), ("audit", "verify"), ("audit", "fingerprints"),
            ("config", "show")} <= set(JSON_COMMANDS)


@pytest.mark.parametrize("path", JSON_COMMANDS, ids=[" ".join(p) for p in JSON_COMMANDS])
def test_every_json_command_answers_a_usage_error_with_the_envelope(path):
    """A malformed command line (an unknown option) is a JSON envelope too, on stdout, exit 2; nothing on stderr."""
    res = runner.invoke(app, [*path, "--json", "--no-such-option"])
    assert res.exit_code == 2, res.output
    env = _envelope(res.stdout)
    assert (env["status"], env["exit_code"], env["error_code"]) == ("error", 2, "USAGE")
    assert "--no-such-option" in env["message"] and env["data"] is None
    assert res.stderr == ""


def test_command_errors_are_envelopes_with_their_exit_code(tmp_path):
    cases = [
        (["privacy", "report", str(tmp_path / "missing"), "--json"], 2, "BAD_INPUT"),
        (["privacy", "plan", "--trajectories", "10", "--accountant", "gdp", "--json"], 2, "BAD_INPUT"),
        (["audit", "fingerprints", str(tmp_path / "missing"), "--json"], 2, "USAGE"),
        (["data", "describe", "-d", "mnist", "--json"], 2, "USAGE"),
        (["run", "--dataset", "mnist", "--json", "--out", str(tmp_path / "r")], 2, "BAD_INPUT"),
        (["train", "--preset", "tiny", "--method", "nope", "--json"], 2, "USAGE"),
        (["config", "show", "--preset", "huge", "--json"], 2, "BAD_INPUT"),
    ]
    for args, code, error_code in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == code, (args, res.output)
        env = _envelope(res.stdout)
        assert (env["status"], env["exit_code"], env["error_code"]) == ("error", code, error_code), args
        assert env["message"] and res.stderr == ""
    assert not (tmp_path / "r").exists()


def test_success_envelopes(tmp_path):
    res = runner.invoke(app, ["privacy", "plan", "--trajectories", "2048", "--rounds", "20", "--accountant", "rdp",
                              "--json"])
    env = _envelope(res.stdout)
    assert (env["status"], env["exit_code"], env["error_code"]) == ("ok", 0, None)
    assert env["data"]["steps"] == 640 and "σ =" in env["message"]
    res = runner.invoke(app, ["config", "show", "--preset", "tiny", "--json"])
    env = _envelope(res.stdout)
    assert env["data"]["config"]["federation"]["rounds"] == 2
    assert {r["key"] for r in env["data"]["keys"]} >= {"federation.rounds", "dp.epsilon", "secagg.min_sites"}


def test_human_errors_go_to_stderr_without_a_traceback(tmp_path):
    res = runner.invoke(app, ["privacy", "report", str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert res.stdout == "" and "error:" in res.stderr and "missing" in res.stderr
    assert "Traceback" not in res.output


def test_a_bug_is_one_line_unless_fcd_debug(monkeypatch):
    sub = typer.Typer()

    @sub.command()
    def boom() -> None:
        raise ZeroDivisionError("x")

    from fcd_secure.cli.app import new_app

    bug = new_app()
    bug.add_typer(sub, name="t")
    res = runner.invoke(bug, ["t", "boom"])
    assert res.exit_code == 1 and res.stdout == "" and "ZeroDivisionError: x" in res.stderr
    assert "Traceback" not in res.output
    monkeypatch.setenv("FCD_DEBUG", "1")
    res = runner.invoke(bug, ["t", "boom"])
    assert isinstance(res.exception, ZeroDivisionError)


def test_error_codes_are_a_closed_list():
    with pytest.raises(ValueError, match="unknown error code"):
        CliError("x", "SOMETHING_NEW")
    assert ERROR_CODES["DP_BUDGET_EXHAUSTED"] == 5 and ERROR_CODES["BAD_INPUT"] == 2


def test_version_and_completion():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"fcd {fcd_secure.__version__}"
    res = runner.invoke(app, ["--help"])
    assert "--install-completion" in res.stdout and "--show-completion" in res.stdout


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_at_80_columns_prints_every_option_name_whole(path):
    res = runner.invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    cmd = dict(COMMANDS)[path]
    for param in cmd.params:
        for opt in param.opts + param.secondary_opts:
            if opt.startswith("--"):
                assert opt in res.stdout, f"{' '.join(path)}: option {opt} not printed whole"
    assert "…" not in res.stdout and "\\[" not in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


def test_importing_the_command_line_loads_nothing_heavy():
    """`fcd --help` must not import torch, Flower, pandas, matplotlib, Opacus or Ray (each costs seconds)."""
    code = (
        "import sys, fcd_secure.cli.main as m\n"
        "heavy = sorted(n for n in ('torch', 'flwr', 'pandas', 'matplotlib', 'opacus', 'ray', 'numpy', 'pydantic')"
        " if n in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"imported at start-up: {proc.stdout.strip()}"

"""``fcd`` as the tests run it in their own process: the command group the console script runs
(``fcd_secure.cli.main.app``) through typer's ``CliRunner``, answered in the shape of a ``subprocess.run``. A plain
module beside the tests (``from cli_cases import fcd_here``), not part of the package.

A fresh interpreter costs each command ~7 s of CPU importing torch, Flower and the package (measured on the shared
2-core machine: ``python -c "import fcd_secure.cli.main, torch, flwr, fcd_secure.engines.inprocess"``, 6.7-7.1 s
user), which the test's process has paid already. ``CliRunner`` runs the same ``FcdGroup.main`` with its exit codes
and its separate stdout and stderr (click 8.2+), at the terminal width given. Tests whose point is a real process
(pipes, signals, the installed entry point) keep ``subprocess``.
"""

from __future__ import annotations

import subprocess

__all__ = ["fcd_here"]


def fcd_here(*args, columns: int = 100, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``fcd *args`` in this process at a ``columns``-wide terminal, with ``env`` set in ``os.environ`` for the
    command's duration only: its exit code, stdout and stderr."""
    from typer.testing import CliRunner

    from fcd_secure.cli.main import app

    res = CliRunner(env={"COLUMNS": str(columns), **(env or {})}).invoke(app, [*map(str, args)])
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)

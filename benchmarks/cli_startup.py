"""Start-up time of the command line: ``fcd <command> --help`` for every command, and how long a run with bad input
takes to fail (exit 2, before any engine starts).

Each figure is the median of ``--repeat`` fresh processes: wall-clock seconds and the CPU seconds of the process
(user + system; on a loaded machine the wall clock waits for a core, the CPU time does not). Nothing is asserted
(tests assert that start-up imports nothing heavy: tests/test_cli_envelope.py).

    .venv/bin/python benchmarks/cli_startup.py [--repeat 3] [--fcd PATH] [--no-bad-input]
    .venv/bin/python benchmarks/cli_startup.py --quick   # one process per figure: fcd, fcd run, one bad input

``--quick`` checks the script end to end in a few seconds: the same measurements, one process each, of the root
command and ``fcd run`` (the commands are still read from the help, so a renamed ``run`` fails it) and of the first
bad-input case.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[float, float, int]:
    """``(wall s, CPU s, exit code)`` of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def subcommands(fcd: str, path: list[str], env: dict[str, str]) -> list[list[str]]:
    """The command paths one level below ``path``, read from its help (its ``Commands:`` section)."""
    text = subprocess.run([fcd, *path, "--help"], capture_output=True, text=True, env=env).stdout
    if "Commands:" not in text:
        return []
    return [path + [line.split()[0]] for line in text.split("Commands:", 1)[1].splitlines()
            if line.startswith("  ") and not line.startswith("   ") and line.split()]


def top_level(fcd: str, env: dict[str, str]) -> list[list[str]]:
    """The root and its commands."""
    return [[], *subcommands(fcd, [], env)]


def commands(fcd: str, env: dict[str, str]) -> list[list[str]]:
    """Every command path of ``fcd``, read from its own help (``Commands:`` sections)."""
    out: list[list[str]] = [[]]
    todo: list[list[str]] = [[]]
    while todo:
        found = subcommands(fcd, todo.pop(), env)
        out += found
        todo += found
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fcd", default=str(Path(sys.executable).with_name("fcd")))
    ap.add_argument("--no-bad-input", action="store_true", help="skip the failing-run measurement")
    ap.add_argument("--quick", action="store_true", help="one process each: fcd, fcd run and one bad input")
    args = ap.parse_args()
    if args.quick:
        args.repeat = 1
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    print(f"fcd: {args.fcd} (PYTHONPATH={ROOT}), median of {args.repeat}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':<38} {'wall s':>8} {'CPU s':>8}")
    paths = [p for p in top_level(args.fcd, env) if p in ([], ["run"])] if args.quick else commands(args.fcd, env)
    for path in paths:
        runs = [timed([args.fcd, *path, "--help"], env) for _ in range(args.repeat)]
        label = "fcd " + " ".join(path) + " --help"
        print(f"{label:<38} {statistics.median(r[0] for r in runs):>8.2f} {statistics.median(r[1] for r in runs):>8.2f}")
    if args.no_bad_input:
        return
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "run --dataset mnist": ["run", "--dataset", "mnist", "--out", f"{tmp}/r"],
            "run --data-dir missing": ["run", "--dataset", "diabetes130", "--data-dir", f"{tmp}/none", "--out", f"{tmp}/r"],
            "run --out <a file>": ["run", "--preset", "tiny", "--out", __file__],
        }
        print(f"\n{'bad-input run (exit 2)':<38} {'wall s':>8} {'CPU s':>8} {'exit':>5}")
        for label, argv in list(cases.items())[:1 if args.quick else None]:
            runs = [timed([args.fcd, *argv], env, cwd=tmp) for _ in range(args.repeat)]
            print(f"{label:<38} {statistics.median(r[0] for r in runs):>8.2f} "
                  f"{statistics.median(r[1] for r in runs):>8.2f} {runs[0][2]:>5}")


if __name__ == "__main__":
    main()

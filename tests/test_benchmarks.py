"""Every script in ``benchmarks/`` runs: its quick form finishes and prints its figures (their names, never their
values: a benchmark reports, it does not assert; benchmarks/README.md).

Each quick form is the script's own command line (``QUICK`` below, the same as in benchmarks/README.md), run as a
user runs it. Scripts that start no Flower engine run inside this test's interpreter (``runpy``, as ``__main__``
with that command line), which has torch and Flower imported already: a fresh interpreter would spend ~3 s of CPU
importing them again for each script. Scripts that start Flower (Ray's simulation engine, or SuperLink and SuperNode
processes) run in a fresh interpreter each (Flower's simulation engine starts once per process), one after another
with the other tests that start Flower processes (``conftest.FLOWER_PROCESSES``).
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import FLOWER_PROCESSES

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
#: scripts whose quick form another test file runs (benchmarks/README.md names it)
TESTED_ELSEWHERE = {"omop.py"}


@dataclass(frozen=True)
class Quick:
    """One benchmark's quick form: the command line after ``python benchmarks/<script>``, the figure names its
    output must show, and whether it starts Flower (then it runs in its own interpreter)."""

    script: str
    args: tuple[str, ...]
    figures: tuple[str, ...]
    flower: bool = False

    @property
    def id(self) -> str:
        return " ".join((self.script, *self.args))


QUICK = (
    Quick("cli_startup.py", ("--quick",),
          ("fcd  --help", "fcd run --help", "bad-input run (exit 2)", "wall s", "CPU s")),
    Quick("dp.py", ("--quick",),
          ("step time", "DP / non-DP (same objective)", "utility vs ε", "PEHE at ε = 8 / non-DP")),
    Quick("dr_learner.py", ("--quick",), ("corr DR", "skill DR", "PEHE DR", "mean over seeds")),
    Quick("dr_tails.py", ("--quick",), ("DR + unseen-mass bounds", "median width DR", "mean weight per step")),
    Quick("heldout_check.py", ("--quick",), ("true gain", "shown", "worse", "s.d. gain", "mean SE")),
    Quick("incremental.py", ("--quick",), ("ESS of the weight products", "doubly robust value")),
    Quick("onestep_noise.py", ("--quick",), ("interval covers", "mean error", "mean SE", "|error| ≤ 0.05")),
    Quick("sampler.py", ("--quick",), ("steps / transition", "rollouts / second", "PEHE")),
    Quick("secagg.py", ("--quick", "--repeats", "1"), ("client s", "server s", "B/param", "faster than Flower")),
    Quick("selection.py", ("--quick",),
          ("ρ D1 (≥0.8)", "ρ fit", "rule pick", "true one-step err", "cost: selection sums")),
    Quick("targeted.py", ("--quick",), ("one-step effect at every decision step", "AIPW", "self-norm.", "naive")),
    Quick("propensity.py", ("--quick",), ("AIPW P̂", "IPW P̂", "g-formula", "pick P̂", "true Γ", "toy world")),
    Quick("free_running.py", ("--quick",), ("whole-trajectory fidelity", "value err", "NC gap", "mean over seeds")),
    Quick("tumour.py", ("--quick",), ("normalised RMSE (%)", "PEHE", "|ATE err|", "truth-free selection")),
    Quick("federation.py", ("--superlink-requests", "--quick"), ("SuperLink ms CPU / request", "scoped / Flower")),
    # the in-process engine (no Ray start): these run in the test's interpreter, beside the other tests
    Quick("federation.py", ("--quick",), ("seconds / round", "MB uplink (measured)", "in-process engine")),
    Quick("federation.py", ("--deployment", "--quick"),
          ("warm executors", "in-process s / round", "deployment s / round", "deployment / reference"), flower=True),
    Quick("fidelity.py", ("--quick",), ("Effect fidelity", "PEHE", "|ATE err|", "corr(τ̂, τ)", "Targets")),
    Quick("intervals.py", ("--quick",), ("interval coverage", "coverage of the truth", "whole test sets")),
    # its federated runs on the in-process engine (the script's default): no Flower start, so not in the serial group
    Quick("horizon.py", ("--quick",), ("whole-trajectory values", "natural course", "sequential DR")),
)


def _scripts() -> set[str]:
    return {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}


def test_every_benchmark_has_a_quick_form_here_and_a_line_in_the_readme():
    assert _scripts() - TESTED_ELSEWHERE == {q.script for q in QUICK}
    readme = (BENCHMARKS / "README.md").read_text()
    for q in QUICK:
        assert f"python benchmarks/{q.id}" in readme, f"benchmarks/README.md does not give the quick form of {q.script}"
    for name in _scripts() | TESTED_ELSEWHERE:
        assert f"`{name}`" in readme, f"benchmarks/README.md has no line for {name}"


def _check_figures(q: Quick, out: str) -> None:
    flat = " ".join(out.split())  # a narrow console wraps a figure's name over lines
    missing = [f for f in q.figures if " ".join(f.split()) not in flat]
    assert not missing, f"{q.id}: finished but printed none of {missing}:\n{out[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("q", [q for q in QUICK if not q.flower], ids=lambda q: q.id)
def test_quick_form_runs_and_prints_its_figures(q: Quick, monkeypatch, capsys, one_torch_thread):
    monkeypatch.setenv("COLUMNS", "200")  # rich tables keep their column names on one line
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their helpers (_machine, targeted) by name
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / q.script), *q.args])
    try:
        runpy.run_path(str(BENCHMARKS / q.script), run_name="__main__")
    except SystemExit as exc:  # typer and argparse scripts end with sys.exit
        assert exc.code in (0, None), f"{q.id} exited {exc.code}:\n{capsys.readouterr().err[-3000:]}"
    finally:  # the scripts' sibling modules (imported by bare name) are not left for the next test
        siblings = [n for n, m in sys.modules.items() if Path(getattr(m, "__file__", None) or "/").parent == BENCHMARKS]
        for name in siblings:
            del sys.modules[name]
    _check_figures(q, capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.xdist_group(FLOWER_PROCESSES)
@pytest.mark.parametrize("q", [
    # the Deployment Engine's form starts SuperLink and SuperNode processes: marked as every such test is
    pytest.param(q, id=q.id, marks=[pytest.mark.deployment] if "--deployment" in q.args else [])
    for q in QUICK if q.flower])
def test_quick_form_that_starts_flower_runs_and_prints_its_figures(q: Quick, tmp_path):
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    # its own session: on a timeout the whole group goes, the SuperLink and SuperNodes it started included
    proc = subprocess.Popen([sys.executable, str(BENCHMARKS / q.script), *q.args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the script's finally stops the processes it started
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: what it started goes with it
            out, err = proc.communicate()
        pytest.fail(f"{q.id} ran past 600 s:\n{err[-3000:]}")
    assert proc.returncode == 0, f"{q.id} exited {proc.returncode}:\n{err[-3000:]}"
    _check_figures(q, out)

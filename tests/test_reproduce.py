"""`fcd reproduce --preset tiny`: every table and figure with the expected rows and columns, a report beside the
paper's numbers, cached cells (a second run resumes; a removed cell is recomputed alone), and bad input refused."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.experiments.reproduction import get_preset
from fcd_secure.experiments.reproduction.report import verdict
from fcd_secure.experiments.reproduction.selection import select_lr

DATASETS = ("dkt-synth", "obd")
METHODS = ("fed_causaldiff", "rcgan")
POLICIES = {"never", "always", "early_on", "late_on"}
#: the tests that read the reproduced folder (a module-scoped fixture) run on one xdist worker
shared_run = pytest.mark.xdist_group("reproduce-tiny")
ARGS = ["reproduce", "--preset", "tiny", *(a for d in DATASETS for a in ("--dataset", d)),
        *(a for m in METHODS for a in ("--method", m)), "--json"]


def _run(out, *extra):
    r = CliRunner().invoke(app, ARGS + ["--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    env = json.loads(r.stdout)  # one JSON envelope on stdout (cli/envelope.py), the progress bar on stderr
    assert env["status"] == "ok" and env["exit_code"] == 0 and env["error_code"] is None, env
    return env["data"]


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    from conftest import real_data

    real_data()  # OBD is a real dataset: without the data folder there is nothing to reproduce it from (a skip)
    out = tmp_path_factory.mktemp("repro")
    return out, _run(out)


@shared_run
def test_tables_have_the_expected_rows_and_columns(reproduced):
    out, res = reproduced
    assert res["cells"] == 6 and res["cached"] == 0  # 2 datasets × 2 methods + 2 ablations
    t3 = pd.read_csv(out / "table3.csv")
    assert list(t3["method"]) == ["fed_causaldiff", "full_sync", "no_ldis", "rcgan"]  # the paper's row order
    for col in ("pehe_mean", "pehe_sd", "ate_mean", "value_mean", "auc_mean", "uplink_mb_mean", "paper_pehe",
                "paper_ate", "paper_value"):
        assert col in t3.columns, col
    assert t3["pehe_mean"].notna().all() and t3["value_mean"].notna().all()
    assert (t3["ate_mean"] <= t3["pehe_mean"] + 1e-12).all()  # Cauchy–Schwarz
    assert t3.set_index("method").loc["fed_causaldiff", "paper_pehe"] == "0.057±0.010"
    t4 = pd.read_csv(out / "table4.csv")
    assert set(zip(t4["dataset"], t4["method"])) == {(d, m) for d in DATASETS for m in (*METHODS, "trtr")}
    assert {"auc_mean", "auc_sd", "rmse_mean", "rmse_sd", "paper_auc", "paper_rmse"} <= set(t4.columns)
    assert t4["rmse_mean"].notna().all()
    f2 = pd.read_csv(out / "fig2.csv")
    assert set(f2["policy"]) == POLICIES
    assert {(d, m) for d, m in zip(f2["dataset"], f2["method"])} >= {(d, m) for d in DATASETS for m in METHODS}
    assert {"dr_mean", "pdr_mean", "pdr_full_mean", "simulated_mean", "true_mean"} <= set(f2.columns)
    assert f2["simulated_mean"].notna().all() and f2["dr_mean"].notna().all()  # step-wise DR on every dataset
    assert f2[f2["dataset"] == "dkt-synth"]["true_mean"].notna().all()
    f3 = pd.read_csv(out / "fig3.csv")
    assert set(f3["dataset"]) == {"dkt-synth"} and set(f3["round"]) == {1, 2}
    assert set(f3["method"]) == {"fed_causaldiff", "full_sync", "no_ldis", "rcgan"}
    f4 = pd.read_csv(out / "fig4.csv")
    assert set(f4["dataset"]) == set(DATASETS) and {"cum_uplink_mb", "factual_auc_mean"} <= set(f4.columns)
    assert (f4.groupby(["dataset", "method"])["cum_uplink_mb"].diff().dropna() > 0).all()  # cumulative
    assert set(pd.read_csv(out / "params.csv")["method"]) == {*METHODS, "full_sync", "no_ldis"}
    assert set(pd.read_csv(out / "selection.csv")["method"]) == set(METHODS)
    for stem in ("table3", "table4", "fig2", "fig3", "fig4"):
        assert json.loads((out / f"{stem}.json").read_text())["rows"], stem


@shared_run
def test_figures_and_report(reproduced):
    out, res = reproduced
    want = {"fig2_dr.png", "fig2_simulated.png", "fig3_pehe_vs_rounds.png", "fig4_auc_vs_uplink_dkt-synth.png",
            "fig4_auc_vs_uplink_obd.png"}
    assert set(res["figures"]) == want
    for name in want:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    text = (out / "REPORT.md").read_text()
    for heading in ("## Table III", "## Table IV", "## Fig. 2", "## Figs. 3 and 4", "## Why we differ",
                    "## Hyperparameters"):
        assert heading in text, heading
    assert "0.057±0.010" in text and "RCGAN" in text and "load average" in text


@shared_run
def test_a_second_run_resumes_from_the_cache(reproduced):
    """Unchanged arguments: every cell from the cache. One cell removed: only it runs again and gives the same
    numbers. The removed cell is the cheapest one (the cells record ``cpu_s``: dkt-synth/rcgan 4.6 s, obd/rcgan
    6.2 s, fed_causaldiff 11-16 s), and the runs stay in this process: with ``--workers 2`` a single missing cell
    still ran here (one job never goes to the pool), and the pool only spawned two interpreters to read the cached
    learning-rate selections, 36 of the resumed run's 43 s."""
    out, _ = reproduced
    again = _run(out)
    assert again["cached"] == again["cells"] == 6
    cell = out / "cells" / "dkt-synth" / "rcgan-seed0.json"
    before = json.loads(cell.read_text())
    cell.unlink()
    third = _run(out)
    assert third["cached"] == 5  # only the removed cell ran again, with the same numbers
    after = json.loads(cell.read_text())
    assert after["tstr"] == before["tstr"] and after["final"]["factual_auc"] == before["final"]["factual_auc"]


def test_bad_input_exits_2(tmp_path):
    runner = CliRunner()
    for extra in (["--preset", "huge"], ["--dataset", "mnist"], ["--method", "gpt"]):
        r = runner.invoke(app, ["reproduce", "--out", str(tmp_path)] + extra)
        assert r.exit_code == 2, (extra, r.output)
        r = runner.invoke(app, ["reproduce", "--out", str(tmp_path), "--json"] + extra)
        env = json.loads(r.stdout)
        assert r.exit_code == 2 and env["status"] == "error" and env["error_code"] == "USAGE", (extra, env)
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_selection_takes_the_smallest_d1_among_the_candidates_within_one_se_never_the_fit_and_caches(tmp_path,
                                                                                                     one_torch_thread):
    preset = get_preset("tiny").model_copy(update={"lr_grid": (1e-4, 2e-2), "selection_epochs": 2})
    s = select_lr(preset, "dkt-synth", "crn", 0, tmp_path)
    cands = {c["lr"]: c for c in s["candidates"]}
    assert set(cands) == {1e-4, 2e-2} and all(math.isfinite(c["val_logloss"]) and c["d1_se"] > 0 for c in cands.values())
    best = min(cands.values(), key=lambda c: c["d1"])
    within = [c for c in cands.values() if c["d1"] <= best["d1"] + best["d1_se"]]
    assert s["lr"] in {c["lr"] for c in within} and s["lr"] == best["lr"] and s["selected_on"].startswith("d1-")
    # each candidate is scored as a site scores its validation rows in a round (queries.selection)
    assert all(c["score"]["d1"] == c["d1"] and c["score"]["validation_fit"] == c["val_logloss"] for c in cands.values())
    assert select_lr(preset, "dkt-synth", "crn", 0, tmp_path) == s  # cached


def test_without_propensities_the_learning_rate_is_chosen_by_the_fit_and_says_so():
    from fcd_secure.experiments.reproduction.selection import choose_lr
    from fcd_secure.queries.selection import RoundScore

    def cand(lr: float, fit: float, d1: float = math.nan, se: float = math.nan) -> dict:
        scored = math.isfinite(d1)
        row = RoundScore(round=0, d1=d1, se=se, mean=d1, n=100 if scored else 0, clipped_share=0.0, fit=fit,
                         sites_scoring=int(scored), sites=1).as_row()
        return {"lr": lr, "val_logloss": fit, "d1": row["d1"], "d1_se": row["d1_se"], "score": row}

    lr, how = choose_lr([cand(1e-3, 0.7), cand(3e-3, 0.6)])
    assert lr == 3e-3 and "unavailable" in how
    lr, how = choose_lr([cand(1e-3, 0.7, 0.01, 0.01), cand(3e-3, 0.6, 0.2, 0.01)])
    assert lr == 1e-3  # the better fit is the confounded one: D1 rules it out
    assert how.startswith("d1-paired-one-se") and "learning rate #1" in how


def test_verdict():
    assert verdict(0.06, 0.01, (0.057, 0.01)) == "agrees"
    assert verdict(0.20, 0.0, (0.057, 0.01)) == "higher by 0.143"
    assert verdict(0.01, 0.0, (0.065, None)) == "lower by 0.055"
    assert verdict(None, None, (0.1, None)) == "—" and verdict(0.1, 0.0, None) == "—"
    assert verdict(0.1, 0.0, (math.nan, None)) == "—"


def test_the_worker_pool_returns_every_result_in_job_order_from_other_processes():
    """``--workers N`` (``reproduction.run._run_all``): the jobs run in spawned worker processes (not this one), and
    their results come back in job order whichever finishes first; the progress line names the first jobs."""
    import os

    from fcd_secure.experiments.reproduction.run import _run_all

    jobs = [(os.getpid, (), f"job{i}") for i in range(3)]
    started: list[str] = []
    pids = list(_run_all(jobs, 2, started.append))
    assert len(pids) == 3 and os.getpid() not in pids
    assert started == ["job0, job1"]
    assert list(_run_all([(divmod, (7, 2), "a"), (divmod, (9, 4), "b")], 1, started.append)) == [(3, 1), (2, 1)]

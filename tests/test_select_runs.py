"""`fcd select`: outcome-model variants chosen by the truth-free criterion (issue 29 item 2, ``queries.selection.
choose_run``): two real runs on the same data and seed (the diffusion transition and the deterministic one), the
rule applied across their selected rounds, runs on different data refused, no D1 anywhere reported as such."""

from __future__ import annotations

import json
import math
import os

import pytest
from typer.testing import CliRunner

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from conftest import SMALL_SCORED, SMALL_SCORED_RUN  # noqa: E402

from fcd_secure.cli.main import app  # noqa: E402
from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.queries.selection import RoundScore, choose_run  # noqa: E402

runner = CliRunner()
#: the two runs are one module fixture, the diffusion one the session's small scored run (conftest): the tests that
#: read them run on one xdist worker (``--dist loadgroup``)
shared = pytest.mark.xdist_group(SMALL_SCORED_RUN)
#: small DKT-Synth on 4 even sites (every site has ≥ 20 validation students: each round is scored), 2 rounds
SCORED = SMALL_SCORED


def _row(d1, se, fit, sites_scoring=4):
    return RoundScore(round=0, d1=d1, se=se, mean=-d1, n=400, clipped_share=0.0, fit=fit, sites=4,
                      sites_scoring=sites_scoring).as_row()


def test_choose_run_never_lets_the_fit_decide_among_the_runs_within_one_se_and_says_when_it_cannot_choose():
    got = choose_run([_row(0.30, 0.02, 0.50), _row(0.05, 0.02, 0.70), _row(0.06, 0.02, 0.65)])
    # the best fit (run 0) is the most confounded; runs 1 and 2 are within one SE, run 2 fits better, but the fit
    # never decides (issue 42 item 5): the smaller D1, run 1
    assert got["run"] == 1 and got["candidates"] == [1, 2] and "run(s)" in got["reason"]
    none = choose_run([_row(math.nan, math.nan, 0.5, 0), _row(math.nan, math.nan, 0.4, 0)])
    assert none["run"] is None and none["rule"] == "unavailable" and "cannot choose" in none["reason"]


def test_choose_run_leaves_out_a_run_whose_chosen_round_failed_its_natural_course_where_another_passed():
    failed, passed = ({**_row(d1, 0.005, 0.6), "nc_gap": gap, "nc_passes": ok}
                      for d1, gap, ok in ((0.01, 0.04, False), (0.03, 0.02, True)))
    got = choose_run([failed, passed])
    # run #1 has the smaller D1 (0.02 apart, four SEs), but its natural course failed: run #2 answers
    assert got["run"] == 1 and "natural course failed: run #1" in got["reason"]
    # rows written before the flag (no "nc_passes"): the rule as before, the smaller D1
    assert choose_run([{k: v for k, v in r.items() if k != "nc_passes"} for r in (failed, passed)])["run"] == 0


def test_choose_run_never_reads_a_runs_own_paired_sums_as_a_pair_with_another_run():
    # each run's selected round keeps paired sums against the earlier rounds of its own run: run #2's pair keyed 1
    # is its own round 1, not run #1, so across runs the window is the marginal SE (0.02: both runs are candidates,
    # the smaller natural-course gap decides)
    own = RoundScore(round=0, d1=0.06, se=0.02, mean=-0.06, n=400, clipped_share=0.0, fit=0.6, sites=4,
                     sites_scoring=4, pairs={1: (400, 0.4, 0.0004001)}, nc=0.01).as_row()
    first = RoundScore(round=0, d1=0.05, se=0.02, mean=-0.05, n=400, clipped_share=0.0, fit=0.7, sites=4,
                       sites_scoring=4, nc=0.03).as_row()
    got = choose_run([first, own])
    assert got["candidates"] == [0, 1] and "marginal SE" in got["reason"] and got["run"] == 1


@pytest.fixture(scope="module")
def two_variants(tmp_path_factory, small_scored_run):
    """Fed-CausalDiff with the diffusion transition (the default: the session's small scored run) and with the
    deterministic one, same data and seed."""
    from fcd_secure.engines.inprocess import run_inprocess

    assert small_scored_run.cfg.model.transition == "diffusion"
    root = tmp_path_factory.mktemp("variants")
    cfg = build_config("tiny", {**SCORED, "model": {"transition": "deterministic"},
                                "state_dir": str(root / "deterministic" / "state"),
                                "out": str(root / "deterministic" / "run")})
    run_inprocess(cfg)
    return [small_scored_run.out, root / "deterministic" / "run"]


@shared
@pytest.mark.slow
def test_fcd_select_chooses_between_the_diffusion_and_the_deterministic_transition_by_the_rule(two_variants):
    res = runner.invoke(app, ["select", *map(str, two_variants), "--json"])
    assert res.exit_code == 0, res.stdout
    data = json.loads(res.stdout)["data"]
    runs = data["runs"]
    assert [r["model"].split(", ")[1] for r in runs] == ["transition diffusion", "transition deterministic"]
    # recomputed from each run's own files: the selected round's D1, then the one-SE rule and the fit
    rows = []
    for d in two_variants:
        summary = json.loads((d / "summary.json").read_text())
        rnd = summary["selection"]["round"]
        rows.append(next(r for r in json.loads((d / "rounds.json").read_text()) if r["round"] == rnd)["selection"])
    assert all(r["d1"] is not None and r["d1_se"] > 0 for r in rows)
    best = min(range(2), key=lambda i: rows[i]["d1"])
    cands = [i for i in range(2) if rows[i]["d1"] <= rows[best]["d1"] + rows[best]["d1_se"]]
    pick = min(cands, key=lambda i: rows[i]["validation_fit"])
    assert data["chosen"] == str(two_variants[pick]) and [r["chosen"] for r in runs] == [i == pick for i in range(2)]
    table = runner.invoke(app, ["select", *map(str, two_variants)])
    assert table.exit_code == 0 and "not by fit" in table.stdout and "chosen:" in table.stdout


@shared
@pytest.mark.slow
def test_fcd_select_refuses_runs_on_different_data_or_a_single_run(two_variants, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(two_variants[1], other, ignore=shutil.ignore_patterns("state"))
    cfg_text = (other / "config.toml").read_text()
    (other / "config.toml").write_text(cfg_text.replace("seed = 0", "seed = 1", 1))
    res = runner.invoke(app, ["select", str(two_variants[0]), str(other), "--json"])
    assert res.exit_code == 2 and "seed" in json.loads(res.stdout)["message"]
    one = runner.invoke(app, ["select", str(two_variants[0]), "--json"])
    assert one.exit_code == 2 and "at least two" in json.loads(one.stdout)["message"]
    missing = runner.invoke(app, ["select", str(two_variants[0]), str(tmp_path / "nope"), "--json"])
    assert missing.exit_code == 2 and "not a finished run folder" in json.loads(missing.stdout)["message"]

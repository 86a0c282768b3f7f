"""Never an unlabelled simulated table (issue 43 item 5): where no site logs or estimates propensities, every number is
the simulator's, and every output path says so — the run's tables, ``summary.json``, ``fcd whatif`` in print and in
JSON, the HTML report — and the commands exit 8 (``MODEL_ONLY_ANSWER``).

One real tiny run (on the in-process engine: the claim is the labels, not the engine) on a user's table of three
hospitals without a propensity column, with the sites told not to estimate theirs (``evaluation.propensities =
"logged"``), then ``fcd whatif`` of it twice (on the run's engine) and ``fcd report``: all four through the same
command group in the test's process (``cli_cases.fcd_here``, typer's ``CliRunner``: the same ``FcdGroup.main``, its
exit codes and its stdout/stderr), so that none pays a fresh interpreter's start (``test_cli_run.py`` runs the entry
point in a fresh process).
"""

from __future__ import annotations

import json

import pytest
from cli_cases import fcd_here
from conftest import GOOD_SPEC, make_long_table

shared = pytest.mark.xdist_group("model-only")
UNLABELLED = "What happens under each policy"


def _only_extrapolation(answer: dict) -> None:
    """The JSON of a model-only answer labels the simulator's numbers as extrapolation, unranked, and claims no answer
    checked by weighting (``queries.kinds``)."""
    from fcd_secure.queries.kinds import CHECKED, EXTRAPOLATION, G_COMPUTATION

    kinds = answer["kinds"]
    assert kinds[EXTRAPOLATION]["ranked"] is False and CHECKED not in kinds, kinds
    # a natural course that matches the logs does not make a model-only answer g-computation: nothing weighted checks
    # it, and the printed table says extrapolation (the JSON must not say more)
    assert G_COMPUTATION not in kinds, kinds


@pytest.fixture(scope="module")
def model_only(tmp_path_factory):
    base = tmp_path_factory.mktemp("model-only")
    df = make_long_table(n_entities=300, seed=2)
    df["hospital"] = df["pid"].map({e: f"h{i % 3}" for i, e in enumerate(df["pid"].unique())})
    (base / "spec.toml").write_text(GOOD_SPEC.replace('propensity = "p"\n', ""))
    df.drop(columns=["p"]).to_csv(base / "table.csv", index=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)  # the run names its spec and table relative to where it was started, as a user's would
        run = fcd_here("run", "--preset", "tiny", "--rounds", "1", "--spec", "spec.toml", "--table", "table.csv",
                       "--no-secure-aggregation", "--set", "evaluation.propensities=logged", "--engine", "inprocess",
                       "--out", "run")
        asked = fcd_here("whatif", "run", "-p", "never", "-p", "always", "--json")
        printed = fcd_here("whatif", "run", "-p", "never", "-p", "always")
        report = fcd_here("report", "run", "--json")
    return base, run, asked, printed, report


@shared
def test_the_run_prints_the_simulator_under_the_extrapolation_label_and_exits_8(model_only):
    base, run, _, _, _ = model_only
    assert run.returncode == 8, run.stderr[-3000:]
    said = " ".join(run.stdout.split())
    assert "Extrapolation (spec)" in said and "model only: no site logged or could estimate propensities" in said
    assert UNLABELLED not in said and "What the logs identify" not in said
    assert "propensities: none at 3 of 3 sites" in said
    assert "MODEL_ONLY" not in run.stdout and "the simulator's alone" in " ".join(run.stderr.split())
    summary = json.loads((base / "run" / "summary.json").read_text())
    assert summary["model_only"] is True and summary["propensities"]["source"] == "none"
    # issue 43 item 6: the answer names the sites without propensities and why (their hello, not the sums)
    assert sorted(summary["propensities"]["missing_at"]) == sorted(summary["site_ids"])
    assert all("evaluation.propensities = 'logged'" in why for why in summary["propensities"]["missing_at"].values())
    assert f"without propensities: {summary['site_ids'][0]} (none: its table logs none" in said
    assert summary["policies"] and not summary.get("one_step_effect")
    _only_extrapolation(summary)


@shared
def test_whatif_flags_a_model_only_answer_in_json_and_in_print(model_only):
    base, _, asked, printed, _ = model_only
    env = json.loads(asked.stdout)
    assert asked.returncode == 8 and env["error_code"] == "MODEL_ONLY_ANSWER" and env["exit_code"] == 8
    assert env["data"]["model_only"] is True and env["data"]["policies"]
    _only_extrapolation(env["data"])
    assert printed.returncode == 8
    said = " ".join(printed.stdout.split())
    assert "Extrapolation (spec)" in said and "model only" in said and UNLABELLED not in said
    # the answers fcd whatif keeps in the run folder (runs/<run>/whatif/<query>.json) say so too
    kept = sorted((base / "run" / "whatif").glob("*.json"))
    assert kept
    for path in kept:
        doc = json.loads(path.read_text())
        assert doc["model_only"] is True, path
        _only_extrapolation(doc)


@shared
def test_the_report_labels_it_too(model_only):
    base, _, _, _, report = model_only
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    html = (base / "run" / "report.html").read_text()
    assert "Extrapolation" in html and UNLABELLED not in html and "propensities: none at 3 of 3 sites" in html


def test_a_natural_course_that_passes_makes_g_computation_only_where_the_sites_have_propensities():
    """``queries.kinds``: the simulator's numbers are g-computation where the natural course matches the logs *and*
    the sites have propensities; without them (a model-only answer, issue 43 item 5) they stay extrapolation, and
    the line says the natural course matched."""
    from fcd_secure.queries.kinds import EXTRAPOLATION, G_COMPUTATION, AnswerKinds

    def kinds(source):
        answer = {"policies": {"always": {}}, "natural_course": {"passes": True, "mean_abs_gap": 0.01},
                  "propensities": {"source": source} if source else {}}
        AnswerKinds().merge({}, None, answer)
        return answer["kinds"]

    assert G_COMPUTATION in kinds("estimated") and G_COMPUTATION in kinds("logged")
    alone = kinds(None)
    assert G_COMPUTATION not in alone and "no propensities" in alone[EXTRAPOLATION]["checked_by"]

"""Issue 32, items 2, 3 and 9: every answer says which sites and how many entities it covers, names a site that
declined or failed (stdout and JSON, exit 7 when an answer covers fewer sites than the run), and no answer about a
policy the logs never follow comes out as a point with a narrow interval; `fcd report` writes one self-contained
HTML report of the run (verdict, sites, bytes, ε and its plot, answers), opened in headless Chromium when present
(driven over CDP, tests/browser.py).

One real tiny run (on the in-process engine: the claims are the answers' coverage, not the engine) on a user's table
of four hospitals: one has too few patients for its evaluation cohort (it declines), and no hospital ever logs the
action ``metformin``. Then ``fcd whatif`` asks the same run again. Both through the same command group in the test's
process (``cli_cases.fcd_here``, typer's ``CliRunner``: exit codes and streams as the shell sees them, without a fresh
interpreter's start; ``test_cli_run.py`` runs the entry point in a fresh process). The tests that read them form one
xdist group.
"""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_cases import fcd_here
from conftest import GOOD_SPEC, make_long_table
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.queries.evaluation import coverage

shared = pytest.mark.xdist_group("answer-coverage")
METFORMIN = 'name = "metformin_only"\ndescription = "metformin at every step"\n[rule]\nkind = "static"\naction = "metformin"\n'


def write_table(folder: Path) -> tuple[Path, Path]:
    """Three hospitals of ~63 patients and one of 12 (its test split stays below the cohort floor of 20); the
    action metformin is never logged (replaced by insulin)."""
    df = make_long_table(n_entities=200, seed=1)
    ents = list(df["pid"].unique())
    df["hospital"] = df["pid"].map({e: (f"h{i % 3}" if i >= 12 else "h3") for i, e in enumerate(ents)})
    df["drug"] = df["drug"].replace({"metformin": "insulin"})
    spec, table = folder / "spec.toml", folder / "table.csv"
    spec.write_text(GOOD_SPEC)
    df.to_csv(table, index=False)
    return spec, table


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    base = tmp_path_factory.mktemp("coverage")
    spec, table = write_table(base)
    (base / "metformin.toml").write_text(METFORMIN)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)  # the run names its policy file relative to where it was started, as a user's would
        run = fcd_here("run", "--preset", "tiny", "--rounds", "1", "--spec", spec, "--table", table,
                       "--no-secure-aggregation", "--dp-epsilon", "8", "-p", "never", "-p", "metformin.toml",
                       "--engine", "inprocess", "--out", "run", columns=80)
    what = fcd_here("whatif", base / "run", "-p", "never", "-p", base / "metformin.toml", "--json", columns=80)
    return base, run, what


@shared
def test_a_run_that_leaves_a_site_out_names_it_and_exits_7(asked):
    base, run, _ = asked
    assert run.returncode == 7, run.stderr[-3000:]
    said = " ".join(run.stdout.split())
    assert "WARNING: the answers cover 3 of 4 sites" in said and "site-03 (declined" in said
    assert max(len(line) for line in run.stdout.splitlines()) <= 80
    summary = json.loads((base / "run" / "summary.json").read_text())
    cov = summary["coverage"]
    assert cov["sites_covered"] == ["site-00", "site-01", "site-02"] and cov["declined"] == ["site-03"]
    assert cov["complete"] is False and cov["n_entities"] == summary["policies"]["never"]["n"] > 0
    assert all(d["n_sites"] == 3 for d in summary["policies"].values())
    assert "error: the answers cover 3 of 4 sites" in run.stderr


@shared
def test_a_policy_no_logged_step_follows_is_not_identified(asked):
    base, run, _ = asked
    d = json.loads((base / "run" / "summary.json").read_text())["policies"]["metformin_only"]
    assert d["supported"] is False and d["support"] == 0.0 and d["value_sim"] is None
    assert d["n_sites_without_support"] == 3 and d["sites_without_support"] == ["site-00", "site-01", "site-02"]
    # what is left is the bounds over the outcome's range, never a point with a narrow interval
    assert (d["interval"]["low"], d["interval"]["high"]) == (0.0, 1.0)
    assert d["doubly_robust"]["estimate"] is None and d["effect"]["estimate"] is None
    assert all(r["value"] is None for k, r in d.items() if isinstance(r, dict) and "ess" in r)
    assert "value_sim" in d["model_only"]  # the model's extrapolation is kept, labelled as the model's only
    # the simulator's table: "not identified" with the bounds only (the identified answers' table says so too)
    assert any("metformin_only" in x and "not identified" in x and "0.000–1.000" in x for x in run.stdout.splitlines())
    assert "metformin_only: not identified" in " ".join(run.stdout.split())


@shared
def test_whatif_says_what_it_covers_too(asked):
    _, _, what = asked
    assert what.returncode == 7, what.stderr[-3000:]
    env = json.loads(what.stdout)
    assert (env["exit_code"], env["error_code"]) == (7, "INCOMPLETE_ANSWER")
    assert "site-03" in env["message"] and env["data"]["coverage"]["declined"] == ["site-03"]
    assert env["data"]["policies"]["metformin_only"]["supported"] is False


def test_data_validate_reports_actions_a_site_never_logs(tmp_path):
    spec, table = write_table(tmp_path)
    res = CliRunner().invoke(app, ["data", "validate", "--spec", str(spec), "--table", str(table), "--json"])
    assert res.exit_code == 0, res.output
    absent = json.loads(res.stdout)["data"]["actions_absent"]
    assert absent["all sites"] == ["metformin"] and "metformin" in absent["h3"]
    res = CliRunner().invoke(app, ["data", "validate", "--spec", str(spec), "--table", str(table)])
    assert "no site logs metformin" in res.stdout


def test_coverage_names_every_site_left_out():
    full = coverage(["a", "b", "c"], [], [], 90)
    assert full["complete"] and full["warning"] is None and full["n_entities"] == 90
    part = coverage(["a", "b", "c"], ["c"], ["b"], 40)
    assert part["sites_covered"] == ["a"] and not part["complete"]
    assert "cover 1 of 3 sites (40 test entities)" in part["warning"]
    assert "b (declined" in part["warning"] and "c (failed" in part["warning"]
    none = coverage(["a", "b", "c", "d"], [], ["d"], None, aborted=True)
    assert none["sites_covered"] == [] and none["n_entities"] is None and "a (no sum revealed)" in none["warning"]


# -- issue 32, item 9: the run's one HTML report (the same run: DP, a declined site, a policy without support) ------
class _Doc(HTMLParser):
    """Every tag with its attributes, and the text, of an HTML document."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


@shared
def test_the_html_report_is_one_self_contained_file_with_verdict_sites_epsilon_and_answers(asked):
    base, _, _ = asked
    res = CliRunner().invoke(app, ["report", str(base / "run"), "--json"])
    assert res.exit_code == 0, res.output
    facts = json.loads(res.stdout)["data"]
    assert facts["verdict"] == "unverified" and facts["dp"] and facts["plot"]
    html = Path(facts["file"]).read_text()
    doc = _Doc()
    doc.feed(html)
    text = " ".join(" ".join(doc.text).split())
    tags = doc.tags
    # self-contained: no script, nothing fetched; the plot is an embedded PNG
    assert not any(t == "script" for t, _ in tags)
    assert not any(v and ("http:" in v or "https:" in v or v.startswith("//")) for _, a in tags
                   for k, v in a.items() if k in ("src", "href"))
    img = next(a for t, a in tags if t == "img" and a.get("id") == "epsilon-plot")
    assert base64.b64decode(img["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(t == "meta" and a.get("name") == "viewport" for t, a in tags)  # readable on a phone
    # the verdict and what could not be checked (no pins given)
    assert "UNVERIFIED" in text and "No key was pinned" in text and "HTTP framing" in text
    # who took part, what left each site, ε against the cap, the answers with their support
    assert all(f"site-0{i}" in text for i in range(4)) and "no: declined" in text
    assert "Θc parameters" in text and "aggregate sums and counts" in text and "server received" in text
    assert "ε spent" in text and "consortium (max over sites)" in text
    assert "metformin_only not identified" in text and "the answers cover 3 of 4 sites" in text
    # the headline is what the logs identify, apart from the simulator's extrapolation, and the selected round
    assert "What the logs identify" in text and "Extrapolation: the simulator" in text and "Answers from round" in text


@shared
def test_the_html_report_with_the_operators_pins_says_compliant(asked, tmp_path):
    base, _, _ = asked
    pins = tmp_path / "pins.toml"
    assert CliRunner().invoke(app, ["audit", "fingerprints", str(base / "run"), "--out", str(pins)]).exit_code == 0
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(base / "run"), "--pins", str(pins), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert '<div class="verdict compliant" id="verdict"><strong>COMPLIANT</strong>' in out.read_text()
    bad = CliRunner().invoke(app, ["report", str(tmp_path), "--json"])
    assert bad.exit_code == 2 and "no summary.json" in json.loads(bad.stdout)["message"]


@shared
def test_the_html_report_renders_its_verdict_and_plot_in_headless_chromium(asked, tmp_path):
    """A real browser (Debian's ``chromium``, driven over CDP: ``tests/browser.py``) loads the report with the
    network off. The page runs no script of its own (its CSP forbids it), so the test reads the DOM from DevTools:
    the verdict's text and the decoded plot's size; at a phone's width the page does not scroll sideways."""
    from browser import Browser, chromium

    if chromium() is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it where apt can); "
                    "the plain HTML test still runs")
    base, _, _ = asked
    res = CliRunner().invoke(app, ["report", str(base / "run"), "--out", str(tmp_path / "report.html")])
    assert res.exit_code == 0, res.output
    with Browser(chromium()) as b:
        b.open(tmp_path / "report.html", 1280)
        assert b.js("document.getElementById('verdict').innerText").startswith("UNVERIFIED")
        w, h = b.js("[document.getElementById('epsilon-plot').naturalWidth, "
                    "document.getElementById('epsilon-plot').naturalHeight]")
        assert w > 300 and h > 200  # the embedded PNG decoded: the plot is drawn
        b.open(tmp_path / "report.html", 412, 2400)  # a phone's width: one column, nothing off-screen
        assert b.js("innerWidth") == 412 and b.js("document.documentElement.scrollWidth") <= 412

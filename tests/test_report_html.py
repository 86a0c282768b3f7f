"""`fcd report`: a run folder cannot script the auditor's page (issue 44 finding 4, docs/threats.md P47), a deployed
DP run's report states ε per site from the sites' signed privacy records (issue 45 item 1, P48), and the page reads
on a phone with the privacy officer's summary first (issue 45 item 8, P49).

The run folders are built from real parts: ``tests/golden/summary.json`` (a real run's answers), site ledgers written
by the real egress gate with real Ed25519 keys, and DP ledgers of the real privacy engine (``DPSite``). The page is
opened in a real headless Chromium (``tests/browser.py``, CDP over a pipe); without Chromium those tests skip with
the reason (``.ci/run`` installs it where apt can).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from browser import Browser, chromium
from fcd_secure.cli.main import app
from fcd_secure.experiments.report_html import ReportError, build_report_html, read_summary

GOLDEN = Path(__file__).parent / "golden" / "summary.json"
#: runs if it is ever parsed as markup: a broken image's handler and an inline script, both rewriting the title
PAYLOAD = "<img src=x onerror=\"document.title='PWNED'\"><script>document.title='PWNED'</script>"
needs_browser = pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (Debian: apt-get install "
                                   "chromium; .ci/run installs it where apt can)")


def _leaves(d, path=()):
    """Every (path, value) leaf of a JSON document (dict keys and list indices), in document order."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _leaves(v, (*path, i))
    else:
        yield path, d


def _set(d, path, value):
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


def _folder(tmp: Path, summary: dict) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "summary.json").write_text(json.dumps(summary))
    return tmp


def _injected(golden: dict, tmp: Path) -> tuple[str, list[tuple], list[tuple]]:
    """The payload in every field of summary.json, one field at a time: the fields the report refuses (wrong type)
    and those it accepts; then one report with the payload in every accepted field at once."""
    refused, accepted = [], []
    for path, value in _leaves(golden):
        if value is None or isinstance(value, bool):
            continue
        s = copy.deepcopy(golden)
        _set(s, path, PAYLOAD if not isinstance(value, str) else value + PAYLOAD)
        try:
            read_summary(_folder(tmp / "one", s) / "summary.json")  # the report's one gate on what it reads
        except ReportError as exc:
            assert ".".join(map(str, path)) in str(exc) or "wrong" in str(exc), exc
            refused.append(path)
        else:
            accepted.append(path)
    every = copy.deepcopy(golden)
    for path in accepted:
        value = dict(_leaves(golden))[path]
        _set(every, path, PAYLOAD if not isinstance(value, str) else value + PAYLOAD)
    # policy names are keys: the payload in a name too
    every["policies"] = {k + PAYLOAD: v for k, v in every["policies"].items()}
    doc, _ = build_report_html(_folder(tmp / "every", every))
    return doc, refused, accepted


@needs_browser
def test_a_script_in_every_summary_field_is_refused_or_inert_in_chromium(tmp_path):
    """P47: the payload in each field of summary.json in turn. A field of the wrong type (a script where a number
    belongs) is refused; a text field is printed as text. With the payload in every accepted field at once, no tag
    of it reaches the page, and Chromium runs none of it: the title is the report's, there is no script element and
    no element with an event handler."""
    golden = json.loads(GOLDEN.read_text())
    doc, refused, accepted = _injected(golden, tmp_path)
    assert ("rounds",) in refused and ("dp", "epsilon_cap") not in accepted and ("pehe",) in refused
    assert len(accepted) > 40  # the text fields: names, reasons, warnings, site ids
    shown = doc.count("&lt;script&gt;")
    assert "<script>" not in doc and "<img src=x" not in doc and shown >= 20  # printed as text, every one
    page = tmp_path / "every.html"
    page.write_text(doc)
    with Browser(chromium()) as b:
        b.open(page, 1280)
        assert b.js("document.title").startswith("fcd run report")
        assert b.js("document.scripts.length") == 0
        assert b.js("[...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => "
                    "a.name.startsWith('on'))).length") == 0
        in_body = doc[doc.index("<body>"):].count("&lt;script&gt;")
        assert b.js("document.body.innerText.split(\"<script>document.title='PWNED'\").length - 1") == in_body


def test_a_summary_of_the_wrong_types_is_refused_with_exit_2(tmp_path):
    """P47: a script where a number belongs (``rounds``, the ε cap, a metric) never reaches the page: exit 2 and the
    field named."""
    for field, value in (("rounds", PAYLOAD), ("dp", {"enabled": True, "epsilon_cap": PAYLOAD}), ("pehe", PAYLOAD),
                         ("site_ids", [PAYLOAD, 3])):
        s = json.loads(GOLDEN.read_text())
        s[field] = value
        run = _folder(tmp_path / field, s)
        res = CliRunner().invoke(app, ["report", str(run), "--json"])
        env = json.loads(res.stdout)
        assert res.exit_code == 2 and env["exit_code"] == 2, res.output
        assert f"field {field}" in env["message"] and "wrong type" in env["message"], env["message"]
        assert not (run / "report.html").exists()
    (tmp_path / "list" / "summary.json").parent.mkdir()
    (tmp_path / "list" / "summary.json").write_text("[1, 2]")
    assert CliRunner().invoke(app, ["report", str(tmp_path / "list")]).exit_code == 2


@needs_browser
def test_the_pages_content_security_policy_runs_no_script_and_loads_nothing(tmp_path):
    """P47: the CSP is the second wall. A copy of the report with a script and a remote image added by hand (what a
    missed escape would let in) runs nothing in Chromium and fetches nothing; the page's own style still applies."""
    doc, _ = build_report_html(_folder(tmp_path / "run", json.loads(GOLDEN.read_text())))
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src &#x27;none&#x27;; img-src data:;" in doc
    page = tmp_path / "planted.html"
    page.write_text(doc.replace("</main>", "<script>document.title='RAN'</script><img id=remote src="
                                "\"file:///etc/hostname\" onerror=\"document.title='RAN'\"></main>"))
    with Browser(chromium()) as b:
        b.open(page, 1280)
        assert b.js("document.title").startswith("fcd run report")
        assert b.js("document.getElementById('remote').naturalWidth") == 0
        # the stylesheet, allowed by its hash, applied: the verdict box has its left border
        assert b.js("getComputedStyle(document.getElementById('verdict')).borderLeftStyle") == "solid"


# -- P48: a deployed DP run: ε per site from the sites' signed privacy records --------------------------------------
def _deployed_dp_run(tmp_path: Path, with_records=("site-00", "site-01")) -> tuple[Path, dict, list[str]]:
    """A deployed run folder as the evidence collection leaves it: summary.json (DP on, cap 8), and in evidence/
    the site ledgers of the sites in ``with_records`` (real gates whose uploads carry the heads of real DP ledgers),
    the server ledger; the sites' state, with their privacy ledgers, stays outside the run folder. ``site-02`` took
    part but its ledger was not collected."""
    from test_audit_support import Server, Site, close_run

    from fcd_secure.privacy.anchor import read_anchors
    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite
    from fcd_secure.privacy.report import build_report

    homes = tmp_path / "homes"
    server = Server(homes)
    sites, spent = [], {}
    for i, sid in enumerate(with_records):
        site = Site(homes, sid, seed=i)
        state = homes / sid
        site.ctx.privacy_anchors = lambda state=state: read_anchors(state)
        sites.append((site, state))
    for r in (1, 2, 3):
        for i, (site, state) in enumerate(sites):
            dp = DPSite(state, f"{i}" * 64, DPConfig(enabled=True, epsilon=8.0, delta=1e-3, accountant="rdp",
                                                    noise_seed="run_seed"), 60 + 20 * i, planned_rounds=4,
                        local_epochs=1, batch_size=12)
            res = dp.reserve_round(round_id=r)
            dp.ledger.commit(res.seq, res.steps)  # a round that trained: the steps it reserved, all charged
            server.receive(site.send(server.downlink("train", r, 100 + i)), site.site_id)
    close_run([s for s, _ in sites], server, 3, [100 + i for i in range(len(sites))])
    for site, state in sites:
        spent[site.site_id] = build_report(state)["sites"][0]["epsilon_spent"]
    run = tmp_path / "run"
    ev = run / "evidence"
    for site, _ in sites:
        (ev / "sites" / site.site_id).mkdir(parents=True)
        shutil.copy(site.ledger.path, ev / "sites" / site.site_id / "site_ledger.jsonl")
    (ev / "server").mkdir(parents=True)
    shutil.copy(server.ledger.path, ev / "server" / "server_ledger.jsonl")
    s = json.loads(GOLDEN.read_text())
    s["site_ids"] = ["site-00", "site-01", "site-02"]
    s["dp"] = {"enabled": True, "epsilon_cap": 8.0, "epsilon_spent": None, "consortium_epsilon": None,
               "guarantee": "record-level (ε, δ)-DP per site; ε is kept in each site's ledger"}
    (run / "summary.json").write_text(json.dumps(s))
    return run, spent, [s.ledger.fingerprint for s, _ in sites]


def test_a_deployed_dp_runs_report_states_epsilon_per_site_from_the_signed_records(tmp_path):
    """P48: measured, the deployed DP run's report said "This run has no DP guarantee" under "DP-SGD, ε cap 8 per
    site". It now states DP and each site's ε against the cap, as the sites signed it, equal to what each site's own
    ledger gives; a site whose records are absent is "unverified"; the plot is embedded."""
    run, spent, site_fps = _deployed_dp_run(tmp_path)
    doc, facts = build_report_html(run)
    assert "no DP guarantee" not in doc and facts["dp"] and facts["dp_basis"] == "signed records"
    assert facts["dp_unverified"] == ["site-02"] and facts["plot"]
    assert "DP-SGD was on." in doc and "Unverified: no intact signed privacy record of site-02" in doc
    for sid, eps in spent.items():
        assert f'<span class="id">{sid}</span></td><td class="n" data-label="ε spent"><span class="ok">{eps:.3f}' in doc
    assert 0 < min(spent.values()) < max(spent.values()) < 8
    assert "signed, key not pinned" in doc
    pinned, _ = build_report_html(run, site_keys=site_fps)
    assert pinned.count("signed, key pinned") == 2

    # `fcd privacy report` on the same folder: the same figures, from the same records
    res = CliRunner().invoke(app, ["privacy", "report", str(run), "--json", "--no-files"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)["data"]
    assert rep["dp"] is True and rep["basis"] == "signed records" and rep["unverified"] == ["site-02"]
    got = {s["site"]: s["epsilon_spent"] for s in rep["sites"]}
    assert got == {**spent, "site-02": None}
    text = CliRunner().invoke(app, ["privacy", "report", str(run), "--no-files"])
    assert text.exit_code == 0 and "unverified" in text.stdout and "no DP guarantee" not in text.stdout


def test_a_tampered_or_missing_privacy_record_is_unverified_never_no_dp(tmp_path):
    """P48: a site ledger edited after the fact is not read (its ε is not stated: "unverified"); with no site
    ledger collected at all the report still says DP was on and every site unverified."""
    run, spent, _ = _deployed_dp_run(tmp_path)
    led = run / "evidence" / "sites" / "site-01" / "site_ledger.jsonl"
    lines = led.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if '"privacy_anchors"' in line)
    lines[i] = lines[i].replace('"epsilon":', '"epsilon": 0.0001, "was":', 1)
    led.write_text("\n".join(lines) + "\n")
    doc, facts = build_report_html(run)
    assert facts["dp_unverified"] == ["site-01", "site-02"] and "no DP guarantee" not in doc
    shutil.rmtree(run / "evidence" / "sites")
    doc, facts = build_report_html(run)
    assert facts["dp"] and facts["dp_unverified"] == ["site-00", "site-01", "site-02"]
    assert "DP-SGD was on." in doc and "no DP guarantee" not in doc and not facts["plot"]


# -- P49: the phone ---------------------------------------------------------------------------------------------
@needs_browser
@pytest.mark.parametrize("width", [390, 1280])
def test_the_report_fits_a_phone_and_a_desktop_with_the_officers_summary_first(tmp_path, width):
    """P49: measured at 390 px, the "what it carried" column was off-screen and ids broke mid-word, and the page
    opened with raw ledger notes. At 390 and 1280 CSS px in Chromium: no element reaches past the viewport's right
    edge and the page does not scroll sideways; every site id is on one line; the first section after the title is
    the privacy officer's summary (verdict, ε per site against the cap, who took part), before the notes."""
    run, _, _ = _deployed_dp_run(tmp_path)
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    with Browser(chromium()) as b:
        b.open(run / "report.html", width, 2000)
        assert b.js("innerWidth") == width
        assert b.js("document.documentElement.scrollWidth") <= width
        over = b.js("[...document.body.querySelectorAll('*')].filter(e => { const r = e.getBoundingClientRect();"
                    " return r.width > 0 && (r.right > innerWidth + 0.5 || r.left < -0.5); })"
                    ".map(e => e.tagName + '.' + e.className + ':' + e.textContent.slice(0, 30))")
        assert over == [], over
        broken = b.js("[...document.querySelectorAll('.id')].filter(e => e.getClientRects().length > 1)"
                      ".map(e => e.textContent)")
        assert broken == [], broken
        order = b.js("[...document.querySelectorAll('h2')].map(e => e.textContent)")
        assert order[0] == "Summary for the privacy officer" and order.index("What could not be checked") > 0
        assert b.js("['verdict', 'dp-state', 'epsilon-table', 'took-part'].every(i => "
                    "document.getElementById('summary').contains(document.getElementById(i)))")
        carried = b.js("[...document.querySelectorAll('td[data-label=\"what it carried\"]')].map(e => "
                       "e.getBoundingClientRect().right)")
        assert carried and max(carried) <= width

"""One self-contained HTML report of a run, for a privacy officer and an auditor (``fcd report RUN_DIR``).

It gathers in one file what a run folder already holds, each from its one source, the privacy officer's summary
first (the verdict, DP and ε per site against its cap, who took part), then the details:

* **the audit verdict** (:func:`fcd_secure.audit.verify.verify_path`, with the pins the reader gives) and what could
  not be checked: the findings that keep the verdict from "compliant" (keys not pinned, evidence partial) and the
  notes, and what no ledger can show (HTTP framing, TLS, heartbeats);
* **who took part**: the sites of ``summary.json``, the rounds each was sampled for (``rounds.json``) and whether
  its data is in the answers (``coverage``, ``queries.evaluation.coverage``);
* **what left each site**: every upload of the site's own signed ledger, by action, with its payload bytes and what
  it carried (Θc tensors, aggregate sums, protocol and audit fields), and the totals the server received;
* **ε per site against its cap** (:func:`fcd_secure.experiments.privacy_evidence.run_privacy_report`: recomputed
  from each site's ledger where the folder holds it, else from the sites' signed privacy records in the evidence;
  per record: the unit of privacy is one trajectory), with the plot of ε over rounds
  (:func:`fcd_secure.privacy.report.plot_epsilon`) embedded as a base64 PNG;
* **the answers with their support**: the headline metrics, each policy's value and interval, its logged support,
  whether the data identifies it and the sites whose logs never follow it, and the coverage line.

The run folder is written by the server being audited, so nothing in it is trusted as markup: the fields read are
type-checked (:class:`ReportSummary`), every value is escaped where it is placed, and the page's CSP (:data:`CSP`)
forbids every script and every load but the embedded plot (docs/threats.md P47). Self-contained: inline CSS, the
plot as a ``data:`` URI, no script, no font, nothing fetched; readable on a phone (a viewport meta tag, one column,
tables whose rows stack with their cells labelled, identifiers that never break inside).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["CSP", "Html", "ReportError", "ReportSummary", "build_report_html", "write_report_html"]

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from fcd_secure._format import fmt
from fcd_secure.errors import FcdError, first_invalid
from fcd_secure.queries.answers import G_COMPUTATION, EvaluationAnswer
from fcd_secure.queries.policy_answers import NOT_IDENTIFIED, interval_text

#: what no ledger entry can show (the audit's byte definition stops at Flower's serialized content)
NOT_IN_LEDGERS = (
    "HTTP framing, TLS records and heartbeats are outside the ledgers: corroborate the byte counts with network "
    "counters",
    "what a site's operator did outside the federation's messages (copies of the data, other processes)",
)

CSS = """
:root { color-scheme: light dark; --ok: #1b7f3b; --warn: #a66300; --bad: #b3261e; --muted: #666; }
* { box-sizing: border-box; }
body { font: 16px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; padding: 0 0 3em;
       overflow-wrap: break-word; }
main { max-width: 60em; margin: 0 auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin: 1em 0 .3em; overflow-wrap: break-word; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #8884; }
.meta, .muted { color: var(--muted); font-size: .9em; }
.officer { border: 1px solid #8885; border-radius: .4em; padding: .2em 1em .6em; margin: 1em 0; }
.verdict { border-left: .4em solid var(--warn); padding: .6em 1em; background: #8881; margin: 1em 0; }
.verdict.compliant { border-color: var(--ok); } .verdict.violation, .verdict.tampered { border-color: var(--bad); }
.verdict strong { font-size: 1.2em; letter-spacing: .05em; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: .5em 0; max-width: 100%; }
table { border-collapse: collapse; width: 100%; font-size: .92em; }
th, td { padding: .3em .6em; border-bottom: 1px solid #8883; text-align: left; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .88em; overflow-wrap: anywhere; }
.id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .88em; white-space: nowrap; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0; }
.warn { color: var(--warn); } .bad { color: var(--bad); } .ok { color: var(--ok); }
ul { padding-left: 1.2em; } li { margin: .2em 0; }
@media (max-width: 40em) {
  body { font-size: 15px; } main { padding: 0 .6em; }
  table, thead, tbody, tr, th, td { display: block; width: 100%; }
  thead { position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); }
  tr { border-bottom: 1px solid #8886; padding: .3em 0; }
  td, td.n { border: 0; padding: .1em 0; text-align: left; white-space: normal; }
  td[data-label]::before { content: attr(data-label) ": "; color: var(--muted); font-size: .85em; }
  td:empty { display: none; }
  .id { white-space: normal; overflow-wrap: break-word; }
}
"""

#: Content-Security-Policy of the page (W3C CSP Level 3, https://www.w3.org/TR/CSP3/ §"default-src", delivered by
#: ``<meta http-equiv>`` as §4.2 allows for a file opened from disk): nothing may load or run, images only from
#: ``data:`` (the ε plot), the one stylesheet only by its hash, so even a value that escaped escaping runs no script
#: and fetches nothing.
CSP = ("default-src 'none'; img-src data:; style-src 'sha256-{style_hash}'; base-uri 'none'; form-action 'none'")


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode("ascii")
    return CSP.format(style_hash=digest)


class ReportError(FcdError, ValueError):
    """A folder that is not a finished run folder (no ``summary.json``), or a ``summary.json`` whose fields have
    the wrong types."""


class Html(str):
    """Markup this module built from escaped parts: the one kind of string the page takes as it is. Every other
    value (``str``, a number, ``None``) is escaped where it is placed (:func:`_e`)."""


def _e(value: Any) -> Html:
    """``value`` as page text: ``Html`` as it is, anything else through :func:`html.escape` (quotes included)."""
    return value if isinstance(value, Html) else Html(escape(str(value), quote=True))


def _cls(text: Any, css: str) -> Html:
    return Html(f'<span class="{css}">{_e(text)}</span>')


def _sid(text: Any) -> Html:
    return Html(f'<span class="id">{_e(text)}</span>')


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _DP(_Strict):
    enabled: bool = False
    epsilon_cap: float | None = None


class _Coverage(_Strict):
    sites_covered: list[str] = []
    declined: list[str] = []
    failed: list[str] = []


class _SiteError(_Strict):
    site_id: str
    error: str
    round: int | None = None
    action: str | None = None


class ReportSummary(_Strict):
    """The fields of ``summary.json`` the report states outside the answers, with their types (strict: a string
    where a number belongs is refused, never printed). The answers are validated as
    :class:`~fcd_secure.queries.answers.EvaluationAnswer`."""

    dataset: str | None = None
    seed: int | None = None
    rounds: int | None = None
    site_ids: list[str] = []
    secure_aggregation: bool | None = None
    sync: str | None = None
    dp: _DP = _DP()
    versions: dict[str, str | None] = {}
    coverage: _Coverage | None = None
    site_errors: list[_SiteError] = []


@functools.cache
def _answers_adapter() -> TypeAdapter[EvaluationAnswer]:
    """The answers' validator, built once per process: building pydantic's schema of the nested answer records costs
    about a second, and a report (or the P47 test's thousand summaries) reads many summaries."""
    return TypeAdapter(EvaluationAnswer)


def read_summary(path: Path) -> tuple[ReportSummary, EvaluationAnswer]:
    """``summary.json`` of a run folder, its fields type-checked, and its answers as typed records.

    Raises:
        ReportError: not JSON, not an object, or a field of the wrong type (named).
    """
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a readable summary.json ({exc})") from None
    if not isinstance(raw, dict):
        raise ReportError(f"{path}: summary.json is not a JSON object")
    try:
        summary = ReportSummary.model_validate(raw)
        loose = EvaluationAnswer.from_json(raw)
        answers = _answers_adapter().validate_python(dataclasses.asdict(loose))
    except ValidationError as exc:
        where, why = first_invalid(exc, "summary")
        raise ReportError(f"{path}: summary.json field {where} has the wrong type ({why})") from None
    except (TypeError, AttributeError, ValueError, KeyError) as exc:
        raise ReportError(f"{path}: summary.json answers of the wrong shape ({type(exc).__name__}: {exc})") from None
    return summary, answers


def _table(head: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> Html:
    """A table whose cells are escaped unless :class:`Html`, in a box that scrolls sideways on a wide page; on a
    phone each row is a block whose cells carry their column's name (``data-label``)."""
    numeric = numeric or set()

    def cls(i: int) -> str:
        return ' class="n"' if i in numeric else ""

    th = "".join(f"<th{cls(i)}>{_e(h)}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f'<td{cls(i)} data-label="{_e(head[i])}">{_e(c)}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return Html(f'<div class="scroll"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>')


def _uploads_by_site(root: Path, ledgers: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per site and action: messages, payload bytes and what the uploads carried, from each site's own ledger."""
    from fcd_secure.audit.entries import UploadLine, parse_line  # noqa: PLC0415
    from fcd_secure.audit.ledger import read_lines  # noqa: PLC0415

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for led in ledgers:
        if led.get("role") != "site":
            continue
        path = Path(led["path"])
        path = path if path.is_absolute() else root / path
        for _n, text in read_lines(path):
            try:
                line = parse_line(text)
            except Exception:  # noqa: BLE001 - verify reports a bad line; the report only counts what it can read
                continue
            if not isinstance(line, UploadLine):
                continue
            a = out.setdefault(line.site_id, {}).setdefault(line.action, {
                "messages": 0, "payload_bytes": 0, "tensors": set(), "metrics": set(), "fields": set(),
                "refused": 0, "errors": 0})
            a["messages"] += 1
            a["payload_bytes"] += int(line.payload_bytes)
            a["tensors"].update(t.name for t in line.tensors)
            a["metrics"].update(line.metrics)
            a["fields"].update(f"{c.record}/{c.key}" for c in line.config_fields)
            a["refused"] += line.status == "refused"
            a["errors"] += line.status == "error"
    return out


def _kinds(a: dict[str, Any]) -> Html:
    bits = []
    if a["tensors"]:
        bits.append(_e(f"Θc parameters ({len(a['tensors'])} tensors)"))
    if a["metrics"]:
        bits.append(_e(f"aggregate sums and counts ({len(a['metrics'])} keys)"))
    if a["fields"]:
        bits.append(_e(f"protocol / audit fields ({len(a['fields'])})"))
    if a["refused"]:
        bits.append(_cls(f"{a['refused']} refused (the site\u2019s gate or policy: nothing left)", "bad"))
    if a["errors"]:
        bits.append(_cls(f"{a['errors']} error replies (a fixed category)", "warn"))
    return Html("; ".join(bits) or "nothing but the message envelope")


#: the cell of a value the logged data cannot identify, flagged
_NOT_IDENTIFIED_HTML = _cls(NOT_IDENTIFIED, "warn")


def _answers_html(ans: EvaluationAnswer) -> list[str]:
    """The answers with their support (``queries.answers``): coverage, headline metrics, the round the answers come
    from, what the logs identify (the one-step effect, the identified horizons), then the simulator's extrapolation
    with its doubly robust and bounded intervals, support and the sites whose logs never follow a policy."""
    h: list[str] = []  # markup; every value in it went through escape() or _table
    cov = ans.coverage
    if cov is not None:
        cls = "ok" if cov.complete else "warn"
        text = cov.warning or f"The answers cover all {cov.n_sites_covered} sites ({cov.n_entities} test entities)."
        h.append(f'<p class="{cls}" id="coverage">{escape(text)}</p>')
    rows = [[label, fmt(value, ".3f")] for value, label in (
        (ans.pehe, "PEHE (oracle)"), (ans.ate_error, "|ATE error| (oracle)"), (ans.factual_auc, "factual AUC"))
        if value is not None]
    if rows:
        h.append(_table(["metric", "value"], rows, {1}))
    pols, level = ans.policies, ans.level
    sel = ans.selection
    if sel is not None:
        h.append(f'<p id="selection">Answers from round {escape(str(sel.round))} '
                 f'({escape(str(sel.rule))}, criterion {escape(str(sel.coverage))}): '
                 f'{escape(str(sel.reason))}</p>')
    ident = ans.identified
    one = ans.one_step
    if ident or one is not None:
        h.append("<h3>What the logs identify (doubly robust)</h3>")
    decl = ans.unrecorded_confounding
    if decl is not None:
        h.append(f'<p class="warn" id="unrecorded-confounding">{escape(decl.line())}.</p>')
    if one is not None and one.not_identified:
        h.append(f'<p id="one-step">One-step effect of a_on vs a_off at every decision step: '
                 f"{escape(one.not_identified)}; its bounds under an unrecorded confounder follow.</p>")
    elif one is not None:
        h.append(f'<p id="one-step">One-step effect of a_on vs a_off at every decision step: '
                 f'{escape(one.sentence("interval"))}.</p>')
    if ans.sensitivity is not None:
        sens = ans.sensitivity
        h.append(f'<p id="sensitivity">Sensitivity to an unrecorded confounder: {escape(sens.verdict())} '
                 f'({escape(sens.model)}).</p>')
        h.append(_table(["Γ", "low", "high", "with sampling error"],
                        [[f"{b['gamma']:g}", f"{b['low']:+.3f}", f"{b['high']:+.3f}",
                          f"{b['low_ci']:+.3f} to {b['high_ci']:+.3f}"] for b in sens.bounds], {0, 1, 2}))
    if ans.propensities is not None:
        h.append(f'<p id="propensities">{escape(ans.propensities.line())}.</p>')
    if ident and decl is None:
        rows = []
        for name, d in ident.items():
            a = d.identified.answer
            if a is None:
                rows.append([name, "–", _NOT_IDENTIFIED_HTML, "", "", ""])
                continue
            e = d.identified.effect
            eff = "ref." if e is None and name == ans.reference else (
                f"{e.estimate:+.3f} ({e.low:+.3f} to {e.high:+.3f}, h {e.horizon})" if e is not None
                else NOT_IDENTIFIED)
            rows.append([name, str(a.horizon), fmt(a.estimate, ".3f"), interval_text(a), f"{a.ess:.0f}",
                         eff])
        h.append(_table(["policy", "h", "DR value", f"{level:.0%} interval", "ESS", "effect"], rows, {1, 2, 3, 4}))
        h.append('<p class="muted">h: the longest horizon whose weight products keep an effective sample size of at '
                 f"least 20. {escape(ans.horizon_caption())}; the table below is the simulator's "
                 f"{'g-computation' if ans.simulator_kind == G_COMPUTATION else 'extrapolation'}.</p>")
    for line in ans.kind_lines():
        h.append(f'<p class="kind">Kind of answer: {escape(line)}</p>')
    if pols:
        h.append(f"<h3>{escape(ans.simulator_title)}</h3>")
        rows = []
        for name, d in pols.items():
            dr = d.doubly_robust
            value = _NOT_IDENTIFIED_HTML if d.model_only else fmt(d.value_sim, ".3f")
            k = d.n_sites_without_support or 0
            where = (", ".join(d.sites_without_support) if d.sites_without_support
                     else (f"{k} site(s)" if k else "none"))
            rows.append([name, value, interval_text(d.interval), interval_text(dr),
                         interval_text(dr and dr.bounded), fmt(d.support, ".0%"), where, fmt(d.n)])
        h.append(_table(["policy", "value", f"{level:.0%} interval", "doubly robust", "with bounds", "support",
                         "sites whose logs never follow it", "entities"], rows, {1, 2, 3, 4, 5, 7}))
        if (line := ans.simulated_ranking_line()) is not None:
            h.append(f'<p class="ranking">{escape(line)}</p>')
        h.append('<p class="muted">Support: the share of steps the logged actions follow the policy. A policy no '
                 "logged step follows is not identified: only the bounds over the outcome's range are shown.</p>")
    sdr = {k: p for k, p in pols.items() if p.sequential_dr is not None}
    if sdr:
        h.append("<h3>Sequential doubly robust values (Q̂ from each logged history)</h3>")
        h.append(_table(["policy", "SDR value", f"{level:.0%} interval", "ESS", "support"],
                        [[escape(k), _NOT_IDENTIFIED_HTML if p.model_only or p.sequential_dr.not_identified else
                          _cls("withheld", "warn") if p.sequential_dr.withheld else fmt(p.sequential_dr.estimate, ".3f"),
                          "" if p.sequential_dr.withheld else interval_text(p.sequential_dr),
                          fmt(p.sequential_dr.ess, ".0f"), fmt(p.support, ".0%")]
                         for k, p in sdr.items()], {1, 2, 3, 4}))
        for k, p in sdr.items():
            if p.sequential_dr.withheld and p.sequential_dr.why and not p.model_only and not p.sequential_dr.not_identified:
                h.append(f'<p class="warn">{escape(k)}: sequential DR withheld — {escape(p.sequential_dr.why)}.</p>')
        h.append('<p class="muted">Covers the value if either the simulator\'s Q̂ or the propensities are right; '
                 "shown only where at least 20 effective entities (Kish ESS of the weight products) follow the policy "
                 "through the horizon and the mean weight product is not significantly below 1.</p>")
    hb = ans.sensitivity_horizon
    if hb is not None and not hb.gammas:  # every value withheld: nothing to bound
        h.append(f'<p id="sensitivity-horizon">Sensitivity over {escape(hb.horizon_text)}: '
                 f"{escape(hb.ranking_verdict())}.</p>")
    elif hb is not None:
        h.append(f"<h3>Sensitivity over {escape(hb.horizon_text)} to an unrecorded confounder</h3>")
        h.append(_table(["policy"] + [f"Γ = {g:g}" for g in hb.gammas],
                        [[escape(label), *cells] for label, cells, _v in hb.rows()], set(range(1, len(hb.gammas) + 1))))
        for name, e in hb.effects.items():
            h.append(f'<p class="muted">{escape(name)} − {escape(str(e.get("reference")))}: '
                     f"{escape(hb.effect_verdict(name))}.</p>")
        h.append(f'<p id="sensitivity-horizon">Ranking over {escape(hb.horizon_text)}: '
                 f"{escape(hb.ranking_verdict())} ({escape(hb.model)}; Γ = 1: no unrecorded confounder).</p>")
    if ans.natural_course is not None:
        h.append(f'<p id="natural-course">Natural course (the simulator under the logging policy vs the logs): '
                 f"{escape(ans.natural_course.cell())}.</p>")
    return h


def _privacy(root: Path, summary: ReportSummary, site_keys: list[str] | None) -> dict[str, Any]:
    """The privacy statement (:func:`fcd_secure.experiments.privacy_evidence.run_privacy_report`); where nothing
    can be read and the settings say DP was on, every site of the run is unverified (never "no DP guarantee")."""
    from fcd_secure.experiments.privacy_evidence import run_privacy_report, signed_records_report  # noqa: PLC0415
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415

    try:
        return run_privacy_report(root, site_keys=site_keys)
    except (FileNotFoundError, PrivacyLedgerError, ValueError) as exc:
        if not summary.dp.enabled:
            return {"dp": False, "sites": [], "error": str(exc)}
        rep = signed_records_report(root, cap=summary.dp.epsilon_cap, sites=summary.site_ids)
        return rep | {"error": str(exc)}


def _privacy_rows(privacy: dict[str, Any]) -> tuple[list[str], list[list[Any]], set[int]]:
    """The ε table: per site against its cap, from the ledgers (recomputed) or the sites' signed records."""
    rows: list[list[Any]] = []
    if privacy.get("basis"):
        for s in privacy["sites"]:
            spent, cap = s.get("epsilon_spent"), s.get("epsilon_cap")
            if spent is None:
                state = _cls("unverified", "warn")
            else:
                state = _cls(s["status"], "ok" if s["status"] == "signed, key pinned" else "warn")
            cls = "bad" if s.get("over_cap") else "ok"
            rows.append([_sid(s["site"]), _cls(fmt(spent, ".3f"), cls) if spent is not None else "–",
                         fmt(s.get("epsilon_any_record"), ".3f") if spent is not None else "–", fmt(cap, "g"),
                         fmt(s.get("epsilon_remaining"), ".3f") if spent is not None else "–", state])
        con = privacy.get("consortium") or {}
        rows.append([Html("<b>consortium</b> (max over sites)"), Html(f"<b>{_e(fmt(con.get('epsilon'), '.3f'))}</b>"),
                     "", "", "", "" if con.get("complete") else _cls("incomplete", "warn")])
        return ["site", "ε spent", "any record ≤", "ε cap", "remaining", "record"], rows, {1, 2, 3, 4}
    for s in privacy["sites"]:
        spent, cap = s.get("epsilon_spent"), s.get("epsilon_cap")
        over = spent is not None and cap is not None and spent > cap + 1e-9
        low = s.get("epsilon_remaining") is not None and s["epsilon_remaining"] <= 1e-3
        rows.append([_sid(s["site"]), _cls(fmt(spent, ".3f"), "bad" if over else ("warn" if low else "ok")),
                     fmt(cap, "g"), fmt(s.get("epsilon_remaining"), ".3f"), fmt(s.get("delta"), ".1e"),
                     s.get("accountant") or "n/a"])
    con = privacy.get("consortium") or {}
    rows.append([Html("<b>consortium</b> (max over sites)"), Html(f"<b>{_e(fmt(con.get('epsilon'), '.3f'))}</b>"),
                 "", "", "", ""])
    return ["site", "ε spent", "ε cap", "remaining", "δ", "accountant"], rows, {1, 2, 3, 4}


def _plot(privacy: dict[str, Any]) -> str | None:
    """The ε-over-rounds plot as base64 PNG (:func:`fcd_secure.privacy.report.plot_epsilon`), of the sites whose ε
    is known; ``None`` when none is."""
    from fcd_secure.privacy.report import plot_epsilon  # noqa: PLC0415

    known = [s for s in privacy.get("sites") or [] if s.get("epsilon_spent") is not None]
    if not (privacy.get("dp") and known):
        return None
    return base64.b64encode(plot_epsilon({**privacy, "sites": known})).decode("ascii")


def build_report_html(run_dir: str | Path, *, site_keys: list[str] | None = None,
                      server_keys: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The HTML report of the run in ``run_dir`` and the facts it states (for ``--json``).

    Every value from the run folder is escaped where it is placed (:func:`_e`, :func:`_table`), and the page carries
    a Content-Security-Policy (:data:`CSP`) under which no script runs and nothing loads: the folder is written by
    the server being audited, and must not be able to script the auditor's page (docs/threats.md P47).

    Args:
        run_dir: a finished run folder (``summary.json``; its ``state/`` or ``evidence/`` holds the ledgers).
        site_keys, server_keys: pinned fingerprints (``fcd audit verify``'s): without them the verdict is at best
            "unverified", and the report says so.

    Raises:
        ReportError: no ``summary.json`` in ``run_dir``, or one whose fields have the wrong types.
    """
    from fcd_secure.audit.report import verdict as verdict_of  # noqa: PLC0415
    from fcd_secure.audit.verify import UsageError, verify_path  # noqa: PLC0415

    root = Path(run_dir)
    summary_file = root / "summary.json"
    if not summary_file.is_file():
        raise ReportError(f"{root}: no summary.json (not a finished run folder of `fcd run`)")
    summary, answers = read_summary(summary_file)
    try:
        rounds = json.loads((root / "rounds.json").read_text()) if (root / "rounds.json").is_file() else []
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{root / 'rounds.json'}: not readable ({exc})") from None
    if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
        raise ReportError(f"{root / 'rounds.json'}: not a list of rounds")
    sites = list(summary.site_ids)

    # the audit verdict
    try:
        result = verify_path(root, site_keys=site_keys or None, server_keys=server_keys or None)
        audit = result.to_json()
        status, exit_code, said = result.status, result.exit_code, verdict_of(result)["message"]
    except UsageError as exc:
        audit, status, exit_code = {"findings": [], "ledgers": [], "per_site": {}, "server_totals": {}}, "no ledgers", None
        audit["error"], said = str(exc), None
    findings = audit.get("findings") or []
    unchecked = [f for f in findings if f["severity"] in ("unverified", "partial")]
    serious = [f for f in findings if f["severity"] in ("violation", "tampered")]
    notes = sorted({f["message"] for f in findings if f["severity"] == "note"})

    privacy = _privacy(root, summary, site_keys)
    plot_b64 = _plot(privacy)

    uploads = _uploads_by_site(root, audit.get("ledgers") or [])
    cov = summary.coverage
    sampled: dict[str, int] = {}
    for r in rounds:
        for sid in str(r.get("sites") or "").split():
            sampled[sid] = sampled.get(sid, 0) + 1
    errors: dict[str, list[str]] = {}
    for e in summary.site_errors:
        errors.setdefault(e.site_id, []).append(f"{e.error} (round {e.round}, {e.action})")

    h: list[str] = []  # markup; every value in it went through _e() or _table()
    title = f"fcd run report: {summary.dataset} · seed {summary.seed}"
    h.append(f"<h1>{_e(title)}</h1>")
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mode = "secure aggregation" if summary.secure_aggregation else "plain FedAvg"
    dp = summary.dp
    dp_text = f"DP-SGD, ε cap {fmt(dp.epsilon_cap, 'g')} per site" if dp.enabled else "no DP"
    h.append(f'<p class="meta">{_e(summary.rounds)} rounds · {len(sites)} sites · {_e(mode)} · sync '
             f'{_e(summary.sync)} · {_e(dp_text)} · report made {made} by fcd_secure '
             f'{_e(summary.versions.get("fcd_secure"))}</p>')

    # 1. what a privacy officer needs first: the verdict, ε per site against its cap, who took part
    h.append('<section class="officer" id="summary"><h2>Summary for the privacy officer</h2>')
    h.append(f'<div class="verdict {_e(status)}" id="verdict"><strong>{_e(status.upper())}</strong>'
             + (f" (what <code>fcd audit verify</code> exits with: {_e(exit_code)})" if exit_code is not None else "")
             + (f"<br>{_e(said)}" if said else "") + "</div>")
    if privacy.get("dp") and privacy.get("sites"):
        if privacy.get("basis"):
            basis = ("ε per record (one trajectory), as each site signed it into its audit chain: the head of its DP "
                     "ledger at every upload, checked as <code>fcd audit verify</code> checks the chain (the ledgers "
                     "stay on the sites; docs/privacy.md).")
        else:
            basis = "ε per record (one trajectory), at each site\u2019s δ, recomputed from the site\u2019s ledger."
        h.append(f'<p id="dp-state"><b>DP-SGD was on.</b> {basis}</p>')
        head, rows, numeric = _privacy_rows(privacy)
        h.append(Html('<div id="epsilon-table">') + _table(head, rows, numeric) + "</div>")
        if privacy.get("unverified"):
            h.append(f'<p class="warn" id="dp-unverified">Unverified: no intact signed privacy record of '
                     f'{_e(", ".join(privacy["unverified"]))}. DP was on; what these sites spent is not stated '
                     "here: ask for their audit ledgers, or read <code>fcd privacy report</code> at each site.</p>")
    else:
        h.append('<p class="warn" id="no-dp">This run has no DP guarantee: no site trained under DP-SGD, so no ε '
                 "bounds what its released parameters reveal about a record.</p>")
    covered = set(cov.sites_covered) if cov else set()
    h.append(f'<p id="took-part">{len(sites)} sites took part: '
             + ", ".join(_sid(x) for x in sites) + (f"; {len(covered)} in the answers" if cov else "") + ".</p>")
    h.append("</section>")

    # 2. who took part
    h.append("<h2>Who took part</h2>")
    rows = []
    for sid in sites:
        in_answers = ("yes" if sid in covered else
                      _cls("no: declined", "warn") if cov and sid in cov.declined else
                      _cls("no: failed", "bad") if cov and sid in cov.failed else "n/a")
        rows.append([_sid(sid), str(sampled.get(sid, 0)), in_answers, "; ".join(errors.get(sid, [])) or "none"])
    h.append(_table(["site", "rounds sampled", "in the answers", "site errors"], rows, {1}))

    # 3. privacy: the plot and what ε does not cover
    h.append("<h2>Privacy budget: ε per site against its cap</h2>")
    if privacy.get("dp") and privacy.get("sites"):
        unit = privacy.get("unit_of_privacy") or (privacy.get("common") or {}).get("unit_of_privacy")
        h.append(f'<p class="muted">Unit of privacy: {_e(unit)}.</p>')
        if plot_b64:
            h.append(f'<img id="epsilon-plot" alt="ε spent per site against rounds, with the cap" '
                     f'src="data:image/png;base64,{plot_b64}">')
        nc = (privacy.get("common") or {}).get("not_covered") or []
        if nc:
            h.append("<p>Not covered by ε:</p><ul>" + "".join(f"<li>{_e(x)}</li>" for x in nc) + "</ul>")
        if privacy.get("error"):
            h.append(f'<p class="warn">{_e(privacy["error"])}</p>')
    else:
        h.append('<p class="muted">No DP: nothing to plot.</p>')

    # 4. what could not be checked
    h.append("<h2>What could not be checked</h2>")
    if audit.get("error"):
        h.append(f'<p class="bad">{_e(audit["error"])}</p>')
    if serious:
        h.append("<p>Findings:</p><ul>" + "".join(
            f'<li class="bad"><b>{_e(f["severity"])}</b> <code>{_e(f["ledger"])}</code>: {_e(f["message"])}</li>'
            for f in serious) + "</ul>")
    h.append("<ul>")
    if not (site_keys or server_keys):
        h.append("<li>No key was pinned for this report: the signatures prove that one key wrote each ledger, not "
                 "whose. Give the operator's pin file (<code>fcd report RUN_DIR --pins pins.toml</code>) for a "
                 "compliance verdict.</li>")
    for f in unchecked:
        h.append(f'<li class="warn"><code>{_e(f["ledger"])}</code>: {_e(f["message"])}</li>')
    for text in (*notes, *NOT_IN_LEDGERS):
        h.append(f"<li>{_e(text)}</li>")
    h.append("</ul>")

    # 5. what left each site
    h.append("<h2>What left each site</h2>")
    h.append('<p class="muted">From each site\'s own signed ledger (every reply at its egress gate). Payload bytes: '
             "Flower's serialized content, identical at both ends.</p>")
    rows = []
    for sid in sites or sorted(uploads):
        for action, a in sorted((uploads.get(sid) or {}).items()):
            rows.append([_sid(sid), Html(f"<code>{_e(action)}</code>"), str(a["messages"]),
                         fmt(a["payload_bytes"], ","), _kinds(a)])
        tot = (audit.get("per_site") or {}).get(sid)
        if tot:
            rows.append([Html(f'<b class="id">{_e(sid)}</b>'), Html("<b>all</b>"), Html(f"<b>{_e(tot['messages'])}</b>"),
                         Html(f"<b>{_e(fmt(tot['payload_bytes'], ','))}</b>"), ""])
    st = audit.get("server_totals") or {}
    if st.get("messages"):
        rows.append([Html("<b>server received</b>"), "", str(st["messages"]), fmt(st.get("payload_bytes"), ","), ""])
    h.append(_table(["site", "action", "messages", "payload bytes", "what it carried"], rows, {2, 3}))

    # 6. the answers
    h.append("<h2>The answers and their support</h2>")
    h += _answers_html(answers)
    h.append(f'<p class="meta">Run folder <code>{_e(root)}</code>. Self-contained: this file loads nothing from the '
             "network and runs no script (its Content-Security-Policy forbids both). Sources: summary.json, "
             "rounds.json, the signed site and server ledgers, the sites' privacy ledgers or their signed privacy "
             "records.</p>")

    doc = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           f'<meta http-equiv="Content-Security-Policy" content="{_e(_csp())}">'
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
           f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>"
           + "\n".join(h) + "</main></body></html>\n")
    facts = {"run": str(root), "verdict": status, "verify_exit_code": exit_code, "sites": sites,
             "coverage": summary.model_dump()["coverage"] if cov else None, "dp": bool(privacy.get("dp")),
             "dp_basis": privacy.get("basis") or ("ledgers" if privacy.get("dp") else None),
             "dp_unverified": privacy.get("unverified") or [], "plot": plot_b64 is not None,
             "unchecked": [f["message"] for f in unchecked], "bytes": len(doc.encode())}
    return doc, facts


def write_report_html(run_dir: str | Path, out: str | Path | None = None, **keys: Any) -> tuple[Path, dict[str, Any]]:
    """Write :func:`build_report_html` to ``out`` (default ``<run_dir>/report.html``, atomically)."""
    from fcd_secure._io import atomic_write_text  # noqa: PLC0415

    doc, facts = build_report_html(run_dir, **keys)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    atomic_write_text(path, doc)
    return path, {**facts, "file": str(path)}

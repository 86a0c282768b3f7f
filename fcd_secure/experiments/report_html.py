"""One self-contained HTML report of a run, for a privacy officer and an auditor (``fcd report RUN_DIR``).

It gathers in one file what a run folder already holds, each from its one source:

* **the audit verdict** (:func:`fcd_secure.audit.verify.verify_path`, with the pins the reader gives) and what could
  not be checked: the findings that keep the verdict from "compliant" (keys not pinned, evidence partial) and the
  notes, and what no ledger can show (HTTP framing, TLS, heartbeats);
* **who took part**: the sites of ``summary.json``, the rounds each was sampled for (``rounds.json``) and whether
  its data is in the answers (``coverage``, ``queries.evaluation.coverage``);
* **what left each site**: every upload of the site's own signed ledger, by action, with its payload bytes and what
  it carried (Θc tensors, aggregate sums, protocol and audit fields), and the totals the server received;
* **ε per site against its cap** (:func:`fcd_secure.privacy.report.build_report`, recomputed from each site's
  write-ahead ledger; per record: the unit of privacy is one trajectory), with the plot of ε over rounds
  (:func:`fcd_secure.privacy.report.plot_epsilon`) embedded as a base64 PNG;
* **the answers with their support**: the headline metrics, each policy's value and interval, its logged support,
  whether the data identifies it and the sites whose logs never follow it, and the coverage line.

Self-contained: inline CSS, the plot as a ``data:`` URI, no script, no font, nothing fetched; readable on a phone
(a viewport meta tag, one column, tables that scroll sideways inside their own box, identifiers that wrap).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["ReportError", "build_report_html", "write_report_html"]

from fcd_secure._format import fmt
from fcd_secure.errors import FcdError
from fcd_secure.queries.answers import EvaluationAnswer
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
body { font: 16px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; padding: 0 0 3em; }
main { max-width: 60em; margin: 0 auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin: 1em 0 .3em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #8884; }
.meta, .muted { color: var(--muted); font-size: .9em; }
.verdict { border-left: .4em solid var(--warn); padding: .6em 1em; background: #8881; margin: 1em 0; }
.verdict.compliant { border-color: var(--ok); } .verdict.violation, .verdict.tampered { border-color: var(--bad); }
.verdict strong { font-size: 1.2em; letter-spacing: .05em; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: .5em 0; }
table { border-collapse: collapse; min-width: 100%; font-size: .92em; }
th, td { padding: .3em .6em; border-bottom: 1px solid #8883; text-align: left; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, .id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .88em; overflow-wrap: anywhere; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0; }
.warn { color: var(--warn); } .bad { color: var(--bad); } .ok { color: var(--ok); }
ul { padding-left: 1.2em; } li { margin: .2em 0; }
@media (max-width: 40em) { body { font-size: 15px; } th, td { padding: .25em .4em; } }
"""


class ReportError(FcdError, ValueError):
    """A folder that is not a finished run folder (no ``summary.json``)."""


def _table(head: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    """A table whose cells are already HTML (escaped by the caller), inside a box that scrolls sideways."""
    numeric = numeric or set()
    th = "".join(f'<th class="n">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>" for r in rows
    )
    return f'<div class="scroll"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


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


def _kinds(a: dict[str, Any]) -> str:
    bits = []
    if a["tensors"]:
        bits.append(f"Θc parameters ({len(a['tensors'])} tensors)")
    if a["metrics"]:
        bits.append(f"aggregate sums and counts ({len(a['metrics'])} keys)")
    if a["fields"]:
        bits.append(f"protocol / audit fields ({len(a['fields'])})")
    if a["refused"]:
        bits.append(f'<span class="bad">{a["refused"]} refused (the site\u2019s gate or policy: nothing left)</span>')
    if a["errors"]:
        bits.append(f'<span class="warn">{a["errors"]} error replies (a fixed category)</span>')
    return "; ".join(bits) or "nothing but the message envelope"


#: the cell of a value the logged data cannot identify, flagged
_NOT_IDENTIFIED_HTML = f'<span class="warn">{NOT_IDENTIFIED}</span>'


def _answers_html(ans: EvaluationAnswer) -> list[str]:
    """The answers with their support (``queries.answers``): coverage, headline metrics, the round the answers come
    from, what the logs identify (the one-step effect, the identified horizons), then the simulator's extrapolation
    with its doubly robust and bounded intervals, support and the sites whose logs never follow a policy."""
    h: list[str] = []
    cov = ans.coverage
    if cov is not None:
        cls = "ok" if cov.complete else "warn"
        text = cov.warning or f"The answers cover all {cov.n_sites_covered} sites ({cov.n_entities} test entities)."
        h.append(f'<p class="{cls}" id="coverage">{escape(text)}</p>')
    rows = [[escape(label), fmt(value, ".3f")] for value, label in (
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
    if one is not None:
        h.append(f'<p id="one-step">One-step effect of a_on vs a_off at every decision step: '
                 f'{escape(one.sentence("interval"))}.</p>')
    if ans.propensities is not None:
        h.append(f'<p id="propensities">{escape(ans.propensities.line())}.</p>')
    if ident:
        rows = []
        for name, d in ident.items():
            a = d.identified.answer
            if a is None:
                rows.append([escape(name), "–", _NOT_IDENTIFIED_HTML, "", "", ""])
                continue
            e = d.identified.effect
            eff = "ref." if e is None and name == ans.reference else (
                f"{e.estimate:+.3f} ({e.low:+.3f} to {e.high:+.3f}, h {e.horizon})" if e is not None
                else NOT_IDENTIFIED)
            rows.append([escape(name), str(a.horizon), fmt(a.estimate, ".3f"), interval_text(a), f"{a.ess:.0f}",
                         escape(eff)])
        h.append(_table(["policy", "h", "DR value", f"{level:.0%} interval", "ESS", "effect"], rows, {1, 2, 3, 4}))
        h.append('<p class="muted">h: the longest horizon whose weight products keep an effective sample size of at '
                 "least 20. Rank policies on these numbers only; the table below is the simulator's extrapolation.</p>")
    if pols:
        h.append("<h3>Extrapolation: the simulator over whole trajectories</h3>")
        rows = []
        for name, d in pols.items():
            dr = d.doubly_robust
            value = _NOT_IDENTIFIED_HTML if d.model_only else fmt(d.value_sim, ".3f")
            k = d.n_sites_without_support or 0
            where = (escape(", ".join(d.sites_without_support)) if d.sites_without_support
                     else (f"{k} site(s)" if k else "none"))
            rows.append([escape(name), value, interval_text(d.interval), interval_text(dr),
                         interval_text(dr and dr.bounded), fmt(d.support, ".0%"), where, fmt(d.n)])
        h.append(_table(["policy", "value", f"{level:.0%} interval", "doubly robust", "with bounds", "support",
                         "sites whose logs never follow it", "entities"], rows, {1, 2, 3, 4, 5, 7}))
        h.append('<p class="muted">Support: the share of steps the logged actions follow the policy. A policy no '
                 "logged step follows is not identified: only the bounds over the outcome's range are shown.</p>")
    sdr = {k: p for k, p in pols.items() if p.sequential_dr is not None}
    if sdr:
        h.append("<h3>Sequential doubly robust values (Q̂ from each logged history)</h3>")
        h.append(_table(["policy", "SDR value", f"{level:.0%} interval", "support"],
                        [[escape(k), _NOT_IDENTIFIED_HTML if p.model_only else fmt(p.sequential_dr.estimate, ".3f"),
                          interval_text(p.sequential_dr), fmt(p.support, ".0%")] for k, p in sdr.items()],
                        {1, 2, 3}))
        h.append('<p class="muted">Covers the value if either the simulator\'s Q̂ or the propensities are right; '
                 "where few logged steps follow the policy the value is the simulator's and the interval too "
                 "narrow.</p>")
    if ans.natural_course is not None:
        h.append(f'<p id="natural-course">Natural course (the simulator under the logging policy vs the logs): '
                 f"{escape(ans.natural_course.cell())}.</p>")
    return h


def build_report_html(run_dir: str | Path, *, site_keys: list[str] | None = None,
                      server_keys: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The HTML report of the run in ``run_dir`` and the facts it states (for ``--json``).

    Args:
        run_dir: a finished run folder (``summary.json``; its ``state/`` holds the ledgers).
        site_keys, server_keys: pinned fingerprints (``fcd audit verify``'s): without them the verdict is at best
            "unverified", and the report says so.

    Raises:
        ReportError: no ``summary.json`` in ``run_dir``.
    """
    from fcd_secure.audit.report import verdict as verdict_of  # noqa: PLC0415
    from fcd_secure.audit.verify import UsageError, verify_path  # noqa: PLC0415
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415
    from fcd_secure.privacy.report import build_report, plot_epsilon  # noqa: PLC0415

    root = Path(run_dir)
    summary_file = root / "summary.json"
    if not summary_file.is_file():
        raise ReportError(f"{root}: no summary.json (not a finished run folder of `fcd run`)")
    summary = json.loads(summary_file.read_text())
    rounds = json.loads((root / "rounds.json").read_text()) if (root / "rounds.json").is_file() else []
    sites: list[str] = list(summary.get("site_ids") or [])

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

    # privacy
    try:
        privacy = build_report(root)
    except (FileNotFoundError, PrivacyLedgerError) as exc:
        privacy = {"dp": False, "sites": [], "error": str(exc)}
    plot_b64 = None
    if privacy.get("dp") and privacy.get("sites"):
        plot_b64 = base64.b64encode(plot_epsilon(privacy)).decode("ascii")

    uploads = _uploads_by_site(root, audit.get("ledgers") or [])
    cov = summary.get("coverage") or {}
    sampled: dict[str, int] = {}
    for r in rounds:
        for sid in str(r.get("sites") or "").split():
            sampled[sid] = sampled.get(sid, 0) + 1
    errors: dict[str, list[str]] = {}
    for e in summary.get("site_errors") or []:
        errors.setdefault(e["site_id"], []).append(f"{e['error']} (round {e['round']}, {e['action']})")

    h: list[str] = []
    title = f"fcd run report: {summary.get('dataset')} · seed {summary.get('seed')}"
    h.append(f"<h1>{escape(title)}</h1>")
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mode = "secure aggregation" if summary.get("secure_aggregation") else "plain FedAvg"
    dp = summary.get("dp") or {}
    h.append(f'<p class="meta">Run folder <code>{escape(str(root))}</code> · {summary.get("rounds")} rounds · '
             f'{len(sites)} sites · {escape(mode)} · sync {escape(str(summary.get("sync")))} · '
             f'{"DP-SGD, ε cap " + fmt(dp.get("epsilon_cap"), "g") + " per site" if dp.get("enabled") else "no DP"}'
             f' · report made {made} by fcd_secure {escape(str((summary.get("versions") or {}).get("fcd_secure")))}</p>')

    # 1. verdict
    h.append("<h2>Audit verdict</h2>")
    h.append(f'<div class="verdict {escape(status)}" id="verdict"><strong>{escape(status.upper())}</strong>'
             + (f" (what <code>fcd audit verify</code> exits with: {exit_code})" if exit_code is not None else "")
             + (f"<br>{escape(said)}" if said else "") + "</div>")
    if audit.get("error"):
        h.append(f'<p class="bad">{escape(audit["error"])}</p>')
    if serious:
        h.append("<p>Findings:</p><ul>" + "".join(
            f'<li class="bad"><b>{escape(f["severity"])}</b> <code>{escape(f["ledger"])}</code>: {escape(f["message"])}</li>'
            for f in serious) + "</ul>")
    h.append("<h3>What could not be checked</h3><ul>")
    if not (site_keys or server_keys):
        h.append("<li>No key was pinned for this report: the signatures prove that one key wrote each ledger, not "
                 "whose. Give the operator's pin file (<code>fcd report RUN_DIR --pins pins.toml</code>) for a "
                 "compliance verdict.</li>")
    for f in unchecked:
        h.append(f'<li class="warn"><code>{escape(f["ledger"])}</code>: {escape(f["message"])}</li>')
    for text in (*notes, *NOT_IN_LEDGERS):
        h.append(f"<li>{escape(text)}</li>")
    h.append("</ul>")

    # 2. who took part
    h.append("<h2>Who took part</h2>")
    covered = set(cov.get("sites_covered") or [])
    rows = []
    for sid in sites:
        in_answers = ("yes" if sid in covered else
                      '<span class="warn">no: declined</span>' if sid in (cov.get("declined") or []) else
                      '<span class="bad">no: failed</span>' if sid in (cov.get("failed") or []) else "n/a")
        rows.append([f'<span class="id">{escape(sid)}</span>', str(sampled.get(sid, 0)), in_answers,
                     escape("; ".join(errors.get(sid, []))) or "none"])
    h.append(_table(["site", "rounds sampled", "in the answers", "site errors"], rows, {1}))

    # 3. what left each site
    h.append("<h2>What left each site</h2>")
    h.append('<p class="muted">From each site\'s own signed ledger (every reply at its egress gate). Payload bytes: '
             "Flower's serialized content, identical at both ends.</p>")
    rows = []
    for sid in sites or sorted(uploads):
        for action, a in sorted((uploads.get(sid) or {}).items()):
            rows.append([f'<span class="id">{escape(sid)}</span>', f"<code>{escape(action)}</code>",
                         str(a["messages"]), fmt(a["payload_bytes"], ","), _kinds(a)])
        tot = (audit.get("per_site") or {}).get(sid)
        if tot:
            rows.append([f'<b class="id">{escape(sid)}</b>', "<b>all</b>", f"<b>{tot['messages']}</b>",
                         f"<b>{fmt(tot['payload_bytes'], ',')}</b>", ""])
    st = audit.get("server_totals") or {}
    if st.get("messages"):
        rows.append(["<b>server received</b>", "", str(st["messages"]), fmt(st.get("payload_bytes"), ","), ""])
    h.append(_table(["site", "action", "messages", "payload bytes", "what it carried"], rows, {2, 3}))

    # 4. privacy
    h.append("<h2>Privacy budget: ε per site against its cap</h2>")
    if privacy.get("dp") and privacy.get("sites"):
        unit = (privacy.get("common") or {}).get("unit_of_privacy") or privacy["sites"][0].get("unit_of_privacy")
        h.append(f'<p class="muted">ε is per record (the unit of privacy: {escape(str(unit))}), at each site\'s δ, '
                 "recomputed from the site's write-ahead ledger.</p>")
        rows = []
        for s in privacy["sites"]:
            spent, cap = s.get("epsilon_spent"), s.get("epsilon_cap")
            over = spent is not None and cap is not None and spent > cap + 1e-9
            cls = "bad" if over else ("warn" if s.get("epsilon_remaining") is not None and s["epsilon_remaining"] <= 1e-3 else "ok")
            rows.append([f'<span class="id">{escape(str(s["site"]))}</span>', f'<span class="{cls}">{fmt(spent, ".3f")}</span>',
                         fmt(cap, "g"), fmt(s.get("epsilon_remaining"), ".3f"), fmt(s.get("delta"), ".1e"),
                         escape(str(s.get("accountant") or "n/a"))])
        con = privacy.get("consortium") or {}
        rows.append(["<b>consortium</b> (max over sites)", f"<b>{fmt(con.get('epsilon'), '.3f')}</b>", "", "", "", ""])
        h.append(_table(["site", "ε spent", "ε cap", "remaining", "δ", "accountant"], rows, {1, 2, 3, 4}))
        if plot_b64:
            h.append(f'<img id="epsilon-plot" alt="ε spent per site against rounds, with the cap" '
                     f'src="data:image/png;base64,{plot_b64}">')
        nc = (privacy.get("common") or {}).get("not_covered") or []
        if nc:
            h.append("<p>Not covered by ε:</p><ul>" + "".join(f"<li>{escape(str(x))}</li>" for x in nc) + "</ul>")
    else:
        h.append('<p class="warn" id="no-dp">This run has no DP guarantee: no site trained under DP-SGD, so no ε '
                 "bounds what its released parameters reveal about a record.</p>")

    # 5. the answers
    h.append("<h2>The answers and their support</h2>")
    h += _answers_html(EvaluationAnswer.from_json(summary))
    h.append('<p class="meta">Self-contained: this file loads nothing from the network. Sources: summary.json, '
             "rounds.json, the signed site and server ledgers, the sites' privacy ledgers.</p>")

    doc = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
           f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
           + "\n".join(h) + "</main></body></html>\n")
    facts = {"run": str(root), "verdict": status, "verify_exit_code": exit_code, "sites": sites,
             "coverage": cov or None, "dp": bool(privacy.get("dp")), "plot": plot_b64 is not None,
             "unchecked": [f["message"] for f in unchecked], "bytes": len(doc.encode())}
    return doc, facts


def write_report_html(run_dir: str | Path, out: str | Path | None = None, **keys: Any) -> tuple[Path, dict[str, Any]]:
    """Write :func:`build_report_html` to ``out`` (default ``<run_dir>/report.html``, atomically)."""
    from fcd_secure._io import atomic_write_text  # noqa: PLC0415

    doc, facts = build_report_html(run_dir, **keys)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    atomic_write_text(path, doc)
    return path, {**facts, "file": str(path)}

"""The typed answers (``queries.answers``) and the one number formatter (``_format``), read from the pinned answers of
``tests/golden`` (no run: the golden run of ``tests/test_golden.py`` made them).

The merged answer round-trips through the typed records (every key a record reads is the merged JSON's, unchanged);
an absent part is None, never an error in a renderer; the run table printed from the typed answer is the pinned one,
byte for byte; the texts two renderers share (an interval, the "not identified" cell, the one-step sentence) come out
of the HTML report and ``fcd whatif`` alike.
"""

from __future__ import annotations

import io
import json
import re
from html import escape
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from fcd_secure._format import fmt
from fcd_secure.cli.app import say_identifier
from fcd_secure.cli.run import summary_table
from fcd_secure.cli.whatif import (anchors_line, coverage_line, dr_table, identified_table, one_step_line,
                                   pi_k_lines, print_answers, support_lines, whatif_table)
from fcd_secure.experiments.report_html import build_report_html
from fcd_secure.queries.answers import EvaluationAnswer, HeldOutCheck
from fcd_secure.queries.policy_answers import NOT_IDENTIFIED, Interval, PolicyAnswer, interval_text

GOLDEN = Path(__file__).resolve().parent / "golden"
#: the golden run's policies in the order it asked them (the reference first)
PAPER_POLICIES = ("never", "always", "early_on", "late_on")


@pytest.fixture(scope="module")
def summary() -> dict:
    # the golden file leaves out the machine's values: put back the two the run table prints (then scrubbed); it
    # sorts its keys, so the policies go back into the question's order (the run's default: the paper's four)
    d = json.loads((GOLDEN / "summary.json").read_text())
    pols = {k: d["policies"][k] for k in PAPER_POLICIES}
    return {**d, "policies": pols, "downlink_bytes": 1_234_567, "wall_s": 81.5}


@pytest.fixture(scope="module")
def whatif() -> dict:
    return json.loads((GOLDEN / "whatif.json").read_text())["data"]


def contained(part, whole, path: str = "$") -> list[str]:
    """Where ``part`` (a record's ``to_json``) is not ``whole`` restricted to its keys."""
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [f"{path}: not an object"]
        return [d for k, v in part.items() for d in (
            [f"{path}.{k}: not in the answer"] if k not in whole else contained(v, whole[k], f"{path}.{k}"))]
    if isinstance(part, list):
        if not isinstance(whole, list) or len(part) != len(whole):
            return [f"{path}: not the answer's list"]
        return [d for i, (p, w) in enumerate(zip(part, whole)) for d in contained(p, w, f"{path}[{i}]")]
    return [] if part == whole else [f"{path}: {part!r} != {whole!r}"]


def text(*renderables, width: int = 80) -> str:
    con = Console(width=width, file=io.StringIO(), highlight=False)
    for r in renderables:
        con.print(r)
    return con.file.getvalue()


# -- the formatter -------------------------------------------------------------------------------------------------
def test_one_formatter_prints_missing_values_floats_counts_and_words():
    assert fmt(None) == "n/a" and fmt(None, missing="—") == "—"
    assert fmt(0.12143672459720684) == "0.1214" and fmt(-0.353, "+.3f") == "-0.353" and fmt(0.0141, ".0%") == "1%"
    assert fmt(np.float32(0.5), ".3f") == "0.500" and fmt(np.float64(1e-5), ".3g") == "1e-05"
    assert fmt(3) == "3" and fmt(np.int64(3), ".4f") == "3"  # a count under a float spec stays a count
    assert fmt(241144, ",") == "241,144" and fmt(12, ".0f") == "12"
    assert fmt(True) == "True" and fmt("extrapolation") == "extrapolation"
    assert fmt(0.1, "") == str(0.1) and fmt(7, "") == "7"  # the empty spec is Python's own str


# -- the typed records ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["summary", "whatif"])
def test_the_merged_answer_round_trips_through_the_typed_records(which, request):
    merged = request.getfixturevalue(which)
    ans = EvaluationAnswer.from_json(merged)
    assert not contained(ans.to_json(), merged)
    assert list(ans.policies) == list(merged["policies"])  # the answer's order is the question's
    for name, p in ans.policies.items():
        d = merged["policies"][name]
        assert p.value_sim == d["value_sim"] and p.interval.low == d["interval"]["low"]
        assert p.doubly_robust.bounded.high == d["doubly_robust"]["bounded"]["high"]
        assert p.support == d["support"] and p.model_only is (d["supported"] is False)
        assert set(p.ope) == {k for k in ("ipw", "snipw", "dr", "ipw_h2", "snipw_h2", "dr_h2") if d.get(k)}
        ident = d["identified"]
        assert p.identified.answer.estimate == ident["answer"]["estimate"]
        assert len(p.identified.horizons) == len(ident["horizons"])
        assert (p.identified.effect is None) == (not ident.get("effect"))
        assert (p.effect is None) == (name == merged["whatif"]["reference"])
    assert ans.one_step.estimate == merged["one_step_effect"]["estimate"]
    assert ans.coverage.sites_covered == tuple(merged["coverage"]["sites_covered"])
    assert EvaluationAnswer.of(ans) is ans and EvaluationAnswer.of(merged) == ans
    if which == "summary":
        dr = merged["dr_learner"]
        assert ans.dr_learner.fitted and ans.dr_learner.steps == dr["steps"]
        assert ans.dr_learner.simulator.heldout.verdict == dr["simulator"]["heldout"]["verdict"]
        assert ans.selection.round == merged["selection"]["round"]
        assert ans.effect_skill.flags == tuple(merged["effect_skill"]["flags"])
        assert ans.effect_support.extrapolation


def test_absent_parts_are_none_and_every_renderer_says_nothing_of_them():
    ans = EvaluationAnswer.from_json({})
    assert ans.policies == {} and ans.one_step is None and ans.dr_learner is None and ans.coverage is None
    assert ans.level == 0.9 and ans.reference is None
    assert identified_table({}) is None and dr_table({}) is None and one_step_line({}) is None
    assert support_lines({}) == [] and pi_k_lines({}) == [] and coverage_line(None) is None
    base = {"uplink_bytes": 1, "uplink_formula_bytes": 1, "downlink_bytes": 1, "wall_s": 1.0, "rounds": 2}
    table = text(*summary_table(base))
    assert "rounds" in table and "PEHE" not in table and "answers from round" not in table
    # a policy without its parts: no KeyError, "n/a" where a number would stand
    p = PolicyAnswer.from_json("p", {"value_sim": 0.5})
    assert p.interval is None and p.effect is None and p.identified is None and p.value_cell == "0.500"
    assert "n/a" in text(whatif_table({"policies": {"p": {"value_sim": 0.5}}}))


# -- the texts written once ----------------------------------------------------------------------------------------
def test_the_shared_texts():
    assert interval_text(Interval(low=0.44645, high=0.54478)) == "0.446–0.545" and interval_text(None) == "n/a"
    assert interval_text(Interval(estimate=0.5)) == "n/a"
    assert PolicyAnswer.from_json("p", {"supported": False, "value_sim": 0.4}).value_cell == NOT_IDENTIFIED
    chk = HeldOutCheck(gain=-0.0071, se=0.0035, z=-2.03, verdict="worse than the constant", steps=600)
    assert chk.cell(1000) == "-0.0071 (z -2.0): worse (partial)" and chk.cell(600) == "-0.0071 (z -2.0): worse"
    assert HeldOutCheck(verdict="unavailable").cell(10) == "unavailable"
    assert HeldOutCheck(gain=0.1, z=float("nan"), verdict="shown").cell(10) == "unavailable"


def test_the_run_table_from_the_typed_answer_is_the_pinned_one(summary):
    """What ``fcd run`` prints after the run (``cli.run.execute_run``), at the golden run's ``COLUMNS=100``."""
    con = Console(width=100, file=io.StringIO(), highlight=False)
    for t in summary_table(summary, title="Fed-CausalDiff on dkt-synth"):
        con.print(t)
    con.print(coverage_line(summary["coverage"]))
    con.print(f"anchors of the paper's policies: {anchors_line(summary['anchors'])}", soft_wrap=True)
    print_answers(con, summary, "dkt-synth")
    for line in support_lines(summary):
        con.print(line)
    say_identifier(con, "run folder:", "run", indent=0)
    got = re.sub(r"wall time s\s+\S+", "wall time s <s>", con.file.getvalue())
    got = re.sub(r"downlink MB \(measured\)\s+\S+", "downlink MB (measured) <MB>", got)
    assert got == (GOLDEN / "run_table.txt").read_text()


def test_whatif_renders_the_same_from_the_typed_answer_and_from_its_json(whatif):
    ans = EvaluationAnswer.from_json(whatif)
    for render in (lambda r: text(whatif_table(r)), lambda r: text(identified_table(r)), lambda r: text(dr_table(r)),
                   lambda r: text(dr_table(r, bounds_only=True)), one_step_line, pi_k_lines, support_lines):
        assert render(ans) == render(whatif)
    lines = dict(ln.split(": ", 1) for ln in pi_k_lines(ans))
    assert lines["share_on_20"].startswith("weights from the logged propensities alone")
    table = text(whatif_table(ans))
    for name, d in whatif["policies"].items():
        assert f"{d['interval']['low']:.3f}–{d['interval']['high']:.3f}" in table
        assert f"{d['value_sim']:.3f}" in table


def _undeclared(summary: dict) -> dict:
    """The golden answer as a world without a declared unrecorded confounder would have it (``queries.declared``
    only adds the marks): no declaration, no mark."""
    plain = json.loads(json.dumps(summary))
    plain.pop("unrecorded_confounding", None)
    plain["one_step_effect"].pop("not_identified", None)
    for p in plain["policies"].values():
        for key in ("identified", "sequential_dr"):
            (p.get(key) or {}).pop("not_identified", None)
    return plain


def test_the_html_report_states_the_answers_as_fcd_whatif_does(summary, tmp_path):
    # DKT-Synth declares its hidden readiness: the report and fcd whatif say the one-step effect is not identified,
    # and print neither its estimate nor the identified table
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    doc, _facts = build_report_html(tmp_path)
    declared = EvaluationAnswer.from_json(summary)
    mark = declared.one_step.not_identified
    assert mark and escape(mark) in doc and mark in one_step_line(declared)
    assert declared.one_step.sentence("interval") not in doc and 'id="unrecorded-confounding"' in doc
    summary = _undeclared(summary)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    doc, _facts = build_report_html(tmp_path)
    ans = EvaluationAnswer.from_json(summary)
    assert ans.one_step.sentence("interval") in doc
    assert one_step_line(ans).endswith(ans.one_step.sentence("CI"))
    for name, p in ans.policies.items():
        for iv in (p.interval, p.doubly_robust, p.doubly_robust.bounded, p.identified.answer):
            assert interval_text(iv) in doc
        assert re.search(rf'<td[^>]*>{re.escape(name)}</td><td class="n"[^>]*>{re.escape(p.value_cell)}</td>', doc)
    # a policy no logged step follows: the same cell, flagged
    blind = json.loads(json.dumps(summary))
    blind["policies"]["always"]["supported"] = False
    (tmp_path / "summary.json").write_text(json.dumps(blind))
    doc, _facts = build_report_html(tmp_path)
    assert f'<span class="warn">{NOT_IDENTIFIED}</span>' in doc
    assert NOT_IDENTIFIED in text(whatif_table(blind), width=120)

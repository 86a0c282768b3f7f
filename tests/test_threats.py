"""docs/threats.md holds the attack list: every P-number the code or the tests cite has an entry there (attacker,
defence, tests), the list has no gaps, no one cites an unused number, and every test an entry names exists.

A citation is ``P<1–2 digits>`` (or a range ``P1–P18``) as a word of its own, on a line that reads as a threat
citation: it names DESIGN or threats.md, or the number sits in parentheses, a list, a ``match=`` pattern, a section
comment ``# -- P4 / P16: …`` or before a colon. ``P[n, L]``, ``P_t``, ``MP3`` or ``P100`` are not citations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREATS = ROOT / "docs" / "threats.md"
#: a threat citation: "P7", "P1–P18", "(P7, P22)", "docs/threats.md P27", "threats.md P13" (not "P[n, L]" or "P_t")
CITE = re.compile(r"(?<![A-Za-z0-9_\[])P([0-9]{1,2})(?:\s*[–-]\s*P?([0-9]{1,2}))?(?![0-9A-Za-z_\[])")


def _entries() -> dict[int, str]:
    text = THREATS.read_text(encoding="utf-8")
    parts = re.split(r"^### P([0-9]+) — ", text, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def _unused(body: str) -> bool:
    """An entry whose title is "unused number" (a skipped number kept so that no citation changes meaning)."""
    return body.split("\n", 1)[0].strip() == "unused number"


def _cited(ranges: bool = True) -> dict[int, set[str]]:
    """P-number -> the files that cite it; ``ranges=False`` leaves out the numbers only inside a range ("P1–P18")."""
    out: dict[int, set[str]] = {}
    for path in [*(ROOT / "fcd_secure").rglob("*.py"), *(ROOT / "tests").glob("*.py")]:
        if path.name == "test_threats.py":
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not re.search(r"DESIGN|threats\.md|P[0-9]{1,2}\b.*[:;,)–-]|[(,] *P[0-9]|attack|# --", line):
                continue
            for a, b in CITE.findall(line):
                lo, hi = int(a), int(b or a)
                spans = ranges and hi >= lo and hi - lo < 30
                for k in range(lo, hi + 1) if spans else {lo, hi}:
                    out.setdefault(k, set()).add(str(path.relative_to(ROOT)))
    return out


def test_the_citation_pattern_finds_citations_and_nothing_else():
    def nums(s: str) -> list[tuple[str, str]]:
        return CITE.findall(s)

    assert nums("docs/threats.md P27") == [("27", "")]
    assert nums("(P7, P22)") == [("7", ""), ("22", "")]
    assert nums("(docs/threats.md P1–P18)") == [("1", "18")]
    assert nums("# -- P4 / P16: mask quality") == [("4", ""), ("16", "")]
    assert nums('match="P10"') == [("10", "")]
    for not_a_citation in ("P[n, L]", "P_t", "MP3", "P100", "P2P", "self.P1x", "CP12"):
        assert nums(not_a_citation) == [], not_a_citation


def test_every_cited_threat_has_an_entry():
    entries, cited = _entries(), _cited()
    assert cited, "no citation found: the pattern is wrong"
    assert {1, 13, 19, 27} <= set(cited)
    missing = {k: sorted(v)[:3] for k, v in cited.items() if k not in entries}
    assert not missing, f"cited but not in docs/threats.md: {missing}"


def test_the_list_is_numbered_without_gaps_and_no_one_cites_an_unused_number():
    entries, cited = _entries(), _cited(ranges=False)  # "P1–P18" spans P11 without citing it
    assert sorted(entries) == list(range(1, max(entries) + 1)), sorted(entries)
    assert max(entries) >= 27
    unused = {k for k, body in entries.items() if _unused(body)}
    assert 11 in unused
    wrong = {k: sorted(cited[k]) for k in unused if k in cited}
    assert not wrong, f"cites an unused number: {wrong}"
    text = THREATS.read_text(encoding="utf-8")
    assert "## Open, filed as issues" in text and "P28" in text


def test_every_entry_names_an_attacker_a_defence_and_tests_or_says_why_not():
    for k, body in _entries().items():
        if _unused(body):
            continue
        assert "Attacker:" in body and "Defence:" in body and "Tests:" in body, f"P{k} lacks a part"


def test_every_test_an_entry_names_exists():
    names = set()
    for body in _entries().values():
        names |= set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", body))
    assert len(names) >= 40
    missing = []
    for file, test in sorted(names):
        path = ROOT / file
        if not path.exists():
            missing.append(f"{file} (no such file)")
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        if test not in defined:
            missing.append(f"{file}::{test}")
    assert not missing, missing


def test_p13_has_a_test():
    assert "tests/test_p13_dp_secagg.py::" in _entries()[13]

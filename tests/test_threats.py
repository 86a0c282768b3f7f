"""docs/threats.md holds the attack list: every P-number the code or the tests cite has an entry there (attacker,
defence, tests), and every test an entry names exists."""

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


def _cited() -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for path in [*(ROOT / "fcd_secure").rglob("*.py"), *(ROOT / "tests").glob("*.py")]:
        if path.name == "test_threats.py":
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not re.search(r"DESIGN|threats\.md|P[0-9]{1,2}\b.*[:;,)–-]|[(,] *P[0-9]|attack|# --", line):
                continue
            for a, b in CITE.findall(line):
                lo, hi = int(a), int(b or a)
                for k in range(lo, hi + 1 if hi >= lo and hi - lo < 30 else lo + 1):
                    out.setdefault(k, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_cited_threat_has_an_entry():
    entries, cited = _entries(), _cited()
    assert cited, "no citation found: the pattern is wrong"
    missing = {k: sorted(v)[:3] for k, v in cited.items() if k not in entries}
    assert not missing, f"cited but not in docs/threats.md: {missing}"


def test_every_entry_names_an_attacker_a_defence_and_tests_or_says_why_not():
    for k, body in _entries().items():
        if "unused number" in body:
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
        defined = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)}
        if test not in defined:
            missing.append(f"{file}::{test}")
    assert not missing, missing


def test_p13_has_a_test():
    assert "tests/test_p13_dp_secagg.py::" in _entries()[13]

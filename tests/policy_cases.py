"""Policies as the tests write them: from a rule (as a policy file states it) or as a one-rule TOML file. A plain
module beside the tests (``from policy_cases import ...``), not part of the package."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fcd_secure.data.policy import Policy, load_policy
from fcd_secure.data.spec import DataError

__all__ = ["assert_rule_refused", "policy", "rule_file"]


def policy(name: str, rule: dict[str, Any]) -> Policy:
    """A policy from its rule, as a policy file states it (``fcd_secure.data.policy``)."""
    return Policy.model_validate({"name": name, "rule": rule})


def rule_file(folder: Path, kind: str, body: str, name: str = "x") -> Path:
    """A policy file ``<name>.toml`` in ``folder`` with one rule of ``kind``, its fields the TOML lines ``body``."""
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\n[rule]\nkind = "{kind}"\n{body}\n')
    return path


def assert_rule_refused(folder: Path, kind: str, body: str, words: str) -> None:
    """Loading the policy file of a ``kind`` rule with ``body`` raises a ``DataError`` whose message says ``words``
    (a field name or the words that name the fault)."""
    with pytest.raises(DataError, match=re.escape(words)):
        load_policy(rule_file(folder, kind, body, "bad"))

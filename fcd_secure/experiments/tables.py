"""Mean ± s.d. over seeds, the cells of paper Table III ("0.057±0.010"): the one table function of the experiments.

Per-cell statistics are :func:`fcd_secure.evaluation.metrics.summarise` (sample s.d., NaN seeds counted apart);
this module only groups rows and names the columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fcd_secure.evaluation.metrics import effect_flags, summarise

__all__ = ["mean_sd_table", "skill_flags"]


def _number(v: Any) -> float:
    return math.nan if v is None else float(v)


def mean_sd_table(
    rows: Sequence[Mapping[str, Any]], by: str, metrics: Mapping[str, str] | Sequence[str]
) -> list[dict[str, Any]]:
    """Group per-seed ``rows`` by ``by`` and summarise each metric over the seeds of a group.

    Args:
        rows: one mapping per (group, seed), e.g. ``{"variant": "dss", "seed": 0, "pehe": 0.05, ...}``; a missing or
            None value counts as NaN (visible in ``<name>_n``, never silently averaged).
        by: the grouping key; groups keep the order in which they first appear.
        metrics: the columns to summarise, as ``{output name: column}`` or a list of columns (named as themselves).

    Returns:
        One dict per group: ``by`` and, per metric, ``<name>_mean``, ``<name>_sd`` (ddof = 1; 0 for one seed),
        ``<name>_n`` (finite seeds) and ``<name>_fmt`` (``"0.057±0.010"``, ``"n/a"`` when no seed is finite).
    """
    named = dict(metrics) if isinstance(metrics, Mapping) else {m: m for m in metrics}
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[by], []).append(r)
    table = []
    for key, members in groups.items():
        out: dict[str, Any] = {by: key}
        for name, col in named.items():
            s = summarise([_number(r.get(col)) for r in members])
            out.update({
                f"{name}_mean": s.mean, f"{name}_sd": s.std, f"{name}_n": s.n, f"{name}_fmt": str(s) if s.n else "n/a",
            })
        table.append(out)
    return table


def skill_flags(row: dict[str, Any]) -> list[str]:
    """The flags of a row of :func:`mean_sd_table` from its means over seeds (``EffectStats.flags`` on the means:
    ``pehe``, ``pehe0``, ``skill``); they stand where a rank by PEHE would let a model that learns nothing win."""
    return effect_flags(*(row.get(f"{k}_mean") for k in ("pehe", "pehe0", "skill")))

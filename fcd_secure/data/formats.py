"""Readers for on-disk formats that several loaders share."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from fcd_secure.errors import FcdError


class FormatError(FcdError, ValueError):
    """A file does not follow its format; the message names the file and line."""


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="ascii") if path.suffix == ".gz" else open(path, encoding="ascii")


def read_three_line(path: str | Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Read the knowledge-tracing 3-line format (DKVMN / DKT files in ../shared/data).

    Per student: line 1 ``N``; line 2 ``q_1,...,q_N`` (item/skill ids); line 3 ``r_1,...,r_N`` (0/1).
    Trailing commas (DKT original files) are tolerated. Returns ``[(q int64[N], r int64[N]), ...]`` in file order.
    """
    path = Path(path)
    with _open_text(path) as fh:
        lines = [ln.strip() for ln in fh]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) % 3:
        raise FormatError(f"{path}: {len(lines)} lines is not a multiple of 3 (3-line format)")
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for k in range(0, len(lines), 3):
        try:
            n = int(lines[k].rstrip(","))
            q = np.array([int(v) for v in lines[k + 1].split(",") if v != ""], dtype=np.int64)
            r = np.array([int(v) for v in lines[k + 2].split(",") if v != ""], dtype=np.int64)
        except ValueError as exc:
            raise FormatError(f"{path}: line {k + 1}-{k + 3}: not integers ({exc})") from None
        if len(q) != n or len(r) != n:
            raise FormatError(f"{path}: line {k + 1}: N={n} but {len(q)} ids and {len(r)} answers")
        if not np.isin(r, (0, 1)).all():
            raise FormatError(f"{path}: line {k + 3}: answers must be 0/1")
        out.append((q, r))
    return out

"""Shared by the knowledge-tracing sources (Statics2011, ASSISTments 2009): answer sequences into the schema.

Not a source itself. The 3-line files hold one student per record; a record becomes one entity, longer students
are cut into consecutive chunks of Lmax steps, T is the item presented, A its concept tag, Y correctness, and X a
baseline profile computed only from the student's answers before the chunk (no outcome inside a chunk leaks into X).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fcd_secure.data.formats import read_three_line
from fcd_secure.data.paths import need_file
from fcd_secure.data.preprocess import make_dataset, pack
from fcd_secure.data.schema import SiteDataset

__all__ = ["KT_X_NAMES", "build_kt_dataset", "read_records", "tag_map"]


def read_records(folder: Path, *files: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every student record of the 3-line ``files`` in ``folder``, file after file (train and test pooled).

    Raises:
        DataError: A file is missing (named).
    """
    return [rec for name in files for rec in read_three_line(need_file(folder / name))]


def tag_map(n_actions: int, items: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """Context id per item id, int64 [n_actions]: ``tags[j]`` for ``items[j]``, 0 for an item without a tag."""
    tag = np.zeros(n_actions, dtype=np.int64)
    tag[np.asarray(items)] = np.asarray(tags)
    return tag


KT_X_NAMES = [
    "log1p_prior_steps",
    "prior_correct_rate",
    "recent_correct_rate",
    "log1p_prior_tags",
    "no_prior_history",
]
_RECENT = 20


def build_kt_dataset(
    seqs: list[tuple[np.ndarray, np.ndarray]],
    tag_of_item: np.ndarray,
    *,
    name: str,
    max_len: int,
    action_label: str,
    tag_label: str,
    notes: list[str],
) -> SiteDataset:
    """One pooled ``SiteDataset`` of knowledge-tracing answer sequences (one entity per student record).

    Args:
        seqs: Per student ``(item ids, correctness)`` in answer order (empty records are dropped).
        tag_of_item: Context id of every item (``A_t``, da = 1, categorical); its length is |T| (item ids lie
            in ``[0, len(tag_of_item))``).
        name: Dataset name.
        max_len: Lmax; longer students are cut into consecutive chunks.
        action_label: Word for an action in ``action_names`` ("tag", "skill").
        tag_label: Name of the context column.
        notes: Modelling choices of the source, in words (the common ones are appended).

    Returns:
        The dataset; X is the baseline profile from each student's history *before* the chunk (``KT_X_NAMES``).
    """
    n_actions = len(tag_of_item)
    lens = np.array([len(q) for q, _ in seqs], dtype=np.int64)
    keep = lens > 0
    seqs = [s for s, k in zip(seqs, keep) if k]
    lens = lens[keep]
    q = np.concatenate([s[0] for s in seqs]).astype(np.int64)
    r = np.concatenate([s[1] for s in seqs]).astype(np.float64)
    student = np.repeat(np.arange(len(seqs)), lens)
    N = len(q)
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    rank = np.arange(N) - np.repeat(starts, lens)
    # baseline profile of a trajectory = the student's record *before* its first step, so a chunk's X never sees
    # the outcomes inside the chunk (no leakage of Y into X)
    cum = np.cumsum(r)
    cum_before = cum - r - np.repeat(cum[starts] - r[starts], lens)
    prior_rate = np.divide(cum_before, rank, out=np.zeros(N), where=rank > 0)
    w = np.minimum(rank, _RECENT)
    lag = np.arange(N) - w
    cum_at_lag = np.where(w > 0, cum[np.maximum(lag, 0)] - r[np.maximum(lag, 0)], 0.0)
    recent = np.divide(cum - r - cum_at_lag, w, out=np.zeros(N), where=w > 0)
    tags = tag_of_item[q]
    first_seen = ~pd.DataFrame({"s": student, "t": tags}).duplicated().to_numpy()
    cum_tags = np.cumsum(first_seen)
    prior_tags = cum_tags - first_seen - np.repeat(cum_tags[starts] - first_seen[starts], lens)
    X = np.stack(
        [np.log1p(rank), prior_rate, recent, np.log1p(prior_tags), (rank == 0).astype(np.float64)], axis=1
    )
    A = tags[:, None].astype(np.float32)
    arrays, info = pack(student, max_len, overflow="chunk", A=A, T=q, Y=r.astype(np.float32), X=X)
    meta = {
        "dataset": name,
        "x_names": KT_X_NAMES,
        "a_names": [tag_label],
        "x_continuous": [0, 1, 2, 3],
        "a_continuous": [],
        "x_categorical": {},
        "a_categorical": {0: int(tag_of_item.max()) + 1},
        "action_names": [f"{action_label} {i}" for i in range(n_actions)],
        "outcome_name": "correct",
        # A_t is a function of T_t here; a do-simulation that changes T_t should recompute A_t with this map
        "context_of_action": tag_of_item.astype(int).tolist(),
        # the tag is fixed by the item of the same step, not by earlier treatment: not endogenous; replayed (see above)
        "a_dynamics": ["exogenous"],
        **info,
        "notes": notes
        + [
            f"entities longer than {max_len} steps are cut into consecutive chunks (this reproduces Table I's "
            "sequence count closely)",
            "X = baseline profile from the student's history before the chunk: log1p(prior steps), prior correct "
            f"rate, correct rate over the last {_RECENT} prior steps, log1p(distinct prior tags), no-history flag",
            "students have no ids in the files; a student is a record's position; train and test files are pooled",
        ],
    }
    return make_dataset(arrays, n_actions, name, meta)

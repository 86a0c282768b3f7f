"""A what-if question asked of a deployed run, and each site's own record of the runs it answered (P61-P64).

A deployed run's Θs stay on the sites (paper §III, "decoupled synchronisation"), so a later question about the run
(``fcd whatif`` on a run folder of ``fcd server run``) is a new Flower run through the SuperLink: the coordinator signs
a run start (``federation.run_ticket``, P34, used once: P52) whose ``fcd-config`` text is the run's ``RunConfig``
JSON with one more top-level entry, :data:`QUESTION_KEY`: a :class:`QuestionStart` naming the run by the signed
session id of the run start that answered it, and the question itself (``queries.request.WhatIfRequest`` as its
canonical JSON). The ticket's signature covers the whole text, so the question and the run it names are the
coordinator's, as signed.

What the question is answered *with* comes from the site's own files, never from the server's say-so: when a site
answers a deployed run's final evaluation it records, under that run's signed session id (:class:`AnsweredRuns`, in
its state folder), the Θs it answered with, the SHA-256 of the Θc it received (:func:`theta_digest`), the
standardisation statistics it used and the consortium's shared behaviour model it weighted by (a run with
``evaluation.behaviour_model = "shared"`` or ``"shared_slopes"``; the slopes only in the latter: the site completes
them with its own intercepts again from its training rows). A question is answered only with that record: about a run the site has no
record of (it never answered it, P62) or whose Θs it deleted (P63), with another Θc than that run's, or with
another question in the message than the signed one (P61), the site declines under rule :data:`WHATIF_RULE`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fcd_secure._io import atomic_write_bytes, atomic_write_text, file_lock, npz_bytes, read_npz
from fcd_secure.audit.rules import Refusal

#: the ``fcd-config`` JSON entry that makes a run start a question about an earlier run
QUESTION_KEY = "fcd-whatif"
#: the rule under which a site declines a question about a deployed run (``audit.rules.REFUSAL_RULES``)
WHATIF_RULE = "whatif_run"
#: the site's record of the runs it answered (``slots/<name>`` of its state folder)
ANSWERED_SLOT = "answered_runs"
_INDEX = "index.json"
_SESSION_RE = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class QuestionStart:
    """The signed part of a question run (module docstring).

    Attributes:
        run_session: the signed session id (32 hex digits) of the run start whose final evaluation answered the
            run asked about (``run_start.json`` of its run folder, written by the coordinator).
        question: the question, ``WhatIfRequest.to_json()`` (canonical JSON).
    """

    run_session: str
    question: str

    def __post_init__(self) -> None:
        if not _SESSION_RE.match(str(self.run_session)):
            raise ValueError(f"a question names its run by a 32-hex-digit session id, not {self.run_session!r}")
        if not isinstance(self.question, str) or not self.question:
            raise ValueError("a question run carries its question")


def config_text(config_json: str, start: QuestionStart | None) -> str:
    """The ``fcd-config`` text of a run start: the ``RunConfig`` JSON, with the question when ``start`` is given."""
    if start is None:
        return config_json
    doc = json.loads(config_json)
    doc[QUESTION_KEY] = asdict(start)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def split_config_text(text: str) -> tuple[dict, QuestionStart | None]:
    """The ``RunConfig`` fields of an ``fcd-config`` text and the question it carries (None: a training run).

    Raises:
        ValueError: the text is not a JSON object, or its question entry is malformed.
    """
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("the run configuration is not a JSON object")
    raw = doc.pop(QUESTION_KEY, None)
    if raw is None:
        return doc, None
    if not isinstance(raw, dict) or set(raw) != {"run_session", "question"}:
        raise ValueError(f"run configuration entry {QUESTION_KEY!r} is not a question")
    return doc, QuestionStart(str(raw["run_session"]), str(raw["question"]))


def question_start_of(run_config: Mapping[str, object] | None, config_key: str) -> QuestionStart | None:
    """The question a run start carries under ``config_key`` (``fcd-config``), or None (a training run, or none)."""
    raw = (run_config or {}).get(config_key)
    if not raw:
        return None
    return split_config_text(str(raw))[1]


def theta_digest(theta: Mapping[str, np.ndarray]) -> str:
    """SHA-256 (hex) of a set of named arrays: each name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256(b"fcd/theta/v1\0")
    for name in sorted(theta):
        arr = np.ascontiguousarray(theta[name])
        h.update(f"{name}\0{arr.dtype.str}\0{list(arr.shape)}\0".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class AnsweredRun:
    """What a site answered one deployed run with: its Θs (None: it had not trained, the initial Θs), the digest of
    the Θc it received, the standardisation statistics (JSON text; None: the run standardised none) and the shared
    behaviour model (``SharedFitStep.to_json`` as JSON text; None: the run shared none, or the record predates it)."""

    theta_s: dict[str, np.ndarray] | None
    theta_c_sha256: str
    statistics: str | None
    behaviour: str | None = None


class AnsweredRuns:
    """A site's record of the deployed runs it answered (module docstring): ``<folder>/index.json`` (session id ->
    when, Θc digest, file) and one ``<session>.npz`` per run with its Θs. Deleting a run's ``.npz`` forgets its Θs
    (the index keeps that it answered the run, so a later question is declined as deleted, never answered with
    other parameters).

    Args:
        folder: the slot folder in the site's state (``SiteState.slot(ANSWERED_SLOT)``).
    """

    def __init__(self, folder: str | Path) -> None:
        self.dir = Path(folder)

    def path(self, session: str) -> Path:
        return self.dir / f"{session}.npz"

    def _index(self) -> dict:
        p = self.dir / _INDEX
        if not p.exists():
            return {}
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            raise Refusal(WHATIF_RULE, "record", "unreadable") from None
        if not isinstance(doc, dict):
            raise Refusal(WHATIF_RULE, "record", "unreadable")
        return doc

    def record(self, session: str, theta_s: Mapping[str, np.ndarray] | None, theta_c_sha256: str,
               statistics: str | None, behaviour: str | None = None) -> None:
        """Keep what the site answers run ``session`` with (again: the last answer of the run's session wins)."""
        if not _SESSION_RE.match(session):
            raise ValueError(f"not a session id: {session!r}")
        arrays = {f"theta_s/{k}": np.asarray(v) for k, v in (theta_s or {}).items()}
        arrays["__initial__"] = np.asarray([theta_s is None], dtype=np.uint8)
        with file_lock(self.dir / _INDEX):
            index = self._index()
            atomic_write_bytes(self.path(session), npz_bytes(arrays), mode=0o600)
            index[session] = {"recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "theta_c_sha256": theta_c_sha256, "statistics": statistics,
                              **({"behaviour": behaviour} if behaviour is not None else {})}
            atomic_write_text(self.dir / _INDEX, json.dumps(index, indent=1, sort_keys=True) + "\n")

    def load(self, session: str) -> AnsweredRun:
        """What the site answered run ``session`` with.

        Raises:
            Refusal: rule :data:`WHATIF_RULE`, key ``unknown_run`` (the site never answered that run, P62),
                ``theta_deleted`` (it did, and its Θs were deleted since, P63) or ``unreadable``.
        """
        entry = self._index().get(session)
        if entry is None:
            raise Refusal(WHATIF_RULE, "run", "unknown_run")
        p = self.path(session)
        if not p.exists():
            raise Refusal(WHATIF_RULE, "run", "theta_deleted")
        try:
            arrays = read_npz(p)
        except (OSError, ValueError):
            raise Refusal(WHATIF_RULE, "record", "unreadable") from None
        theta_s = None if bool(arrays["__initial__"][0]) else {
            k[len("theta_s/"):]: v for k, v in arrays.items() if k.startswith("theta_s/")}
        return AnsweredRun(theta_s, str(entry["theta_c_sha256"]), entry.get("statistics"), entry.get("behaviour"))


def check_question(start: QuestionStart, asked: str | None, answered: AnsweredRun, global_theta: Mapping[str, np.ndarray]) -> None:
    """Refuse a question message that is not the signed question about the run as the site answered it (P61).

    Args:
        start: the signed question (the run start's ``fcd-config``).
        asked: the question the evaluation message carries (``WhatIfRequest.to_json()``; None: none).
        answered: the site's own record of the run.
        global_theta: the Θc the message carries.

    Raises:
        Refusal: rule :data:`WHATIF_RULE`, key ``question_not_signed`` or ``theta_c_not_the_runs``.
    """
    if asked != start.question:
        raise Refusal(WHATIF_RULE, "config", "question_not_signed")
    if theta_digest(global_theta) != answered.theta_c_sha256:
        raise Refusal(WHATIF_RULE, "global", "theta_c_not_the_runs")

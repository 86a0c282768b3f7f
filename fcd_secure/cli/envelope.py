"""The one JSON contract of every ``fcd ... --json`` command, and the exit codes of the command line.

Every command given ``--json`` prints exactly one JSON object on stdout, success or error alike (the NVFLARE 2.9
CLI output contract, ``nvflare/tool/cli_output.py``, adopted for ``fcd``)::

    {"schema_version": "1", "status": "...", "exit_code": 0, "error_code": null,
     "message": "...", "hint": null, "data": {...}}

``status`` is ``"ok"`` or ``"error"`` (``fcd audit verify`` puts its verdict there: ``compliant``, ``violation``,
``unverified``, ...), ``exit_code`` is the process exit code, ``error_code`` a fixed upper-case name from
:data:`ERROR_CODES` (``null`` on success), ``data`` the command's result (``null`` on most errors). Without
``--json`` the same error is printed for people on stderr, and results on stdout.

This module is torch-free and imports nothing heavy: it is loaded for every ``fcd`` invocation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from fcd_secure.errors import FcdError

SCHEMA_VERSION = "1"

#: Exit codes shared by every command (``fcd audit verify`` adds 1/3/4/6 verdicts, documented with the command; 7 is
#: ``fcd run`` / ``fcd whatif`` answering over fewer sites than asked).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DP_BUDGET = 5
#: a finished run or question whose answers cover fewer sites than it asked (named; ``coverage`` in the JSON)
EXIT_INCOMPLETE = 7
EXIT_MODEL_ONLY = 8
EXIT_INTERRUPTED = 130

#: The closed list of error codes the command line reports (``error_code`` of the envelope), with their exit code.
ERROR_CODES: dict[str, int] = {
    "USAGE": EXIT_USAGE,  # a malformed command line, unknown option or value
    "BAD_INPUT": EXIT_USAGE,  # a file, table, spec, policy, config or folder that cannot be used (named)
    "DATA_INVALID": EXIT_FAILED,  # `fcd data validate`: the table does not match its spec (named)
    "RUN_FAILED": EXIT_FAILED,  # a run that started and could not finish (the message says where)
    "SITE_FAILED": EXIT_FAILED,  # a site reported an error (a fixed, non-secret reason) or failed its evaluation
    "DP_BUDGET_EXHAUSTED": EXIT_DP_BUDGET,  # a site refused to train: its ε budget is spent
    "INCOMPLETE_ANSWER": EXIT_INCOMPLETE,  # answers given, but over fewer sites than the run: the others are named
    "MODEL_ONLY_ANSWER": EXIT_MODEL_ONLY,  # answers given, all of them the simulator's: nothing checked by the logs
    "INTERRUPTED": EXIT_INTERRUPTED,  # stopped by a signal (Ctrl-C, SIGTERM); the state folder can be resumed
    "INTERNAL": EXIT_FAILED,  # a bug: FCD_DEBUG=1 prints the traceback
}


class CliError(FcdError, Exception):
    """An error the command line reports without a traceback (JSON envelope or ``error:`` on stderr).

    Args:
        message: what went wrong, naming the file, column, row or field where it applies.
        error_code: one of :data:`ERROR_CODES`; it fixes the exit code unless ``exit_code`` is given.
        hint: what to do about it.
        exit_code: overrides the error code's exit code (e.g. an audit verdict).
        data: structured details for ``--json`` (e.g. ``{"file": ..., "column": ..., "row": ...}``).
    """

    def __init__(
        self,
        message: str,
        error_code: str = "BAD_INPUT",
        *,
        hint: str | None = None,
        exit_code: int | None = None,
        data: Any = None,
    ) -> None:
        if error_code not in ERROR_CODES:
            raise ValueError(f"unknown error code {error_code!r}; add it to ERROR_CODES")
        super().__init__(message)
        self.message = message
        self.error_code = error_code
        self.hint = hint
        self.exit_code = ERROR_CODES[error_code] if exit_code is None else int(exit_code)
        self.data = data

    def envelope(self) -> "Envelope":
        return Envelope(
            status="error", exit_code=self.exit_code, error_code=self.error_code, message=self.message,
            hint=self.hint, data=self.data,
        )


@dataclass(frozen=True)
class Envelope:
    """One ``--json`` document (module docstring)."""

    status: str
    exit_code: int
    error_code: str | None
    message: str
    hint: str | None = None
    data: Any = None
    schema_version: str = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: d[k] for k in ("schema_version", "status", "exit_code", "error_code", "message", "hint", "data")}


def ok(data: Any, message: str = "ok") -> Envelope:
    """The envelope of a successful command."""
    return Envelope(status="ok", exit_code=EXIT_OK, error_code=None, message=message, data=data)


ENVELOPE_KEYS = frozenset(Envelope.__dataclass_fields__)

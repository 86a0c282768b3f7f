"""What a site keeps in memory between messages is what is on disk: its per-process caches re-read a file that
another process (a fresh ClientApp, another executor) replaced, and nobody can change what a cache holds."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure._io import atomic_write_bytes, npz_bytes
from fcd_secure.audit.history import ThetaSHistory


def _theta(x: float) -> dict[str, np.ndarray]:
    return {"head_s.weight": np.full((2, 3), x, dtype=np.float32)}


def test_theta_s_history_rereads_a_file_another_process_replaced(tmp_path):
    path = tmp_path / "theta_s_history.npz"
    history = ThetaSHistory(path)
    assert history.observe(_theta(1.0), keep=3) == []
    earlier = history.observe(_theta(2.0), keep=3)
    assert [v["head_s.weight"][0, 0] for v in earlier] == [1.0]
    with pytest.raises(ValueError):  # what the cache holds cannot be changed through what it returns
        earlier[0]["head_s.weight"][0, 0] = 9.0
    # another process's gate saw Θs versions 7 and 8 (newest first), replacing the file as every write does
    atomic_write_bytes(path, npz_bytes({f"{i}/head_s.weight": _theta(x)["head_s.weight"]
                                        for i, x in enumerate((8.0, 7.0))}), mode=0o600)
    seen = ThetaSHistory(path).observe(_theta(8.0), keep=3)
    assert [v["head_s.weight"][0, 0] for v in seen] == [7.0]
    seen = ThetaSHistory(path).observe(_theta(9.0), keep=1)
    assert [v["head_s.weight"][0, 0] for v in seen] == [8.0]


def test_site_state_load_is_the_files_and_the_callers_own(tmp_path):
    from fcd_secure.federation.state import SiteState

    state = SiteState(tmp_path, "site-00")
    state.commit(1, "layout", _theta(1.0), b"opt", b"rng")
    first = state.load()
    first.theta_s["head_s.weight"][:] = 5.0  # the caller's copy: the next load is the file's
    assert state.load().theta_s["head_s.weight"][0, 0] == 1.0
    # another process (a fresh ClientApp of the same site) commits round 2: this process reads it from disk
    SiteState(tmp_path, "site-00").commit(2, "layout", _theta(2.0), b"opt2", b"rng2")
    again = state.load()
    assert (again.last_round, again.theta_s["head_s.weight"][0, 0], again.optimizer_state) == (2, 2.0, b"opt2")
    state.path("site_state.npz").write_bytes(b"not a state file")  # corrupt in place: refused, not served from memory
    with pytest.raises(Exception, match="unreadable state file"):
        state.load()


def test_site_ledger_entries_are_the_files_lines_and_an_edit_is_still_refused(tmp_path):
    """``SiteLedger.entries`` parses only the lines appended since its last parse of a byte-identical prefix: its
    lines equal a fresh parse of the file after every append, and an edited earlier line is refused by number."""
    from fcd_secure.audit import SiteLedger
    from fcd_secure.audit.entries import CheckpointLine, parse_line
    from fcd_secure.audit.ledger import AuditLedgerError, read_lines

    path = tmp_path / "site_ledger.jsonl"
    ledger = SiteLedger(path, bytes(range(32)), writer_id="site-00")
    for rnd in (1, 2, 3):
        ledger.checkpoint(rnd)
        assert ledger.entries() == [parse_line(text) for _, text in read_lines(path)]
    assert [e.round for e in ledger.entries() if isinstance(e, CheckpointLine)] == [1, 2, 3]
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"x" * len(lines[1])  # line 2 edited in place, same size
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(AuditLedgerError, match="line 2 is not a ledger line"):
        ledger.entries()
    with pytest.raises(AuditLedgerError, match="line 2 is not a ledger line"):
        SiteLedger(path, bytes(range(32)), writer_id="site-00").checkpoint(4)

"""A site's SuperNode supervisor (``_flower.supernode_main``) starts its SuperNode again after the coordinator
restarts, waiting longer after each quick exit (issue 45 item 2). This file starts no process: the deployed walk
through a coordinator restart, with real Flower processes, is ``test_sites_survive_a_coordinator_restart_and_the_
evidence_stays_honest`` in ``tests/test_hospital_deployment.py`` (it shares that module's consortium).
"""

from __future__ import annotations

from fcd_secure._flower.supernode_main import BACKOFF_MAX_S, BACKOFF_S, STABLE_S, next_backoff


def test_restart_backoff_doubles_and_resets_after_a_stable_run():
    waits = [BACKOFF_S]
    for _ in range(8):
        waits.append(next_backoff(waits[-1], 1.0))
    assert waits[:3] == [1.0, 2.0, 4.0] and max(waits) == BACKOFF_MAX_S
    assert next_backoff(BACKOFF_MAX_S, STABLE_S) == BACKOFF_S

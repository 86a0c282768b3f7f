"""``fcd site start|stop|status``: the site's SuperNode and its own executor, on the pinned CA and the site's keys.

The SuperNode connects to the SuperLink over TLS verified with the CA pinned at join, authenticates with the site's
SuperNode key, launches nothing itself (``--isolation process``), and names in its node config only this site's
folder: its state, its policy, its pinned roster, and its own spec and table (``own-spec``, ``own-table``: the
ClientApp reads the site's table and nothing else, ``apps.site``). The site executor
(``engines.site_exec``) runs the site's installed ClientApp only for the app hash pinned in the site's policy.
"""

from __future__ import annotations

import json
from typing import Any

from fcd_secure.engines.deployment import executor_command, flower_env, free_port, supernode_command, supernode_env
from fcd_secure.provisioning import processes
from fcd_secure.provisioning.consortium import ProvisioningError
from fcd_secure.provisioning.site_install.home import SiteHome
from fcd_secure._flower.wake import WAKE_FILE

NODE, EXEC = "supernode", "site-exec"


def site_index(h: SiteHome) -> tuple[int, int]:
    """This site's index in the consortium (its place in the sorted roster) and the number of sites."""
    sites = sorted(json.loads(h.roster.read_text())["sites"])
    return sites.index(h.site_id), len(sites)


def start_site(h: SiteHome, *, warm: bool = True) -> dict[str, Any]:
    """Start the site's SuperNode and executor (module docstring).

    Args:
        h: the site's home (joined).
        warm: the executor keeps one warm ClientApp process for the site (``engines.site_exec``) instead of a
            cold process per message.

    Raises:
        ProvisioningError: the site has not joined, or it runs already.
    """
    cfg = h.consortium()
    if any(p["running"] for p in processes.status(h.root).values()):
        raise ProvisioningError(f"{h.root}: the site is running already (fcd site status / stop)")
    index, n = site_index(h)
    node_config = (
        f'site-id="{h.site_id}" site-index={index} num-partitions={n} state-dir="{h.state_root}" '
        f'site-policy="{h.policy}" secagg-roster="{h.roster}" own-spec="{h.spec}" own-table="{h.table}"'
    )
    runtime = free_port()
    pipe = h.root / WAKE_FILE  # the SuperNode wakes the executor through it (_flower.wake)
    node = processes.spawn(h.root, NODE, supernode_command(cfg.superlink, runtime, node_config, ca_cert=h.ca_cert,
                                                           node_key=h.node_key, secret=h.secret),
                           supernode_env(h.root / "flwr-home", n, pipe))
    ex = processes.spawn(h.root, EXEC, executor_command(runtime, h.secret, node, pipe, warm=warm),
                         flower_env(h.root / "flwr-home"))
    return {"site_id": h.site_id, "index": index, "supernode_pid": node, "executor_pid": ex, "superlink": cfg.superlink}


def site_status(h: SiteHome) -> dict[str, Any]:
    return {"site_id": h.site_id, "processes": processes.status(h.root)}


def stop_site(h: SiteHome) -> dict[str, int]:
    return processes.stop(h.root)

"""``fcd site service``: a systemd unit that runs the site (``fcd site start --foreground``) as a service.

The unit runs as a dedicated service user (default :data:`DEFAULT_USER`, never silently the user who wrote the unit:
that was root on most installations), with telemetry off, a private /tmp, no new privileges, and write access to the
site's home only (``ProtectSystem=strict`` + ``ReadWritePaths``). Two of those settings hide paths from the service:
``PrivateTmp=yes`` gives it an empty /tmp and /var/tmp of its own, so a site home or a table kept there is not there
for the service (:func:`hidden_paths` names them, and ``fcd site service`` warns).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from fcd_secure.provisioning.site_install.home import SiteHome

__all__ = ["DEFAULT_USER", "PRIVATE_TMP", "hidden_paths", "systemd_unit"]

#: the service user the unit names unless told otherwise (create it: ``useradd --system --home-dir HOME fcd-site``)
DEFAULT_USER = "fcd-site"
#: the folders ``PrivateTmp=yes`` replaces with empty private ones
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))


def hidden_paths(h: SiteHome) -> list[str]:
    """The site's paths the unit's sandbox hides (under a folder ``PrivateTmp=yes`` replaces), each with why."""
    out = []
    for what, path in (("site home", h.root), ("table", h.table)):
        if isinstance(path, str):  # a database server's URL: nothing on this disk to hide
            continue
        resolved = Path(path).resolve()
        for tmp in PRIVATE_TMP:
            if resolved == tmp or tmp in resolved.parents:
                out.append(f"the {what} {resolved} is under {tmp}, which PrivateTmp=yes hides from the service: "
                           "move it (fcd site init --home elsewhere) before installing the unit")
    return out


def systemd_unit(h: SiteHome, fcd_command: str | None = None, user: str = DEFAULT_USER) -> str:
    """The unit file text for the site at ``h``, run as ``user``."""
    fcd = fcd_command or str(Path(sys.executable).parent / "fcd")
    home = shlex.quote(str(h.root))
    return f"""[Unit]
Description=fcd_secure site {h.site_id} (Flower SuperNode + site executor)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User={user}
Environment=FLWR_TELEMETRY_ENABLED=0
Environment=FLWR_DISABLE_UPDATE_CHECK=1
ExecStartPre={fcd} site preflight --home {home}
ExecStart={fcd} site start --home {home} --foreground
Restart=on-failure
RestartSec=10
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=read-only
ReadWritePaths={h.root}
UMask=0077

[Install]
WantedBy=multi-user.target
"""

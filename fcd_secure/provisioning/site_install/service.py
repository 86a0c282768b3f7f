"""``fcd site service``: a systemd unit that runs the site (``fcd site start --foreground``) as a service.

The unit runs as the user that owns the site's home, with telemetry off, a private /tmp, no new privileges, and
write access to the site's home only (``ProtectSystem=strict`` + ``ReadWritePaths``).
"""

from __future__ import annotations

import getpass
import shlex
import sys
from pathlib import Path

from fcd_secure.provisioning.site_install.home import SiteHome


def systemd_unit(h: SiteHome, fcd_command: str | None = None, user: str | None = None) -> str:
    """The unit file text for the site at ``h``."""
    fcd = fcd_command or str(Path(sys.executable).parent / "fcd")
    user = user or getpass.getuser()
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

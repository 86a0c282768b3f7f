"""A throw-away PostgreSQL server for tests: ``initdb`` into a temporary folder, ``pg_ctl start`` on a free local
port, stopped and removed afterwards (https://www.postgresql.org/docs/current/app-initdb.html,
https://www.postgresql.org/docs/current/app-pg-ctl.html).

The server listens on 127.0.0.1 only, with password (SCRAM) authentication over TCP, so that the tests exercise
what a site's DBA sets up: a read-only role whose password the client takes from ``PGPASSWORD`` or a password file.
PostgreSQL refuses to run as root; under root the server runs as the ``postgres`` system user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ADMIN = "fcd_admin"
READER = "fcd_reader"


def postgres_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (links on the PATH followed), else the newest
    /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "pg_ctl").is_file():
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name.split(".")[0]))
    return Path(dirs[-1]) if dirs and Path(dirs[-1], "initdb").is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    folder: Path
    port: int
    admin_password: str
    reader_password: str
    bin: Path

    def url(self, user: str, database: str = "cdm", schema: str | None = None) -> str:
        tail = f"?options=-csearch_path%3D{schema}" if schema else ""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}{tail}"

    def psql(self, sql: str, database: str = "cdm") -> None:
        """Run ``sql`` as the superuser (autocommit: ``create database`` runs outside a transaction)."""
        import psycopg  # noqa: PLC0415

        with psycopg.connect(host="127.0.0.1", port=self.port, user=ADMIN, password=self.admin_password,
                             dbname=database, autocommit=True) as con:
            con.execute(sql)


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def start(bin_dir: Path) -> PgServer:
    """A running server with a superuser, a database ``cdm`` and a login role ``fcd_reader`` without grants."""
    folder = Path(tempfile.mkdtemp(prefix="fcd-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    admin_pw, reader_pw = "adm-" + os.urandom(8).hex(), "rdr-" + os.urandom(8).hex()
    pwfile = folder / "pw"
    pwfile.write_text(admin_pw + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres", "postgres")
    data, log, port = folder / "data", folder / "log", _free_port()
    subprocess.run(_as_server_user([str(bin_dir / "initdb"), "-D", str(data), "-U", ADMIN, "--pwfile", str(pwfile),
                                    "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8"]),
                   check=True, capture_output=True, timeout=120)
    pwfile.unlink()
    subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                                    "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"]),
                   check=True, capture_output=True, timeout=120)
    srv = PgServer(folder, port, admin_pw, reader_pw, bin_dir)
    try:
        srv.psql("create database cdm", database="postgres")
        srv.psql(f"create role {READER} login password '{reader_pw}'")
    except BaseException:
        stop(srv)
        raise
    return srv


def stop(srv: PgServer) -> None:
    subprocess.run(_as_server_user([str(srv.bin / "pg_ctl"), "-D", str(srv.folder / "data"), "-m", "fast", "-w",
                                    "stop"]), capture_output=True, timeout=120)
    shutil.rmtree(srv.folder, ignore_errors=True)

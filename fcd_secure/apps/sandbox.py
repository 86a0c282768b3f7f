"""The ServerApp reads only the keys it needs (docs/threats.md P35).

The coordinator's processes — the SuperLink, its executor and every ServerApp it starts — run as the coordinator's OS
user, so file permissions cannot keep a ServerApp from the coordinator's other keys: its signing key (which signs
bundles, the roster and every run start) and the SuperLink's TLS key. A ServerApp needs neither: it signs with the
server ledger's own key (``<state root>/_server/identity_ed25519.key``). So before it does anything else, a deployed
ServerApp takes away its own right to read the files the coordinator names in :data:`DENY_ENV` (``fcd server start``
names the coordinator key and the TLS key), with Linux Landlock (Linux ≥ 5.13; landlock(7)): the restriction holds
for the process and everything it starts, and cannot be lifted.

Landlock grants rights beneath paths (an allow list), so denying a few files means granting ``READ_FILE`` beneath
everything else: each sibling of each folder on the way from ``/`` down to a denied file is granted whole
(:func:`_allowed_roots`). Only reading files is restricted; writing, creating and listing are not. A file created
later directly in one of those folders (not beneath a granted sibling) cannot be read back, so the run folder is
created, and granted, before the restriction starts.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Iterable
from pathlib import Path

from fcd_secure.errors import FcdError

#: the environment variable that names, separated by ``os.pathsep``, the files a ServerApp must not read
DENY_ENV = "FCD_SERVERAPP_DENY"

#: landlock(7) on x86-64 and aarch64 (asm-generic): landlock_create_ruleset, landlock_add_rule, landlock_restrict_self
_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_ACCESS_FS_READ_FILE = 1 << 2
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38


class SandboxError(FcdError, OSError):
    """The kernel would not restrict the process (no Landlock), or a path to deny is not a file."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _call(libc, number: int, *args) -> int:
    res = libc.syscall(number, *args)
    if res < 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"landlock syscall {number}: {os.strerror(err)}")
    return res


def _allowed_roots(denied: Iterable[Path]) -> list[Path]:
    """Every path beneath which reading stays allowed: the whole tree but the denied files, as the siblings of each
    folder on the way down to them."""
    deny = {Path(p).resolve() for p in denied}
    ancestors = {a for p in deny for a in p.parents}
    out: list[Path] = []

    def walk(folder: Path) -> None:
        try:
            children = sorted(folder.iterdir())
        except OSError:
            return
        for child in children:
            if child in deny or child.is_symlink():
                continue  # a link is not granted: its target is, under its own path (a link to a folder on the way
                # to a denied file would otherwise grant that whole folder)
            if child in ancestors and child.is_dir() and not child.is_symlink():
                walk(child)
            else:
                out.append(child)

    walk(Path("/"))
    return out


def deny_reading(denied: Iterable[str | Path], also_allow: Iterable[str | Path] = ()) -> int:
    """Take away this process's right to read ``denied`` files or folders (and keep every other read), for good.

    Args:
        denied: files this process must never read.
        also_allow: folders created just now in a folder on the way to a denied file (the run folder).

    Returns:
        The number of Landlock rules.

    Raises:
        SandboxError: Landlock is not available (another OS, an old kernel, or disabled).
    """
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or platform.system() != "Linux":
        raise SandboxError(f"Landlock is not available on {platform.system()} {platform.machine()}")
    create, add_rule, restrict = numbers
    libc = _libc()
    attr = struct.pack("=Q", _ACCESS_FS_READ_FILE)
    ruleset = _call(libc, create, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    try:
        roots = [*_allowed_roots([Path(p) for p in denied]), *(Path(p) for p in also_allow)]
        for root in roots:
            try:
                fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # vanished since it was listed
            try:
                rule = struct.pack("=Qi", _ACCESS_FS_READ_FILE, fd)
                _call(libc, add_rule, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.c_char_p(rule),
                      ctypes.c_uint32(0))
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        _call(libc, restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        return len(roots)
    finally:
        os.close(ruleset)


def denied_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """The files :data:`DENY_ENV` names (empty when it is unset)."""
    raw = (os.environ if environ is None else environ).get(DENY_ENV, "")
    return [p for p in raw.split(os.pathsep) if p]

"""The ServerApp reads only the keys it needs and writes only beneath its run folder and state (docs/threats.md
P35, P50).

The coordinator's processes — the SuperLink, its executor and every ServerApp it starts — run as the coordinator's OS
user, so file permissions cannot keep a ServerApp from the coordinator's other keys: its signing key (which signs
bundles, the roster and every run start) and the SuperLink's TLS key. A ServerApp needs neither: it signs with the
server ledger's own key (``<state root>/_server/identity_ed25519.key``). So before it does anything else, a deployed
ServerApp takes away its own right to read the files the coordinator names in :data:`DENY_ENV` (``fcd server start``
names the coordinator key and the TLS key), with Linux Landlock (Linux ≥ 5.13; landlock(7)): the restriction holds
for the process and everything it starts, and cannot be lifted.

Landlock grants rights beneath paths (an allow list), so denying a few files means granting ``READ_FILE`` beneath
everything else: each sibling of each folder on the way from ``/`` down to a denied file is granted whole
(:func:`_allowed_roots`). A file created later directly in one of those folders (not beneath a granted sibling)
cannot be read back, so the run folder is created, and granted, before the restriction starts.

Writing is restricted the other way round (P50): every right that changes the file system — writing or truncating a
file, creating, removing, renaming or linking anything (landlock(7): ``WRITE_FILE``, ``REMOVE_*``, ``MAKE_*``,
``REFER``, ``TRUNCATE``) — is granted only beneath the folders the ServerApp writes (its run folder, the server state,
a private temporary folder) and on ``/dev/null``. Without it, a ServerApp could write the environment's
site-packages (a ``.pth`` file planted there ran in the next ordinary ``fcd`` command, as the coordinator, and read
the signing key), rename the signing key or rewrite the coordinator's folder. Listing and executing stay allowed.
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
#: landlock(7) rights that change the file system, with the ABI version that introduced each
_WRITE_FILE, _TRUNCATE = 1 << 1, 1 << 14
_WRITE_RIGHTS = {
    1: _WRITE_FILE | sum(1 << b for b in range(4, 13)),  # REMOVE_DIR, REMOVE_FILE, MAKE_CHAR .. MAKE_SYM
    2: 1 << 13,  # REFER: link or rename a file into another folder
    3: _TRUNCATE,
}
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
#: files, not folders, a confined process may write: a rule on a file may hold only file rights
WRITABLE_FILES = ("/dev/null",)


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


def abi_version() -> int:
    """The Landlock ABI version of the running kernel (landlock(7)), or 0 when there is none."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or platform.system() != "Linux":
        return 0
    res = _libc().syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(res), 0)


def confine(denied: Iterable[str | Path], writable: Iterable[str | Path], also_allow: Iterable[str | Path] = ()) -> int:
    """Take away, for good, this process's right to read ``denied`` files and to change the file system anywhere but
    beneath ``writable`` folders and :data:`WRITABLE_FILES` (module docstring); every other read is kept.

    Args:
        denied: files this process must never read.
        writable: the folders it writes (run folder, server state, its temporary folder); they must exist.
        also_allow: folders created just now in a folder on the way to a denied file (the run folder): readable.

    Returns:
        The number of Landlock rules.

    Raises:
        SandboxError: Landlock is not available (another OS, an old kernel, or disabled).
    """
    numbers = _SYSCALLS.get(platform.machine())
    abi = abi_version()
    if numbers is None or abi < 1:
        raise SandboxError(f"Landlock is not available on {platform.system()} {platform.machine()} {platform.release()}")
    create, add_rule, restrict = numbers
    write = sum(bits for version, bits in _WRITE_RIGHTS.items() if version <= abi)
    file_write = write & (_WRITE_FILE | _TRUNCATE)
    libc = _libc()
    attr = struct.pack("=Q", _ACCESS_FS_READ_FILE | write)
    ruleset = _call(libc, create, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    writable = [Path(p) for p in writable]
    rules = [*((root, _ACCESS_FS_READ_FILE) for root in _allowed_roots([Path(p) for p in denied])),
             *((Path(p), _ACCESS_FS_READ_FILE) for p in also_allow),
             *((p, _ACCESS_FS_READ_FILE | write) for p in writable),
             *((Path(p), _ACCESS_FS_READ_FILE | file_write) for p in WRITABLE_FILES)]
    try:
        for root, access in rules:
            try:
                fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                if root in writable:
                    raise SandboxError(f"{root}: a folder the ServerApp writes is missing") from None
                continue  # vanished since it was listed
            try:
                if access & ~(_ACCESS_FS_READ_FILE | file_write) and not os.path.isdir(root):
                    access &= _ACCESS_FS_READ_FILE | file_write  # a file: only file rights (else EINVAL)
                rule = struct.pack("=Qi", access, fd)
                _call(libc, add_rule, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.c_char_p(rule),
                      ctypes.c_uint32(0))
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        _call(libc, restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        return len(rules)
    finally:
        os.close(ruleset)


def denied_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """The files :data:`DENY_ENV` names (empty when it is unset)."""
    raw = (os.environ if environ is None else environ).get(DENY_ENV, "")
    return [p for p in raw.split(os.pathsep) if p]

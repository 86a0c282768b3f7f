"""Private file I/O every layer shares: atomic writes, inter-process locks, secrets created once with mode 0600.

Bottom of the package (no project imports). Three promises the rest of the code relies on:

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: a reader (or a process killed mid-write) sees the old
  file or the new one, never half of one (temp file in the same folder, ``fsync``, ``os.replace``, ``fsync`` of
  the folder);
* :func:`file_lock`: one exclusive inter-process lock per protected file (``filelock``), for read-modify-write
  cycles of ledgers shared by several processes (Flower runs a site's ClientApp in a Ray actor or a fresh
  process per message);
* :func:`load_or_create_secret`: key material is created from the OS CSPRNG with ``O_EXCL`` and mode 0600, and a
  file of the wrong size is an error, never silently replaced;
* :func:`file_sha256`: the one hash of a file's bytes (checksums of shipped weights, a site's table, a bundle);
* :class:`FolderPath`: a folder layout written as a table (``pinned = FolderPath("root", "consortium")``);
* :func:`jsonable`: the one sanitiser of everything the project writes as JSON (``summary.json``, what-if answers,
  the reproduction's tables, the CLI's ``--json`` envelope): NaN and ±inf become ``null``, never a non-standard
  ``NaN`` token.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, Hashable, TypeVar, overload

from filelock import FileLock
from fcd_secure.errors import FcdError

__all__ = [
    "FolderPath",
    "Kept",
    "arrays_sha256",
    "SecretFileError",
    "atomic_write_bytes",
    "atomic_write_text",
    "file_lock",
    "fsync_dir",
    "drop_none",
    "file_sha256",
    "jsonable",
    "load_or_create_secret",
    "npz_bytes",
    "read_npz",
]


class SecretFileError(FcdError, RuntimeError):
    """A key or secret file exists but cannot be used (wrong size, unreadable)."""


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename inside ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename itself is still atomic
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically; ``mode`` (e.g. ``0o600``) is set before the file becomes visible."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


@contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Exclusive inter-process lock guarding ``path`` (held on the sibling ``<path>.lock``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        yield


def load_or_create_secret(
    path: str | os.PathLike[str], nbytes: int = 32, *, make: Callable[[], bytes] | None = None
) -> bytes:
    """The secret at ``path``, created on first use (mode 0600, ``O_EXCL``) by ``make()`` or ``nbytes`` random bytes.

    Raises:
        SecretFileError: the file exists with another size than ``nbytes``, or cannot be read.
    """
    path = Path(path)
    with file_lock(path):
        if not path.exists():
            data = make() if make is not None else secrets.token_bytes(nbytes)
            if len(data) != nbytes:
                raise SecretFileError(f"{path}: generated secret has {len(data)} bytes, expected {nbytes}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(path.parent)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SecretFileError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) != nbytes:
        raise SecretFileError(f"{path}: expected {nbytes} bytes, found {len(data)}")
    return data


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks (``hashlib.file_digest``, Python docs: never the whole file in
    memory)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_identity(path: str | os.PathLike[str]) -> tuple[str, int, int, int, int, int]:
    """``(resolved path, device, inode, size, mtime_ns, ctime_ns)`` of a file (``os.stat``, Python docs): what a
    per-process cache of something read from the file keys on, so a file replaced (new inode), rewritten (new size,
    modification and change times) or moved to the path is read again. Cheaper than hashing the bytes; like
    ``make`` and Python's bytecode cache it cannot see a same-size rewrite within the file system's timestamp
    granularity that also keeps the inode.

    Raises:
        OSError: the file cannot be stat'ed (missing: ``FileNotFoundError``).
    """
    resolved = Path(path).resolve()
    st = resolved.stat()
    return str(resolved), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def arrays_sha256(head: str, arrays) -> str:
    """SHA-256 of ``head`` and of each array's dtype, shape and bytes (C order): a key that names the numbers
    themselves, for a per-process cache of what is a pure function of them (:class:`Kept`)."""
    import numpy as np  # noqa: PLC0415

    h = hashlib.sha256(head.encode())
    for arr in arrays:
        a = np.ascontiguousarray(arr)
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Kept(Generic[K, V]):
    """A per-process memo of at most ``size`` entries, the oldest dropped first: for what a site recomputes on every
    message although it is a pure function of its key (the key must name every input, so an entry is only ever
    served for the same inputs)."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._entries: dict[K, V] = {}

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The entry of ``key``, made by ``make()`` and kept where there is none."""
        if key in self._entries:
            return self._entries[key]
        value = make()
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = value
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class FileKept(Generic[V]):
    """A per-process memo of what was read from each of at most ``size`` files, served while the file's
    :func:`file_identity` is the one it had when it was read: for a file a site reads on every message and rewrites
    only by replacing it (:func:`atomic_write_bytes`: a new inode), so what another process wrote is always read
    from disk. One entry per path: a replaced file's old content is dropped, not kept beside the new one.

    The identity is taken before ``read`` runs: a file replaced in between is kept under its old identity and read
    again at the next call.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._entries: dict[str, tuple[tuple, V]] = {}

    def get(self, path: str | os.PathLike[str], read: Callable[[], V]) -> V:
        """What ``read()`` returned for ``path`` at its current identity, read now where nothing is kept.

        Raises:
            OSError: ``path`` cannot be stat'ed; whatever ``read`` raises.
        """
        identity = file_identity(path)
        kept = self._entries.get(identity[0])
        if kept is not None and kept[0] == identity:
            return kept[1]
        value = read()
        self.put(path, value, identity)
        return value

    def put(self, path: str | os.PathLike[str], value: V, identity: tuple | None = None) -> None:
        """Keep ``value`` as what ``path`` holds now (its writer, right after the write)."""
        identity = identity if identity is not None else file_identity(path)
        self._entries.pop(identity[0], None)
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[identity[0]] = (identity, value)

    def clear(self) -> None:
        self._entries.clear()


class FolderPath:
    """A path of a folder layout, declared as a class attribute: ``FolderPath("root", "state")`` reads
    ``Path(obj.root) / "state"`` on an instance, so a layout class is a table of its files rather than one property
    each (a read-only descriptor, Python docs, "Descriptor Guide"). The base may itself be a ``FolderPath``
    (``bundle = FolderPath("pinned", "bundle.json")``)."""

    def __init__(self, base: str, *parts: str) -> None:
        self.base, self.parts = base, parts

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "FolderPath": ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Path: ...
    def __get__(self, obj: Any, owner: type | None = None) -> "Path | FolderPath":
        if obj is None:
            return self
        return Path(getattr(obj, self.base)).joinpath(*self.parts)


def npz_bytes(arrays: dict) -> bytes:
    """``np.savez`` of ``arrays`` into bytes (for :func:`atomic_write_bytes`)."""
    import numpy as np  # noqa: PLC0415 - numpy is only needed by the callers that write arrays

    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def read_npz(path: str | os.PathLike[str]) -> dict:
    """Every array of an ``.npz`` file (no pickles); ``OSError``/``ValueError`` propagate to the caller."""
    import numpy as np  # noqa: PLC0415

    with np.load(Path(path), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def jsonable(x):
    """``x`` with everything JSON cannot hold replaced: dict keys as strings; lists, tuples and numpy arrays as lists;
    a non-finite float (Python or numpy) as ``None`` (JSON has no NaN; ``null`` reads as "not available"); a numpy
    scalar as its Python value; a path as its string; any other object with a ``tolist()`` (a pandas series, a torch
    tensor) as what that returns. Anything else is returned as it is (``json.dumps`` then decides). numpy is imported
    only if ``x`` holds numpy values (this module stays at the bottom, numpy-free).

    The one sanitiser of the four that were (``summary.json`` and ``rounds.json``, what-if answers, the reproduction's
    tables, the CLI envelope): for every value those files held they agree. Where they differed it is the widest:
    the CLI's also took ``tolist()`` and paths (the others raised ``TypeError`` on them, so none of their files held
    one), the others also turned a non-finite numpy value that is not a ``float64`` (a ``float32`` NaN, a NaN in an
    array) into ``null``, where the CLI wrote a non-standard ``NaN`` token against its own rule."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    if type(x).__module__ == "numpy":
        import numpy as np  # noqa: PLC0415

        if isinstance(x, np.ndarray):
            return jsonable(x.tolist())
        if isinstance(x, np.generic):
            return jsonable(x.item())
    if callable(getattr(x, "tolist", None)):
        return jsonable(x.tolist())
    return x


def drop_none(d):
    """``d`` without its ``None`` values, in nested dicts and lists too (TOML has no null: a key left out means the
    default)."""
    if isinstance(d, dict):
        return {k: drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, (list, tuple)):
        return [drop_none(v) for v in d]
    return d

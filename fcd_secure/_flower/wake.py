"""A site's SuperNode wakes the site's executor when a message arrives, so that the executor need not poll.

Flower 1.42's SuperExec finds work by polling the SuperNode's Runtime API (``AcquireTask``, one HTTP request every
0.1 s). Each poll costs both processes a few milliseconds of CPU (4.8 ms on the executor's side alone, measured with
cProfile on loopback), which is nothing for one site on its own machine but 1.3 of 2 cores for ten idle sites on one
host, where it starved the rounds themselves. So the SuperNode (``_flower.supernode_main``) writes one byte to a
named pipe in the site's home after it has stored a message and its objects, and the executor
(``engines.site_exec``) waits on that pipe, acquiring at once when woken and otherwise only every
:data:`FALLBACK_POLL_S`. The byte carries nothing: a wake-up that is lost or forged costs one ``AcquireTask`` call,
and the task itself is still acquired with the site's secret.
"""

from __future__ import annotations

import errno
import os
import select
import stat
from pathlib import Path
from fcd_secure.errors import FcdError

#: the environment variable that names the pipe to the SuperNode (its own arguments are Flower's)
WAKE_ENV = "FCD_EXEC_WAKE"
#: the pipe's name in a site's folder
WAKE_FILE = "exec.wake"
#: how often the executor still asks for a task when no wake-up came (a safety net, not the path tasks take)
FALLBACK_POLL_S = 1.0


class WakeError(FcdError, RuntimeError):
    """The wake-up pipe's path holds something that is not a pipe."""


def notify(path: str | os.PathLike) -> None:
    """Wake the executor reading ``path``; a missing pipe, an absent reader or a full pipe are not errors (the
    executor's fallback poll finds the task)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENXIO):
            return
        raise
    try:
        os.write(fd, b"\0")
    except BlockingIOError:
        pass  # thousands of unread wake-ups: the reader will wake anyway
    finally:
        os.close(fd)


class WakeReader:
    """The executor's end: :meth:`wait` returns when woken or after ``timeout_s``.

    Args:
        path: the pipe (created 0600 if absent).

    Raises:
        WakeError: ``path`` exists and is not a named pipe.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            os.mkfifo(self.path, 0o600)
        except FileExistsError:
            if not stat.S_ISFIFO(self.path.lstat().st_mode):
                raise WakeError(f"{self.path}: exists and is not a named pipe; remove it and start the site again") from None
        # opened read-write, so the pipe never reads as closed while no SuperNode holds it open (no EOF spin)
        self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a wake-up; True when one came (all pending ones are consumed)."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, float(timeout_s)))
        if not ready:
            return False
        try:
            while os.read(self._fd, 4096):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        os.close(self._fd)

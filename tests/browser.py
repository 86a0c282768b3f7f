"""A real headless Chromium driven over the Chrome DevTools Protocol (CDP) through ``--remote-debugging-pipe``.

The pipe transport (https://chromedevtools.github.io/devtools-protocol/, "--remote-debugging-pipe": JSON messages
separated by a NUL byte, read by the browser on fd 3 and written on fd 4) needs no websocket client and no port.
The browser runs with the network off (a proxy nobody listens on). ``Runtime.evaluate`` runs in the page as the
DevTools console does, which the page's Content-Security-Policy does not govern, so a test can measure a page that
forbids every script of its own.

``chromium()`` is the browser on PATH or ``None``; tests skip with the reason when it is absent (``.ci/run``
installs it where apt can).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


MOBILE = True


def chromium() -> str | None:
    """The Chromium binary on PATH (Debian's ``chromium``), or ``None``."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium; :meth:`open` a page at a window size, :meth:`js` to evaluate in it."""

    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()
        self._profile = tempfile.TemporaryDirectory(prefix="fcd-chromium-")

        def fds() -> None:  # in the child: the pipe's ends on fds 3 and 4, where Chromium expects them
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            for fd in (3, 4):  # dup2 onto itself (a free 3 or 4) is a no-op that keeps os.dup's close-on-exec
                os.set_inheritable(fd, True)  # every other fd Python opened is not inherited (PEP 446)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--proxy-server=127.0.0.1:9", "--no-first-run", f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False,
            preexec_fn=fds,  # close_fds=False: subprocess would close 3 and 4 after preexec_fn otherwise
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self._events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        want = self._id
        while True:
            m = self._next()
            if m.get("id") == want:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self._events.append(m)

    def _next(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buf:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, page: Path, width: int, height: int = 900) -> None:
        """Load ``page`` (a file) in a fresh tab of ``width`` × ``height`` CSS pixels and wait for its load event."""
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._send("Page.enable", session=self.session)
        self._send("Emulation.setDeviceMetricsOverride",
                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": MOBILE and width < 600},
                   session=self.session)
        self._events.clear()
        self._send("Page.navigate", {"url": page.resolve().as_uri()}, session=self.session)
        deadline = time.monotonic() + self.timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{page}: no load event")
            self._events.append(self._next())
        time.sleep(0.3)  # the one frame after load (an onerror handler of a broken image, a late layout)

    def js(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the open page."""
        res = self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                         session=self.session)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:80]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def close(self) -> None:
        try:
            self._send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

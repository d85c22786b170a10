"""A headless Chromium for tests: open pages at a given screen size and measure them.

It speaks the DevTools protocol over ``--remote-debugging-pipe`` (the browser reads
commands on its file descriptor 3 and answers on 4, each message JSON ended by a NUL
byte), so it needs nothing beyond the ``chromium`` program. The network is off: every
host name resolves to nothing and every request goes to a proxy that is not there, so
a page looks as it does to a reader behind a firewall.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

TIMEOUT = 60.0
"""Seconds to wait for any one answer from the browser."""

NETWORK_OFF = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]


def find_chromium() -> str | None:
    """Return the path of the browser: ``$CHROMIUM``, or ``chromium`` on ``PATH``."""
    return shutil.which(os.environ.get("CHROMIUM", "chromium"))


class Browser:
    """One tab of a headless Chromium, driven over the DevTools pipe."""

    def __init__(self, send: BinaryIO, receive: BinaryIO) -> None:
        self._send = send
        self._receive = receive
        self._buffer = b""
        self._events: list[str] = []  # the events seen since the last navigation
        self._id = 0
        self._session: str | None = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable")

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if not select.select([self._receive], [], [], TIMEOUT)[0]:
                raise TimeoutError(f"chromium did not answer in {TIMEOUT} s")
            chunk = self._receive.read(1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        result: dict[str, Any] = json.loads(message)
        return result

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command (to the tab, once attached) and return its result."""
        self._id += 1
        command: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self._session is not None:
            command["sessionId"] = self._session
        self._send.write(json.dumps(command).encode() + b"\0")
        while True:
            message = self._message()
            if "method" in message:
                self._events.append(message["method"])
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def _wait_for(self, event: str) -> None:
        while event not in self._events:
            self._events.append(self._message().get("method", ""))

    def open(self, url: str, width: int, height: int, *, mobile: bool = False) -> None:
        """Show ``url`` on a screen ``width`` x ``height`` CSS pixels; wait for its fonts."""
        self.resize(width, height, mobile=mobile)
        self._events.clear()
        self.call("Page.navigate", url=url)
        self._wait_for("Page.loadEventFired")
        self.evaluate("document.fonts.ready.then(() => true)")

    def resize(self, width: int, height: int, *, mobile: bool = False) -> None:
        """Make the screen ``width`` x ``height`` CSS pixels; the page stays and lays out
        again, as when a reader resizes the window (its media queries follow)."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    def evaluate(self, expression: str) -> Any:
        """Return the value of a JavaScript expression (a promise is awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        """Write a PNG of the screen (or of the whole page) to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "scale": 1, **size}
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))


@contextmanager
def chromium(executable: str) -> Iterator[Browser]:
    """Start a headless Chromium with the network off; yield a `Browser` on one tab."""
    to_browser_read, to_browser_write = os.pipe()
    from_browser_read, from_browser_write = os.pipe()

    def plumb() -> None:  # in the child: the pipes' ends on descriptors 3 and 4
        read = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 10)
        write = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 10)
        os.dup2(read, 3)
        os.dup2(write, 4)

    with tempfile.TemporaryDirectory() as profile:
        command = [executable, "--headless", "--remote-debugging-pipe", "--no-sandbox"]
        command += ["--disable-gpu", f"--user-data-dir={profile}"]
        command += ["--no-first-run", "--no-default-browser-check", *NETWORK_OFF]
        process = subprocess.Popen(
            [*command, "about:blank"],
            preexec_fn=plumb,  # the tests start no threads around it
            close_fds=False,  # 3 and 4 stay open; the others are close-on-exec
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        try:
            with (
                os.fdopen(to_browser_write, "wb", buffering=0) as send,
                os.fdopen(from_browser_read, "rb", buffering=0) as receive,
            ):
                yield Browser(send, receive)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

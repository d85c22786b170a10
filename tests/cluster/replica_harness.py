"""Replicas as OS processes (``replica.py``) for the cluster end-to-end tests, and a small
fenced database they write to.

A test starts replicas with ``open_replicas``, sends them commands and waits for their
records (JSON lines on their stdout, times on the system-wide ``time.monotonic()``).
Waits are for records, never sleeps; each wait is bounded (``WAIT``) so a broken
hand-over fails with the replica's records and log instead of hanging.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from trio_taskvisor._config import RedisSlotStore

REPLICA = Path(__file__).with_name("replica.py")
WAIT = 10.0  # seconds: the bound of one wait, far above any liveness bound of a test

Record = dict[str, Any]


class ReplicaProcess:
    """One replica process: its commands, its records, its log (stderr)."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdin is not None
        assert popen.stdout is not None
        assert popen.stderr is not None
        self.name = name
        self.popen = popen
        self.pid = popen.pid
        self.records: list[Record] = []
        self.log = b""
        self.instance = ""
        self.ended = False  # its stdout closed, or it reported "closed"
        self.killed = False
        self._changed = trio.Event()
        # The readers run until the replica is detached, whatever the test cancels: its
        # records are needed to close it for the next test.
        self._readers = trio.CancelScope(shield=True)
        self._stdin = trio.lowlevel.FdStream(os.dup(popen.stdin.fileno()))
        self._stdout = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
        self._stderr = trio.lowlevel.FdStream(os.dup(popen.stderr.fileno()))

    def __repr__(self) -> str:
        return f"<replica {self.name} pid={self.pid}>"

    # -- commands ----------------------------------------------------------------------------

    async def send(self, op: str, **fields: Any) -> None:
        await self._send_line({"op": op, **fields})

    async def _send_line(self, data: dict[str, Any]) -> None:
        await self._stdin.send_all((json.dumps(data) + "\n").encode())

    async def submit(self, wid: str, slot: str, policy: str = "queue", **body: Any) -> None:
        """Submit work ``wid``; wait until the replica's ``submit`` call returned."""
        await self.send("submit", id=wid, slot=slot, policy=policy, **body)
        await self.wait_for("submitted", id=wid)

    async def cluster_slot(self, slot: str) -> Record:
        """Ask the replica's ``sup.cluster_slot(slot)``; return its answer."""
        seen = len(self.of("info", slot=slot))
        await self.send("cluster_slot", slot=slot)
        return await self.wait_for("info", slot=slot, count=seen + 1)

    def kill(self) -> None:
        self.killed = True
        self.popen.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.popen.send_signal(signal.SIGCONT)

    # -- records ------------------------------------------------------------------------------

    def of(self, ev: str, **fields: Any) -> list[Record]:
        """The records ``ev`` whose ``fields`` match, in arrival order."""
        return [
            r
            for r in self.records
            if r["ev"] == ev and all(r.get(k) == v for k, v in fields.items())
        ]

    def event(self, kind: str, **fields: Any) -> list[Record]:
        """The ``event`` records of event kind ``kind`` (an ``EventKind`` value)."""
        return self.of("event", kind=kind, **fields)

    async def wait_for(self, ev: str, *, count: int = 1, **fields: Any) -> Record:
        """The ``count``-th record ``ev`` matching ``fields``, waiting for it."""
        return await self.wait_until(lambda: _nth(self.of(ev, **fields), count), f"{ev} {fields}")

    async def wait_event(self, kind: str, **fields: Any) -> Record:
        """The first ``event`` record of kind ``kind`` matching ``fields``."""
        return await self.wait_for("event", kind=kind, **fields)

    async def wait_until(self, found: Callable[[], Record | None], what: str) -> Record:
        with trio.move_on_after(WAIT):
            while True:
                record = found()
                if record is not None:
                    return record
                if self.ended:
                    break
                await self._changed.wait()
        raise AssertionError(f"{self.name}: no {what} within {WAIT} s\n{self.describe()}")

    def describe(self) -> str:
        records = "\n".join(json.dumps(r) for r in self.records[-40:])
        return f"records:\n{records}\nlog:\n{self.log.decode(errors='replace')[-4000:]}"

    def _add(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            record = json.loads(line)
        except ValueError:
            self.log += b"stdout: " + line + b"\n"
            return
        self.records.append(record)
        if record["ev"] == "ready":
            self.instance = record["instance"]
        elif record["ev"] == "closed":
            self.ended = True
        self._changed.set()
        self._changed = trio.Event()

    async def _read(self) -> None:
        with self._readers:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_stderr)
                await self._read_stdout()
                await trio.sleep_forever()  # the log, until detached

    async def _read_stdout(self) -> None:
        """Read records until the replica closed: what follows is the next test's."""
        buffer = b""
        while not self.ended and (chunk := await self._stdout.receive_some()):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self._add(line)
        self.ended = True  # waits give up
        self._changed.set()

    async def _read_stderr(self) -> None:
        while chunk := await self._stderr.receive_some():
            self.log += chunk

    async def _recycle(self) -> bool:
        """Close the replica's supervisor for the next test; return whether it closed (a
        killed replica, or one that does not close in time, is killed instead)."""
        if self.killed or self.popen.poll() is not None:
            return False
        self.resume()  # a no-op unless the test left it paused
        if not self.ended:
            with trio.move_on_after(WAIT):
                await self.send("exit")
                while not self.ended:
                    await self._changed.wait()
        return bool(self.of("closed"))

    async def _detach(self) -> None:
        for stream in (self._stdin, self._stdout, self._stderr):
            await stream.aclose()


def _nth(records: list[Record], count: int) -> Record | None:
    return records[count - 1] if len(records) >= count else None


def replica_config(store: RedisSlotStore, **overrides: Any) -> dict[str, Any]:
    return {
        "url": store.url,
        "namespace": store.namespace,
        "lease_ttl": store.lease_ttl,
        "connect_timeout": store.connect_timeout,
        "replicas_ack": store.replicas_ack,
        "replicas_ack_timeout": store.replicas_ack_timeout,
        **overrides,
    }


class _Pool:
    """Replica processes, started ahead of time and reused: a replica's interpreter start
    and imports take about a second of CPU (several seconds on a loaded machine), a test
    with replicas takes well under one. A replica that closed cleanly waits for the next
    test; a killed one is replaced."""

    SPARE = 3

    def __init__(self) -> None:
        self._idle: deque[subprocess.Popen[bytes]] = deque()
        atexit.register(self.close)

    def fill(self) -> None:
        """Start replicas until ``SPARE`` are idle (they start while tests run)."""
        while len(self._idle) < self.SPARE:
            self._idle.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop("PYTHONWARNINGS", None)
        return subprocess.Popen(
            [sys.executable, str(REPLICA)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    def take(self, count: int) -> list[subprocess.Popen[bytes]]:
        return [self._idle.popleft() if self._idle else self._spawn() for _ in range(count)]

    def give_back(self, popen: subprocess.Popen[bytes]) -> None:
        self._idle.append(popen)

    def discard(self, popen: subprocess.Popen[bytes]) -> None:
        _kill(popen)
        self.fill()

    def close(self) -> None:
        while self._idle:
            _kill(self._idle.popleft())


def _kill(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGCONT)
        popen.kill()
    popen.wait()
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()


_pool = _Pool()
_pool.fill()  # at collection: the first replicas start while the earlier tests run


@asynccontextmanager
async def open_replicas(
    store: RedisSlotStore, *names: str, **config: Any
) -> AsyncIterator[list[ReplicaProcess]]:
    """Configure one replica per name with ``store`` (and ``config``'s overrides); wait
    until each is ready. At the end each replica closes its supervisor for the next test
    (or is killed, if the test killed it or it does not close in time)."""
    replicas = [ReplicaProcess(n, p) for n, p in zip(names, _pool.take(len(names)), strict=True)]
    closed = [False] * len(replicas)
    try:
        async with trio.open_nursery() as nursery:
            for replica in replicas:
                nursery.start_soon(replica._read)
                await replica._send_line(replica_config(store, **config))
            try:
                for replica in replicas:
                    await replica.wait_for("ready")
                yield replicas
            finally:
                with trio.CancelScope(shield=True):
                    closed = [await replica._recycle() for replica in replicas]
                for replica in replicas:
                    replica._readers.cancel(reason="the replica is detached")
    finally:
        with trio.CancelScope(shield=True):
            for replica, reusable in zip(replicas, closed, strict=True):
                await replica._detach()
                if reusable:
                    _pool.give_back(replica.popen)
                else:
                    _pool.discard(replica.popen)


async def close(*replicas: ReplicaProcess) -> None:
    """Ask each replica to shut down gracefully; wait until each has closed."""
    for replica in replicas:
        await replica.send("exit")
    for replica in replicas:
        await replica.wait_for("closed")


# -- a fenced database -------------------------------------------------------------------------


class FencedDatabase:
    """A store that refuses a write whose fence token is lower than the highest it has
    seen (the replicas write to it over TCP: ``"<token> <writer>\\n"`` -> ``ok`` /
    ``refused``). Its log keeps every attempt: ``(token, writer, accepted)``."""

    def __init__(self) -> None:
        self.highest = 0
        self.log: list[tuple[int, str, bool]] = []
        self.port = 0

    def write(self, token: int, writer: str) -> bool:
        accepted = token >= self.highest
        if accepted:
            self.highest = token
        self.log.append((token, writer, accepted))
        return accepted

    def writes(self, writer: str) -> list[tuple[int, bool]]:
        return [(token, accepted) for token, who, accepted in self.log if who == writer]

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        data = b""
        async with stream:
            while not data.endswith(b"\n"):
                chunk = await stream.receive_some()
                if not chunk:
                    return
                data += chunk
            token, _, writer = data.decode().strip().partition(" ")
            accepted = token != "None" and self.write(int(token), writer)
            await stream.send_all(b"ok\n" if accepted else b"refused\n")

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(self._serve_one, listeners, handler_nursery=nursery)

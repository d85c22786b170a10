"""Helpers of the cluster tests: call the scripts directly, read an instance's messages,
open supervisors with a slot store (``replica``) and the bodies their tests submit."""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import coredis
import pytest
import trio
from coredis.retry import NoRetryPolicy
from redis_server import RedisServer

from trio_taskvisor import (
    ControllerConfig,
    SlotStoreUnavailableError,
    Supervisor,
    SupervisorConfig,
    TaskSpec,
    open_supervisor,
)
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._clusterslots import ClusterSlotMachine
from trio_taskvisor._config import RedisSlotStore
from trio_taskvisor._keeper import LeaseKeeper, Report, ServerClient
from trio_taskvisor._redis_client import RedisClient
from trio_taskvisor.testing import EventRecorder

R = TypeVar("R")


class Scripts:
    """The cluster scripts of one namespace, called one at a time (raw replies)."""

    def __init__(self, client: coredis.Redis[str], store: RedisSlotStore) -> None:
        self.client = client
        self.store = store
        self.prefix = store.key_prefix
        self._common = scripts.common_args(store.key_prefix, store.lease_ttl, store.keep)

    async def call(self, script: scripts.Script, *args: str | int) -> Any:
        try:
            return await self.client.evalsha(script.sha, [], [*self._common, *map(str, args)])
        except coredis.exceptions.NoScriptError:
            await self.client.script_load(script.source)
            return await self.client.evalsha(script.sha, [], [*self._common, *map(str, args)])

    async def submit(
        self,
        slot: str,
        entry: str,
        policy: str = "queue",
        *,
        max_queue: int = 100,
        watch: bool = False,
    ) -> Any:
        return await self.call(
            scripts.SUBMIT, *scripts.submit_args(slot, entry, policy, max_queue, watch)
        )

    async def claim(self, slot: str, entry: str) -> Any:
        return await self.call(scripts.CLAIM, slot, entry)

    async def release(self, slot: str, entry: str, outcome: str = "") -> Any:
        return await self.call(scripts.RELEASE, slot, entry, outcome)

    async def store_outcome(self, entry: str, outcome: str) -> Any:
        return await self.call(scripts.STORE_OUTCOME, entry, outcome)

    async def withdraw(self, slot: str, entry: str, reason: str = "removed_from_queue") -> Any:
        return await self.call(scripts.WITHDRAW, slot, entry, reason)

    async def stop_owner(self, slot: str, instance: str) -> Any:
        return await self.call(scripts.STOP_OWNER, slot, instance)

    async def renew(
        self,
        instance: str,
        leases: list[tuple[str, str]] | None = None,
        entries: list[tuple[str, str]] | None = None,
        follows: list[tuple[str, str]] | None = None,
    ) -> Any:
        """The reply's three parts, decoded."""
        args = scripts.renew_args(instance, leases or [], entries or [], follows or [])
        return scripts.renew_items(await self.call(scripts.RENEW, *args))

    async def cluster_slot(self, slot: str) -> Any:
        return await self.call(scripts.CLUSTER_SLOT, slot)

    async def heartbeat(self, *instances: str) -> None:
        """Make instances alive (as their first renewal would)."""
        for instance in instances:
            await self.renew(instance)

    async def expire_lease(self, slot: str) -> None:
        """Make a slot's lease expire at once (as for a holder that died: no release)."""
        await self.client.delete([f"{self.prefix}lease:{slot}"])

    async def kill(self, instance: str) -> None:
        """Make an instance dead at once: its heartbeat key expires."""
        await self.client.delete([f"{self.prefix}hb:{instance}"])

    async def queue(self, slot: str) -> list[str]:
        return list(await self.client.lrange(f"{self.prefix}q:{slot}", 0, -1))

    async def lease(self, slot: str) -> dict[str, str]:
        return dict(await self.client.hgetall(f"{self.prefix}lease:{slot}"))

    async def get(self, key: str) -> str | None:
        return await self.client.get(f"{self.prefix}{key}")


class Inbox:
    """The messages published to one instance's channel, in arrival order."""

    def __init__(self) -> None:
        self.messages: list[list[Any]] = []
        self._changed = trio.Event()

    def _add(self, message: list[Any]) -> None:
        self.messages.append(message)
        self._changed.set()
        self._changed = trio.Event()

    def of(self, kind: str) -> list[list[Any]]:
        return [m for m in self.messages if m[0] == kind]

    async def wait_for(self, predicate: Callable[[list[Any]], bool]) -> list[Any]:
        """Return the first message matching ``predicate``, waiting for it if needed."""
        while True:
            for message in self.messages:
                if predicate(message):
                    return message
            await self._changed.wait()

    async def wait_kind(self, *prefix: Any) -> list[Any]:
        """Return the first message that starts with ``prefix``."""
        return await self.wait_for(lambda m: m[: len(prefix)] == list(prefix))


@asynccontextmanager
async def open_inboxes(
    url: str, store: RedisSlotStore, *instances: str
) -> AsyncIterator[dict[str, Inbox]]:
    """Subscribe to the channels of ``instances``; yield an inbox per instance."""
    inboxes = {instance: Inbox() for instance in instances}
    by_channel = {f"{store.key_prefix}ch:{i}": inbox for i, inbox in inboxes.items()}
    async with (
        coredis.Redis.from_url(url, decode_responses=True) as client,
        trio.open_nursery() as nursery,
    ):

        async def read(task_status: trio.TaskStatus[None]) -> None:
            async with client.pubsub(
                ignore_subscribe_messages=True, retry_policy=NoRetryPolicy()
            ) as pubsub:
                await pubsub.subscribe(*by_channel)
                task_status.started()
                while True:
                    message = await pubsub.get_message()
                    if message is not None and message["type"] == "message":
                        by_channel[str(message["channel"])]._add(json.loads(str(message["data"])))

        await nursery.start(read)
        yield inboxes
        nursery.cancel_scope.cancel(reason="inboxes closed")


def entry(instance: str, n: int) -> str:
    """An entry id as the keeper builds it."""
    return f"{instance}/{n}"


class Reports:
    """The reports one keeper sent, read by a fake controller task, in order."""

    def __init__(self) -> None:
        self.items: list[Report] = []
        self.times: list[float] = []
        self._changed = trio.Event()

    def _add(self, report: Report) -> None:
        self.items.append(report)
        self.times.append(trio.current_time())
        self._changed.set()
        self._changed = trio.Event()

    def of(self, kind: type[Any]) -> list[Any]:
        return [r for r in self.items if isinstance(r, kind)]

    async def wait_for(self, kind: type[R], **fields: Any) -> R:
        """Return the first report of ``kind`` with ``fields``, waiting if needed."""
        while True:
            for report in self.items:
                if isinstance(report, kind) and all(
                    getattr(report, name) == value for name, value in fields.items()
                ):
                    return report
            await self._changed.wait()

    def time_of(self, report: Report) -> float:
        """When the fake controller received ``report`` (``trio.current_time()``)."""
        return self.times[next(i for i, r in enumerate(self.items) if r is report)]


class Running:
    """A keeper under test, the reports its fake controller read, and a way to kill it."""

    def __init__(self, keeper: LeaseKeeper, reports: Reports, scope: trio.CancelScope) -> None:
        self.keeper = keeper
        self.reports = reports
        self._scope = scope

    def kill(self) -> None:
        """Cancel the keeper's task: no release, no goodbye, as a killed process."""
        self._scope.cancel(reason="the test kills this process")


@asynccontextmanager
async def open_keeper(
    store: RedisSlotStore, instance_id: str, *, client: ServerClient | None = None
) -> AsyncIterator[Running]:
    """Run a keeper, and a fake controller reading its reports, for the block; close
    the keeper at the end (unless killed)."""
    send, receive = trio.open_memory_channel[Report](math.inf)
    keeper = LeaseKeeper(store, instance_id, send, client or RedisClient(store, instance_id))
    reports = Reports()
    scope = trio.CancelScope()

    async def read() -> None:
        async for report in receive:
            reports._add(report)

    async def run(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await keeper.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await nursery.start(run)
        yield Running(keeper, reports, scope)
        await keeper.aclose()
        nursery.cancel_scope.cancel(reason="keeper test block ended")


# -- supervisors with a slot store ------------------------------------------------------------


def config(store: RedisSlotStore, **controller: int) -> SupervisorConfig:
    """A supervisor config (``grace=1``) whose controller uses ``store``."""
    return SupervisorConfig(grace=1.0, controller=ControllerConfig(slot_store=store, **controller))


async def refused_start(store: RedisSlotStore) -> SlotStoreUnavailableError:
    """Open a supervisor of ``config(store)`` that must not start (within 10 s); return
    its error."""
    with trio.fail_after(10), pytest.raises(SlotStoreUnavailableError) as error:
        async with open_supervisor(config(store)):
            pytest.fail("the block must not run")
    return error.value


@asynccontextmanager
async def replica(
    store: RedisSlotStore, **controller: int
) -> AsyncIterator[tuple[Supervisor, EventRecorder]]:
    """One replica in this process: a supervisor of ``config(store)`` and its recorder."""
    recorder = EventRecorder()
    async with open_supervisor(config(store, **controller), subscribers=[recorder]) as sup:
        yield sup, recorder


def gated(gate: trio.Event, value: object = None) -> TaskSpec:
    """``once`` work that returns ``value`` once ``gate`` is set."""

    async def body() -> object:
        await gate.wait()
        return value

    return TaskSpec.once(f"gated-{id(gate)}", body)


def quick(name: str, value: object = None) -> TaskSpec:
    """``once`` work that returns ``value`` after one checkpoint."""

    async def body() -> object:
        await trio.lowlevel.checkpoint()
        return value

    return TaskSpec.once(name, body)


def machine(**budgets: int) -> ClusterSlotMachine[None]:
    """A cluster slot machine for the pure tests: ``max_slot_queue=10``, the other
    budgets unbounded, unless given."""
    fields: dict[str, int | None] = {
        "max_slot_queue": 10,
        "max_total_pending": None,
        "max_slots": None,
        "max_waiters": None,
    }
    fields.update(budgets)
    return ClusterSlotMachine(**fields)  # type: ignore[arg-type]


@asynccontextmanager
async def tcp_server(
    answer: bytes | None, connected: trio.Event | None = None, connections: int = 1
) -> AsyncIterator[int]:
    """A TCP server on a loopback port that answers ``answer`` to what it receives and
    closes, or (``None``) never answers; yield its port. ``connected`` is set once
    ``connections`` clients connected."""
    accepted = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        if connected is not None and accepted >= connections:
            connected.set()
        if answer is None:
            await trio.sleep_forever()
        try:
            await stream.receive_some(65536)
            await stream.send_all(answer)
        except trio.BrokenResourceError:
            pass
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), handle, 0
        )
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel(reason="the test server is no longer needed")


Filter = Callable[[trio.SocketStream, bytes], Awaitable[bytes]]


async def _passed(_: trio.SocketStream, data: bytes) -> bytes:
    return data


@asynccontextmanager
async def tcp_proxy(
    port: int, *, upstream: Filter = _passed, downstream: Filter = _passed
) -> AsyncIterator[int]:
    """A TCP proxy to the loopback server at ``port``; yield its own port. What a client
    sends goes to the server as ``await upstream(client, data)`` returns it, what the
    server sends back to the client as ``await downstream(client, data)`` does (``b""``:
    nothing)."""

    async def pump(
        source: trio.SocketStream, sink: trio.SocketStream, client: trio.SocketStream, how: Filter
    ) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                if passed := await how(client, data):
                    await sink.send_all(passed)

    async def handle(client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", port)
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, server, client, upstream)
            await pump(server, client, client, downstream)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), handle, 0
        )
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel(reason="the test proxy is no longer needed")


def _command_at(buffer: bytes, at: int) -> tuple[list[bytes], int] | None:
    """The RESP command (an array of bulk strings, as clients send them) at
    ``buffer[at:]`` and where it ends; ``None`` while it is not all there."""
    end = buffer.find(b"\r\n", at)
    if end < 0:
        return None
    count, at, args = int(buffer[at + 1 : end]), end + 2, []
    for _ in range(count):
        end = buffer.find(b"\r\n", at)
        if end < 0:
            return None
        size, start = int(buffer[at + 1 : end]), end + 2
        if len(buffer) < start + size + 2:
            return None
        args.append(buffer[start : start + size])
        at = start + size + 2
    return args, at


def _command(*args: bytes) -> bytes:
    return b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)])


FAILED_BY_THE_PROXY = "the test proxy fails this script"


@attrs.define
class FailingProxy:
    """What ``failing_proxy`` yields: its ``port``; ``failing``, the SHA1s of the scripts
    it fails (empty at first); ``failed``, set once it failed one; ``release``, which
    ends the hold of a proxy that holds replies; ``calls``, how many ``EVALSHA`` of each
    script its clients sent."""

    port: int
    failing: set[str] = attrs.field(factory=set)
    calls: collections.Counter[str] = attrs.field(factory=collections.Counter)
    failed: trio.Event = attrs.field(factory=trio.Event)
    release: trio.Event = attrs.field(factory=trio.Event)

    def store(self, store: RedisSlotStore) -> RedisSlotStore:
        """``store``, through this proxy."""
        return attrs.evolve(store, url=f"redis://127.0.0.1:{self.port}/0")


@asynccontextmanager
async def failing_proxy(port: int, *, hold: bool = False) -> AsyncIterator[FailingProxy]:
    """A TCP proxy to the loopback server at ``port``. An ``EVALSHA`` of a script in
    ``failing`` reaches the server as a script that fails (``FAILED_BY_THE_PROXY``), as a
    server's error that is no foreign data would (a command the user may no longer run, a
    server out of memory); every other command passes as it is. With ``hold``, a
    connection that sent a failed script gets no reply from then on (that error
    included) until ``release`` is set: the test decides what its client learns first."""
    proxy = FailingProxy(0)
    pending: dict[trio.SocketStream, bytes] = {}
    held: set[trio.SocketStream] = set()
    script = f"return redis.error_reply('ERR {FAILED_BY_THE_PROXY}')"
    error = _command(b"EVAL", script.encode(), b"0")

    async def upstream(client: trio.SocketStream, data: bytes) -> bytes:
        buffer, at, out = pending.pop(client, b"") + data, 0, []
        while (command := _command_at(buffer, at)) is not None:
            args, end = command
            sha = args[1].decode().lower() if args[0].upper() == b"EVALSHA" else None
            if sha is not None:
                proxy.calls[sha] += 1
            if sha in proxy.failing:
                out.append(error)
                proxy.failed.set()
                if hold:
                    held.add(client)
            else:
                out.append(buffer[at:end])
            at = end
        pending[client] = buffer[at:]
        return b"".join(out)

    async def downstream(client: trio.SocketStream, data: bytes) -> bytes:
        if client in held:
            await proxy.release.wait()
        return data

    async with tcp_proxy(port, upstream=upstream, downstream=downstream) as proxy.port:
        yield proxy


async def start_later(server: RedisServer, delay: float = 0.3) -> None:
    """Start the stopped ``server`` after ``delay`` seconds (in a thread: it waits until
    the server answers), as a server that comes up while a supervisor starts."""
    await trio.sleep(delay)
    await trio.to_thread.run_sync(server.start)


@asynccontextmanager
async def child(script: str, *args: str) -> AsyncIterator[trio.Process]:
    """A Python child running ``script`` with ``args``, its stdout and stderr piped;
    killed at the end (ended already, unless the test failed)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            process.kill()
            await process.wait()


async def read_line(stream: trio.abc.ReceiveStream | None) -> bytes:
    """One line of a child's output (a print may come in more than one read)."""
    assert stream is not None
    line = b""
    while not line.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        assert chunk, f"the output ended after {line!r}"
        line += chunk
    return line

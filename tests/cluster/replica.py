"""One replica of a service, as a separate OS process: the cluster end-to-end tests run
several of these against one server (``test_cluster_replicas.py``, ``replica_harness.py``).

Run as ``python replica.py``; a line on stdin configures it (a JSON object: ``url``,
``namespace``, ``lease_ttl``, ...), so the tests start replicas ahead of time and
configure them when a test begins, and a replica that closed cleanly waits for the next
configuration (the next test). Configured, it opens a supervisor whose controller has a
``RedisSlotStore`` and then follows commands, one JSON object per line on stdin, and
reports what happens, one JSON object per line on stdout. Times are ``time.monotonic()``,
which is system-wide on Linux (``CLOCK_MONOTONIC``), so records of different processes
can be compared.

Commands (``op``):

* ``submit``: ``id``, ``slot``, ``policy`` (an ``AdmissionPolicy`` value), ``wait``, and
  the body's behaviour: ``gate`` (run until ``release``; ``defer``: in a ``defer_cancel()``
  block), ``thread`` (block in a thread until ``release``), ``hold`` (seconds), ``value``
  (returned; ``"sample"``: ``SAMPLE``), ``db`` (a port: write to the fenced database every
  20 ms while running, and once more as the body ends).
* ``add``: ``id``, ``limit`` (``{"name", "capacity"}`` or ``{"name", "rate", "per",
  "burst"}``) and the same body arguments: plain work (no slot) that takes one unit of
  that limit pool, cluster-wide, for its attempt.
* ``call``: ``run_in_slot`` with the same body arguments, in a scope ``cancel`` cancels
  (``cancel_in_flight``: the replica cancels it once its acquisition is on the wire).
* ``release`` / ``cancel``: ``id``.
* ``cluster_slot``: ``slot``; ``snapshot``: the controller snapshot.
* ``exit``: leave the supervisor block (the graceful shutdown).

Records (``ev``): ``ready`` (``instance``), ``unavailable`` (``error``),
``submitted``, ``start`` / ``end`` (``t``, ``token``), ``write`` (``token``, ``accepted``),
``outcome`` (``kind``, ``reason``, ``value``, ``rejection``), ``event`` (every controller
event and ``task_finished``: ``kind``, ``name``, ``slot``, ``token``, ``reason``),
``info``, ``snapshot``, ``closed``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    ConcurrencyLimit,
    ControllerConfig,
    ControllerSpec,
    GraceExceededError,
    OutcomeError,
    RateLimit,
    SlotStoreUnavailableError,
    Supervisor,
    SupervisorConfig,
    TaskEvent,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.redis import RedisSlotStore


def emit(ev: str, **fields: Any) -> None:
    print(json.dumps({"ev": ev, **fields}), flush=True)


class Reporter:
    """A subscriber that reports the controller's events (and TASK_FINISHED)."""

    name = "replica-reporter"

    async def on_event(self, event: TaskEvent) -> None:
        kind = event.kind.value
        if kind.startswith("controller_") or kind == "task_finished":
            emit(
                "event",
                kind=kind,
                name=event.name,
                slot=event.slot,
                token=event.fence_token,
                reason=event.reason,
                rejection=None if event.rejection is None else event.rejection.value,
                outcome=None if event.outcome is None else event.outcome.value,
                t=time.monotonic(),
            )


def fenced_write(port: int, writer: str, token: int | None) -> bool:
    """Ask the test's fenced database to take a write with ``token``. Synchronous, as a
    database driver's call often is: once started, it runs to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        sock.sendall(f"{token} {writer}\n".encode())
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(64)
            if not chunk:
                break
            reply += chunk
    return reply.strip() == b"ok"


def write(port: int, wid: str, token: int | None, what: str) -> None:
    accepted = fenced_write(port, wid, token)
    emit("write", id=wid, token=token, accepted=accepted, what=what, t=time.monotonic())


# A value that JSON does not carry as it is: tuples come back as lists, int keys as str.
SAMPLE = (1, "two", {3: (4.5, None)})


class Replica:
    def __init__(self, sup: Supervisor, nursery: trio.Nursery) -> None:
        self.sup = sup
        self.nursery = nursery
        self.gates: dict[str, trio.Event] = {}
        self.thread_gates: dict[str, threading.Event] = {}
        self.callers: dict[str, trio.CancelScope] = {}
        self.done = trio.Event()
        self._busy = 0  # submit and call tasks still waiting for their outcome
        self._idle = trio.Event()

    def spawn(self, fn: Any, command: dict[str, Any]) -> None:
        async def run() -> None:
            try:
                await fn(command)
            finally:
                self._busy -= 1
                if not self._busy:
                    self._idle.set()

        self._busy += 1
        self._idle = trio.Event()
        self.nursery.start_soon(run)

    async def wait_idle(self) -> None:
        if self._busy:
            await self._idle.wait()

    def body(self, command: dict[str, Any]) -> Any:
        wid = command["id"]
        gate = self.gates.setdefault(wid, trio.Event()) if command.get("gate") else None
        thread_gate = None
        if command.get("thread"):
            thread_gate = self.thread_gates.setdefault(wid, threading.Event())
        hold = command.get("hold")
        port = command.get("db")

        async def body() -> Any:
            context = current_context()
            token = context.fence_token
            emit("start", id=wid, slot=context.slot, t=time.monotonic(), token=token)
            try:
                if port is not None:
                    # A write every 20 ms while it runs, and a last one (a flush) as it
                    # ends, however it ends.
                    try:
                        while gate is None or not gate.is_set():
                            write(port, wid, token, "update")
                            with trio.move_on_after(0.02):
                                if gate is None:
                                    await trio.sleep_forever()
                                else:
                                    await gate.wait()
                    finally:
                        write(port, wid, token, "flush")
                elif thread_gate is not None:
                    # Blocking code in a thread nothing can cancel: the body outlives a
                    # force (a lost lease) until ``release``.
                    await trio.to_thread.run_sync(thread_gate.wait)
                elif gate is not None and command.get("defer"):
                    with context.defer_cancel():  # ignores the soft stop: forced after grace
                        await gate.wait()
                elif gate is not None:
                    await gate.wait()
                elif hold:
                    await trio.sleep(hold)
                else:
                    await trio.lowlevel.checkpoint()
            finally:
                emit("end", id=wid, slot=context.slot, t=time.monotonic(), token=token)
            return SAMPLE if command.get("value") == "sample" else command.get("value")

        return body

    async def submit(self, command: dict[str, Any]) -> None:
        wid = command["id"]
        spec = ControllerSpec(
            TaskSpec.once(wid, self.body(command)),
            AdmissionPolicy(command.get("policy", "queue")),
            command["slot"],
            bool(command.get("wait", False)),
        )
        waiter = await self.sup.submit(spec)
        emit("submitted", id=wid, task=int(waiter.id), t=time.monotonic())
        outcome = await waiter.wait()
        emit(
            "outcome",
            id=wid,
            kind=outcome.kind.value,
            reason=outcome.reason,
            value=outcome.value,
            rejection=None if outcome.rejection is None else outcome.rejection.value,
            t=time.monotonic(),
        )

    async def add(self, command: dict[str, Any]) -> None:
        wid = command["id"]
        spec = command["limit"]
        pool: ConcurrencyLimit | RateLimit
        if "capacity" in spec:
            pool = ConcurrencyLimit(spec["name"], spec["capacity"])
        else:
            pool = RateLimit(spec["name"], spec["rate"], per=spec["per"], burst=spec["burst"])
        waiter = await self.sup.add(TaskSpec.once(wid, self.body(command), limits=(pool,)))
        emit("submitted", id=wid, task=int(waiter.id), t=time.monotonic())
        outcome = await waiter.wait()
        emit("outcome", id=wid, kind=outcome.kind.value, reason=outcome.reason, t=time.monotonic())

    async def call(self, command: dict[str, Any]) -> None:
        wid = command["id"]
        policy = AdmissionPolicy(command.get("policy", "queue"))
        scope = self.callers[wid]
        if command.get("cancel_in_flight"):
            self.nursery.start_soon(self.cancel_when_blocked, scope)
        with scope:
            try:
                value = await self.sup.run_in_slot(
                    command["slot"], self.body(command), policy=policy
                )
            except OutcomeError as exc:
                emit("outcome", id=wid, kind=exc.outcome.kind.value, reason=exc.outcome.reason)
            else:
                emit("outcome", id=wid, kind="completed", value=value)
        if scope.cancelled_caught:
            emit("outcome", id=wid, kind="caller_cancelled", t=time.monotonic())

    async def cancel_when_blocked(self, scope: trio.CancelScope) -> None:
        """Cancel the caller once every task waits: the call's request to the server is
        then on the wire (the lease keeper waits for its reply)."""
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel(reason="the test cancels the caller while its acquisition is in flight")

    async def cluster_slot(self, command: dict[str, Any]) -> None:
        try:
            info = await self.sup.cluster_slot(command["slot"])
        except SlotStoreUnavailableError as exc:
            emit("info", slot=command["slot"], error=str(exc))
            return
        if info is None:
            emit("info", slot=command["slot"], none=True)
        else:
            emit(
                "info",
                slot=info.slot,
                none=False,
                holder=info.holder,
                token=info.fence_token,
                depth=info.queue_depth,
                remaining=info.lease_remaining,
            )

    def handle(self, command: dict[str, Any]) -> None:
        match command["op"]:
            case "submit":
                self.spawn(self.submit, command)
            case "add":
                self.spawn(self.add, command)
            case "call":
                self.callers[command["id"]] = trio.CancelScope()
                self.spawn(self.call, command)
            case "release":
                self.gates.setdefault(command["id"], trio.Event()).set()
                self.thread_gates.setdefault(command["id"], threading.Event()).set()
            case "cancel":
                self.callers[command["id"]].cancel(reason="the test cancels the caller")
            case "cluster_slot":
                self.nursery.start_soon(self.cluster_slot, command)
            case "snapshot":
                views = self.sup.controller_snapshot().slots
                emit(
                    "snapshot",
                    slots={
                        v.slot: {"status": v.status.value, "token": v.fence_token} for v in views
                    },
                )
            case "exit":
                self.done.set()
            case other:
                raise ValueError(f"unknown command {other!r}")


async def read_commands(replica: Replica) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    buffer = b""
    async with stdin:
        while True:
            chunk = await stdin.receive_some()
            if not chunk:
                replica.done.set()  # the test went away
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    replica.handle(json.loads(line))


async def main(config: dict[str, Any]) -> None:
    store = RedisSlotStore(
        config["url"],
        namespace=config["namespace"],
        lease_ttl=config.get("lease_ttl", 1.0),
        connect_timeout=config.get("connect_timeout", 1.0),
        replicas_ack=config.get("replicas_ack", 0),
        replicas_ack_timeout=config.get("replicas_ack_timeout"),
    )
    controller = ControllerConfig(
        slot_store=store, max_slot_queue=config.get("max_slot_queue", 100)
    )
    sup_config = SupervisorConfig(grace=config.get("grace", 2.0), controller=controller)
    try:
        async with (
            open_supervisor(sup_config, subscribers=[Reporter()]) as sup,
            trio.open_nursery() as nursery,
        ):
            replica = Replica(sup, nursery)
            nursery.start_soon(read_commands, replica)
            emit("ready", instance=sup.instance_id, pid=os.getpid(), t=time.monotonic())
            await replica.done.wait()
            emit("closing", t=time.monotonic())
            try:
                await sup.shutdown()
            except GraceExceededError as exc:
                emit("grace_exceeded", error=str(exc))
            await replica.wait_idle()  # every outcome is reported
            nursery.cancel_scope.cancel(reason="the replica exits")
    except GraceExceededError:
        pass  # reported above
    except SlotStoreUnavailableError as exc:
        emit("unavailable", error=str(exc), repr=repr(exc))
    emit("closed", t=time.monotonic())


def read_config() -> dict[str, Any]:
    """The next line of stdin, read unbuffered (the commands after it stay in the pipe)."""
    os.set_blocking(0, True)  # the last run's FdStream made it non-blocking
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            sys.exit(0)  # never configured: the test session ended
        line += byte
    return dict(json.loads(line))


if __name__ == "__main__":
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(message)s")
    while True:
        trio.run(main, read_config())

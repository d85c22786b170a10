"""Scenario 5: keyed calls, ``run_in_slot`` over K keys with ``max_concurrent=8``.

M calls spread round-robin over K keys; every caller is a task in a nursery that awaits
its call's value. Ours: ``sup.run_in_slot(key, job)`` (QUEUE policy: FIFO per key, one
call per key at a time, at most 8 running, fair across keys).

Baseline: a hand-written dispatcher with the same guarantees and no supervision: a dict
of per-key deques, a channel of ready keys, and 8 worker tasks that run each job
*inline* (no task per call), hand the value back through a ``trio.Event``, and requeue
the key behind the other ready keys (round-robin).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable

import trio
from _harness import Plan, Result, Target, interleave, ratio_row, timed_trio

from trio_taskvisor import ControllerConfig, Supervisor, SupervisorConfig, open_supervisor

WORKERS = 8


async def job(value: int) -> int:
    """The keyed work: return at once."""
    return value


class _Call:
    """One pending call of the hand-written dispatcher."""

    __slots__ = ("args", "done", "fn", "value")

    def __init__(self, fn: Callable[[int], Awaitable[int]], args: int) -> None:
        self.fn = fn
        self.args = args
        self.done = trio.Event()
        self.value: int | None = None


class Dispatcher:
    """FIFO per key, one call per key at a time, ``workers`` calls at most, fair across keys."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[_Call]] = {}
        self.ready_send, self.ready_recv = trio.open_memory_channel[str](math.inf)

    async def call(self, key: str, fn: Callable[[int], Awaitable[int]], arg: int) -> int:
        """Queue ``fn(arg)`` behind the key's earlier calls and wait for its value."""
        entry = _Call(fn, arg)
        queue = self.queues.get(key)
        if queue is None:
            self.queues[key] = deque([entry])
            self.ready_send.send_nowait(key)
        else:
            queue.append(entry)
        await entry.done.wait()
        assert entry.value is not None
        return entry.value

    async def worker(self) -> None:
        """Run the head call of each ready key inline, then requeue the key if it has more."""
        async for key in self.ready_recv:
            queue = self.queues[key]
            entry = queue.popleft()
            entry.value = await entry.fn(entry.args)
            entry.done.set()
            if queue:
                self.ready_send.send_nowait(key)
            else:
                del self.queues[key]


async def bare_dispatcher(m: int, k: int) -> None:
    """The baseline: M callers over K keys through the hand-written dispatcher."""
    dispatcher = Dispatcher()
    async with trio.open_nursery() as workers:
        for _ in range(WORKERS):
            workers.start_soon(dispatcher.worker)
        async with trio.open_nursery() as callers:
            for i in range(m):
                callers.start_soon(_bare_caller, dispatcher, f"k{i % k}", i)
        dispatcher.ready_send.close()


async def _bare_caller(dispatcher: Dispatcher, key: str, i: int) -> None:
    if await dispatcher.call(key, job, i) != i:
        raise RuntimeError("the dispatcher returned a wrong value")


async def _ours_caller(sup: Supervisor, key: str, i: int) -> None:
    if await sup.run_in_slot(key, job, i) != i:
        raise RuntimeError("run_in_slot returned a wrong value")


async def ours_keyed(m: int, k: int) -> None:
    """M ``run_in_slot`` callers over K keys, ``max_concurrent=8``."""
    config = SupervisorConfig(
        max_concurrent=WORKERS,
        max_registered_tasks=None,
        command_capacity=m + 16,
        controller=ControllerConfig(
            queue_capacity=m + 16,
            max_slot_queue=m,
            max_total_pending=None,
            max_slots=None,
            max_waiters=None,
        ),
    )
    async with open_supervisor(config) as sup, trio.open_nursery() as callers:
        for i in range(m):
            callers.start_soon(_ours_caller, sup, f"k{i % k}", i)


def run_keyed(plan: Plan) -> list[Result]:
    """Scenario 5: M keyed calls over K = 64 keys vs the hand-written dispatcher."""
    results: list[Result] = []
    keys = 64
    for m in plan.sizes([1_000, 10_000], [1_000]):
        samples = interleave(
            {"ours": timed_trio(ours_keyed, m, keys), "bare": timed_trio(bare_dispatcher, m, keys)},
            rounds=plan.rounds(m),
            warmup=plan.warmup(m),
        )
        results.append(
            ratio_row(
                "5",
                f"keyed calls, K={keys}",
                m,
                samples,
                "ours",
                "bare",
                per=m,
                unit="us/call",
                target=Target(4.0),
                baseline_name="dict-of-deques dispatcher, 8 workers, jobs inline",
            )
        )
    return results

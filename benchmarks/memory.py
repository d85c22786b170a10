"""Scenario 7: bytes per idle supervised task vs a bare sleeping trio task.

Ours: with the supervisor already open (its fixed cost excluded), ``add_batch`` N
``once`` specs whose body signals that it started and then sleeps forever; once all N
are running, the growth of ``tracemalloc``'s traced memory since just before the specs
were built, divided by N, is the cost per task (spec, record, waiter, actor task, attempt
scopes, coroutine frames, ...). The waiters are kept, as a user would keep them.

Baseline: the same N bodies started with ``start_soon`` in a bare nursery, measured the
same way. Memory is deterministic enough that three rounds suffice; tracemalloc makes
these runs slow, so their times are not reported.
"""

from __future__ import annotations

import tracemalloc

import trio
import trio.testing
from _harness import Plan, Result, Target, interleave, ratio_row, reported_trio

from trio_taskvisor import SupervisorConfig, TaskSpec, open_supervisor


class StartGate:
    """Counts started bodies and sets ``all_started`` when the N-th one arrives."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.started = 0
        self.all_started = trio.Event()

    async def body(self) -> None:
        """A task body: report the start, then sleep until cancelled."""
        self.started += 1
        if self.started == self.n:
            self.all_started.set()
        await trio.sleep_forever()


async def ours_idle_bytes(n: int) -> float:
    """Traced bytes per registered, sleeping supervised task."""
    gate = StartGate(n)
    config = SupervisorConfig(max_registered_tasks=None, command_capacity=n + 16, grace=5.0)
    tracemalloc.start()
    try:
        async with open_supervisor(config) as sup:
            await trio.testing.wait_all_tasks_blocked()
            before = tracemalloc.get_traced_memory()[0]
            waiters = await sup.add_batch([TaskSpec.once(f"idle-{i}", gate.body) for i in range(n)])
            await gate.all_started.wait()
            await trio.testing.wait_all_tasks_blocked()
            after = tracemalloc.get_traced_memory()[0]
            if len(sup.list()) != n:
                raise RuntimeError("not every task is registered")
            del waiters
    finally:
        tracemalloc.stop()
    return (after - before) / n


async def bare_idle_bytes(n: int) -> float:
    """Traced bytes per sleeping task in a bare nursery."""
    gate = StartGate(n)
    tracemalloc.start()
    try:
        async with trio.open_nursery() as nursery:
            await trio.testing.wait_all_tasks_blocked()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(n):
                nursery.start_soon(gate.body)
            await gate.all_started.wait()
            await trio.testing.wait_all_tasks_blocked()
            after = tracemalloc.get_traced_memory()[0]
            nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    return (after - before) / n


def run_memory(plan: Plan) -> list[Result]:
    """Scenario 7: bytes per idle task, ours vs bare."""
    n = 1_000 if plan.quick else 10_000
    samples = interleave(
        {"ours": reported_trio(ours_idle_bytes, n), "bare": reported_trio(bare_idle_bytes, n)},
        rounds=3,
    )
    return [
        ratio_row(
            "7",
            "memory per idle task",
            n,
            samples,
            "ours",
            "bare",
            unit="B/task",
            scale=1.0,
            target=Target(1.9),
            baseline_name="bare sleeping trio task",
            note="tracemalloc, traced bytes after all N started, supervisor already open",
        )
    ]

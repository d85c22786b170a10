"""Scenario 8: stopping N cooperative (sleeping) tasks.

Ours: N ``once`` tasks sleeping forever in an open supervisor; once all have started,
time leaving the ``open_supervisor`` block (the shared graceful shutdown: soft-stop
every task, wait for every actor to exit, drain). Baseline: N sleeping tasks in a bare
nursery; once all have started, time ``cancel_scope.cancel()`` and leaving the nursery.

Unlike the other scenarios, this one times a phase inside the run (with
``time.perf_counter``), since starting N tasks would otherwise dominate the figure.
"""

from __future__ import annotations

import time

import trio
import trio.testing
from _harness import Plan, Result, interleave, ratio_row, reported_trio
from memory import StartGate

from trio_taskvisor import OutcomeKind, SupervisorConfig, TaskSpec, open_supervisor


async def ours_stop(n: int) -> float:
    """Seconds from the shutdown request to the end of the ``open_supervisor`` block."""
    gate = StartGate(n)
    config = SupervisorConfig(max_registered_tasks=None, command_capacity=n + 16, grace=30.0)
    async with open_supervisor(config) as sup:
        waiters = await sup.add_batch([TaskSpec.once(f"idle-{i}", gate.body) for i in range(n)])
        await gate.all_started.wait()
        await trio.testing.wait_all_tasks_blocked()
        start = time.perf_counter()
    elapsed = time.perf_counter() - start
    for waiter in waiters:
        if waiter.outcome_nowait().kind is not OutcomeKind.CANCELLED:
            raise RuntimeError(f"{waiter.name} was not cancelled")
    return elapsed


async def bare_stop(n: int) -> float:
    """Seconds from cancelling a bare nursery of N sleeping tasks to leaving it."""
    gate = StartGate(n)
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(gate.body)
        await gate.all_started.wait()
        await trio.testing.wait_all_tasks_blocked()
        start = time.perf_counter()
        nursery.cancel_scope.cancel()
    return time.perf_counter() - start


def run_shutdown(plan: Plan) -> list[Result]:
    """Scenario 8: stop N sleeping tasks, ours vs cancelling a bare nursery."""
    results: list[Result] = []
    for n in plan.sizes([1_000, 10_000], [1_000]):
        samples = interleave(
            {"ours": reported_trio(ours_stop, n), "bare": reported_trio(bare_stop, n)},
            rounds=plan.rounds(n),
            warmup=plan.warmup(n),
        )
        results.append(
            ratio_row(
                "8",
                "shutdown of sleeping tasks",
                n,
                samples,
                "ours",
                "bare",
                per=n,
                baseline_name="cancel a bare nursery",
                note="times the stop phase only (inside the run)",
            )
        )
    return results

"""Scenarios 1 and 2: N ``once`` no-op tasks taken to their outcomes.

1a burst: one ``add_batch`` of N specs, then await every waiter.
1b sequential: ``await add`` for each spec, then await every waiter.
2  the burst of 1a with 1 and with 8 no-op subscribers.

Baseline: a bare trio nursery that spawns and joins N trivial tasks. Each measurement
is one whole ``trio.run``, opening and shutting down the supervisor included.
"""

from __future__ import annotations

import trio
from _harness import Plan, Result, Row, Target, interleave, ratio_row, scaling_row, timed_trio

from trio_taskvisor import (
    OutcomeKind,
    SupervisorConfig,
    TaskEvent,
    TaskSpec,
    TaskWaiter,
    open_supervisor,
)


async def noop() -> None:
    """The task body: return at once, without a checkpoint."""


class NoopSubscriber:
    """A subscriber that only counts what it receives."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.queue_capacity = capacity
        self.received = 0

    async def on_event(self, event: TaskEvent, /) -> None:
        """Count the event."""
        self.received += 1


def supervisor_config(n: int) -> SupervisorConfig:
    """A configuration whose registry limit and command channel never block N adds."""
    return SupervisorConfig(max_registered_tasks=None, command_capacity=n + 16, bus_capacity=1024)


async def check_completed(waiters: list[TaskWaiter]) -> None:
    """Await every waiter; raise if any task did not complete (a broken run, not a timing)."""
    for waiter in waiters:
        outcome = await waiter.wait()
        if outcome.kind is not OutcomeKind.COMPLETED:
            raise RuntimeError(f"{waiter.name} ended {outcome.kind.name}, expected COMPLETED")


def specs(n: int) -> list[TaskSpec]:
    """N ``once`` specs of the no-op body, with distinct names."""
    return [TaskSpec.once(f"t{i}", noop) for i in range(n)]


async def ours_burst(n: int, subscribers: int = 0) -> None:
    """One ``add_batch`` of N no-op tasks, then await every waiter."""
    subs = [NoopSubscriber(f"sub{i}", 8 * n + 64) for i in range(subscribers)]
    config = SupervisorConfig(
        max_registered_tasks=None, command_capacity=n + 16, bus_capacity=8 * n + 64
    )
    async with open_supervisor(config, subscribers=subs) as sup:
        await check_completed(await sup.add_batch(specs(n)))


async def ours_sequential(n: int) -> None:
    """``await add`` for each of N no-op tasks, then await every waiter."""
    async with open_supervisor(supervisor_config(n)) as sup:
        waiters = [await sup.add(spec) for spec in specs(n)]
        await check_completed(waiters)


async def bare_nursery(n: int) -> None:
    """The baseline: spawn N trivial tasks in a bare nursery and join them."""
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(noop)


def run_lifecycle(plan: Plan) -> list[Result]:
    """Scenario 1: burst and sequential lifecycles, plus the scaling check of 1a."""
    results: list[Result] = []
    bursts: list[Row] = []
    for n in plan.sizes([1_000, 10_000, 100_000], [1_000, 10_000]):
        samples = interleave(
            {
                "burst": timed_trio(ours_burst, n),
                "bare": timed_trio(bare_nursery, n),
                "sequential": timed_trio(ours_sequential, n),
            },
            rounds=plan.rounds(n),
            warmup=plan.warmup(n),
        )
        burst = ratio_row(
            "1a", "lifecycle burst", n, samples, "burst", "bare", per=n, target=Target(3.3)
        )
        bursts.append(burst)
        results.append(burst)
        results.append(
            ratio_row(
                "1b",
                "lifecycle sequential",
                n,
                samples,
                "sequential",
                "bare",
                per=n,
                target=Target(4.5),
            )
        )
    if len(bursts) > 1:
        small, large = bursts[0], bursts[-1]
        results.append(
            scaling_row(
                "1a", f"scaling {large.n // small.n}x N (per task)", small, large, Target(1.5)
            )
        )
    return results


def run_subscribers(plan: Plan) -> list[Result]:
    """Scenario 2: the burst of 1a with 1 and with 8 no-op subscribers."""
    results: list[Result] = []
    for n in plan.sizes([1_000, 10_000], [1_000]):
        samples = interleave(
            {
                "sub1": timed_trio(ours_burst, n, 1),
                "bare": timed_trio(bare_nursery, n),
                "sub8": timed_trio(ours_burst, n, 8),
            },
            rounds=plan.rounds(n),
            warmup=plan.warmup(n),
        )
        results.append(
            ratio_row(
                "2", "burst, 1 subscriber", n, samples, "sub1", "bare", per=n, target=Target(5.5)
            )
        )
        results.append(ratio_row("2", "burst, 8 subscribers", n, samples, "sub8", "bare", per=n))
    return results

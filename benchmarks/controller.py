"""Scenario 4: the keyed controller's intake and dispatch.

4a distinct slots: ``await submit`` N QUEUE submissions, each to its own slot, then
   await every waiter (a superset of 1b plus one hop through the controller loop).
4b one slot: N QUEUE submissions to the same slot (``max_slot_queue >= N``), run one
   after the other, then await every waiter.
4c replace storm: N REPLACE submissions into one slot, back to back; each displaces the
   queue head (SUPERSEDED) or stops the owner; the last one completes.

Baseline for all: a bare nursery that spawns and joins N trivial tasks.
"""

from __future__ import annotations

from _harness import Plan, Result, Row, Target, interleave, ratio_row, scaling_row, timed_trio
from lifecycle import bare_nursery, noop

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    SupervisorConfig,
    TaskSpec,
    TaskWaiter,
    open_supervisor,
)


def controller_config(n: int) -> SupervisorConfig:
    """Budgets that never reject or block N submissions."""
    return SupervisorConfig(
        max_registered_tasks=None,
        command_capacity=n + 16,
        controller=ControllerConfig(
            queue_capacity=n + 16,
            max_slot_queue=n,
            max_total_pending=None,
            max_slots=None,
            max_waiters=None,
        ),
    )


async def await_all(waiters: list[TaskWaiter], allowed: frozenset[OutcomeKind]) -> None:
    """Await every waiter; raise on an outcome kind the scenario cannot produce."""
    for waiter in waiters:
        outcome = await waiter.wait()
        if outcome.kind not in allowed:
            raise RuntimeError(f"{waiter.name} ended {outcome.kind.name}")


COMPLETED = frozenset({OutcomeKind.COMPLETED})
REPLACED = frozenset({OutcomeKind.COMPLETED, OutcomeKind.CANCELLED, OutcomeKind.REJECTED})


async def ours_distinct(n: int) -> None:
    """``await submit`` to N distinct slots, then await all.

    As a user's code runs: the ``TaskSpec`` and the ``ControllerSpec`` are built inside
    the timed loop, each naming its slot.
    """
    async with open_supervisor(controller_config(n)) as sup:
        waiters = [
            await sup.submit(ControllerSpec.queue(TaskSpec.once(f"t{i}", noop), slot=f"s{i}"))
            for i in range(n)
        ]
        await await_all(waiters, COMPLETED)


async def ours_one_slot(n: int) -> None:
    """N QUEUE submissions to one slot, then await all."""
    async with open_supervisor(controller_config(n)) as sup:
        waiters = [
            await sup.submit(ControllerSpec.queue(TaskSpec.once(f"t{i}", noop), slot="hot"))
            for i in range(n)
        ]
        await await_all(waiters, COMPLETED)


async def ours_replace_storm(n: int) -> None:
    """N REPLACE submissions into one slot, then await all."""
    async with open_supervisor(controller_config(n)) as sup:
        waiters = [
            await sup.submit(ControllerSpec.replace(TaskSpec.once(f"t{i}", noop), slot="hot"))
            for i in range(n)
        ]
        await await_all(waiters, REPLACED)
        last = await waiters[-1].wait()
        if last.kind is not OutcomeKind.COMPLETED:
            raise RuntimeError(f"the last replacement ended {last.kind.name}")


def run_controller(plan: Plan) -> list[Result]:
    """Scenario 4: distinct slots (with the scaling check), one slot, replace storm."""
    results: list[Result] = []
    distinct: list[Row] = []
    # 5k is the size the target was set at (5,000 submissions to distinct slots against
    # a bare nursery of 5,000 tasks): more rounds there, for a steadier median.
    for n in plan.sizes([1_000, 5_000, 10_000, 100_000], [1_000, 10_000]):
        contenders = {
            "distinct": timed_trio(ours_distinct, n),
            "bare": timed_trio(bare_nursery, n),
        }
        if n in plan.sizes([1_000, 10_000], [1_000]):
            contenders["one_slot"] = timed_trio(ours_one_slot, n)
            contenders["replace"] = timed_trio(ours_replace_storm, n)
        rounds = plan.rounds(n) if n != 5_000 else 2 * plan.rounds(n) + 1
        samples = interleave(contenders, rounds=rounds, warmup=plan.warmup(n))
        row = ratio_row(
            "4a", "controller distinct slots", n, samples, "distinct", "bare", per=n,
            target=Target(6.0),
        )  # fmt: skip
        distinct.append(row)
        results.append(row)
        if "one_slot" in samples:
            results.append(
                ratio_row("4b", "controller one slot, QUEUE", n, samples, "one_slot", "bare", per=n)
            )
            results.append(
                ratio_row("4c", "controller REPLACE storm", n, samples, "replace", "bare", per=n)
            )
    if len(distinct) > 1:
        small, large = distinct[0], distinct[-1]
        results.append(
            scaling_row(
                "4a", f"scaling {large.n // small.n}x N (per task)", small, large, Target(1.5)
            )
        )
    return results

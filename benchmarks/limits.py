"""Scenario 11: what a local limit pool costs an attempt.

N ``once`` no-op tasks in one ``add_batch`` under ``max_concurrent=8``, each naming one
``ConcurrencyLimit`` of capacity 8 (so the pool never holds back an attempt the permit
lets through: what is measured is taking and giving back its unit with the permit, all
at once), then every waiter awaited. Baseline: the same tasks under ``max_concurrent=8``
alone, in the same run.
"""

from __future__ import annotations

from _harness import Plan, Result, Target, interleave, ratio_row, timed_trio
from lifecycle import check_completed, noop

from trio_taskvisor import ConcurrencyLimit, SupervisorConfig, TaskSpec, open_supervisor

PERMITS = 8
POOL = ConcurrencyLimit("exports", PERMITS)


def _config(n: int) -> SupervisorConfig:
    return SupervisorConfig(
        max_concurrent=PERMITS, max_registered_tasks=None, command_capacity=n + 16
    )


async def _run(n: int, limited: bool) -> None:
    options = {"limits": (POOL,)} if limited else {}
    specs = [TaskSpec.once(f"t{i}", noop, **options) for i in range(n)]
    async with open_supervisor(_config(n)) as sup:
        await check_completed(await sup.add_batch(specs))


async def ours_limited(n: int) -> None:
    """Every attempt takes a unit of ``POOL`` with its permit."""
    await _run(n, limited=True)


async def permit_only(n: int) -> None:
    """The baseline: the permit alone."""
    await _run(n, limited=False)


def run_limits(plan: Plan) -> list[Result]:
    """Scenario 11: one local concurrency pool against the permit alone."""
    results: list[Result] = []
    for n in plan.sizes([1_000, 10_000], [1_000]):
        samples = interleave(
            {"limited": timed_trio(ours_limited, n), "permit": timed_trio(permit_only, n)},
            rounds=plan.rounds(n),
            warmup=plan.warmup(n),
        )
        results.append(
            ratio_row(
                "11",
                "one local ConcurrencyLimit",
                n,
                samples,
                "limited",
                "permit",
                per=n,
                target=Target(1.15),
                baseline_name="the same tasks under max_concurrent=8 alone",
            )
        )
    return results

"""Scenario 11: what a local limit pool costs an attempt.

N ``once`` no-op tasks in one ``add_batch`` under ``max_concurrent=8``, each naming one
``ConcurrencyLimit`` of capacity 8 (so the pool never holds back an attempt the permit
lets through: what is measured is taking and giving back its unit with the permit, all
at once), then every waiter awaited. Baseline: the same tasks under ``max_concurrent=8``
alone, in the same run. The specs are built before the clock starts (the target is the
attempt's cost; a spec with options costs its converters once per task, not per attempt).
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


def _specs(n: int, limited: bool) -> list[TaskSpec[None]]:
    options = {"limits": (POOL,)} if limited else {}
    return [TaskSpec.once(f"t{i}", noop, **options) for i in range(n)]


async def run_specs(specs: list[TaskSpec[None]]) -> None:
    """One supervisor runs ``specs`` (built beforehand) and awaits every waiter."""
    async with open_supervisor(_config(len(specs))) as sup:
        await check_completed(await sup.add_batch(specs))


def run_limits(plan: Plan) -> list[Result]:
    """Scenario 11: one local concurrency pool against the permit alone."""
    results: list[Result] = []
    for n in plan.sizes([1_000, 10_000], [1_000]):
        samples = interleave(
            {
                "limited": timed_trio(run_specs, _specs(n, limited=True)),
                "permit": timed_trio(run_specs, _specs(n, limited=False)),
            },
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

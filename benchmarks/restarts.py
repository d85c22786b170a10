"""Scenario 3: one task that fails R times with zero backoff, then succeeds.

Ours: ``TaskSpec.restartable`` with ``BackoffPolicy.constant(0)`` and ``max_retries=R``,
so the attempt R + 1 succeeds and the outcome is COMPLETED (``log_failures=False``).
Baseline: a bare retry loop that opens a fresh ``trio.CancelScope`` per attempt and
calls the same failing function. Both pay R + 1 calls of the body and R raised
exceptions.
"""

from __future__ import annotations

import trio
from _harness import Plan, Result, Target, interleave, ratio_row, timed_trio

from trio_taskvisor import BackoffPolicy, OutcomeKind, SupervisorConfig, TaskSpec, open_supervisor


class Flaky:
    """An async callable that raises on its first ``failures`` calls, then returns."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise ValueError(f"attempt {self.calls} fails")
        return self.calls


async def ours_restarts(r: int) -> None:
    """A restartable task failing R times with zero backoff, awaited to COMPLETED."""
    flaky = Flaky(r)
    spec = TaskSpec.restartable("flaky", flaky, backoff=BackoffPolicy.constant(0), max_retries=r)
    # The failures are the workload: without this, each round's first one is a WARNING
    # line on stderr, in the middle of the progress line (the one log call of a round).
    async with open_supervisor(SupervisorConfig(log_failures=False)) as sup:
        outcome = await (await sup.add(spec)).wait()
    if outcome.kind is not OutcomeKind.COMPLETED or flaky.calls != r + 1:
        raise RuntimeError(f"restarts ended {outcome.kind.name} after {flaky.calls} calls")


async def bare_retry_loop(r: int) -> None:
    """The baseline: retry the same function in a fresh cancel scope per attempt."""
    flaky = Flaky(r)
    for _ in range(r + 1):
        with trio.CancelScope():
            try:
                await flaky()
            except Exception:
                continue
            break
    if flaky.calls != r + 1:
        raise RuntimeError(f"bare retry loop made {flaky.calls} calls")


def run_restarts(plan: Plan) -> list[Result]:
    """Scenario 3: R restarts, ours vs the bare per-attempt-scope retry loop."""
    results: list[Result] = []
    for r in plan.sizes([1_000, 10_000], [1_000]):
        samples = interleave(
            {"ours": timed_trio(ours_restarts, r), "bare": timed_trio(bare_retry_loop, r)},
            rounds=plan.rounds(r),
            warmup=plan.warmup(r),
        )
        results.append(
            ratio_row(
                "3",
                "restarts",
                r,
                samples,
                "ours",
                "bare",
                per=r,
                unit="us/restart",
                target=Target(2.5),
                baseline_name="bare retry loop, a CancelScope per attempt",
            )
        )
    return results

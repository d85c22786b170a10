"""``python -m trio_taskvisor tour``: a short, self-contained tour of the supervisor.

A flaky fetch that succeeds on its third attempt, a periodic heartbeat, a task that
fails fatally, and a stubborn task that defers cancellation past the grace window at
shutdown. Every event is logged; a summary of outcomes ends the run (about 2 s). It
needs nothing beyond the library's own dependencies.
"""

from __future__ import annotations

import logging

import trio

from .. import (
    BackoffPolicy,
    FatalError,
    GraceExceededError,
    LoggingSubscriber,
    SupervisorConfig,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from . import StdoutLines


async def fetch(url: str) -> int:
    attempt = current_context().attempt
    await trio.sleep(0.05)
    if attempt < 3:
        raise ConnectionError(f"{url} unreachable (attempt {attempt})")
    return 200


async def heartbeat() -> None:
    await trio.sleep(0.01)


async def migrate() -> None:
    raise FatalError("schema version 7 is not supported", exit_code=2)


async def stubborn() -> None:
    with current_context().defer_cancel():
        await trio.sleep_forever()


async def tour() -> None:
    """Run the four tasks for 1.2 s, shut down and print every outcome."""
    specs = [
        TaskSpec.restartable(
            "fetch", fetch, "https://example.org", backoff=BackoffPolicy.exponential(0.2)
        ),
        TaskSpec.periodic("heartbeat", 0.3, heartbeat),
        TaskSpec.once("migrate", migrate),
        TaskSpec.once("stubborn", stubborn),
    ]
    config = SupervisorConfig(grace=0.5)
    waiters: list[TaskWaiter[object]] = []
    try:
        async with open_supervisor(config, subscribers=[LoggingSubscriber()]) as sup:
            waiters = await sup.add_batch(specs)
            await trio.sleep(1.2)
    except GraceExceededError as exc:
        print(f"shutdown: {exc}")
    print("outcomes:")
    for waiter in waiters:
        outcome = waiter.outcome_nowait()
        # The value of a completed task, else the reason, if any (a cancelled task has none).
        detail = outcome.value if outcome.is_success else outcome.reason or ""
        print(f"  {waiter.name:<10} {outcome.kind.value:<14} {detail}".rstrip())


def main() -> int:
    """Log to stdout and run the tour; the exit status."""
    logging.basicConfig(
        handlers=[StdoutLines()],
        level=logging.INFO,
        format="%(relativeCreated)6.0f ms  %(message)s",
    )
    trio.run(tour)
    return 0

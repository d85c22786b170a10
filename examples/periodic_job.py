"""A periodic job: run every N seconds, with an attempt timeout and a retry on failure.

``TaskSpec.periodic(name, every, fn)`` waits ``every`` seconds after each success and
runs again. A failure (here: a run that overruns its ``timeout``) is retried after the
backoff instead, without waiting a whole period; the successful runs never count
against ``max_retries``. The job runs until it is stopped: ``await sup.cancel(name)``
returns once its outcome (``CANCELLED``) is committed.
"""

import trio

from trio_taskvisor import (
    BackoffPolicy,
    EventKind,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)

runs: list[str] = []
t0 = 0.0  # when the job was added


async def cleanup_expired_sessions() -> int:
    attempt = current_context().attempt
    started = trio.current_time()
    # The third run is slow (say, a lock held elsewhere) and overruns the timeout.
    await trio.sleep(1.0 if attempt == 3 else 0.01)
    runs.append(f"attempt {attempt} at {started - t0:.2f} s")
    return attempt


async def main() -> None:
    global t0
    spec = TaskSpec.periodic(
        "cleanup",
        0.2,  # every 0.2 s after a success
        cleanup_expired_sessions,
        timeout=0.25,  # each attempt; hard: it cancels the attempt
        backoff=BackoffPolicy.constant(0.05),  # the retry after a failure or timeout
        max_retries=3,  # consecutive failures before giving up (FAILED)
    )
    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup, sup.events() as events:
        t0 = trio.current_time()
        waiter = await sup.add(spec)
        async with trio.open_nursery() as nursery:

            async def watch_timeouts() -> None:
                async for event in events:
                    if event.kind is EventKind.ATTEMPT_TIMED_OUT:
                        print(f"attempt {event.attempt} timed out after {event.timeout} s")

            nursery.start_soon(watch_timeouts)
            await trio.sleep(1.2)
            nursery.cancel_scope.cancel()
        await sup.cancel("cleanup")  # stop it and wait until its outcome is committed
        print(f"outcome: {waiter.outcome_nowait().kind.name}")
    print("\n".join(runs))
    print(f"{len(runs)} successful runs")


if __name__ == "__main__":
    trio.run(main)

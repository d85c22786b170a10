"""Watched outcomes: a reliable final outcome per task, and a best-effort event stream.

* ``TaskWaiter.wait()`` returns the one final ``TaskOutcome`` of a task, whatever
  happens to events: kind, value or error, reason, exit code. ``outcome.unwrap()``
  returns the value or raises ``OutcomeError`` (chained to the task's error).
* ``async with sup.events() as stream`` is an ad-hoc stream of later events, for
  watching. It is bounded: a consumer that falls behind loses events (and is told how
  many, with ``SUBSCRIBER_OVERFLOW``); never build correctness on it.
* This program prints every outcome itself, so it turns off ``log_failures`` (by
  default every final failure is also logged, with its traceback, on the
  ``trio_taskvisor`` logger).
"""

import trio

from trio_taskvisor import (
    BackoffPolicy,
    EventKind,
    FatalError,
    OutcomeError,
    Supervisor,
    SupervisorConfig,
    TaskCancelled,
    TaskFailure,
    TaskSpec,
    current_context,
    open_supervisor,
)


async def resize_image(path: str) -> str:
    await trio.sleep(0.3)  # still running when the duplicate below arrives
    return path.replace(".png", "-small.png")


async def call_flaky_api() -> None:
    raise TaskFailure(f"503 from upstream (attempt {current_context().attempt})", exit_code=75)


async def load_config() -> None:
    raise FatalError("config.toml: unknown key 'colour'", exit_code=78)


async def slow_report() -> None:
    await trio.sleep(10)


async def optional_step() -> None:
    raise TaskCancelled("feature flag is off")


STREAMED = {
    EventKind.ATTEMPT_FAILED,
    EventKind.ATTEMPT_TIMED_OUT,
    EventKind.BACKOFF_SCHEDULED,
    EventKind.TASK_FINISHED,
}


async def watch(sup: Supervisor, task_status: trio.TaskStatus[None]) -> None:
    """Print some events, from now until the supervisor has shut down."""
    async with sup.events() as stream:
        task_status.started()  # the stream is open: no later event is missed
        async for event in stream:
            if event.kind in STREAMED:
                detail = event.outcome.name if event.outcome else event.reason
                print(f"  event {event.seq:>3} {event.kind.value:<18} {event.name}: {detail}")


async def main() -> None:
    fast = BackoffPolicy.constant(0.01)
    specs = [
        TaskSpec.once("resize", resize_image, "cat.png"),
        TaskSpec.restartable("flaky-api", call_flaky_api, backoff=fast, max_retries=2),
        TaskSpec.restartable("config", load_config, backoff=fast),
        TaskSpec.once("report", slow_report, timeout=0.05),
        TaskSpec.once("optional", optional_step),
    ]
    # The nursery outlives the supervisor: its shutdown drains the stream, then closes
    # it, and watch() ends by itself. Every outcome is printed below: no failure logs.
    config = SupervisorConfig(grace=1.0, log_failures=False)
    async with trio.open_nursery() as nursery, open_supervisor(config) as sup:
        await nursery.start(watch, sup)
        waiters = await sup.add_batch(specs)
        # A duplicate name, added without blocking: the waiter resolves to REJECTED.
        waiters.append(sup.add_nowait(TaskSpec.once("resize", resize_image, "dog.png")))
        outcomes = [await waiter.wait() for waiter in waiters]

    print("outcomes:")
    for waiter, outcome in zip(waiters, outcomes, strict=True):
        extra = outcome.value if outcome.is_success else outcome.reason or ""
        code = f" (exit code {outcome.exit_code})" if outcome.exit_code is not None else ""
        print(f"  {waiter.name:<9} {outcome.kind.name:<9} {extra}{code}")

    print("unwrap:", outcomes[0].unwrap())
    try:
        outcomes[2].unwrap()
    except OutcomeError as exc:
        print(f"unwrap: OutcomeError, caused by {type(exc.__cause__).__name__}")


if __name__ == "__main__":
    trio.run(main)

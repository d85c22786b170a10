"""A custom subscriber: per-task attempt statistics from lifecycle events.

A subscriber is any object with ``async def on_event(self, event)``; optional
attributes ``name`` (default: the class name) and ``queue_capacity`` (default 1024).
Each subscriber gets its own bounded queue and its own task ("lane"), so:

* a slow subscriber never slows the tasks: when its queue is full it loses events,
  then gets one ``SUBSCRIBER_OVERFLOW`` event saying how many (``dropped``);
* a subscriber that raises is isolated: the others get ``SUBSCRIBER_FAILED``, and it
  keeps receiving events.

Events are best-effort: use them for metrics and logs, waiters for results.
"""

import collections

import trio

from trio_taskvisor import (
    BackoffPolicy,
    EventKind,
    OutcomeKind,
    SupervisorConfig,
    TaskEvent,
    TaskSpec,
    current_context,
    open_supervisor,
)


class AttemptStats:
    """Count attempts and failures, and sum attempt time, per task."""

    name = "attempt-stats"

    def __init__(self) -> None:
        self.attempts: collections.Counter[str] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()
        self.busy: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.outcomes: dict[str, OutcomeKind] = {}
        self.notices: list[str] = []

    async def on_event(self, event: TaskEvent) -> None:
        name = event.name or ""
        if event.kind is EventKind.ATTEMPT_STARTING:
            self.attempts[name] += 1
        elif event.kind in (EventKind.ATTEMPT_FAILED, EventKind.ATTEMPT_TIMED_OUT):
            self.failures[name] += 1
        if event.duration is not None:  # on every attempt's end event
            self.busy[name] += event.duration
        if event.kind is EventKind.TASK_FINISHED and event.outcome is not None:
            self.outcomes[name] = event.outcome
        if event.kind is EventKind.SUBSCRIBER_FAILED:  # another subscriber raised
            self.notices.append(f"{event.name} failed: {event.reason}")


class Auditor:
    """A subscriber that is slow (with a tiny queue) and has a bug."""

    name = "auditor"
    queue_capacity = 2

    def __init__(self) -> None:
        self.lost = 0
        self.seen = 0

    async def on_event(self, event: TaskEvent) -> None:
        if event.kind is EventKind.SUBSCRIBER_OVERFLOW:  # sent to this lane only
            self.lost += event.dropped or 0
            return
        await trio.sleep(0.01)  # slower than events arrive: its queue overflows
        self.seen += 1
        if self.seen == 1:  # the bug: reported to the others, and this lane goes on
            raise KeyError(f"audit column {event.kind.value!r} missing")


async def ingest() -> int:
    ctx = current_context()
    await trio.sleep(0.02)
    if ctx.attempt < 3:
        raise OSError(f"disk busy (attempt {ctx.attempt})")
    return 3


async def index() -> None:
    await trio.sleep(0.03)


async def main() -> None:
    stats = AttemptStats()
    auditor = Auditor()
    specs = [
        TaskSpec.restartable("ingest", ingest, backoff=BackoffPolicy.constant(0.01)),
        TaskSpec.once("index", index),
    ]
    async with open_supervisor(SupervisorConfig(grace=1.0), subscribers=[stats, auditor]) as sup:
        for waiter in await sup.add_batch(specs):
            await waiter.wait()
        await trio.sleep(0.2)  # let the slow auditor catch up before shutdown drains it
        dropped = sup.statistics().subscriber_dropped

    for name in sorted(stats.attempts):
        print(
            f"{name}: {stats.attempts[name]} attempts, {stats.failures[name]} failed, "
            f"{stats.busy[name]:.2f} s busy, {stats.outcomes[name].name}"
        )
    for notice in stats.notices:
        print(notice)
    print(f"auditor was told it lost {auditor.lost} events")
    print(f"dropped per subscriber: {dict(dropped)}")


if __name__ == "__main__":
    trio.run(main)

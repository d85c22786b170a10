"""No events after ``TASK_REMOVED``: ``FORCED_TASK_EXITED`` and
``statistics().forced_alive``.

A force-aborted task's outcome is committed at the grace deadline (``TASK_FINISHED``,
``TASK_REMOVED``); its body may run on. When it physically exits it publishes one
``FORCED_TASK_EXITED`` (``duration``: from the force to the exit), and never an
``ATTEMPT_*`` event. Virtual time: every duration is exact.
"""

from __future__ import annotations

import trio
import trio.testing

from trio_taskvisor import EventKind, OutcomeKind, TaskSpec
from trio_taskvisor.testing import EventRecorder

from helpers import ATTEMPT_END_KINDS, forever, kinds_of, stubborn, supervisor

FORCED_TRAIL = [
    EventKind.TASK_ADD_REQUESTED,
    EventKind.TASK_ADDED,
    EventKind.ATTEMPT_STARTING,
    EventKind.TASK_REMOVE_REQUESTED,
    EventKind.TASK_FINISHED,
    EventKind.TASK_REMOVED,
    EventKind.FORCED_TASK_EXITED,
]


async def test_a_forced_task_ends_its_events_with_forced_task_exited(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Forced at 5 s, exited at 20 s: no attempt event after TASK_REMOVED, one exit."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("t")
        assert trio.current_time() == 5.0
        assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        exited = await recorder.wait_for(EventKind.FORCED_TASK_EXITED, name="t")
    assert kinds_of(recorder, "t") == FORCED_TRAIL
    assert (exited.task_id, exited.slot, exited.time, exited.duration) == (
        waiter.id,
        None,
        20.0,
        15.0,
    )
    assert recorder.of(EventKind.TASK_REMOVED, name="t")[0].time == 5.0


async def test_forced_alive_counts_forced_tasks_until_they_exit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``statistics().forced_alive``: forced, not registered, still physically running."""
    async with supervisor(grace=5.0) as sup:
        await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.statistics().forced_alive == 0
        await sup.cancel("t")
        stats = sup.statistics()
        assert (stats.registered, stats.alive, stats.forced_alive) == (0, 1, 1)
        await trio.sleep(15.0)
        await trio.testing.wait_all_tasks_blocked()
        stats = sup.statistics()
        assert (stats.registered, stats.alive, stats.forced_alive) == (0, 0, 0)


async def test_a_force_at_the_exit_has_a_zero_duration(autojump_clock: trio.abc.Clock) -> None:
    """``grace=0``: forced at the stop, exited at its next step, ``duration == 0``."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=0.0) as sup:
        await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()
        await sup.remove("t")
    exited = recorder.of(EventKind.FORCED_TASK_EXITED, name="t")
    assert [(e.time, e.duration) for e in exited] == [(0.0, 0.0)]
    assert not any(e.kind in ATTEMPT_END_KINDS for e in recorder.events if e.name == "t")


async def test_every_task_forced_by_the_shutdown_exits_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Stuck tasks of a shutdown each publish one FORCED_TASK_EXITED, after the grace."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=2.0, stuck=("a", "b")) as sup:
        await sup.add(TaskSpec.once("a", stubborn, 3.0))
        await sup.add(TaskSpec.once("b", stubborn, 7.0))
        await sup.add(TaskSpec.once("c", forever))
        await trio.testing.wait_all_tasks_blocked()  # their attempts have begun
    exits = {e.name: e.duration for e in recorder.of(EventKind.FORCED_TASK_EXITED)}
    assert exits == {"a": 1.0, "b": 5.0}
    for name in ("a", "b"):
        assert kinds_of(recorder, name)[-3:] == [
            EventKind.TASK_FINISHED,
            EventKind.TASK_REMOVED,
            EventKind.FORCED_TASK_EXITED,
        ]
    assert kinds_of(recorder, "c")[-1] is EventKind.TASK_REMOVED

"""Queue deadlines: ``queue_timeout`` on QUEUE and REPLACE work.

Work still queued or held at exactly intake + timeout is withdrawn
``REJECTED(QUEUE_TIMEOUT)`` (``CONTROLLER_REJECTED`` published), its body never runs and
its joiners share the outcome; work that became the owner before is not affected; a
REPLACE withdrawn at its deadline does not undo its stop. Intake is when ``submit`` or
``submit_nowait`` hands the work over. (Invalid values: ``test_bad_input.py``.)
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ControllerSpec,
    EventKind,
    OutcomeError,
    OutcomeKind,
    Placement,
    RejectionKind,
)
from trio_taskvisor.testing import EventRecorder

from helpers import (
    Body,
    job,
    join,
    once,
    queue,
    rejected,
    replace,
    settle,
    submitted_reasons,
    supervisor,
    winding_down,
)

TIMED_OUT = rejected(RejectionKind.QUEUE_TIMEOUT)


def test_queue_timeout_defaults_to_none_and_keeps_its_value() -> None:
    """queue_timeout is None by default; a number is kept as a float, inf as inf."""
    task = once("w")
    assert ControllerSpec.queue(task).queue_timeout is None
    assert ControllerSpec.queue(task, queue_timeout=2).queue_timeout == 2.0
    assert ControllerSpec.replace(task, queue_timeout=math.inf).queue_timeout == math.inf
    assert ControllerSpec(task, queue_timeout=0.5).queue_timeout == 0.5


# -- queued and held work at exactly intake + timeout ------------------------------------------


async def test_queued_work_is_withdrawn_at_exactly_intake_plus_timeout(
    autojump_clock: Any,
) -> None:
    """Queued work whose deadline passes ends REJECTED(QUEUE_TIMEOUT) then, never running."""
    recorder = EventRecorder()
    body = Body()
    async with supervisor(recorder, max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        await trio.sleep(1.0)
        waiter = await sup.submit(queue("late", body, slot="s", queue_timeout=2.5))
        assert await waiter.wait() == TIMED_OUT
        assert trio.current_time() == 3.5
        assert waiter.placement is Placement.QUEUED
        assert sup.controller_snapshot().total_queued == 0
    assert body.started == 0
    [event] = recorder.of(EventKind.CONTROLLER_REJECTED, task_id=waiter.id)
    assert (event.time, event.rejection, event.slot) == (3.5, RejectionKind.QUEUE_TIMEOUT, "s")
    assert recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=waiter.id) == []


async def test_held_work_is_withdrawn_at_exactly_intake_plus_timeout(autojump_clock: Any) -> None:
    """Held work whose deadline passes while held ends QUEUE_TIMEOUT, placed REJECTED."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        await trio.sleep(2.0)
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True, queue_timeout=3.0))
        assert await held.wait() == TIMED_OUT
        assert trio.current_time() == 5.0
        assert held.placement is Placement.REJECTED
        assert sup.controller_snapshot().slot("s").waiting == 0  # type: ignore[union-attr]
    assert submitted_reasons(recorder, held) == ["held"]


async def test_work_that_became_the_owner_before_its_deadline_is_unaffected(
    autojump_clock: Any,
) -> None:
    """Queued work that starts before its deadline runs to its end, past the deadline."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        waiter = await sup.submit(queue("next", job, 5.0, "done", slot="s", queue_timeout=2.0))
        assert (await waiter.wait()).value == "done"
        assert trio.current_time() == 6.0


async def test_deadline_and_owner_exit_at_the_same_instant_withdraw(autojump_clock: Any) -> None:
    """The deadline is inclusive: work whose deadline is the instant its turn comes is out."""
    body = Body()
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 2.0, slot="s"))
        waiter = await sup.submit(queue("next", body, slot="s", queue_timeout=2.0))
        assert await waiter.wait() == TIMED_OUT
        assert trio.current_time() == 2.0
        await sup.wait_idle()
    assert body.started == 0


async def test_held_work_placed_before_its_deadline_keeps_it_in_the_queue(
    autojump_clock: Any,
) -> None:
    """Held work placed in the queue still leaves at its deadline if it has not started."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        await sup.submit(queue("queued", job, 10.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True, queue_timeout=4.0))
        assert await held.wait_placed() is Placement.QUEUED
        assert trio.current_time() == 1.0
        assert await held.wait() == TIMED_OUT
        assert trio.current_time() == 4.0


async def test_expired_queued_work_frees_room_for_held_work(autojump_clock: Any) -> None:
    """Room freed by a queue deadline is offered to held work at once."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        await sup.submit(queue("queued", job, 1.0, slot="s", queue_timeout=3.0))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        assert await held.wait_placed() is Placement.QUEUED
        assert trio.current_time() == 3.0


async def test_deadlines_expire_in_their_own_order(autojump_clock: Any) -> None:
    """Each queued submission leaves at its own deadline, earliest first."""
    ended: list[tuple[str, float]] = []
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 100.0, slot="s"))
        waiters = [
            await sup.submit(queue(name, job, 1.0, slot="s", queue_timeout=timeout))
            for name, timeout in (("a", 9.0), ("b", 2.0), ("c", 5.0))
        ]
        async with trio.open_nursery() as nursery:
            for waiter in waiters:

                async def note(w: Any = waiter) -> None:
                    await w.wait()
                    ended.append((w.name, trio.current_time()))

                nursery.start_soon(note)
    assert ended == [("b", 2.0), ("c", 5.0), ("a", 9.0)]


async def test_removed_work_leaves_no_deadline_behind(autojump_clock: Any) -> None:
    """Work removed before its deadline ends REMOVED_FROM_QUEUE; the deadline does nothing."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, slot="s", queue_timeout=3.0))
        assert await sup.remove(waiter.id)
        await trio.sleep(5.0)
        assert waiter.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
    assert [e.rejection for e in recorder.of(EventKind.CONTROLLER_REJECTED)] == [
        RejectionKind.REMOVED_FROM_QUEUE
    ]


# -- zero, None and inf ------------------------------------------------------------------------


async def test_zero_timeout_on_an_idle_slot_starts_the_work(autojump_clock: Any) -> None:
    """queue_timeout=0 does not affect work that starts on an idle slot."""
    async with supervisor(max_slot_queue=10) as sup:
        waiter = await sup.submit(queue("w", job, 1.0, "ran", slot="s", queue_timeout=0))
        assert (await waiter.wait()).value == "ran"


async def test_zero_timeout_rejects_work_that_would_be_queued_at_intake(
    autojump_clock: Any,
) -> None:
    """queue_timeout=0 on a busy slot: it never enters the queue, so it is placed
    REJECTED(QUEUE_TIMEOUT) at once; only CONTROLLER_REJECTED is published for it."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, slot="s", queue_timeout=0))
        assert waiter.placement is Placement.REJECTED
        assert waiter.outcome_nowait() == TIMED_OUT
        assert trio.current_time() == 0.0
    assert [e.kind for e in recorder.events if e.task_id == waiter.id] == [
        EventKind.CONTROLLER_REJECTED
    ]


async def test_zero_timeout_rejects_work_that_would_be_held_at_intake(
    autojump_clock: Any,
) -> None:
    """queue_timeout=0 on work that would be held: placed REJECTED, never submitted."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        held = await sup.submit(queue("w", job, 1.0, slot="s", wait=True, queue_timeout=0))
        assert held.placement is Placement.REJECTED
        assert held.outcome_nowait() == TIMED_OUT
        assert trio.current_time() == 0.0
    assert submitted_reasons(recorder, held) == []


async def test_zero_timeout_replace_on_a_busy_slot_still_stops_the_owner(
    autojump_clock: Any,
) -> None:
    """A REPLACE with queue_timeout=0 is rejected at intake, and its stop stands."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", job, 10.0, slot="s"))
        newer = await sup.submit(replace("newer", job, 1.0, slot="s", queue_timeout=0))
        assert newer.placement is Placement.REJECTED
        assert newer.outcome_nowait() == TIMED_OUT
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 0.0
    assert submitted_reasons(recorder, newer) == []
    assert recorder.of(EventKind.CONTROLLER_SLOT_TRANSITION, reason="running->terminating")


@pytest.mark.parametrize("limit", [None, math.inf])
async def test_none_and_inf_set_no_deadline(autojump_clock: Any, limit: float | None) -> None:
    """queue_timeout None or inf: queued work waits as long as it takes."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1000.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, "v", slot="s", queue_timeout=limit))
        assert (await waiter.wait()).value == "v"
        assert trio.current_time() == 1001.0


# -- intake ------------------------------------------------------------------------------------


async def test_deadline_counts_from_submit_not_from_prepare(autojump_clock: Any) -> None:
    """prepare_submission starts nothing: the deadline counts from the submit."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 100.0, slot="s"))
        prepared = sup.prepare_submission(queue("w", job, 1.0, slot="s", queue_timeout=2.0))
        await trio.sleep(5.0)
        waiter = await prepared.submit()
        assert await waiter.wait() == TIMED_OUT
        assert trio.current_time() == 7.0


async def test_deadline_counts_from_submit_nowait(autojump_clock: Any) -> None:
    """submit_nowait hands the work over at the call: the deadline counts from there."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 100.0, slot="s"))
        await trio.sleep(1.0)
        waiter = sup.submit_nowait(queue("w", job, 1.0, slot="s", queue_timeout=2.0))
        assert await waiter.wait() == TIMED_OUT
        assert trio.current_time() == 3.0


async def test_an_earlier_deadline_taken_in_later_wakes_the_loop_earlier(
    autojump_clock: Any,
) -> None:
    """A deadline earlier than the one the controller waits for is kept, to the instant."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 100.0, slot="s"))
        far = await sup.submit(queue("far", job, 1.0, slot="s", queue_timeout=50.0))
        await settle()  # the controller waits for 50.0 now
        near = await sup.submit(queue("near", job, 1.0, slot="s", queue_timeout=1.5))
        assert await near.wait() == TIMED_OUT
        assert trio.current_time() == 1.5
        assert await far.wait() == TIMED_OUT
        assert trio.current_time() == 50.0


# -- joiners and REPLACE -----------------------------------------------------------------------


async def test_joiners_of_timed_out_work_get_its_outcome(autojump_clock: Any) -> None:
    """A joiner following queued work that times out resolves QUEUE_TIMEOUT with it."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        tail = await sup.submit(queue("tail", job, 1.0, slot="s", queue_timeout=4.0))
        joiner = await sup.submit(join("j", job, 1.0, slot="s"))
        assert await joiner.wait_placed() is Placement.JOINED
        assert await joiner.wait() == TIMED_OUT
        assert trio.current_time() == 4.0
        assert tail.outcome_nowait() == TIMED_OUT


async def test_cancel_at_the_deadline_returns_once_the_timeout_is_committed(
    mock_clock: trio.testing.MockClock,
) -> None:
    """``cancel()`` of queued work that reaches the loop in the instant of its deadline,
    before the loop woke for the deadline: the timeout wins, and ``cancel()`` returns
    ``False`` only once the outcome is committed (it returned with the work pending)."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        waiter = await sup.submit(queue("late", job, 1.0, slot="s", queue_timeout=1.0))
        await settle()  # the loop waits for the deadline
        mock_clock.jump(1.0)  # no checkpoint: the cancel's command reaches the loop first
        assert await sup.cancel(waiter.id) is False
        assert waiter.outcome_nowait() == TIMED_OUT
        assert trio.current_time() == 1.0
        await sup.cancel("owner")


async def test_replace_withdrawn_at_its_deadline_does_not_undo_its_stop(
    autojump_clock: Any,
) -> None:
    """A REPLACE that times out while the owner winds down: the owner still stops."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=10.0, max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", winding_down, 5.0, slot="s"))
        await trio.sleep(1.0)
        newer = await sup.submit(replace("newer", job, 1.0, slot="s", queue_timeout=2.0))
        assert await newer.wait() == TIMED_OUT
        assert trio.current_time() == 3.0
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.queue_depth, view.owner_id) == (0, owner.id)
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 5.0  # its deferred work done, the stop lands
        await sup.wait_idle()
    assert recorder.of(EventKind.CONTROLLER_SLOT_TRANSITION, reason="running->terminating")


async def test_run_in_slot_with_a_queue_timeout_raises_outcome_error(autojump_clock: Any) -> None:
    """run_in_slot(queue_timeout=...) whose work times out raises OutcomeError(QUEUE_TIMEOUT)."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", job, 1.0, queue_timeout=2.0)
        assert info.value.outcome == TIMED_OUT
        assert trio.current_time() == 2.0


async def test_run_in_slot_within_its_queue_timeout_returns_the_value(autojump_clock: Any) -> None:
    """A keyed call that starts before its queue deadline returns its value."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        assert await sup.run_in_slot("s", job, 3.0, "v", queue_timeout=2.0) == "v"
        assert trio.current_time() == 4.0


async def test_pending_deadlines_at_shutdown_reject_shutting_down(autojump_clock: Any) -> None:
    """At shutdown queued work with a deadline ends SHUTTING_DOWN, not QUEUE_TIMEOUT."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, slot="s", queue_timeout=3.0))
    assert waiter.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)

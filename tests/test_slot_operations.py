"""Slot-wide operations (DESIGN section 11): ``cancel_slot`` and ``wait_slot_idle``.

``cancel_slot`` withdraws the slot's queued and held work (as removals by id), stops the
owner (grace, then force) and returns when the owner's outcome is committed, with a
count; ``wait_slot_idle`` returns at the exact end of the slot's last work. Both raise
``DeadlockError`` from inside the slot's own attempt. (Without a controller:
``test_bad_input.py``.)
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    DeadlockError,
    EventKind,
    OutcomeKind,
    Placement,
    RejectionKind,
    current_context,
)
from trio_taskvisor.testing import EventRecorder

from helpers import (
    Body,
    forever,
    job,
    join,
    queue,
    rejected,
    replace,
    settle,
    stall_registry,
    stubborn,
    supervisor,
)

REMOVED = rejected(RejectionKind.REMOVED_FROM_QUEUE)


# -- cancel_slot -------------------------------------------------------------------------------


async def test_cancel_slot_withdraws_the_line_and_stops_a_cooperative_owner(
    autojump_clock: Any,
) -> None:
    """Queued and held work is withdrawn, the owner stopped; the count includes the owner."""
    body = Body()
    async with supervisor(max_slot_queue=1) as sup:
        owner = await sup.submit(queue("owner", forever, slot="s"))
        queued = await sup.submit(queue("queued", body, slot="s"))
        held = await sup.submit(queue("held", body, slot="s", wait=True))
        await trio.sleep(1.0)
        assert await sup.cancel_slot("s") == 3
        assert trio.current_time() == 1.0
        assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert queued.outcome_nowait() == REMOVED
        assert held.outcome_nowait() == REMOVED
        assert (queued.placement, held.placement) == (Placement.QUEUED, Placement.REJECTED)
        await sup.wait_idle()
        assert sup.controller_snapshot().slots == ()
    assert body.started == 0


async def test_cancel_slot_publishes_each_removal_before_its_rejection(
    autojump_clock: Any,
) -> None:
    """Each withdrawn submission: TASK_REMOVE_REQUESTED, then CONTROLLER_REJECTED, in line order."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=1) as sup:
        owner = await sup.submit(queue("owner", forever, slot="s"))
        queued = await sup.submit(queue("queued", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        await sup.cancel_slot("s")
    trail = [
        (e.kind, e.task_id)
        for e in recorder.events
        if e.kind in (EventKind.TASK_REMOVE_REQUESTED, EventKind.CONTROLLER_REJECTED)
    ]
    assert trail == [
        (EventKind.TASK_REMOVE_REQUESTED, queued.id),
        (EventKind.CONTROLLER_REJECTED, queued.id),
        (EventKind.TASK_REMOVE_REQUESTED, held.id),
        (EventKind.CONTROLLER_REJECTED, held.id),
        (EventKind.TASK_REMOVE_REQUESTED, owner.id),
    ]
    rejections = recorder.of(EventKind.CONTROLLER_REJECTED)
    assert {e.rejection for e in rejections} == {RejectionKind.REMOVED_FROM_QUEUE}


async def test_cancel_slot_with_a_stubborn_owner_returns_at_the_grace_deadline(
    autojump_clock: Any,
) -> None:
    """A stubborn owner is forced at exactly the grace deadline; the slot stays reserved."""
    async with supervisor(grace=3.0, max_slot_queue=10, stuck=()) as sup:
        owner = await sup.submit(queue("owner", stubborn, 10.0, slot="s"))
        await sup.submit(queue("queued", job, 1.0, slot="s"))
        await trio.sleep(1.0)
        assert await sup.cancel_slot("s") == 2
        assert trio.current_time() == 4.0
        assert owner.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.owner_id, view.queue_depth) == (owner.id, 0)
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 10.0  # the body's physical exit


async def test_cancel_slot_on_a_forced_owner_still_running_counts_it_and_returns_at_once(
    autojump_clock: Any,
) -> None:
    """An owner already forced (its outcome committed) but still physically running
    counts 1, and ``cancel_slot`` returns without waiting for its exit."""
    async with supervisor(grace=3.0, max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", stubborn, 10.0, slot="s"))
        await trio.sleep(1.0)
        await sup.cancel(owner.id)
        assert trio.current_time() == 4.0
        assert owner.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        await trio.sleep(1.0)
        assert await sup.cancel_slot("s") == 1
        assert trio.current_time() == 5.0
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert view.owner_id == owner.id  # reserved until the body exits
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 10.0


async def test_cancel_slot_resolves_joiners_of_withdrawn_work_and_does_not_count_them(
    autojump_clock: Any,
) -> None:
    """Joiners of withdrawn work share its outcome; joiners of the owner get the owner's."""
    async with supervisor(max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", forever, slot="s"))
        on_owner = await sup.submit(join("j-owner", job, 1.0, slot="s"))
        await sup.submit(queue("tail", job, 1.0, slot="s"))
        on_tail = await sup.submit(join("j-tail", job, 1.0, slot="s"))
        assert await sup.cancel_slot("s") == 2
        assert on_tail.outcome_nowait() == REMOVED
        assert on_owner.outcome_nowait() == owner.outcome_nowait()
        assert on_owner.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_cancel_slot_never_offers_freed_room_to_the_slots_held_work(
    autojump_clock: Any,
) -> None:
    """Held work of the slot is withdrawn while held, though its queue room frees first."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=1) as sup:
        await sup.submit(queue("owner", forever, slot="s"))
        await sup.submit(queue("queued", job, 1.0, slot="s"))
        held = [await sup.submit(queue(f"h{i}", job, 1.0, slot="s", wait=True)) for i in range(2)]
        assert await sup.cancel_slot("s") == 4
    for waiter in held:
        assert waiter.placement is Placement.REJECTED
        assert submitted_reasons_of(recorder, waiter.id) == ["held"]


def submitted_reasons_of(recorder: EventRecorder, task_id: int) -> list[str | None]:
    return [e.reason for e in recorder.of(EventKind.CONTROLLER_SUBMITTED, task_id=task_id)]


async def test_cancel_slot_gives_freed_room_to_other_slots_held_work(autojump_clock: Any) -> None:
    """Pending room freed by cancel_slot goes to another slot's held work at once."""
    async with supervisor(max_total_pending=1) as sup:
        await sup.submit(queue("a-owner", forever, slot="a"))
        await sup.submit(queue("a-queued", job, 1.0, slot="a"))
        await sup.submit(queue("b-owner", forever, slot="b"))
        b_held = await sup.submit(queue("b-held", job, 1.0, slot="b", wait=True))
        await trio.sleep(1.0)
        assert b_held.placement is None
        assert await sup.cancel_slot("a") == 2
        assert b_held.placement is Placement.QUEUED


async def test_cancel_slot_withdraws_a_queued_replacement(autojump_clock: Any) -> None:
    """A REPLACE queued behind a stopping owner is withdrawn too; the count has both."""
    async with supervisor(grace=10.0, max_slot_queue=10) as sup:
        await sup.submit(queue("owner", stubborn, 2.0, slot="s"))
        await settle()  # the owner runs (a REPLACE while it is admitting stops it sooner)
        newer = await sup.submit(replace("newer", job, 1.0, slot="s"))
        assert await sup.cancel_slot("s") == 2
        assert trio.current_time() == 2.0  # the owner's CANCELLED outcome, within grace
        assert newer.outcome_nowait() == REMOVED


async def test_cancel_slot_of_an_already_stopping_owner_counts_it_and_waits(
    autojump_clock: Any,
) -> None:
    """An owner whose stop was requested before counts 1; the call waits for its end."""
    async with supervisor(grace=10.0, max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", stubborn, 4.0, slot="s"))
        assert await sup.remove(owner.id)
        await trio.sleep(1.0)
        assert await sup.cancel_slot("s") == 1
        assert trio.current_time() == 4.0
        assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_cancel_slot_stops_an_owner_still_admitting(autojump_clock: Any) -> None:
    """An owner the registry has not decided on yet is stopped once admitted."""
    body = Body()
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=10) as sup:
        stall_registry(sup)
        # Both commands reach the controller in one batch: the owner is taken in, handed
        # to the registry's inbox (ADMITTING), then cancel_slot stops it behind that.
        owner = sup.submit_nowait(queue("owner", body, slot="s"))
        assert await sup.cancel_slot("s") == 1
        assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 0.0
    assert body.started == 0
    assert recorder.of(EventKind.ATTEMPT_STARTING, task_id=owner.id) == []


async def test_cancel_slot_does_not_touch_work_submitted_after_it(autojump_clock: Any) -> None:
    """Work submitted after cancel_slot was taken in runs once the owner is gone."""
    async with supervisor(grace=5.0, max_slot_queue=10) as sup:
        await sup.submit(queue("owner", stubborn, 2.0, slot="s"))
        async with trio.open_nursery() as nursery:
            counts: list[int] = []

            async def cancel() -> None:
                counts.append(await sup.cancel_slot("s"))

            nursery.start_soon(cancel)
            await settle()  # cancel_slot was taken in; it waits for the owner now
            later = await sup.submit(queue("later", job, 1.0, "v", slot="s"))
        assert counts == [1]
        assert (await later.wait()).value == "v"
        assert trio.current_time() == 3.0


async def test_cancel_slot_of_an_idle_or_unknown_slot_is_zero_and_a_checkpoint(
    autojump_clock: Any,
) -> None:
    """An idle or never used slot gives 0, as a checkpoint."""
    async with supervisor(max_slot_queue=10) as sup:
        waiter = await sup.submit(queue("w", job, 1.0, slot="s"))
        await waiter.wait()
        for slot in ("s", "never-used"):
            with trio.testing.assert_checkpoints():
                assert await sup.cancel_slot(slot) == 0


async def test_cancel_slot_from_another_attempt_works(autojump_clock: Any) -> None:
    """An attempt in another slot may cancel a slot; it waits for that owner's stop."""

    async def canceller() -> int:
        return await current_context().supervisor.cancel_slot("s")

    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", forever, slot="s"))
        await sup.submit(queue("queued", job, 1.0, slot="s"))
        assert await sup.run_in_slot("other", canceller) == 2


# -- wait_slot_idle ----------------------------------------------------------------------------


async def test_wait_slot_idle_returns_at_the_exact_end_of_the_slots_last_work(
    autojump_clock: Any,
) -> None:
    """wait_slot_idle returns when the last queued work of the slot ends."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("a", job, 1.0, slot="s"))
        await sup.submit(queue("b", job, 2.5, slot="s"))
        await sup.submit(queue("other", job, 10.0, slot="o"))
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 3.5
        assert sup.controller_snapshot().slot("s") is None


async def test_wait_slot_idle_waits_for_held_work(autojump_clock: Any) -> None:
    """Held work keeps the slot busy until it has run."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        await sup.submit(queue("held", job, 2.0, slot="s", wait=True))
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 3.0


async def test_wait_slot_idle_waits_for_work_still_in_the_command_channel(
    autojump_clock: Any,
) -> None:
    """A submission of the slot not yet taken in keeps the slot busy."""
    async with supervisor(max_slot_queue=10) as sup:
        sup.submit_nowait(queue("w", job, 2.0, slot="s"))
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 2.0


async def test_wait_slot_idle_waits_for_a_forced_owner_to_exit(autojump_clock: Any) -> None:
    """A forced owner still physically running keeps the slot busy until it exits."""
    async with supervisor(grace=1.0, max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", stubborn, 10.0, slot="s"))
        assert await sup.cancel(owner.id)
        assert trio.current_time() == 1.0
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 10.0


async def test_wait_slot_idle_on_an_idle_slot_returns_at_once_as_a_checkpoint(
    autojump_clock: Any,
) -> None:
    """An idle slot: wait_slot_idle returns at once, as a checkpoint."""
    async with supervisor(max_slot_queue=10) as sup:
        with trio.testing.assert_checkpoints():
            await sup.wait_slot_idle("s")
        assert trio.current_time() == 0.0


async def test_several_callers_of_wait_slot_idle_all_return(autojump_clock: Any) -> None:
    """Every caller waiting for one slot returns when it becomes idle."""
    returned: list[float] = []
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("w", job, 2.0, slot="s"))

        async def wait_idle() -> None:
            await sup.wait_slot_idle("s")
            returned.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(wait_idle)
    assert returned == [2.0, 2.0, 2.0]


# -- from inside the slot's own attempt --------------------------------------------------------


@pytest.mark.parametrize("operation", ["cancel_slot", "wait_slot_idle"])
async def test_slot_operations_from_the_owners_attempt_raise_deadlock(
    autojump_clock: Any, operation: str
) -> None:
    """From inside the attempt owning the slot, both raise DeadlockError and change nothing."""

    async def owner_body() -> str:
        ctx = current_context()
        with pytest.raises(DeadlockError) as info:
            await getattr(ctx.supervisor, operation)("s")
        return str(info.value)

    async with supervisor(max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", owner_body, slot="s"))
        queued = await sup.submit(queue("queued", job, 1.0, "ran", slot="s"))
        message = (await owner.wait()).value
        assert message == (
            f"task 'owner' ({owner.id}) owns slot 's': "
            f"{operation} from inside it would wait for the task itself"
        )
        assert (await queued.wait()).value == "ran"

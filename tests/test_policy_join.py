"""JOIN: a joiner follows the slot's owner, or its queue tail, and resolves to that work's
outcome; on an idle slot it runs its own work; it is never registered, and it takes a
``max_waiters`` unit. (Removing a joiner: ``test_controller_stops.py``.)
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from trio_taskvisor import ControllerConfig, EventKind, OutcomeKind, RejectionKind
from trio_taskvisor.testing import EventRecorder

from helpers import (
    job,
    join,
    queue,
    rejected,
    replace,
    stubborn,
    submitted_reasons,
    supervisor,
)

# -- following work ------------------------------------------------------------------------


async def test_join_on_busy_slot_resolves_to_the_owner_outcome(autojump_clock: Any) -> None:
    """A joiner on a slot with no queue resolves to the owner's outcome, when it does."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", job, 1.0, 42, slot="s"))
        joiner = await sup.submit(join("joiner", job, 5.0, "mine", slot="s"))
        outcome = await joiner.wait()
        assert trio.current_time() == 1.0
        assert outcome == await owner.wait()
        assert outcome.value == 42


async def test_join_follows_the_queue_tail(autojump_clock: Any) -> None:
    """A joiner on a slot with a queue resolves to the last queued work's outcome."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("first", job, 1.0, "first", slot="s"))
        await sup.submit(queue("second", job, 1.0, "second", slot="s"))
        joiner = await sup.submit(join("joiner", job, 5.0, "mine", slot="s"))
        assert (await joiner.wait()).value == "second"
        assert trio.current_time() == 2.0


async def test_join_on_full_queue_follows_the_queue_tail_not_held_work(
    autojump_clock: Any,
) -> None:
    """With the queue full and work held, a JOIN follows the queue tail."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", job, 1.0, "owner", slot="s"))
        await sup.submit(queue("tail", job, 1.0, "tail", slot="s"))
        await sup.submit(queue("held", job, 1.0, "held", slot="s", wait=True))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        assert (await joiner.wait()).value == "tail"
        assert trio.current_time() == 2.0


async def test_join_resolves_rejected_when_followed_work_is_superseded(
    autojump_clock: Any,
) -> None:
    """A joiner following a queue head that gets superseded resolves REJECTED(SUPERSEDED)."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        head = await sup.submit(queue("head", job, 1.0, slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        await sup.submit(replace("new", job, 1.0, slot="s"))
        assert await joiner.wait() == rejected(RejectionKind.SUPERSEDED)
        assert await head.wait() == rejected(RejectionKind.SUPERSEDED)
        assert trio.current_time() == 0.0


async def test_join_on_idle_slot_runs_its_own_work(autojump_clock: Any) -> None:
    """A JOIN on an idle slot starts its own work, like any policy."""
    async with supervisor(controller=ControllerConfig()) as sup:
        joiner = await sup.submit(join("joiner", job, 1.0, "mine", slot="s"))
        assert (await joiner.wait()).value == "mine"
        assert trio.current_time() == 1.0


# -- identity and events -------------------------------------------------------------------


async def test_joiner_id_is_never_registered(autojump_clock: Any) -> None:
    """A joiner's own TaskId never appears in list()."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", job, 1.0, slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        await trio.testing.wait_all_tasks_blocked()
        assert [info.id for info in sup.list()] == [owner.id]
        assert joiner.id != owner.id


async def test_join_publishes_submitted_naming_the_followed_work(autojump_clock: Any) -> None:
    """A joiner publishes CONTROLLER_SUBMITTED with reason "joined #N"."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        tail = await sup.submit(queue("tail", job, 1.0, slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        await joiner.wait()
    assert submitted_reasons(recorder, joiner) == [f"joined {tail.id}"]


# -- max_waiters ---------------------------------------------------------------------------


async def test_joiner_uses_a_max_waiters_unit(autojump_clock: Any) -> None:
    """A joiner counts against max_waiters: held work past it gets RESOURCE_LIMIT."""
    async with supervisor(max_slot_queue=0, max_waiters=1) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        assert await held.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert (await joiner.wait()).kind is OutcomeKind.COMPLETED


async def test_join_past_max_waiters_is_rejected_resource_limit(autojump_clock: Any) -> None:
    """A JOIN on a busy slot with max_waiters in use is REJECTED(RESOURCE_LIMIT)."""
    async with supervisor(max_waiters=1) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        await sup.submit(join("joiner-1", job, 1.0, slot="s"))
        extra = await sup.submit(join("joiner-2", job, 1.0, slot="s"))
        assert await extra.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_joiners_of_a_forced_owner_hold_no_budget_and_cannot_be_removed(
    autojump_clock: Any,
) -> None:
    """An owner forced at its grace deadline runs on (its own shield) until 7.5, but
    its joiners have their outcome at 1.0: they hold no ``max_waiters`` unit from then
    on, ``cancel()`` of one is ``False`` (it is finished), and a JOIN of that owner gets
    its outcome at once. Before, they held the unit until the owner's physical exit
    (every JOIN and held submission of every slot refused ``RESOURCE_LIMIT``), and
    ``cancel()`` of one returned ``True`` and published a removal."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=1.0, max_slot_queue=0, max_waiters=1) as sup:
        owner = await sup.submit(queue("owner", stubborn, 7.5, slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        await sup.cancel(owner.id)  # forced at 1.0
        assert trio.current_time() == 1.0
        assert (await joiner.wait()).kind is OutcomeKind.FORCE_ABORTED
        assert await sup.cancel(joiner.id) is False
        late = await sup.submit(join("late", job, 1.0, slot="s"))
        assert (await late.wait()).kind is OutcomeKind.FORCE_ABORTED
        await sup.submit(queue("other", job, 5.0, slot="t"))
        held = await sup.submit(queue("held", job, 1.0, "v", slot="t", wait=True))
        assert (await held.wait()).value == "v"
        assert trio.current_time() == 7.0  # held took its turn at 6.0
    assert [e.kind for e in recorder.events if e.task_id == joiner.id] == [
        EventKind.CONTROLLER_SUBMITTED
    ]

"""Wait-for cycles with real tasks: ``DeadlockError`` exactly when a wait
inside an attempt closes a cycle of slot, permit and wait edges, at once or by a later
edge; the message names the cycle from the caller; a wait that is only slow never
raises. A Hypothesis test builds random wait-for graphs out of real tasks (slots, a small
``max_concurrent``, waits between them) and compares every step with a graph model
built from what the supervisor shows. (The pure search: ``test_waitfor.py``; waits on
one's own slot through ``run_in_slot``: ``test_keyed_calls.py``.)
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_taskvisor import (
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    DeadlockError,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskFailure,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
)

from helpers import job, join, once, queue, settle, stall_registry, supervisor


def ref(waiter: TaskWaiter) -> str:
    """How a DeadlockError message names a task."""
    return f"{waiter.name!r} ({waiter.id})"


class Awaits:
    """A body that waits for the waiter ``self.target`` and reports how the wait ended."""

    def __init__(self) -> None:
        self.target: TaskWaiter | None = None
        self.ready = trio.Event()
        self.error: str | None = None
        self.at: float | None = None

    async def __call__(self) -> str:
        await self.ready.wait()
        assert self.target is not None
        try:
            outcome = await self.target.wait()
        except DeadlockError as exc:
            self.error, self.at = str(exc), trio.current_time()
            return "deadlock"
        self.at = trio.current_time()
        return f"got {outcome.value!r}"

    def aim(self, target: TaskWaiter) -> None:
        self.target = target
        self.ready.set()


# -- slot edges --------------------------------------------------------------------------------


async def test_waiting_for_work_queued_behind_the_callers_slot_names_the_cycle(
    autojump_clock: Any,
) -> None:
    """The classic: the owner of 's' awaits work queued behind 's'."""
    body = Awaits()
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", body, slot="s"))
        inner = await sup.submit(queue("inner", job, 1.0, slot="s"))
        body.aim(inner)
        assert (await owner.wait()).value == "deadlock"
    assert body.error == (
        f"wait-for cycle: task {ref(owner)} waits for {ref(inner)}, "
        f"which is queued behind {ref(owner)}"
    )
    assert body.at == 0.0


async def test_a_two_slot_cycle_raises_in_the_wait_that_closes_it(autojump_clock: Any) -> None:
    """A awaits work behind B, then B awaits work behind A: B raises, A keeps waiting."""
    body_a, body_b = Awaits(), Awaits()
    async with supervisor(controller=ControllerConfig()) as sup:
        a = await sup.submit(queue("A", body_a, slot="a"))
        b = await sup.submit(queue("B", body_b, slot="b"))
        behind_b = await sup.submit(queue("behind-b", job, 1.0, "x", slot="b"))
        behind_a = await sup.submit(queue("behind-a", job, 1.0, "y", slot="a"))
        body_a.aim(behind_b)
        await settle()
        await trio.sleep(1.0)
        body_b.aim(behind_a)
        assert (await b.wait()).value == "deadlock"
        assert (await a.wait()).value == "got 'x'"  # B ended, so behind-b ran
        assert trio.current_time() == 2.0
    assert body_b.error == (
        f"wait-for cycle: task {ref(b)} waits for {ref(behind_a)}, "
        f"which is queued behind {ref(a)}, which waits for {ref(behind_b)}, "
        f"which is queued behind {ref(b)}"
    )
    assert (body_a.error, body_b.at) == (None, 1.0)


async def test_waiting_for_held_work_behind_the_callers_slot_raises(autojump_clock: Any) -> None:
    """Held work waits for its slot's owner too."""
    body = Awaits()
    async with supervisor(max_slot_queue=0) as sup:
        owner = await sup.submit(queue("owner", body, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        body.aim(held)
        assert (await owner.wait()).value == "deadlock"
    assert body.error == (
        f"wait-for cycle: task {ref(owner)} waits for {ref(held)}, "
        f"which is held behind {ref(owner)}"
    )


async def test_wait_placed_on_work_held_behind_the_callers_slot_raises(
    autojump_clock: Any,
) -> None:
    """wait_placed is a wait on other work: held behind one's own slot, it raises."""

    async def owner_body() -> str:
        sup = current_context().supervisor
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        try:
            await held.wait_placed()
        except DeadlockError as exc:
            return str(exc)
        return "placed"

    async with supervisor(max_slot_queue=0) as sup:
        owner = await sup.submit(queue("owner", owner_body, slot="s"))
        message = (await owner.wait()).value
    assert isinstance(message, str)
    assert message.startswith(f"wait-for cycle: task {ref(owner)} waits for the placement of ")
    assert message.endswith(f", which is held behind {ref(owner)}")


async def test_wait_placed_on_queued_work_behind_the_callers_slot_returns(
    autojump_clock: Any,
) -> None:
    """Queued work is placed: wait_placed returns QUEUED even behind the caller's slot."""

    async def owner_body() -> str:
        sup = current_context().supervisor
        inner = await sup.submit(queue("inner", job, 1.0, slot="s"))
        return str(await inner.wait_placed())

    async with supervisor(max_slot_queue=10) as sup:
        owner = await sup.submit(queue("owner", owner_body, slot="s"))
        assert (await owner.wait()).value == "queued"


async def test_a_join_that_follows_the_caller_names_the_cycle(autojump_clock: Any) -> None:
    """A joiner of the caller's own work waits for the caller."""
    body = Awaits()
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", body, slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        body.aim(joiner)
        assert (await owner.wait()).value == "deadlock"
    assert body.error == (
        f"wait-for cycle: task {ref(owner)} waits for {ref(joiner)}, which follows {ref(owner)}"
    )


async def test_a_wait_for_oneself_raises(autojump_clock: Any) -> None:
    """An attempt awaiting its own waiter would wait forever."""
    body = Awaits()
    async with supervisor() as sup:
        me = await sup.add(once("me", body))
        body.aim(me)
        assert (await me.wait()).value == "deadlock"
    assert body.error == f"wait-for cycle: task {ref(me)} waits for {ref(me)}"


async def test_regression_wait_idle_inside_an_attempt_raises(autojump_clock: Any) -> None:
    """``wait_idle()`` inside an attempt of the same supervisor could never return (the
    caller is alive until it does): ``DeadlockError`` at once. Before, it waited for ever.
    Inside another supervisor's attempt it waits as usual."""
    errors: list[str] = []

    async with supervisor() as sup, supervisor() as other:

        async def waits_for_idle(target: Supervisor) -> str:
            try:
                await target.wait_idle()
            except DeadlockError as exc:
                errors.append(str(exc))
                return "deadlock"
            return f"idle at {trio.current_time()}"

        await other.add(once("busy", job, 2.0))
        me = await sup.add(once("me", waits_for_idle, sup))
        with trio.fail_after(60):
            assert (await me.wait()).value == "deadlock"
        assert trio.current_time() == 0.0
        outside = await sup.add(once("outside", waits_for_idle, other))
        assert (await outside.wait()).value == "idle at 2.0"
    assert errors == [
        f"task 'me' ({me.id}) is alive: wait_idle() from inside it would wait for the task itself"
    ]


# -- permit edges ------------------------------------------------------------------------------


async def test_holding_the_last_permit_and_awaiting_work_that_needs_one_raises(
    autojump_clock: Any,
) -> None:
    """max_concurrent=1: the holder awaits work waiting for a permit."""
    body = Awaits()
    async with supervisor(max_concurrent=1, controller=ControllerConfig()) as sup:
        holder = await sup.submit(queue("holder", body, slot="a"))
        await settle()
        other = await sup.submit(queue("other", job, 1.0, slot="b"))
        body.aim(other)
        assert (await holder.wait()).value == "deadlock"
        assert (await other.wait()).is_success  # the holder's end freed the permit
    assert body.error == (
        f"wait-for cycle: task {ref(holder)} waits for {ref(other)}, "
        f"which waits for a permit held by {ref(holder)}"
    )


async def test_a_permit_cycle_without_a_controller_raises(autojump_clock: Any) -> None:
    """Added work has permit edges too: no controller is needed for a permit cycle."""
    body = Awaits()
    async with supervisor(max_concurrent=1) as sup:
        holder = await sup.add(once("holder", body))
        await settle()
        other = await sup.add(once("other", job, 1.0))
        body.aim(other)
        assert (await holder.wait()).value == "deadlock"


async def test_a_free_permit_makes_the_wait_only_slow(autojump_clock: Any) -> None:
    """max_concurrent=2 with one holder blocked: the awaited work gets the free permit."""
    body = Awaits()
    async with supervisor(max_concurrent=2) as sup:
        holder = await sup.add(once("holder", body))
        busy = await sup.add(once("busy", job, 5.0))
        await settle()
        other = await sup.add(once("other", job, 1.0, "v"))
        body.aim(other)
        assert (await holder.wait()).value == "got 'v'"
        assert trio.current_time() == 6.0  # other waited for busy's permit
        assert (await busy.wait()).is_success


async def test_the_last_holder_blocking_closes_a_cycle_through_another_wait(
    autojump_clock: Any,
) -> None:
    """The second holder blocks on unrelated work: the first holder's wait raises."""
    first, second = Awaits(), Awaits()

    async def fails() -> None:
        raise TaskFailure("later")

    async with supervisor(max_concurrent=2) as sup:
        # In backoff, holding no permit: waiting for it has no edge (yet).
        unrelated = await sup.add(
            TaskSpec.restartable("unrelated", fails, backoff=BackoffPolicy.constant(100.0))
        )
        await settle()
        h1 = await sup.add(once("h1", first))
        h2 = await sup.add(once("h2", second))
        await settle()
        needs_permit = await sup.add(once("needs-permit", job, 1.0))
        first.aim(needs_permit)
        await settle()
        assert first.error is None  # h2 runs freely: only slow so far
        second.aim(unrelated)  # now every permit holder is blocked
        assert (await h1.wait()).value == "deadlock"
        assert first.error == (
            f"wait-for cycle: task {ref(h1)} waits for {ref(needs_permit)}, "
            f"which waits for a permit held by {ref(h1)}"
        )
        assert second.error is None
        assert (await needs_permit.wait()).is_success
        await sup.cancel(h2.id)
        await sup.cancel(unrelated.id)


async def test_a_later_permit_wait_of_the_awaited_work_raises_at_that_instant(
    autojump_clock: Any,
) -> None:
    """The awaited work was in backoff; reaching its permit wait closes the cycle."""
    attempts: list[float] = []

    async def flaky_once() -> str:
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise TaskFailure("first attempt fails")
        return "second"

    body = Awaits()
    async with supervisor(max_concurrent=1) as sup:
        retried = await sup.add(
            TaskSpec.restartable("retried", flaky_once, backoff=BackoffPolicy.constant(5.0))
        )
        await settle()  # its first attempt failed: backoff until 5.0, no permit held
        holder = await sup.add(once("holder", body))
        await trio.sleep(1.0)
        body.aim(retried)
        assert (await holder.wait()).value == "deadlock"
        assert body.at == 5.0
        assert (await retried.wait()).value == "second"
        assert attempts == [0.0, 5.0]


async def test_an_owner_admitted_later_closes_the_cycle_when_it_waits_for_a_permit(
    autojump_clock: Any,
) -> None:
    """The awaited owner was still admitting; once in the permit FIFO the wait raises."""
    body = Awaits()
    async with supervisor(max_concurrent=1, controller=ControllerConfig()) as sup:
        holder = await sup.submit(queue("holder", body, slot="a"))
        await settle()
        stall_registry(sup)
        other = await sup.submit(queue("other", job, 1.0, slot="b"))
        body.aim(other)
        assert (await holder.wait()).value == "deadlock"
        assert body.at == 0.0


# -- the other waits of the API ----------------------------------------------------------------


async def test_wait_slot_idle_on_a_slot_whose_owner_waits_for_the_caller_raises(
    autojump_clock: Any,
) -> None:
    """B awaits A's outcome; A waits for slot 'b' to be idle: A's wait closes the cycle."""
    body_b = Awaits()
    message: list[str] = []

    async def body_a() -> None:
        await trio.sleep(1.0)
        try:
            await current_context().supervisor.wait_slot_idle("b")
        except DeadlockError as exc:
            message.append(str(exc))

    async with supervisor(controller=ControllerConfig()) as sup:
        a = await sup.submit(queue("A", body_a, slot="a"))
        b = await sup.submit(queue("B", body_b, slot="b"))
        body_b.aim(a)
        assert (await b.wait()).value == "got None"
    assert message == [
        f"wait-for cycle: task {ref(a)} waits for slot 'b', owned by {ref(b)}, "
        f"which waits for {ref(a)}"
    ]


async def test_cancel_slot_of_a_slot_whose_owner_waits_for_the_caller_stops_it(
    autojump_clock: Any,
) -> None:
    """cancel_slot stops the owner first: its waits end by its stop, so no cycle."""
    body_b = Awaits()

    async def body_a() -> int:
        await trio.sleep(1.0)
        return await current_context().supervisor.cancel_slot("b")

    async with supervisor(controller=ControllerConfig()) as sup:
        a = await sup.submit(queue("A", body_a, slot="a"))
        b = await sup.submit(queue("B", body_b, slot="b"))
        body_b.aim(a)
        assert (await a.wait()).value == 1
        assert (await b.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 1.0


async def test_cancel_of_a_task_that_waits_for_the_caller_is_not_a_deadlock(
    autojump_clock: Any,
) -> None:
    """cancel() stops its target first, so the target's own waits do not count."""
    body_b = Awaits()

    async def body_a() -> bool:
        await trio.sleep(1.0)
        assert b_waiter
        return await current_context().supervisor.cancel(b_waiter[0].id)

    b_waiter: list[TaskWaiter] = []
    async with supervisor() as sup:
        a = await sup.add(once("A", body_a))
        b = await sup.add(once("B", body_b))
        b_waiter.append(b)
        body_b.aim(a)
        assert (await a.wait()).value is True
        assert (await b.wait()).kind is OutcomeKind.CANCELLED


async def test_a_holder_cancelling_work_that_waits_for_a_permit_is_not_blocked(
    autojump_clock: Any,
) -> None:
    """max_concurrent=2: one holder awaits work that waits for a permit, the other
    cancels work that waits for one too. The canceller's wait ends as soon as its
    target does (its stop was requested), so it is no blocked holder, and the first
    wait is only slow. Before, the two holders counted as blocked and the first wait
    raised ``DeadlockError`` ("... waits for a permit held by" itself)."""
    first = Awaits()
    cancelled: list[bool] = []

    async def canceller() -> None:
        await trio.sleep(1.0)
        sup = current_context().supervisor
        cancelled.append(await sup.cancel(doomed.id))
        await trio.sleep(1.0)

    async with supervisor(max_concurrent=2) as sup:
        h1 = await sup.add(once("h1", first))
        await sup.add(once("h2", canceller))
        await settle()
        needed = await sup.add(once("needed", job, 1.0, "v"))
        doomed = await sup.add(once("doomed", job, 1.0))
        first.aim(needed)
        assert (await h1.wait()).value == "got 'v'"
        assert first.error is None
        assert cancelled == [True]
        assert (await doomed.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 3.0  # needed took h2's permit at 2.0


async def test_run_in_slot_into_another_slot_holding_the_last_permit_raises(
    autojump_clock: Any,
) -> None:
    """A keyed call from the only permit holder into another slot: its work needs a permit."""

    async def nested() -> str:
        try:
            await current_context().supervisor.run_in_slot("other", job, 1.0)
        except DeadlockError as exc:
            return str(exc)
        return "ran"

    async with supervisor(max_concurrent=1, controller=ControllerConfig()) as sup:
        outer = await sup.submit(queue("outer", nested, slot="s"))
        message = (await outer.wait()).value
        assert isinstance(message, str)
        assert "which waits for a permit held by " + ref(outer) in message
        await sup.wait_idle()
        assert sup.list() == ()  # the call's work was withdrawn, never run


# -- only slow, or not checked -----------------------------------------------------------------


async def test_waiting_for_work_behind_a_free_running_owner_is_only_slow(
    autojump_clock: Any,
) -> None:
    """Work queued behind another slot's owner that waits for nothing: no DeadlockError."""
    body = Awaits()
    async with supervisor(controller=ControllerConfig()) as sup:
        caller = await sup.submit(queue("caller", body, slot="a"))
        await sup.submit(queue("owner-b", job, 3.0, slot="b"))
        behind = await sup.submit(queue("behind-b", job, 1.0, "x", slot="b"))
        body.aim(behind)
        assert (await caller.wait()).value == "got 'x'"
        assert trio.current_time() == 4.0


async def test_a_wait_outside_any_attempt_is_never_checked(autojump_clock: Any) -> None:
    """The main task awaiting queued work just waits."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 2.0, slot="s"))
        inner = await sup.submit(queue("inner", job, 1.0, "v", slot="s"))
        assert (await inner.wait()).value == "v"
        assert trio.current_time() == 3.0


async def test_waits_on_another_supervisors_work_are_not_checked(autojump_clock: Any) -> None:
    """An attempt of one supervisor awaiting another supervisor's work waits normally."""
    async with (
        supervisor(max_concurrent=1, controller=ControllerConfig()) as first,
        supervisor(max_concurrent=1, controller=ControllerConfig()) as second,
    ):
        blocker = await second.submit(queue("blocker", job, 2.0, slot="s"))
        theirs = await second.submit(queue("theirs", job, 1.0, "v", slot="s"))
        body = Awaits()
        mine = await first.submit(queue("mine", body, slot="s"))
        body.aim(theirs)
        assert (await mine.wait()).value == "got 'v'"
        assert (await blocker.wait()).is_success


# -- random wait-for graphs out of real tasks --------------------------------------------------
#
# Puppet tasks hold their attempt open and, on command, spawn child tasks that wait for
# other tasks (``wait()``) or for a slot (``wait_slot_idle``). The test drives them one
# operation at a time, lets everything settle, then builds the wait-for graph from what
# the supervisor shows (``list()`` states, ``controller_snapshot()`` owners, the puppets'
# own records of their blocked waits), with the edges as docs/design.md defines them.

SLOTS = ("a", "b", "c")


@attrs.frozen
class Submit:
    slot: str | None  # None: added with add(); RETRY: added, in backoff at first


RETRY = "retry"  # an added task whose first attempt fails: BACKOFF (no edges) until it retries
BACKOFF = BackoffPolicy.constant(10.0)


@attrs.frozen
class Handoff:
    """A running task ``submit_nowait``s work into ``slot`` and waits for it at once, before
    the controller took it in: the work gains its slot edge later, at its intake."""

    slot: str
    caller: int


@attrs.frozen
class Advance:
    """Let 10 virtual seconds pass: tasks in backoff reach their permit wait (a later edge)."""


@attrs.frozen
class Wait:
    caller: int
    target: int


@attrs.frozen
class WaitSlot:
    caller: int
    slot: str


@attrs.frozen
class Finish:
    task: int


Op = Submit | Wait | WaitSlot | Finish | Advance | Handoff

# A caller is picked among the running tasks (its number modulo their count), a target
# among every task submitted so far (modulo their count; 7: the task after the caller).
submits = st.builds(Submit, st.sampled_from((*SLOTS, None, RETRY)))
ops_strategy = st.builds(
    lambda first, rest: [*first, *rest],
    st.lists(submits, min_size=2, max_size=5),
    st.lists(
        st.one_of(
            submits,
            st.builds(Wait, st.integers(0, 7), st.integers(0, 7)),
            st.builds(Wait, st.integers(0, 7), st.integers(0, 7)),
            st.builds(WaitSlot, st.integers(0, 7), st.sampled_from(SLOTS)),
            st.builds(Finish, st.integers(0, 7)),
            st.builds(Advance),
            st.builds(Handoff, st.sampled_from(SLOTS), st.integers(0, 7)),
        ),
        max_size=14,
    ),
)


@attrs.define
class Blocked:
    """One child wait of a puppet, while it is blocked."""

    caller: int
    target: int | None  # a task, or
    slot: str | None  # a slot (wait_slot_idle)


class Puppets:
    """The tasks of one run and what their waits did."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.waiters: list[TaskWaiter] = []
        self.slots: list[str | None] = []
        self.commands: list[trio.MemorySendChannel[Op | None]] = []
        self.receivers: list[trio.MemoryReceiveChannel[Op | None]] = []
        self.running: set[int] = set()
        self.blocked: dict[int, Blocked] = {}  # by a sequence number
        self.raised: list[tuple[Blocked, str]] = []
        self.seq = 0

    def by_id(self, task_id: int) -> int:
        return next(i for i, w in enumerate(self.waiters) if int(w.id) == task_id)

    async def body(self, index: int) -> None:
        if self.slots[index] == RETRY and current_context().attempt == 1:
            raise TaskFailure("first attempt fails")
        self.running.add(index)
        try:
            async with trio.open_nursery() as nursery:
                async for command in self.receivers[index]:
                    if command is None:
                        nursery.cancel_scope.cancel()
                        break
                    nursery.start_soon(self.child, index, command)
        finally:
            self.running.discard(index)

    async def child(self, index: int, command: Op) -> None:
        self.seq += 1
        key = self.seq
        if isinstance(command, Handoff):
            # No checkpoint between the intake and the wait: the wait sees it in intake.
            self.submit_nowait(command.slot)
            command = Wait(index, len(self.waiters) - 1)
        if isinstance(command, Wait):
            self.blocked[key] = blocked = Blocked(index, command.target, None)
            call: Callable[[], Any] = self.waiters[command.target].wait
        else:
            assert isinstance(command, WaitSlot)
            self.blocked[key] = blocked = Blocked(index, None, command.slot)
            slot = command.slot
            call = lambda: self.sup.wait_slot_idle(slot)  # noqa: E731
        try:
            await call()
        except DeadlockError as exc:
            self.raised.append((blocked, str(exc)))
        finally:
            del self.blocked[key]

    def submit_nowait(self, slot: str) -> None:
        index = self._new(slot)
        spec = ControllerSpec.queue(TaskSpec.once(f"t{index}", self.body, index), slot=slot)
        self.waiters.append(self.sup.submit_nowait(spec))

    def _new(self, slot: str | None) -> int:
        send, receive = trio.open_memory_channel[Op | None](16)
        self.commands.append(send)
        self.receivers.append(receive)
        self.slots.append(slot)
        return len(self.slots) - 1

    async def submit(self, slot: str | None) -> None:
        index = self._new(slot)
        spec = TaskSpec.once(f"t{index}", self.body, index)
        if slot == RETRY:
            spec = TaskSpec.restartable(f"t{index}", self.body, index, backoff=BACKOFF)
        if slot is None or slot == RETRY:
            self.waiters.append(await self.sup.add(spec))
        else:
            self.waiters.append(await self.sup.submit(ControllerSpec.queue(spec, slot=slot)))

    def resolved(self, index: int) -> bool:
        try:
            self.waiters[index].outcome_nowait()
        except trio.WouldBlock:
            return False
        return True


class Model:
    """The wait-for graph, built from what the supervisor shows."""

    def __init__(self, p: Puppets, max_concurrent: int | None, raised: list[Blocked]) -> None:
        sup = p.sup
        infos = {p.by_id(int(info.id)): info for info in sup.list()}
        owners = {
            view.slot: p.by_id(int(view.owner_id)) for view in sup.controller_snapshot().slots
        }
        # The waits as they were when the raised ones raised: those are blocked again.
        waits = [*p.blocked.values(), *raised]
        edges: dict[int, set[int]] = {i: set() for i in range(len(p.waiters))}
        blocked_callers = {w.caller for w in waits if self._awaits(p, owners, w) is not None}
        for wait in waits:
            target = self._awaits(p, owners, wait)
            if target is not None:
                edges[wait.caller].add(target)
        for i, slot in enumerate(p.slots):
            if p.resolved(i) or i in infos or slot is None or slot == RETRY:
                continue
            if owners.get(slot, i) != i:
                edges[i].add(owners[slot])  # queued behind its slot's owner
        holders = {i for i, info in infos.items() if info.state is TaskState.RUNNING}
        if max_concurrent is not None and len(holders) == max_concurrent <= len(
            holders & blocked_callers
        ):
            for i, info in infos.items():
                if info.state is TaskState.WAITING:
                    edges[i] |= holders
        self.edges = edges

    @staticmethod
    def _awaits(p: Puppets, owners: dict[str, int], wait: Blocked) -> int | None:
        if wait.target is not None:
            return None if p.resolved(wait.target) else wait.target
        assert wait.slot is not None
        return owners.get(wait.slot)

    def reaches(self, start: int, goal: int) -> bool:
        seen: set[int] = set()
        todo = [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(self.edges[node])
        return False

    def acyclic(self) -> bool:
        return not any(self.reaches(n, i) for i in self.edges for n in self.edges[i])


async def run_graph(max_concurrent: int | None, ops: list[Op]) -> None:
    config = SupervisorConfig(
        grace=1.0, max_concurrent=max_concurrent, controller=ControllerConfig()
    )
    async with open_supervisor(config) as sup:
        p = Puppets(sup)
        for op in ops:
            before = len(p.raised)
            if isinstance(op, Submit):
                await p.submit(op.slot)
            elif isinstance(op, Advance):
                await trio.sleep(10.0)
            elif isinstance(op, Handoff):
                if not p.running:
                    continue
                caller = sorted(p.running)[op.caller % len(p.running)]
                await p.commands[caller].send(Handoff(op.slot, caller))
            elif p.running:
                running = sorted(p.running)
                count = len(p.waiters)
                if isinstance(op, Wait):
                    caller = running[op.caller % len(running)]
                    target = op.target % count if op.target < 7 else caller + 1
                    op = Wait(caller, target % count)
                elif isinstance(op, WaitSlot):
                    op = WaitSlot(running[op.caller % len(running)], op.slot)
                else:
                    op = Finish(running[op.task % len(running)])
                caller = op.task if isinstance(op, Finish) else op.caller
                await p.commands[caller].send(None if isinstance(op, Finish) else op)
            else:
                continue
            await settle()
            raised = p.raised[before:]
            model = Model(p, max_concurrent, [w for w, _ in raised])
            for wait, message in raised:
                # The message names a cycle of the model, from the caller, in order.
                ids = [int(n) for n in re.findall(r"\(#(\d+)\)", message)]
                cycle = [p.by_id(i) for i in ids]
                assert cycle[0] == cycle[-1] == wait.caller, message
                for here, there in itertools.pairwise(cycle):
                    assert there in model.edges[here], (message, model.edges)
            if isinstance(op, Wait | WaitSlot) and raised and raised[0][0].caller == op.caller:
                assert len(raised) == 1  # the new wait closed the cycle: nobody else raises
            # Whatever closed: no cycle survives the step.
            assert Model(p, max_concurrent, []).acyclic(), (ops, Model(p, max_concurrent, []).edges)
        for index in range(len(p.waiters)):
            if index in p.running:
                await p.commands[index].send(None)
        for index in range(len(p.waiters)):
            if not p.resolved(index):
                await sup.cancel(p.waiters[index].id)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(max_concurrent=st.sampled_from((None, 1, 1, 2, 2, 3)), ops=ops_strategy)
def test_random_wait_for_graphs_of_real_tasks_match_the_model(
    max_concurrent: int | None, ops: list[Op]
) -> None:
    """DeadlockError exactly when a wait closes a cycle; no run hangs."""

    async def main() -> None:
        with trio.fail_after(1000):  # virtual seconds: a hang fails instead of blocking
            await run_graph(max_concurrent, ops)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize(
    ("max_concurrent", "ops"),
    [
        # Two holders, each awaiting work that needs a permit.
        (2, [Submit("a"), Submit("b"), Submit("c"), Submit(None), Wait(0, 2), Wait(1, 3)]),
        # The last permit holder blocks on work in backoff: a cycle closes elsewhere.
        (2, [Submit(RETRY), Submit("a"), Submit("b"), Submit("c"), Wait(0, 3), Wait(1, 0)]),
        # A wait on work not yet taken in, which lands behind the caller's slot.
        (None, [Submit("a"), Handoff("a", 0)]),
        # A slot cycle closed by a wait_slot_idle.
        (None, [Submit("a"), Submit("b"), Submit("b"), Wait(0, 2), WaitSlot(1, "a")]),
        # A chain that a Finish turns into a permit cycle.
        (1, [Submit("a"), Submit("b"), Wait(0, 1), Finish(0), Submit("a"), Wait(1, 2)]),
    ],
)
def test_chosen_wait_for_graphs_match_the_model(max_concurrent: int | None, ops: list[Op]) -> None:
    """A few graphs the random test must cover, replayed by hand."""

    async def main() -> None:
        with trio.fail_after(1000):
            await run_graph(max_concurrent, ops)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

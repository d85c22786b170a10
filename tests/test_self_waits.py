"""Calls a task makes that can only end once the task itself has ended (self-waits).

``sup.cancel()`` of the caller's own task, and a wait of a task whose stop was requested
for work that waits for the task (a REPLACE of its own slot, awaited through
``run_in_slot`` or ``wait()``; work queued behind its slot), cannot return. The stop's
``Cancelled`` ends such a call; in a shielded scope (a ``defer_cancel()`` block too),
which the stop cannot reach, ``DeadlockError`` does, as the stop comes, and the task
ends ``CANCELLED`` when it returns. (``shutdown()`` from a task: ``test_shutdown.py``;
waits on one's own slot that ask no stop: ``test_keyed_calls.py``.)
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    ControllerConfig,
    ControllerSpec,
    DeadlockError,
    OutcomeKind,
    TaskId,
    TaskSpec,
    TaskWaiter,
    current_context,
)

from helpers import job, supervisor

SHIELDS = ["cancel-scope", "defer-cancel"]


def shield(how: str) -> Any:
    """A scope the stop cannot reach: a shielded ``CancelScope`` (until 100) or a
    ``defer_cancel()`` block (forced at the grace deadline, 5)."""
    if how == "cancel-scope":
        return trio.CancelScope(shield=True, deadline=100.0)
    return current_context().defer_cancel()


def ref(name: str, id: int) -> str:
    """How a ``DeadlockError`` message names a task."""
    return f"{name!r} ({TaskId(id)})"


def self_wait(owner: TaskWaiter, work: str, work_id: int) -> str:
    """The message of a stopping owner's wait for ``work`` queued behind its slot."""
    return (
        f"wait-for cycle: task {ref('owner', owner.id)} waits for {ref(work, work_id)}, "
        f"which is queued behind {ref('owner', owner.id)}; {ref('owner', owner.id)} has "
        "been asked to stop, which cannot reach this wait (a shielded scope, a "
        "defer_cancel() block), and the wait ends only once the task has"
    )


class Calls:
    """What the calls of a body did: (time, what) for each return and each error."""

    def __init__(self) -> None:
        self.ended: list[tuple[float, str]] = []

    async def __call__(self, call: Any) -> Any:
        try:
            value = await call()
        except DeadlockError as exc:
            self.ended.append((trio.current_time(), f"DeadlockError: {exc}"))
        except trio.Cancelled:
            self.ended.append((trio.current_time(), "Cancelled"))
            raise
        else:
            self.ended.append((trio.current_time(), f"returned {value!r}"))
            return value


# -- sup.cancel() of the caller's own task --------------------------------------------------


@pytest.mark.parametrize("how", SHIELDS)
async def test_cancel_of_own_task_in_a_shielded_scope_raises_deadlock_error(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    """The stop is requested, and the call, which the stop cannot reach, raises
    ``DeadlockError`` at once; the task, returning, ends ``CANCELLED``. Before, the call
    waited for the task's own outcome: in a shielded scope it returned ``True`` at the
    grace deadline, the task ``FORCE_ABORTED`` and still running; in a ``defer_cancel()``
    block the deadline's force cancelled it (``FORCE_ABORTED`` too)."""
    calls = Calls()

    async def body() -> None:
        with shield(how):
            await calls(lambda: current_context().supervisor.cancel("t"))

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 0.0
    assert calls.ended == [
        (
            0.0,
            f"DeadlockError: sup.cancel() in task {ref('t', waiter.id)} cannot wait for the "
            "outcome of its own task, which comes once the task has ended: its stop has "
            "been requested",
        )
    ]


async def test_cancel_of_own_task_is_ended_by_the_stop(autojump_clock: trio.abc.Clock) -> None:
    """Outside a shielded scope the stop's ``Cancelled`` ends the call, as documented for
    any stop: the task ends ``CANCELLED`` at once. (Unchanged.)"""
    calls = Calls()

    async def body() -> None:
        await calls(lambda: current_context().supervisor.cancel("t"))

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
    assert calls.ended == [(0.0, "Cancelled")]


async def test_remove_of_own_task_returns_and_the_stop_follows(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``remove`` waits for nothing: it returns ``True`` and the stop comes at the next
    checkpoint outside a shielded scope. (Unchanged.)"""
    calls = Calls()

    async def body() -> None:
        with trio.CancelScope(shield=True):
            await calls(lambda: current_context().supervisor.remove("t"))
        await calls(partial(trio.sleep, 1.0))

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
    assert calls.ended == [(0.0, "returned True"), (0.0, "Cancelled")]


# -- a REPLACE of the caller's own slot ------------------------------------------------------


async def replace_own_slot(sup: Any, call: str) -> Any:
    """REPLACE the caller's slot ``"s"`` with ``job(1.0, "new")`` and wait for it."""
    if call == "run_in_slot":
        return await sup.run_in_slot("s", job, 1.0, "new", policy=AdmissionPolicy.REPLACE)
    request = ControllerSpec.replace(TaskSpec.once("new", job, 1.0, "new"), slot="s")
    # submit_nowait: the wait begins before the controller takes the REPLACE in (the
    # stop comes while the wait is blocked); submit: after (the stop came first).
    waiter = sup.submit_nowait(request) if call == "submit_nowait" else await sup.submit(request)
    return (await waiter.wait()).value


@pytest.mark.parametrize("how", SHIELDS)
@pytest.mark.parametrize("call", ["run_in_slot", "submit", "submit_nowait"])
async def test_replace_of_own_slot_in_a_shielded_scope_raises_deadlock_error(
    autojump_clock: trio.abc.Clock, how: str, call: str
) -> None:
    """The REPLACE stops the owner, and its wait for the replacement, queued behind the
    owner itself and out of the stop's reach, raises ``DeadlockError`` at once; the owner,
    returning, ends ``CANCELLED``. ``run_in_slot`` withdraws its work on the error, as on
    any failure (the slot is idle at once); submitted work runs once the owner is gone.
    Before, the wait (a stopping task's, so never checked) waited for the owner: in a
    shielded scope until its own deadline (100; the owner ``FORCE_ABORTED`` at the grace
    deadline, 5, still holding the slot), in a ``defer_cancel()`` block until the grace
    deadline forced it."""
    calls = Calls()

    async def body() -> None:
        with shield(how):
            await calls(lambda: replace_own_slot(current_context().supervisor, call))

    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", body), slot="s"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 0.0
        await sup.wait_slot_idle("s")
        idle_at = trio.current_time()
    work = "job" + str(TaskId(owner.id + 1)) if call == "run_in_slot" else "new"
    assert calls.ended == [(0.0, f"DeadlockError: {self_wait(owner, work, owner.id + 1)}")]
    assert idle_at == (0.0 if call == "run_in_slot" else 1.0)


@pytest.mark.parametrize("call", ["run_in_slot", "submit"])
async def test_replace_of_own_slot_is_ended_by_the_stop(
    autojump_clock: trio.abc.Clock, call: str
) -> None:
    """Outside a shielded scope the REPLACE's stop ends the owner's wait with
    ``Cancelled``: ``run_in_slot`` withdraws its work then, as cancelling its caller
    always does (nothing replaces the owner), and submitted work runs once the owner is
    gone. (Unchanged.)"""
    calls = Calls()

    async def body() -> None:
        await calls(lambda: replace_own_slot(current_context().supervisor, call))

    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", body), slot="s"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        await sup.wait_slot_idle("s")
        idle_at = trio.current_time()
    assert calls.ended == [(0.0, "Cancelled")]
    assert idle_at == (0.0 if call == "run_in_slot" else 1.0)


# -- a stopping task's wait for work queued behind its own slot ------------------------------


@pytest.mark.parametrize("how", SHIELDS)
@pytest.mark.parametrize("order", ["submitted-before-the-stop", "submitted-after-the-stop"])
async def test_a_stopping_owner_waiting_for_its_queued_work_raises_deadlock_error(
    autojump_clock: trio.abc.Clock, how: str, order: str
) -> None:
    """A task asked to stop (here by its own ``remove``) that waits, out of the stop's
    reach, for work queued behind its own slot gets ``DeadlockError``: when the wait
    begins (the work was queued already), or when the work is taken in behind the slot.
    Before, its waits were never checked: it waited until its shield's deadline (100), or
    the grace deadline's force (5)."""
    calls = Calls()

    async def body() -> None:
        sup = current_context().supervisor
        request = ControllerSpec.queue(TaskSpec.once("inner", job, 1.0, "x"), slot="s")
        with shield(how):
            if order == "submitted-before-the-stop":
                inner = await sup.submit(request)
                await sup.remove("owner")
            else:
                await sup.remove("owner")
                inner = sup.submit_nowait(request)  # taken in after the wait begins
            await calls(inner.wait)

    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", body), slot="s"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        await sup.wait_slot_idle("s")
        assert trio.current_time() == 1.0  # the queued work ran after the owner
    assert calls.ended == [(0.0, f"DeadlockError: {self_wait(owner, 'inner', owner.id + 1)}")]

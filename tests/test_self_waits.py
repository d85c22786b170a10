"""Calls a task makes that can only end once the task itself has ended (self-waits).

``sup.cancel()`` of the caller's own task cannot return. The stop's ``Cancelled`` ends
it; in a shielded scope (a ``defer_cancel()`` block too), which the stop cannot reach,
``DeadlockError`` does, as the stop comes, and the task ends ``CANCELLED`` when it
returns. (``shutdown()`` from a task: ``test_shutdown.py``; waits on one's own slot that
ask no stop: ``test_keyed_calls.py``.)
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    DeadlockError,
    OutcomeKind,
    TaskId,
    TaskSpec,
    TaskWaiter,
    current_context,
)

from helpers import supervisor

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

"""The loops' intake (``_inbox.Inbox``): bounded for callers as a trio memory channel is,
the room an item leaves going to the oldest waiting ``put``.

The inbox is driven directly here, as a loop drives it (``drain`` handles what is
buffered, in order, without a scheduler pass each).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_taskvisor._inbox import Inbox


async def test_the_room_an_item_leaves_goes_to_the_oldest_waiting_put(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Two callers wait for room in a full inbox; the loop takes one item, and a later
    caller's ``put_nowait`` finds no room: it went to the first waiting ``put``, whose
    item is queued at once, in call order. Before, the later caller took it and the
    waiting one went to the back of the line (work of one slot ran out of the order of
    its ``submit()`` calls)."""
    inbox: Inbox[str] = Inbox(1)
    inbox.put_nowait("first")
    handled: list[str] = []
    late: list[str] = []

    def handle(item: str) -> None:
        handled.append(item)
        if item == "first":
            try:
                inbox.put_nowait("late")
            except trio.WouldBlock:
                late.append("refused")
            else:
                late.append("queued")

    with trio.fail_after(1.0):
        async with trio.open_nursery() as nursery:
            for item in ("a", "b"):
                nursery.start_soon(inbox.put, item)
                await trio.testing.wait_all_tasks_blocked()
            inbox.drain(handle)
    assert (handled, late) == (["first", "a", "b"], ["refused"])


async def test_a_put_waiting_when_the_loop_ends_raises(autojump_clock: trio.abc.Clock) -> None:
    """``close()`` wakes the waiting callers with ``BrokenResourceError``; their items are
    not queued."""
    inbox: Inbox[str] = Inbox(1)
    inbox.put_nowait("first")
    raised: list[str] = []

    async def put(item: str) -> None:
        with pytest.raises(trio.BrokenResourceError):
            await inbox.put(item)
        raised.append(item)

    async with trio.open_nursery() as nursery:
        for item in ("a", "b"):
            nursery.start_soon(put, item)
        await trio.testing.wait_all_tasks_blocked()
        inbox.close()
    assert sorted(raised) == ["a", "b"]  # woken together: in the order trio runs them
    assert inbox.size == 1  # "first", left for the loop's drain


async def test_a_cancelled_put_queues_nothing(autojump_clock: trio.abc.Clock) -> None:
    """A waiting ``put`` that is cancelled leaves the line: the room goes to the next."""
    inbox: Inbox[str] = Inbox(1)
    inbox.put_nowait("first")
    handled: list[str] = []
    scope = trio.CancelScope()

    async def cancelled_put() -> None:
        with scope:
            await inbox.put("a")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancelled_put)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(inbox.put, "b")
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        inbox.drain(handled.append)
    assert scope.cancelled_caught
    assert handled == ["first", "b"]

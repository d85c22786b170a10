"""A loop's intake and skeleton (``Inbox``), and the one-shot answer to a caller (``Reply``).

Each loop (registry, controller) receives on one ``Inbox``: an unbounded trio memory
channel whose *callers* are bounded by a capacity, exactly as a bounded
``trio.MemorySendChannel`` would bound them (``put_nowait`` raises ``trio.WouldBlock``
when full, an item handed to the loop waiting in ``get()`` takes no room; ``put`` is
built on it as ``MemorySendChannel.send`` is on ``send_nowait``, waiting for room in FIFO
order: as the channel does, the room an item leaves goes to the first waiting ``put``,
whose item is queued then, before any later caller can take it), while the
supervisor's own messages (``force=True``: a controller's admission, a forwarded stop,
a report from the registry, the shutdown) are never refused, so no loop ever waits on
another. Its own counters tell whether the loop is idle (parked in
``get()`` with nothing queued), which lets a caller run the loop's non-blocking core
directly in its own task: nothing is ordered before it then, and code between two
checkpoints is atomic in trio.

Both loops (registry, controller) also share one skeleton, ``Inbox.serve``: wait for the
next item until the loop's next deadline, handle it, then handle whatever is already
buffered without a scheduler pass each, and before each wait let the loop do what is due
and name its next deadline. Another task that adds an earlier deadline calls
``wake_at``: it brings the pending wait's deadline forward, or wakes a loop parked with
no deadline with a no-op item that only the skeleton sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, Generic, NoReturn, TypeVar

import trio

T = TypeVar("T")


class _Wake:
    """A no-op item: makes a parked loop look at its deadlines again."""

    __slots__ = ()


_WAKE: Final = _Wake()


class Reply(Generic[T]):
    """A one-shot answer from a loop to a waiting caller."""

    __slots__ = ("error", "event", "value")

    value: T

    def __init__(self) -> None:
        self.event = trio.Event()
        self.error: BaseException | None = None

    def set(self, value: T, error: BaseException | None = None) -> None:
        """Answer: ``value``, or raise ``error`` in the waiting caller."""
        self.value = value
        self.error = error
        self.event.set()

    async def wait(self) -> T:
        """Wait for the answer; raise its error if it has one."""
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class Inbox(Generic[T]):
    """One loop's intake: FIFO, bounded for callers, never refusing the supervisor."""

    __slots__ = (
        "_capacity",
        "_handed",
        "_in_get",
        "_parked",
        "_putters",
        "_recv",
        "_send",
        "_size",
        "_wait_scope",
        "closed",
    )

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        # Items of type T, and the skeleton's own _WAKE.
        self._send, self._recv = trio.open_memory_channel[Any](math.inf)
        # Callers of ``put`` waiting for room, oldest first, with their items.
        self._putters: dict[trio.lowlevel.Task, T] = {}
        self._size = 0  # items put and not yet taken by the loop
        self._handed = False  # the first of them went to the loop waiting in get()
        self._in_get = False
        self.closed = False
        # The loop's wait for the next item, while it has a deadline; ``_parked`` while
        # it waits with none.
        self._wait_scope: trio.CancelScope | None = None
        self._parked = False

    def idle(self) -> bool:
        """Whether nothing is queued and the loop is parked in ``get()``."""
        return self._in_get and not self._size

    @property
    def size(self) -> int:
        """Items put and not yet taken by the loop."""
        return self._size

    def put_nowait(self, item: T | _Wake, *, force: bool = False) -> None:
        """Queue ``item``; ``trio.WouldBlock`` when full unless ``force``.

        Raises ``trio.BrokenResourceError`` once the loop has closed its inbox.
        """
        if self.closed:
            raise trio.BrokenResourceError("the loop has ended")
        if not force and (self._putters or self._size - self._handed >= self._capacity):
            raise trio.WouldBlock
        if self._in_get and not self._size:
            self._handed = True  # as a channel hands an item to a waiting receiver
        self._send.send_nowait(item)  # unbounded: never blocks
        self._size += 1

    async def put(self, item: T) -> None:
        """Queue ``item``, waiting FIFO for room. A checkpoint.

        Cancelled before it is queued, it queues nothing.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.put_nowait(item)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        task = trio.lowlevel.current_task()
        self._putters[task] = item

        def abort(_: object) -> trio.lowlevel.Abort:
            del self._putters[task]
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        if task in self._putters:  # woken by close(), not queued by _taken()
            del self._putters[task]
            raise trio.BrokenResourceError("the loop has ended")

    async def _get(self) -> Any:
        """Take the next item, waiting for one (the loop only)."""
        self._in_get = True
        try:
            item = await self._recv.receive()
        finally:
            self._in_get = False
        self._taken()
        return item

    def _taken(self) -> None:
        self._size -= 1
        self._handed = False
        if self._putters and self._size < self._capacity:
            # The room goes to the oldest waiting put, now: no later caller takes it.
            task = next(iter(self._putters))
            self._send.send_nowait(self._putters.pop(task))
            self._size += 1
            trio.lowlevel.reschedule(task)

    # -- the loop's skeleton --------------------------------------------------------------

    async def serve(self, handle: Callable[[T], None], due: Callable[[], float]) -> NoReturn:
        """Run the loop: handle every item in order, until cancelled (the loop's task).

        Before each wait, ``due()`` does what is due by now and returns the loop's next
        deadline (``inf``: none); the wait for the next item lasts until then at most.
        After a wake-up, the items already buffered are handled too.
        """
        get = self._get
        try:
            while True:
                wake = due()
                if wake == math.inf:
                    # No deadline, so no scope; one added meanwhile from another task
                    # wakes this wait with a no-op item instead (wake_at).
                    self._parked = True
                    item = await get()
                    self._parked = False
                    if item is not _WAKE:
                        handle(item)
                else:
                    with trio.move_on_at(wake) as self._wait_scope:
                        item = await get()
                        if item is not _WAKE:
                            handle(item)
                    self._wait_scope = None
                # Keep no handled item alive while waiting for the next one: an add_batch
                # command holds every record of the batch (idle task memory, row 7).
                item = None
                self.drain(handle)
        finally:
            self._parked = False
            self._wait_scope = None

    def drain(self, handle: Callable[[T], None]) -> None:
        """Handle the items already buffered, in order, without a scheduler pass each
        (the loop's task; after ``close()``, the items the loop left)."""
        receive = self._recv.receive_nowait
        while self._size:
            item = receive()
            self._taken()
            if item is not _WAKE:
                handle(item)

    def wake_at(self, deadline: float) -> None:
        """Have the loop look at its deadlines by ``deadline`` (from another task).

        While the loop waits, bring its wake-up forward; parked with no deadline, wake
        it. Nothing once it has ended.
        """
        scope = self._wait_scope
        if scope is not None:
            if deadline < scope.deadline:
                scope.deadline = deadline
        elif self._parked and deadline != math.inf:
            self._parked = False
            self.put_nowait(_WAKE, force=True)

    def close(self) -> None:
        """The loop has ended: later puts raise ``BrokenResourceError``; wake waiters."""
        self.closed = True
        for task in self._putters:
            trio.lowlevel.reschedule(task)  # still listed: its put raises

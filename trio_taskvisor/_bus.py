"""The event bus: one bounded bus channel, a fan-out task, one lane per subscriber.

Publishing never blocks and never fails: an event that finds the bus channel or a
lane's queue full is dropped and counted. Each subscriber has its own bounded
channel and lane task, so a slow or failing subscriber never slows tasks or other
subscribers. With no subscriber and no open ``events()`` stream, ``active`` is false
and callers skip building events altogether.

Decisions the design leaves open:

* ``SUBSCRIBER_FAILED`` goes to every lane except the failing one; the failing
  subscriber keeps receiving later events. A failure on a ``SUBSCRIBER_FAILED`` event
  is not reported in turn: two subscribers that fail on every event (two dashboards
  that are down) reported each other's failures to each other for ever, about 100,000
  events a second, and a test's ``wait_all_tasks_blocked()`` never returned.
* An ``events()`` stream is a lane whose subscriber forwards into an unbuffered
  channel, so it gets the same drop counting and overflow markers; its drops count
  in ``events_dropped`` but not in ``subscriber_dropped``. Closing the receive side
  early ends the stream quietly.
* Events still queued when the drain deadline passes count as dropped, and are
  dropped: an ``on_event`` that shields itself and outlives the deadline is given no
  more (before, it was handed every one of them, counted dropped all the same, and the
  shutdown took their number times a call's time).
* An ``events()`` stream opened once the shutdown's drain has begun (``close()``: no
  event is published from then on) ends at once, as one opened after the supervisor's
  end does. It was given a lane that the finished fan-out never closed: its reader
  waited, and the shutdown with it, until the drain deadline
  (``subscriber_shutdown_timeout``).
* The same subscriber object given twice is a ``ConfigError``: it would get (and count)
  every event twice. Two subscribers of one name are fine (their drops add up).
* A ``BaseException`` from ``on_event`` that is not trio's cancellation
  (``KeyboardInterrupt``, ``SystemExit``) is not isolated: like one from a task, it
  starts the graceful shutdown and propagates bare from ``open_supervisor``; that
  subscriber's lane ends.
* An exception group from ``on_event`` is judged by what remains once trio's
  ``Cancelled`` is removed: only ``Exception`` instances left are an isolated failure
  (``SUBSCRIBER_FAILED``) and the ``Cancelled`` part is re-raised to the lane's scope;
  anything else is handled as above, without its ``Cancelled``.
* ``lane_of_caller()`` names the subscriber whose ``on_event`` makes a call (or a task
  it spawned: a context variable, inherited as the task record's is): the supervisor's
  ``shutdown()`` cannot wait there, since the shutdown's drain waits for that call.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from ._config import check_capacity
from ._events import EventKind, TaskEvent, new_event
from ._exceptions import ConfigError, error_text, split_cancelled


class Subscriber(Protocol):
    """Anything with ``async def on_event(self, event)``.

    Optional attributes: ``name`` (default: the class name) and ``queue_capacity``
    (default 1024).
    """

    async def on_event(self, event: TaskEvent, /) -> None: ...


_current_lane: contextvars.ContextVar[_Lane] = contextvars.ContextVar("trio_taskvisor_lane")


class _Lane:
    __slots__ = ("closer", "deliver", "dropped", "name", "pending", "recv", "scope", "send")

    def __init__(
        self,
        name: str,
        capacity: int,
        deliver: Callable[[TaskEvent], Awaitable[object]],
        *,
        closer: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.deliver = deliver
        self.closer = closer  # set for events() streams: closes the consumer's channel
        self.send, self.recv = trio.open_memory_channel[TaskEvent](capacity)
        self.scope = trio.CancelScope()
        self.pending = 0  # drops not yet reported by an overflow marker
        self.dropped = 0  # all drops of this lane


class EventBus:
    """Owns sequence numbers, the bus channel and the lanes of one supervisor."""

    def __init__(
        self,
        capacity: int,
        subscribers: tuple[Subscriber, ...],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        self._send, self._recv = trio.open_memory_channel[TaskEvent](capacity)
        self._lanes: tuple[_Lane, ...] = ()
        self._seq = 0
        self._failed_origin: dict[int, _Lane] = {}
        self._nursery: trio.Nursery | None = None
        self._clock: trio.abc.Clock  # set when the bus starts running
        self._closed = False
        self._closing = False  # close() was called: nothing is published from then on
        self.finished = trio.Event()
        self.active = False
        self.published = 0
        self.dropped = 0
        self._initial = tuple(_subscriber_lane(s) for s in subscribers)
        seen: set[int] = set()
        for subscriber in subscribers:
            if id(subscriber) in seen:
                raise ConfigError(
                    f"subscriber {subscriber!r} is given twice: it would get every event twice"
                )
            seen.add(id(subscriber))
        # Called with a BaseException from on_event (KeyboardInterrupt): not isolated.
        self.on_crash = on_crash

    # -- publishing ---------------------------------------------------------------

    def _build(self, kind: EventKind, **fields: Any) -> TaskEvent:
        self._seq += 1
        self.published += 1
        return new_event(self._seq, self._clock.current_time(), time.time(), kind, **fields)

    def publish(self, kind: EventKind, *fields: Any, **named: Any) -> None:
        """Publish an event to every lane; never blocks, drops when full.

        ``fields`` are the event's fields after ``kind`` in declaration order
        (``task_id``, ``name``, ``slot``, ...), ``named`` any others. Callers on hot
        paths check ``active`` first and skip the call (and its arguments) without
        subscribers.
        """
        if not self.active:
            return
        self._seq += 1
        self.published += 1
        event = new_event(
            self._seq, self._clock.current_time(), time.time(), kind, *fields, **named
        )
        try:
            self._send.send_nowait(event)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.dropped += 1

    def subscriber_dropped(self) -> dict[str, int]:
        """Drops per subscriber name (streams excluded)."""
        counts: dict[str, int] = {}
        for lane in self._lanes:
            if lane.closer is None:
                counts[lane.name] = counts.get(lane.name, 0) + lane.dropped
        return counts

    # -- lifecycle ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the fan-out and the lanes until ``close()`` and the drain end."""
        try:
            # trio.current_time() is this clock's time; asking it directly is cheaper
            # (benchmark row 2: one read per event).
            self._clock = trio.lowlevel.current_clock()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for lane in self._initial:
                    self._add_lane(lane)
                nursery.start_soon(self._fan_out, name="taskvisor fan-out")
                task_status.started()
        finally:
            self._closed = True
            self.active = False
            self.finished.set()

    def close(self) -> None:
        """Stop accepting events; the fan-out forwards what is queued, then ends."""
        self._closing = True
        self._send.close()

    def cancel(self) -> None:
        """Drop whatever is still queued and cancel lanes in progress."""
        for lane in self._lanes:
            # Taken out, not only counted: a call that outlives the cancellation (its
            # own shield) would have been handed them one after the other.
            queued = 0
            with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                while True:
                    lane.recv.receive_nowait()
                    queued += 1
            lane.dropped += queued
            self.dropped += queued
            lane.scope.cancel(reason="subscriber drain deadline passed")
        self.dropped += self._recv.statistics().current_buffer_used
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel(reason="subscriber drain deadline passed")

    def _add_lane(self, lane: _Lane) -> None:
        assert self._nursery is not None
        self._lanes = (*self._lanes, lane)
        self.active = True
        self._nursery.start_soon(self._run_lane, lane, name=f"taskvisor lane {lane.name}")

    def _remove_lane(self, lane: _Lane) -> None:
        self._lanes = tuple(x for x in self._lanes if x is not lane)
        self.active = bool(self._lanes)
        lane.send.close()
        lane.scope.cancel(reason="event stream closed")

    @asynccontextmanager
    async def stream(self, capacity: int) -> AsyncGenerator[trio.MemoryReceiveChannel[TaskEvent]]:
        """Open a lane that forwards later events into a receive channel."""
        capacity = check_capacity("capacity", capacity)
        send, recv = trio.open_memory_channel[TaskEvent](0)
        if self._closing or self._closed or self._nursery is None:
            # No later event will come (a lane added once the fan-out has ended would
            # never be closed): an ended stream.
            send.close()
            await trio.lowlevel.checkpoint()
            yield recv
            return
        lane = _Lane("events()", capacity, send.send, closer=send.close)
        self._add_lane(lane)
        try:
            await trio.lowlevel.checkpoint()
            yield recv
        finally:
            self._remove_lane(lane)

    # -- tasks ------------------------------------------------------------------------

    async def _fan_out(self) -> None:
        recv = self._recv
        try:
            while True:
                try:
                    event = await recv.receive()
                except trio.EndOfChannel:
                    return
                # Events already buffered are forwarded without a scheduler pass each.
                while True:
                    self._forward(event)
                    try:
                        event = recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
        finally:
            for lane in self._lanes:
                lane.send.close()

    def _forward(self, event: TaskEvent) -> None:
        origin = None
        if event.kind is EventKind.SUBSCRIBER_FAILED:
            origin = self._failed_origin.pop(event.seq, None)
        for lane in self._lanes:
            if lane is origin:
                continue
            try:
                lane.send.send_nowait(event)
            except trio.WouldBlock:
                lane.pending += 1
                lane.dropped += 1
                self.dropped += 1
            except trio.ClosedResourceError:
                pass

    def lane_of_caller(self) -> str | None:
        """The name of this bus's subscriber whose ``on_event`` (or a task it spawned)
        is the caller, or ``None``."""
        lane = _current_lane.get(None)
        return lane.name if lane is not None and lane in self._lanes else None

    async def _run_lane(self, lane: _Lane) -> None:
        _current_lane.set(lane)
        recv = lane.recv
        deliver = lane.deliver
        try:
            with lane.scope:
                while True:
                    try:
                        event = await recv.receive()
                    except trio.EndOfChannel:
                        return
                    # Deliver what is buffered without a scheduler pass per event, and
                    # with no coroutine but the subscriber's own per event.
                    while True:
                        try:
                            await deliver(event)
                        except Exception as exc:
                            if not self._isolate(lane, exc, event):
                                return
                        except BaseException as exc:
                            if not self._not_a_failure(lane, exc, event):
                                return
                        try:
                            event = recv.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    if lane.pending:
                        # Caught up: report what this lane dropped meanwhile, once.
                        dropped, lane.pending = lane.pending, 0
                        marker = self._build(
                            EventKind.SUBSCRIBER_OVERFLOW, name=lane.name, dropped=dropped
                        )
                        try:
                            await deliver(marker)
                        except Exception as exc:
                            if not self._isolate(lane, exc, marker):
                                return
                        except BaseException as exc:
                            if not self._not_a_failure(lane, exc, marker):
                                return
        finally:
            if lane.closer is not None:
                lane.closer()

    def _isolate(self, lane: _Lane, exc: Exception, event: TaskEvent) -> bool:
        """``on_event`` raised: isolate it. Whether the lane goes on."""
        if lane.closer is not None and isinstance(
            exc, trio.BrokenResourceError | trio.ClosedResourceError
        ):
            # The consumer of an events() stream closed its end: end the stream.
            self._remove_lane(lane)
            return False
        self._report_failure(lane, exc, event)
        return True

    def _not_a_failure(self, lane: _Lane, exc: BaseException, event: TaskEvent) -> bool:
        """``on_event`` raised a ``BaseException``: re-raise or report. Whether to go on."""
        cancelled, rest = split_cancelled(exc)
        if rest is None:
            raise exc
        if isinstance(rest, Exception):
            # Cancelled mixed with Exceptions (the subscriber's own nursery, cancelled
            # at the drain deadline while a child's cleanup raised): a failure, and
            # the Cancelled goes on to the scope it belongs to.
            self._report_failure(lane, rest, event)
            assert cancelled is not None  # else exc would have been an Exception
            raise cancelled from None
        # Not a subscriber failure (KeyboardInterrupt, SystemExit): like one raised by a
        # task, it starts the graceful shutdown and then propagates from open_supervisor,
        # without any Cancelled. This lane ends; the subscriber gets nothing more.
        lane.send.close()
        self.on_crash(rest)
        return False

    def _report_failure(self, lane: _Lane, exc: Exception, event: TaskEvent) -> None:
        """Isolate a subscriber's failure on ``event``: report it to the other lanes, keep
        this one; one on a report is not reported."""
        # Whatever it is (trio's resource errors from a subscriber's own channels
        # included), it is the subscriber's.
        if not self.active or event.kind is EventKind.SUBSCRIBER_FAILED:
            return
        reason = f"{type(exc).__name__}: {error_text(exc)}"
        failure = self._build(EventKind.SUBSCRIBER_FAILED, name=lane.name, reason=reason)
        self._failed_origin[failure.seq] = lane
        try:
            self._send.send_nowait(failure)
        except (trio.WouldBlock, trio.ClosedResourceError):
            # Full, or closed for the shutdown drain: the report is dropped.
            self._failed_origin.pop(failure.seq)
            self.dropped += 1


def _subscriber_lane(subscriber: Subscriber) -> _Lane:
    on_event = getattr(subscriber, "on_event", None)
    if on_event is None or not inspect.iscoroutinefunction(on_event):
        raise TypeError(f"subscriber must have an 'async def on_event(event)', got {subscriber!r}")
    name = getattr(subscriber, "name", None) or type(subscriber).__name__
    if not isinstance(name, str):
        raise TypeError(f"subscriber name must be a str, got {name!r}")
    capacity = check_capacity(
        f"queue_capacity of subscriber {name!r}", getattr(subscriber, "queue_capacity", 1024)
    )
    return _Lane(name, capacity, on_event)

"""The one shared, cached shutdown workflow of a supervisor.

1. Close intake (the facade's flag: ``started``); publish ``SHUTDOWN_REQUESTED``
   (explicit calls, leaving the ``open_supervisor`` block, signals and crashes; not
   ``run()``'s natural completion).
2. The controller rejects queued and held work, at once: from then on no queue
   advances. The registry gets the shutdown behind every command already accepted, so
   those are processed with real replies.
3. The registry soft-stops every task under one grace deadline and forces the rest at
   that deadline (``GRACE_EXCEEDED``, else ``ALL_STOPPED_WITHIN_GRACE``).
4. Wait for every actor to exit physically (this wait cannot be bounded in trio: a
   forced task that never reaches a checkpoint keeps it open), then drain subscribers
   for at most ``subscriber_shutdown_timeout`` and drop the rest. A signal during the
   drain (``cut_drain``) ends it at once, as its deadline does; one before the drain
   does not shorten it (the subscribers still get the forced tasks' last events).

The workflow runs as a task in the supervisor's shielded background nursery, so
cancelling a caller of ``shutdown()`` only stops that caller's wait.
"""

from __future__ import annotations

import trio

from ._bus import EventBus
from ._controller import Controller
from ._events import EventKind
from ._exceptions import GraceExceededError
from ._registry import Registry


class Shutdown:
    """State of the one shutdown: started (intake closed), done, and its result."""

    __slots__ = (
        "_bus",
        "_controller",
        "_drain",
        "_drain_timeout",
        "_grace",
        "_registry",
        "begun",
        "done",
        "started",
        "stuck",
    )

    def __init__(
        self,
        registry: Registry,
        bus: EventBus,
        controller: Controller | None,
        *,
        grace: float,
        drain_timeout: float,
    ) -> None:
        self._registry = registry
        self._controller = controller
        self._bus = bus
        self._grace = grace
        self._drain_timeout = drain_timeout
        self._drain: trio.CancelScope | None = None  # the subscribers' drain, once begun
        self.started = False
        self.begun = trio.Event()  # set with ``started``: what ``wait_closing()`` waits for
        self.done = trio.Event()
        self.stuck: tuple[str, ...] = ()

    def start(self, nursery: trio.Nursery, *, explicit: bool) -> None:
        """Begin the workflow in ``nursery`` unless it has begun; close intake at once.

        A background that already ended (a loop of the supervisor raised: a bug) has
        nothing left to run: its error is the one that propagates."""
        if self.started:
            return
        self.started = True
        self.begun.set()
        self._registry.close_intake()
        if self.done.is_set():
            return
        if self._controller is not None:
            # Now, not in the workflow's task: an owner that ends before that task runs
            # (the critical failure that began this shutdown) would advance its slot.
            self._controller.close()
        if explicit and self._bus.active:
            self._bus.publish(EventKind.SHUTDOWN_REQUESTED)
        nursery.start_soon(self._run, name="taskvisor shutdown")

    def error(self) -> GraceExceededError | None:
        """The cached result as a fresh exception, or ``None``."""
        return GraceExceededError(self._grace, self.stuck) if self.stuck else None

    async def wait(self) -> None:
        """Wait for the workflow to finish; raise its result. A checkpoint."""
        await self.done.wait()
        error = self.error()
        if error is not None:
            raise error

    def cut_drain(self) -> None:
        """End the subscribers' drain now, dropping what they have left, as its deadline
        does (a signal during it). Before the drain, nothing."""
        if self._drain is not None:
            self._drain.cancel(reason="a signal during the subscribers' drain")

    async def _run(self) -> None:
        registry = self._registry
        bus = self._bus
        try:
            registry.begin_shutdown(trio.current_time() + self._grace)
            await registry.exited.wait()
            if self._controller is not None:
                # Every owner has exited: its lease is given back; then the keeper drains.
                await self._controller.close_store()
                self._controller.end()
                await self._controller.exited.wait()
            self.stuck = tuple(registry.stuck)
            bus.close()
            with trio.move_on_after(self._drain_timeout) as self._drain:
                await bus.finished.wait()
            if not bus.finished.is_set():
                bus.cancel()
                await bus.finished.wait()
        finally:
            self.done.set()

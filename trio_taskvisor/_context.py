"""``TaskContext``: what an attempt knows about itself, via ``current_context()``.

Decisions the design leaves open:

* ``current_context()`` works in the attempt's own task; child tasks the attempt
  spawns inherit the context variable, so they see the same ``TaskContext``.
* ``defer_cancel()`` blocks may nest; the force at the grace deadline, and the attempt
  timeout, end all of them.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import trio

from ._record import TaskRecord, current_task_context

if TYPE_CHECKING:
    from ._outcome import TaskId
    from ._supervisor import Supervisor  # the one upward edge: a type annotation only


def current_context() -> TaskContext:
    """Return the ``TaskContext`` of the supervised attempt running this code.

    Raises ``RuntimeError`` outside a supervised attempt.
    """
    try:
        record = current_task_context.get()
    except LookupError:
        raise RuntimeError("current_context() called outside a supervised attempt") from None
    extras = record.extras()
    if extras.task_context is None:
        extras.task_context = TaskContext(record)
    return cast("TaskContext", extras.task_context)


class TaskContext:
    """The running task's identity, attempt number and stop request."""

    __slots__ = ("_record", "supervisor")

    def __init__(self, record: TaskRecord) -> None:
        self._record = record
        self.supervisor = cast("Supervisor", record.supervisor)
        """The supervisor that runs the task."""

    def __repr__(self) -> str:
        return f"<TaskContext {self.id} {self.name!r} attempt={self.attempt}>"

    @property
    def id(self) -> TaskId:
        """The task's ``TaskId``."""
        return self._record.id

    @property
    def name(self) -> str:
        """The task's name."""
        return self._record.name

    @property
    def slot(self) -> str | None:
        """The controller slot, or ``None`` for work added with ``add``."""
        return self._record.slot

    @property
    def fence_token(self) -> int | None:
        """The fence token of the slot's cluster lease, or ``None`` without a slot store.

        It strictly increases with every new owner of the slot, across processes: pass
        it to the systems the task writes to, so they can refuse a stale owner's writes.
        """
        return self._record.fence_token

    @property
    def attempt(self) -> int:
        """The current attempt number, from 1."""
        return self._record.attempt

    @property
    def cancel_requested(self) -> bool:
        """Whether a stop (remove, cancel, replace, shutdown) was requested."""
        return self._record.stop_requested

    async def wait_cancel_requested(self) -> None:
        """Wait until a stop is requested. A checkpoint."""
        await self._record.cancel_flag().wait_value(True)  # pyright: ignore[reportUnknownMemberType]

    @contextmanager
    def defer_cancel(self) -> Generator[None]:
        """Keep a stop request out of this block until the grace deadline.

        The block is shielded from the soft stop; when grace expires (or the attempt's
        timeout passes) the stop is forced and cancellation reaches the block. Entered
        after the force, it does not shield.
        """
        record = self._record
        if record.forced:
            yield
            return
        scope = trio.CancelScope(shield=True, deadline=record.hard_deadline)
        extras = record.extras()
        if extras.defer_scopes is None:
            extras.defer_scopes = set()
        scopes = extras.defer_scopes
        scopes.add(scope)
        try:
            with scope:
                try:
                    yield
                finally:
                    # The attempt timeout passed: unshield so the cancellation of the
                    # enclosing (expired) timeout scope propagates instead of stopping here.
                    if scope.cancel_called:
                        scope.shield = False
        finally:
            scopes.discard(scope)

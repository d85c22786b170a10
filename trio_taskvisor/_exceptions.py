"""The exceptions trio_taskvisor raises, and the ones tasks raise to steer it.

::

    Exception
     ├── ConfigError(ValueError)              invalid configuration or policy values
     ├── TaskNameInUseError(ValueError)       .name; add/add_batch
     ├── ResourceLimitError(RuntimeError)     .resource, .limit
     ├── NoControllerError(RuntimeError)      submit without a controller
     ├── DeadlockError(RuntimeError)          a wait that closes a wait-for cycle
     ├── SlotStoreUnavailableError(RuntimeError)  slot store silent or refusing
     ├── LeaseLostError(RuntimeError)         a limited block's cluster units were lost
     ├── CriticalTaskError(RuntimeError)      .outcome, .task_id, .name; open_supervisor, run
     ├── GraceExceededError(Exception)        .grace, .stuck: tuple[str, ...]
     ├── OutcomeError(Exception)              .outcome; from TaskOutcome.unwrap()
     ├── FatalError(Exception)                raised by tasks: stop without retry; .exit_code
     ├── TaskFailure(Exception)               raised by tasks: retryable, with .exit_code
     └── TaskCancelled(Exception)             raised by tasks: stop as CANCELLED
    trio.ClosedResourceError
     └── SupervisorClosedError                intake after shutdown began

Messages are lower-case and name the offending value.

Each survives ``pickle`` and ``copy`` (a worker process's result, an error reporter that
copies): those built from fields rebuild from them (``__reduce__``), since the default
passes the message where the fields belong.
"""

from __future__ import annotations

from typing import Any, Final, cast

import trio

from ._outcome import OutcomeError as OutcomeError
from ._outcome import TaskId, TaskOutcome


def error_text(error: BaseException) -> str:
    """``str(error)``, which the exception of a task may fail to make (a ``__str__`` that
    raises): then ``"<exception str() failed>"``, as Python's tracebacks print it."""
    try:
        return str(error)
    except Exception:
        return "<exception str() failed>"


def exit_code_of(error: BaseException) -> int | None:
    """The ``exit_code`` of ``error`` if it has an ``int`` one (``FatalError``,
    ``TaskFailure``, or any exception of the task's); ``None`` also when reading it
    raises."""
    try:
        code = getattr(error, "exit_code", None)
    except Exception:
        return None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


class ConfigError(ValueError):
    """A configuration or policy value is invalid; raised where the value is given."""


class TaskNameInUseError(ValueError):
    """The task name is taken by a registered, stopping or still-running task."""

    def __init__(self, name: str) -> None:
        super().__init__(f"task name {name!r} is already in use")
        self.name = name
        """The name that is taken."""

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.name,), self.__dict__


class ResourceLimitError(RuntimeError):
    """A configured limit (``resource``) of size ``limit`` is reached."""

    def __init__(self, resource: str, limit: int) -> None:
        super().__init__(f"{resource} limit of {limit} reached")
        self.resource = resource
        """The name of the limit's setting, such as ``"max_registered_tasks"``."""
        self.limit = limit
        """The limit's configured value."""

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.resource, self.limit), self.__dict__


class NoControllerError(RuntimeError):
    """A controller operation was used on a supervisor without a ``ControllerConfig``."""

    def __init__(self, operation: str = "submit") -> None:
        super().__init__(
            f"{operation} needs a controller: pass SupervisorConfig(controller=ControllerConfig())"
        )
        self._operation = operation

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self._operation,), self.__dict__


class DeadlockError(RuntimeError):
    """A wait inside a supervised attempt would close a wait-for cycle.

    Raised by ``TaskWaiter.wait()`` and ``wait_placed()``, and by the waits inside
    ``run_in_slot``, ``cancel``, ``cancel_slot`` and ``wait_slot_idle``, when the awaited
    work cannot start or finish until the caller's own attempt ends (work queued behind
    the caller's slot, a ``max_concurrent`` permit only the caller could free, two slots
    waiting for each other). The message names every task on the cycle, from the caller.
    Also raised by ``Supervisor.wait_idle()`` inside an attempt of the same supervisor
    (the caller's own task is alive until it returns), and by ``limited()`` asking for a
    concurrency pool the caller already holds.
    """


class SlotStoreUnavailableError(RuntimeError):
    """The slot store refused what the supervisor needs, or did not answer in time.

    Raised by ``open_supervisor`` when the server cannot be used at start, and by
    ``Supervisor.cluster_slot`` when it cannot answer. When the server answered with an
    error (credentials, permissions, an unknown command, the database number, TLS, not
    the Redis protocol), the message says what was refused and ``__cause__`` is the
    client's error; "did not answer within N s" (no cause) means silence for
    ``connect_timeout``.
    """


class LeaseLostError(RuntimeError):
    """The cluster units of a ``Supervisor.limited`` block were lost.

    Raised into the block at once (from its next checkpoint) when this process could not
    renew its units on the slot store's server for ``0.8 * lease_ttl``: another process
    may hold them now. The message names the pools: ``"limit lease lost: <pools>"``.
    Also raised into a block of a task outside the supervisor that still holds its units
    when the supervisor's shutdown ends: nothing renews them from then on.
    """


class CriticalTaskError(RuntimeError):
    """A task marked ``critical`` ended ``FAILED``, ``FATAL`` or ``PANICKED``.

    Raised by ``open_supervisor`` (leaving the block) and ``run`` after the shutdown that
    the failure began; the failed outcome's error, if any, is in ``outcome.error``.
    """

    def __init__(self, outcome: TaskOutcome[Any], task_id: TaskId, name: str) -> None:
        super().__init__(
            f"critical task {name!r} ({task_id}) ended {outcome.kind.value}: {outcome.reason}"
        )
        self.outcome = outcome
        """The critical task's final outcome."""
        self.task_id = task_id
        """The critical task's ``TaskId``."""
        self.name = name
        """The critical task's name."""

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.outcome, self.task_id, self.name), self.__dict__


class GraceExceededError(Exception):
    """Shutdown had to force-abort tasks that did not stop within ``grace`` seconds."""

    def __init__(self, grace: float, stuck: tuple[str, ...]) -> None:
        super().__init__(
            f"{len(stuck)} task(s) did not stop within the grace of {grace!r} s: "
            + ", ".join(stuck)
        )
        self.grace = grace
        """The grace window that ran out, in seconds."""
        self.stuck = stuck
        """The names of the tasks that were forced, sorted."""

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.grace, self.stuck), self.__dict__


def _check_exit_code(exit_code: object) -> None:
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise TypeError(f"exit_code must be an int or None, got {exit_code!r}")


class FatalError(Exception):
    """Raised by a task to stop at once, without retry (outcome ``FATAL``)."""

    def __init__(self, reason: str, *, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        """Why the task stopped; also ``str()`` of the error."""
        _check_exit_code(exit_code)
        self.exit_code = exit_code
        """Copied to ``TaskOutcome.exit_code`` and the events; ``None`` by default."""


class TaskFailure(Exception):
    """Raised by a task for a retryable failure that carries an exit code."""

    def __init__(self, reason: str, *, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        """What failed; also ``str()`` of the error."""
        _check_exit_code(exit_code)
        self.exit_code = exit_code
        """Copied to the events and, if final, ``TaskOutcome.exit_code``; ``None`` by default."""


class TaskCancelled(Exception):
    """Raised by a task to end itself as ``CANCELLED``, without retry."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(*(() if reason is None else (reason,)))
        self.reason = reason
        """Why the task ended itself, or ``None``."""


_CLOSED: Final = "the supervisor is closed: its shutdown has begun, so it takes no new work"


class SupervisorClosedError(trio.ClosedResourceError):
    """Intake (add, submit) after the supervisor's shutdown has begun."""

    def __init__(self, message: str = _CLOSED) -> None:
        super().__init__(message)


def split_cancelled(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """Split ``exc`` into trio's ``Cancelled`` and the rest, which decides how it is handled.

    The rest is ``None`` when ``exc`` is only cancellation. A group that mixes
    ``Cancelled`` with other exceptions (a task's or a subscriber's own nursery, cancelled
    while a child's cleanup raised) leaves the group of the others: an ``Exception`` when
    only ``Exception`` instances remain (an ordinary failure), else a ``BaseException``
    that takes the supervisor down. The ``Cancelled`` part belongs to its scope: re-raise
    it, or let trio deliver it again at the next checkpoint inside that scope.
    """
    if isinstance(exc, BaseExceptionGroup):
        parts = exc.split(trio.Cancelled)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        return cast("tuple[BaseException | None, BaseException | None]", parts)
    if isinstance(exc, trio.Cancelled):
        return exc, None
    return None, exc

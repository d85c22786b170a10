"""OpenTelemetry tracing for supervised work: ``traced`` and ``TracingSubscriber``.

Needs the ``otel`` extra (``pip install 'trio_taskvisor[otel]'``, the API only; install
and configure an SDK in the application)::

    from trio_taskvisor.contrib.otel import TracingSubscriber, traced

    async with open_supervisor(subscribers=[TracingSubscriber()]) as sup:
        with tracer.start_as_current_span("handle request"):
            await sup.add(TaskSpec.restartable("sync-acme", traced(sync_tenant), "acme"))

``traced(fn)`` returns an async function that opens one span around each call of
``fn``: one span per attempt. The supervisor captures the submitter's context
variables at ``add`` / ``submit`` / ``run_in_slot`` time and runs every attempt in a
copy of them, so the OpenTelemetry context of the caller is current inside the attempt
and the attempt's span is a child of the submitter's span, however late the attempt
runs (retries and periodic repeats included). The span is current inside ``fn``, so
spans ``fn`` opens are its children.

Span name: ``span_name``, default ``fn.__qualname__`` (``"taskvisor.attempt"`` for
callables without one). Attributes:

===============================  ==================================================
``taskvisor.task.name``          the task's name
``taskvisor.task.id``            its ``TaskId`` (an int)
``taskvisor.task.slot``          its controller slot (absent for ``add``)
``taskvisor.attempt.number``     the attempt, from 1
``taskvisor.attempt.result``     ``succeeded``, ``failed``, ``fatal``, ``timed_out``,
                                 ``cancelled`` or ``force_aborted``
``taskvisor.attempt.exit_code``  the error's ``exit_code``, when it has one
``taskvisor.forced_exit.delay``  for ``force_aborted``: seconds from the force to the
                                 attempt's physical exit (``FORCED_TASK_EXITED``'s
                                 ``duration``)
===============================  ==================================================

``failed``, ``fatal`` and ``timed_out`` set the span status to ERROR (the exception
is recorded as a span event); the other results leave it unset. Span events:

* ``taskvisor.force_aborted``: the stop was forced at the grace deadline. Stamped when
  the attempt exits, or at the force itself when a ``TracingSubscriber`` learns of it
  while the attempt is still running (sync code, its own shield).
* ``taskvisor.backoff`` on attempts after the first, with the ``BACKOFF_SCHEDULED``
  event's ``delay``, ``source`` (``failure`` / ``success``) and ``reason``: needs a
  ``TracingSubscriber`` among the supervisor's subscribers. Best-effort like every
  event: a backoff that reaches the subscriber after the next attempt has started (a
  zero delay, a lagging subscriber queue) is missing.

Decisions the design leaves open:

* A force-aborted attempt's span ends when its body physically exits, after the task's
  events ended (``TASK_REMOVED``; only ``FORCED_TASK_EXITED`` comes later): its result
  comes from the wrapper, which sees the exit, never from an attempt event (none is
  published for it).
* The task's final outcome is not on any span: it is only known after the last
  attempt, from ``TaskWaiter.wait()``; ``taskvisor.attempt.result`` is per attempt.
* Work added outside any span starts a new trace per attempt. A periodic task added
  inside a request span keeps adding attempt spans to that request's trace for as
  long as it runs: add long-lived work outside request spans.
* Outside a supervised attempt (a direct call in a test), or nested in an attempt
  that already has its ``traced`` span (a traced helper it calls), the wrapper opens
  a plain span with no ``taskvisor.*`` attributes.
* ``tracer=None`` uses ``trace.get_tracer("trio_taskvisor")`` at decoration time; the
  API's proxy tracer follows a tracer provider installed later.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, ParamSpec, TypeVar

import trio
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from .._config import check_capacity
from .._events import EventKind, TaskEvent
from .._exceptions import FatalError, TaskCancelled, error_text, exit_code_of, split_cancelled
from .._outcome import OutcomeKind, TaskId
from .._record import TaskRecord, current_task_context
from .._spec import check_async_callable

__all__ = ["TracingSubscriber", "traced"]

P = ParamSpec("P")
T = TypeVar("T")

_MAX_NOTES: Final = 4096


class _LiveAttempt:
    __slots__ = ("force_noted", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.force_noted = False


# Attempts in progress under a ``traced`` wrapper, by task (an entry lives exactly as
# long as its attempt: removed when the wrapper exits). TaskIds are process-unique.
_live: Final[dict[TaskId, _LiveAttempt]] = {}
# BACKOFF_SCHEDULED events waiting for the next attempt's span, oldest first. Bounded:
# a task whose next attempt never comes and whose TASK_REMOVED was lost would
# otherwise stay for ever.
_backoffs: Final[collections.OrderedDict[TaskId, TaskEvent]] = collections.OrderedDict()


def traced(
    fn: Callable[P, Awaitable[T]],
    *,
    tracer: Tracer | None = None,
    span_name: str | None = None,
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Wrap ``fn`` so each call (each attempt) runs in its own span.

    The span is a child of the span current in the submitter's captured context.
    ``fn`` is checked as a ``TaskSpec`` checks its function (``TypeError`` for a
    synchronous function, a lambda, a coroutine object, ...): the wrapper itself is
    always an async function, which would hide the mistake until an attempt ran.
    """
    check_async_callable(fn)
    the_tracer = tracer if tracer is not None else trace.get_tracer("trio_taskvisor")
    name = span_name if span_name is not None else getattr(fn, "__qualname__", None)
    if not isinstance(name, str) or not name:
        name = "taskvisor.attempt"

    @functools.wraps(fn)
    async def attempt(*args: P.args, **kwargs: P.kwargs) -> T:
        record = current_task_context.get(None)
        if record is None or record.id in _live:
            # Not an attempt, or a nested call within one (a traced helper the attempt
            # calls, maybe from a child task): a plain span, a child of the current one.
            with the_tracer.start_as_current_span(name):
                return await fn(*args, **kwargs)
        with the_tracer.start_as_current_span(
            name,
            attributes=_start_attributes(record),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            live = _LiveAttempt(span)
            _live[record.id] = live
            note = _backoffs.pop(record.id, None)
            if note is not None and note.attempt == record.attempt - 1:
                span.add_event("taskvisor.backoff", _backoff_attributes(note))
            error: BaseException | None = None
            try:
                return await fn(*args, **kwargs)
            except BaseException as exc:
                error = exc
                raise
            finally:
                del _live[record.id]
                _finish(span, live, record, error)

    return attempt


def _start_attributes(record: TaskRecord) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "taskvisor.task.name": record.name,
        "taskvisor.task.id": int(record.id),
        "taskvisor.attempt.number": record.attempt,
    }
    if record.slot is not None:
        attributes["taskvisor.task.slot"] = record.slot
    return attributes


def _backoff_attributes(event: TaskEvent) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {"taskvisor.backoff.delay": event.delay or 0.0}
    if event.backoff_source is not None:
        attributes["taskvisor.backoff.source"] = event.backoff_source.value
    if event.reason is not None:
        attributes["taskvisor.backoff.reason"] = event.reason
    return attributes


def _finish(
    span: Span, live: _LiveAttempt, record: TaskRecord, error: BaseException | None
) -> None:
    """Classify the attempt as the actor does, and annotate its span."""
    timed_out = trio.current_time() >= record.hard_deadline
    rest = None if error is None else split_cancelled(error)[1]
    if isinstance(rest, Exception):
        error = rest  # a group of Cancelled and Exceptions counts as its Exceptions
    if record.forced:
        result = "force_aborted"
    elif isinstance(error, TaskCancelled):
        result = "cancelled"
    elif isinstance(error, FatalError):
        result = "fatal"
    elif isinstance(error, Exception):
        result = "failed"
    elif timed_out:
        # Trio's Cancelled from the attempt's timeout scope, or a return after the
        # deadline (the attempt swallowed the cancellation): the actor's ATTEMPT_TIMED_OUT.
        result = "timed_out"
    elif error is not None:
        result = "cancelled"
    else:
        result = "succeeded"
    span.set_attribute("taskvisor.attempt.result", result)
    code = None if error is None else exit_code_of(error)
    if code is not None:
        span.set_attribute("taskvisor.attempt.exit_code", code)
    if result in ("failed", "fatal"):
        assert error is not None
        text = error_text(error)
        try:
            span.record_exception(error)
        except Exception:  # the SDK makes str(error), which may raise: record what it can
            message = {"exception.type": type(error).__qualname__, "exception.message": text}
            span.add_event("exception", message)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {text}"))
    elif result == "timed_out":
        span.set_status(Status(StatusCode.ERROR, "attempt timed out"))
    if result == "force_aborted":
        # Since the force (the record's force deadline is the force's time once forced).
        span.set_attribute(
            "taskvisor.forced_exit.delay", trio.current_time() - record.force_deadline
        )
        if not live.force_noted:
            span.add_event("taskvisor.force_aborted")


class TracingSubscriber:
    """Add supervisor decisions to the spans of ``traced`` attempts.

    Keeps each task's latest ``BACKOFF_SCHEDULED`` for its next attempt's span (the
    ``taskvisor.backoff`` event), and stamps ``taskvisor.force_aborted`` on an attempt
    span still running when its task is force-aborted. Never blocks.
    """

    def __init__(self, *, name: str = "TracingSubscriber", queue_capacity: int = 1024) -> None:
        self.name = name
        """The subscriber's name in ``SUBSCRIBER_*`` events and ``subscriber_dropped``."""
        self.queue_capacity = check_capacity("queue_capacity", queue_capacity)
        """The size of its event queue; events that find it full are dropped."""

    def __repr__(self) -> str:
        return f"<TracingSubscriber name={self.name!r}>"

    async def on_event(self, event: TaskEvent) -> None:
        """Record or apply ``event``."""
        task_id = event.task_id
        if task_id is None:
            return
        kind = event.kind
        if kind is EventKind.BACKOFF_SCHEDULED:
            _backoffs[task_id] = event
            _backoffs.move_to_end(task_id)
            if len(_backoffs) > _MAX_NOTES:
                _backoffs.popitem(last=False)
        elif kind is EventKind.TASK_REMOVED or kind is EventKind.FORCED_TASK_EXITED:
            # A task's events end with TASK_REMOVED (a forced one's with its exit): its
            # pending backoff note, if any, will never be used.
            _backoffs.pop(task_id, None)
        elif kind is EventKind.TASK_FINISHED and event.outcome is OutcomeKind.FORCE_ABORTED:
            live = _live.get(task_id)
            if live is not None and not live.force_noted:
                live.force_noted = True
                live.span.add_event("taskvisor.force_aborted", timestamp=int(event.wall_time * 1e9))

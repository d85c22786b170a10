"""``LoggingSubscriber``: one stdlib log record per event.

Every event field goes into the record's ``extra`` under a ``taskvisor_`` prefix
(``taskvisor_name``, ``taskvisor_kind``, ...), so structured formatters (JSON,
structlog's stdlib bridge) get them as fields; ``name`` itself is reserved by
``LogRecord``. Failures log at WARNING (a slot store's outage too), losses and faults
at ERROR (a forced or a panicked task, a lost lease, a failed subscriber), routine
lifecycle at DEBUG/INFO. ``BACKOFF_SCHEDULED`` of a periodic task waiting for its next
run (``backoff_source=SUCCESS``) is routine: DEBUG; a retry's is INFO.
``FORCED_TASK_EXITED`` (a forced task's late physical exit) is a WARNING.

Subscribing a ``LoggingSubscriber`` (or a subclass) turns off the supervisor's own
``log_failures`` records: its records already cover every failure.

``log`` writes those records, and every other record of the library's own (outages,
retries, a shutdown's trouble): the application's logging never raises through it into
a loop (a filter that raises loses its record, reported on stderr).
"""

from __future__ import annotations

import logging
import math
import sys
import traceback
from collections.abc import Mapping
from decimal import Decimal
from typing import Final

import attrs

from ._events import BackoffSource, EventKind, TaskEvent
from ._outcome import OutcomeKind

_LEVELS: Final = {
    EventKind.TASK_ADD_REQUESTED: logging.DEBUG,
    EventKind.ATTEMPT_STARTING: logging.DEBUG,
    EventKind.ATTEMPT_SUCCEEDED: logging.DEBUG,
    EventKind.TASK_REMOVED: logging.DEBUG,
    EventKind.CONTROLLER_SUBMITTED: logging.DEBUG,
    EventKind.CONTROLLER_SLOT_TRANSITION: logging.DEBUG,
    EventKind.ATTEMPT_FAILED: logging.WARNING,
    EventKind.ATTEMPT_TIMED_OUT: logging.WARNING,
    EventKind.TASK_ADD_FAILED: logging.WARNING,
    EventKind.CONTROLLER_REJECTED: logging.WARNING,
    EventKind.SUBSCRIBER_OVERFLOW: logging.WARNING,
    EventKind.CONTROLLER_STORE_UNAVAILABLE: logging.WARNING,
    EventKind.FORCED_TASK_EXITED: logging.WARNING,
    EventKind.GRACE_EXCEEDED: logging.ERROR,
    EventKind.SUBSCRIBER_FAILED: logging.ERROR,
    EventKind.CONTROLLER_LEASE_LOST: logging.ERROR,
}
_FAILED_OUTCOMES: Final = {
    OutcomeKind.FAILED: logging.WARNING,
    OutcomeKind.FATAL: logging.ERROR,
    OutcomeKind.FORCE_ABORTED: logging.ERROR,
    OutcomeKind.PANICKED: logging.ERROR,
    OutcomeKind.LEASE_LOST: logging.ERROR,
}


_LOGGER: Final = logging.getLogger("trio_taskvisor")


def log(
    level: int,
    msg: str,
    *args: object,
    exc_info: BaseException | None = None,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Write one of the library's own records (a failure, a retry, an outage, ...) to
    the ``trio_taskvisor`` logger, from the caller's line, never raising into the loop
    that logs. Logging hands a handler's own errors to its ``handleError``, but lets a
    filter's through (a logger's or a handler's ``filter`` that raises): such an error
    is reported as logging reports a handler's ("--- Logging error ---" and its
    traceback on stderr, when ``logging.raiseExceptions``) and the record is lost."""
    try:
        _LOGGER.log(level, msg, *args, exc_info=exc_info, extra=extra, stacklevel=2)
    except Exception:
        if logging.raiseExceptions and sys.stderr is not None:
            try:
                sys.stderr.write("--- Logging error ---\n")
                traceback.print_exc(file=sys.stderr)
                sys.stderr.write(f"Message: {msg!r}\nArguments: {args!r}\n")
            except Exception:
                pass


def seconds(value: float) -> str:
    """A duration as log lines show it to a person: three significant digits and the
    unit, never an exponent: ``"0.238 s"``, ``"30 s"``, ``"3600 s"`` (``%.3g`` would say
    ``3.6e+03``), and under a millisecond in milliseconds, ``"0.197 ms"`` (not
    ``0.000197s``). The one formatter of the library's log lines and the demo's."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g} s"
    if abs(value) >= 999.5:  # 999.9 would round to 1e+03
        return f"{value:.0f} s"
    if abs(value) >= 0.001:
        return f"{value:.3g} s"
    return f"{Decimal(f'{value * 1000:.3g}'):f} ms"


def _level(event: TaskEvent) -> int:
    kind = event.kind
    if kind is EventKind.TASK_FINISHED and event.outcome is not None:
        return _FAILED_OUTCOMES.get(event.outcome, logging.INFO)
    if kind is EventKind.BACKOFF_SCHEDULED and event.backoff_source is BackoffSource.SUCCESS:
        return logging.DEBUG  # a periodic task waiting for its next run: routine
    return _LEVELS.get(kind, logging.INFO)


def _words(text: str) -> str:
    return text.replace("_", " ").replace("-", " ").lower()


def says(reason: str | None, label: str) -> bool:
    """Whether ``reason`` begins with what ``label`` (an enum value) says, so a message
    showing both would repeat it (``superseded - superseded by ...``)."""
    return reason is not None and _words(reason).startswith(_words(label))


def _label(parts: list[str], label: str, reason: str | None) -> None:
    """Add ``label`` to the message unless ``reason`` begins with it."""
    if not says(reason, label):
        parts.append(label)


class LoggingSubscriber:
    """Log every event to ``logger`` (default: the ``trio_taskvisor`` logger)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger if logger is not None else logging.getLogger("trio_taskvisor")
        """The logger every event is written to."""
        self.name = "LoggingSubscriber"
        """The subscriber's name in ``SUBSCRIBER_*`` events and ``subscriber_dropped``."""

    async def on_event(self, event: TaskEvent) -> None:
        """Log ``event``: one record, fields in ``extra``."""
        level = _level(event)
        if not self.logger.isEnabledFor(level):
            return
        kind = event.kind
        parts = [kind.value]
        if event.name is not None:
            parts.append(repr(event.name))
        if event.task_id is not None:
            parts.append(str(event.task_id))
        if event.attempt is not None and event.kind is not EventKind.TASK_FINISHED:
            parts.append(f"attempt={event.attempt}")
        if event.delay is not None:
            parts.append(f"delay={seconds(event.delay)}")
        if event.dropped is not None:
            parts.append(f"dropped={event.dropped}")
        if event.kind is EventKind.FORCED_TASK_EXITED and event.duration is not None:
            parts.append(f"{seconds(event.duration)} after the force")
        reason = event.reason
        # A label the reason already begins with is left out ("superseded - superseded by
        # a newer submission"); CONTROLLER_REJECTED's outcome (always REJECTED) repeats
        # its kind.
        if event.outcome is not None and kind is not EventKind.CONTROLLER_REJECTED:
            _label(parts, event.outcome.value, reason)
        if event.rejection is not None:
            _label(parts, event.rejection.value, reason)
        if reason is not None:
            parts.append(f"- {reason}")
        extra = {
            f"taskvisor_{key}": value for key, value in attrs.asdict(event, recurse=False).items()
        }
        self.logger.log(level, " ".join(parts), extra=extra)

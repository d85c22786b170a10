"""Helpers for testing code that uses trio_taskvisor.

``EventRecorder`` is a subscriber that keeps every event it receives. It can be
constructed outside ``trio.run``, so a pytest fixture can build it.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import trio

from ._config import check_capacity
from ._events import BackoffSource, EventKind, TaskEvent
from ._exceptions import ConfigError
from ._outcome import OutcomeKind, RejectionKind

__all__ = ["EventRecorder"]


def _kind(kind: EventKind | str) -> EventKind:
    """Accept an ``EventKind`` or its string value; fail at once for anything else."""
    if isinstance(kind, EventKind):
        return kind
    if not isinstance(kind, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"kind must be an EventKind, got {kind!r}")
    try:
        return EventKind(kind)
    except ValueError:
        raise ConfigError(f"unknown event kind {kind!r}") from None


_FIELDS: Final = frozenset(attrs.fields_dict(TaskEvent))
_ENUMS: Final[dict[str, type[OutcomeKind | RejectionKind | BackoffSource]]] = {
    "outcome": OutcomeKind,
    "rejection": RejectionKind,
    "backoff_source": BackoffSource,
}


def _check_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` to match on, an enum field's string value as its member (as ``kind``
    is taken). A field that no ``TaskEvent`` has, or a value no member has, fails at the
    call: it would match nothing, and ``wait_for`` would wait for ever."""
    unknown = sorted(fields.keys() - _FIELDS)
    if unknown:
        raise TypeError(
            f"TaskEvent has no field {', '.join(map(repr, unknown))}; "
            f"its fields: {', '.join(sorted(_FIELDS))}"
        )
    checked = dict(fields)
    for name, value in fields.items():
        enum = _ENUMS.get(name)
        if enum is not None and isinstance(value, str):
            try:
                checked[name] = enum(value)
            except ValueError:
                raise ConfigError(f"unknown {name} {value!r}") from None
    return checked


def _matches(event: TaskEvent, kind: EventKind, fields: dict[str, Any]) -> bool:
    return event.kind is kind and all(getattr(event, k) == v for k, v in fields.items())


class EventRecorder:
    """Record events in delivery order; query them and wait for them."""

    def __init__(self, *, name: str = "EventRecorder", queue_capacity: int = 1024) -> None:
        self.name = name
        """The subscriber's name in ``SUBSCRIBER_*`` events and ``subscriber_dropped``."""
        self.queue_capacity = check_capacity("queue_capacity", queue_capacity)
        """The size of its event queue; events that find it full are dropped."""
        self.events: list[TaskEvent] = []
        """Every event recorded, in delivery order."""
        self._waiters: list[tuple[EventKind, dict[str, Any], trio.Event]] = []

    async def on_event(self, event: TaskEvent) -> None:
        """Record ``event`` and wake the ``wait_for`` calls it matches."""
        self.events.append(event)
        for kind, fields, wake in self._waiters:
            if _matches(event, kind, fields):
                wake.set()

    def kinds(self, *wanted: EventKind) -> list[EventKind]:
        """The kinds of the recorded events in order, only ``wanted`` ones if given (each
        an ``EventKind`` or its string value, checked as ``of`` checks its ``kind``)."""
        kinds = {_kind(kind) for kind in wanted}
        return [e.kind for e in self.events if not kinds or e.kind in kinds]

    def of(self, kind: EventKind | str, **fields: Any) -> list[TaskEvent]:
        """Recorded events of ``kind`` whose attributes equal ``fields`` (``TypeError``
        for a name that is no ``TaskEvent`` field; an enum field, ``outcome`` say, may be
        given its member or its string value)."""
        kind = _kind(kind)
        fields = _check_fields(fields)
        return [e for e in self.events if _matches(e, kind, fields)]

    async def wait_for(self, kind: EventKind | str, **fields: Any) -> TaskEvent:
        """Return the first recorded match, waiting for one if there is none yet.

        A checkpoint. ``kind`` is an ``EventKind`` or its string value; ``TypeError``
        for a field name that is no ``TaskEvent`` field (it would wait for ever).
        """
        kind = _kind(kind)
        fields = _check_fields(fields)
        for event in self.events:
            if _matches(event, kind, fields):
                await trio.lowlevel.checkpoint()
                return event
        entry = (kind, fields, trio.Event())
        self._waiters.append(entry)
        try:
            await entry[2].wait()
        finally:
            self._waiters.remove(entry)
        return next(e for e in self.events if _matches(e, kind, fields))

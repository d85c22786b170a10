"""The keyed controller: one owner per slot.

Only its configuration exists so far; the controller loop lands with the keyed
controller work.
"""

from __future__ import annotations

import attrs

from ._bus import check_capacity
from ._exceptions import ConfigError


def _check_limit(what: str, value: object, *, minimum: int, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{what} must be {kind}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value!r}")


@attrs.frozen
class ControllerConfig:
    """Budgets of the keyed controller; ``None`` means unlimited where allowed."""

    queue_capacity: int = 1024
    max_slot_queue: int = 100
    max_total_pending: int | None = 1024
    max_slots: int | None = 1024
    max_waiters: int | None = 1024

    def __attrs_post_init__(self) -> None:
        check_capacity("queue_capacity", self.queue_capacity)
        _check_limit("max_slot_queue", self.max_slot_queue, minimum=0, optional=False)
        _check_limit("max_total_pending", self.max_total_pending, minimum=0)
        _check_limit("max_slots", self.max_slots, minimum=1)
        _check_limit("max_waiters", self.max_waiters, minimum=0)

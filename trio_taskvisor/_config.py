"""Configuration values and every validator: ``SupervisorConfig``, ``ControllerConfig``,
``TaskDefaults``.

Values are attrs frozen classes validated at construction, so bad input fails at the call
that gave it. One message style everywhere: ``"<what> must be <rule>, got <value!r>"``;
wrong *types* raise ``TypeError``, wrong *values* raise ``ConfigError``.

Decisions the design leaves open:

* Durations are finite-or-infinite numbers ``>= 0`` (``bool`` is not a number here);
  ints too large for a float raise ``ConfigError``. ``grace`` may be ``math.inf``
  (never force).
* ``timeout=math.inf`` is normalised to ``None`` like ``timeout=0``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import attrs

from ._exceptions import ConfigError
from ._policies import BackoffPolicy, RestartPolicy
from ._slotstore import SlotStore

# -- validators ---------------------------------------------------------------------------


def check_type(what: str, value: object, cls: type, *, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a ``cls`` (or ``None`` when ``optional``)."""
    if not isinstance(value, cls) and not (optional and value is None):
        suffix = " or None" if optional else ""
        raise TypeError(f"{what} must be a {cls.__name__}{suffix}, got {value!r}")


def check_duration(what: str, value: object) -> float:
    """Validate a duration in seconds: a finite-or-infinite number ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise ConfigError(f"{what} must fit in a float, got {value!r}: too large") from None
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(f"{what} must be >= 0, got {value!r}")
    return seconds


def check_count(what: str, value: object, *, minimum: int, optional: bool = True) -> int | None:
    """Validate a count or limit: an ``int >= minimum``, or ``None`` when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{what} must be {kind}, got {value!r}")
    if value < minimum:
        rule = f">= {minimum} or None" if optional else f">= {minimum}"
        raise ConfigError(f"{what} must be {rule}, got {value!r}")
    return value


def check_capacity(what: str, value: object) -> int:
    """Validate a channel capacity: an ``int >= 1``."""
    capacity = check_count(what, value, minimum=1, optional=False)
    assert capacity is not None
    return capacity


def normalize_timeout(value: object) -> float | None:
    """Validate an attempt timeout; ``0`` and ``inf`` mean no timeout (``None``)."""
    if value is None:
        return None
    seconds = check_duration("timeout", value)
    return None if seconds == 0 or math.isinf(seconds) else seconds


def check_max_retries(value: object) -> int | None:
    """Validate ``max_retries``: ``None`` (unlimited) or an ``int >= 1``."""
    if value == 0 and not isinstance(value, bool):
        raise ConfigError("max_retries must be >= 1 or None, got 0; use TaskSpec.once instead")
    return check_count("max_retries", value, minimum=1)


_Validator: TypeAlias = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _validator(check: Callable[[str, Any], object]) -> _Validator:
    """An attrs validator calling ``check(field name, value)``."""

    def validate(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        check(attribute.name, value)

    return validate


def _count(*, minimum: int, optional: bool = True) -> _Validator:
    return _validator(
        lambda what, value: check_count(what, value, minimum=minimum, optional=optional)
    )


def _instance(cls: type, *, optional: bool = False) -> _Validator:
    return _validator(lambda what, value: check_type(what, value, cls, optional=optional))


_DURATION: Final = _validator(check_duration)
_CAPACITY: Final = _validator(check_capacity)


def _check_slot_store(value: object) -> None:
    if value is not None and not isinstance(value, SlotStore):
        raise ConfigError(
            f"slot_store must be a slot store (trio_taskvisor.redis.RedisSlotStore) or None, "
            f"got {value!r}"
        )


# -- values ---------------------------------------------------------------------------------


@attrs.frozen
class TaskDefaults:
    """Supervisor-wide values for ``TaskSpec`` options left as ``INHERIT``."""

    restart: RestartPolicy = attrs.field(
        default=RestartPolicy.ON_FAILURE, validator=_instance(RestartPolicy)
    )
    backoff: BackoffPolicy = attrs.field(factory=BackoffPolicy, validator=_instance(BackoffPolicy))
    timeout: float | None = attrs.field(default=None, converter=normalize_timeout)
    max_retries: int | None = attrs.field(default=None, converter=check_max_retries)


@attrs.frozen
class ControllerConfig:
    """Budgets of the keyed controller; ``None`` means unlimited where allowed."""

    queue_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    max_slot_queue: int = attrs.field(default=100, validator=_count(minimum=0, optional=False))
    max_total_pending: int | None = attrs.field(default=1024, validator=_count(minimum=0))
    max_slots: int | None = attrs.field(default=1024, validator=_count(minimum=1))
    max_waiters: int | None = attrs.field(default=1024, validator=_count(minimum=0))
    slot_store: SlotStore | None = attrs.field(
        default=None, validator=_validator(lambda what, value: _check_slot_store(value))
    )


@attrs.frozen
class SupervisorConfig:
    """Settings of one supervisor; invalid values raise ``ConfigError``.

    ``grace`` may be ``math.inf`` (never force); capacities must be ``>= 1``.
    """

    grace: float = attrs.field(default=60.0, validator=_DURATION)
    subscriber_shutdown_timeout: float = attrs.field(default=5.0, validator=_DURATION)
    max_concurrent: int | None = attrs.field(default=None, validator=_count(minimum=1))
    max_registered_tasks: int | None = attrs.field(default=1024, validator=_count(minimum=1))
    command_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    bus_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    task_defaults: TaskDefaults = attrs.field(
        factory=TaskDefaults, validator=_instance(TaskDefaults)
    )
    controller: ControllerConfig | None = attrs.field(
        default=None, validator=_instance(ControllerConfig, optional=True)
    )
    random: random.Random = attrs.field(
        factory=random.Random, eq=False, validator=_instance(random.Random)
    )

"""Configuration values and every validator: ``SupervisorConfig``, ``ControllerConfig``,
``TaskDefaults``.

Values are attrs frozen classes validated at construction, so bad input fails at the call
that gave it. One message style everywhere: ``"<what> must be <rule>, got <value!r>"``;
wrong *types* raise ``TypeError``, wrong *values* raise ``ConfigError``.

Decisions the design leaves open:

* Durations are finite-or-infinite numbers ``>= 0`` (``bool`` is not a number anywhere
  in the API: ``TypeError``; NaN is a ``ConfigError`` that says it is not finite);
  ints too large for a float raise ``ConfigError``. ``grace`` may be ``math.inf``
  (never force).
* ``timeout=math.inf`` is normalised to ``None`` like ``timeout=0``.
* ``healthy_after=math.inf`` and ``retry_budget=math.inf`` are normalised to ``None``
  (never healthy, no budget); ``0`` is a ``ConfigError`` for both (they must be > 0).
* ``retry_on`` takes exception classes (``BaseException`` subclasses) in a ``tuple``;
  anything else, a bare class or a list included, is a ``TypeError``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import attrs

from ._exceptions import ConfigError
from ._limits import Pool, check_limits
from ._policies import BackoffPolicy, RestartLimit, RestartPolicy
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
    if math.isnan(seconds):
        raise ConfigError(f"{what} must be >= 0 and finite (or math.inf), got {value!r}")
    if seconds < 0:
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


def check_positive_seconds(what: str, value: object) -> float | None:
    """Validate ``healthy_after`` / ``retry_budget``: ``None`` or seconds ``> 0``.

    ``inf`` means ``None``.
    """
    if value is None:
        return None
    seconds = check_duration(what, value)
    if seconds == 0:
        raise ConfigError(f"{what} must be > 0 or None, got {value!r}")
    return None if math.isinf(seconds) else seconds


def normalize_healthy_after(value: object) -> float | None:
    """Validate ``healthy_after``: ``None`` or seconds ``> 0``."""
    return check_positive_seconds("healthy_after", value)


def normalize_retry_budget(value: object) -> float | None:
    """Validate ``retry_budget``: ``None`` or seconds ``> 0``."""
    return check_positive_seconds("retry_budget", value)


def check_retry_on(value: object) -> tuple[type[BaseException], ...] | None:
    """Validate ``retry_on``: ``None`` or a non-empty tuple of exception classes."""
    if value is None:
        return None
    if type(value) is not tuple:
        raise TypeError(f"retry_on must be a tuple of exception classes or None, got {value!r}")
    items: tuple[object, ...] = value  # pyright: ignore[reportUnknownVariableType]
    if not items:
        raise ConfigError("retry_on must name at least one exception class, got ()")
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"retry_on must hold exception classes, got {item!r} in {value!r}")
    return items  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


def check_critical(value: object) -> bool:
    """Validate ``critical``: a ``bool`` (``TypeError`` otherwise, ``0`` and ``1`` too)."""
    check_type("critical", value, bool)
    return value  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


def check_restart_limit(value: object) -> RestartLimit | None:
    """Validate ``restart_limit``: ``None`` or a ``RestartLimit``."""
    check_type("restart_limit", value, RestartLimit, optional=True)
    return value  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


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
    """The restart policy of tasks that inherit it."""
    backoff: BackoffPolicy = attrs.field(factory=BackoffPolicy, validator=_instance(BackoffPolicy))
    """The backoff policy of tasks that inherit it."""
    timeout: float | None = attrs.field(default=None, converter=normalize_timeout)
    """The attempt timeout in seconds of tasks that inherit it; ``None``: no limit."""
    max_retries: int | None = attrs.field(default=None, converter=check_max_retries)
    """The retry limit of tasks that inherit it; ``None``: unlimited."""
    healthy_after: float | None = attrs.field(default=None, converter=normalize_healthy_after)
    """Seconds after which an attempt counts as healthy; ``None``: never."""
    restart_limit: RestartLimit | None = attrs.field(default=None, converter=check_restart_limit)
    """The restart intensity limit of tasks that inherit it; ``None``: no limit."""
    retry_on: tuple[type[BaseException], ...] | None = attrs.field(
        default=None, converter=check_retry_on
    )
    """The exception classes worth a retry; ``None``: every ``Exception``."""
    retry_budget: float | None = attrs.field(default=None, converter=normalize_retry_budget)
    """Seconds from a streak's first failure in which retries may start; ``None``: no budget."""
    critical: bool = attrs.field(default=False, validator=_instance(bool))
    """Whether a task's final failure shuts the supervisor down (``CriticalTaskError``)."""
    limits: tuple[Pool, ...] = attrs.field(default=(), converter=check_limits)
    """The limit pools of tasks that inherit them; ``()``: none."""


@attrs.frozen
class ControllerConfig:
    """Budgets of the keyed controller; ``None`` means unlimited where allowed."""

    queue_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    """The size of the controller's bounded command channel; ``>= 1``."""
    max_slot_queue: int = attrs.field(default=100, validator=_count(minimum=0, optional=False))
    """The most entries queued in one slot behind its owner; REPLACE ignores it."""
    max_total_pending: int | None = attrs.field(default=1024, validator=_count(minimum=0))
    """The most queued entries over all slots; ``None``: unlimited."""
    max_slots: int | None = attrs.field(default=1024, validator=_count(minimum=1))
    """The most slots tracked at once (past it, ``RESOURCE_LIMIT``); ``None``: unlimited."""
    max_waiters: int | None = attrs.field(default=1024, validator=_count(minimum=0))
    """The most ``wait=True`` submissions held, joiners included; ``None``: unlimited."""
    slot_store: SlotStore | None = attrs.field(
        default=None, validator=_validator(lambda what, value: _check_slot_store(value))
    )
    """A ``RedisSlotStore`` makes every slot cluster-wide; ``None``: slots are in-process."""


@attrs.frozen
class SupervisorConfig:
    """Settings of one supervisor; invalid values raise ``ConfigError``.

    ``grace`` may be ``math.inf`` (never force); capacities must be ``>= 1``.
    ``log_failures`` (default ``True``) writes final ``FAILED``, ``FATAL`` and
    ``PANICKED`` outcomes (ERROR, with the error as ``exc_info``) and the first failed
    attempt of each failure streak (WARNING) to the ``trio_taskvisor`` logger, unless a
    ``LoggingSubscriber`` is subscribed.
    """

    grace: float = attrs.field(default=60.0, validator=_DURATION)
    """Seconds from a stop request (a task's or shutdown's) until it is forced; ``inf``: never."""
    subscriber_shutdown_timeout: float = attrs.field(default=5.0, validator=_DURATION)
    """Seconds to drain subscriber queues at shutdown, once every task has exited."""
    max_concurrent: int | None = attrs.field(default=None, validator=_count(minimum=1))
    """The most attempts running at once (FIFO permits); ``None``: unlimited."""
    max_registered_tasks: int | None = attrs.field(default=1024, validator=_count(minimum=1))
    """The most registered and stopping tasks (forced ones until they exit); ``None``: unlimited."""
    command_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    """The size of the registry's bounded command channel."""
    bus_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    """The size of the bounded event bus channel."""
    task_defaults: TaskDefaults = attrs.field(
        factory=TaskDefaults, validator=_instance(TaskDefaults)
    )
    """The values of ``TaskSpec`` options left as ``INHERIT``."""
    controller: ControllerConfig | None = attrs.field(
        default=None, validator=_instance(ControllerConfig, optional=True)
    )
    """Installs the keyed controller with these budgets; ``None``: no controller."""
    random: random.Random = attrs.field(
        factory=random.Random, eq=False, validator=_instance(random.Random)
    )
    """The source of backoff jitter; seed it for reproducible delays."""
    log_failures: bool = attrs.field(default=True, validator=_instance(bool))
    """Log final failures and each streak's first failed attempt to ``trio_taskvisor``."""

"""Restart and backoff policies: plain values and pure arithmetic, no trio.

Backoff maths. For the ``n``-th retry of a failure streak (``n = 0`` is the delay after
the first failure)::

    base  = 0                                 if first == 0
          = min(first * factor**n, max)       otherwise; overflow saturates at max
    delay = base                              Jitter.NONE
          = uniform(0, base)                  Jitter.FULL
          = uniform(base / 2, base)           Jitter.EQUAL
          = uniform(first, min(3 * base, max))  Jitter.BAND
    delay = max(delay, floor)
    delay = max(delay, 0.001)                 unless base == 0

Because ``factor >= 1`` and ``first <= max``, ``base`` is non-decreasing in ``n`` and
stays in ``[first, max]``; every jitter interval is therefore well formed and no delay
exceeds ``max(max, floor, 0.001)`` with ``floor <= max``.

Decisions the design leaves open, fixed here:

* Durations (``first``, ``max``, ``floor``, an ``always`` interval) must be finite and
  ``>= 0``: ``inf`` and NaN raise ``ConfigError`` like negatives do. Ints are accepted
  and stored as floats; anything else (``str``, ``None``, ``Decimal``, ``Fraction``,
  and ``bool``, which is not a number anywhere in the API) is a ``TypeError`` naming
  the field, and so is a ``jitter`` that is no ``Jitter``: wrong types raise
  ``TypeError`` here as everywhere in the API. (They raised ``ConfigError`` before, the
  only values that did.)
* ``floor`` above ``max`` is clamped to ``max`` rather than rejected.
* The ``floor`` applies after jitter, to every delay, including ``base == 0`` (so
  ``first=0, floor=f`` always waits ``f``). The 1 ms safety floor applies after ``floor``
  and only when ``base > 0``: ``first=0`` with ``floor=0`` gives exactly ``0.0``, an
  immediate retry.
* The RNG is drawn from only when the jitter needs it: never for ``Jitter.NONE`` and
  never when ``base == 0``, so such policies leave a seeded RNG's sequence untouched.
* ``delay_for_retry`` is O(1) for any ``n``: float power, with an ``OverflowError`` of
  ``factor**n`` (or an ``inf`` product) read as "beyond ``max``". This departs from exact
  maths only when ``max / first`` exceeds the float range (~1.8e308), which no real
  policy has. ``factor == 1`` is exact (``base = first``) however large ``n`` is.
* ``RestartPolicy.always(0)`` normalises to ``always(None)``: run again right after a
  success. An ``interval`` on any kind other than ``"always"`` is a ``ConfigError``.

Restart intensity (``RestartLimit``), fixed here where the design is
silent:

* The window is closed, as in Erlang/OTP (``R >= Now - Period``): a restart at ``at`` is
  counted with the earlier restarts ``s`` for which ``s >= at - within``; the limit is hit
  when that count, the new restart included, exceeds ``max_restarts``.
* A restart counts at the time it is scheduled to start (failure time plus backoff
  delay), not when a ``max_concurrent`` permit lets it begin: the rule stays pure, and
  the two differ only under permit contention.
* ``within`` must be finite (like every duration here); ``max_restarts`` an ``int >= 1``.
  Wrong types raise ``TypeError``, wrong values ``ConfigError`` (the rule of ``_spec``
  and ``_config``).
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from collections.abc import Callable
from typing import ClassVar, cast

import attrs

from ._exceptions import ConfigError, error_text

_SAFETY_FLOOR = 0.001
_DEFAULT_MAX = 30.0


class Jitter(enum.Enum):
    """How a backoff delay is randomised around its base."""

    NONE = "none"
    """Exactly the base delay; draws no randomness."""
    FULL = "full"
    """Uniform in ``[0, base]``."""
    EQUAL = "equal"
    """Uniform in ``[base / 2, base]``."""
    BAND = "band"
    """Uniform in ``[first, min(3 * base, max)]`` (decorrelated-style band)."""


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_to_float(value: float) -> float:
    """Store ints as floats and ``-0.0`` as ``0.0``; leave the rest to the validator."""
    if _is_real(value):
        try:
            return float(value) + 0.0
        except OverflowError:  # an int too large for a float; the validator rejects it
            return value
    return value


def positive_seconds(what: str, value: object) -> float:
    """``value`` as a float number of seconds, finite and ``> 0``: ``TypeError`` for a
    non-number (a ``bool`` included), ``ConfigError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{what} must be finite and > 0, got {value!r}")
    return seconds


def _finite_at_least(low: float) -> Callable[[object, attrs.Attribute[float], float], None]:
    """Build a validator that accepts finite floats ``>= low``."""
    low_text = f"{low:g}"

    def validate(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if isinstance(value, bool):
            raise TypeError(f"{attribute.name} must be a real number, not a bool, got {value!r}")
        if not _is_real(value):
            raise TypeError(f"{attribute.name} must be a real number, got {value!r}")
        # An int that reaches here was too large to become a float.
        if isinstance(value, int) or not (math.isfinite(value) and value >= low):
            raise ConfigError(f"{attribute.name} must be finite and >= {low_text}, got {value!r}")

    return validate


def _is_jitter(_instance: object, _attribute: attrs.Attribute[Jitter], value: Jitter) -> None:
    if not isinstance(value, Jitter):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"jitter must be a Jitter, got {value!r}")


def _default_max(first: float) -> float:
    # A non-number or NaN ``first`` falls back to the default so that the constructor
    # reports ``first`` itself, not a confusing ``max``.
    if _is_real(first) and first > _DEFAULT_MAX:
        return first
    return _DEFAULT_MAX


@attrs.frozen
class BackoffPolicy:
    """How long to wait before each retry of a failure streak.

    Invalid values raise `ConfigError` at construction, and values of a wrong type
    `TypeError`; a ``floor`` above ``max`` is clamped to ``max``.
    """

    first: float = attrs.field(
        default=0.2, converter=_int_to_float, validator=_finite_at_least(0.0)
    )
    """Seconds before the first retry of a streak (``n = 0``); ``0`` retries at once."""
    max: float = attrs.field(
        default=_DEFAULT_MAX, converter=_int_to_float, validator=_finite_at_least(0.0)
    )
    """The largest base delay in seconds; growth saturates here. Must be ``>= first``."""
    factor: float = attrs.field(
        default=2.0, converter=_int_to_float, validator=_finite_at_least(1.0)
    )
    """What the base delay is multiplied by per retry (``>= 1``); ``1.0`` keeps it constant."""
    jitter: Jitter = attrs.field(default=Jitter.EQUAL, validator=_is_jitter)
    """How each delay is randomised around its base."""
    floor: float = attrs.field(
        default=0.0, converter=_int_to_float, validator=_finite_at_least(0.0)
    )
    """The shortest delay in seconds, applied after jitter; clamped to ``max``."""

    def __attrs_post_init__(self) -> None:
        if self.first > self.max:
            raise ConfigError(
                f"first must be <= max, got first={self.first!r} and max={self.max!r}"
            )
        if self.floor > self.max:
            object.__setattr__(self, "floor", self.max)

    @classmethod
    def constant(cls, delay: float) -> BackoffPolicy:
        """Return a policy that waits ``delay`` seconds before every retry, without jitter."""
        return cls(first=delay, max=_default_max(delay), factor=1.0, jitter=Jitter.NONE)

    @classmethod
    def exponential(
        cls,
        first: float,
        *,
        max: float | None = None,
        factor: float = 2.0,
        jitter: Jitter = Jitter.NONE,
    ) -> BackoffPolicy:
        """Return a policy that multiplies the delay by ``factor`` per retry, up to ``max``.

        ``max=None`` means ``max(first, 30.0)``.
        """
        if max is None:
            max = _default_max(first)
        return cls(first=first, max=max, factor=factor, jitter=jitter)

    def delay_for_retry(self, n: int, rng: random.Random) -> float:
        """Return the delay in seconds before retry ``n`` (0 = after the first failure).

        Pure and O(1) for any ``n``; draws from ``rng`` only when the jitter needs it.
        Raises `ConfigError` for a negative ``n``, `TypeError` for one that is no ``int``.
        """
        if type(n) is not int and (isinstance(n, bool) or not isinstance(n, int)):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"retry index must be an int, got {n!r}")
        if n < 0:
            raise ConfigError(f"retry index must be >= 0, got {n!r}")
        base = self._base(n)
        if base == 0.0:
            # Nothing to jitter: an immediate retry, unless a floor asks for a pause.
            return self.floor
        match self.jitter:
            case Jitter.NONE:
                delay = base
            case Jitter.FULL:
                delay = rng.uniform(0.0, base)
            case Jitter.EQUAL:
                delay = rng.uniform(base / 2, base)
            case Jitter.BAND:
                delay = rng.uniform(self.first, min(3 * base, self.max))
        return max(delay, self.floor, _SAFETY_FLOOR)

    def _base(self, n: int) -> float:
        # Invariant: first <= result <= max, non-decreasing in n (factor >= 1).
        if self.first == 0.0 or self.factor == 1.0:
            return self.first
        try:
            grown = self.first * self.factor**n
        except OverflowError:
            return self.max
        return min(grown, self.max)


_RESTART_KINDS = ("never", "on_failure", "always")


def _interval_to_float(value: float | None) -> float | None:
    """Normalise ``0`` to ``None`` (restart at once) and ints to floats."""
    if value is None:
        return None
    if _is_real(value) and value == 0:
        return None
    return _int_to_float(value)


def _check_kind(_instance: object, _attribute: attrs.Attribute[str], value: str) -> None:
    if value not in _RESTART_KINDS:
        raise ConfigError(f"restart kind must be one of {', '.join(_RESTART_KINDS)}, got {value!r}")


def _check_interval(
    instance: RestartPolicy, _attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is None:
        return
    if instance.kind != "always":
        raise ConfigError(
            f"interval is only valid for restart kind 'always', got {value!r}"
            f" for kind {instance.kind!r}"
        )
    if isinstance(value, bool):
        raise TypeError(f"interval must be a number of seconds or None, not a bool, got {value!r}")
    if not _is_real(value):
        raise TypeError(f"interval must be a real number or None, got {value!r}")
    if isinstance(value, int) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"interval must be finite and >= 0, got {value!r}")


@attrs.frozen(repr=False)
class RestartPolicy:
    """When a task runs again after an attempt ends; compares by value.

    Use `RestartPolicy.NEVER`, `RestartPolicy.ON_FAILURE` or `RestartPolicy.always`.
    """

    NEVER: ClassVar[RestartPolicy]
    """One attempt, whatever happens."""
    ON_FAILURE: ClassVar[RestartPolicy]
    """Retry retryable failures (with backoff); stop after a success."""

    kind: str = attrs.field(validator=_check_kind)
    """``"never"``, ``"on_failure"`` or ``"always"``."""
    interval: float | None = attrs.field(
        default=None, converter=_interval_to_float, validator=_check_interval
    )
    """Seconds from a success to the next run, for kind ``"always"``.

    ``None`` (also given as ``0``) runs again right away; it is the value of the other kinds.
    """

    @classmethod
    def always(cls, interval: float | None = None) -> RestartPolicy:
        """Return a policy that runs again ``interval`` seconds after each success.

        Failures are retried with backoff. ``None`` or ``0`` runs again right away.
        """
        return cls("always", interval)

    @property
    def restarts_on_failure(self) -> bool:
        """Whether a retryable failure leads to another attempt."""
        return self.kind != "never"

    @property
    def restarts_on_success(self) -> bool:
        """Whether a success leads to another attempt."""
        return self.kind == "always"

    def __repr__(self) -> str:
        if self.kind == "always":
            return f"RestartPolicy.always({'' if self.interval is None else repr(self.interval)})"
        return f"RestartPolicy.{self.kind.upper()}"


RestartPolicy.NEVER = RestartPolicy("never")
RestartPolicy.ON_FAILURE = RestartPolicy("on_failure")


def _check_max_restarts(_instance: object, _attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"max_restarts must be an int, got {value!r}")
    if value < 1:
        raise ConfigError(f"max_restarts must be >= 1, got {value!r}")


def _check_within(_instance: object, _attribute: attrs.Attribute[float], value: float) -> None:
    if not _is_real(value):
        raise TypeError(f"within must be a number of seconds, got {value!r}")
    # An int that reaches here was too large to become a float.
    if isinstance(value, int) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"within must be finite and > 0, got {value!r}")


@attrs.frozen
class RestartLimit:
    """At most ``max_restarts`` restarts after failures within any ``within`` seconds.

    The restart intensity of Erlang/OTP supervisors, per task: a failure whose restart
    would exceed it ends the task ``FAILED`` at once. Repeats after a success (under
    ``RestartPolicy.always``) are not restarts, and ``healthy_after`` does not reset the
    count.
    """

    max_restarts: int = attrs.field(validator=_check_max_restarts)
    """The most restarts after failures allowed within the window; ``>= 1``."""
    within: float = attrs.field(converter=_int_to_float, validator=_check_within)
    """The window's length in seconds (finite, ``> 0``), ending at the restart's start time."""

    def reason(self, error: BaseException) -> str:
        """The ``TaskOutcome.reason`` of a task this limit ended."""
        return (
            f"restart limit reached: {self.max_restarts} "
            f"{'restart' if self.max_restarts == 1 else 'restarts'} within "
            f"{float(self.within)!r} s: {error_text(error)}"
        )


class RestartWindow:
    """The restarts one task made recently, checked against its ``RestartLimit``.

    Pure: times are plain floats given by the caller, in non-decreasing order. Keeps at
    most ``max_restarts`` times, which is all a check needs.
    """

    __slots__ = ("_limit", "_times")

    def __init__(self, limit: RestartLimit) -> None:
        self._limit = limit
        self._times: deque[float] = deque(maxlen=limit.max_restarts)

    def admits(self, at: float) -> bool:
        """Whether a restart at ``at`` keeps the task within its limit."""
        threshold = at - self._limit.within
        recent = sum(1 for time in self._times if time >= threshold)
        return recent + 1 <= self._limit.max_restarts

    def record(self, at: float) -> None:
        """A restart is scheduled at ``at`` (no earlier than any recorded one)."""
        self._times.append(at)


def retry_budget_spent(first_failure: float, budget: float, at: float) -> bool:
    """Whether a retry at ``at`` falls after the budget of a streak that began at
    ``first_failure`` (one starting exactly at the budget's end is made)."""
    return at > first_failure + budget


def retry_budget_reason(budget: float, error: BaseException) -> str:
    """The ``TaskOutcome.reason`` of a task its ``retry_budget`` ended."""
    return f"retry budget of {float(budget)!r} s spent: {error_text(error)}"


def retry_on_matches(error: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    """Whether ``error`` is worth a retry under ``retry_on=types``.

    An exception group matches when every exception in it, through nested groups (as
    ``except*`` sees them), is an instance of one of ``types``; so does a group that is
    itself an instance of one of them.
    """
    if isinstance(error, types):
        return True
    if isinstance(error, BaseExceptionGroup):
        group = cast("BaseExceptionGroup[BaseException]", error)
        return group.split(types)[1] is None
    return False

"""Defining work: ``TaskSpec``, ``TaskDefaults`` and the ``INHERIT`` marker.

Validation and normalisation happen at construction, so bad input fails at the call
that gave it. Options left as ``INHERIT`` resolve against the supervisor's
``TaskDefaults`` when the registry admits the task.

Decisions the design leaves open:

* Wrong *types* (a name that is not a ``str``, ``max_retries=1.5``, a ``restart`` that
  is not a ``RestartPolicy``) raise ``TypeError``; wrong *values* raise ``ConfigError``.
* ``timeout=math.inf`` is normalised to ``None`` like ``timeout=0``.
* ``args`` may be any iterable except ``str`` / ``bytes`` (which would become one
  argument per character); durations given as ints too large for a float raise
  ``ConfigError``.
* Objects whose ``__call__`` is synchronous are accepted at construction (``inspect``
  cannot tell what they return); an attempt whose call returns a non-awaitable ends
  ``FATAL`` with a ``TypeError``.
"""

from __future__ import annotations

import enum
import functools
import inspect
import math
import types
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, TypeAlias

import attrs

from ._exceptions import ConfigError
from ._policies import BackoffPolicy, RestartPolicy


class _Inherit(enum.Enum):
    INHERIT = "INHERIT"

    def __repr__(self) -> str:
        return "INHERIT"


INHERIT: Final = _Inherit.INHERIT
"""Marks a ``TaskSpec`` option that takes the supervisor's ``TaskDefaults`` value."""

TaskFn: TypeAlias = Callable[..., Awaitable[Any]]


def check_async_callable(fn: object) -> None:
    """Raise ``TypeError`` unless ``fn`` is callable and not a plain sync function."""
    if type(fn) is types.FunctionType and fn.__code__.co_flags & inspect.CO_COROUTINE:
        return  # the common case, without inspect's general checks
    if not callable(fn):
        raise TypeError(f"task function must be callable, got {fn!r}")
    target: object = fn
    while isinstance(target, functools.partial):
        target = target.func  # pyright: ignore[reportUnknownMemberType]
    if inspect.iscoroutinefunction(target):
        return
    if inspect.isasyncgenfunction(target):
        raise TypeError(
            f"task function must be an async function, got async generator function {fn!r}"
        )
    if (
        inspect.isfunction(target)
        or inspect.ismethod(target)
        or inspect.isbuiltin(target)
        or inspect.ismethoddescriptor(target)
    ):
        raise TypeError(
            f"task function must be an async function, got synchronous {fn!r}; "
            "use trio.to_thread.run_sync inside an async function for blocking work"
        )


def check_duration(what: str, value: object) -> float:
    """Validate a duration in seconds: a finite-or-infinite number ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise ConfigError(f"{what} is too large for a float, got {value!r}") from None
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(f"{what} must be >= 0, got {value!r}")
    return seconds


def normalize_timeout(value: object) -> float | None:
    """Validate an attempt timeout; ``0`` and ``inf`` mean no timeout (``None``)."""
    if value is None:
        return None
    seconds = check_duration("timeout", value)
    return None if seconds == 0 or math.isinf(seconds) else seconds


def check_max_retries(value: object) -> int | None:
    """Validate ``max_retries``: ``None`` (unlimited) or an ``int >= 1``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_retries must be an int or None, got {value!r}")
    if value == 0:
        raise ConfigError("max_retries must be >= 1 or None, got 0; use TaskSpec.once instead")
    if value < 0:
        raise ConfigError(f"max_retries must be >= 1 or None, got {value!r}")
    return value


def _check_type(what: str, value: object, cls: type) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{what} must be a {cls.__name__}, got {value!r}")


def _restart(value: RestartPolicy | _Inherit) -> RestartPolicy | _Inherit:
    if value is not INHERIT:
        _check_type("restart", value, RestartPolicy)
    return value


def _backoff(value: BackoffPolicy | _Inherit) -> BackoffPolicy | _Inherit:
    if value is not INHERIT:
        _check_type("backoff", value, BackoffPolicy)
    return value


def _timeout(value: float | _Inherit | None) -> float | _Inherit | None:
    return value if value is INHERIT else normalize_timeout(value)


def _max_retries(value: int | _Inherit | None) -> int | _Inherit | None:
    return value if value is INHERIT else check_max_retries(value)


def _name(value: str) -> str:
    if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"task name must be a str, got {value!r}")
    if not value:
        raise ConfigError(f"task name must not be empty, got {value!r}")
    return value


def _fn(value: TaskFn) -> TaskFn:
    check_async_callable(value)
    return value


def _args(value: Iterable[Any]) -> tuple[Any, ...]:
    if type(value) is tuple:
        return value  # pyright: ignore[reportUnknownVariableType]
    # A string would silently become one argument per character.
    if not isinstance(value, str | bytes):
        try:
            return tuple(value)
        except TypeError:  # not iterable
            pass
    raise TypeError(f"args must be a tuple of arguments, got {value!r}")


@attrs.frozen
class TaskDefaults:
    """Supervisor-wide values for ``TaskSpec`` options left as ``INHERIT``."""

    restart: RestartPolicy = attrs.field(
        default=RestartPolicy.ON_FAILURE,
        validator=lambda _i, _a, v: _check_type("restart", v, RestartPolicy),
    )
    backoff: BackoffPolicy = attrs.field(
        factory=BackoffPolicy,
        validator=lambda _i, _a, v: _check_type("backoff", v, BackoffPolicy),
    )
    timeout: float | None = attrs.field(default=None, converter=normalize_timeout)
    max_retries: int | None = attrs.field(default=None, converter=check_max_retries)


@attrs.frozen
class TaskSpec:
    """What to run and how to supervise it.

    ``fn(*args)`` is called afresh for every attempt. Options left as ``INHERIT``
    take the supervisor's ``TaskDefaults`` at admission; ``timeout=None`` disables a
    timeout even if the defaults set one, and ``timeout=0`` means ``None``.
    """

    name: str = attrs.field(converter=_name)
    fn: TaskFn = attrs.field(converter=_fn)
    args: tuple[Any, ...] = attrs.field(default=(), converter=_args)
    restart: RestartPolicy | _Inherit = attrs.field(
        default=INHERIT, kw_only=True, converter=_restart
    )
    backoff: BackoffPolicy | _Inherit = attrs.field(
        default=INHERIT, kw_only=True, converter=_backoff
    )
    timeout: float | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_timeout
    )
    max_retries: int | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_max_retries
    )

    @classmethod
    def once(
        cls,
        name: str,
        fn: TaskFn,
        *args: Any,
        backoff: BackoffPolicy | _Inherit = INHERIT,
        timeout: float | _Inherit | None = INHERIT,
        max_retries: int | _Inherit | None = INHERIT,
    ) -> TaskSpec:
        """Run ``fn(*args)`` once, whatever happens (``RestartPolicy.NEVER``)."""
        return cls(
            name,
            fn,
            args,
            restart=RestartPolicy.NEVER,
            backoff=backoff,
            timeout=timeout,
            max_retries=max_retries,
        )

    @classmethod
    def restartable(
        cls,
        name: str,
        fn: TaskFn,
        *args: Any,
        backoff: BackoffPolicy | _Inherit = INHERIT,
        timeout: float | _Inherit | None = INHERIT,
        max_retries: int | _Inherit | None = INHERIT,
    ) -> TaskSpec:
        """Retry retryable failures with backoff; stop after a success."""
        return cls(
            name,
            fn,
            args,
            restart=RestartPolicy.ON_FAILURE,
            backoff=backoff,
            timeout=timeout,
            max_retries=max_retries,
        )

    @classmethod
    def periodic(
        cls,
        name: str,
        every: float | None,
        fn: TaskFn,
        *args: Any,
        backoff: BackoffPolicy | _Inherit = INHERIT,
        timeout: float | _Inherit | None = INHERIT,
        max_retries: int | _Inherit | None = INHERIT,
    ) -> TaskSpec:
        """Run again ``every`` seconds after each success; failures use backoff."""
        return cls(
            name,
            fn,
            args,
            restart=RestartPolicy.always(every),
            backoff=backoff,
            timeout=timeout,
            max_retries=max_retries,
        )


@attrs.frozen
class ResolvedSpec:
    """A ``TaskSpec`` with every option resolved against ``TaskDefaults``."""

    restart: RestartPolicy
    backoff: BackoffPolicy
    timeout: float | None
    max_retries: int | None


def resolve(spec: TaskSpec, defaults: TaskDefaults) -> ResolvedSpec:
    """Resolve the ``INHERIT`` options of ``spec`` against ``defaults``."""
    return ResolvedSpec(
        defaults.restart if spec.restart is INHERIT else spec.restart,
        defaults.backoff if spec.backoff is INHERIT else spec.backoff,
        defaults.timeout if spec.timeout is INHERIT else spec.timeout,
        defaults.max_retries if spec.max_retries is INHERIT else spec.max_retries,
    )


class Resolver:
    """Resolve specs against one ``TaskDefaults``, sharing one ``ResolvedSpec`` per policy.

    Most tasks of a supervisor share a handful of policies, so a small cache saves an
    object per task.
    """

    __slots__ = ("_cache", "_defaults")

    _MAX_ENTRIES = 256

    def __init__(self, defaults: TaskDefaults) -> None:
        self._defaults = defaults
        self._cache: dict[tuple[object, ...], ResolvedSpec] = {}

    def __call__(self, spec: TaskSpec) -> ResolvedSpec:
        key = (spec.restart, spec.backoff, spec.timeout, spec.max_retries)
        resolved = self._cache.get(key)
        if resolved is None:
            resolved = resolve(spec, self._defaults)
            if len(self._cache) < self._MAX_ENTRIES:
                self._cache[key] = resolved
        return resolved

"""Defining work: ``TaskSpec``, ``ControllerSpec``, ``AdmissionPolicy`` and ``INHERIT``.

Validation and normalisation happen at construction, so bad input fails at the call
that gave it. Options left as ``INHERIT`` resolve against the supervisor's
``TaskDefaults`` when the registry admits the task (``Resolver``).

Decisions the design leaves open:

* Wrong *types* (a name that is not a ``str``, ``max_retries=1.5``, a ``restart`` that
  is not a ``RestartPolicy``) raise ``TypeError``; wrong *values* raise ``ConfigError``.
* ``args`` may be any iterable except ``str`` / ``bytes`` (which would become one
  argument per character).
* Objects whose ``__call__`` is synchronous are accepted at construction (``inspect``
  cannot tell what they return); an attempt whose call returns a non-awaitable ends
  ``FATAL`` with a ``TypeError``.
* ``TaskSpec`` supports no weak references: the named constructors build specs whose
  options are all ``INHERIT`` without attrs' checked ``__init__`` (``_frozen``), which
  needs a layout without a weak-reference slot.
* A JOIN on an idle slot starts its own work, like any policy on an idle slot.
* ``ControllerSpec.queue_timeout`` keeps the value given (an ``int`` becomes a ``float``);
  ``math.inf`` stays ``math.inf`` and, like ``None``, sets no deadline. Any value other
  than ``None`` with JOIN or DROP_IF_RUNNING is a ``TypeError``, ``math.inf`` included.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, TypeAlias

import attrs

from ._config import (
    TaskDefaults,
    check_duration,
    check_max_retries,
    check_type,
    normalize_timeout,
)
from ._exceptions import ConfigError
from ._frozen import trusted_constructor
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


def _restart(value: RestartPolicy | _Inherit) -> RestartPolicy | _Inherit:
    if value is not INHERIT:
        check_type("restart", value, RestartPolicy)
    return value


def _backoff(value: BackoffPolicy | _Inherit) -> BackoffPolicy | _Inherit:
    if value is not INHERIT:
        check_type("backoff", value, BackoffPolicy)
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


@attrs.frozen(weakref_slot=False)
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
        return cls._named(name, fn, args, RestartPolicy.NEVER, backoff, timeout, max_retries)

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
        return cls._named(name, fn, args, RestartPolicy.ON_FAILURE, backoff, timeout, max_retries)

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
        restart = RestartPolicy.always(every)
        return cls._named(name, fn, args, restart, backoff, timeout, max_retries)

    @classmethod
    def _named(
        cls,
        name: str,
        fn: TaskFn,
        args: tuple[Any, ...],
        restart: RestartPolicy,
        backoff: BackoffPolicy | _Inherit,
        timeout: float | _Inherit | None,
        max_retries: int | _Inherit | None,
    ) -> TaskSpec:
        """The named constructors: options all ``INHERIT`` skip the converters."""
        if backoff is INHERIT and timeout is INHERIT and max_retries is INHERIT:
            # ``args`` is the constructor's own tuple, ``restart`` one of ours.
            return _trusted_spec(_name(name), _fn(fn), args, restart, INHERIT, INHERIT, INHERIT)
        return cls(
            name,
            fn,
            args,
            restart=restart,
            backoff=backoff,
            timeout=timeout,
            max_retries=max_retries,
        )


_trusted_spec: Final = trusted_constructor(TaskSpec)


class AdmissionPolicy(enum.Enum):
    """What a submission does when its slot is busy."""

    QUEUE = "queue"
    REPLACE = "replace"
    DROP_IF_RUNNING = "drop_if_running"
    JOIN = "join"


def _check_slot(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"slot must be a str or None, got {value!r}")
    if not value:
        raise ConfigError(f"slot must not be empty, got {value!r}")
    return value


def _check_queue_timeout(value: float | None) -> float | None:
    return None if value is None else check_duration("queue_timeout", value)


_NEVER_QUEUED: Final = (AdmissionPolicy.JOIN, AdmissionPolicy.DROP_IF_RUNNING)


@attrs.frozen
class ControllerSpec:
    """A submission to the controller: the task, its slot and the busy-slot policy.

    ``queue_timeout`` (QUEUE and REPLACE only): seconds from intake after which work
    still queued or held is withdrawn, ``REJECTED(QUEUE_TIMEOUT)``; ``None`` or
    ``math.inf``: no deadline.
    """

    task: TaskSpec = attrs.field(validator=lambda _i, _a, v: check_type("task", v, TaskSpec))
    policy: AdmissionPolicy = attrs.field(
        default=AdmissionPolicy.QUEUE,
        validator=lambda _i, _a, v: check_type("policy", v, AdmissionPolicy),
    )
    slot: str | None = attrs.field(default=None, converter=_check_slot)
    wait: bool = attrs.field(default=False, validator=lambda _i, _a, v: check_type("wait", v, bool))
    queue_timeout: float | None = attrs.field(
        default=None, kw_only=True, converter=_check_queue_timeout
    )

    def __attrs_post_init__(self) -> None:
        if self.wait and self.policy in _NEVER_QUEUED:
            raise ConfigError(f"policy {self.policy.name} has no wait mode, got wait=True")
        if self.queue_timeout is not None and self.policy in _NEVER_QUEUED:
            raise TypeError(
                f"policy {self.policy.name} never queues, so it takes no queue_timeout, "
                f"got queue_timeout={self.queue_timeout!r}"
            )

    @property
    def slot_name(self) -> str:
        """The slot: ``slot``, or the task name."""
        return self.task.name if self.slot is None else self.slot

    @classmethod
    def queue(
        cls,
        task: TaskSpec,
        *,
        slot: str | None = None,
        wait: bool = False,
        queue_timeout: float | None = None,
    ) -> ControllerSpec:
        """Run when the slot is free; queue FIFO behind its owner.

        ``queue_timeout``: withdraw the work if it is still queued or held that many
        seconds after intake (``REJECTED(QUEUE_TIMEOUT)``).
        """
        return cls(task, AdmissionPolicy.QUEUE, slot, wait, queue_timeout=queue_timeout)

    @classmethod
    def replace(
        cls,
        task: TaskSpec,
        *,
        slot: str | None = None,
        wait: bool = False,
        queue_timeout: float | None = None,
    ) -> ControllerSpec:
        """Stop the slot's owner and become the head of its queue.

        ``queue_timeout``: as for ``queue``; withdrawn at its deadline, the work does not
        undo the stop it requested.
        """
        return cls(task, AdmissionPolicy.REPLACE, slot, wait, queue_timeout=queue_timeout)

    @classmethod
    def drop_if_running(cls, task: TaskSpec, *, slot: str | None = None) -> ControllerSpec:
        """Run only if the slot is idle; otherwise reject ``SLOT_BUSY``."""
        return cls(task, AdmissionPolicy.DROP_IF_RUNNING, slot)

    @classmethod
    def join(cls, task: TaskSpec, *, slot: str | None = None) -> ControllerSpec:
        """On a busy slot, start nothing: resolve to the outcome of the slot's last work."""
        return cls(task, AdmissionPolicy.JOIN, slot)


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

    Most tasks of a supervisor share a handful of policy objects (``RestartPolicy.NEVER``,
    ``INHERIT``, one ``BackoffPolicy``), so a small cache keyed by the options' identities
    saves an object per task and hashes nothing but ints. Each entry keeps its option
    objects alive, so their ids cannot be reused while cached.
    """

    __slots__ = ("_cache", "_defaults")

    _MAX_ENTRIES = 256

    def __init__(self, defaults: TaskDefaults) -> None:
        self._defaults = defaults
        self._cache: dict[tuple[int, int, int, int], tuple[ResolvedSpec, tuple[object, ...]]] = {}

    def __call__(self, spec: TaskSpec) -> ResolvedSpec:
        options = (spec.restart, spec.backoff, spec.timeout, spec.max_retries)
        key = (id(options[0]), id(options[1]), id(options[2]), id(options[3]))
        cached = self._cache.get(key)
        if cached is not None:
            return cached[0]
        resolved = resolve(spec, self._defaults)
        if len(self._cache) < self._MAX_ENTRIES:
            self._cache[key] = (resolved, options)
        return resolved

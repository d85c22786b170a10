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
* A JOIN on an idle slot starts its own work, like any policy on an idle slot. A joiner
  that follows other work runs nothing: its spec's options (``critical`` included) do
  not apply, and it ends with the followed work's outcome; whether that work's failure
  shuts the supervisor down is the followed work's own ``critical``, once.
* ``ControllerSpec.queue_timeout`` keeps the value given (an ``int`` becomes a ``float``);
  ``math.inf`` stays ``math.inf`` and, like ``None``, sets no deadline. Any value other
  than ``None`` with JOIN or DROP_IF_RUNNING is a ``TypeError``, ``math.inf`` included.
* ``name=None``: the task is named ``f"{qualname}{task_id}"`` when its record is built
  (``auto_name``): at add, submit or ``prepare_submission``. An automatic name is a name:
  it is reserved while the task lives and is a name target (``remove("poll#7")``); a user
  task already holding it makes the nameless task's admission fail as any duplicate does.
  Only keyed calls (``run_in_slot``) reserve no name (``TaskRecord.reserved = False``):
  a user task named like one must never make a keyed call fail. The qualname is the
  function's ``__qualname__``; of a ``functools.partial``, the wrapped function's (through
  nested partials); of a callable object, its type's.
* The failure-streak options (``healthy_after``, ``restart_limit``, ``retry_on``,
  ``retry_budget``) are accepted by every named constructor, ``once`` included, where
  they have no effect (a task that never retries has no failure streak), as
  ``backoff`` and ``max_retries=None`` are: an options dict shared with ``restartable``
  specs works. A number of retries is refused there (``ConfigError``), by ``once`` and
  by keyed calls (``run_in_slot(..., max_retries=3)``): it says "retry", the spec
  "never", and it was dropped without a word (the work ran once), as ``max_retries=0``
  is refused by the others ("use ``once``"). The direct constructor, with ``restart=
  RestartPolicy.NEVER``, checks nothing of the kind.
* Types: ``TaskSpec[T]`` is generic in the task's return type. The named constructors
  type their arguments like ``trio``'s ``start_soon`` (``fn: Callable[[*Ts],
  Awaitable[T]], *args: *Ts``); the direct constructor takes ``args`` as a tuple and
  cannot check them. A function written for ``Supervisor.start`` takes a keyword-only
  ``task_status`` with a default, which the ``*Ts`` typing does not see.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Iterable, Mapping
from operator import attrgetter
from typing import Any, Final, Generic, TypeAlias, TypedDict, TypeVar, TypeVarTuple, Unpack

import attrs

from ._config import (
    TaskDefaults,
    check_critical,
    check_duration,
    check_max_retries,
    check_restart_limit,
    check_retry_on,
    check_type,
    normalize_healthy_after,
    normalize_retry_budget,
    normalize_timeout,
)
from ._exceptions import ConfigError
from ._frozen import trusted_constructor
from ._limits import Pool, PoolId, check_limits
from ._policies import BackoffPolicy, RestartLimit, RestartPolicy

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Ts = TypeVarTuple("Ts")


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
    if inspect.iscoroutine(fn):
        fn.close()  # never to run: no "was never awaited" warning on top of this error
        raise TypeError(
            f"task function must be an async function, got the coroutine object {fn!r}: "
            "pass the function and its arguments (TaskSpec.once(name, fn, *args)), not "
            "its call fn(*args)"
        )
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
        if getattr(target, "__name__", None) == "<lambda>":
            raise TypeError(
                f"task function must be an async function, got {fn!r}, which is synchronous "
                "even when it returns a coroutine: pass the async function and its "
                "arguments (TaskSpec.once(name, fn, *args)), or a functools.partial of it"
            )
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


def _healthy_after(value: float | _Inherit | None) -> float | _Inherit | None:
    return value if value is INHERIT else normalize_healthy_after(value)


def _restart_limit(value: RestartLimit | _Inherit | None) -> RestartLimit | _Inherit | None:
    return value if value is INHERIT else check_restart_limit(value)


def _retry_on(
    value: tuple[type[BaseException], ...] | _Inherit | None,
) -> tuple[type[BaseException], ...] | _Inherit | None:
    return value if value is INHERIT else check_retry_on(value)


def _retry_budget(value: float | _Inherit | None) -> float | _Inherit | None:
    return value if value is INHERIT else normalize_retry_budget(value)


def _critical(value: bool | _Inherit) -> bool | _Inherit:
    return value if value is INHERIT else check_critical(value)


def _limits(value: tuple[Pool, ...] | _Inherit) -> tuple[Pool, ...] | _Inherit:
    return value if value is INHERIT else check_limits(value)


def _name(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"task name must be a str or None, got {value!r}")
    if not value:
        raise ConfigError(f"task name must not be empty, got {value!r}")
    return value


def _fn(_instance: object, _attribute: attrs.Attribute[Any], value: Any) -> None:
    check_async_callable(value)


def auto_name(fn: Callable[..., object], task_id: int) -> str:
    """The automatic name of a nameless task: ``f"{qualname}{task_id}"`` (``poll#7``)."""
    if type(fn) is types.FunctionType:  # the usual case, first: a keyed call's (row 5)
        return f"{fn.__qualname__}#{int(task_id)}"  # as str(TaskId), without its call
    target: object = fn
    while isinstance(target, functools.partial):
        target = target.func  # pyright: ignore[reportUnknownMemberType]
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(qualname, str):  # a callable object: its type's
        qualname = type(target).__qualname__
    return f"{qualname}#{int(task_id)}"


def qualname(fn: object) -> str:
    """The qualname automatic names use: a ``functools.partial``'s is the wrapped
    function's (through nested partials), a callable object's its type's."""
    target: object = fn
    while isinstance(target, functools.partial):
        target = target.func  # pyright: ignore[reportUnknownMemberType]
    name = getattr(target, "__qualname__", None)
    return name if isinstance(name, str) else type(target).__qualname__


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


class TaskOptions(TypedDict, total=False):
    """The keyword options of ``TaskSpec``'s named constructors (and of ``run_in_slot``).

    Each is a ``TaskSpec`` field of the same name; one left out is ``INHERIT``. A new
    option is declared here, as a ``TaskSpec`` field, and in ``TaskDefaults`` and
    ``ResolvedSpec``: ``OPTIONS`` and the constructors follow.
    """

    backoff: BackoffPolicy | _Inherit
    timeout: float | _Inherit | None
    max_retries: int | _Inherit | None
    healthy_after: float | _Inherit | None
    restart_limit: RestartLimit | _Inherit | None
    retry_on: tuple[type[BaseException], ...] | _Inherit | None
    retry_budget: float | _Inherit | None
    critical: bool | _Inherit
    limits: tuple[Pool, ...] | _Inherit


OPTIONS: Final = ("restart", *TaskOptions.__annotations__)
"""Every option of a ``TaskSpec`` that ``TaskDefaults`` resolves, in declaration order."""
_OTHER_OPTIONS: Final = attrgetter(*TaskOptions.__annotations__)
_OPTION_NAMES: Final = frozenset(TaskOptions.__annotations__)
_N_OTHER: Final = len(TaskOptions.__annotations__)


def check_task_options(caller: str, options: Mapping[str, object]) -> None:
    """Raise ``TypeError`` naming ``caller`` for a keyword that is no task option: a
    keyword argument meant for the task's function, most often (Python's own error
    named ``TaskSpec.__init__``, and not why)."""
    for name in options:
        if name in _OPTION_NAMES:
            continue
        unexpected = f"{caller}() got an unexpected keyword argument {name!r}"
        if name == "restart":
            raise TypeError(
                f"{unexpected}: its restart policy is its own; build TaskSpec(name, fn, "
                "args, restart=...) for another"
            )
        raise TypeError(
            f"{unexpected}: it takes the task options as keywords "
            f"({', '.join(TaskOptions.__annotations__)}); a keyword argument of the "
            f"function goes in functools.partial(fn, {name}=...)"
        )


@attrs.frozen(weakref_slot=False)
class TaskSpec(Generic[T_co]):
    """What to run and how to supervise it; generic in the task's return type ``T``.

    ``fn(*args)`` is called afresh for every attempt. Options left as ``INHERIT``
    take the supervisor's ``TaskDefaults`` at admission; ``timeout=None`` disables a
    timeout even if the defaults set one, and ``timeout=0`` means ``None``.
    ``name=None`` names the task ``f"{qualname}{task_id}"`` when it is added or
    submitted (``poll#7``); that name is reserved and targeted as any other.

    Failure streaks (each ``None`` to turn it off, even if the defaults set it):

    * ``healthy_after``: an attempt that has run this long (inclusive) is healthy: the
      failure streak (retry count, backoff step, retry budget) starts afresh, even if
      the attempt fails later.
    * ``restart_limit``: a ``RestartLimit``; a failure whose restart would exceed it
      ends the task ``FAILED`` at once.
    * ``retry_on``: the exception classes worth a retry; a failure (or timeout) that
      would be retried but matches none of them ends the task ``FATAL``. An exception
      group matches when every exception in it (through nested groups) does.
    * ``retry_budget``: seconds from a streak's first failure; a retry that would start
      later ends the task ``FAILED`` instead.

    ``critical=True``: a task the service cannot do without. Its final ``FAILED``,
    ``FATAL`` or ``PANICKED`` outcome shuts the supervisor down, and leaving the
    ``open_supervisor`` block (or ``run``) raises ``CriticalTaskError``.
    """

    name: str | None = attrs.field(converter=_name)
    """The task's name; ``None`` names it ``f"{qualname}{task_id}"`` at add or submit."""
    fn: Callable[..., Awaitable[T_co]] = attrs.field(validator=_fn)
    """The async callable, called as ``fn(*args)`` afresh for every attempt."""
    args: tuple[Any, ...] = attrs.field(default=(), converter=_args)
    """The positional arguments of every call of ``fn``."""
    restart: RestartPolicy | _Inherit = attrs.field(
        default=INHERIT, kw_only=True, converter=_restart
    )
    """When the task runs again after an attempt ends."""
    backoff: BackoffPolicy | _Inherit = attrs.field(
        default=INHERIT, kw_only=True, converter=_backoff
    )
    """The delays before the retries of a failure streak."""
    timeout: float | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_timeout
    )
    """Seconds each attempt may run, ``defer_cancel()`` blocks included; ``None``: no limit.

    An attempt that runs out ends as a timeout, which is retried like a failure.
    """
    max_retries: int | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_max_retries
    )
    """Retries allowed after the first failure of a streak; ``None``: unlimited."""
    healthy_after: float | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_healthy_after
    )
    """Seconds after which a running attempt counts as healthy (a new streak); ``None``: never."""
    restart_limit: RestartLimit | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_restart_limit
    )
    """The most restarts after failures within a window; ``None``: no limit."""
    retry_on: tuple[type[BaseException], ...] | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_retry_on
    )
    """The exception classes worth a retry; ``None``: every ``Exception``."""
    retry_budget: float | _Inherit | None = attrs.field(
        default=INHERIT, kw_only=True, converter=_retry_budget
    )
    """Seconds from a streak's first failure in which retries may start; ``None``: no budget."""
    critical: bool | _Inherit = attrs.field(default=INHERIT, kw_only=True, converter=_critical)
    """Whether a final ``FAILED``, ``FATAL`` or ``PANICKED`` outcome shuts the supervisor down.

    The supervisor then cancels the body of its ``open_supervisor`` block, shuts down,
    and raises ``CriticalTaskError``; other outcomes escalate nothing.
    """
    limits: tuple[Pool, ...] | _Inherit = attrs.field(
        default=INHERIT, kw_only=True, converter=_limits
    )
    """The limit pools every attempt takes one unit of, all at once, before it starts.

    A ``ConcurrencyLimit`` (or one key's pool of it) caps how many attempts hold a unit
    at once; a ``RateLimit`` how many start per period. An attempt that holds a unit and
    awaits work waiting for the same pool can wait for ever: keep such waits out of
    limited attempts.
    """

    @classmethod
    def once(
        cls,
        name: str | None,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        **options: Unpack[TaskOptions],
    ) -> TaskSpec[T]:
        """Run ``fn(*args)`` once, whatever happens (``RestartPolicy.NEVER``).

        A number of retries (``max_retries=3``) raises ``ConfigError``: it would never
        apply. The other options of retries are accepted (an options dict shared with
        ``restartable`` specs) and unused.
        """
        if not options:
            return _trusted(name, fn, args, RestartPolicy.NEVER)
        return one_attempt("TaskSpec.once", name, fn, args, options)

    @classmethod
    def restartable(
        cls,
        name: str | None,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        **options: Unpack[TaskOptions],
    ) -> TaskSpec[T]:
        """Retry retryable failures with backoff; stop after a success."""
        if not options:
            return _trusted(name, fn, args, RestartPolicy.ON_FAILURE)
        check_task_options("TaskSpec.restartable", options)
        return TaskSpec(
            name,
            fn,
            args,
            restart=RestartPolicy.ON_FAILURE,
            **options,
        )

    @classmethod
    def periodic(
        cls,
        name: str | None,
        every: float | None,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        **options: Unpack[TaskOptions],
    ) -> TaskSpec[T]:
        """Run again ``every`` seconds after each success; failures use backoff."""
        restart = RestartPolicy.always(every)
        if not options:
            return _trusted(name, fn, args, restart)
        check_task_options("TaskSpec.periodic", options)
        return TaskSpec(
            name,
            fn,
            args,
            restart=restart,
            **options,
        )


_trusted_spec: Final[Callable[..., TaskSpec[Any]]] = trusted_constructor(TaskSpec)


def one_attempt(
    caller: str,
    name: str | None,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    options: Mapping[str, Any],
) -> TaskSpec[T]:
    """The spec of ``caller``'s work of one attempt (``RestartPolicy.NEVER``), with
    ``options``; ``ConfigError`` for a number of retries (after the options' own
    checks), which would never apply."""
    check_task_options(caller, options)
    spec = TaskSpec(name, fn, args, restart=RestartPolicy.NEVER, **options)
    if isinstance(spec.max_retries, int):
        raise ConfigError(
            f"{caller}() runs one attempt, so max_retries={spec.max_retries} would never "
            "apply: TaskSpec.restartable retries"
        )
    return spec


def _trusted(
    name: str | None, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], restart: RestartPolicy
) -> TaskSpec[T]:
    """The named constructors with every option ``INHERIT``: skip the converters.

    ``args`` is the constructor's own tuple, ``restart`` one of ours.
    """
    # The checks of _name and check_async_callable, their usual cases inlined (this is
    # every plain spec's path: benchmark rows 4a and 5 build their specs in the timed
    # loop); anything else goes through them, for their errors.
    if not (name is None or (type(name) is str and name)):
        _name(name)
    if not (type(fn) is types.FunctionType and fn.__code__.co_flags & inspect.CO_COROUTINE):
        check_async_callable(fn)
    return _trusted_spec(name, fn, args, restart)  # the options' defaults: INHERIT


class AdmissionPolicy(enum.Enum):
    """What a submission does when its slot is busy."""

    QUEUE = "queue"
    """Append to the slot's FIFO queue; ``QUEUE_FULL`` (or held, with ``wait``) when it is full."""
    REPLACE = "replace"
    """Stop the owner and become the queue head; a displaced head is rejected ``SUPERSEDED``."""
    DROP_IF_RUNNING = "drop_if_running"
    """Reject the submission ``SLOT_BUSY``; the owner and the queue are untouched."""
    JOIN = "join"
    """Start nothing: resolve to the outcome of the slot's last work (queue tail, else owner)."""


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


@attrs.frozen(weakref_slot=False)
class ControllerSpec(Generic[T_co]):
    """A submission to the controller: the task, its slot and the busy-slot policy.

    ``queue_timeout`` (QUEUE and REPLACE only): seconds from intake after which work
    still queued or held is withdrawn, ``REJECTED(QUEUE_TIMEOUT)``; ``None`` or
    ``math.inf``: no deadline. A task without a name needs an explicit ``slot``
    (``ConfigError`` otherwise).
    """

    task: TaskSpec[T_co] = attrs.field(validator=lambda _i, _a, v: check_type("task", v, TaskSpec))
    """The work to run in the slot."""
    policy: AdmissionPolicy = attrs.field(
        default=AdmissionPolicy.QUEUE,
        validator=lambda _i, _a, v: check_type("policy", v, AdmissionPolicy),
    )
    """What the submission does when its slot is busy."""
    slot: str | None = attrs.field(default=None, converter=_check_slot)
    """The slot's name; ``None``: the task's name (see ``slot_name``)."""
    wait: bool = attrs.field(default=False, validator=lambda _i, _a, v: check_type("wait", v, bool))
    """Hold the work until the budgets it needs have room, instead of rejecting it."""
    queue_timeout: float | None = attrs.field(
        default=None, kw_only=True, converter=_check_queue_timeout
    )
    """Seconds from intake until queued or held work is withdrawn; ``None``: no deadline."""

    def __attrs_post_init__(self) -> None:
        if self.wait and self.policy in _NEVER_QUEUED:
            raise ConfigError(f"policy {self.policy.name} has no wait mode, got wait=True")
        if self.queue_timeout is not None and self.policy in _NEVER_QUEUED:
            raise TypeError(
                f"policy {self.policy.name} never queues, so it takes no queue_timeout, "
                f"got queue_timeout={self.queue_timeout!r}"
            )
        if self.slot is None and self.task.name is None:
            raise ConfigError(
                f"a task without a name needs an explicit slot, got slot=None for {self.task.fn!r}"
            )

    @property
    def slot_name(self) -> str:
        """The slot: ``slot``, or the task name."""
        slot = self.task.name if self.slot is None else self.slot
        assert slot is not None  # checked at construction
        return slot

    @classmethod
    def queue(
        cls,
        task: TaskSpec[T],
        *,
        slot: str | None = None,
        wait: bool = False,
        queue_timeout: float | None = None,
    ) -> ControllerSpec[T]:
        """Run when the slot is free; queue FIFO behind its owner.

        ``queue_timeout``: withdraw the work if it is still queued or held that many
        seconds after intake (``REJECTED(QUEUE_TIMEOUT)``).
        """
        if queue_timeout is None and _plain(task, slot, wait):
            return _trusted_request(task, AdmissionPolicy.QUEUE, slot, wait, None)
        return ControllerSpec(task, AdmissionPolicy.QUEUE, slot, wait, queue_timeout=queue_timeout)

    @classmethod
    def replace(
        cls,
        task: TaskSpec[T],
        *,
        slot: str | None = None,
        wait: bool = False,
        queue_timeout: float | None = None,
    ) -> ControllerSpec[T]:
        """Stop the slot's owner and become the head of its queue.

        ``queue_timeout``: as for ``queue``; withdrawn at its deadline, the work does not
        undo the stop it requested.
        """
        if queue_timeout is None and _plain(task, slot, wait):
            return _trusted_request(task, AdmissionPolicy.REPLACE, slot, wait, None)
        return ControllerSpec(
            task, AdmissionPolicy.REPLACE, slot, wait, queue_timeout=queue_timeout
        )

    @classmethod
    def drop_if_running(cls, task: TaskSpec[T], *, slot: str | None = None) -> ControllerSpec[T]:
        """Run only if the slot is idle; otherwise reject ``SLOT_BUSY``."""
        return ControllerSpec(task, AdmissionPolicy.DROP_IF_RUNNING, slot)

    @classmethod
    def join(cls, task: TaskSpec[T], *, slot: str | None = None) -> ControllerSpec[T]:
        """On a busy slot, start nothing: resolve to the outcome of the slot's last work."""
        return ControllerSpec(task, AdmissionPolicy.JOIN, slot)


# QUEUE and REPLACE without a queue_timeout (the common case) skip the validators when
# the arguments are plainly valid; anything else takes the validating constructor.
_trusted_request: Final[Callable[..., ControllerSpec[Any]]] = trusted_constructor(ControllerSpec)


def _plain(task: object, slot: object, wait: object) -> bool:
    """Whether ``task``, ``slot`` and ``wait`` need no validation (a ``TaskSpec``; a
    non-empty ``str`` slot, or none with a named task; a ``bool``): the named
    constructors' fast path (benchmark rows 4a and 5)."""
    return (
        type(task) is TaskSpec
        and type(wait) is bool
        and ((type(slot) is str and slot != "") or (slot is None and task.name is not None))
    )


def not_a(expected: type[TaskSpec[Any] | ControllerSpec[Any]], got: object) -> TypeError:
    """The error for ``got`` where an ``expected`` belongs; the two specs mixed up are told
    which call takes them."""
    detail = repr(got)
    task: object = getattr(got, "task", got)
    name = getattr(task, "name", None)
    if isinstance(got, ControllerSpec):
        detail = f"a ControllerSpec (of the task {name!r}): submit() takes it (or add() its .task)"
    elif isinstance(got, TaskSpec):
        detail = (
            f"a TaskSpec (the task {name!r}): add() takes it; to submit() it, wrap it, as in "
            "ControllerSpec.queue(spec, slot=...)"
        )
    return TypeError(f"expected a {expected.__name__}, got {detail}")


@attrs.frozen
class ResolvedSpec:
    """A ``TaskSpec`` with every option resolved against ``TaskDefaults``.

    ``needs_clock``: an attempt's start time is needed even without events (a deadline,
    a repeat gap, the healthy mark). ``streak_rules``: a failure-streak rule applies to its
    failures, so the actor takes its fuller failure path; without one, it pays nothing
    for them.
    """

    restart: RestartPolicy
    backoff: BackoffPolicy
    timeout: float | None
    max_retries: int | None
    healthy_after: float | None = None
    restart_limit: RestartLimit | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    retry_budget: float | None = None
    critical: bool = False
    limits: tuple[PoolId, ...] = ()
    """The limit pools every attempt takes a unit of, as the supervisor's table knows them."""
    needs_clock: bool = attrs.field(init=False)
    streak_rules: bool = attrs.field(init=False)
    repeats: bool = attrs.field(init=False)
    """``restart.restarts_on_success``, read once per successful attempt."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "repeats", self.restart.restarts_on_success)
        object.__setattr__(
            self,
            "needs_clock",
            self.timeout is not None or self.repeats or self.healthy_after is not None,
        )
        object.__setattr__(
            self,
            "streak_rules",
            self.healthy_after is not None
            or self.restart_limit is not None
            or self.retry_on is not None
            or self.retry_budget is not None,
        )


PoolIds: TypeAlias = Callable[[tuple[Pool, ...]], tuple[PoolId, ...]]
"""Learn pools' settings (``ConfigError`` if a known name has others); their identities."""


def resolve(spec: TaskSpec[Any], defaults: TaskDefaults, pool_ids: PoolIds) -> ResolvedSpec:
    """Resolve the ``INHERIT`` options of ``spec`` against ``defaults``."""
    values: dict[str, Any] = {}
    for name in OPTIONS:
        value = getattr(spec, name)
        values[name] = getattr(defaults, name) if value is INHERIT else value
    values["limits"] = pool_ids(values["limits"]) if values["limits"] else ()
    return ResolvedSpec(**values)


class Resolver:
    """Resolve specs against one ``TaskDefaults``, sharing one ``ResolvedSpec`` per policy.

    Most tasks of a supervisor share a handful of policy objects (``RestartPolicy.NEVER``,
    ``INHERIT``, one ``BackoffPolicy``), so a small cache keyed by the options' identities
    saves an object per task and hashes nothing but ints. Each cached item keeps its option
    objects alive, so their ids cannot be reused while cached. ``pool_ids`` learns the
    settings of a spec's limits when its ``ResolvedSpec`` is made (a cached one's pools
    are known already).
    """

    __slots__ = ("_cache", "_defaults", "_plain", "_pool_ids")

    _MAX_CACHED = 256

    def __init__(self, defaults: TaskDefaults, pool_ids: PoolIds) -> None:
        self._defaults = defaults
        self._pool_ids = pool_ids
        # Specs that set nothing but their restart policy (the named constructors without
        # options, keyed calls), keyed by the policy's id; each item keeps it alive.
        self._plain: dict[int, tuple[ResolvedSpec, object]] = {}
        # Keyed by the ids of every option.
        self._cache: dict[tuple[int, ...], tuple[ResolvedSpec, tuple[object, ...]]] = {}

    def __call__(self, spec: TaskSpec[Any]) -> ResolvedSpec:
        others = _OTHER_OPTIONS(spec)
        if others.count(INHERIT) == _N_OTHER:
            restart = spec.restart
            plain = self._plain.get(id(restart))
            if plain is not None:
                return plain[0]
            resolved = resolve(spec, self._defaults, self._pool_ids)
            if len(self._plain) < self._MAX_CACHED:
                self._plain[id(restart)] = (resolved, restart)
            return resolved
        options = (spec.restart, *others)
        key = tuple(map(id, options))
        cached = self._cache.get(key)
        if cached is not None:
            return cached[0]
        resolved = resolve(spec, self._defaults, self._pool_ids)
        if len(self._cache) < self._MAX_CACHED:
            self._cache[key] = (resolved, options)
        return resolved

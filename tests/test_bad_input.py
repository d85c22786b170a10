"""Bad input: every public constructor and method fails clearly at the call.

Wrong *types* raise ``TypeError``, wrong *values* ``ConfigError``; the message starts
with a lower-case letter and shows the offending value (its ``repr``). After a bad
call on a running supervisor, the supervisor keeps working: a normal task added next
completes.

Decisions the documentation leaves open
-----------------------------------
* Policy values (``BackoffPolicy``, ``RestartPolicy``) raise ``TypeError`` for wrong
  types like everything else (``jitter="full"``, ``first="1"``, ``always("5")``); they
  raised ``ConfigError`` before.
* ``bool`` is not a number anywhere (policies included): ``True`` or ``False`` where a
  duration, count, capacity or exit code is expected is a ``TypeError``.
* ``TaskSpec.args`` must be an iterable other than ``str`` / ``bytes`` (a string would
  silently become one argument per character).
* An ``async def`` generator function is not a task function (``TypeError``), and the
  message says so.
* A class (or any object whose ``__call__`` is synchronous) is accepted at
  construction, as documented; its attempt ends ``FATAL`` with a ``TypeError``.
* ``lambda: coro()`` is a plain synchronous function and is rejected (``TypeError``);
  use ``functools.partial`` or an ``async def``.
* Durations given as ints too large for a float (``10**400``) raise ``ConfigError``.
* Names and slots have no length limit: a 1 MB name or slot works like any other.
* ``run_in_slot`` needs a non-empty ``str`` slot; ``None`` is a ``TypeError`` (it does
  not fall back to a per-call slot).
* ``EventRecorder.of`` / ``wait_for`` take an ``EventKind`` or its string value; an
  unknown kind raises at the call instead of waiting forever.
* Subscriber attributes (``queue_capacity``, ``name``, ``on_event``) are checked by
  ``open_supervisor``, which is where a subscriber is given; the library's own
  subscribers check their ``queue_capacity`` when they are built, too.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import AsyncGenerator, Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ConcurrencyLimit,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    FatalError,
    NoControllerError,
    OutcomeKind,
    PreparedSubmission,
    RestartLimit,
    RestartPolicy,
    Supervisor,
    SupervisorConfig,
    TaskDefaults,
    TaskFailure,
    TaskNameInUseError,
    TaskSpec,
    TaskWaiter,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

from helpers import Service, async_fn, failing, invoke, supervisor, sync_fn

HUGE = 10**400  # an int too large for a float


async def agen_fn() -> AsyncGenerator[int]:
    yield 1


class NotAwaitable:
    """A class: callable, but calling it returns a non-awaitable."""


def check_message(exc: BaseException, shown: str, *, lower: bool = True) -> None:
    message = str(exc)
    if lower:
        assert message[:1].islower(), message
    assert shown in message, message


async def assert_still_works(sup: Supervisor) -> None:
    """A normal task added now completes, and nothing from the bad call is left."""
    assert sup.list() == ()
    t0 = trio.current_time()

    async def job() -> str:
        await trio.sleep(1.0)
        return "fine"

    waiter = await sup.add(TaskSpec.once("still-works", job))
    assert (await waiter.wait()).value == "fine"
    assert trio.current_time() == t0 + 1.0
    if sup.config.controller is not None:
        assert await sup.run_in_slot("slot", job) == "fine"
        assert sup.controller_snapshot().slots == ()


SPEC = TaskSpec.once("job", async_fn)


# -- constructors ------------------------------------------------------------------------------

CONSTRUCTOR_CASES: list[Any] = [
    # TaskSpec: name
    pytest.param(lambda: TaskSpec.once(123, async_fn), TypeError, "123", id="name-int"),
    pytest.param(lambda: TaskSpec.once(b"job", async_fn), TypeError, "b'job'", id="name-bytes"),
    pytest.param(lambda: TaskSpec.once("", async_fn), ConfigError, "''", id="name-empty"),
    # TaskSpec: fn
    pytest.param(lambda: TaskSpec.once("job", 42), TypeError, "42", id="fn-int"),
    pytest.param(lambda: TaskSpec.once("job", "fn"), TypeError, "'fn'", id="fn-str"),
    pytest.param(lambda: TaskSpec.once("job", None), TypeError, "None", id="fn-none"),
    pytest.param(lambda: TaskSpec.once("job", sync_fn), TypeError, "sync_fn", id="fn-sync"),
    pytest.param(
        lambda: TaskSpec.once("job", lambda: async_fn()), TypeError, "<lambda>", id="fn-lambda"
    ),
    pytest.param(
        lambda: TaskSpec.once("job", Service().sync_method),
        TypeError,
        "sync_method",
        id="fn-sync-method",
    ),
    pytest.param(lambda: TaskSpec.once("job", len), TypeError, "len", id="fn-builtin"),
    pytest.param(
        lambda: TaskSpec.once("job", functools.partial(sync_fn)),
        TypeError,
        "partial",
        id="fn-partial-of-sync",
    ),
    pytest.param(
        lambda: TaskSpec.once("job", agen_fn), TypeError, "async generator", id="fn-async-gen"
    ),
    # TaskSpec: args
    pytest.param(lambda: TaskSpec("job", async_fn, 5), TypeError, "5", id="args-int"),
    pytest.param(lambda: TaskSpec("job", async_fn, "abc"), TypeError, "'abc'", id="args-str"),
    pytest.param(lambda: TaskSpec("job", async_fn, None), TypeError, "None", id="args-none"),
    # TaskSpec: options
    pytest.param(
        lambda: TaskSpec("job", async_fn, restart="always"),
        TypeError,
        "'always'",
        id="restart-str",
    ),
    pytest.param(
        lambda: TaskSpec("job", async_fn, restart=None), TypeError, "None", id="restart-none"
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, backoff=1.0), TypeError, "1.0", id="backoff-float"
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, timeout=-1), ConfigError, "-1", id="timeout-neg"
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, timeout=math.nan),
        ConfigError,
        "nan",
        id="timeout-nan",
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, timeout="5"), TypeError, "'5'", id="timeout-str"
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, timeout=True), TypeError, "True", id="timeout-bool"
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, timeout=HUGE),
        ConfigError,
        "timeout",
        id="timeout-huge-int",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, max_retries=0),
        ConfigError,
        "0",
        id="max-retries-zero",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, max_retries=-2),
        ConfigError,
        "-2",
        id="max-retries-neg",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, max_retries=1.5),
        TypeError,
        "1.5",
        id="max-retries-float",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, max_retries=True),
        TypeError,
        "True",
        id="max-retries-bool",
    ),
    pytest.param(
        lambda: TaskSpec.periodic("job", -1.0, async_fn), ConfigError, "-1", id="every-neg"
    ),
    pytest.param(
        lambda: TaskSpec.periodic("job", math.nan, async_fn), ConfigError, "nan", id="every-nan"
    ),
    pytest.param(
        lambda: TaskSpec.periodic("job", math.inf, async_fn), ConfigError, "inf", id="every-inf"
    ),
    # TaskSpec: the failure-streak options (section 12), through every constructor
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, healthy_after=0),
        ConfigError,
        "0",
        id="healthy-after-zero",
    ),
    pytest.param(
        lambda: TaskSpec.periodic("job", 1.0, async_fn, healthy_after=-1.0),
        ConfigError,
        "-1.0",
        id="healthy-after-neg",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, healthy_after=math.nan),
        ConfigError,
        "nan",
        id="healthy-after-nan",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, healthy_after="5"),
        TypeError,
        "'5'",
        id="healthy-after-str",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, retry_budget=0.0),
        ConfigError,
        "0.0",
        id="retry-budget-zero",
    ),
    pytest.param(
        lambda: TaskSpec.once("job", async_fn, retry_budget=True),
        TypeError,
        "True",
        id="retry-budget-bool",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, retry_on=ValueError),
        TypeError,
        "ValueError",
        id="retry-on-bare-class",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, retry_on=[ValueError]),
        TypeError,
        "[<class 'ValueError'>]",
        id="retry-on-list",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, retry_on=()),
        ConfigError,
        "()",
        id="retry-on-empty",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, retry_on=(ValueError, "KeyError")),
        TypeError,
        "'KeyError'",
        id="retry-on-not-a-class",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, retry_on=(int,)),
        TypeError,
        "<class 'int'>",
        id="retry-on-not-an-exception",
    ),
    pytest.param(
        lambda: TaskSpec.restartable("job", async_fn, restart_limit=(3, 60)),
        TypeError,
        "(3, 60)",
        id="restart-limit-tuple",
    ),
    pytest.param(
        lambda: TaskSpec("job", async_fn, restart_limit=3), TypeError, "3", id="restart-limit-int"
    ),
    # ControllerSpec: a nameless task needs a slot
    pytest.param(
        lambda: ControllerSpec.queue(TaskSpec.once(None, async_fn)),
        ConfigError,
        "explicit slot",
        id="nameless-without-slot",
    ),
    # BackoffPolicy
    pytest.param(lambda: BackoffPolicy(first=-1), ConfigError, "-1", id="backoff-first-neg"),
    pytest.param(lambda: BackoffPolicy(first=math.nan), ConfigError, "nan", id="backoff-first-nan"),
    pytest.param(lambda: BackoffPolicy(max=math.inf), ConfigError, "inf", id="backoff-max-inf"),
    pytest.param(lambda: BackoffPolicy(factor=0.5), ConfigError, "0.5", id="backoff-factor"),
    pytest.param(
        lambda: BackoffPolicy(first=5, max=2), ConfigError, "first=5.0", id="backoff-first-gt-max"
    ),
    pytest.param(lambda: BackoffPolicy(jitter="full"), TypeError, "'full'", id="jitter-str"),
    pytest.param(lambda: BackoffPolicy(first="1"), TypeError, "'1'", id="backoff-first-str"),
    pytest.param(lambda: BackoffPolicy(first=HUGE), ConfigError, "first", id="backoff-huge"),
    pytest.param(lambda: BackoffPolicy.constant(-1), ConfigError, "-1", id="constant-neg"),
    pytest.param(
        lambda: BackoffPolicy.exponential(1.0, factor=math.nan),
        ConfigError,
        "nan",
        id="exponential-factor-nan",
    ),
    pytest.param(
        lambda: BackoffPolicy().delay_for_retry(-1, random.Random(0)),
        ConfigError,
        "-1",
        id="delay-for-retry-neg",
    ),
    # RestartPolicy
    pytest.param(lambda: RestartPolicy.always(-1), ConfigError, "-1", id="always-neg"),
    pytest.param(lambda: RestartPolicy.always(math.nan), ConfigError, "nan", id="always-nan"),
    pytest.param(lambda: RestartPolicy.always("5"), TypeError, "'5'", id="always-str"),
    # TaskDefaults
    pytest.param(lambda: TaskDefaults(restart="x"), TypeError, "'x'", id="defaults-restart"),
    pytest.param(lambda: TaskDefaults(backoff=None), TypeError, "None", id="defaults-backoff"),
    pytest.param(lambda: TaskDefaults(timeout=-1), ConfigError, "-1", id="defaults-timeout"),
    pytest.param(lambda: TaskDefaults(max_retries=0), ConfigError, "0", id="defaults-retries"),
    pytest.param(
        lambda: TaskDefaults(healthy_after=0), ConfigError, "0", id="defaults-healthy-after"
    ),
    pytest.param(
        lambda: TaskDefaults(retry_budget=-1), ConfigError, "-1", id="defaults-retry-budget"
    ),
    pytest.param(
        lambda: TaskDefaults(retry_on=[KeyError]), TypeError, "KeyError", id="defaults-retry-on"
    ),
    pytest.param(
        lambda: TaskDefaults(restart_limit="x"), TypeError, "'x'", id="defaults-restart-limit"
    ),
    pytest.param(lambda: SupervisorConfig(log_failures=1), TypeError, "1", id="log-failures-int"),
    # SupervisorConfig
    pytest.param(lambda: SupervisorConfig(grace=-1), ConfigError, "-1", id="grace-neg"),
    pytest.param(lambda: SupervisorConfig(grace=math.nan), ConfigError, "nan", id="grace-nan"),
    pytest.param(lambda: SupervisorConfig(grace="5"), TypeError, "'5'", id="grace-str"),
    pytest.param(lambda: SupervisorConfig(grace=None), TypeError, "None", id="grace-none"),
    pytest.param(lambda: SupervisorConfig(grace=HUGE), ConfigError, "grace", id="grace-huge"),
    pytest.param(
        lambda: SupervisorConfig(subscriber_shutdown_timeout=-0.5),
        ConfigError,
        "-0.5",
        id="drain-neg",
    ),
    pytest.param(
        lambda: SupervisorConfig(subscriber_shutdown_timeout=math.nan),
        ConfigError,
        "nan",
        id="drain-nan",
    ),
    pytest.param(
        lambda: SupervisorConfig(max_concurrent=0), ConfigError, "0", id="max-concurrent-zero"
    ),
    pytest.param(
        lambda: SupervisorConfig(max_concurrent=1.5), TypeError, "1.5", id="max-concurrent-float"
    ),
    pytest.param(
        lambda: SupervisorConfig(max_registered_tasks=-1),
        ConfigError,
        "-1",
        id="max-registered-neg",
    ),
    pytest.param(
        lambda: SupervisorConfig(max_registered_tasks="10"),
        TypeError,
        "'10'",
        id="max-registered-str",
    ),
    pytest.param(
        lambda: SupervisorConfig(command_capacity=0), ConfigError, "0", id="command-capacity-zero"
    ),
    pytest.param(
        lambda: SupervisorConfig(command_capacity=None),
        TypeError,
        "None",
        id="command-capacity-none",
    ),
    pytest.param(
        lambda: SupervisorConfig(bus_capacity=-3), ConfigError, "-3", id="bus-capacity-neg"
    ),
    pytest.param(
        lambda: SupervisorConfig(bus_capacity=2.0), TypeError, "2.0", id="bus-capacity-float"
    ),
    pytest.param(
        lambda: SupervisorConfig(task_defaults={}), TypeError, "{}", id="task-defaults-dict"
    ),
    pytest.param(lambda: SupervisorConfig(controller={}), TypeError, "{}", id="controller-dict"),
    pytest.param(lambda: SupervisorConfig(random=42), TypeError, "42", id="random-int"),
    # ControllerConfig
    pytest.param(
        lambda: ControllerConfig(queue_capacity=0), ConfigError, "0", id="queue-capacity-zero"
    ),
    pytest.param(
        lambda: ControllerConfig(queue_capacity="1"), TypeError, "'1'", id="queue-capacity-str"
    ),
    pytest.param(
        lambda: ControllerConfig(max_slot_queue=-1), ConfigError, "-1", id="max-slot-queue-neg"
    ),
    pytest.param(
        lambda: ControllerConfig(max_slot_queue=None),
        TypeError,
        "None",
        id="max-slot-queue-none",
    ),
    pytest.param(
        lambda: ControllerConfig(max_total_pending=-1),
        ConfigError,
        "-1",
        id="max-total-pending-neg",
    ),
    pytest.param(lambda: ControllerConfig(max_slots=0), ConfigError, "0", id="max-slots-zero"),
    pytest.param(lambda: ControllerConfig(max_waiters=1.0), TypeError, "1.0", id="waiters-float"),
    # ControllerSpec
    pytest.param(lambda: ControllerSpec("job"), TypeError, "'job'", id="cspec-task-str"),
    pytest.param(lambda: ControllerSpec(None), TypeError, "None", id="cspec-task-none"),
    pytest.param(
        lambda: ControllerSpec(SPEC, "queue"), TypeError, "'queue'", id="cspec-policy-str"
    ),
    pytest.param(lambda: ControllerSpec.queue(SPEC, slot=5), TypeError, "5", id="cspec-slot-int"),
    pytest.param(
        lambda: ControllerSpec.queue(SPEC, slot=""), ConfigError, "''", id="cspec-slot-empty"
    ),
    pytest.param(
        lambda: ControllerSpec.queue(SPEC, slot=["a"]),
        TypeError,
        "['a']",
        id="cspec-slot-unhashable",
    ),
    pytest.param(
        lambda: ControllerSpec.join(SPEC, slot={"a": 1}),
        TypeError,
        "{'a': 1}",
        id="cspec-slot-dict",
    ),
    pytest.param(lambda: ControllerSpec(SPEC, wait="yes"), TypeError, "'yes'", id="cspec-wait-str"),
    pytest.param(
        lambda: ControllerSpec(SPEC, AdmissionPolicy.JOIN, wait=True),
        ConfigError,
        "JOIN",
        id="cspec-join-wait",
    ),
    pytest.param(
        lambda: ControllerSpec(SPEC, AdmissionPolicy.DROP_IF_RUNNING, wait=True),
        ConfigError,
        "DROP_IF_RUNNING",
        id="cspec-drop-wait",
    ),
    # ControllerSpec.queue_timeout
    pytest.param(
        lambda: ControllerSpec.queue(SPEC, queue_timeout=-1), ConfigError, "-1", id="qt-negative"
    ),
    pytest.param(
        lambda: ControllerSpec.replace(SPEC, queue_timeout=math.nan),
        ConfigError,
        "nan",
        id="qt-nan",
    ),
    pytest.param(
        lambda: ControllerSpec.queue(SPEC, queue_timeout="5"), TypeError, "'5'", id="qt-str"
    ),
    pytest.param(
        lambda: ControllerSpec.queue(SPEC, queue_timeout=True), TypeError, "True", id="qt-bool"
    ),
    pytest.param(
        lambda: ControllerSpec(SPEC, AdmissionPolicy.JOIN, queue_timeout=5.0),
        TypeError,
        "JOIN",
        id="qt-join",
    ),
    pytest.param(
        lambda: ControllerSpec(SPEC, AdmissionPolicy.DROP_IF_RUNNING, queue_timeout=0),
        TypeError,
        "DROP_IF_RUNNING",
        id="qt-drop",
    ),
    pytest.param(
        lambda: ControllerSpec(SPEC, AdmissionPolicy.JOIN, queue_timeout=math.inf),
        TypeError,
        "inf",
        id="qt-join-inf",
    ),
    # EventRecorder queries
    pytest.param(
        lambda: EventRecorder().of("task_addded"), ConfigError, "'task_addded'", id="of-typo"
    ),
    pytest.param(lambda: EventRecorder().of(5), TypeError, "5", id="of-int"),
    pytest.param(
        lambda: EventRecorder(queue_capacity=0), ConfigError, "0", id="recorder-capacity-zero"
    ),
]


@pytest.mark.parametrize(("make", "exc_type", "shown"), CONSTRUCTOR_CASES)
def test_constructor_rejects_bad_input_clearly(
    make: Callable[[], object], exc_type: type[Exception], shown: str
) -> None:
    with pytest.raises(exc_type) as info:
        make()
    check_message(info.value, shown)


def test_join_and_drop_constructors_take_no_queue_timeout() -> None:
    """ControllerSpec.join and .drop_if_running have no queue_timeout parameter."""
    with pytest.raises(TypeError, match="queue_timeout"):
        ControllerSpec.join(SPEC, queue_timeout=5.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="queue_timeout"):
        ControllerSpec.drop_if_running(SPEC, queue_timeout=5.0)  # type: ignore[call-arg]


@pytest.mark.parametrize("policy", [AdmissionPolicy.JOIN, AdmissionPolicy.DROP_IF_RUNNING])
async def test_run_in_slot_rejects_a_queue_timeout_for_a_policy_that_never_queues(
    autojump_clock: Any, policy: AdmissionPolicy
) -> None:
    """run_in_slot(policy=JOIN or DROP_IF_RUNNING, queue_timeout=...) is a TypeError."""
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(TypeError) as info:
            await sup.run_in_slot("s", async_fn, policy=policy, queue_timeout=1.0)
        check_message(info.value, policy.name)
        await assert_still_works(sup)


def test_unknown_option_is_a_type_error() -> None:
    """Python's own message (not lower-case first) names the unknown keyword."""
    with pytest.raises(TypeError) as info:
        TaskSpec.once("job", async_fn, retries=3)  # type: ignore[call-arg]
    check_message(info.value, "retries", lower=False)


def test_wrong_types_are_also_value_errors_only_where_documented() -> None:
    """ConfigError is a ValueError: ``except ValueError`` catches every bad value."""
    assert issubclass(ConfigError, ValueError)
    assert not issubclass(ConfigError, TypeError)


def test_event_recorder_accepts_the_string_value_of_a_kind() -> None:
    recorder = EventRecorder()
    assert recorder.of("task_added") == []
    assert recorder.kinds() == []
    assert recorder.kinds("task_added") == []


def test_regression_event_recorder_kinds_checks_the_kinds_it_filters_by() -> None:
    """``kinds("task_addded")`` used to return ``[]``, whatever was recorded."""
    with pytest.raises(ConfigError, match="task_addded"):
        EventRecorder().kinds("task_addded")  # type: ignore[arg-type]


async def test_regression_event_recorder_wait_for_unknown_kind_raises_at_once(
    autojump_clock: Any,
) -> None:
    """A misspelled kind used to wait forever (``is`` never matched a str)."""
    recorder = EventRecorder()
    with pytest.raises(ConfigError, match="task_finnished"):
        await recorder.wait_for("task_finnished")  # type: ignore[arg-type]
    async with open_supervisor(subscribers=[recorder]) as sup:
        await sup.add(TaskSpec.once("job", async_fn))
        event = await recorder.wait_for("task_finished", name="job")  # type: ignore[arg-type]
    assert event.kind is EventKind.TASK_FINISHED


async def test_regression_event_recorder_unknown_field_raises_at_once(
    autojump_clock: Any,
) -> None:
    """A misspelled field (``nmae=``) used to wait for ever: it matched no event, and
    the recorder's own delivery failed on it. Now ``TypeError`` at the call, naming the
    fields there are, for ``of`` too."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        await sup.add(TaskSpec.once("job", async_fn))
        with pytest.raises(TypeError, match=r"TaskEvent has no field 'nmae'; its fields: .*name"):
            await recorder.wait_for(EventKind.TASK_FINISHED, nmae="job")
        with pytest.raises(TypeError, match="'nmae'"):
            recorder.of(EventKind.TASK_FINISHED, nmae="job")
        await recorder.wait_for(EventKind.TASK_FINISHED, name="job")
    assert recorder.of(EventKind.SUBSCRIBER_FAILED) == []


async def test_event_recorder_takes_an_enum_fields_string_value(autojump_clock: Any) -> None:
    """``outcome="failed"`` matches as ``kind="task_finished"`` does; it used to match
    nothing, and ``wait_for`` waited for ever. A value no member has fails at the call."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        waiter = await sup.add(TaskSpec.once("job", failing))
        event = await recorder.wait_for(EventKind.TASK_FINISHED, name="job")
        assert event.outcome is OutcomeKind.FAILED
        assert recorder.of("task_finished", outcome="failed") == [event]
        assert await recorder.wait_for("task_finished", outcome="failed") is event
        with pytest.raises(ConfigError, match="unknown outcome 'faild'"):
            recorder.of(EventKind.TASK_FINISHED, outcome="faild")
        with pytest.raises(ConfigError, match="unknown rejection 'full'"):
            await recorder.wait_for(EventKind.TASK_FINISHED, rejection="full")
        await waiter.wait()


def test_regression_args_string_is_not_split_into_characters() -> None:
    with pytest.raises(TypeError, match="'abc'"):
        TaskSpec("job", async_fn, "abc")
    assert TaskSpec("job", async_fn, ["a", "b"]).args == ("a", "b")


def test_regression_huge_int_durations_raise_config_error() -> None:
    for make in (
        lambda: TaskSpec.once("job", async_fn, timeout=HUGE),
        lambda: TaskDefaults(timeout=HUGE),
        lambda: SupervisorConfig(grace=HUGE),
        lambda: SupervisorConfig(subscriber_shutdown_timeout=HUGE),
    ):
        with pytest.raises(ConfigError, match="too large"):
            make()


async def test_class_as_task_function_is_accepted_and_ends_fatal(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.restartable("job", NotAwaitable))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FATAL
        assert isinstance(outcome.error, TypeError)
        assert "not an awaitable" in str(outcome.error)
        await assert_still_works(sup)


# -- bool is not a number ------------------------------------------------------------------------
#
# ``True == 1`` and ``False == 0``: a ``bool`` passed where a duration, count or capacity is
# expected is a mistake (a flag in the wrong place), never a number: ``TypeError`` everywhere.


def _store(**kwargs: Any) -> object:
    from trio_taskvisor.redis import RedisSlotStore

    return RedisSlotStore("redis://localhost", **kwargs)


def _tracing(**kwargs: Any) -> object:
    pytest.importorskip("opentelemetry")
    from trio_taskvisor.contrib.otel import TracingSubscriber

    return TracingSubscriber(**kwargs)


def _prometheus(**kwargs: Any) -> object:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from trio_taskvisor.contrib.prometheus import PrometheusSubscriber

    return PrometheusSubscriber(CollectorRegistry(), **kwargs)


NUMBER_PARAMETERS: dict[str, Callable[[Any], object]] = {
    "TaskSpec.timeout": lambda b: TaskSpec.once("job", async_fn, timeout=b),
    "TaskSpec.max_retries": lambda b: TaskSpec.restartable("job", async_fn, max_retries=b),
    "TaskSpec.healthy_after": lambda b: TaskSpec.restartable("job", async_fn, healthy_after=b),
    "TaskSpec.retry_budget": lambda b: TaskSpec.restartable("job", async_fn, retry_budget=b),
    "TaskSpec.periodic.every": lambda b: TaskSpec.periodic("job", b, async_fn),
    "TaskSpec(timeout)": lambda b: TaskSpec("job", async_fn, timeout=b),
    "ControllerSpec.queue_timeout": lambda b: ControllerSpec(SPEC, queue_timeout=b),
    "ControllerSpec.queue.queue_timeout": lambda b: ControllerSpec.queue(SPEC, queue_timeout=b),
    "ControllerSpec.replace.queue_timeout": lambda b: ControllerSpec.replace(SPEC, queue_timeout=b),
    "RestartLimit.max_restarts": lambda b: RestartLimit(b, 1.0),
    "RestartLimit.within": lambda b: RestartLimit(1, b),
    "RestartPolicy.always": lambda b: RestartPolicy.always(b),
    "BackoffPolicy.first": lambda b: BackoffPolicy(first=b),
    "BackoffPolicy.max": lambda b: BackoffPolicy(max=b),
    "BackoffPolicy.factor": lambda b: BackoffPolicy(factor=b),
    "BackoffPolicy.floor": lambda b: BackoffPolicy(floor=b),
    "BackoffPolicy.constant": lambda b: BackoffPolicy.constant(b),
    "BackoffPolicy.exponential.first": lambda b: BackoffPolicy.exponential(b),
    "BackoffPolicy.exponential.max": lambda b: BackoffPolicy.exponential(1.0, max=b),
    "BackoffPolicy.exponential.factor": lambda b: BackoffPolicy.exponential(1.0, factor=b),
    "BackoffPolicy.delay_for_retry": lambda b: BackoffPolicy().delay_for_retry(b, random.Random()),
    "TaskDefaults.timeout": lambda b: TaskDefaults(timeout=b),
    "TaskDefaults.max_retries": lambda b: TaskDefaults(max_retries=b),
    "TaskDefaults.healthy_after": lambda b: TaskDefaults(healthy_after=b),
    "TaskDefaults.retry_budget": lambda b: TaskDefaults(retry_budget=b),
    "SupervisorConfig.grace": lambda b: SupervisorConfig(grace=b),
    "SupervisorConfig.subscriber_shutdown_timeout": lambda b: SupervisorConfig(
        subscriber_shutdown_timeout=b
    ),
    "SupervisorConfig.max_concurrent": lambda b: SupervisorConfig(max_concurrent=b),
    "SupervisorConfig.max_registered_tasks": lambda b: SupervisorConfig(max_registered_tasks=b),
    "SupervisorConfig.command_capacity": lambda b: SupervisorConfig(command_capacity=b),
    "SupervisorConfig.bus_capacity": lambda b: SupervisorConfig(bus_capacity=b),
    "ControllerConfig.queue_capacity": lambda b: ControllerConfig(queue_capacity=b),
    "ControllerConfig.max_slot_queue": lambda b: ControllerConfig(max_slot_queue=b),
    "ControllerConfig.max_total_pending": lambda b: ControllerConfig(max_total_pending=b),
    "ControllerConfig.max_slots": lambda b: ControllerConfig(max_slots=b),
    "ControllerConfig.max_waiters": lambda b: ControllerConfig(max_waiters=b),
    "RedisSlotStore.lease_ttl": lambda b: _store(lease_ttl=b),
    "RedisSlotStore.connect_timeout": lambda b: _store(connect_timeout=b),
    "RedisSlotStore.replicas_ack": lambda b: _store(replicas_ack=b),
    "RedisSlotStore.replicas_ack_timeout": lambda b: _store(replicas_ack_timeout=b),
    "EventRecorder.queue_capacity": lambda b: EventRecorder(queue_capacity=b),
    "TracingSubscriber.queue_capacity": lambda b: _tracing(queue_capacity=b),
    "PrometheusSubscriber.queue_capacity": lambda b: _prometheus(queue_capacity=b),
    "FatalError.exit_code": lambda b: FatalError("stop", exit_code=b),
    "TaskFailure.exit_code": lambda b: TaskFailure("again", exit_code=b),
}


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("make", list(NUMBER_PARAMETERS.values()), ids=list(NUMBER_PARAMETERS))
def test_a_bool_is_never_a_number(make: Callable[[Any], object], flag: bool) -> None:
    """Every duration, count and capacity of the API refuses ``True`` and ``False``."""
    with pytest.raises(TypeError) as info:
        make(flag)
    check_message(info.value, repr(flag))


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        pytest.param(lambda sup: sup.events(True), "True", id="events"),
        pytest.param(
            lambda sup: sup.run_in_slot("s", async_fn, timeout=True), "True", id="ris-timeout"
        ),
        pytest.param(
            lambda sup: sup.run_in_slot("s", async_fn, queue_timeout=False),
            "False",
            id="ris-queue-timeout",
        ),
        pytest.param(
            lambda sup: sup.run_in_slot("s", async_fn, max_retries=True),
            "True",
            id="ris-max-retries",
        ),
    ],
)
async def test_a_bool_is_never_a_number_in_supervisor_calls(
    autojump_clock: Any, call: Callable[[Supervisor], Any], shown: str
) -> None:
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(TypeError) as info:
            await invoke(call, sup)
        check_message(info.value, shown)
        await assert_still_works(sup)


_BACKOFF_PARAMETERS: dict[str, Callable[[Any], object]] = {
    "BackoffPolicy.first": lambda v: BackoffPolicy(first=v),
    "BackoffPolicy.max": lambda v: BackoffPolicy(max=v),
    "BackoffPolicy.factor": lambda v: BackoffPolicy(factor=v),
    "BackoffPolicy.floor": lambda v: BackoffPolicy(floor=v),
    "BackoffPolicy.jitter": lambda v: BackoffPolicy(jitter=v),
    "constant.delay": BackoffPolicy.constant,
    "exponential.first": BackoffPolicy.exponential,
    "exponential.max": lambda v: BackoffPolicy.exponential(1.0, max=v),
    "exponential.factor": lambda v: BackoffPolicy.exponential(1.0, factor=v),
    "exponential.jitter": lambda v: BackoffPolicy.exponential(1.0, jitter=v),
    "RestartPolicy.always": RestartPolicy.always,
}
_FIELD = {"constant.delay": "first", "RestartPolicy.always": "interval"}


@pytest.mark.parametrize(
    "value",
    ["1", b"1", [1.0], 1j, Decimal("1.5"), Fraction(3, 2), True, object()],
    ids=["str", "bytes", "list", "complex", "Decimal", "Fraction", "bool", "object"],
)
@pytest.mark.parametrize("given", list(_BACKOFF_PARAMETERS))
def test_a_policy_of_a_wrong_type_is_a_type_error_naming_the_field(
    given: str, value: object
) -> None:
    """Every field of ``BackoffPolicy`` and its constructors, and ``always``'s interval,
    refuse a value of a wrong type with a ``TypeError`` that names the field (they
    raised ``ConfigError``, the only wrong types in the API that did)."""
    field = _FIELD.get(given, given.rpartition(".")[2])
    with pytest.raises(TypeError, match=rf"^{field} must be a ") as info:
        _BACKOFF_PARAMETERS[given](value)
    check_message(info.value, repr(value))


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, -1, -1e-300, HUGE],
    ids=["nan", "inf", "-inf", "-1", "-1e-300", "huge"],
)
@pytest.mark.parametrize("given", [k for k in _BACKOFF_PARAMETERS if not k.endswith("jitter")])
def test_a_policy_of_a_wrong_value_is_a_config_error_naming_the_field(
    given: str, value: object
) -> None:
    """NaN, infinities, negatives and ints too large for a float: ``ConfigError``."""
    field = _FIELD.get(given, given.rpartition(".")[2])
    minimum = 1 if field == "factor" else 0
    with pytest.raises(ConfigError, match=rf"^{field} must be finite and >= {minimum}, got "):
        _BACKOFF_PARAMETERS[given](value)


def test_a_nan_duration_is_refused_as_not_finite() -> None:
    """A NaN duration's message says why: it is not a finite number (nor math.inf)."""
    with pytest.raises(
        ConfigError, match=r"^timeout must be >= 0 and finite \(or math.inf\), got nan$"
    ):
        TaskSpec.once("job", async_fn, timeout=math.nan)


# -- open_supervisor and subscribers ---------------------------------------------------------


class NoOnEvent:
    name = "no-on-event"


class SyncOnEvent:
    def on_event(self, event: object) -> None:
        pass


class ZeroCapacity:
    queue_capacity = 0

    async def on_event(self, event: object) -> None:
        pass


class BoolCapacity:
    queue_capacity = True

    async def on_event(self, event: object) -> None:
        pass


class IntName:
    name = 5

    async def on_event(self, event: object) -> None:
        pass


@pytest.mark.parametrize(
    ("kwargs", "exc_type", "shown"),
    [
        pytest.param({"config": "config"}, TypeError, "'config'", id="config-str"),
        pytest.param({"config": ControllerConfig()}, TypeError, "ControllerConfig", id="config"),
        pytest.param({"subscribers": [NoOnEvent()]}, TypeError, "NoOnEvent", id="no-on-event"),
        pytest.param({"subscribers": [SyncOnEvent()]}, TypeError, "SyncOnEvent", id="sync"),
        pytest.param({"subscribers": [ZeroCapacity()]}, ConfigError, "0", id="capacity-zero"),
        pytest.param({"subscribers": [BoolCapacity()]}, TypeError, "True", id="capacity-bool"),
        pytest.param({"subscribers": [IntName()]}, TypeError, "5", id="name-int"),
        pytest.param({"subscribers": 5}, TypeError, "5", id="subscribers-int"),
        pytest.param({"subscribers": EventRecorder()}, TypeError, "EventRecorder", id="not-list"),
    ],
)
async def test_open_supervisor_rejects_bad_input_clearly(
    autojump_clock: Any, kwargs: dict[str, Any], exc_type: type[Exception], shown: str
) -> None:
    with pytest.raises(exc_type) as info:
        async with open_supervisor(**kwargs):
            pytest.fail("the block must not run")
    check_message(info.value, shown)
    # Nothing was left running: a correct supervisor opens and works.
    async with supervisor() as sup:
        await assert_still_works(sup)


# -- supervisor methods -------------------------------------------------------------------------

BAD_CALLS: list[Any] = [
    # add / add_nowait
    pytest.param(lambda sup: sup.add(None), TypeError, "None", id="add-none"),
    pytest.param(lambda sup: sup.add("job"), TypeError, "'job'", id="add-str"),
    pytest.param(
        lambda sup: sup.add(ControllerSpec.queue(SPEC)),
        TypeError,
        "got a ControllerSpec (of the task 'job'): submit() takes it (or add() its .task)",
        id="add-controller-spec",
    ),
    pytest.param(lambda sup: sup.add_nowait(42), TypeError, "42", id="add-nowait-int"),
    # add_batch
    pytest.param(lambda sup: sup.add_batch(None), TypeError, "None", id="batch-none"),
    pytest.param(lambda sup: sup.add_batch(5), TypeError, "5", id="batch-int"),
    pytest.param(lambda sup: sup.add_batch(SPEC), TypeError, "TaskSpec", id="batch-one-spec"),
    pytest.param(
        lambda sup: sup.add_batch([TaskSpec.once("good", async_fn), "bad"]),
        TypeError,
        "'bad'",
        id="batch-mixed",
    ),
    # remove / cancel
    pytest.param(lambda sup: sup.remove(None), TypeError, "None", id="remove-none"),
    pytest.param(lambda sup: sup.remove(1.5), TypeError, "1.5", id="remove-float"),
    pytest.param(lambda sup: sup.remove(True), TypeError, "True", id="remove-bool"),
    pytest.param(lambda sup: sup.remove(b"job"), TypeError, "b'job'", id="remove-bytes"),
    pytest.param(lambda sup: sup.cancel(["job"]), TypeError, "['job']", id="cancel-list"),
    pytest.param(lambda sup: sup.cancel(SPEC), TypeError, "TaskSpec", id="cancel-spec"),
    # submit / submit_nowait / prepare_submission
    pytest.param(
        lambda sup: sup.submit(SPEC),
        TypeError,
        "got a TaskSpec (the task 'job'): add() takes it; to submit() it, wrap it, as in "
        "ControllerSpec.queue(spec, slot=...)",
        id="submit-task-spec",
    ),
    pytest.param(lambda sup: sup.submit(None), TypeError, "None", id="submit-none"),
    pytest.param(lambda sup: sup.submit_nowait("job"), TypeError, "'job'", id="submit-nowait"),
    pytest.param(lambda sup: sup.prepare_submission(5), TypeError, "5", id="prepare-int"),
    # events
    pytest.param(lambda sup: sup.events(0), ConfigError, "0", id="events-zero"),
    pytest.param(lambda sup: sup.events(-1), ConfigError, "-1", id="events-neg"),
    pytest.param(lambda sup: sup.events("5"), TypeError, "'5'", id="events-str"),
    pytest.param(lambda sup: sup.events(1.5), TypeError, "1.5", id="events-float"),
    pytest.param(lambda sup: sup.events(None), TypeError, "None", id="events-none"),
    # run_in_slot
    pytest.param(lambda sup: sup.run_in_slot(None, async_fn), TypeError, "None", id="ris-none"),
    pytest.param(lambda sup: sup.run_in_slot(5, async_fn), TypeError, "5", id="ris-int"),
    pytest.param(lambda sup: sup.run_in_slot("", async_fn), ConfigError, "''", id="ris-empty"),
    pytest.param(
        lambda sup: sup.run_in_slot(["s"], async_fn), TypeError, "['s']", id="ris-unhashable"
    ),
    pytest.param(lambda sup: sup.run_in_slot("s", sync_fn), TypeError, "sync_fn", id="ris-sync-fn"),
    pytest.param(lambda sup: sup.run_in_slot("s", 42), TypeError, "42", id="ris-not-callable"),
    pytest.param(
        lambda sup: sup.run_in_slot("s", async_fn, policy="queue"),
        TypeError,
        "'queue'",
        id="ris-policy-str",
    ),
    pytest.param(
        lambda sup: sup.run_in_slot("s", async_fn, timeout=-1),
        ConfigError,
        "-1",
        id="ris-timeout-neg",
    ),
    pytest.param(
        lambda sup: sup.run_in_slot("s", async_fn, timeout=math.nan),
        ConfigError,
        "nan",
        id="ris-timeout-nan",
    ),
]


@pytest.mark.parametrize(("call", "exc_type", "shown"), BAD_CALLS)
async def test_supervisor_method_rejects_bad_input_and_keeps_working(
    autojump_clock: Any,
    call: Callable[[Supervisor], Any],
    exc_type: type[Exception],
    shown: str,
) -> None:
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(exc_type) as info:
            await invoke(call, sup)
        check_message(info.value, shown)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.statistics().events_published == 0
        await assert_still_works(sup)


async def test_rejected_mixed_batch_registers_none_of_its_items(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        with pytest.raises(TypeError):
            await sup.add_batch([TaskSpec.once("good", async_fn), "bad"])  # type: ignore[list-item]
        # The good item's name is free: nothing of the batch was registered.
        waiter = await sup.add(TaskSpec.once("good", async_fn, 1))
        assert (await waiter.wait()).value == (1,)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda sup: sup.submit(ControllerSpec.queue(SPEC)), id="submit"),
        pytest.param(lambda sup: sup.submit_nowait(ControllerSpec.queue(SPEC)), id="nowait"),
        pytest.param(lambda sup: sup.prepare_submission(ControllerSpec.queue(SPEC)), id="prep"),
        pytest.param(lambda sup: sup.run_in_slot("s", async_fn), id="run-in-slot"),
        pytest.param(lambda sup: sup.controller_snapshot(), id="snapshot"),
        pytest.param(lambda sup: sup.cancel_slot("s"), id="cancel-slot"),
        pytest.param(lambda sup: sup.wait_slot_idle("s"), id="wait-slot-idle"),
    ],
)
async def test_controller_calls_without_a_controller_raise_no_controller_error(
    autojump_clock: Any, call: Callable[[Supervisor], Any]
) -> None:
    async with supervisor() as sup:
        with pytest.raises(NoControllerError) as info:
            await invoke(call, sup)
        check_message(info.value, "controller")
        await assert_still_works(sup)


def _in_a_run_of_its_own(call: Callable[[Supervisor], Any]) -> Callable[[Supervisor], Any]:
    """``invoke`` ``call`` in a trio run of the calling thread."""
    return lambda sup: trio.run(invoke, call, sup)


QUEUED = ControllerSpec.queue(SPEC, slot="s")
LIMITED_ADVICE = "enter it in an async function of that run (trio.from_thread.run(fn))"
SYNC_CALLS = {
    "sup.add_nowait",
    "sup.submit_nowait",
    "prepared.submit_nowait",
    "sup.prepare_submission",
}


def _prepared_elsewhere(
    use: Callable[[PreparedSubmission[Any]], Any], *, own_run: bool
) -> Callable[[Supervisor], Any]:
    """Prepare a submission in the supervisor's thread (through ``trio.from_thread``),
    then ``use`` it in the calling thread (in a trio run of its own when ``own_run``)."""

    def call(sup: Supervisor) -> Any:
        prepared = trio.from_thread.run_sync(sup.prepare_submission, QUEUED)
        if own_run:
            return _in_a_run_of_its_own(lambda _: use(prepared))(sup)
        return use(prepared)

    return call


@pytest.mark.parametrize(
    ("call", "through"),
    [
        pytest.param(lambda sup: sup.add_nowait(SPEC), "sup.add_nowait, spec", id="add-nowait"),
        pytest.param(
            lambda sup: sup.submit_nowait(QUEUED),
            "sup.submit_nowait, request",
            id="submit-nowait",
        ),
        pytest.param(
            lambda sup: sup.prepare_submission(QUEUED),
            "sup.prepare_submission, request",
            id="prepare-submission",
        ),
        pytest.param(
            _prepared_elsewhere(lambda prepared: prepared.submit_nowait(), own_run=False),
            "prepared.submit_nowait",
            id="prepared-submit-nowait",
        ),
        pytest.param(_in_a_run_of_its_own(lambda sup: sup.add(SPEC)), "sup.add, spec", id="add"),
        pytest.param(
            _in_a_run_of_its_own(lambda sup: sup.add_batch([SPEC])),
            "sup.add_batch, specs",
            id="add-batch",
        ),
        pytest.param(
            _in_a_run_of_its_own(lambda sup: sup.submit(QUEUED)), "sup.submit, request", id="submit"
        ),
        pytest.param(
            _prepared_elsewhere(lambda prepared: prepared.submit(), own_run=True),
            "prepared.submit",
            id="prepared-submit",
        ),
        pytest.param(
            _in_a_run_of_its_own(lambda sup: sup.run_in_slot("s", async_fn)),
            "sup.run_in_slot, slot, fn, *args",
            id="run-in-slot",
        ),
        pytest.param(
            _in_a_run_of_its_own(lambda sup: sup.start(SPEC)), "sup.start, spec", id="start"
        ),
        pytest.param(
            _in_a_run_of_its_own(lambda sup: sup.start_in_slot(QUEUED)),
            "sup.start_in_slot, request",
            id="start-in-slot",
        ),
        pytest.param(
            _in_a_run_of_its_own(lambda sup: sup.limited(ConcurrencyLimit("c", 1))),
            "sup.limited",
            id="limited",
        ),
    ],
)
async def test_intake_from_another_thread_raises_and_changes_nothing(
    autojump_clock: Any, call: Callable[[Supervisor], Any], through: str
) -> None:
    """Work handed to a supervisor from a worker thread raises ``RuntimeError`` naming
    the call and the way through ``trio.from_thread``, before it changes anything.
    Before, the registry's or the controller's loop was taken off its channel and never
    woken: the supervisor took no more work and its shutdown never ended. (Until the
    messages named the call, every one advised ``sup.add_nowait`` or ``sup.add``, a
    ``limited`` block's included.)"""
    with trio.CancelScope() as bound:
        async with supervisor(controller=ControllerConfig()) as sup:
            with pytest.raises(RuntimeError) as info:
                await trio.to_thread.run_sync(call, sup)
            name = through.partition(",")[0]
            run = "run_sync" if name in SYNC_CALLS else "run"
            advice = (
                LIMITED_ADVICE
                if name == "sup.limited"
                else f"go through trio.from_thread.{run}({through})"
            )
            assert str(info.value) == (
                f"{name}() works only in the thread of the supervisor's trio run; "
                f"from another thread, {advice}"
            )
            # (a deadline while a thread runs would be the autojump clock's next stop)
            bound.deadline = trio.current_time() + 60
            await assert_still_works(sup)
    assert not bound.cancelled_caught


@pytest.mark.parametrize(
    ("call", "through"),
    [
        pytest.param(lambda sup, w: w.wait(), "waiter.wait", id="waiter-wait"),
        pytest.param(lambda sup, w: sup.wait_idle(), "sup.wait_idle", id="wait-idle"),
        pytest.param(lambda sup, w: sup.wait_closing(), "sup.wait_closing", id="wait-closing"),
        pytest.param(lambda sup, w: sup.shutdown(), "sup.shutdown", id="shutdown"),
        pytest.param(lambda sup, w: sup.remove("held"), "sup.remove, target", id="remove"),
        pytest.param(lambda sup, w: sup.cancel("held"), "sup.cancel, target", id="cancel"),
        pytest.param(
            lambda sup, w: sup.cancel_slot("s"), "sup.cancel_slot, slot", id="cancel-slot"
        ),
        pytest.param(
            lambda sup, w: sup.wait_slot_idle("s"), "sup.wait_slot_idle, slot", id="wait-slot-idle"
        ),
        pytest.param(
            lambda sup, w: sup.cluster_slot("s"), "sup.cluster_slot, slot", id="cluster-slot"
        ),
        pytest.param(
            lambda sup, w: sup.cluster_limit(ConcurrencyLimit("c", 1)),
            "sup.cluster_limit, pool",
            id="cluster-limit",
        ),
        pytest.param(lambda sup, w: sup.events(), "sup.events", id="events"),
    ],
)
async def test_regression_waits_from_another_trio_run_raise_at_once(
    autojump_clock: Any, call: Callable[[Supervisor, TaskWaiter[Any]], Any], through: str
) -> None:
    """A supervisor's waits awaited in a trio run of another thread raise
    ``RuntimeError`` at once, naming the way through ``trio.from_thread``, and change
    nothing. Before, ``waiter.wait()`` waited there until the task ended, and then the
    supervisor's run crashed with trio's bare ``AssertionError`` (it woke a task of the
    other run); ``wait_idle()`` and ``wait_closing()`` waited for ever; ``remove`` and
    ``cancel`` failed with trio's ``AssertionError`` and the supervisor never closed;
    ``shutdown()`` failed with ``TrioInternalError`` and ended the task ``PANICKED``."""
    gate = trio.Event()

    async def held() -> None:
        await gate.wait()

    with trio.CancelScope() as bound:
        async with supervisor(controller=ControllerConfig()) as sup:
            waiter = await sup.add(TaskSpec.once("held", held))

            async def elsewhere() -> None:
                with trio.fail_after(10):  # a liveness bound, on that run's real clock
                    await invoke(lambda sup: call(sup, waiter), sup)

            def in_a_run_of_its_own() -> None:
                trio.run(elsewhere)

            with pytest.raises(RuntimeError) as info:
                await trio.to_thread.run_sync(in_a_run_of_its_own)
            name = through.partition(",")[0]
            advice = (
                "read the stream in a task of that run (or give it a subscriber)"
                if name == "sup.events"
                else f"from another thread, go through trio.from_thread.run({through})"
            )
            assert str(info.value) == (
                f"{name}() works only in the thread of the supervisor's trio run; {advice}"
            )
            bound.deadline = trio.current_time() + 60
            assert not sup.closing
            assert [info.name for info in sup.list()] == ["held"]
            gate.set()
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
            await assert_still_works(sup)
    assert not bound.cancelled_caught


@pytest.mark.parametrize(
    ("call", "through"),
    [
        pytest.param(lambda sup: sup.list(), "sup.list", id="list"),
        pytest.param(lambda sup: sup.alive_snapshot(), "sup.alive_snapshot", id="alive-snapshot"),
        pytest.param(lambda sup: sup.is_alive("held"), "sup.is_alive, name", id="is-alive"),
        pytest.param(lambda sup: sup.statistics(), "sup.statistics", id="statistics"),
        pytest.param(
            lambda sup: sup.controller_snapshot(), "sup.controller_snapshot", id="controller"
        ),
        pytest.param(lambda sup: sup.limit_snapshot(), "sup.limit_snapshot", id="limits"),
    ],
)
async def test_regression_reads_from_another_thread_raise(
    autojump_clock: Any, call: Callable[[Supervisor], Any], through: str
) -> None:
    """The supervisor's reads called in another thread raise ``RuntimeError`` naming
    ``trio.from_thread.run_sync``, as its other calls do. Before, they read the state
    while the supervisor's thread changed it: ``statistics()`` now and then raised
    "dictionary changed size during iteration" (once in about a million reads while
    tasks came and went), and ``controller_snapshot()`` always raised trio's "must be
    called from async context"."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.add(TaskSpec.once("held", trio.sleep_forever))
        with trio.CancelScope() as bound:
            with pytest.raises(RuntimeError) as info:
                await trio.to_thread.run_sync(call, sup)
            bound.deadline = trio.current_time() + 60
        assert not bound.cancelled_caught
        name = through.partition(",")[0]
        assert str(info.value) == (
            f"{name}() works only in the thread of the supervisor's trio run; from another "
            f"thread, go through trio.from_thread.run_sync({through})"
        )
        read = await trio.to_thread.run_sync(lambda: trio.from_thread.run_sync(sup.statistics))
        assert read.registered == 1
        await sup.cancel("held")


async def test_intake_from_another_thread_through_trio_from_thread_works(
    autojump_clock: Any,
) -> None:
    """What the error above advises: ``trio.from_thread`` runs the call in the
    supervisor's thread."""
    async with supervisor(controller=ControllerConfig()) as sup:

        def from_a_worker_thread() -> list[TaskWaiter[int]]:
            spec = TaskSpec.once("through", async_fn)
            return [
                trio.from_thread.run_sync(sup.add_nowait, spec),
                trio.from_thread.run(sup.submit, ControllerSpec.queue(spec, slot="s")),
            ]

        waiters = await trio.to_thread.run_sync(from_a_worker_thread)
        assert [(await w.wait()).kind for w in waiters] == [OutcomeKind.COMPLETED] * 2


async def test_unknown_targets_are_not_errors(autojump_clock: Any) -> None:
    """Ids and names that match nothing are valid input: ``False``."""
    async with supervisor(controller=ControllerConfig()) as sup:
        for target in (0, -1, 10**30, "", "nobody", "x" * 100_000):
            assert await sup.remove(target) is False
            assert await sup.cancel(target) is False
        await assert_still_works(sup)


# -- huge and odd names --------------------------------------------------------------------------


async def test_one_megabyte_name_works(autojump_clock: Any) -> None:
    name = "n" * 1_000_000
    recorder = EventRecorder()
    async with open_supervisor(SupervisorConfig(), subscribers=[recorder]) as sup:
        release = trio.Event()

        async def job() -> int:
            await release.wait()
            return 1

        waiter = await sup.add(TaskSpec.once(name, job))
        assert waiter.name == name
        assert sup.is_alive(name) or [i.name for i in sup.list()] == [name]
        with pytest.raises(TaskNameInUseError) as info:
            await sup.add(TaskSpec.once(name, async_fn))
        assert info.value.name == name
        release.set()
        assert (await waiter.wait()).value == 1
        await sup.wait_idle()
    [finished] = recorder.of(EventKind.TASK_FINISHED)
    assert finished.name == name


async def test_one_megabyte_slot_works(autojump_clock: Any) -> None:
    slot = "s" * 1_000_000

    async def job() -> str:
        await trio.sleep(1.0)
        return "done"

    async with supervisor(controller=ControllerConfig()) as sup:
        assert await sup.run_in_slot(slot, job) == "done"
        waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("job", job), slot=slot))
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot(slot)
        assert view is not None
        assert view.owner_id == waiter.id
        assert (await waiter.wait()).value == "done"
        await assert_still_works(sup)


@pytest.mark.parametrize(
    "name", [" ", "\n", "naïve ☃", "a/b", "#7", "x" * 10_000], ids=lambda n: repr(n)[:12]
)
async def test_odd_names_work(autojump_clock: Any, name: str) -> None:
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once(name, async_fn, name))
        [info] = sup.list()
        assert info.name == name
        assert (await waiter.wait()).value == (name,)
        assert await sup.remove(name) is False


# -- regressions ----------------------------------------------------------------------------------


def test_regression_async_generator_function_is_named_as_such() -> None:
    """It used to be called "synchronous", which it is not."""
    with pytest.raises(TypeError) as info:
        TaskSpec.once("job", agen_fn)
    check_message(info.value, "async generator function")
    assert "synchronous" not in str(info.value)


def test_regression_a_coroutine_object_is_told_to_pass_the_function() -> None:
    """``TaskSpec.once(name, fn(x))`` (the call, not the function) is told to pass the
    function and its arguments, and the coroutine is closed: no "was never awaited"
    warning follows the error. It used to read "must be callable" and leave the
    coroutine to warn when collected."""
    coroutine = async_fn(1)
    with pytest.raises(TypeError) as info:
        TaskSpec.once("job", coroutine)
    check_message(info.value, "coroutine object")
    assert "TaskSpec.once(name, fn, *args)" in str(info.value)
    assert coroutine.cr_frame is None  # closed


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda: async_fn(1), id="lambda"),
        pytest.param(functools.partial(lambda x: async_fn(x), 1), id="partial-of-a-lambda"),
    ],
)
def test_regression_a_lambda_is_told_how_to_pass_its_call(fn: Callable[[], Any]) -> None:
    """``lambda: coro()`` (trio's own ``start_soon`` takes it) is told to pass the async
    function and its arguments; it used to be told to run blocking work in a thread."""
    with pytest.raises(TypeError) as info:
        TaskSpec.once("job", fn)
    check_message(info.value, "<lambda>")
    assert "even when it returns a coroutine" in str(info.value)
    assert "TaskSpec.once(name, fn, *args)" in str(info.value)
    assert "to_thread" not in str(info.value)


def test_regression_empty_name_and_slot_messages_show_the_value() -> None:
    with pytest.raises(ConfigError, match="got ''"):
        TaskSpec.once("", async_fn)
    with pytest.raises(ConfigError, match="got ''"):
        ControllerSpec.queue(SPEC, slot="")


async def test_regression_add_batch_of_a_non_collection_names_it(autojump_clock: Any) -> None:
    """A single spec, a str or an int used to fail with Python's unhelpful iteration error."""
    async with supervisor() as sup:
        for bad in (SPEC, "job", 5):
            with pytest.raises(TypeError, match="specs must be an iterable of TaskSpec") as info:
                await sup.add_batch(bad)  # type: ignore[arg-type]
            check_message(info.value, repr(bad))
        await assert_still_works(sup)


async def test_regression_subscribers_not_a_collection_names_it(autojump_clock: Any) -> None:
    recorder = EventRecorder()
    with pytest.raises(TypeError, match="subscribers must be an iterable") as info:
        async with open_supervisor(subscribers=recorder):  # type: ignore[arg-type]
            pytest.fail("the block must not run")
    check_message(info.value, "EventRecorder")


@pytest.mark.parametrize("flag", ["yes", 1, None])
async def test_regression_handle_signals_not_a_bool_names_it(
    autojump_clock: Any, flag: object
) -> None:
    """A truthy non-bool (``"yes"``, ``1``) used to handle signals, ``None`` not to."""
    with pytest.raises(TypeError, match="handle_signals must be a bool") as info:
        async with open_supervisor(handle_signals=flag):  # type: ignore[arg-type]
            pytest.fail("the block must not run")
    check_message(info.value, repr(flag))


async def test_regression_is_alive_of_a_non_str_names_it(autojump_clock: Any) -> None:
    """``sup.is_alive(1)`` (a ``TaskId``, say) used to answer ``False``."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", trio.sleep, 1.0))
        with pytest.raises(TypeError, match="name must be a task name") as info:
            sup.is_alive(waiter.id)  # type: ignore[arg-type]
        check_message(info.value, repr(waiter.id))
        await trio.sleep(0.5)
        assert sup.is_alive("job")
        await waiter.wait()
        await assert_still_works(sup)


async def test_regression_run_in_slot_rejects_a_none_slot(autojump_clock: Any) -> None:
    """``None`` used to run the call in a per-call slot named after it."""
    body_runs: list[int] = []

    async def body() -> None:
        body_runs.append(1)

    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(TypeError, match="slot must be a str, got None"):
            await sup.run_in_slot(None, body)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert body_runs == []
        assert sup.controller_snapshot().slots == ()
        await assert_still_works(sup)


@pytest.mark.parametrize(("given", "shown"), [("abc", "a number"), ("-1", "a positive number")])
def test_regression_demo_duration_message_names_the_rule_not_a_function(
    capsys: pytest.CaptureFixture[str], given: str, shown: str
) -> None:
    """``--duration abc`` says what a duration must be (not "invalid _seconds value")."""
    from trio_taskvisor.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["demo", "--duration", given])
    assert info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument --duration: must be {shown} of seconds, got {given!r}" in error
    assert "_seconds" not in error


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m trio_taskvisor --version`` prints the version and exits 0 (before, it
    was an "unrecognized arguments" error, status 2)."""
    import trio_taskvisor
    from trio_taskvisor.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"trio_taskvisor {trio_taskvisor.__version__}\n"


async def test_regression_a_context_manager_entered_twice_says_to_call_again(
    autojump_clock: Any,
) -> None:
    """``open_supervisor()``, ``sup.events()`` and ``sup.limited()`` each make one
    ``async with`` block, as trio's ``CancelScope`` does. A second ``async with`` of the
    same object (``block = sup.limited(pool)`` kept for a loop) is a ``RuntimeError``
    that says to call again; before, it was contextlib's ``AttributeError`` about
    ``args``. The first block was not disturbed, and the supervisor keeps working."""
    pool = ConcurrencyLimit("reused", 1)
    manager = open_supervisor()
    async with manager as sup:
        block = sup.limited(pool)
        async with block:
            pass
        with pytest.raises(RuntimeError, match=r"^sup\.limited\(\.\.\.\) makes one 'async with'"):
            async with block:
                pass
        stream = sup.events()
        async with stream:
            with pytest.raises(RuntimeError, match=r"^sup\.events\(\) makes one 'async with'"):
                async with stream:
                    pass
        assert sup.limit_snapshot() == ()
        async with sup.limited(pool):
            assert [view.held for view in sup.limit_snapshot()] == [1]
    with pytest.raises(
        RuntimeError,
        match=r"^open_supervisor\(\.\.\.\) makes one 'async with' block, and this one was "
        r"entered already: call it again for another$",
    ):
        async with manager:
            pass


async def test_regression_a_plain_with_says_async_with(autojump_clock: Any) -> None:
    """``with sup.limited(pool):`` (the ``async`` forgotten) is a ``TypeError`` that says
    to use ``async with``; before, Python's own message named contextlib's private
    ``_AsyncGeneratorContextManager``."""
    async with open_supervisor() as sup:
        for manager, what in [
            (open_supervisor(), r"open_supervisor\(\.\.\.\)"),
            (sup.events(), r"sup\.events\(\)"),
            (sup.limited(ConcurrencyLimit("plain", 1)), r"sup\.limited\(\.\.\.\)"),
        ]:
            message = rf"^{what} is an async context manager: use 'async with'$"
            with pytest.raises(TypeError, match=message), manager:
                pass
        assert sup.limit_snapshot() == ()


# -- exceptions whose str() raises -----------------------------------------------------------


class Unprintable(Exception):
    """An exception whose ``__str__`` raises (an attribute its ``__init__`` never set)."""

    def __str__(self) -> str:
        raise AttributeError("'Unprintable' object has no attribute 'detail'")


async def raise_unprintable() -> None:
    raise Unprintable


ONE_S = BackoffPolicy.constant(1.0)


@pytest.mark.parametrize(
    ("spec", "kind", "reason"),
    [
        pytest.param(TaskSpec.once("t", raise_unprintable), "failed", "", id="once"),
        pytest.param(
            TaskSpec.restartable("t", raise_unprintable, backoff=ONE_S, max_retries=1),
            "failed",
            "retry limit reached after 1 retry: ",
            id="max-retries",
        ),
        pytest.param(
            TaskSpec.restartable("t", raise_unprintable, backoff=ONE_S, retry_budget=1.5),
            "failed",
            "retry budget of 1.5 s spent: ",
            id="retry-budget",
        ),
        pytest.param(
            TaskSpec.restartable(
                "t", raise_unprintable, backoff=ONE_S, restart_limit=RestartLimit(1, 10)
            ),
            "failed",
            "restart limit reached: 1 restart within 10.0 s: ",
            id="restart-limit",
        ),
        pytest.param(
            TaskSpec.restartable("t", raise_unprintable, retry_on=(KeyError,)),
            "fatal",
            "",
            id="retry-on",
        ),
    ],
)
async def test_regression_an_exception_whose_str_raises_is_an_outcome(
    autojump_clock: Any,
    caplog: pytest.LogCaptureFixture,
    spec: TaskSpec[Any],
    kind: str,
    reason: str,
) -> None:
    """A task's exception whose ``str()`` raises ends the task as any failure does; its
    text reads ``<exception str() failed>``, as in Python's tracebacks (the outcome's
    ``reason``, the attempt's and the backoff's event, the log). Before, the actor
    raised the ``AttributeError`` while it built the reason or the attempt's event: the
    whole supervisor failed with it and the task ended ``CANCELLED``."""
    recorder = EventRecorder()
    async with supervisor(recorder, log_failures=True) as sup:
        outcome = await (await sup.add(spec)).wait()
        await assert_still_works(sup)
    assert (outcome.kind.value, outcome.reason) == (kind, reason + "<exception str() failed>")
    assert isinstance(outcome.error, Unprintable)
    texts = [e.reason for e in recorder.events if e.kind.name.startswith(("ATTEMPT_", "BACKOFF"))]
    assert "<exception str() failed>" in texts
    assert "<exception str() failed>" in caplog.text


async def test_regression_an_exception_whose_exit_code_raises_has_none(
    autojump_clock: Any,
) -> None:
    """An exception of the task whose ``exit_code`` property raises (anything but an
    ``AttributeError``) has no exit code: the task ends ``FAILED`` as for any error.
    Before, reading it raised in the actor and the whole supervisor failed with it."""

    class OddCode(Exception):
        @property
        def exit_code(self) -> int:
            raise RuntimeError("no code yet")

    async def raise_odd() -> None:
        raise OddCode("odd")

    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        outcome = await (await sup.add(TaskSpec.once("t", raise_odd))).wait()
        await assert_still_works(sup)
    assert (outcome.kind, outcome.reason, outcome.exit_code) == (OutcomeKind.FAILED, "odd", None)
    failed = [e for e in recorder.events if e.kind is EventKind.ATTEMPT_FAILED]
    assert [(e.reason, e.exit_code) for e in failed] == [("odd", None)]


async def test_regression_a_subscriber_error_whose_str_raises_is_reported(
    autojump_clock: Any,
) -> None:
    """A subscriber's exception whose ``str()`` raises is reported as any subscriber's
    failure, its reason ``"Unprintable: <exception str() failed>"``."""

    class Failing:
        async def on_event(self, event: Any) -> None:
            raise Unprintable

    recorder = EventRecorder()
    async with supervisor(recorder, subscribers=[Failing()]) as sup:
        await (await sup.add(TaskSpec.once("t", async_fn))).wait()
        await assert_still_works(sup)
    failed = [e for e in recorder.events if e.kind is EventKind.SUBSCRIBER_FAILED]
    assert failed[0].reason == "Unprintable: <exception str() failed>"


# -- keywords that are no task option -------------------------------------------------------------


async def add(x: int, *, y: int = 0) -> int:
    return x + y


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: TaskSpec.once("t", add, 1, y=2), id="once"),
        pytest.param(lambda: TaskSpec.restartable("t", add, 1, y=2), id="restartable"),
        pytest.param(lambda: TaskSpec.periodic("t", 1.0, add, 1, y=2), id="periodic"),
    ],
)
def test_a_keyword_meant_for_the_function_names_the_constructor(make: Callable[[], Any]) -> None:
    """A keyword argument of the task's function given to a constructor, whose keywords
    are task options: the error names the constructor and says where the keyword goes
    (Python's own said ``TaskSpec.__init__() got an unexpected keyword argument``)."""
    with pytest.raises(TypeError) as error:
        make()
    text = str(error.value)
    assert text.startswith("TaskSpec.")
    assert "() got an unexpected keyword argument 'y': it takes the task options" in text
    assert text.endswith("goes in functools.partial(fn, y=...)")


def test_restart_given_to_a_constructor_says_it_is_the_constructors_own() -> None:
    """``restart`` is a field of ``TaskSpec``, not an option: the constructor's own."""
    with pytest.raises(TypeError, match=r"'restart': its restart policy is its own; build "):
        TaskSpec.once("t", add, 1, restart=RestartPolicy.ON_FAILURE)  # type: ignore[call-arg]


async def test_run_in_slot_names_itself_for_a_keyword_meant_for_the_function() -> None:
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config) as sup:
        with pytest.raises(
            TypeError, match=r"^run_in_slot\(\) got an unexpected keyword argument 'y'"
        ):
            await sup.run_in_slot("s", add, 1, y=2)  # type: ignore[call-arg]
        assert await sup.run_in_slot("s", functools.partial(add, y=2), 1) == 3


def test_a_type_error_takes_the_article_of_its_type() -> None:
    """The message reads "must be an AdmissionPolicy" (it read "a AdmissionPolicy"), and
    "must be a bool"."""
    spec = TaskSpec.once("t", add, 1)
    with pytest.raises(TypeError, match=r"^policy must be an AdmissionPolicy, got 'queue'$"):
        ControllerSpec(spec, "queue", "s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^wait must be a bool, got 'yes'$"):
        ControllerSpec.queue(spec, slot="s", wait="yes")  # type: ignore[arg-type]

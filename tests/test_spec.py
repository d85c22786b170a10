"""TaskSpec construction, validation and INHERIT resolution; TaskDefaults and SupervisorConfig.

ControllerConfig and ControllerSpec values are in ``test_controller_api.py``.
"""

from __future__ import annotations

import functools
import math
import random
import re
from typing import Any

import attrs
import pytest
import trio

from trio_taskvisor import (
    INHERIT,
    BackoffPolicy,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    RestartPolicy,
    SupervisorConfig,
    TaskDefaults,
    TaskOutcome,
    TaskSpec,
)

from helpers import Service, async_fn, forever, run_spec, sync_fn

# -- fakes -------------------------------------------------------------------------------


class AsyncCallable:
    """An object whose ``__call__`` is ``async def``."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, *args: Any) -> tuple[Any, ...]:
        self.calls += 1
        return args


class SyncCallable:
    """An object whose synchronous ``__call__`` returns a non-awaitable."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return 42


class Flaky:
    """Fails with ``ValueError("boom")`` ``failures`` times, then returns ``"ok"``."""

    def __init__(self, failures: float = math.inf) -> None:
        self.failures = failures
        self.starts: list[float] = []

    async def __call__(self) -> str:
        self.starts.append(trio.current_time())
        if len(self.starts) <= self.failures:
            raise ValueError("boom")
        return "ok"


class Sleeper:
    """Sleeps ``seconds`` and returns ``"done"``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def __call__(self) -> str:
        await trio.sleep(self.seconds)
        return "done"


def with_defaults(**fields: Any) -> SupervisorConfig:
    return SupervisorConfig(task_defaults=TaskDefaults(**fields))


# -- construction ------------------------------------------------------------------------


def test_direct_construction_leaves_options_inherit() -> None:
    """TaskSpec(name, fn) has empty args and every option INHERIT."""
    spec = TaskSpec("job", async_fn)
    assert (spec.name, spec.fn, spec.args) == ("job", async_fn, ())
    assert spec.restart is INHERIT
    assert spec.backoff is INHERIT
    assert spec.timeout is INHERIT
    assert spec.max_retries is INHERIT


def test_direct_construction_keeps_every_option() -> None:
    """TaskSpec stores args and explicit options as given."""
    backoff = BackoffPolicy.constant(1.0)
    spec = TaskSpec(
        "job",
        async_fn,
        (1, 2),
        restart=RestartPolicy.NEVER,
        backoff=backoff,
        timeout=3.5,
        max_retries=2,
    )
    assert spec.args == (1, 2)
    assert spec.restart == RestartPolicy.NEVER
    assert spec.backoff == backoff
    assert spec.timeout == 3.5
    assert spec.max_retries == 2


def test_options_are_keyword_only() -> None:
    """Options cannot be passed positionally."""
    with pytest.raises(TypeError):
        TaskSpec("job", async_fn, (), RestartPolicy.NEVER)  # type: ignore[misc]


def test_spec_is_frozen() -> None:
    """A TaskSpec cannot be mutated."""
    spec = TaskSpec("job", async_fn)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_once_uses_never_and_packs_args() -> None:
    """TaskSpec.once sets RestartPolicy.NEVER and passes *args into args."""
    spec = TaskSpec.once("job", async_fn, 1, "two")
    assert spec.restart == RestartPolicy.NEVER
    assert spec.args == (1, "two")


def test_restartable_uses_on_failure() -> None:
    """TaskSpec.restartable sets RestartPolicy.ON_FAILURE."""
    spec = TaskSpec.restartable("job", async_fn, 1)
    assert spec.restart == RestartPolicy.ON_FAILURE
    assert spec.args == (1,)


def test_periodic_uses_always_every() -> None:
    """TaskSpec.periodic(name, every, ...) sets RestartPolicy.always(every)."""
    spec = TaskSpec.periodic("job", 5.0, async_fn, 1)
    assert spec.restart == RestartPolicy.always(5.0)
    assert spec.args == (1,)


def test_named_constructors_accept_options() -> None:
    """The named constructors take backoff, timeout and max_retries as keywords."""
    backoff = BackoffPolicy.exponential(0.5)
    spec = TaskSpec.restartable("job", async_fn, backoff=backoff, timeout=2.0, max_retries=3)
    assert (spec.backoff, spec.timeout, spec.max_retries) == (backoff, 2.0, 3)


# -- normalisation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [(0, None), (0.0, None), (math.inf, None), (None, None), (2, 2.0), (2.5, 2.5)],
)
def test_timeout_is_normalised(given: float | None, stored: float | None) -> None:
    """timeout=0 and timeout=inf become None; other durations are kept."""
    assert TaskSpec("job", async_fn, timeout=given).timeout == stored


def test_named_constructor_normalises_timeout() -> None:
    """TaskSpec.once(..., timeout=0) stores None."""
    assert TaskSpec.once("job", async_fn, timeout=0).timeout is None


def test_max_retries_none_means_unlimited() -> None:
    """max_retries=None is stored as None, not INHERIT."""
    assert TaskSpec("job", async_fn, max_retries=None).max_retries is None


# -- bad values --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -0.5, -math.inf, math.nan], ids=repr)
def test_bad_timeout_raises_config_error(bad: float) -> None:
    """A negative or NaN timeout raises ConfigError naming the value."""
    with pytest.raises(ConfigError, match=rf"timeout.*{re.escape(repr(bad))}"):
        TaskSpec("job", async_fn, timeout=bad)


@pytest.mark.parametrize("bad", [-1.0, math.nan], ids=repr)
def test_bad_periodic_interval_raises_config_error(bad: float) -> None:
    """A negative or NaN periodic interval raises ConfigError."""
    with pytest.raises(ConfigError, match="interval"):
        TaskSpec.periodic("job", bad, async_fn)


def test_empty_name_raises_config_error() -> None:
    """An empty task name raises ConfigError."""
    with pytest.raises(ConfigError, match="name"):
        TaskSpec("", async_fn)


def test_max_retries_zero_raises_config_error_pointing_at_once() -> None:
    """max_retries=0 raises ConfigError that suggests TaskSpec.once."""
    with pytest.raises(ConfigError, match="once"):
        TaskSpec.restartable("job", async_fn, max_retries=0)


def test_a_number_of_retries_for_one_attempt_raises_config_error() -> None:
    """``once`` never retries: ``max_retries=3`` would be dropped without a word (the
    work ran once), so it is refused; ``max_retries=None`` and the other options of
    retries (an options dict shared with ``restartable``) are accepted and unused."""
    with pytest.raises(ConfigError) as info:
        TaskSpec.once("job", async_fn, max_retries=3)
    assert str(info.value) == (
        "TaskSpec.once() runs one attempt, so max_retries=3 would never apply: "
        "TaskSpec.restartable retries"
    )
    with pytest.raises(TypeError, match="max_retries"):
        TaskSpec.once("job", async_fn, max_retries=1.5)  # type: ignore[typeddict-item]
    shared = {"backoff": BackoffPolicy.constant(1.0), "retry_budget": 5.0, "max_retries": None}
    assert TaskSpec.once("job", async_fn, **shared).max_retries is None  # type: ignore[arg-type]


def test_negative_max_retries_raises_config_error() -> None:
    """max_retries=-1 raises ConfigError naming the value."""
    with pytest.raises(ConfigError, match="-1"):
        TaskSpec("job", async_fn, max_retries=-1)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(sync_fn, id="sync-function"),
        pytest.param(lambda: None, id="lambda"),
        pytest.param(Service().sync_method, id="sync-method"),
        pytest.param(len, id="builtin"),
        pytest.param(str.upper, id="method-descriptor"),
        pytest.param(42, id="int"),
        pytest.param("not callable", id="str"),
        pytest.param(None, id="none"),
    ],
)
def test_non_async_fn_raises_type_error(fn: Any) -> None:
    """A non-callable or plain synchronous function or method raises TypeError."""
    with pytest.raises(TypeError):
        TaskSpec("job", fn)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(async_fn, id="async-function"),
        pytest.param(Service().async_method, id="async-method"),
        pytest.param(AsyncCallable(), id="async-call-object"),
        pytest.param(functools.partial(async_fn, 1), id="partial"),
        pytest.param(functools.partial(functools.partial(async_fn, 1), 2), id="nested-partial"),
    ],
)
def test_async_callables_are_accepted(fn: Any) -> None:
    """Async functions, async methods, async __call__ objects and partials are accepted."""
    assert TaskSpec("job", fn).fn is fn


async def test_partial_runs_with_bound_and_spec_args(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A partial's bound args come before the spec's args."""
    outcome, _, _ = await run_spec(TaskSpec.once("job", functools.partial(async_fn, 1), 2, 3))
    assert outcome == TaskOutcome(OutcomeKind.COMPLETED, value=(1, 2, 3))


async def test_async_call_object_runs(autojump_clock: trio.testing.MockClock) -> None:
    """An object with an async __call__ is called with the spec's args."""
    fn = AsyncCallable()
    outcome, _, _ = await run_spec(TaskSpec.once("job", fn, "a"))
    assert outcome == TaskOutcome(OutcomeKind.COMPLETED, value=("a",))
    assert fn.calls == 1


async def test_sync_call_returning_awaitable_runs(autojump_clock: trio.testing.MockClock) -> None:
    """An object whose sync __call__ returns a coroutine is awaited like any task."""

    class Factory:
        def __call__(self, *args: Any) -> Any:
            return async_fn(*args)

    outcome, _, _ = await run_spec(TaskSpec.once("job", Factory(), 1))
    assert outcome == TaskOutcome(OutcomeKind.COMPLETED, value=(1,))


async def test_non_awaitable_result_ends_fatal_with_type_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A callable that returns a non-awaitable ends FATAL with a TypeError, not retried."""
    fn = SyncCallable()
    outcome, _, _ = await run_spec(TaskSpec.restartable("job", fn))
    assert outcome.kind is OutcomeKind.FATAL
    assert isinstance(outcome.error, TypeError)
    assert outcome.reason == str(outcome.error)
    assert fn.calls == 1


# -- INHERIT resolution at admission -----------------------------------------------------


async def test_inherited_timeout_applies(autojump_clock: trio.testing.MockClock) -> None:
    """A spec left at INHERIT takes the supervisor's default timeout."""
    outcome, elapsed, _ = await run_spec(TaskSpec.once("job", forever), with_defaults(timeout=2.0))
    assert outcome.kind is OutcomeKind.FAILED
    assert isinstance(outcome.error, TimeoutError)
    assert elapsed == 2.0


@pytest.mark.parametrize("no_timeout", [None, 0])
async def test_explicit_no_timeout_overrides_inherited_default(
    autojump_clock: trio.testing.MockClock, no_timeout: float | None
) -> None:
    """timeout=None (or 0) disables the supervisor's default timeout."""
    outcome, elapsed, _ = await run_spec(
        TaskSpec.once("job", Sleeper(5.0), timeout=no_timeout), with_defaults(timeout=2.0)
    )
    assert outcome == TaskOutcome(OutcomeKind.COMPLETED, value="done")
    assert elapsed == 5.0


async def test_inherited_restart_policy_applies(autojump_clock: trio.testing.MockClock) -> None:
    """A direct TaskSpec takes the default restart policy (here NEVER)."""
    fn = Flaky()
    outcome, _, _ = await run_spec(TaskSpec("job", fn), with_defaults(restart=RestartPolicy.NEVER))
    assert outcome.kind is OutcomeKind.FAILED
    assert len(fn.starts) == 1


async def test_default_task_defaults_retry_on_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With the stock TaskDefaults a direct TaskSpec retries a failure (ON_FAILURE)."""
    fn = Flaky(failures=2)
    outcome, _, _ = await run_spec(TaskSpec("job", fn))
    assert outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")
    assert len(fn.starts) == 3


async def test_inherited_backoff_and_max_retries_apply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Default backoff and max_retries govern a spec that leaves them INHERIT."""
    fn = Flaky()
    outcome, elapsed, _ = await run_spec(
        TaskSpec.restartable("job", fn),
        with_defaults(backoff=BackoffPolicy.constant(1.5), max_retries=2),
    )
    assert outcome.reason == "retry limit reached after 2 retries: boom"
    assert fn.starts == [0.0, 1.5, 3.0]
    assert elapsed == 3.0


async def test_explicit_option_wins_over_default(autojump_clock: trio.testing.MockClock) -> None:
    """An option set on the spec is not replaced by the supervisor's default."""
    fn = Flaky()
    outcome, _, _ = await run_spec(
        TaskSpec.restartable("job", fn, backoff=BackoffPolicy.constant(1.0), max_retries=1),
        with_defaults(max_retries=5),
    )
    assert outcome.reason == "retry limit reached after 1 retry: boom"
    assert len(fn.starts) == 2


async def test_same_spec_resolves_per_supervisor(autojump_clock: trio.testing.MockClock) -> None:
    """One INHERIT spec takes each admitting supervisor's defaults and stays INHERIT."""
    spec = TaskSpec.once("job", forever)
    _, first, _ = await run_spec(spec, with_defaults(timeout=1.0))
    _, second, _ = await run_spec(spec, with_defaults(timeout=3.0))
    assert (first, second) == (1.0, 3.0)
    assert spec.timeout is INHERIT


# -- TaskDefaults ------------------------------------------------------------------------


def test_task_defaults_have_documented_values() -> None:
    """TaskDefaults() is ON_FAILURE, BackoffPolicy(), no timeout, unlimited retries."""
    defaults = TaskDefaults()
    assert defaults.restart == RestartPolicy.ON_FAILURE
    assert defaults.backoff == BackoffPolicy()
    assert defaults.timeout is None
    assert defaults.max_retries is None


@pytest.mark.parametrize("given", [0, math.inf])
def test_task_defaults_normalise_timeout(given: float) -> None:
    """TaskDefaults(timeout=0 or inf) stores None."""
    assert TaskDefaults(timeout=given).timeout is None


@pytest.mark.parametrize("bad", [-1.0, math.nan], ids=repr)
def test_task_defaults_bad_timeout_raises_config_error(bad: float) -> None:
    """A negative or NaN default timeout raises ConfigError."""
    with pytest.raises(ConfigError, match="timeout"):
        TaskDefaults(timeout=bad)


def test_task_defaults_max_retries_zero_raises_config_error() -> None:
    """TaskDefaults(max_retries=0) raises ConfigError."""
    with pytest.raises(ConfigError, match="once"):
        TaskDefaults(max_retries=0)


# -- SupervisorConfig ------------------------------------------------------------------


def test_supervisor_config_has_documented_defaults() -> None:
    """SupervisorConfig() matches the documented defaults."""
    config = SupervisorConfig()
    assert config.grace == 60.0
    assert config.subscriber_shutdown_timeout == 5.0
    assert config.max_concurrent is None
    assert config.max_registered_tasks == 1024
    assert config.command_capacity == 1024
    assert config.bus_capacity == 1024
    assert config.task_defaults == TaskDefaults()
    assert config.controller is None
    assert isinstance(config.random, random.Random)


def test_supervisor_config_is_frozen() -> None:
    """A SupervisorConfig cannot be mutated."""
    config = SupervisorConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.grace = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("field", ["command_capacity", "bus_capacity"])
@pytest.mark.parametrize("bad", [0, -1])
def test_supervisor_capacity_below_one_raises_config_error(field: str, bad: int) -> None:
    """A command or bus capacity of 0 or less raises ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        SupervisorConfig(**{field: bad})


@pytest.mark.parametrize("field", ["grace", "subscriber_shutdown_timeout"])
@pytest.mark.parametrize("bad", [-1.0, math.nan], ids=repr)
def test_supervisor_bad_duration_raises_config_error(field: str, bad: float) -> None:
    """A negative or NaN grace or drain timeout raises ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        SupervisorConfig(**{field: bad})


def test_max_concurrent_zero_raises_config_error() -> None:
    """max_concurrent=0 (no attempt could ever run) raises ConfigError."""
    with pytest.raises(ConfigError, match="max_concurrent"):
        SupervisorConfig(max_concurrent=0)


def test_supervisor_zero_durations_are_valid() -> None:
    """grace=0 and subscriber_shutdown_timeout=0 are accepted."""
    config = SupervisorConfig(grace=0, subscriber_shutdown_timeout=0)
    assert (config.grace, config.subscriber_shutdown_timeout) == (0, 0)


def test_unlimited_limits_are_valid() -> None:
    """Limits documented as optional accept None."""
    config = SupervisorConfig(
        max_concurrent=None,
        max_registered_tasks=None,
        controller=ControllerConfig(max_total_pending=None, max_slots=None, max_waiters=None),
    )
    assert config.max_registered_tasks is None
    assert config.controller is not None
    assert config.controller.max_slots is None


@pytest.mark.parametrize("make", [ControllerSpec.queue, ControllerSpec.replace])
def test_controller_spec_fast_path_equals_the_validating_constructor(make: Any) -> None:
    """``queue`` and ``replace`` without options skip the validators only for plainly
    valid arguments: the result equals the validated one, and bad input still fails."""
    spec = TaskSpec.once("t", async_fn)
    for slot, wait in [(None, False), ("k", True)]:
        made = make(spec, slot=slot, wait=wait)
        assert type(made) is ControllerSpec
        assert made == ControllerSpec(spec, made.policy, slot, wait)
    with pytest.raises(ConfigError):
        make(spec, slot="")
    with pytest.raises(ConfigError):
        make(TaskSpec.once(None, async_fn))  # no name, no slot
    with pytest.raises(TypeError):
        make(spec, wait=1)
    with pytest.raises(TypeError):
        make("not a spec")


def test_resolver_never_mixes_up_policies_of_plain_specs() -> None:
    """Specs that set only a restart policy share resolutions by the policy's identity;
    a policy freed and a new one at the same address must not get the old resolution."""
    from trio_taskvisor._spec import Resolver

    resolver = Resolver(TaskDefaults(backoff=BackoffPolicy.constant(2.0)), lambda pools: ())
    once = resolver(TaskSpec.once("a", async_fn))
    assert once is resolver(TaskSpec.once("b", async_fn))  # shared
    assert once.restart is RestartPolicy.NEVER
    assert not once.repeats
    for i in range(1, 600):  # past the cache's bound too
        spec = TaskSpec(f"t{i}", async_fn, restart=RestartPolicy.always(float(i)))
        resolved = resolver(spec)
        assert resolved.restart.interval == float(i)
        assert resolved.repeats
        assert resolved.backoff == BackoffPolicy.constant(2.0)
        del spec, resolved


@pytest.mark.parametrize("option", ["healthy_after", "retry_budget"])
@pytest.mark.parametrize("value", [-1, -0.5, 0, 0.0, math.nan])
def test_a_streak_duration_not_above_zero_names_the_rule_it_breaks(
    option: str, value: float
) -> None:
    """Negative, zero and NaN say "> 0 or None", the rule each of them breaks. Before, a
    negative value said "must be >= 0", which 0 then broke too."""
    with pytest.raises(ConfigError) as info:
        TaskSpec.restartable("job", async_fn, **{option: value})  # type: ignore[arg-type]
    assert str(info.value) == f"{option} must be > 0 or None, got {value!r}"

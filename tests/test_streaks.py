"""Failure streaks in long attempts (DESIGN section 12): ``healthy_after``,
``restart_limit``, ``retry_on`` and ``retry_budget``, on the virtual clock.

Every test runs on a fresh ``MockClock`` (``autojump_clock``) starting at 0; a task's
attempts record their start times (``Attempts``), so every timing rule is checked
exactly. Events are read after the ``open_supervisor`` block (``run_spec``), whose
shutdown drained the recorder.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_taskvisor import (
    BackoffPolicy,
    BackoffSource,
    EventKind,
    FatalError,
    OutcomeKind,
    RestartLimit,
    SupervisorConfig,
    TaskCancelled,
    TaskDefaults,
    TaskSpec,
    open_supervisor,
)

from helpers import Attempts, run_spec

ONE_SECOND = BackoffPolicy.constant(1.0)
DOUBLING = BackoffPolicy.exponential(1.0, max=64.0)  # 1, 2, 4, ... without jitter
BOOM = ValueError("boom")


def backoff_delays(run: Any) -> list[float | None]:
    """The delays of a run's retries (``BACKOFF_SCHEDULED(FAILURE)``), in order."""
    return [
        e.delay
        for e in run.recorder.of(EventKind.BACKOFF_SCHEDULED)
        if e.backoff_source is BackoffSource.FAILURE
    ]


async def run_for(spec: TaskSpec[Any], seconds: float) -> tuple[Attempts, Any]:
    """Run ``spec`` for ``seconds`` of virtual time; return its outcome after the stop."""
    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        waiter = await sup.add(spec)
        await trio.sleep(seconds)
    return spec.fn, waiter.outcome_nowait()  # type: ignore[return-value]


# -- healthy_after ------------------------------------------------------------------------


async def test_poller_failing_once_an_hour_never_exhausts_max_retries(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A poller that runs an hour between blips retries from the first step every time."""
    poller = Attempts((3600.0, ConnectionError("blip")))
    spec = TaskSpec.restartable("poll", poller, backoff=DOUBLING, max_retries=2, healthy_after=60.0)
    _, outcome = await run_for(spec, 5 * 3601.0 - 0.5)
    assert poller.starts == [0.0, 3601.0, 7202.0, 10803.0, 14404.0]
    assert outcome.kind is OutcomeKind.CANCELLED  # stopped by the shutdown, never FAILED


async def test_without_healthy_after_the_same_poller_ends_failed(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The trap healthy_after removes: the streak never resets, the backoff grows."""
    run = await run_spec(
        TaskSpec.restartable(
            "poll", Attempts((3600.0, ConnectionError("blip"))), backoff=DOUBLING, max_retries=2
        )
    )
    assert run.outcome.kind is OutcomeKind.FAILED
    assert run.outcome.reason == "retry limit reached after 2 retries: blip"
    assert backoff_delays(run) == [1.0, 2.0]
    assert run.elapsed == 3 * 3600.0 + 1.0 + 2.0


async def test_healthy_after_resets_the_backoff_step(autojump_clock: trio.abc.Clock) -> None:
    """After a healthy attempt the next delay is the first step again."""
    body = Attempts((0.0, BOOM), (0.0, BOOM), (10.0, BOOM), (0.0, BOOM), (0.0, "done"))
    run = await run_spec(TaskSpec.restartable("t", body, backoff=DOUBLING, healthy_after=10.0))
    assert run.outcome.value == "done"
    assert backoff_delays(run) == [1.0, 2.0, 1.0, 2.0]
    assert body.starts == [0.0, 1.0, 3.0, 14.0, 16.0]


@pytest.mark.parametrize(
    ("duration", "outcome"),
    [
        pytest.param(10.0, OutcomeKind.COMPLETED, id="exactly-healthy"),
        pytest.param(9.5, OutcomeKind.FAILED, id="just-short"),
    ],
)
async def test_healthy_after_is_inclusive(
    autojump_clock: trio.abc.Clock, duration: float, outcome: OutcomeKind
) -> None:
    """An attempt that ran exactly ``healthy_after`` seconds counts as healthy."""
    body = Attempts((0.0, BOOM), (duration, BOOM), (0.0, "done"))
    spec = TaskSpec.restartable("t", body, backoff=ONE_SECOND, max_retries=1, healthy_after=10.0)
    run = await run_spec(spec)
    assert run.outcome.kind is outcome
    if outcome is OutcomeKind.FAILED:
        assert run.outcome.reason == "retry limit reached after 1 retry: boom"


async def test_healthy_after_resets_the_retry_budget(autojump_clock: trio.abc.Clock) -> None:
    """A healthy attempt's failure begins a new streak, with a budget of its own."""
    body = Attempts((0.0, BOOM), (20.0, BOOM), (0.0, BOOM), (0.0, BOOM))
    spec = TaskSpec.restartable("t", body, backoff=DOUBLING, healthy_after=10.0, retry_budget=5.0)
    run = await run_spec(spec)
    # Streak 1 begins at 0 (retry at 1); the healthy attempt fails at 21: streak 2 begins
    # there, retries at 22 and 24 are within 21 + 5; the one after 28 is not.
    assert body.starts == [0.0, 1.0, 22.0, 24.0]
    assert run.outcome.kind is OutcomeKind.FAILED
    assert run.outcome.reason == "retry budget of 5.0 s spent: boom"
    assert run.elapsed == 24.0


# -- restart_limit ----------------------------------------------------------------------


async def test_restart_limit_fails_at_the_failure_that_would_exceed_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Two restarts within 10 s are allowed; the failure asking for a third ends FAILED."""
    body = Attempts((0.0, BOOM))
    run = await run_spec(
        TaskSpec.restartable("t", body, backoff=ONE_SECOND, restart_limit=RestartLimit(2, 10))
    )
    assert body.starts == [0.0, 1.0, 2.0]
    assert run.outcome.kind is OutcomeKind.FAILED
    assert run.outcome.reason == "restart limit reached: 2 restarts within 10.0 s: boom"
    assert run.outcome.error is BOOM
    assert run.elapsed == 2.0  # at the failure, with no backoff first
    assert backoff_delays(run) == [1.0, 1.0]


async def test_restart_limit_counts_only_restarts_inside_the_window(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Restarts further apart than ``within`` never add up."""
    body = Attempts((6.0, BOOM))
    spec = TaskSpec.restartable("t", body, backoff=ONE_SECOND, restart_limit=RestartLimit(2, 10))
    _, outcome = await run_for(spec, 60.0)
    assert body.starts == [0.0, 7.0, 14.0, 21.0, 28.0, 35.0, 42.0, 49.0, 56.0]
    assert outcome.kind is OutcomeKind.CANCELLED


async def test_restart_limit_window_includes_its_start(autojump_clock: trio.abc.Clock) -> None:
    """A restart exactly ``within`` seconds after an earlier one is counted with it."""
    body = Attempts((6.0, BOOM))
    run = await run_spec(
        TaskSpec.restartable("t", body, backoff=ONE_SECOND, restart_limit=RestartLimit(1, 7))
    )
    # Restart at 7; the failure at 13 would restart at 14, and 7 >= 14 - 7.
    assert body.starts == [0.0, 7.0]
    assert run.outcome.reason == "restart limit reached: 1 restart within 7.0 s: boom"
    assert run.elapsed == 13.0


async def test_healthy_after_does_not_reset_the_restart_count(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Healthy attempts still count as restarts for the intensity limit."""
    body = Attempts((5.0, BOOM))
    spec = TaskSpec.restartable(
        "t", body, backoff=ONE_SECOND, healthy_after=1.0, restart_limit=RestartLimit(1, 100)
    )
    run = await run_spec(spec)
    assert body.starts == [0.0, 6.0]
    assert run.outcome.reason == "restart limit reached: 1 restart within 100.0 s: boom"
    assert run.elapsed == 11.0


async def test_repeats_after_success_are_not_restarts(autojump_clock: trio.abc.Clock) -> None:
    """Under ``always``, only the restarts after failures count against the limit."""
    body = Attempts((0.0, "ok"), (0.0, "ok"), (0.0, "ok"), (0.0, BOOM), (0.0, "ok"), (0.0, BOOM))
    spec = TaskSpec.periodic("t", 1.0, body, backoff=ONE_SECOND, restart_limit=RestartLimit(1, 100))
    run = await run_spec(spec)
    assert body.starts == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert run.outcome.kind is OutcomeKind.FAILED
    assert run.elapsed == 5.0


# -- retry_on ------------------------------------------------------------------------------


async def test_retry_on_retries_matching_exceptions(autojump_clock: trio.abc.Clock) -> None:
    """An exception of a listed class (a subclass too) is retried."""
    body = Attempts((0.0, ConnectionResetError("reset")), (0.0, "ok"))
    run = await run_spec(
        TaskSpec.restartable("t", body, backoff=ONE_SECOND, retry_on=(ConnectionError,))
    )
    assert run.outcome.value == "ok"
    assert body.starts == [0.0, 1.0]


async def test_retry_on_ends_other_exceptions_fatal(autojump_clock: trio.abc.Clock) -> None:
    """An exception matching none of the classes ends the task FATAL, with that error."""
    error = KeyError("missing")
    body = Attempts((0.0, ConnectionError("down")), (0.0, error))
    run = await run_spec(
        TaskSpec.restartable("t", body, backoff=ONE_SECOND, retry_on=(ConnectionError,))
    )
    assert run.outcome.kind is OutcomeKind.FATAL
    assert run.outcome.error is error
    assert run.outcome.reason == str(error)
    assert body.starts == [0.0, 1.0]
    assert run.elapsed == 1.0
    assert backoff_delays(run) == [1.0]


async def test_retry_on_without_timeout_error_ends_a_timeout_fatal(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A timeout is retried only if ``TimeoutError`` matches."""
    body = Attempts((5.0, "late"))
    run = await run_spec(TaskSpec.restartable("t", body, timeout=2.0, retry_on=(ConnectionError,)))
    assert run.outcome.kind is OutcomeKind.FATAL
    assert isinstance(run.outcome.error, TimeoutError)
    assert run.outcome.reason == "attempt timed out after 2.0 s"
    assert run.kinds().count(EventKind.ATTEMPT_TIMED_OUT) == 1
    assert run.elapsed == 2.0


async def test_retry_on_with_timeout_error_retries_timeouts(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``TimeoutError`` in ``retry_on``: timeouts are retried as usual."""
    body = Attempts((5.0, "late"), (0.0, "ok"))
    run = await run_spec(
        TaskSpec.restartable("t", body, backoff=ONE_SECOND, timeout=2.0, retry_on=(TimeoutError,))
    )
    assert run.outcome.value == "ok"
    assert body.starts == [0.0, 3.0]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        pytest.param(FatalError("stop"), OutcomeKind.FATAL, id="fatal-error"),
        pytest.param(TaskCancelled("done"), OutcomeKind.CANCELLED, id="task-cancelled"),
    ],
)
async def test_retry_on_never_changes_fatal_error_or_task_cancelled(
    autojump_clock: trio.abc.Clock, error: Exception, kind: OutcomeKind
) -> None:
    """``FatalError`` is never retried, ``TaskCancelled`` still ends CANCELLED."""
    body = Attempts((0.0, error))
    run = await run_spec(TaskSpec.restartable("t", body, retry_on=(type(error), Exception)))
    assert run.outcome.kind is kind
    assert body.starts == [0.0]


async def test_retry_on_applies_only_to_failures_that_would_be_retried(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A ``once`` task's failure, and the last one of ``max_retries``, stay FAILED."""
    once = await run_spec(TaskSpec.once("once", Attempts((0.0, BOOM)), retry_on=(OSError,)))
    assert once.outcome.kind is OutcomeKind.FAILED
    assert once.outcome.reason == "boom"
    body = Attempts((0.0, OSError("io")), (0.0, BOOM))
    limited = await run_spec(
        TaskSpec.restartable(
            "limited", body, backoff=ONE_SECOND, max_retries=1, retry_on=(OSError,)
        )
    )
    assert limited.outcome.kind is OutcomeKind.FAILED
    assert limited.outcome.reason == "retry limit reached after 1 retry: boom"


async def test_retry_on_retries_a_group_whose_every_leaf_matches(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A group (nested too) whose every exception matches one of the types is retried."""
    group = ExceptionGroup(
        "io", [ConnectionResetError("a"), ExceptionGroup("inner", [TimeoutError("b")])]
    )
    body = Attempts((0.0, group), (0.0, "ok"))
    spec = TaskSpec.restartable(
        "t", body, backoff=ONE_SECOND, retry_on=(ConnectionError, TimeoutError)
    )
    run = await run_spec(spec)
    assert run.outcome.value == "ok"
    assert body.starts == [0.0, 1.0]


async def test_retry_on_ends_a_group_with_one_unmatched_leaf_fatal(
    autojump_clock: trio.abc.Clock,
) -> None:
    """One exception in a nested group that matches none of the types ends it FATAL."""
    group = ExceptionGroup(
        "io", [ConnectionResetError("a"), ExceptionGroup("inner", [KeyError("k")])]
    )
    body = Attempts((0.0, group))
    run = await run_spec(
        TaskSpec.restartable("t", body, backoff=ONE_SECOND, retry_on=(ConnectionError,))
    )
    assert run.outcome.kind is OutcomeKind.FATAL
    assert run.outcome.error is group
    assert body.starts == [0.0]


# -- which rule names the reason -----------------------------------------------------------


async def test_max_retries_names_the_reason_before_the_retry_budget(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A failure both ``max_retries`` and ``retry_budget`` would end: the retry limit."""
    body = Attempts((0.0, BOOM))
    spec = TaskSpec.restartable("t", body, backoff=ONE_SECOND, max_retries=2, retry_budget=2)
    run = await run_spec(spec)
    assert body.starts == [0.0, 1.0, 2.0]
    assert run.outcome.reason == "retry limit reached after 2 retries: boom"


async def test_retry_budget_names_the_reason_before_the_restart_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A failure both ``retry_budget`` and ``restart_limit`` would end: the budget."""
    body = Attempts((0.0, BOOM))
    limit = RestartLimit(max_restarts=2, within=10.0)
    spec = TaskSpec.restartable("t", body, backoff=ONE_SECOND, retry_budget=2, restart_limit=limit)
    run = await run_spec(spec)
    assert body.starts == [0.0, 1.0, 2.0]
    assert run.outcome.reason == "retry budget of 2.0 s spent: boom"


async def test_restart_limit_ends_a_failure_before_retry_on_is_consulted(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An unmatched failure the restart limit ends anyway is ``FAILED``, not ``FATAL``."""
    error = KeyError("k")
    body = Attempts((0.0, OSError("io")), (0.0, error))
    limit = RestartLimit(max_restarts=1, within=10.0)
    spec = TaskSpec.restartable(
        "t", body, backoff=ONE_SECOND, restart_limit=limit, retry_on=(OSError,)
    )
    run = await run_spec(spec)
    assert run.outcome.kind is OutcomeKind.FAILED
    assert run.outcome.reason == f"restart limit reached: 1 restart within 10.0 s: {error}"


# -- retry_budget --------------------------------------------------------------------------


async def test_retry_budget_makes_a_retry_exactly_at_its_end(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Retries at 1, 2 and 3 s fit a 3 s budget from the first failure; 4 s does not."""
    body = Attempts((0.0, BOOM))
    run = await run_spec(TaskSpec.restartable("t", body, backoff=ONE_SECOND, retry_budget=3))
    assert body.starts == [0.0, 1.0, 2.0, 3.0]
    assert run.outcome.kind is OutcomeKind.FAILED
    assert run.outcome.reason == "retry budget of 3.0 s spent: boom"
    assert run.outcome.error is BOOM
    assert run.elapsed == 3.0
    assert backoff_delays(run) == [1.0, 1.0, 1.0]


async def test_retry_budget_counts_from_the_first_failure(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The budget starts at the streak's first failure, not at the task's start."""
    body = Attempts((10.0, BOOM), (0.0, BOOM), (0.0, "ok"))
    run = await run_spec(TaskSpec.restartable("t", body, backoff=ONE_SECOND, retry_budget=2))
    assert run.outcome.value == "ok"
    assert body.starts == [0.0, 11.0, 12.0]


async def test_a_success_starts_a_new_budget(autojump_clock: trio.abc.Clock) -> None:
    """After a success under ``always``, a failure begins a fresh budget."""
    body = Attempts((0.0, BOOM), (0.0, BOOM), (0.0, "ok"), (0.0, BOOM), (0.0, BOOM), (0.0, BOOM))
    spec = TaskSpec.periodic("t", 10.0, body, backoff=ONE_SECOND, retry_budget=2)
    run = await run_spec(spec)
    assert body.starts == [0.0, 1.0, 2.0, 12.0, 13.0, 14.0]
    assert run.outcome.reason == "retry budget of 2.0 s spent: boom"
    assert run.elapsed == 14.0


async def test_a_delay_longer_than_the_budget_fails_at_the_first_failure(
    autojump_clock: trio.abc.Clock,
) -> None:
    """No retry is made when even the first one would start after the budget."""
    run = await run_spec(
        TaskSpec.restartable(
            "t", Attempts((0.0, BOOM)), backoff=BackoffPolicy.constant(5.0), retry_budget=1
        )
    )
    assert run.outcome.reason == "retry budget of 1.0 s spent: boom"
    assert run.elapsed == 0.0
    assert backoff_delays(run) == []


# -- defaults ------------------------------------------------------------------------------


async def test_task_defaults_supply_the_streak_rules(autojump_clock: trio.abc.Clock) -> None:
    """Options left INHERIT take the supervisor's ``TaskDefaults``."""
    defaults = TaskDefaults(backoff=ONE_SECOND, retry_budget=2.0, retry_on=(ValueError,))
    config = SupervisorConfig(task_defaults=defaults)
    inherited = await run_spec(TaskSpec.restartable("t", Attempts((0.0, BOOM))), config)
    assert inherited.outcome.reason == "retry budget of 2.0 s spent: boom"
    assert inherited.elapsed == 2.0
    other = await run_spec(TaskSpec.restartable("t", Attempts((0.0, KeyError("k")))), config)
    assert other.outcome.kind is OutcomeKind.FATAL


async def test_none_turns_off_a_default_rule(autojump_clock: trio.abc.Clock) -> None:
    """``retry_budget=None`` on the spec overrides the default budget."""
    config = SupervisorConfig(task_defaults=TaskDefaults(backoff=ONE_SECOND, retry_budget=2.0))
    body = Attempts((0.0, BOOM), (0.0, BOOM), (0.0, BOOM), (0.0, BOOM), (0.0, "ok"))
    run = await run_spec(TaskSpec.restartable("t", body, retry_budget=None), config)
    assert run.outcome.value == "ok"
    assert body.starts == [0.0, 1.0, 2.0, 3.0, 4.0]

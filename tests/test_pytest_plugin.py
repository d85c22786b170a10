"""The pytest plugin, tested on small inner test suites run by ``pytester``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable

import pytest

from helpers import ROOT

pytest_plugins = ["pytester"]


RunInner = Callable[..., pytest.RunResult]

TRIO_MODE_INI = "[pytest]\ntrio_mode = true\n"

COMMON = """
import random

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy, ControllerConfig, ControllerSpec, EventKind, OutcomeKind,
    SupervisorConfig, TaskFailure, TaskSpec, current_context,
)


async def flaky():
    if current_context().attempt < 3:
        raise TaskFailure("not yet")
    return "ok"


async def stubborn():
    with current_context().defer_cancel():
        await trio.sleep_forever()
"""


@pytest.fixture
def plugin_args(pytestconfig: pytest.Config) -> list[str]:
    """Load the plugin by hand unless the installed entry point already did."""
    if pytestconfig.pluginmanager.has_plugin("trio_taskvisor"):
        return []
    return ["-p", "trio_taskvisor.pytest_plugin"]


@pytest.fixture
def run_inner(pytester: pytest.Pytester, plugin_args: list[str]) -> RunInner:
    """Write an inner test module (after ``COMMON``) and run it in-process."""

    def run(source: str, *args: str, trio_mode: bool = True) -> pytest.RunResult:
        if trio_mode:
            pytester.makeini(TRIO_MODE_INI)
        pytester.makepyfile(test_inner=COMMON + textwrap.dedent(source))
        return pytester.runpytest("--strict-markers", *plugin_args, *args)

    return run


# -- both modes ------------------------------------------------------------------------------

RECIPES = """
async def test_retries_back_off(supervisor, autojump_clock):
    t0 = trio.current_time()
    waiter = await supervisor.add(
        TaskSpec.restartable("t", flaky, backoff=BackoffPolicy.constant(2.0))
    )
    assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert trio.current_time() - t0 == 4.0


async def test_backoff_is_scheduled_after_the_failure(
    supervisor, event_recorder, autojump_clock
):
    await supervisor.add(
        TaskSpec.restartable("t", flaky, backoff=BackoffPolicy.constant(2.0))
    )
    failed = await event_recorder.wait_for(EventKind.ATTEMPT_FAILED, name="t")
    started = await event_recorder.wait_for(EventKind.ATTEMPT_STARTING, attempt=2)
    assert started.time - failed.time == 2.0


async def test_recorder_is_subscribed(supervisor, event_recorder):
    await (await supervisor.add(TaskSpec.once("t", trio.lowlevel.checkpoint))).wait()
    await event_recorder.wait_for(EventKind.TASK_REMOVED, name="t")
    assert event_recorder.kinds(EventKind.TASK_ADDED, EventKind.TASK_FINISHED) == [
        EventKind.TASK_ADDED, EventKind.TASK_FINISHED
    ]
"""


def test_fixtures_work_in_trio_mode(run_inner: RunInner) -> None:
    """With ``trio_mode = true`` the fixtures and the documented recipes just work."""
    result = run_inner(RECIPES)
    result.assert_outcomes(passed=3)


def test_fixtures_work_with_the_explicit_trio_marker(run_inner: RunInner) -> None:
    """Without trio mode, ``@pytest.mark.trio`` tests get the same fixtures."""
    result = run_inner("pytestmark = pytest.mark.trio\n" + RECIPES, trio_mode=False)
    result.assert_outcomes(passed=3)


def test_the_supervisor_runs_in_the_tests_trio_run(run_inner: RunInner) -> None:
    """The fixture's supervisor shares the test's clock and trio run."""
    result = run_inner(
        """
        async def test_same_run(supervisor, autojump_clock):
            async def now():
                return trio.current_time()

            await trio.sleep(5.0)
            outcome = await (await supervisor.add(TaskSpec.once("t", now))).wait()
            assert outcome.value == trio.current_time() == 5.0
        """
    )
    result.assert_outcomes(passed=1)


# -- teardown checks -------------------------------------------------------------------------


def test_a_forced_teardown_fails_the_test(run_inner: RunInner) -> None:
    """A task that overstays grace at teardown fails the test, naming it."""
    result = run_inner(
        """
        @pytest.mark.taskvisor_config(grace=1.0)
        async def test_leaves_a_stubborn_task(supervisor, autojump_clock):
            await supervisor.add(TaskSpec.once("stubborn", stubborn))
            await trio.testing.wait_all_tasks_blocked()
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*shutdown had to force 'stubborn' after grace=1.0 s*taskvisor_allow_force*"]
    )


def test_allow_force_accepts_a_forced_teardown(run_inner: RunInner) -> None:
    """``taskvisor_allow_force`` opts out of the force check."""
    result = run_inner(
        """
        @pytest.mark.taskvisor_allow_force
        @pytest.mark.taskvisor_config(grace=1.0)
        async def test_leaves_a_stubborn_task(supervisor, event_recorder, autojump_clock):
            await supervisor.add(TaskSpec.once("stubborn", stubborn))
            await trio.testing.wait_all_tasks_blocked()
        """
    )
    result.assert_outcomes(passed=1)


def test_tasks_stopped_within_grace_pass(run_inner: RunInner) -> None:
    """Tasks still running at teardown are fine when they stop within grace."""
    result = run_inner(
        """
        async def test_leaves_a_task(supervisor):
            await supervisor.add(TaskSpec.once("forever", trio.sleep_forever))
        """
    )
    result.assert_outcomes(passed=1)


BROKEN_SUBSCRIBER = """
class Broken:
    async def on_event(self, event):
        raise RuntimeError("boom")


@pytest.fixture
def taskvisor_subscribers():
    return [Broken()]
"""


def test_a_failing_subscriber_fails_the_test(run_inner: RunInner) -> None:
    """SUBSCRIBER_FAILED seen during the test fails it, with the subscriber's error."""
    result = run_inner(
        BROKEN_SUBSCRIBER
        + """
async def test_runs_work(supervisor):
    await (await supervisor.add(TaskSpec.once("t", trio.lowlevel.checkpoint))).wait()
"""
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*subscriber 'Broken' failed*: RuntimeError: boom*"])


def test_allow_subscriber_failure_accepts_it(run_inner: RunInner) -> None:
    """``taskvisor_allow_subscriber_failure`` opts out of the subscriber check."""
    result = run_inner(
        BROKEN_SUBSCRIBER
        + """
@pytest.mark.taskvisor_allow_subscriber_failure
async def test_runs_work(supervisor, event_recorder):
    await (await supervisor.add(TaskSpec.once("t", trio.lowlevel.checkpoint))).wait()
    failed = await event_recorder.wait_for(EventKind.SUBSCRIBER_FAILED)
    assert failed.name == "Broken"
"""
    )
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        pytest.param(
            'EventRecorder(name="audit")', "<trio_taskvisor.testing.EventRecorder", id="one"
        ),
        pytest.param('"audit"', "'audit'", id="str"),
    ],
)
def test_subscribers_that_are_no_collection_are_told_what_it_must_be(
    run_inner: RunInner, value: str, shown: str
) -> None:
    """A ``taskvisor_subscribers`` that returns one subscriber (or a str) fails the test,
    naming the fixture and what it must return (it failed with "Value after * must be
    an iterable", or one subscriber per character)."""
    result = run_inner(
        f"""
        from trio_taskvisor.testing import EventRecorder


        @pytest.fixture
        def taskvisor_subscribers():
            return {value}


        async def test_runs(supervisor):
            pass
        """
    )
    result.assert_outcomes(failed=1)
    assert (
        "TypeError: the taskvisor_subscribers fixture must return an iterable of subscribers"
        f" (a list: [subscriber] for one), got {shown}"
    ) in result.stdout.str()


def test_a_failing_test_reports_its_own_error(run_inner: RunInner) -> None:
    """A test that fails with tasks running reports its assertion; teardown still runs."""
    result = run_inner(
        """
        async def test_fails(supervisor):
            await supervisor.add(TaskSpec.once("forever", trio.sleep_forever))
            assert 1 == 2, "the test's own failure"
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the test's own failure*"])
    result.stdout.no_fnmatch_line("*had to force*")


def test_a_test_outside_a_trio_run_is_told_what_it_needs(run_inner: RunInner) -> None:
    """Without trio mode or the marker, a test using ``supervisor`` (async or not) fails
    at setup naming what it needs, each one (pytest alone failed the second inside its
    own fixture code, with a bare AssertionError)."""
    result = run_inner(
        """
        async def test_async(supervisor):
            pass

        def test_sync(supervisor):
            pass
        """,
        trio_mode=False,
    )
    result.assert_outcomes(errors=2)
    for name in ("test_async", "test_sync"):
        result.stdout.fnmatch_lines(
            [
                f"*{name} uses the supervisor fixture, which runs in the test's trio run: make"
                " it an async trio test (pytest-trio: trio_mode = true in the pytest"
                " configuration, or @pytest.mark.trio)*"
            ]
        )
    result.stdout.no_fnmatch_line("*AssertionError*")


ANYIO_ON_ASYNCIO = {
    "parametrized": """
        @pytest.mark.anyio
        @pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
        async def test_anyio(supervisor):
            await (await supervisor.add(TaskSpec.once("t", trio.lowlevel.checkpoint))).wait()
        """,
    "fixture": """
        @pytest.fixture
        def anyio_backend():
            return "asyncio"


        @pytest.mark.anyio
        async def test_anyio(supervisor):
            pass
        """,
}


@pytest.mark.parametrize("how", ANYIO_ON_ASYNCIO)
def test_an_anyio_test_on_asyncio_is_told_what_it_needs(run_inner: RunInner, how: str) -> None:
    """``@pytest.mark.anyio`` on the trio backend gets the fixtures; on asyncio (a
    parameter, or an ``anyio_backend`` fixture) the test fails at setup saying what it
    needs (it crashed inside trio: "'RunContext' object has no attribute 'runner'")."""
    result = run_inner(ANYIO_ON_ASYNCIO[how], trio_mode=False)
    if how == "parametrized":
        result.assert_outcomes(passed=1, errors=1)
    else:
        result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_anyio*",
            "*test_anyio* uses the supervisor fixture, which runs in the test's trio run, and"
            " runs on anyio's asyncio backend: run it on anyio's trio backend only (an"
            " anyio_backend fixture that returns 'trio')*",
        ]
    )
    result.stdout.no_fnmatch_line("*RunContext*")


def test_an_anyio_test_whose_critical_task_fails_fails_and_the_run_goes_on(
    pytester: pytest.Pytester, plugin_args: list[str]
) -> None:
    """On anyio's trio backend, which runs the fixture's setup, the test and its
    teardown in one task, a critical task's failure fails the test with
    ``CriticalTaskError`` (at teardown: anyio tears fixtures down after the test), and
    the next test runs. Before, the supervisor's body scope covered the test: trio's
    ``Cancelled`` left the test, and pytest hung for ever at the fixture's teardown."""
    pytester.makepyfile(
        test_inner=COMMON
        + textwrap.dedent(
            """
            @pytest.fixture
            def anyio_backend():
                return "trio"


            async def boom():
                raise ValueError("kaboom")


            @pytest.mark.anyio
            async def test_critical(supervisor):
                await supervisor.add(TaskSpec.once("crit", boom, critical=True))
                await trio.sleep(0.5)


            @pytest.mark.anyio
            async def test_next(supervisor):
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess("--strict-markers", *plugin_args, timeout=60)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*CriticalTaskError*critical task 'crit'*kaboom*"])
    result.stdout.no_fnmatch_line("*trio.Cancelled*")


def test_a_critical_failure_says_where_to_catch_it(run_inner: RunInner) -> None:
    """A critical task's failure fails a test that uses ``supervisor``, even one that
    wraps it in ``pytest.raises(CriticalTaskError)``: the fixture raises it, outside the
    test's body. The error now carries a note that says so, and the recipe it gives (a
    supervisor of the test's own) passes. Before, the test failed with the bare
    ``CriticalTaskError`` raised from the fixture, and nothing said why ``pytest.raises``
    had not caught it."""
    result = run_inner(
        """
        from trio_taskvisor import CriticalTaskError, open_supervisor


        async def boom():
            raise ValueError("kaboom")


        async def test_in_the_fixture(supervisor, autojump_clock):
            with pytest.raises(CriticalTaskError):
                await supervisor.add(TaskSpec.once("crit", boom, critical=True))
                await trio.sleep(1.0)


        async def test_as_the_note_says(autojump_clock):
            with pytest.raises(CriticalTaskError) as caught:
                async with open_supervisor(SupervisorConfig()) as sup:
                    await sup.add(TaskSpec.once("crit", boom, critical=True))
                    await trio.sleep_forever()
            assert caught.value.name == "crit"
            assert isinstance(caught.value.outcome.error, ValueError)
        """
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*CriticalTaskError: critical task 'crit' (#*) ended failed: kaboom",
            "*The supervisor fixture raised this when it closed, outside the test's body*"
            " a pytest.raises(CriticalTaskError) in the test cannot catch it. To test a"
            " critical task's failure, open a supervisor in the test: with"
            " pytest.raises(CriticalTaskError): async with open_supervisor(...) as sup: ...",
        ]
    )


@pytest.mark.parametrize(
    "marks",
    [
        pytest.param("", id="trio-mode"),
        pytest.param("@pytest.mark.trio", id="trio-marker"),
    ],
)
def test_an_anyio_test_that_pytest_trio_runs_too_is_told_to_use_one(
    run_inner: RunInner, marks: str
) -> None:
    """Under ``trio_mode = true`` (or with ``@pytest.mark.trio`` too), an anyio test that
    uses ``supervisor`` fails at setup, saying that both plugins run it and how to use
    one. Before, it failed inside trio with "Attempted to call run() from inside a
    run()", naming neither plugin nor the fixture."""
    result = run_inner(
        f"""
        @pytest.fixture
        def anyio_backend():
            return "trio"


        @pytest.mark.anyio
        {marks}
        async def test_both(supervisor):
            pass


        @pytest.mark.anyio
        async def test_no_fixture():
            await trio.lowlevel.checkpoint()
        """,
        trio_mode=not marks,
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_both*",
            "test_both uses the supervisor fixture and both pytest-trio (trio_mode = true or"
            " @pytest.mark.trio) and anyio (@pytest.mark.anyio or the anyio_backend fixture)"
            " run it: * Use one: under trio_mode = true drop the anyio marker, or for anyio"
            " drop trio_mode and @pytest.mark.trio",
        ]
    )
    result.stdout.no_fnmatch_line("*RuntimeError*")


HYPOTHESIS = """
from hypothesis import HealthCheck, given, settings, strategies as st

from trio_taskvisor import open_supervisor

EXAMPLES = settings(
    max_examples=3, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
"""


def test_a_hypothesis_test_under_pytest_trio_is_told_to_open_its_own(
    run_inner: RunInner,
) -> None:
    """pytest-trio runs each example of a ``@given`` test in a trio run of its own but
    hands every example after the first the fixture value of the example before: a
    closed supervisor (``SupervisorClosedError``, then pytest-trio's "cancelled the test
    but didn't raise an error"), once Hypothesis's function-scoped-fixture health check
    is suppressed. Now such a test fails at setup, saying why and what to do instead,
    and what it says (a supervisor per example) passes."""
    result = run_inner(
        HYPOTHESIS
        + """
@EXAMPLES
@given(st.integers(0, 9))
async def test_fixture(supervisor, n):
    await (await supervisor.add(TaskSpec.once(f"t{n}", trio.lowlevel.checkpoint))).wait()


@EXAMPLES
@given(st.integers(0, 9))
async def test_own(n):
    async with open_supervisor(SupervisorConfig()) as sup:
        await (await sup.add(TaskSpec.once(f"t{n}", trio.lowlevel.checkpoint))).wait()
"""
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_fixture*",
            "test_fixture uses the supervisor fixture in a Hypothesis test (@given), which"
            " pytest-trio runs in a trio run per example: from the second example on, the"
            " test gets the supervisor of the example before, closed. Open a supervisor per"
            " example in the test instead: async with open_supervisor(...) as sup: ...",
        ]
    )


def test_a_hypothesis_test_under_anyio_shares_one_supervisor(run_inner: RunInner) -> None:
    """anyio runs every example of a ``@given`` test in one trio run, with one
    ``supervisor``: the examples share it, as Hypothesis's health check warns of
    function-scoped fixtures (what the plugin documents)."""
    result = run_inner(
        HYPOTHESIS
        + """
SEEN = set()


@pytest.fixture
def anyio_backend():
    return "trio"


@pytest.mark.anyio
@EXAMPLES
@given(st.integers(0, 9))
async def test_shared(supervisor, n):
    SEEN.add(id(supervisor))
    assert len(SEEN) == 1
    assert not supervisor.closing
""",
        trio_mode=False,
    )
    result.assert_outcomes(passed=1)


# -- unobserved failures -------------------------------------------------


def test_an_unobserved_failure_fails_the_test(run_inner: RunInner) -> None:
    """A task that ended FAILED with nobody awaiting its waiter fails the test."""
    result = run_inner(
        """
        async def broken():
            raise ValueError("bad config")


        async def test_forgets_the_waiter(supervisor):
            await supervisor.add(TaskSpec.once("loader", broken))
            await trio.testing.wait_all_tasks_blocked()
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*task 'loader' (#*) ended failed: bad config, and nobody awaited its waiter*"]
    )
    result.stdout.no_fnmatch_line("*ERROR at teardown*")


@pytest.mark.parametrize(
    "look",
    [
        pytest.param("await waiter.wait()", id="wait"),
        pytest.param("waiter.outcome_nowait()", id="outcome-nowait"),
    ],
)
def test_an_observed_failure_passes(run_inner: RunInner, look: str) -> None:
    """``wait()`` or ``outcome_nowait()`` on the waiter observes the failure."""
    result = run_inner(
        f"""
        async def broken():
            raise ValueError("bad config")


        async def test_looks_at_the_outcome(supervisor):
            waiter = await supervisor.add(TaskSpec.restartable("loader", broken, max_retries=1))
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(1.0)
            {look}
        """
    )
    result.assert_outcomes(passed=1)


def test_a_failure_observed_through_a_joiner_passes(run_inner: RunInner) -> None:
    """A JOIN that followed the failed work observes it when its waiter is looked at."""
    result = run_inner(
        """
        async def broken():
            await trio.sleep(1.0)
            raise ValueError("bad config")


        @pytest.mark.taskvisor_config(controller=ControllerConfig())
        async def test_joins(supervisor, autojump_clock):
            await supervisor.submit(ControllerSpec.queue(TaskSpec.once("loader", broken)))
            joiner = await supervisor.submit(
                ControllerSpec.join(TaskSpec.once("j", broken), slot="loader")
            )
            assert (await joiner.wait()).kind is OutcomeKind.FAILED
        """
    )
    result.assert_outcomes(passed=1)


def test_a_joiner_nobody_looked_at_does_not_observe_the_failure(run_inner: RunInner) -> None:
    """A JOIN whose waiter nobody looked at observes nothing."""
    result = run_inner(
        """
        async def broken():
            await trio.sleep(1.0)
            raise ValueError("bad config")


        @pytest.mark.taskvisor_config(controller=ControllerConfig())
        async def test_joins(supervisor, autojump_clock):
            await supervisor.submit(ControllerSpec.queue(TaskSpec.once("loader", broken)))
            await supervisor.submit(ControllerSpec.join(TaskSpec.once("j", broken), slot="loader"))
            await trio.sleep(2.0)
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*task 'loader' (#*) ended failed: bad config, and nobody*"])


@pytest.mark.parametrize(
    "call",
    [
        pytest.param('supervisor.start(TaskSpec.once("loader", broken))', id="start"),
        pytest.param(
            'supervisor.start_in_slot(ControllerSpec.queue(TaskSpec.once("loader", broken)))',
            id="start-in-slot",
        ),
    ],
)
def test_a_failure_start_raised_outcome_error_for_passes(run_inner: RunInner, call: str) -> None:
    """``start()`` raising ``OutcomeError`` for the failure observes it."""
    result = run_inner(
        f"""
        from trio_taskvisor import OutcomeError


        async def broken(*, task_status):
            raise ValueError("bad config")


        @pytest.mark.taskvisor_config(controller=ControllerConfig())
        async def test_starts(supervisor):
            with pytest.raises(OutcomeError):
                await {call}
        """
    )
    result.assert_outcomes(passed=1)


def test_an_unobserved_fatal_outcome_fails_the_test_too(run_inner: RunInner) -> None:
    """FATAL counts, as FAILED does; CANCELLED and COMPLETED never do."""
    result = run_inner(
        """
        from trio_taskvisor import FatalError


        async def fatal():
            raise FatalError("schema 9")


        async def test_mixed(supervisor):
            await supervisor.add(TaskSpec.once("fatal", fatal))
            await supervisor.add(TaskSpec.once("done", trio.lowlevel.checkpoint))
            await supervisor.add(TaskSpec.once("stopped", trio.sleep_forever))
            await trio.testing.wait_all_tasks_blocked()
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*task 'fatal' (#*) ended fatal: schema 9, and nobody*"])
    result.stdout.no_fnmatch_line("*'done'*")
    result.stdout.no_fnmatch_line("*'stopped'*")


def test_allow_failures_accepts_unobserved_failures(run_inner: RunInner) -> None:
    """``taskvisor_allow_failures`` opts out of the check."""
    result = run_inner(
        """
        async def broken():
            raise ValueError("expected")


        @pytest.mark.taskvisor_allow_failures
        async def test_counts_failures(supervisor, event_recorder):
            await supervisor.add(TaskSpec.once("loader", broken))
            finished = await event_recorder.wait_for(EventKind.TASK_FINISHED, name="loader")
            assert finished.outcome is OutcomeKind.FAILED
        """
    )
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "marker",
    ["taskvisor_allow_failures", "taskvisor_allow_force", "taskvisor_allow_subscriber_failure"],
)
def test_an_allowance_given_arguments_is_told_it_takes_none(
    run_inner: RunInner, marker: str
) -> None:
    """``@pytest.mark.taskvisor_allow_failures("loader")`` reads as allowing one task's
    failures; it allowed every task's. Now the test fails, saying it takes none."""
    result = run_inner(
        f"""
        @pytest.mark.{marker}("loader")
        async def test_marked(supervisor):
            pass
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*@pytest.mark.{marker} takes no arguments*('loader',)*"])


# -- configuration ---------------------------------------------------------------------------


def test_config_marker_fields_build_the_config(run_inner: RunInner) -> None:
    """``taskvisor_config(**fields)`` becomes the fixture's ``SupervisorConfig``."""
    result = run_inner(
        """
        @pytest.mark.taskvisor_config(grace=1.0, controller=ControllerConfig())
        async def test_configured(supervisor):
            assert supervisor.config.grace == 1.0
            spec = ControllerSpec.queue(TaskSpec.once("t", trio.lowlevel.checkpoint), slot="k")
            outcome = await (await supervisor.submit(spec)).wait()
            assert outcome.kind is OutcomeKind.COMPLETED


        async def test_default(supervisor):
            assert supervisor.config == SupervisorConfig()
        """
    )
    result.assert_outcomes(passed=2)


def test_config_marker_fields_replace_those_of_a_config(run_inner: RunInner) -> None:
    """A positional config with fields: the fields win; the closest marker wins."""
    result = run_inner(
        """
        pytestmark = pytest.mark.taskvisor_config(SupervisorConfig(grace=3.0, max_concurrent=2))


        @pytest.mark.taskvisor_config(SupervisorConfig(grace=3.0, max_concurrent=2), grace=1.0)
        async def test_evolved(supervisor):
            assert supervisor.config.grace == 1.0
            assert supervisor.config.max_concurrent == 2


        async def test_module_marker(supervisor):
            assert supervisor.config.grace == 3.0
        """
    )
    result.assert_outcomes(passed=2)


def test_config_marker_takes_the_config_by_keyword(run_inner: RunInner) -> None:
    """``taskvisor_config(config=..., **fields)``, as the marker's signature reads: the
    config alone, or with fields that replace its own."""
    result = run_inner(
        """
        CONFIG = SupervisorConfig(grace=3.0, max_concurrent=2)


        @pytest.mark.taskvisor_config(config=CONFIG)
        async def test_config(supervisor):
            assert supervisor.config == CONFIG


        @pytest.mark.taskvisor_config(config=CONFIG, grace=1.0)
        async def test_evolved(supervisor):
            assert supervisor.config == SupervisorConfig(grace=1.0, max_concurrent=2)


        @pytest.mark.taskvisor_config(config=None, grace=1.0)
        async def test_no_config(supervisor):
            assert supervisor.config == SupervisorConfig(grace=1.0)
        """
    )
    result.assert_outcomes(passed=3)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param('{"grace": 1.0}', id="positional"),
        pytest.param('config={"grace": 1.0}', id="keyword"),
    ],
)
def test_config_marker_rejects_what_is_not_a_config(run_inner: RunInner, args: str) -> None:
    """A config, positional or by keyword, that is not a SupervisorConfig is a TypeError."""
    result = run_inner(
        f"""
        @pytest.mark.taskvisor_config({args})
        async def test_bad(supervisor):
            pass
        """
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*taskvisor_config needs a SupervisorConfig, got {'grace': 1.0}*"])


def test_config_marker_rejects_a_config_given_twice(run_inner: RunInner) -> None:
    """A config both positional and by keyword is a TypeError that says so."""
    result = run_inner(
        """
        @pytest.mark.taskvisor_config(SupervisorConfig(), config=SupervisorConfig())
        async def test_bad(supervisor):
            pass
        """
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*taskvisor_config got its config twice: positionally and as config=*"]
    )


def test_config_fixture_can_be_overridden(
    pytester: pytest.Pytester,
    run_inner: RunInner,
) -> None:
    """A ``taskvisor_config`` fixture in a conftest sets the default of a directory."""
    pytester.makeconftest(
        """
        import pytest
        from trio_taskvisor import SupervisorConfig

        @pytest.fixture
        def taskvisor_config():
            return SupervisorConfig(grace=2.5)
        """
    )
    result = run_inner(
        """
        async def test_overridden(supervisor):
            assert supervisor.config.grace == 2.5
        """
    )
    result.assert_outcomes(passed=1)


def test_jitter_can_be_seeded(run_inner: RunInner) -> None:
    """``random=random.Random(seed)`` makes jittered backoff reproducible."""
    result = run_inner(
        """
        @pytest.mark.taskvisor_config(random=random.Random(0))
        async def test_seeded(supervisor, event_recorder, autojump_clock):
            waiter = await supervisor.add(
                TaskSpec.restartable("t", flaky, backoff=BackoffPolicy(first=1.0))
            )
            await waiter.wait()
            delays = [e.delay for e in event_recorder.of(EventKind.BACKOFF_SCHEDULED)]
            rng = random.Random(0)
            assert delays == [BackoffPolicy(first=1.0).delay_for_retry(n, rng) for n in (0, 1)]
        """
    )
    result.assert_outcomes(passed=1)


# -- the plugin itself -------------------------------------------------------------------------


def test_markers_are_registered(pytester: pytest.Pytester, plugin_args: list[str]) -> None:
    """``pytest --markers`` lists the four markers (``--strict-markers`` accepts them)."""
    result = pytester.runpytest("--markers", *plugin_args)
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.taskvisor_config(config=None, **fields):*",
            "@pytest.mark.taskvisor_allow_force:*",
            "@pytest.mark.taskvisor_allow_subscriber_failure:*",
            "@pytest.mark.taskvisor_allow_failures:*",
        ]
    )


def test_fixtures_are_not_autouse(run_inner: RunInner) -> None:
    """A test that asks for none of the fixtures gets none of them."""
    result = run_inner(
        """
        async def test_plain():
            await trio.lowlevel.checkpoint()


        def test_sync():
            pass


        def test_asks_for_the_recorder(event_recorder):
            pass
        """,
        "--setup-plan",
    )
    # Fixtures in use are listed: only the one a test asked for.
    result.stdout.fnmatch_lines(["*SETUP*F event_recorder*"])
    result.stdout.no_fnmatch_line("*supervisor*")
    result.stdout.no_fnmatch_line("*taskvisor_*")


def test_event_recorder_works_in_a_sync_test(run_inner: RunInner) -> None:
    """``event_recorder`` alone is an ordinary fixture, no trio run needed."""
    result = run_inner(
        """
        def test_sync(event_recorder):
            assert event_recorder.events == []
        """
    )
    result.assert_outcomes(passed=1)


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_importing_the_package_does_not_import_the_plugin() -> None:
    """``import trio_taskvisor`` neither loads the plugin nor pytest."""
    done = python(
        "import sys, trio_taskvisor, trio_taskvisor.testing\n"
        "assert 'trio_taskvisor.pytest_plugin' not in sys.modules\n"
        "assert 'pytest' not in sys.modules\n"
    )
    assert done.returncode == 0, done.stderr


def test_the_plugin_does_not_import_pytest_trio() -> None:
    """The plugin imports without pytest-trio; only its async fixture needs it."""
    done = python(
        "import sys\n"
        "sys.modules['pytest_trio'] = None  # importing it would raise ImportError\n"
        "import trio_taskvisor.pytest_plugin\n"
    )
    assert done.returncode == 0, done.stderr


def test_the_entry_point_is_declared() -> None:
    """pyproject.toml registers the plugin as a ``pytest11`` entry point."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"trio_taskvisor": "trio_taskvisor.pytest_plugin"}


# -- exception groups mixing trio.Cancelled --------------------------------------------------

NURSERY_RAISING = """
def nursery_raising(exc):
    async def body():
        async def child():
            try:
                await trio.sleep_forever()
            finally:
                raise exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await trio.sleep_forever()

    return body


async def test_leaves_it_running(supervisor, autojump_clock):
    await supervisor.add(TaskSpec.once("t", nursery_raising(EXC)))
    await trio.testing.wait_all_tasks_blocked()
"""


def test_a_task_whose_nursery_raises_on_the_teardown_stop_passes(run_inner: RunInner) -> None:
    """[Cancelled, ValueError] from a task stopped at teardown is that task's business."""
    result = run_inner(NURSERY_RAISING.replace("EXC", 'ValueError("x")'))
    result.assert_outcomes(passed=1)


def test_a_task_whose_nursery_raises_keyboard_interrupt_fails_the_test(
    run_inner: RunInner, pytester: pytest.Pytester
) -> None:
    """[Cancelled, KeyboardInterrupt] at teardown: the test fails with it, not with Cancelled."""
    pytester.makeconftest(
        """
        import pytest
        import trio


        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item, call):
            report = yield
            if call.excinfo is not None:
                exc = call.excinfo.value
                if isinstance(exc, BaseExceptionGroup):
                    cancelled = exc.split(trio.Cancelled)[0] is not None
                    interrupted = exc.split(KeyboardInterrupt)[0] is not None
                    print(f"\\ncancelled={cancelled} interrupted={interrupted}")
            return report
        """
    )
    result = run_inner(NURSERY_RAISING.replace("EXC", "KeyboardInterrupt()"), "-s")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cancelled=False interrupted=True*"])

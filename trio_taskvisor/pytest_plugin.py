"""pytest plugin: a supervisor per test, for pytest-trio test suites.

Installed with the package (a ``pytest11`` entry point), so its fixtures are available
in every test of a project that has trio_taskvisor installed; it defines fixtures,
markers and one check (nothing autouse). The async fixture needs pytest-trio: use it in
trio tests, with ``trio_mode = true`` or ``@pytest.mark.trio`` (or anyio's
``@pytest.mark.anyio`` on the trio backend); a test that uses it otherwise fails at
setup with a message that says so. Use one of the two: a test that both run
(``trio_mode = true`` and ``@pytest.mark.anyio``) fails at setup saying so, where trio
alone would say "Attempted to call run() from inside a run()".

Hypothesis: a ``@given`` test that uses ``supervisor`` and that pytest-trio runs fails
at setup. pytest-trio runs each example in a trio run of its own, but hands every
example after the first the fixture value of the example before, a supervisor that is
closed by then; open a supervisor per example in the test instead (``async with
open_supervisor(...) as sup:``). anyio runs all the examples in one trio run, with one
supervisor that they share, as Hypothesis's ``function_scoped_fixture`` health check
warns (suppress it if sharing is what the test wants); ``event_recorder`` is shared the
same way under both.

Fixtures
--------
``supervisor``
    An open ``Supervisor``, started in the test's trio run (it can use the test's
    clock) and shut down at teardown. The test **fails** if that shutdown had to force
    a task (``GraceExceededError``), if a subscriber failed during the test
    (``SUBSCRIBER_FAILED``), or if a task ended ``FAILED``, ``FATAL`` or ``PANICKED``
    and nobody called ``wait()`` or ``outcome_nowait()`` on its waiter or on that of a
    JOIN that followed it, and no ``start()`` raised ``OutcomeError`` for it (an
    unobserved failure), unless the test is marked ``taskvisor_allow_force`` /
    ``taskvisor_allow_subscriber_failure`` / ``taskvisor_allow_failures``. Under
    pytest-trio the check runs as part of the test, so a failure here is a test
    failure, not a teardown error; anyio tears fixtures down after the test, so there
    it is an error at teardown. A critical task's failure fails the test with
    ``CriticalTaskError``; under pytest-trio the test is cancelled at once, under anyio
    it runs on (anyio runs the test in the fixture's own task, where the supervisor's
    body scope would cancel it with a ``Cancelled`` that leaves the test: the
    supervisor is opened in a task of its own there). The fixture raises it, outside
    the test's body, so a ``pytest.raises(CriticalTaskError)`` in the test cannot catch
    it (the error carries a note that says so): a test of a critical task's failure
    opens a supervisor of its own (see Recipes).
``event_recorder``
    A ``trio_taskvisor.testing.EventRecorder``, subscribed to ``supervisor`` when both
    are used. Alone, it is a recorder to pass to your own ``open_supervisor``.
``taskvisor_config``
    The ``SupervisorConfig`` of ``supervisor``: ``SupervisorConfig()`` (the library's
    defaults, ``grace=60.0``), or what the ``taskvisor_config`` marker says. Override
    the fixture in a ``conftest.py`` to change the default of a whole directory.
``taskvisor_subscribers``
    More subscribers for ``supervisor`` (default: none). Override it to add some: it
    returns an iterable of them (``[subscriber]`` for one).

Markers
-------
``@pytest.mark.taskvisor_config(config=None, **fields)``
    ``fields`` are ``SupervisorConfig`` fields; with a ``config`` too, they replace its
    fields (``attrs.evolve``). The closest marker wins (function, then class, then
    module ``pytestmark``)::

        @pytest.mark.taskvisor_config(grace=1.0, controller=ControllerConfig())

``@pytest.mark.taskvisor_allow_force``
    Teardown may force tasks (a test of the grace window itself). A test that calls
    ``await supervisor.shutdown()`` and expects ``GraceExceededError`` needs it too:
    the shared shutdown's result is raised again when the fixture closes.
``@pytest.mark.taskvisor_allow_subscriber_failure``
    A subscriber may fail (a test of a failing subscriber).
``@pytest.mark.taskvisor_allow_failures``
    Tasks may fail without anyone looking at their outcome (a test of failure logs,
    metrics or events). Looking at the waiter (``wait()``, ``outcome_nowait()``, or
    ``start()`` / ``start_in_slot()`` raising ``OutcomeError`` for it), or at the
    waiter of a JOIN that followed the task, observes a failure and needs no marker.

Recipes
-------
Virtual time: request pytest-trio's ``autojump_clock``. Backoff, timeouts and grace
windows then take no real time, the clock jumps only when every task is blocked, and
durations are exact::

    async def test_retries_back_off(supervisor, autojump_clock):
        t0 = trio.current_time()
        waiter = await supervisor.add(
            TaskSpec.restartable("t", flaky, backoff=BackoffPolicy.constant(2.0))
        )
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        assert trio.current_time() - t0 == 4.0  # two failures, two 2 s back-offs

Exact event times: ``TaskEvent.time`` is ``trio.current_time()`` at publication, so
compare differences with the clock of the test::

    async def test_backoff_is_scheduled_after_the_failure(
        supervisor, event_recorder, autojump_clock
    ):
        await supervisor.add(TaskSpec.restartable("t", flaky, backoff=...))
        failed = await event_recorder.wait_for(EventKind.ATTEMPT_FAILED, name="t")
        started = await event_recorder.wait_for(EventKind.ATTEMPT_STARTING, attempt=2)
        assert started.time - failed.time == 2.0

A critical task's failure, when it is the point of the test: ``open_supervisor`` in
the test raises ``CriticalTaskError`` where ``pytest.raises`` sees it::

    async def test_a_dead_database_stops_the_service(autojump_clock):
        with pytest.raises(CriticalTaskError) as caught:
            async with open_supervisor(SupervisorConfig()) as sup:
                await sup.add(TaskSpec.once("db", connect, critical=True))
                await trio.sleep_forever()
        assert caught.value.name == "db"

Wait for events with ``await event_recorder.wait_for(kind, **fields)`` rather than
sleeping; ``await trio.testing.wait_all_tasks_blocked()`` lets every task (the
subscriber lanes included) run until it blocks. Seed the jitter with
``@pytest.mark.taskvisor_config(random=random.Random(0))``. A test that leaves tasks
running ends them at teardown: with ``autojump_clock`` a ``defer_cancel()`` block
costs no real time, but under the real clock the default 60 s grace is real, and the
force fails the test; mark it ``taskvisor_allow_force`` if the force is the point.

Events go through two bounded queues: the supervisor's bus (``bus_capacity``, 1024
events not yet fanned out; its drops are counted in ``statistics().events_dropped``,
with no event to say so) and ``event_recorder``'s own (``queue_capacity``, 1024; its
drops are announced by ``SUBSCRIBER_OVERFLOW``). A burst larger than that (an
``add_batch`` of a thousand tasks publishes several thousand events) loses events: a
``wait_for`` of a lost one waits for ever, and the subscriber failure check could miss
one. Raise both for such a test: ``@pytest.mark.taskvisor_config(bus_capacity=...)``,
and an ``event_recorder`` fixture of its own returning
``EventRecorder(queue_capacity=...)``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence

import attrs
import pytest
import trio

from ._bus import Subscriber
from ._config import SupervisorConfig
from ._events import EventKind
from ._exceptions import CriticalTaskError, GraceExceededError
from ._record import TaskRecord
from ._supervisor import Supervisor, open_keeping_failures
from .testing import EventRecorder

__all__ = [
    "event_recorder",
    "pytest_configure",
    "pytest_runtest_setup",
    "supervisor",
    "taskvisor_config",
    "taskvisor_subscribers",
]

_ALLOW_FORCE = "taskvisor_allow_force"
_ALLOW_SUBSCRIBER_FAILURE = "taskvisor_allow_subscriber_failure"
_ALLOW_FAILURES = "taskvisor_allow_failures"
_CONFIG = "taskvisor_config"
_CRITICAL_NOTE = (
    "The supervisor fixture raised this when it closed, outside the test's body (under "
    "pytest-trio the failure cancels the test at once): a pytest.raises(CriticalTaskError) "
    "in the test cannot catch it. To test a critical task's failure, open a supervisor in "
    "the test: with pytest.raises(CriticalTaskError): async with open_supervisor(...) as "
    "sup: ..."
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers (so ``--strict-markers`` accepts them)."""
    config.addinivalue_line(
        "markers",
        f"{_CONFIG}(config=None, **fields): the SupervisorConfig of the trio_taskvisor "
        "`supervisor` fixture (fields replace those of config)",
    )
    config.addinivalue_line(
        "markers",
        f"{_ALLOW_FORCE}: the `supervisor` fixture's teardown may force tasks "
        "(GraceExceededError does not fail the test)",
    )
    config.addinivalue_line(
        "markers",
        f"{_ALLOW_SUBSCRIBER_FAILURE}: a subscriber of the `supervisor` fixture may fail "
        "(SUBSCRIBER_FAILED does not fail the test)",
    )
    config.addinivalue_line(
        "markers",
        f"{_ALLOW_FAILURES}: tasks of the `supervisor` fixture may end FAILED, FATAL or "
        "PANICKED without anyone awaiting their waiters",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses ``supervisor`` but runs in no trio run fails at setup, saying what
    it needs. (pytest alone says that it "requested an async fixture" that nothing
    handled, and the next such test of the session then fails inside pytest.) One that
    anyio runs on its asyncio backend is told so by the fixture itself. One that both
    pytest-trio and anyio run fails at setup too, naming both (trio alone says "Attempted
    to call run() from inside a run()"). So does a Hypothesis test that pytest-trio
    runs (every example after the first would get a closed supervisor)."""
    fixturenames = getattr(item, "fixturenames", ())
    if "supervisor" not in fixturenames:
        return
    runner = item.get_closest_marker("trio") or item.get_closest_marker("anyio")
    if runner is None:
        pytest.fail(
            f"{item.name} uses the supervisor fixture, which runs in the test's trio run: "
            "make it an async trio test (pytest-trio: trio_mode = true in the pytest "
            "configuration, or @pytest.mark.trio)",
            pytrace=False,
        )
    if item.get_closest_marker("trio") is None:
        return
    if "anyio_backend" in fixturenames:
        pytest.fail(
            f"{item.name} uses the supervisor fixture and both pytest-trio (trio_mode = true "
            "or @pytest.mark.trio) and anyio (@pytest.mark.anyio or the anyio_backend "
            "fixture) run it: anyio runs the fixture in a trio run and pytest-trio the test "
            'in another ("Attempted to call run() from inside a run()"). Use one: under '
            "trio_mode = true drop the anyio marker, or for anyio drop trio_mode and "
            "@pytest.mark.trio",
            pytrace=False,
        )
    if hasattr(getattr(item, "obj", None), "hypothesis"):
        pytest.fail(
            f"{item.name} uses the supervisor fixture in a Hypothesis test (@given), which "
            "pytest-trio runs in a trio run per example: from the second example on, the "
            "test gets the supervisor of the example before, closed. Open a supervisor per "
            "example in the test instead: async with open_supervisor(...) as sup: ...",
            pytrace=False,
        )


@pytest.fixture
def taskvisor_config(request: pytest.FixtureRequest) -> SupervisorConfig:
    """The ``SupervisorConfig`` of ``supervisor``, from the ``taskvisor_config`` marker."""
    marker = request.node.get_closest_marker(_CONFIG)
    if marker is None:
        return SupervisorConfig()
    if len(marker.args) > 1:
        raise TypeError(
            f"@pytest.mark.{_CONFIG} takes at most one positional argument (a "
            f"SupervisorConfig), got {len(marker.args)}"
        )
    fields = dict(marker.kwargs)
    if marker.args and "config" in fields:
        raise TypeError(f"@pytest.mark.{_CONFIG} got its config twice: positionally and as config=")
    base = marker.args[0] if marker.args else fields.pop("config", None)
    if base is None:
        return SupervisorConfig(**fields)
    if not isinstance(base, SupervisorConfig):
        raise TypeError(f"@pytest.mark.{_CONFIG} needs a SupervisorConfig, got {base!r}")
    return attrs.evolve(base, **fields)


@pytest.fixture
def taskvisor_subscribers() -> Sequence[Subscriber]:
    """Subscribers of ``supervisor`` besides ``event_recorder``: none by default."""
    return ()


@pytest.fixture
def event_recorder() -> EventRecorder:
    """An ``EventRecorder``; subscribed to ``supervisor`` when the test uses both."""
    return EventRecorder()


@pytest.fixture
async def supervisor(
    request: pytest.FixtureRequest,
    taskvisor_config: SupervisorConfig,
    taskvisor_subscribers: Sequence[Subscriber],
    event_recorder: EventRecorder,
) -> AsyncIterator[Supervisor]:
    """An open supervisor for the test, shut down (and checked) at teardown."""
    node = request.node
    if "anyio_backend" in request.fixturenames and not trio.lowlevel.in_trio_run():
        # The setup check cannot see anyio's backend, a fixture: by default anyio runs
        # the test on each one it has, asyncio included.
        backend = request.getfixturevalue("anyio_backend_name")
        pytest.fail(
            f"{node.name} uses the supervisor fixture, which runs in the test's trio run, "
            f"and runs on anyio's {backend} backend: run it on anyio's trio backend only "
            "(an anyio_backend fixture that returns 'trio')",
            pytrace=False,
        )
    _check_subscribers(taskvisor_subscribers)
    allow_force = _allows(node, _ALLOW_FORCE)
    allow_failure = _allows(node, _ALLOW_SUBSCRIBER_FAILURE)
    allow_task_failures = _allows(node, _ALLOW_FAILURES)
    subscribers: list[Subscriber] = [event_recorder, *taskvisor_subscribers]
    problems: list[str] = []
    failed_tasks: list[tuple[TaskRecord, list[TaskRecord]]] = []
    opened = _in_own_task if "anyio_backend" in request.fixturenames else open_keeping_failures
    try:
        async with opened(taskvisor_config, subscribers, failed_tasks) as sup:
            yield sup
    except CriticalTaskError as exc:
        exc.add_note(_CRITICAL_NOTE)
        raise
    except GraceExceededError as exc:
        if not allow_force:
            problems.append(
                "the supervisor fixture's shutdown had to force "
                f"{', '.join(map(repr, exc.stuck))} "
                f"after grace={exc.grace!r} s (mark the test "
                f"@pytest.mark.{_ALLOW_FORCE} if that is expected)"
            )
    if not allow_failure:
        failures = Counter(
            (event.name, event.reason) for event in event_recorder.of(EventKind.SUBSCRIBER_FAILED)
        )
        problems.extend(
            f"subscriber {name!r} failed{'' if n == 1 else f' ({n} times)'}: {reason} (mark "
            f"the test @pytest.mark.{_ALLOW_SUBSCRIBER_FAILURE} if that is expected)"
            for (name, reason), n in failures.items()
        )
    if not allow_task_failures:
        problems.extend(
            _unobserved(rec)
            for rec, joiners in failed_tasks
            if not rec.observed() and not any(joiner.observed() for joiner in joiners)
        )
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@contextlib.asynccontextmanager
async def _in_own_task(
    config: SupervisorConfig,
    subscribers: Iterable[Subscriber],
    failures: list[tuple[TaskRecord, list[TaskRecord]]],
) -> AsyncGenerator[Supervisor]:
    """``open_keeping_failures`` in a task of its own, whose body waits for the exit:
    what the supervisor raises (``CriticalTaskError``, ``GraceExceededError``) is raised
    at the exit, and a critical failure cancels that task's body, not the caller's."""
    done = trio.Event()
    raised: list[Exception] = []

    async def own(*, task_status: trio.TaskStatus[Supervisor]) -> None:
        started = False
        try:
            async with open_keeping_failures(config, subscribers, failures) as sup:
                task_status.started(sup)
                started = True
                await done.wait()
        except Exception as exc:
            if not started:
                raise
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        try:
            yield await nursery.start(own)
        finally:
            done.set()
    if raised:
        raise raised[0]


def _allows(node: pytest.Item, name: str) -> bool:
    """Whether the test is marked ``name``, an allowance that takes no arguments: one
    given (a task's name, say) would read as allowing that alone, and allow all."""
    marker = node.get_closest_marker(name)
    if marker is not None and (marker.args or marker.kwargs):
        raise TypeError(
            f"@pytest.mark.{name} takes no arguments (it applies to the whole test), "
            f"got {marker.args or marker.kwargs!r}"
        )
    return marker is not None


def _check_subscribers(value: object) -> None:
    # One subscriber instead of a collection would fail as "Value after * must be an
    # iterable", a str as one subscriber per character.
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(
            "the taskvisor_subscribers fixture must return an iterable of subscribers "
            f"(a list: [subscriber] for one), got {value!r}"
        )


def _unobserved(rec: TaskRecord) -> str:
    outcome = rec.final_outcome()
    assert outcome is not None
    return (
        f"task {rec.name!r} ({rec.id}) ended {outcome.kind.value}: {outcome.reason}, and "
        "nobody awaited its waiter (await wait() or call outcome_nowait() on it, or mark "
        f"the test @pytest.mark.{_ALLOW_FAILURES} if that is expected)"
    )

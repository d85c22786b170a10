"""OpenTelemetry: one span per attempt, a child of the submitter's span."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("opentelemetry.trace")
pytest.importorskip("opentelemetry.sdk.trace")

import trio
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, Tracer

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    FatalError,
    OutcomeKind,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.contrib.otel import TracingSubscriber, traced

from helpers import flaky, forever, otel_backoff_notes


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("tests")


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def attr(span: ReadableSpan, key: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(key)


def event_names(span: ReadableSpan) -> Sequence[str]:
    return [e.name for e in span.events]


# -- parentage -------------------------------------------------------------------------------


async def test_attempt_span_is_a_child_of_the_submitters_span(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """``add`` captures the caller's context: its span is the attempt span's parent."""

    async def work() -> None:
        await trio.lowlevel.checkpoint()

    async with open_supervisor() as sup:
        with tracer.start_as_current_span("request") as request:
            waiter = await sup.add(TaskSpec.once("work", traced(work, tracer=tracer)))
        await waiter.wait()
    (attempt,) = spans(
        exporter, "test_attempt_span_is_a_child_of_the_submitters_span.<locals>.work"
    )
    assert attempt.parent is not None
    assert attempt.parent.span_id == request.get_span_context().span_id
    assert attempt.context is not None
    assert attempt.context.trace_id == request.get_span_context().trace_id


async def test_every_retry_is_a_child_of_the_submitters_span(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """Retries run long after ``add`` returned, still under the submitter's span."""
    async with open_supervisor() as sup:
        with tracer.start_as_current_span("request") as request:
            spec = TaskSpec.restartable("flaky", traced(flaky, tracer=tracer, span_name="flaky"))
            waiter = await sup.add(spec)
        await waiter.wait()
    attempts = spans(exporter, "flaky")
    assert len(attempts) == 3
    parent = request.get_span_context().span_id
    assert [s.parent.span_id if s.parent else None for s in attempts] == [parent] * 3


async def test_submitted_work_is_a_child_of_the_submitters_span(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """``submit`` and ``run_in_slot`` capture the caller's context too."""

    async def work() -> int:
        await trio.lowlevel.checkpoint()
        return 1

    job = traced(work, tracer=tracer, span_name="job")
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config) as sup:
        with tracer.start_as_current_span("submitter") as submitter:
            waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("j", job), slot="k"))
        await waiter.wait()
        with tracer.start_as_current_span("caller") as caller:
            assert await sup.run_in_slot("k", job, policy=AdmissionPolicy.JOIN) == 1
    first, second = spans(exporter, "job")
    assert first.parent is not None
    assert first.parent.span_id == submitter.get_span_context().span_id
    assert attr(first, "taskvisor.task.slot") == "k"
    assert second.parent is not None
    assert second.parent.span_id == caller.get_span_context().span_id


async def test_the_attempt_span_is_current_inside_the_attempt(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """Spans the task opens are children of its attempt span."""

    async def work() -> None:
        with tracer.start_as_current_span("inner"):
            await trio.lowlevel.checkpoint()

    async with open_supervisor() as sup:
        await (await sup.add(TaskSpec.once("w", traced(work, tracer=tracer, span_name="a")))).wait()
    (inner,) = spans(exporter, "inner")
    (attempt,) = spans(exporter, "a")
    assert inner.parent is not None
    assert attempt.context is not None
    assert inner.parent.span_id == attempt.context.span_id


# -- attributes and results ------------------------------------------------------------------


async def test_each_attempt_span_carries_task_attributes_and_result(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """Name, id, attempt number, result and exit code; failures are ERROR spans."""
    async with open_supervisor() as sup:
        spec = TaskSpec.restartable("flaky", traced(flaky, tracer=tracer, span_name="flaky"))
        waiter = await sup.add(spec)
        await waiter.wait()
    attempts = spans(exporter, "flaky")
    assert [attr(s, "taskvisor.attempt.number") for s in attempts] == [1, 2, 3]
    assert [attr(s, "taskvisor.attempt.result") for s in attempts] == [
        "failed",
        "failed",
        "succeeded",
    ]
    assert {attr(s, "taskvisor.task.name") for s in attempts} == {"flaky"}
    assert {attr(s, "taskvisor.task.id") for s in attempts} == {int(waiter.id)}
    assert attr(attempts[0], "taskvisor.task.slot") is None
    assert attr(attempts[0], "taskvisor.attempt.exit_code") == 3
    assert attr(attempts[2], "taskvisor.attempt.exit_code") is None
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[0].status.description == "TaskFailure: not yet"
    assert "exception" in event_names(attempts[0])
    assert attempts[2].status.status_code is StatusCode.UNSET


async def test_fatal_attempts_are_marked_fatal(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """A FatalError gives result ``fatal`` and an ERROR status."""

    async def broken() -> None:
        raise FatalError("bad config", exit_code=78)

    async with open_supervisor() as sup:
        await (await sup.add(TaskSpec.restartable("b", traced(broken, tracer=tracer)))).wait()
    (attempt,) = exporter.get_finished_spans()
    assert attr(attempt, "taskvisor.attempt.result") == "fatal"
    assert attr(attempt, "taskvisor.attempt.exit_code") == 78
    assert attempt.status.status_code is StatusCode.ERROR


async def test_an_error_whose_str_raises_is_described_as_python_does(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """The status of an attempt whose exception cannot make its ``str()`` reads
    ``"<exception str() failed>"`` after the type's name, and its exception event says
    the same; an ``exit_code`` that raises is no exit code. Before, making either raised
    in the attempt's span (OpenTelemetry's ``record_exception`` makes the ``str()``
    too): the task ended with that error instead of its own."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise AttributeError("detail")

        @property
        def exit_code(self) -> int:
            raise RuntimeError("no code yet")

    async def broken() -> None:
        raise Unprintable

    async with open_supervisor() as sup:
        await (await sup.add(TaskSpec.once("b", traced(broken, tracer=tracer)))).wait()
    (attempt,) = exporter.get_finished_spans()
    assert attempt.status.description == "Unprintable: <exception str() failed>"
    assert attr(attempt, "taskvisor.attempt.exit_code") is None
    (event,) = attempt.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "<exception str() failed>"


async def test_timed_out_attempts_are_marked_timed_out(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """An attempt cancelled by its timeout gives ``timed_out`` and an ERROR status."""
    async with open_supervisor() as sup:
        spec = TaskSpec.once("slow", traced(forever, tracer=tracer), timeout=2.0)
        assert (await (await sup.add(spec)).wait()).kind is OutcomeKind.FAILED
    (attempt,) = exporter.get_finished_spans()
    assert attr(attempt, "taskvisor.attempt.result") == "timed_out"
    assert attempt.status.status_code is StatusCode.ERROR
    assert attempt.end_time is not None
    assert attempt.start_time is not None


async def test_stopped_attempts_are_cancelled_not_errors(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """A stop within grace gives ``cancelled`` and leaves the status unset."""
    async with open_supervisor() as sup:
        await sup.add(TaskSpec.once("f", traced(forever, tracer=tracer)))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("f")
    (attempt,) = exporter.get_finished_spans()
    assert attr(attempt, "taskvisor.attempt.result") == "cancelled"
    assert attempt.status.status_code is StatusCode.UNSET
    assert event_names(attempt) == []


async def test_force_aborted_attempts_get_a_force_event(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """A stop forced at the grace deadline gives ``force_aborted`` and one span event."""

    async def stubborn() -> None:
        with current_context().defer_cancel():
            await trio.sleep_forever()

    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        waiter = await sup.add(TaskSpec.once("s", traced(stubborn, tracer=tracer)))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("s")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
    (attempt,) = exporter.get_finished_spans()
    assert attr(attempt, "taskvisor.attempt.result") == "force_aborted"
    assert event_names(attempt) == ["taskvisor.force_aborted"]


async def test_subscriber_stamps_the_force_on_a_still_running_attempt(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """An attempt that runs on after the force (its own shield) gets the event once."""
    seen_inside: list[Sequence[str]] = []

    async def shielded() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(10.0)
        # Still running, long after the force: the subscriber has stamped it already.
        span = trace.get_current_span()
        assert isinstance(span, ReadableSpan)
        seen_inside.append(event_names(span))

    async with open_supervisor(
        SupervisorConfig(grace=1.0), subscribers=[TracingSubscriber()]
    ) as sup:
        await sup.add(TaskSpec.once("s", traced(shielded, tracer=tracer)))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("s")
        await sup.wait_idle()
    assert seen_inside == [["taskvisor.force_aborted"]]
    (attempt,) = exporter.get_finished_spans()
    assert attr(attempt, "taskvisor.attempt.result") == "force_aborted"
    assert event_names(attempt) == ["taskvisor.force_aborted"]
    assert attr(attempt, "taskvisor.forced_exit.delay") == 9.0  # forced at 1 s, out at 10 s


async def test_a_forced_attempt_gets_no_attempt_event_and_leaves_no_backoff_note(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """A forced retrying task: its span ends at its exit, no note is left behind."""

    async def fails_slowly() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(3.0)
        raise ValueError("late failure")

    async with open_supervisor(
        SupervisorConfig(grace=1.0), subscribers=[TracingSubscriber()]
    ) as sup:
        waiter = await sup.add(TaskSpec.restartable("s", traced(fails_slowly, tracer=tracer)))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("s")
        await sup.wait_idle()
    assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    (attempt,) = exporter.get_finished_spans()
    assert attr(attempt, "taskvisor.attempt.result") == "force_aborted"
    assert waiter.id not in otel_backoff_notes()


async def test_retries_get_a_backoff_event_with_a_tracing_subscriber(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """Attempts 2 and 3 carry the backoff that preceded them."""
    async with open_supervisor(subscribers=[TracingSubscriber()]) as sup:
        spec = TaskSpec.restartable(
            "flaky",
            traced(flaky, tracer=tracer, span_name="flaky"),
            backoff=BackoffPolicy.constant(0.5),
        )
        await (await sup.add(spec)).wait()
    first, second, third = spans(exporter, "flaky")
    assert "taskvisor.backoff" not in event_names(first)
    for span in (second, third):
        (backoff,) = [e for e in span.events if e.name == "taskvisor.backoff"]
        assert backoff.attributes == {
            "taskvisor.backoff.delay": 0.5,
            "taskvisor.backoff.source": "failure",
            "taskvisor.backoff.reason": "not yet",
        }


async def test_no_backoff_event_without_a_tracing_subscriber(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """The backoff comes from events: without the subscriber retries have none."""
    async with open_supervisor() as sup:
        spec = TaskSpec.restartable("flaky", traced(flaky, tracer=tracer, span_name="flaky"))
        await (await sup.add(spec)).wait()
    assert all(event_names(s) in ([], ["exception"]) for s in spans(exporter, "flaky"))


# -- the wrapper -----------------------------------------------------------------------------


def test_traced_returns_an_async_function_with_the_wrapped_name() -> None:
    """The wrapper is an ``async def`` (TaskSpec accepts it) named like ``fn``."""
    wrapped = traced(flaky)
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "flaky"
    TaskSpec.once("t", wrapped)


async def test_outside_an_attempt_the_span_has_no_task_attributes(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """Calling a traced function directly opens a plain span."""

    async def work() -> int:
        await trio.lowlevel.checkpoint()
        return 7

    assert await traced(work, tracer=tracer, span_name="direct")() == 7
    (span,) = exporter.get_finished_spans()
    assert span.name == "direct"
    assert not span.attributes


async def test_nested_traced_calls_open_plain_child_spans(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """A traced helper called by a traced attempt is a plain child span."""

    async def helper() -> None:
        await trio.lowlevel.checkpoint()

    traced_helper = traced(helper, tracer=tracer, span_name="helper")

    async def work() -> None:
        await traced_helper()

    async with open_supervisor() as sup:
        spec = TaskSpec.once("w", traced(work, tracer=tracer, span_name="attempt"))
        await (await sup.add(spec)).wait()
    (inner,) = spans(exporter, "helper")
    (attempt,) = spans(exporter, "attempt")
    assert not inner.attributes
    assert attr(attempt, "taskvisor.attempt.result") == "succeeded"
    assert inner.parent is not None
    assert attempt.context is not None
    assert inner.parent.span_id == attempt.context.span_id


def stopped_nursery_raising(exc: BaseException) -> Any:
    """A body whose child raises ``exc`` while the stop cancels its nursery."""

    async def body() -> None:
        async def child() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await trio.sleep_forever()

    return body


async def test_stopped_attempt_whose_nursery_raises_is_failed_as_the_actor_says(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """[Cancelled, ValueError] on a stop: ``failed``, like its ATTEMPT_FAILED event."""
    body = traced(stopped_nursery_raising(ValueError("cleanup")), tracer=tracer, span_name="b")
    async with open_supervisor() as sup:
        await sup.add(TaskSpec.once("b", body))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("b")
    (attempt,) = spans(exporter, "b")
    assert attr(attempt, "taskvisor.attempt.result") == "failed"
    assert attempt.status.status_code is StatusCode.ERROR


async def test_stopped_attempt_whose_nursery_raises_keyboard_interrupt_is_cancelled(
    autojump_clock: trio.testing.MockClock, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """[Cancelled, KeyboardInterrupt] on a stop: not a failure of the attempt."""
    body = traced(stopped_nursery_raising(KeyboardInterrupt()), tracer=tracer, span_name="b")
    with pytest.raises(BaseExceptionGroup):  # noqa: PT012
        async with open_supervisor() as sup:
            await sup.add(TaskSpec.once("b", body))
            await trio.testing.wait_all_tasks_blocked()
            await sup.cancel("b")
    (attempt,) = spans(exporter, "b")
    assert attr(attempt, "taskvisor.attempt.result") == "cancelled"


def sync_work() -> None:
    pass


async def async_work() -> None:
    pass


@pytest.mark.parametrize(
    ("make", "shown"),
    [
        pytest.param(lambda: sync_work, "synchronous", id="sync"),
        pytest.param(lambda: lambda: async_work(), "<lambda>", id="lambda"),
        pytest.param(lambda: async_work(), "coroutine object", id="coroutine"),
        pytest.param(lambda: 42, "42", id="int"),
    ],
)
def test_traced_checks_its_function_as_a_task_spec_does(make: Any, shown: str) -> None:
    """``traced`` of what is no async function raises at once, as ``TaskSpec`` does:
    its wrapper is always async, and a synchronous function used to pass and fail
    only when an attempt awaited what it returned."""
    with pytest.raises(TypeError, match="task function must be") as info:
        traced(make())
    assert shown in str(info.value)

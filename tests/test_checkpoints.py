"""Cancellation at every checkpoint of every public async method.

How the sweep works
-------------------
``call_cancelled_at(k, op)`` runs ``await op()`` in the calling task, inside a fresh
cancel scope, and cancels that scope at the ``k``-th *schedule point* of the call:

* ``k == 0``: the scope is cancelled before ``op`` is entered (a caller that is
  already cancelled when it makes the call);
* ``k >= 1``: a ``trio.abc.Instrument`` watches ``after_task_step`` of the calling
  task and, when the task yields to the scheduler for the ``k``-th time since the
  call began, cancels the scope right there, from the run loop. Trio calls
  ``after_task_step`` after it has installed the task's abort function, so a
  cancellable wait (``Event.wait``, a blocked ``send``) is aborted at that very wait;
  a yield that is not a cancel point (the shielded half of ``checkpoint()``, the
  ``cancel_shielded_checkpoint`` after a successful channel ``send``) delivers the
  cancellation at the next cancel point of the call, which is exactly what a
  caller cancelled at that instant would see.

The instrument counts only the caller's own steps, so the count is independent of
what other tasks (registry, controller, actors, lanes) do, and no clock is involved:
the sweep is deterministic under ``MockClock(autojump_threshold=0)``.

``sweep(scenario)`` runs ``scenario(k)`` for ``k = 0, 1, 2, ...``, each in a fresh
supervisor, until the cancellation no longer fires (the call made fewer than ``k``
schedule points), so every schedule point of an uncancelled call is covered. Each
scenario classifies its run as ``NO_TRACE`` (cancelled before intake) or ``DONE``
(intake happened; the request completed as if the caller had stayed) and checks
the state that class promises. The sweep also checks that the classes form a prefix
of ``NO_TRACE`` runs followed only by ``DONE`` runs: once a checkpoint is past
intake, every later one is too.

Decisions the documentation leaves open
-----------------------------------
* ``shutdown()`` starts the shutdown synchronously when called, before its first
  checkpoint, even in an already-cancelled scope: shutdown is not intake and a stop
  request must not be lost (``finally: await sup.shutdown()`` in cancelled code).
  So every ``k`` of ``shutdown()``, ``k == 0`` included, is ``DONE``.
* ``submit()`` and ``PreparedSubmission.submit()`` return the waiter right after the
  command channel accepted the submission; a cancellation that lands at the shielded
  schedule point after the send is delivered at the caller's next checkpoint, after
  the call returned (the call does not raise ``Cancelled``).
* A ``PreparedSubmission`` whose ``submit()`` was cancelled before intake is still
  unused: it can be submitted again (regression test below).
* ``run_in_slot`` has its own contract: after intake, cancelling the caller
  withdraws the work (queued: ``REMOVED_FROM_QUEUE``; admitted or running: stopped
  and waited for), so its ``DONE`` class means "withdrawn", never "completed".
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    EventKind,
    GraceExceededError,
    OutcomeError,
    OutcomeKind,
    RejectionKind,
    Supervisor,
    TaskId,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

from helpers import Body, forever, kinds_of, recorder_waiters, settle, supervisor

MAX_CHECKPOINTS = 64  # a sweep that goes further is a bug in the sweep or the library
NEVER = 10**9  # a k no call reaches: the uncancelled call


# -- the helper --------------------------------------------------------------------------


class _CancelAtStep(trio.abc.Instrument):
    """Cancel ``scope`` when ``task`` yields to the scheduler for the ``k``-th time."""

    def __init__(self, task: trio.lowlevel.Task, k: int, scope: trio.CancelScope) -> None:
        self.task = task
        self.k = k
        self.scope = scope
        self.steps = 0
        self.fired = False

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self.task:
            return
        self.steps += 1
        if self.steps == self.k:
            self.fired = True
            self.scope.cancel(reason=f"cancelled at schedule point {self.k}")


@attrs.define
class Run:
    """What one cancelled call did."""

    k: int
    fired: bool  # the cancellation was requested (k <= the call's schedule points)
    cancelled: bool  # Cancelled escaped the call
    steps: int  # schedule points the call made
    value: object = None
    error: Exception | None = None


async def call_cancelled_at(k: int, op: Callable[[], Awaitable[object]]) -> Run:
    """Await ``op()`` and cancel the caller at its ``k``-th schedule point (0: before)."""
    task = trio.lowlevel.current_task()
    value: object = None
    error: Exception | None = None
    with trio.CancelScope() as scope:
        instrument = _CancelAtStep(task, k, scope)
        if k == 0:
            instrument.fired = True
            scope.cancel(reason="cancelled before the call")
        trio.lowlevel.add_instrument(instrument)
        try:
            value = await op()
        except Exception as exc:
            error = exc
        finally:
            trio.lowlevel.remove_instrument(instrument)
    return Run(k, instrument.fired, scope.cancelled_caught, instrument.steps, value, error)


class Phase(enum.Enum):
    NO_TRACE = "no trace"  # cancelled before intake
    DONE = "done"  # after intake: completed as if the caller had stayed


async def sweep(scenario: Callable[[int], Awaitable[tuple[Run, Phase]]]) -> list[Phase]:
    """Run ``scenario(k)`` for k = 0, 1, ... until the cancellation no longer fires.

    Returns the phase of every run whose cancellation fired, and checks that the
    phases are some ``NO_TRACE`` runs followed only by ``DONE`` runs.
    """
    phases: list[Phase] = []
    for k in range(MAX_CHECKPOINTS):
        with trio.fail_after(10_000):  # virtual seconds: a hang fails instead of blocking
            run, phase = await scenario(k)
        if not run.fired:
            # Past the last schedule point: the uncancelled call, which completes.
            assert not run.cancelled
            assert phase is Phase.DONE
            break
        phases.append(phase)
    else:
        pytest.fail(f"more than {MAX_CHECKPOINTS} schedule points")
    first_done = phases.index(Phase.DONE) if Phase.DONE in phases else len(phases)
    assert all(p is Phase.DONE for p in phases[first_done:]), phases
    return phases


# -- what a call left behind ---------------------------------------------------------


async def assert_no_trace(sup: Supervisor, recorder: EventRecorder, name: str, body: Body) -> None:
    """Nothing of the add of ``name`` exists, and the name is free for a new add."""
    await settle()
    assert body.started == 0
    assert kinds_of(recorder, name) == []
    assert name not in [info.name for info in sup.list()]
    assert not sup.is_alive(name)
    with trio.fail_after(60):
        await sup.wait_idle()  # no in-flight count leaked
    again = Body()
    waiter = await sup.add(TaskSpec.once(name, again))
    assert (await waiter.wait()).value == "ok"
    assert again.finished == 1


async def assert_added_and_ran(
    sup: Supervisor, recorder: EventRecorder, name: str, body: Body, t0: float
) -> None:
    """The add of ``name`` happened: registered, ran once, completed on time."""
    with trio.fail_after(60):
        await sup.wait_idle()
    await settle()
    assert body.started == body.finished == 1
    assert trio.current_time() == t0 + body.seconds
    assert kinds_of(recorder, name)[:2] == [EventKind.TASK_ADD_REQUESTED, EventKind.TASK_ADDED]
    [finished] = recorder.of(EventKind.TASK_FINISHED, name=name)
    assert finished.outcome is OutcomeKind.COMPLETED


# -- add -----------------------------------------------------------------------------------


async def _add_scenario(k: int, *, queued_before: int, capacity: int = 1024) -> tuple[Run, Phase]:
    recorder = EventRecorder()
    async with supervisor(recorder, command_capacity=capacity) as sup:
        earlier = [Body() for _ in range(queued_before)]
        for i, b in enumerate(earlier):
            sup.add_nowait(TaskSpec.once(f"earlier-{i}", b))
        body = Body()
        t0 = trio.current_time()
        run = await call_cancelled_at(k, lambda: sup.add(TaskSpec.once("job", body)))
        assert run.error is None
        await settle()
        if not kinds_of(recorder, "job"):
            assert run.cancelled
            await assert_no_trace(sup, recorder, "job", body)
            return run, Phase.NO_TRACE
        await assert_added_and_ran(sup, recorder, "job", body, t0)
        if not run.cancelled:
            assert run.value is not None
        return run, Phase.DONE


async def test_add_fast_path_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """On the fast path (registry idle) the decision comes first, in the caller's task,
    then a shielded checkpoint (trio's idiom): a caller cancelled when it calls leaves no
    trace, one cancelled at that checkpoint has its task added."""
    phases = await sweep(lambda k: _add_scenario(k, queued_before=0))
    assert phases == [Phase.NO_TRACE, Phase.DONE]


async def test_add_behind_a_queued_command_cancelled_at_every_checkpoint(
    autojump_clock: Any,
) -> None:
    """Behind a queued command: the send is intake; cancelled later, the add happens."""
    phases = await sweep(lambda k: _add_scenario(k, queued_before=1))
    assert phases[0] is Phase.NO_TRACE
    assert Phase.DONE in phases


async def test_add_blocked_on_a_full_channel_cancelled_at_every_checkpoint(
    autojump_clock: Any,
) -> None:
    """Cancelled while waiting for command capacity, the add leaves no trace."""
    phases = await sweep(lambda k: _add_scenario(k, queued_before=2, capacity=1))
    assert phases[:2] == [Phase.NO_TRACE, Phase.NO_TRACE]
    assert Phase.DONE in phases


# -- add_batch -------------------------------------------------------------------------------


async def _add_batch_scenario(
    k: int, *, queued_before: int, capacity: int = 1024
) -> tuple[Run, Phase]:
    recorder = EventRecorder()
    async with supervisor(recorder, command_capacity=capacity) as sup:
        for i in range(queued_before):
            sup.add_nowait(TaskSpec.once(f"earlier-{i}", Body()))
        bodies = [Body(), Body(2.0)]
        t0 = trio.current_time()
        specs = [TaskSpec.once(f"item-{i}", b) for i, b in enumerate(bodies)]
        run = await call_cancelled_at(k, lambda: sup.add_batch(specs))
        assert run.error is None
        await settle()
        if run.cancelled and not kinds_of(recorder, "item-0"):
            for i, b in enumerate(bodies):
                await assert_no_trace(sup, recorder, f"item-{i}", b)
            return run, Phase.NO_TRACE
        with trio.fail_after(60):
            await sup.wait_idle()
        await settle()
        assert trio.current_time() == t0 + 2.0
        for i, b in enumerate(bodies):
            assert b.started == b.finished == 1
            [finished] = recorder.of(EventKind.TASK_FINISHED, name=f"item-{i}")
            assert finished.outcome is OutcomeKind.COMPLETED
        return run, Phase.DONE


@pytest.mark.parametrize(("queued_before", "capacity"), [(0, 1024), (2, 1)])
async def test_add_batch_cancelled_at_every_checkpoint(
    autojump_clock: Any, queued_before: int, capacity: int
) -> None:
    """A batch is all-or-nothing under cancellation too: no item, or every item."""
    phases = await sweep(
        lambda k: _add_batch_scenario(k, queued_before=queued_before, capacity=capacity)
    )
    assert phases[0] is Phase.NO_TRACE
    assert Phase.DONE in phases


# -- remove and cancel ----------------------------------------------------------------------


async def _stop_scenario(
    k: int, method: str, *, by_id: bool, controller: bool, capacity: int = 1024
) -> tuple[Run, Phase]:
    recorder = EventRecorder()
    config: dict[str, Any] = {"command_capacity": capacity}
    if controller:
        config["controller"] = ControllerConfig(queue_capacity=capacity)
    async with supervisor(recorder, **config) as sup:

        async def victim() -> None:
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(2.0)  # cleanup that awaits, within grace

        waiter = await sup.add(TaskSpec.once("victim", victim))
        await settle()
        if capacity == 1:
            # Fill the registry's channel so the stop's send has to wait.
            sup.add_nowait(TaskSpec.once("filler-0", Body()))
            sup.add_nowait(TaskSpec.once("filler-1", Body()))
        target = waiter.id if by_id else "victim"
        t0 = trio.current_time()
        run = await call_cancelled_at(k, lambda: getattr(sup, method)(target))
        assert run.error is None
        await settle()
        if not kinds_of(recorder, "victim").count(EventKind.TASK_REMOVE_REQUESTED):
            # No stop was requested: the victim runs on, and the claim is still free.
            assert run.cancelled
            assert sup.is_alive("victim")
            with pytest.raises(trio.WouldBlock):
                waiter.outcome_nowait()
            assert await sup.remove(target) is True
            assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
            return run, Phase.NO_TRACE
        # The stop was requested: it continues without the caller.
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELLED
        assert trio.current_time() == t0 + 2.0
        assert await sup.remove(target) is False  # the cancelled caller was the claimer
        if not run.cancelled:
            assert run.value is True
        return run, Phase.DONE


@pytest.mark.parametrize("method", ["remove", "cancel"])
@pytest.mark.parametrize(
    ("by_id", "controller", "capacity"),
    [(False, False, 1024), (True, False, 1024), (True, True, 1024), (False, False, 1)],
    ids=["by-name", "by-id", "by-id-via-controller", "full-channel"],
)
async def test_stop_cancelled_at_every_checkpoint(
    autojump_clock: Any, method: str, by_id: bool, controller: bool, capacity: int
) -> None:
    """A stop cancelled before its send is not requested; after it, it continues."""
    phases = await sweep(
        lambda k: _stop_scenario(k, method, by_id=by_id, controller=controller, capacity=capacity)
    )
    assert phases[0] is Phase.NO_TRACE
    assert Phase.DONE in phases


# -- wait_idle, TaskWaiter.wait, EventRecorder.wait_for, wait_cancel_requested ------------


async def test_wait_idle_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """A cancelled wait_idle changes nothing: the work ends on time, idle is reached."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        async with supervisor() as sup:
            body = Body(3.0)
            await sup.add(TaskSpec.once("job", body))
            t0 = trio.current_time()
            run = await call_cancelled_at(k, sup.wait_idle)
            assert run.error is None
            with trio.fail_after(60):
                await sup.wait_idle()
            assert trio.current_time() == t0 + 3.0
            assert body.finished == 1
            return run, Phase.DONE

    assert await sweep(scenario)


async def test_waiter_wait_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """A cancelled wait() leaves the waiter usable; the task is unaffected."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        async with supervisor() as sup:
            body = Body(3.0, value=42)
            waiter = await sup.add(TaskSpec.once("job", body))
            t0 = trio.current_time()
            run = await call_cancelled_at(k, waiter.wait)
            assert run.error is None
            outcome = await waiter.wait()
            assert outcome.value == 42
            assert trio.current_time() == t0 + 3.0
            return run, Phase.DONE

    assert await sweep(scenario)


async def test_controller_waiter_wait_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """The same for a controller waiter (which carries a deadlock guard)."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        async with supervisor(controller=ControllerConfig()) as sup:
            body = Body(3.0, value=42)
            waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("job", body)))
            t0 = trio.current_time()
            run = await call_cancelled_at(k, waiter.wait)
            assert run.error is None
            assert (await waiter.wait()).value == 42
            assert trio.current_time() == t0 + 3.0
            return run, Phase.DONE

    assert await sweep(scenario)


async def test_wait_placed_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """A cancelled wait_placed() leaves the held work alone: it is placed on time."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        async with supervisor(max_slot_queue=0) as sup:
            await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", Body(3.0)), slot="s"))
            held = await sup.submit(
                ControllerSpec.queue(TaskSpec.once("held", Body(1.0)), slot="s", wait=True)
            )
            t0 = trio.current_time()
            run = await call_cancelled_at(k, held.wait_placed)
            assert run.error is None
            assert str(await held.wait_placed()) == "owner"
            assert trio.current_time() == t0 + 3.0
            return run, Phase.DONE

    assert await sweep(scenario)


async def test_wait_slot_idle_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """A cancelled wait_slot_idle changes nothing: the slot's work ends on time."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        async with supervisor(controller=ControllerConfig()) as sup:
            body = Body(3.0)
            await sup.submit(ControllerSpec.queue(TaskSpec.once("job", body), slot="s"))
            t0 = trio.current_time()
            run = await call_cancelled_at(k, lambda: sup.wait_slot_idle("s"))
            assert run.error is None
            with trio.fail_after(60):
                await sup.wait_slot_idle("s")
            assert trio.current_time() == t0 + 3.0
            assert body.finished == 1
            return run, Phase.DONE

    assert await sweep(scenario)


async def test_cancel_slot_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """cancel_slot cancelled before its command is sent does nothing; after, it goes on."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        async with supervisor(controller=ControllerConfig()) as sup:
            owner = await sup.submit(
                ControllerSpec.queue(TaskSpec.once("owner", forever), slot="s")
            )
            queued = await sup.submit(ControllerSpec.queue(TaskSpec.once("q", forever), slot="s"))
            await settle()
            run = await call_cancelled_at(k, lambda: sup.cancel_slot("s"))
            assert run.error is None
            await settle()
            if queued.placement is not None and not _resolved(queued):
                assert run.cancelled
                assert not _resolved(owner)
                return run, Phase.NO_TRACE
            assert queued.outcome_nowait().rejection is RejectionKind.REMOVED_FROM_QUEUE
            assert (await owner.wait()).kind is OutcomeKind.CANCELLED
            if not run.cancelled:
                assert run.value == 2
            return run, Phase.DONE

    phases = await sweep(scenario)
    assert phases[0] is Phase.NO_TRACE
    assert Phase.DONE in phases


def _resolved(waiter: Any) -> bool:
    try:
        waiter.outcome_nowait()
    except trio.WouldBlock:
        return False
    return True


async def test_waiter_wait_on_a_resolved_waiter_cancelled(autojump_clock: Any) -> None:
    """Even when the outcome is known, a cancelled caller gets Cancelled, not the value."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", Body(0.0)))
        await waiter.wait()
        run = await call_cancelled_at(0, waiter.wait)
        assert run.cancelled
        run = await call_cancelled_at(1, waiter.wait)
        assert run.cancelled
        assert (await waiter.wait()).value == "ok"


async def test_event_recorder_wait_for_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """A cancelled wait_for leaves no waiter behind and a later wait_for still works."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        recorder = EventRecorder()
        async with supervisor(recorder) as sup:
            await sup.add(TaskSpec.once("job", Body(3.0)))
            run = await call_cancelled_at(
                k, lambda: recorder.wait_for(EventKind.TASK_FINISHED, name="job")
            )
            assert run.error is None
            assert recorder_waiters(recorder) == []
            event = await recorder.wait_for(EventKind.TASK_FINISHED, name="job")
            assert event.outcome is OutcomeKind.COMPLETED
            return run, Phase.DONE

    assert await sweep(scenario)


async def test_event_recorder_wait_for_a_recorded_event_cancelled(autojump_clock: Any) -> None:
    """On its fast path (already recorded) wait_for is still a cancel point."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await (await sup.add(TaskSpec.once("job", Body(0.0)))).wait()
        await recorder.wait_for(EventKind.TASK_FINISHED, name="job")
        for k in (0, 1):
            run = await call_cancelled_at(
                k, lambda: recorder.wait_for(EventKind.TASK_FINISHED, name="job")
            )
            assert run.cancelled


async def test_wait_cancel_requested_cancelled_at_every_checkpoint(autojump_clock: Any) -> None:
    """Inside an attempt, a cancelled wait_cancel_requested changes nothing."""

    async def scenario(k: int) -> tuple[Run, Phase]:
        runs: list[Run] = []
        woke: list[float] = []

        async def body() -> None:
            ctx = current_context()
            with ctx.defer_cancel():
                runs.append(await call_cancelled_at(k, ctx.wait_cancel_requested))
                await ctx.wait_cancel_requested()
                woke.append(trio.current_time())

        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("job", body))
            await trio.sleep(1.0)
            t0 = trio.current_time()
            await sup.cancel("job")
            assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        [run] = runs
        assert run.error is None
        assert woke == [t0]
        return run, Phase.DONE

    assert await sweep(scenario)


# -- shutdown -------------------------------------------------------------------------------


async def _shutdown_scenario(k: int, *, stuck: bool) -> tuple[Run, Phase]:
    recorder = EventRecorder()
    cleaned: list[float] = []

    async def deferring() -> None:
        with current_context().defer_cancel():
            await trio.sleep(2.0)
        cleaned.append(trio.current_time())

    async def stubborn() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(10.0)

    try:
        async with supervisor(recorder) as sup:
            w1 = await sup.add(TaskSpec.once("deferring", deferring))
            w2 = await sup.add(
                TaskSpec.once("stubborn" if stuck else "plain", stubborn if stuck else forever)
            )
            await settle()
            t0 = trio.current_time()
            run = await call_cancelled_at(k, sup.shutdown)
            if stuck:
                assert run.cancelled or isinstance(run.error, GraceExceededError)
            else:
                assert run.error is None
            # The shutdown went on without the caller, to the same cached result.
            with trio.fail_after(60):
                if stuck:
                    with pytest.raises(GraceExceededError) as info:
                        await sup.shutdown()
                    assert info.value.stuck == ("stubborn",)
                    assert trio.current_time() == t0 + 10.0  # physical exit of the stubborn
                else:
                    await sup.shutdown()
                    assert trio.current_time() == t0 + 2.0
            assert (await w1.wait()).kind is OutcomeKind.CANCELLED
            expected = OutcomeKind.FORCE_ABORTED if stuck else OutcomeKind.CANCELLED
            assert (await w2.wait()).kind is expected
            assert cleaned == [t0 + 2.0]
            assert sup.alive_snapshot() == ()
    except GraceExceededError:
        assert stuck
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]
    final = EventKind.GRACE_EXCEEDED if stuck else EventKind.ALL_STOPPED_WITHIN_GRACE
    assert recorder.kinds(EventKind.GRACE_EXCEEDED, EventKind.ALL_STOPPED_WITHIN_GRACE) == [final]
    return run, Phase.DONE


@pytest.mark.parametrize("stuck", [False, True], ids=["within-grace", "grace-exceeded"])
async def test_shutdown_cancelled_at_every_checkpoint(autojump_clock: Any, stuck: bool) -> None:
    """Cancelling a shutdown caller, even before the call, never stops the shutdown."""
    phases = await sweep(lambda k: _shutdown_scenario(k, stuck=stuck))
    assert set(phases) == {Phase.DONE}


# -- submit and PreparedSubmission.submit -----------------------------------------------------


async def _submit_scenario(k: int, *, prepared: bool, capacity: int) -> tuple[Run, Phase]:
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig(queue_capacity=capacity)) as sup:
        for i in range(0 if capacity > 1 else 2):
            sup.submit_nowait(ControllerSpec.queue(TaskSpec.once(f"filler-{i}", Body())))
        body = Body()
        request = ControllerSpec.queue(TaskSpec.once("job", body), slot="s")
        submission = sup.prepare_submission(request) if prepared else None
        t0 = trio.current_time()
        op = submission.submit if submission is not None else lambda: sup.submit(request)
        run = await call_cancelled_at(k, op)
        assert run.error is None
        await settle()
        if run.cancelled and not kinds_of(recorder, "job"):
            assert body.started == 0
            assert sup.controller_snapshot().slot("s") is None
            with trio.fail_after(60):
                await sup.wait_idle()  # no in-flight count leaked
            assert kinds_of(recorder, "job") == []
            if submission is not None:
                # Cancelled before intake, the prepared submission is still unused.
                waiter = await submission.submit()
                assert waiter.id == submission.id
            else:
                waiter = await sup.submit(request)
            assert (await waiter.wait()).value == "ok"
            return run, Phase.NO_TRACE
        with trio.fail_after(60):
            await sup.wait_idle()
        await settle()
        assert body.started == body.finished == 1
        assert trio.current_time() == t0 + 1.0
        [finished] = recorder.of(EventKind.TASK_FINISHED, name="job")
        assert finished.outcome is OutcomeKind.COMPLETED
        if not run.cancelled:
            assert (await run.value.wait()).value == "ok"  # type: ignore[attr-defined]
        if submission is not None:
            with pytest.raises(RuntimeError, match="already submitted"):
                await submission.submit()
        return run, Phase.DONE


@pytest.mark.parametrize("prepared", [False, True], ids=["submit", "prepared"])
@pytest.mark.parametrize("capacity", [1024, 1], ids=["room", "full-channel"])
async def test_submit_cancelled_at_every_checkpoint(
    autojump_clock: Any, prepared: bool, capacity: int
) -> None:
    """A submission cancelled before its intake leaves no trace; after it, it runs."""
    phases = await sweep(lambda k: _submit_scenario(k, prepared=prepared, capacity=capacity))
    if capacity == 1:
        # Before the call, and in the blocked send; the call returns at once when the
        # controller takes the submission in.
        assert phases == [Phase.NO_TRACE, Phase.NO_TRACE]
    else:
        # On the fast path (the controller loop idle) the intake comes first, in the
        # caller's task, then a shielded checkpoint (trio's idiom, as add's): a caller
        # cancelled when it calls leaves no trace, one cancelled at that checkpoint has
        # its work taken in.
        assert phases == [Phase.NO_TRACE, Phase.DONE]


async def test_regression_prepared_submit_cancelled_before_intake_stays_unused(
    autojump_clock: Any,
) -> None:
    """A prepared submission whose submit() was cancelled before intake can be submitted."""
    async with supervisor(controller=ControllerConfig()) as sup:
        prepared = sup.prepare_submission(ControllerSpec.queue(TaskSpec.once("job", Body())))
        with trio.CancelScope() as scope:
            scope.cancel()
            await prepared.submit()
        assert scope.cancelled_caught
        waiter = await prepared.submit()
        assert waiter.id == prepared.id
        assert (await waiter.wait()).value == "ok"
        with pytest.raises(RuntimeError, match="already submitted"):
            await prepared.submit()


# -- run_in_slot ----------------------------------------------------------------------------


async def _run_in_slot_scenario(k: int, *, busy: bool) -> tuple[Run, Phase]:
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        if busy:
            owner = await sup.submit(
                ControllerSpec.queue(TaskSpec.once("owner", Body(5.0)), slot="s")
            )
            await settle()
        body = Body()
        t0 = trio.current_time()
        run = await call_cancelled_at(k, lambda: sup.run_in_slot("s", body))
        assert run.error is None
        calls = [e for e in recorder.events if e.name is not None and e.name.startswith("Body#")]
        if run.cancelled:
            # When Cancelled propagates, the call's work is gone from the slot: never
            # queued behind the owner any more, never owning the slot.
            view = sup.controller_snapshot().slot("s")
            if busy:
                assert view is not None
                assert view.owner_id == owner.id
                assert view.queue_depth == 0
                assert view.waiting == 0
            else:
                assert view is None
            await settle()
            assert body.finished == 0
            calls = [
                e for e in recorder.events if e.name is not None and e.name.startswith("Body#")
            ]
            if not calls:
                return run, Phase.NO_TRACE
            finals = [
                e
                for e in calls
                if e.kind in (EventKind.TASK_FINISHED, EventKind.CONTROLLER_REJECTED)
            ]
            assert len(finals) == 1
            if busy:
                assert finals[0].rejection is RejectionKind.REMOVED_FROM_QUEUE
                assert body.started == 0
            else:
                assert finals[0].outcome is OutcomeKind.CANCELLED
            if busy:
                assert (await owner.wait()).value == "ok"
            return run, Phase.DONE
        # Not cancelled: only possible when the cancellation never fired.
        assert not run.fired
        assert run.value == "ok"
        assert calls
        assert trio.current_time() == (6.0 if busy else 1.0) + t0
        return run, Phase.DONE


@pytest.mark.parametrize("busy", [False, True], ids=["idle-slot", "busy-slot"])
async def test_run_in_slot_cancelled_at_every_checkpoint(autojump_clock: Any, busy: bool) -> None:
    """Cancelled after intake, a keyed call withdraws its work before Cancelled propagates."""
    phases = await sweep(lambda k: _run_in_slot_scenario(k, busy=busy))
    assert phases[0] is Phase.NO_TRACE
    assert Phase.DONE in phases


# -- every async method is a checkpoint, fast paths included --------------------------------


async def test_add_on_its_fast_path_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        await settle()
        with trio.testing.assert_checkpoints():
            await sup.add(TaskSpec.once("job", Body(0.0)))


async def test_add_behind_a_queued_command_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        sup.add_nowait(TaskSpec.once("first", Body(0.0)))
        with trio.testing.assert_checkpoints():
            await sup.add(TaskSpec.once("job", Body(0.0)))


async def test_add_batch_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        with trio.testing.assert_checkpoints():
            await sup.add_batch([])
        with trio.testing.assert_checkpoints():
            await sup.add_batch([TaskSpec.once("job", Body(0.0))])


async def test_add_batch_of_nothing_is_a_checkpoint(autojump_clock: Any) -> None:
    """add_batch([]) returns [] and is still a checkpoint."""
    async with open_supervisor() as sup:
        with trio.testing.assert_checkpoints():
            assert await sup.add_batch([]) == []


async def test_remove_and_cancel_of_a_finished_task_are_checkpoints(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", Body(0.0)))
        await waiter.wait()
        for method in (sup.remove, sup.cancel):
            for target in (waiter.id, "job"):
                with trio.testing.assert_checkpoints():
                    assert await method(target) is False


async def test_remove_of_an_unknown_target_is_a_checkpoint(autojump_clock: Any) -> None:
    """remove() of an unknown name or id returns False as a checkpoint."""
    async with open_supervisor() as sup:
        with trio.testing.assert_checkpoints():
            assert await sup.remove("unknown") is False
        with trio.testing.assert_checkpoints():
            assert await sup.remove(TaskId(10**9)) is False


async def test_cancel_of_an_unknown_target_is_a_checkpoint(autojump_clock: Any) -> None:
    """cancel() of an unknown name or id returns False as a checkpoint."""
    async with open_supervisor() as sup:
        with trio.testing.assert_checkpoints():
            assert await sup.cancel("unknown") is False
        with trio.testing.assert_checkpoints():
            assert await sup.cancel(TaskId(10**9)) is False


async def test_cancel_of_a_task_that_stops_at_once_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        await sup.add(TaskSpec.once("job", forever))
        await settle()
        with trio.testing.assert_checkpoints():
            assert await sup.cancel("job") is True


async def test_stops_via_the_controller_are_checkpoints(autojump_clock: Any) -> None:
    async with supervisor(controller=ControllerConfig()) as sup:
        waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("job", Body(0.0))))
        await waiter.wait()
        with trio.testing.assert_checkpoints():
            assert await sup.remove(waiter.id) is False
        with trio.testing.assert_checkpoints():
            assert await sup.cancel(waiter.id) is False


@pytest.mark.parametrize("method", ["remove", "cancel"])
async def test_stop_after_shutdown_is_a_checkpoint(method: str) -> None:
    """``remove``/``cancel`` stay checkpoints on the after-shutdown fast path."""
    async with supervisor() as sup:
        await sup.shutdown()
        with trio.testing.assert_checkpoints():
            await getattr(sup, method)("t")


async def test_remove_after_the_supervisor_closed_is_a_checkpoint(autojump_clock: Any) -> None:
    """remove() and cancel() after the supervisor ended return False as checkpoints."""
    async with open_supervisor() as sup:
        pass
    with trio.testing.assert_checkpoints():
        assert await sup.remove("t") is False
    with trio.testing.assert_checkpoints():
        assert await sup.cancel("t") is False


async def test_slot_operations_after_the_supervisor_closed_are_checkpoints(
    autojump_clock: Any,
) -> None:
    """cancel_slot and wait_slot_idle after the supervisor ended: 0 and idle, as checkpoints."""
    async with supervisor(controller=ControllerConfig()) as sup:
        pass
    with trio.testing.assert_checkpoints():
        assert await sup.cancel_slot("s") == 0
    with trio.testing.assert_checkpoints():
        await sup.wait_slot_idle("s")


async def test_wait_idle_when_idle_with_a_controller_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor(controller=ControllerConfig()) as sup:
        with trio.testing.assert_checkpoints():
            await sup.wait_idle()


async def test_wait_idle_when_idle_without_a_controller_is_a_checkpoint(
    autojump_clock: Any,
) -> None:
    """wait_idle() on an idle supervisor is a checkpoint."""
    async with open_supervisor() as sup:
        with trio.testing.assert_checkpoints():
            await sup.wait_idle()


async def test_shutdown_is_a_checkpoint_when_done(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        with trio.testing.assert_checkpoints():
            await sup.shutdown()
        with trio.testing.assert_checkpoints():
            await sup.shutdown()


async def test_submit_and_prepared_submit_are_checkpoints(autojump_clock: Any) -> None:
    async with supervisor(controller=ControllerConfig()) as sup:
        with trio.testing.assert_checkpoints():
            await sup.submit(ControllerSpec.queue(TaskSpec.once("a", Body(0.0))))
        prepared = sup.prepare_submission(ControllerSpec.queue(TaskSpec.once("b", Body(0.0))))
        with trio.testing.assert_checkpoints():
            await prepared.submit()


async def test_run_in_slot_is_a_checkpoint(autojump_clock: Any) -> None:
    async def instant() -> int:
        return 1

    async with supervisor(controller=ControllerConfig()) as sup:
        with trio.testing.assert_checkpoints():
            assert await sup.run_in_slot("s", instant) == 1


async def test_wait_on_a_resolved_waiter_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor(controller=ControllerConfig()) as sup:
        plain = await sup.add(TaskSpec.once("plain", Body(0.0)))
        keyed = await sup.submit(ControllerSpec.queue(TaskSpec.once("keyed", Body(0.0))))
        await sup.wait_idle()
        for waiter in (plain, keyed):
            with trio.testing.assert_checkpoints():
                await waiter.wait()


async def test_rejected_waiter_wait_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        await sup.add(TaskSpec.once("job", forever))
        rejected = sup.add_nowait(TaskSpec.once("job", forever))
        await settle()
        assert rejected.outcome_nowait().kind is OutcomeKind.REJECTED
        with trio.testing.assert_checkpoints():
            await rejected.wait()
        await sup.cancel("job")


async def test_wait_for_a_recorded_event_is_a_checkpoint(autojump_clock: Any) -> None:
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await (await sup.add(TaskSpec.once("job", Body(0.0)))).wait()
        await recorder.wait_for(EventKind.TASK_REMOVED, name="job")
        with trio.testing.assert_checkpoints():
            await recorder.wait_for(EventKind.TASK_ADDED, name="job")


async def test_wait_cancel_requested_when_requested_is_a_checkpoint(autojump_clock: Any) -> None:
    checked: list[bool] = []

    async def body() -> None:
        ctx = current_context()
        with ctx.defer_cancel():
            await ctx.wait_cancel_requested()
            with trio.testing.assert_checkpoints():
                await ctx.wait_cancel_requested()
            checked.append(True)

    async with supervisor() as sup:
        await sup.add(TaskSpec.once("job", body))
        await settle()
        await sup.cancel("job")
    assert checked == [True]


async def test_events_stream_entry_is_a_checkpoint(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        with trio.testing.assert_checkpoints():
            async with sup.events():
                pass


async def test_run_in_slot_outcome_error_is_unaffected_by_the_sweep_helper(
    autojump_clock: Any,
) -> None:
    """The helper reports a call's own errors (not Cancelled) as ``error``."""

    async def boom() -> None:
        raise ValueError("boom")

    async with supervisor(controller=ControllerConfig()) as sup:
        run = await call_cancelled_at(NEVER, lambda: sup.run_in_slot("s", boom))
        assert not run.fired
        assert isinstance(run.error, OutcomeError)

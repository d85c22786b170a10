"""Signals in dynamic mode: ``open_supervisor(handle_signals=True)``,
``Supervisor.received_signal``, and a signal during a shutdown forcing it, for
``run(handle_signals=True)`` too.

The signals are real: sent to the test's own process (``os.kill``), as the ``run()``
signal tests of ``test_shutdown.py`` do. Python runs the handler in the main thread at
its next bytecode boundary, so on the virtual clock every time is exact. The sender is
a task outside the supervisor's block (the first signal cancels the block's body).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ConfigError,
    EventKind,
    GraceExceededError,
    OutcomeKind,
    SupervisorClosedError,
    TaskSpec,
    open_supervisor,
    run,
)
from trio_taskvisor._registry import Registry
from trio_taskvisor.testing import EventRecorder

from helpers import deferring, forever, stubborn, supervisor_config

SIGNALS = [signal.SIGINT, signal.SIGTERM]


def send(signum: int) -> None:
    os.kill(os.getpid(), signum)


async def signal_when(
    recorder: EventRecorder, kind: EventKind, signum: int, **fields: object
) -> None:
    """Send ``signum`` once ``kind`` was delivered and every task is blocked."""
    await recorder.wait_for(kind, **fields)
    await trio.testing.wait_all_tasks_blocked()
    send(signum)


@pytest.mark.parametrize("signum", SIGNALS)
async def test_first_signal_cancels_the_body_and_shuts_down_gracefully(
    autojump_clock: trio.abc.Clock, signum: signal.Signals
) -> None:
    """The block returns normally (no KeyboardInterrupt); the tasks end CANCELLED."""
    recorder = EventRecorder()
    reached: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.ATTEMPT_STARTING, signum)
        async with open_supervisor(
            supervisor_config(), subscribers=[recorder], handle_signals=True
        ) as sup:
            waiter = await sup.add(TaskSpec.once("worker", forever))
            await trio.sleep_forever()
            reached.append("after the body's sleep")  # pragma: no cover
    assert reached == []
    assert sup.received_signal == signum
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]
    assert recorder.kinds(EventKind.ALL_STOPPED_WITHIN_GRACE) == [
        EventKind.ALL_STOPPED_WITHIN_GRACE
    ]
    assert trio.current_time() == 0.0


async def test_a_signal_while_the_background_starts_shuts_down_before_the_body(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal that comes while the supervisor's loops start (after the slot store, if
    any, answered) is handled once they run: the shutdown begins before the body, which
    cannot add work and is cancelled at its first checkpoint; the block returns
    normally."""
    start_registry = Registry.run

    async def signalled_first(self: Registry, **kwargs: Any) -> None:
        send(signal.SIGTERM)
        await trio.testing.wait_all_tasks_blocked()  # the watcher takes it
        await start_registry(self, **kwargs)

    monkeypatch.setattr(Registry, "run", signalled_first)
    reached: list[str] = []
    async with open_supervisor(supervisor_config(), handle_signals=True) as sup:
        assert sup.closing
        with pytest.raises(SupervisorClosedError):
            sup.add_nowait(TaskSpec.once("late", forever))
        await trio.lowlevel.checkpoint()
        reached.append("after the first checkpoint")  # pragma: no cover
    assert reached == []
    assert sup.received_signal == signal.SIGTERM
    assert trio.current_time() == 0.0


async def test_graceful_shutdown_after_a_signal_still_waits_for_deferred_work(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After the first signal, deferred work finishes within the grace (5 s)."""
    recorder = EventRecorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.ATTEMPT_STARTING, signal.SIGTERM)
        async with open_supervisor(
            supervisor_config(), subscribers=[recorder], handle_signals=True
        ) as sup:
            waiter = await sup.add(TaskSpec.once("flush", deferring, 3.0))
            await trio.sleep_forever()
    assert trio.current_time() == 3.0
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_signal_during_the_shutdown_forces_every_remaining_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A second signal forces at once: FORCE_ABORTED, listed in ``stuck``, GRACE_EXCEEDED,
    the reasons saying so (before, "did not stop within the grace window", as though
    the grace had run out)."""
    recorder = EventRecorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.ATTEMPT_STARTING, signal.SIGINT)
        nursery.start_soon(signal_when, recorder, EventKind.SHUTDOWN_REQUESTED, signal.SIGTERM)
        with pytest.raises(GraceExceededError) as info:  # noqa: PT012
            async with open_supervisor(
                supervisor_config(grace=60.0), subscribers=[recorder], handle_signals=True
            ) as sup:
                a = await sup.add(TaskSpec.once("a", deferring, 100.0))
                b = await sup.add(TaskSpec.once("b", deferring, 100.0))
                await sup.add(TaskSpec.once("c", forever))
                await trio.sleep_forever()
    assert trio.current_time() == 0.0  # not the 60 s grace
    assert info.value.stuck == ("a", "b")
    assert sup.received_signal == signal.SIGINT  # the first one
    assert a.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert b.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert a.outcome_nowait().reason == "forced at once by a signal during the shutdown"
    grace = recorder.of(EventKind.GRACE_EXCEEDED)
    assert [e.reason for e in grace] == ["forced at once (a signal): a, b"]
    assert recorder.kinds(EventKind.ALL_STOPPED_WITHIN_GRACE) == []


async def test_two_signals_in_one_instant_are_two(autojump_clock: trio.abc.Clock) -> None:
    """The second of two SIGINTs that come before the first is read (a second Ctrl+C
    while the loop was busy) forces the shutdown at once. Before, trio's receiver
    merged them into one: the shutdown waited out the whole grace window."""
    recorder = EventRecorder()

    async def twice() -> None:
        await recorder.wait_for(EventKind.ATTEMPT_STARTING)
        await trio.testing.wait_all_tasks_blocked()
        send(signal.SIGINT)
        send(signal.SIGINT)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(twice)
        with pytest.raises(GraceExceededError) as info:  # noqa: PT012
            async with open_supervisor(
                supervisor_config(grace=60.0), subscribers=[recorder], handle_signals=True
            ) as sup:
                slow = await sup.add(TaskSpec.once("slow", deferring, 100.0))
                await trio.sleep_forever()
    assert trio.current_time() == 0.0  # not the 60 s grace
    assert info.value.stuck == ("slow",)
    assert slow.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert sup.received_signal == signal.SIGINT


class BlocksInTheDrain:
    """A subscriber that blocks on the shutdown's last event, as a slow exporter would."""

    name = "blocks"
    queue_capacity = 16

    def __init__(self) -> None:
        self.cancelled_at: list[float] = []

    async def on_event(self, event: Any) -> None:
        if event.kind is EventKind.ALL_STOPPED_WITHIN_GRACE:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self.cancelled_at.append(trio.current_time())
                raise


async def test_a_signal_during_the_subscribers_drain_ends_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Once every task has exited, a signal ends the subscribers' drain at once, as its
    deadline does. Before, it changed nothing: the shutdown waited for the deadline
    (``subscriber_shutdown_timeout``), and so did every further signal."""
    recorder = EventRecorder()
    blocks = BlocksInTheDrain()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.ATTEMPT_STARTING, signal.SIGINT)
        nursery.start_soon(
            signal_when, recorder, EventKind.ALL_STOPPED_WITHIN_GRACE, signal.SIGTERM
        )
        async with open_supervisor(
            supervisor_config(subscriber_shutdown_timeout=30.0),
            subscribers=[recorder, blocks],
            handle_signals=True,
        ) as sup:
            await sup.add(TaskSpec.once("worker", forever))
            await trio.sleep_forever()
    assert trio.current_time() == 0.0  # not the 30 s drain deadline
    assert blocks.cancelled_at == [0.0]
    assert sup.received_signal == signal.SIGINT


async def test_signal_during_a_shutdown_begun_otherwise_forces_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The shutdown of leaving the block: the first signal during it forces at once."""
    recorder = EventRecorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.SHUTDOWN_REQUESTED, signal.SIGTERM)
        with pytest.raises(GraceExceededError) as info:  # noqa: PT012
            async with open_supervisor(
                supervisor_config(grace=60.0), subscribers=[recorder], handle_signals=True
            ) as sup:
                await sup.add(TaskSpec.once("slow", deferring, 100.0))
                await trio.sleep(1.0)
    assert trio.current_time() == 1.0
    assert info.value.stuck == ("slow",)
    assert sup.received_signal == signal.SIGTERM


async def test_signal_lists_work_forced_earlier_and_still_running(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Forced before the shutdown, still running at the signal: stuck at once too."""
    recorder = EventRecorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.SHUTDOWN_REQUESTED, signal.SIGINT)
        with pytest.raises(GraceExceededError) as info:  # noqa: PT012
            async with open_supervisor(
                supervisor_config(grace=2.0), subscribers=[recorder], handle_signals=True
            ) as sup:
                await sup.add(TaskSpec.once("stubborn", stubborn, 20.0))
                await trio.testing.wait_all_tasks_blocked()
                await sup.cancel("stubborn")  # forced at 2 s, runs on to 20 s
    # The shutdown still waits for the physical exit (trio cannot cut it short).
    assert trio.current_time() == 20.0
    assert info.value.stuck == ("stubborn",)
    grace = recorder.of(EventKind.GRACE_EXCEEDED)
    assert [e.time for e in grace] == [2.0]  # at the signal, not at the 4 s deadline


async def test_received_signal_is_none_without_a_signal(autojump_clock: trio.abc.Clock) -> None:
    """``received_signal`` stays ``None``, with or without ``handle_signals``."""
    async with open_supervisor(supervisor_config(), handle_signals=True) as handled:
        pass
    async with open_supervisor(supervisor_config()) as plain:
        pass
    assert handled.received_signal is None
    assert plain.received_signal is None


async def test_the_previous_handlers_are_back_after_the_block(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``handle_signals`` handles signals for the block only."""
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    async with open_supervisor(supervisor_config(), handle_signals=True):
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


SECOND = (
    "another supervisor of this trio run handles signals already (handle_signals=True): a "
    "signal reaches only the receiver opened last, so one of the two would never see it; "
    "handle them in the outermost supervisor only, whose shutdown ends the others' blocks"
)


async def refused_second(how: str) -> ConfigError:
    """Open a second supervisor that handles signals (``run`` or ``open_supervisor``)."""

    async def second() -> None:
        if how == "run":
            await run([TaskSpec.once("t", forever)], handle_signals=True)
        else:
            async with open_supervisor(handle_signals=True):
                pytest.fail("the block must not run")  # pragma: no cover

    with pytest.raises(ConfigError) as refused:
        await second()
    return refused.value


@pytest.mark.parametrize("how", ["nested", "beside", "run"])
async def test_a_second_supervisor_handling_signals_is_refused(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    """One supervisor of a run handles signals at a time: a second one (in the first's
    block, beside it in another task, or a ``run``) raises ``ConfigError`` before
    anything starts, and the first still gets the signal. Before, the second took it
    alone: a nested one shut down on SIGTERM and the outer one ran on."""
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    errors: list[ConfigError] = []

    async def beside() -> None:
        errors.append(await refused_second("nested"))

    async with (
        trio.open_nursery() as nursery,
        open_supervisor(supervisor_config(), handle_signals=True) as first,
    ):
        handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
        if how == "beside":
            nursery.start_soon(beside)  # outside the first's block
            await trio.testing.wait_all_tasks_blocked()
        else:
            errors.append(await refused_second(how))
        assert [str(error) for error in errors] == [SECOND]
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        send(signal.SIGTERM)
        await trio.sleep_forever()
    assert first.received_signal == signal.SIGTERM
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


async def test_supervisors_may_handle_signals_one_after_the_other(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Once the first block is left, another supervisor of the run may handle them."""
    async with open_supervisor(supervisor_config(), handle_signals=True):
        pass
    async with open_supervisor(supervisor_config(), handle_signals=True) as second:
        send(signal.SIGINT)
        await trio.sleep_forever()
    assert second.received_signal == signal.SIGINT


async def test_a_body_error_after_the_signal_still_propagates(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Only the signal's own cancellation of the body counts as a normal exit."""
    recorder = EventRecorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.ATTEMPT_STARTING, signal.SIGTERM)
        with pytest.raises(RuntimeError, match="cleanup failed"):  # noqa: PT012
            async with open_supervisor(
                supervisor_config(), subscribers=[recorder], handle_signals=True
            ) as sup:
                await sup.add(TaskSpec.once("worker", forever))
                try:
                    await trio.sleep_forever()
                finally:
                    raise RuntimeError("cleanup failed")


# -- run() ------------------------------------------------------------------------------------


async def test_run_second_signal_forces_the_shutdown(autojump_clock: trio.abc.Clock) -> None:
    """``run(handle_signals=True)`` follows the same rules: a second signal forces."""
    recorder = EventRecorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(signal_when, recorder, EventKind.ATTEMPT_STARTING, signal.SIGTERM)
        nursery.start_soon(signal_when, recorder, EventKind.SHUTDOWN_REQUESTED, signal.SIGINT)
        with pytest.raises(GraceExceededError) as info:
            await run(
                [TaskSpec.once("a", deferring, 100.0), TaskSpec.once("b", forever)],
                supervisor_config(grace=30.0),
                subscribers=[recorder],
                handle_signals=True,
            )
    assert info.value.stuck == ("a",)
    assert trio.current_time() == 0.0


# -- off the main thread ---------------------------------------------------------------------

OFF_MAIN_THREAD_BOUND = 30.0  # seconds of the real clock: a hang shows as a live thread


def run_in_a_thread(main: Any) -> BaseException | None:
    """``trio.run(main)`` in a thread of its own; what it raised (``None``: nothing)."""
    raised: list[BaseException | None] = []

    def target() -> None:
        try:
            trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        except BaseException as exc:  # handed to the test
            raised.append(exc)
        else:
            raised.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(OFF_MAIN_THREAD_BOUND)
    assert not thread.is_alive(), "hung: the supervisor waited for a shutdown nothing started"
    return raised[0]


def test_open_supervisor_with_signals_off_the_main_thread_raises_at_once() -> None:
    """trio's RuntimeError, before anything starts: no event, no task, no hang."""
    recorder = EventRecorder()
    bodies: list[str] = []

    async def main() -> None:
        async with open_supervisor(subscribers=[recorder], handle_signals=True):
            bodies.append("the body ran")  # pragma: no cover

    raised = run_in_a_thread(main)
    assert isinstance(raised, RuntimeError)
    assert "main thread" in str(raised)
    assert bodies == []
    assert recorder.events == []


def test_run_with_signals_off_the_main_thread_raises_at_once() -> None:
    """``run(..., handle_signals=True)``: the same, and the specs never run."""
    ran: list[str] = []

    async def work() -> None:
        ran.append("work")  # pragma: no cover

    async def main() -> None:
        await run([TaskSpec.once("work", work)], handle_signals=True)

    raised = run_in_a_thread(main)
    assert isinstance(raised, RuntimeError)
    assert "main thread" in str(raised)
    assert ran == []


def test_without_signals_a_supervisor_runs_off_the_main_thread() -> None:
    """Only the signal handling needs the main thread."""

    async def main() -> None:
        async with open_supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("work", trio.sleep, 1.0))
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED

    assert run_in_a_thread(main) is None


# -- a signal once the shutdown is done --------------------------------------------------------

# The signal arrives after the shutdown is done, before the block is left, in a child
# process: before, trio raised it again once its receiver closed (SIGTERM ended the
# process, SIGINT raised KeyboardInterrupt). ``watcher``: sent from an instrument as the
# signal watcher's task exits, with the receiver still open (it waits in the receiver,
# or its delivery is still queued when the receiver closes: trio's order decides);
# ``closing``: sent as trio's receiver closes, its delivery still queued.
_AFTER_THE_SHUTDOWN = """
import contextlib, os, signal, sys
import trio
from trio_taskvisor import TaskSpec, open_supervisor

signum = getattr(signal, sys.argv[1])
where = sys.argv[2]

class SendWhenTheWatcherExits(trio.abc.Instrument):
    def task_exited(self, task):
        if where == "watcher" and task.name.endswith("_watch_signals"):
            os.kill(os.getpid(), signum)

receiver = trio.open_signal_receiver

@contextlib.contextmanager
def send_as_it_closes(*signums):
    with receiver(*signums) as signals:
        yield signals
        os.kill(os.getpid(), signum)

if where == "closing":
    trio.open_signal_receiver = send_as_it_closes

async def main():
    async with open_supervisor(handle_signals=True) as sup:
        await sup.add(TaskSpec.once("work", trio.sleep, 1.0))
    print("left the block", sup.received_signal, flush=True)
    await trio.sleep(0)
    print("still running", flush=True)

trio.run(main, instruments=[SendWhenTheWatcherExits()])
"""


@pytest.mark.parametrize("where", ["watcher", "closing"])
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_once_the_shutdown_is_done_is_dropped(signum: str, where: str) -> None:
    """Dropped, as the docstring says: the process goes on (no KeyboardInterrupt, no
    end by SIGTERM), and ``received_signal`` is left as it was."""
    result = subprocess.run(
        [sys.executable, "-c", _AFTER_THE_SHUTDOWN, signum, where],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "left the block None\nstill running\n"

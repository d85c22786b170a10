"""Names when you have none (DESIGN section 12): ``TaskSpec.name=None``.

A nameless task is named ``f"{qualname}{task_id}"`` when it is added or submitted; such
a name is a name: a name target, reserved while the task lives, and refused when a user
task already holds it. Keyed calls (``run_in_slot``) use the same scheme, but their
names are labels that reserve nothing.
"""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ControllerSpec,
    OutcomeKind,
    RejectionKind,
    TaskNameInUseError,
    TaskSpec,
    current_context,
)

from helpers import supervisor


async def poll(seconds: float = 0.0) -> str:
    await trio.sleep(seconds)
    return current_context().name


class Poller:
    async def __call__(self) -> str:
        return current_context().name

    async def once(self) -> str:
        return current_context().name


async def test_a_nameless_task_is_named_after_its_function_and_id(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``poll#7``: the qualname, then ``str(TaskId)``; the waiter and the task agree."""
    spec = TaskSpec.once(None, poll)
    assert spec.name is None
    async with supervisor() as sup:
        waiter = await sup.add(spec)
        assert waiter.name == f"poll{waiter.id}"
        assert (await waiter.wait()).value == waiter.name


async def test_one_nameless_spec_can_be_added_twice(autojump_clock: trio.abc.Clock) -> None:
    """Unique by construction: the same spec makes two tasks with two names."""
    spec = TaskSpec.once(None, poll, 1.0)
    async with supervisor() as sup:
        first = await sup.add(spec)
        second = await sup.add(spec)
        assert sorted(i.name for i in sup.list()) == sorted([first.name, second.name])
        assert first.name != second.name


async def test_qualnames_of_partials_methods_and_callable_objects(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A partial's name is the wrapped function's, a callable object's its type's."""
    async with supervisor() as sup:
        partial = await sup.add(TaskSpec.once(None, functools.partial(functools.partial(poll), 0)))
        method = await sup.add(TaskSpec.once(None, Poller().once))
        obj = await sup.add(TaskSpec.once(None, Poller()))
    assert partial.name == f"poll{partial.id}"
    assert method.name == f"Poller.once{method.id}"
    assert obj.name == f"Poller{obj.id}"


async def test_remove_and_cancel_reach_a_nameless_task_by_its_name(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``remove("poll#7")`` / ``cancel("poll#7")`` stop the nameless task named so."""
    async with supervisor() as sup:
        first = await sup.add(TaskSpec.once(None, poll, 5.0))
        second = await sup.add(TaskSpec.once(None, poll, 5.0))
        assert await sup.remove(first.name)
        assert await sup.cancel(second.name)
        assert second.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert (await first.wait()).kind is OutcomeKind.CANCELLED
        assert not await sup.remove(first.name)  # gone: the name is free again


async def test_an_automatic_name_is_reserved_while_its_task_lives(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A user spec named like a live nameless task is refused; once it ended, accepted."""
    async with supervisor() as sup:
        nameless = await sup.add(TaskSpec.once(None, poll, 5.0))
        with pytest.raises(TaskNameInUseError) as info:
            await sup.add(TaskSpec.once(nameless.name, poll, 5.0))
        assert info.value.name == nameless.name
        assert [i.id for i in sup.list()] == [nameless.id]
        await nameless.wait()
        namesake = await sup.add(TaskSpec.once(nameless.name, poll))
        assert (await namesake.wait()).value == nameless.name


async def test_a_user_task_holding_the_automatic_name_keeps_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The nameless ``add`` whose automatic name a user task holds raises; the user's stays."""
    async with supervisor(max_slot_queue=4) as sup:
        peek = int(sup.prepare_submission(ControllerSpec.queue(TaskSpec.once("p", poll))).id)
        squatter = await sup.add(TaskSpec.once(f"poll#{peek + 2}", poll, 5.0))
        with pytest.raises(TaskNameInUseError, match=f"poll#{peek + 2}"):
            await sup.add(TaskSpec.once(None, poll))
        assert [i.id for i in sup.list()] == [squatter.id]
        # Nameless controller work is rejected at admission, as any duplicate name is.
        taken = await sup.add(TaskSpec.once(f"poll#{peek + 4}", poll, 5.0))
        waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once(None, poll), slot="s"))
        assert waiter.name == taken.name
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.REJECTED
        assert outcome.rejection is RejectionKind.ALREADY_EXISTS
        assert {i.id for i in sup.list()} == {squatter.id, taken.id}


async def test_a_batch_of_nameless_specs_never_conflicts_with_itself(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Automatic names are unique by construction: one spec twice in a batch is fine."""
    spec = TaskSpec.once(None, poll)
    async with supervisor() as sup:
        waiters = await sup.add_batch([spec, spec, TaskSpec.once("named", poll)])
        outcomes = [await w.wait() for w in waiters]
    assert [o.value for o in outcomes] == [w.name for w in waiters]


async def test_submitted_nameless_work_is_named_at_submit(autojump_clock: trio.abc.Clock) -> None:
    """Controller work needs its slot; the name comes from the function and id."""
    async with supervisor(max_slot_queue=4) as sup:
        waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once(None, poll), slot="feeds"))
        assert (await waiter.wait()).value == f"poll{waiter.id}"
        prepared = sup.prepare_submission(
            ControllerSpec.replace(TaskSpec.once(None, poll), slot="feeds")
        )
        assert (await (await prepared.submit()).wait()).value == f"poll{prepared.id}"


async def test_a_keyed_calls_name_reserves_nothing(autojump_clock: trio.abc.Clock) -> None:
    """A user task may take a running keyed call's name; the call still completes."""
    async with supervisor(max_slot_queue=4) as sup, trio.open_nursery() as nursery:
        names: list[str] = []

        async def call() -> None:
            names.append(await sup.run_in_slot("s", poll, 1.0))

        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        [running] = sup.list()
        namesake = await sup.add(TaskSpec.once(running.name, poll))
        assert (await namesake.wait()).value == running.name
    assert names == [running.name]


async def test_keyed_calls_use_the_same_naming_scheme(autojump_clock: trio.abc.Clock) -> None:
    """``run_in_slot`` work is named ``{qualname}{id}`` (no more ``slot/call-n``)."""
    async with supervisor(max_slot_queue=4) as sup:
        name = await sup.run_in_slot("s", poll)
    assert name.startswith("poll#")
    assert name == f"poll#{int(name.removeprefix('poll#'))}"


async def test_is_alive_finds_a_running_nameless_task(autojump_clock: trio.abc.Clock) -> None:
    """``is_alive`` works for automatic names too."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once(None, poll, 5.0))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.is_alive(waiter.name)
        assert sup.alive_snapshot() == (waiter.name,)

"""Names when you have none (DESIGN section 12): ``TaskSpec.name=None``.

A nameless task is named ``f"{qualname}{task_id}"`` when it is added or submitted; such
a name is a label: it reserves nothing, so it never collides with a user's task name,
and name targets do not find it (its ``TaskId`` does). Keyed calls (``run_in_slot``)
use the same scheme.
"""

from __future__ import annotations

import functools

import trio
import trio.testing

from trio_taskvisor import ControllerSpec, OutcomeKind, TaskSpec, current_context

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


async def test_an_automatic_name_never_collides_with_a_user_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A user task may take the very name a nameless task carries, and the reverse."""
    async with supervisor() as sup:
        nameless = await sup.add(TaskSpec.once(None, poll, 5.0))
        namesake = await sup.add(TaskSpec.once(nameless.name, poll, 5.0))
        assert [i.name for i in sup.list()] == [nameless.name, nameless.name]
        # The name target finds the user's task only; the id finds the nameless one.
        assert await sup.remove(nameless.name)
        await trio.testing.wait_all_tasks_blocked()
        assert namesake.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert [i.id for i in sup.list()] == [nameless.id]
        assert not await sup.remove(nameless.name)
        assert await sup.remove(nameless.id)


async def test_a_batch_of_nameless_specs_never_conflicts(autojump_clock: trio.abc.Clock) -> None:
    """Automatic names are no duplicates, within the batch or against live tasks."""
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

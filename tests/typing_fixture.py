# pyright: strict
"""Types that flow: a fixture for ``tests/test_typing.py``.

Never imported or run: mypy --strict and pyright check it. A line ending in
``# revealed: <type>`` must reveal that type (module paths left out); a line ending in
``# error`` must be a type error for both; every other line must be clean.
"""

from __future__ import annotations

from typing import reveal_type

import trio

from trio_taskvisor import (
    ConcurrencyLimit,
    ControllerSpec,
    RateLimit,
    Supervisor,
    TaskSpec,
    open_supervisor,
)


async def fetch(url: str) -> int:
    return len(url)


async def nothing() -> None:
    pass


async def serve(port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started(port)


spec = TaskSpec.once("fetch", fetch, "https://example.org")
reveal_type(spec)  # revealed: TaskSpec[int]
reveal_type(TaskSpec.restartable("poll", fetch, "u", healthy_after=60.0))  # revealed: TaskSpec[int]
reveal_type(TaskSpec.periodic("tick", 5.0, nothing))  # revealed: TaskSpec[None]
reveal_type(TaskSpec.once("key", fetch, "u", critical=True))  # revealed: TaskSpec[int]
reveal_type(TaskSpec.once(None, fetch, "u"))  # revealed: TaskSpec[int]
exports, partner = ConcurrencyLimit("exports", 4), RateLimit("partner", 100, per=60.0)
limited = TaskSpec.once("x", fetch, "u", limits=(exports, partner.key("acme")))
reveal_type(limited)  # revealed: TaskSpec[int]
TaskSpec.once("x", fetch, "u", limits=[exports])  # error
TaskSpec.once("x", fetch, "u", timeout="1")  # error
TaskSpec.once("x", fetch, "u", no_such_option=1)  # error
reveal_type(ControllerSpec.replace(spec, slot="k"))  # revealed: ControllerSpec[int]

TaskSpec.once("bad", fetch, 1, 2, 3)  # error
TaskSpec.once("bad", fetch, 1)  # error
TaskSpec.restartable("bad", fetch)  # error
TaskSpec.periodic("bad", 1.0, fetch, b"u")  # error


async def flows(sup: Supervisor) -> None:
    waiter = await sup.add(spec)
    reveal_type(waiter)  # revealed: TaskWaiter[int]
    outcome = await waiter.wait()
    reveal_type(outcome)  # revealed: TaskOutcome[int]
    reveal_type(outcome.unwrap())  # revealed: int
    reveal_type(outcome.value)  # revealed: int | None
    reveal_type(waiter.outcome_nowait())  # revealed: TaskOutcome[int]
    reveal_type(waiter.done)  # revealed: bool
    reveal_type(sup.closing)  # revealed: bool
    reveal_type(sup.add_nowait(spec))  # revealed: TaskWaiter[int]
    reveal_type(await sup.submit(ControllerSpec.queue(spec, slot="k")))  # revealed: TaskWaiter[int]
    reveal_type(sup.submit_nowait(ControllerSpec.join(spec)))  # revealed: TaskWaiter[int]
    reveal_type(await sup.start(TaskSpec.once("server", serve, 8080)))  # revealed: TaskWaiter[None]
    reveal_type(await sup.start_in_slot(ControllerSpec.queue(spec)))  # revealed: TaskWaiter[int]
    prepared = sup.prepare_submission(ControllerSpec.queue(spec))
    reveal_type(prepared.request)  # revealed: ControllerSpec[int]
    reveal_type(await prepared.submit())  # revealed: TaskWaiter[int]
    reveal_type(await sup.run_in_slot("k", fetch, "u"))  # revealed: int
    reveal_type(await sup.run_in_slot("k", nothing))  # revealed: None
    waiters = await sup.add_batch([spec, TaskSpec.once("other", fetch, "v")])
    reveal_type(waiters)  # revealed: list[TaskWaiter[int]]
    await sup.add_batch([spec, TaskSpec.once("mixed", nothing)])

    await sup.run_in_slot("k", fetch, 5)  # error
    await sup.run_in_slot("k", fetch)  # error
    text: str = outcome.unwrap()  # error
    print(text)


async def service() -> None:
    async with open_supervisor(handle_signals=True) as sup:
        await trio.sleep_forever()  # a signal ends the body: the code below runs
    reveal_type(sup.received_signal)  # revealed: int | None

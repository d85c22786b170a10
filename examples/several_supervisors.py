"""Several supervisors: separate policies, limits and shutdown order in one program.

A frontend supervisor runs request handlers: a short grace window, at most two
handlers at once (``max_concurrent``). A background supervisor owns ledger writes:
keyed per account (one write at a time per account, accounts in parallel) and a
longer grace window, so a write in progress is allowed to finish.

The supervisors are independent: each has its own registry, limits, events and
shutdown. Nesting them fixes the shutdown order: the inner one (frontend) stops first,
so no handler is left calling into a background supervisor that is already closed.
``TaskId``s come from one process-wide counter, so ids never collide across
supervisors.
"""

import trio

from trio_taskvisor import (
    ControllerConfig,
    EventKind,
    Supervisor,
    SupervisorConfig,
    TaskEvent,
    TaskSpec,
    open_supervisor,
)

log: list[str] = []
t0 = 0.0


def note(text: str) -> None:
    log.append(f"{trio.current_time() - t0:4.1f} s  {text}")


class ShutdownNotes:
    """A subscriber that notes when its supervisor shuts down."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def on_event(self, event: TaskEvent) -> None:
        if event.kind in (EventKind.SHUTDOWN_REQUESTED, EventKind.ALL_STOPPED_WITHIN_GRACE):
            note(f"{self.name}: {event.kind.value}")


async def reconcile() -> None:
    await trio.sleep(0.1)


async def write_ledger(account: str, amount: int) -> str:
    note(f"ledger  {account} {amount:+d} start")
    await trio.sleep(0.2)
    note(f"ledger  {account} {amount:+d} done")
    return f"{account}:{amount:+d}"


async def handle_request(background: Supervisor, request: str, account: str, amount: int) -> str:
    note(f"handler {request} start")
    receipt = await background.run_in_slot(f"account:{account}", write_ledger, account, amount)
    note(f"handler {request} done -> {receipt}")
    return receipt


async def main() -> None:
    global t0
    background_config = SupervisorConfig(grace=5.0, controller=ControllerConfig())
    frontend_config = SupervisorConfig(grace=0.5, max_concurrent=2)
    async with (
        open_supervisor(background_config, subscribers=[ShutdownNotes("background")]) as background,
        open_supervisor(frontend_config, subscribers=[ShutdownNotes("frontend")]) as frontend,
    ):
        t0 = trio.current_time()
        requests = [("req-1", "alice", 50), ("req-2", "alice", -20), ("req-3", "bob", 70)]
        waiters = await frontend.add_batch(
            [
                TaskSpec.once(name, handle_request, background, name, acct, amt)
                for name, acct, amt in requests
            ]
        )
        for waiter in waiters:
            await waiter.wait()
        # The keyed calls took #4-#6 in the background: one id sequence for both.
        later = await background.add(TaskSpec.once("reconcile", reconcile))
        print(f"frontend ids {', '.join(str(w.id) for w in waiters)}; background {later.id}")
    print("\n".join(log))


if __name__ == "__main__":
    trio.run(main)

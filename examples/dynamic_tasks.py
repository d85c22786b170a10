"""Dynamic add and remove: one task per connected device, added and removed at runtime.

* ``await sup.add(spec)`` registers a task and returns its ``TaskWaiter``; a second
  task with a name in use raises ``TaskNameInUseError``.
* ``await sup.remove(name)`` requests a stop and returns at once (``True`` only for the
  caller that claimed the stop); ``await sup.cancel(name)`` also waits for the outcome.
* A name is free again once its task has left the registry (its waiter has resolved);
  the new task gets a new ``TaskId``: ids are never reused.
* ``sup.list()`` shows what is registered now; ``await sup.wait_idle()`` waits until
  nothing is.
"""

import trio

from trio_taskvisor import (
    SupervisorConfig,
    TaskNameInUseError,
    TaskSpec,
    open_supervisor,
)


async def stream_telemetry(device: str) -> None:
    samples = 0
    while True:  # until the device disconnects (the task is removed)
        await trio.sleep(0.05)  # read a sample
        samples += 1


def telemetry(device: str) -> TaskSpec:
    return TaskSpec.restartable(f"telemetry-{device}", stream_telemetry, device)


async def main() -> None:
    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        waiters = {device: await sup.add(telemetry(device)) for device in ("cam-1", "cam-2")}
        await trio.sleep(0.1)
        print("registered:", ", ".join(f"{i.name} {i.id} {i.state.value}" for i in sup.list()))

        try:
            await sup.add(telemetry("cam-1"))  # cam-1 reconnects before we noticed it left
        except TaskNameInUseError as exc:
            print(f"duplicate: {exc}")

        # cam-1 disconnects: request the stop; the first caller claims it.
        print("remove cam-1:", await sup.remove("telemetry-cam-1"))
        print("remove cam-1 again:", await sup.remove("telemetry-cam-1"))
        outcome = await waiters["cam-1"].wait()  # resolves once the task has left
        print(f"cam-1 ended {outcome.kind.name}")

        # The name is free again: a new task, a new id.
        again = await sup.add(telemetry("cam-1"))
        # (#3 went to the rejected duplicate: ids are allocated before admission.)
        print(f"cam-1 back as {again.id} (was {waiters['cam-1'].id})")

        # A new device; cancel() waits until the outcome is committed.
        await sup.add(telemetry("cam-3"))
        print("registered:", ", ".join(info.name for info in sup.list()))
        for info in sup.list():
            await sup.cancel(info.id)
        await sup.wait_idle()
        print(f"idle: {len(sup.list())} registered")


if __name__ == "__main__":
    trio.run(main)

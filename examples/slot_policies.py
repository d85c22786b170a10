"""One key, one owner: the four slot policies side by side.

Each slot has at most one owner at a time. A busy slot decides by policy what a new
submission does: QUEUE waits its turn (FIFO), REPLACE stops the owner and goes next,
DROP_IF_RUNNING is rejected, JOIN resolves to the outcome of the slot's last work.
"""

import trio

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    SupervisorConfig,
    TaskSpec,
    open_supervisor,
)


async def sync_tenant(tenant: str, revision: int) -> str:
    await trio.sleep(1.0)  # talk to the tenant's backend
    return f"{tenant}@r{revision}"


async def main() -> None:
    config = SupervisorConfig(grace=2.0, controller=ControllerConfig(max_slot_queue=10))
    async with open_supervisor(config) as sup:

        def sync(revision: int) -> TaskSpec:
            return TaskSpec.once(f"sync-acme-r{revision}", sync_tenant, "acme", revision)

        first = await sup.submit(ControllerSpec.queue(sync(1), slot="acme"))
        queued = await sup.submit(ControllerSpec.queue(sync(2), slot="acme"))
        newest = await sup.submit(ControllerSpec.replace(sync(3), slot="acme"))
        dropped = await sup.submit(ControllerSpec.drop_if_running(sync(4), slot="acme"))
        joined = await sup.submit(ControllerSpec.join(sync(5), slot="acme"))

        for waiter in (first, queued, newest, dropped, joined):
            outcome = await waiter.wait()
            detail = outcome.rejection or outcome.value
            print(f"{waiter.name}: {outcome.kind.name} {detail}")


if __name__ == "__main__":
    trio.run(main)

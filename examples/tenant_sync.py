"""Tenant sync with REPLACE: only the newest revision of each tenant matters.

Webhooks announce tenant revisions; each revision is a sync submitted with
``ControllerSpec.replace(..., slot=f"tenant:{tenant}")``. The slot has one owner at a
time, so two syncs of one tenant never overlap, while tenants sync in parallel. A new
revision arriving while a sync runs stops it (the slot goes RUNNING -> TERMINATING)
and becomes the next in line; a revision that is still waiting when an even newer one
arrives is dropped (``REJECTED`` ``SUPERSEDED``): it would be out of date anyway.

The sync applies one page at a time inside ``defer_cancel()``, so a replaced sync stops
between pages, never halfway through one.
"""

import trio

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    SupervisorConfig,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
)

PAGES = 3
applied: list[str] = []


async def sync_tenant(tenant: str, revision: int) -> int:
    ctx = current_context()
    for page in range(1, PAGES + 1):
        with ctx.defer_cancel():  # a page is applied whole: a stop waits for it
            await trio.sleep(0.3)
            applied.append(f"{tenant} r{revision} page {page}")
        await trio.sleep(0.01)  # between pages, a stop lands
    return revision


async def main() -> None:
    config = SupervisorConfig(grace=2.0, controller=ControllerConfig())
    async with open_supervisor(config) as sup:

        async def webhook(tenant: str, revision: int) -> TaskWaiter:
            spec = TaskSpec.once(f"sync-{tenant}-r{revision}", sync_tenant, tenant, revision)
            return await sup.submit(ControllerSpec.replace(spec, slot=f"tenant:{tenant}"))

        acme_r1 = await webhook("acme", 1)
        globex_r1 = await webhook("globex", 1)  # another slot: runs in parallel
        await trio.sleep(0.45)  # acme r1 is in its second page
        acme_r2 = await webhook("acme", 2)  # stops r1 (after its page), waits for the slot
        acme_r3 = await webhook("acme", 3)  # displaces r2, which never runs
        await trio.sleep(0.02)
        view = sup.controller_snapshot().slot("tenant:acme")
        assert view is not None
        status = view.status.name if view.status else "idle"
        print(f"tenant:acme is {status}, {view.queue_depth} waiting")

        for waiter in (acme_r1, acme_r2, acme_r3, globex_r1):
            outcome = await waiter.wait()
            detail = outcome.rejection.name if outcome.rejection else outcome.value
            print(f"{waiter.name}: {outcome.kind.name} {detail or ''}".rstrip())

    print("pages applied:", "; ".join(applied))


if __name__ == "__main__":
    trio.run(main)

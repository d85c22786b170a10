"""Keyed scheduling: serialize per key, keep the newest, single-flight.

* Saves of one document run one at a time, in order; different documents run in
  parallel, sharing a global limit of 8 (fair across documents).
* A tenant sync keeps only the newest revision: REPLACE stops the running sync.
* Concurrent cache refreshes share one run: JOIN resolves to the running refresh.
"""

import trio

from trio_taskvisor import (
    AdmissionPolicy,
    ControllerConfig,
    ControllerSpec,
    OutcomeError,
    SupervisorConfig,
    TaskSpec,
    open_supervisor,
)

saved: list[str] = []


async def save(document: str, text: str) -> int:
    await trio.sleep(0.1)  # write to storage
    saved.append(f"{document}: {text}")
    return len(text)


async def sync_tenant(tenant: str, revision: int) -> int:
    await trio.sleep(1.0)
    return revision


refreshes = 0


async def refresh_cache() -> str:
    global refreshes
    refreshes += 1
    await trio.sleep(0.5)
    return "fresh"


async def main() -> None:
    config = SupervisorConfig(max_concurrent=8, controller=ControllerConfig())
    async with open_supervisor(config) as sup:
        waiters = [
            await sup.submit(
                ControllerSpec.queue(
                    TaskSpec.once(f"save-{doc}-{i}", save, doc, f"edit {i}"), slot=f"doc:{doc}"
                )
            )
            for i in range(3)
            for doc in ("a.txt", "b.txt")
        ]
        for waiter in waiters:
            await waiter.wait()
        print("\n".join(saved))  # per document, edits in submission order

        async def sync(revision: int) -> None:
            try:
                result = await sup.run_in_slot(
                    "tenant:acme", sync_tenant, "acme", revision, policy=AdmissionPolicy.REPLACE
                )
                print(f"revision {revision} synced -> {result}")
            except OutcomeError as exc:
                print(f"revision {revision} {exc.outcome.kind.name.lower()}")

        async with trio.open_nursery() as nursery:
            for revision in (1, 2, 3):
                nursery.start_soon(sync, revision)
                await trio.sleep(0.2)

        results: list[str] = []

        async def read_through() -> None:
            results.append(
                await sup.run_in_slot("cache", refresh_cache, policy=AdmissionPolicy.JOIN)
            )

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(read_through)
        print(f"{len(results)} readers, {refreshes} refresh")


if __name__ == "__main__":
    trio.run(main)

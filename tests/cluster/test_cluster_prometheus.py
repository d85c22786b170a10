"""The Prometheus subscriber of a supervisor with a slot store, against the real server:
lease acquisitions, a lease loss and one outage, counted from the real events."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

import trio
from conftest import RedisServer
from prometheus_client import CollectorRegistry

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    SlotStatus,
    SupervisorConfig,
    TaskSpec,
    open_supervisor,
)
from trio_taskvisor.contrib.prometheus import PrometheusSubscriber
from trio_taskvisor.redis import RedisSlotStore
from trio_taskvisor.testing import EventRecorder


async def test_leases_losses_and_outages_are_counted(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Two owners take a lease each; a paused server costs the third its lease and is one
    outage, however many round trips fail; a REMOTE slot shows in the slots gauge."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry, slot_labels=["billing"])
    recorder = EventRecorder()
    config = SupervisorConfig(grace=1.0, controller=ControllerConfig(slot_store=store))
    gate, forever = trio.Event(), trio.Event()

    async def held() -> None:
        await gate.wait()

    async def blocked() -> None:
        await forever.wait()

    async with open_supervisor(config, subscribers=[metrics, recorder]) as sup:
        metrics.bind(sup)
        for slot in ("billing", "tenant-1"):
            await sup.run_in_slot(slot, trio.lowlevel.checkpoint)
        elsewhere = EventRecorder()
        async with open_supervisor(config, subscribers=[elsewhere]) as other:
            await other.submit(ControllerSpec.queue(TaskSpec.once("elsewhere", held), slot="r"))
            await elsewhere.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED)
            queued = await sup.submit(ControllerSpec.queue(TaskSpec.once("behind", held), slot="r"))
            await recorder.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=queued.id)
            remote = registry.get_sample_value(
                "taskvisor_slots", {"slot": "other", "status": SlotStatus.REMOTE.value}
            )
            assert remote == 1.0
            await sup.cancel(queued.id)
            gate.set()
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("owner", blocked), slot="billing")
        )
        await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        redis_server.pause()
        assert (await owner.wait()).kind is OutcomeKind.LEASE_LOST
        await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        redis_server.resume()
        await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)

    def total(name: str, slot: str) -> float | None:
        return registry.get_sample_value(f"taskvisor_{name}_total", {"slot": slot})

    assert (total("lease_acquisitions", "billing"), total("lease_acquisitions", "other")) == (
        2.0,
        1.0,
    )
    assert (total("lease_losses", "billing"), total("lease_losses", "other")) == (1.0, 0.0)
    assert registry.get_sample_value("taskvisor_store_outages_total") == 1.0

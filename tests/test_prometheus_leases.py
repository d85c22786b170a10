"""The Prometheus subscriber's cluster counters: lease acquisitions, lease losses, store
outages (the events a controller with a slot store publishes; against a real server in
``tests/cluster/test_cluster_prometheus.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry

from trio_taskvisor import EventKind, TaskEvent, TaskId
from trio_taskvisor.contrib.prometheus import PrometheusSubscriber


def event(kind: EventKind, slot: str | None = None) -> TaskEvent:
    task = None if slot is None else TaskId(1)
    return TaskEvent(1, 0.0, 0.0, kind, task, "t", slot, fence_token=None if slot is None else 7)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_cluster_counters_are_exported_at_zero_without_labels() -> None:
    """The three counters exist from the start, at 0, with no label by default."""
    registry = CollectorRegistry()
    PrometheusSubscriber(registry)
    for name in ("lease_acquisitions", "lease_losses", "store_outages"):
        assert value(registry, f"taskvisor_{name}_total") == 0.0


async def test_lease_events_and_outages_are_counted() -> None:
    """Each lease acquisition, lease loss and outage start counts once; a recovery not."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    for kind in (
        EventKind.CONTROLLER_LEASE_ACQUIRED,
        EventKind.CONTROLLER_LEASE_ACQUIRED,
        EventKind.CONTROLLER_LEASE_LOST,
    ):
        await metrics.on_event(event(kind, "billing"))
    await metrics.on_event(event(EventKind.CONTROLLER_STORE_UNAVAILABLE))
    await metrics.on_event(event(EventKind.CONTROLLER_STORE_RECOVERED))
    assert value(registry, "taskvisor_lease_acquisitions_total") == 2.0
    assert value(registry, "taskvisor_lease_losses_total") == 1.0
    assert value(registry, "taskvisor_store_outages_total") == 1.0


async def test_lease_counters_follow_the_slot_allow_list() -> None:
    """With ``slot_labels``, lease counters carry ``slot`` (``other`` for unlisted slots);
    the outage counter, which concerns no slot, stays label-free."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry, slot_labels=["billing"])
    assert value(registry, "taskvisor_lease_losses_total", slot="billing") == 0.0
    await metrics.on_event(event(EventKind.CONTROLLER_LEASE_ACQUIRED, "billing"))
    await metrics.on_event(event(EventKind.CONTROLLER_LEASE_ACQUIRED, "tenant-7"))
    await metrics.on_event(event(EventKind.CONTROLLER_LEASE_LOST, "tenant-7"))
    await metrics.on_event(event(EventKind.CONTROLLER_STORE_UNAVAILABLE))
    name = "taskvisor_lease_acquisitions_total"
    assert value(registry, name, slot="billing") == 1.0
    assert value(registry, name, slot="other") == 1.0
    assert value(registry, "taskvisor_lease_losses_total", slot="other") == 1.0
    assert value(registry, "taskvisor_lease_losses_total", slot="billing") == 0.0
    assert value(registry, "taskvisor_store_outages_total") == 1.0


def test_unregister_removes_the_cluster_counters() -> None:
    """``unregister()`` takes the cluster counters out too: the namespace can be reused."""
    registry = CollectorRegistry()
    PrometheusSubscriber(registry).unregister()
    assert list(registry.collect()) == []
    PrometheusSubscriber(registry)

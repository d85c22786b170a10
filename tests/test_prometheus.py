"""The Prometheus subscriber: counters from events, gauges from the bound supervisor."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("prometheus_client")

import trio
import trio.testing
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from trio_taskvisor import (
    ConcurrencyLimit,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    Supervisor,
    SupervisorConfig,
    TaskSpec,
    open_supervisor,
)
from trio_taskvisor.contrib import prometheus
from trio_taskvisor.contrib.prometheus import PrometheusSubscriber
from trio_taskvisor.testing import EventRecorder

from helpers import ROOT, flaky, forever


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


# -- counters -------------------------------------------------------------------------------


async def test_attempts_are_counted_by_result(autojump_clock: trio.testing.MockClock) -> None:
    """Two failed attempts and one success count as such."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(subscribers=[metrics]) as sup:
        await (await sup.add(TaskSpec.restartable("flaky", flaky))).wait()
    assert value(registry, "taskvisor_attempts_total", result="failed") == 2.0
    assert value(registry, "taskvisor_attempts_total", result="succeeded") == 1.0
    assert value(registry, "taskvisor_attempts_total", result="timed_out") == 0.0


async def test_attempt_durations_are_observed_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each attempt's event duration (1 s in virtual time) lands in the histogram."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[metrics, recorder]) as sup:
        await (await sup.add(TaskSpec.restartable("flaky", flaky))).wait()
    failed = [e.duration for e in recorder.of(EventKind.ATTEMPT_FAILED)]
    assert failed == [pytest.approx(1.0)] * 2
    name = "taskvisor_attempt_duration_seconds"
    assert value(registry, f"{name}_count", result="failed") == 2.0
    assert value(registry, f"{name}_sum", result="failed") == sum(d for d in failed if d)
    assert value(registry, f"{name}_bucket", result="succeeded", le="0.5") == 0.0
    assert value(registry, f"{name}_bucket", result="succeeded", le="1.0") == 1.0


async def test_timeouts_are_a_result_of_their_own(autojump_clock: trio.testing.MockClock) -> None:
    """An attempt that exceeds its timeout counts as ``timed_out``, not ``failed``."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(subscribers=[metrics]) as sup:
        await (await sup.add(TaskSpec.once("slow", forever, timeout=2.0))).wait()
    assert value(registry, "taskvisor_attempts_total", result="timed_out") == 1.0
    assert value(registry, "taskvisor_attempts_total", result="failed") == 0.0
    assert value(registry, "taskvisor_outcomes_total", outcome="failed") == 1.0


async def test_outcomes_are_counted_by_kind(autojump_clock: trio.testing.MockClock) -> None:
    """Every TASK_FINISHED counts once under its outcome kind."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(subscribers=[metrics]) as sup:
        await (await sup.add(TaskSpec.restartable("flaky", flaky))).wait()
        await sup.add(TaskSpec.once("forever", forever))
        await sup.cancel("forever")
    assert value(registry, "taskvisor_outcomes_total", outcome="completed") == 1.0
    assert value(registry, "taskvisor_outcomes_total", outcome="cancelled") == 1.0
    assert value(registry, "taskvisor_outcomes_total", outcome="fatal") == 0.0


async def test_rejections_are_counted_by_kind_and_as_rejected_outcomes() -> None:
    """Registry and controller rejections count by RejectionKind and as ``rejected``."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config, subscribers=[metrics]) as sup:
        await sup.add(TaskSpec.once("busy", forever))
        duplicate = sup.add_nowait(TaskSpec.once("busy", forever))
        await duplicate.wait()
        await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", forever), slot="k"))
        dropped = await sup.submit(
            ControllerSpec.drop_if_running(TaskSpec.once("late", forever), slot="k")
        )
        assert (await dropped.wait()).rejection is RejectionKind.SLOT_BUSY
        await sup.cancel("busy")
        await sup.cancel("owner")
    assert value(registry, "taskvisor_rejections_total", rejection="already_exists") == 1.0
    assert value(registry, "taskvisor_rejections_total", rejection="slot_busy") == 1.0
    assert value(registry, "taskvisor_outcomes_total", outcome="rejected") == 2.0


def test_every_label_value_is_exported_from_the_start() -> None:
    """Each result, outcome and rejection kind has a series at 0 before any event."""
    registry = CollectorRegistry()
    PrometheusSubscriber(registry)
    for result in ("succeeded", "failed", "timed_out", "cancelled"):
        assert value(registry, "taskvisor_attempts_total", result=result) == 0.0
    for outcome in OutcomeKind:
        assert value(registry, "taskvisor_outcomes_total", outcome=outcome.value) == 0.0
    for rejection in RejectionKind:
        assert value(registry, "taskvisor_rejections_total", rejection=rejection.value) == 0.0


def test_no_slot_or_task_label_by_default() -> None:
    """Without an allow-list the exposition has no ``slot`` or task label at all."""
    registry = CollectorRegistry()
    PrometheusSubscriber(registry)
    text = generate_latest(registry).decode()
    assert "slot=" not in text
    assert "name=" not in text


def test_namespace_prefixes_every_metric() -> None:
    """``namespace`` replaces ``taskvisor`` in every name."""
    registry = CollectorRegistry()
    PrometheusSubscriber(registry, namespace="jobs")
    assert value(registry, "jobs_attempts_total", result="failed") == 0.0
    names = {m.name for m in registry.collect()}
    assert names
    assert {name for name in names if not name.startswith("jobs_")} == set()


async def test_an_empty_namespace_leaves_every_name_unprefixed() -> None:
    """``namespace=""``: counters and bound gauges alike drop the prefix and its ``_``,
    as ``prometheus_client`` joins a name's parts (``attempts``, ``registered_tasks``)."""
    names: dict[str, set[str]] = {}
    for namespace in ("taskvisor", ""):
        registry = CollectorRegistry()
        metrics = PrometheusSubscriber(registry, namespace=namespace)
        async with open_supervisor() as sup:
            metrics.bind(sup)
            names[namespace] = {m.name for m in registry.collect()}
    assert "registered_tasks" in names[""]
    assert names[""] == {name.removeprefix("taskvisor_") for name in names["taskvisor"]}


async def test_allow_listed_slots_get_their_own_label_value() -> None:
    """A listed slot keeps its name; other slots aggregate as "other"; no slot is ""."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry, slot_labels=["billing"])
    config = SupervisorConfig(controller=ControllerConfig())

    async def done() -> None:
        await trio.lowlevel.checkpoint()

    async with open_supervisor(config, subscribers=[metrics]) as sup:
        for slot in ("billing", "tenant-1", "tenant-2"):
            waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once(slot, done), slot=slot))
            await waiter.wait()
        await (await sup.add(TaskSpec.once("plain", done))).wait()
    attempts = "taskvisor_attempts_total"
    assert value(registry, attempts, result="succeeded", slot="billing") == 1.0
    assert value(registry, attempts, result="succeeded", slot="other") == 2.0
    assert value(registry, attempts, result="succeeded", slot="") == 1.0
    assert value(registry, attempts, result="succeeded", slot="tenant-1") is None


def test_slot_labels_must_not_be_a_bare_string() -> None:
    """``slot_labels="billing"`` would allow-list single letters: a TypeError instead."""
    with pytest.raises(TypeError, match="slot_labels"):
        PrometheusSubscriber(CollectorRegistry(), slot_labels="billing")


async def test_missed_events_are_counted_from_overflow_markers() -> None:
    """Events lost to this subscriber's full queue are counted, equal to its drops."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry, queue_capacity=1)

    async def done() -> None:
        await trio.lowlevel.checkpoint()

    async with open_supervisor(subscribers=[metrics]) as sup:
        waiters = await sup.add_batch([TaskSpec.once(f"t{i}", done) for i in range(5)])
        for waiter in waiters:
            await waiter.wait()
        await trio.testing.wait_all_tasks_blocked()
        dropped = sup.statistics().subscriber_dropped["PrometheusSubscriber"]
    assert dropped > 0
    assert value(registry, "taskvisor_metrics_missed_events_total") == dropped


def test_unregister_removes_every_metric() -> None:
    """After ``unregister()`` the same namespace can be registered again."""
    registry = CollectorRegistry()
    PrometheusSubscriber(registry).unregister()
    assert list(registry.collect()) == []
    PrometheusSubscriber(registry)


def test_a_second_subscriber_of_one_namespace_is_told_what_to_do() -> None:
    """Two subscribers of one namespace in one registry (a test suite that makes one per
    test with the default registry): ``ConfigError`` naming the way out, and the
    registry left as the first one made it. Before, prometheus_client's "Duplicated
    timeseries" alone."""
    registry = CollectorRegistry()
    first = PrometheusSubscriber(registry)
    before = generate_latest(registry)
    with pytest.raises(ConfigError, match=r"already has metrics named as this subscriber's"):
        PrometheusSubscriber(registry)
    assert generate_latest(registry) == before
    # A metric of the application's own under the gauges' names: the same, nothing left.
    clash = CollectorRegistry()
    Gauge("taskvisor_slots", "the application's own", registry=clash)
    with pytest.raises(ConfigError, match="unregister"):
        PrometheusSubscriber(clash)
    assert [m.name for m in clash.collect()] == ["taskvisor_slots"]
    first.unregister()
    PrometheusSubscriber(registry)


@pytest.mark.parametrize(
    "buckets",
    [[5.0, 1.0], [1.0, 1.0, 2.0], [float("nan")], [], [float("inf")]],
    ids=["unsorted", "repeated", "nan", "empty", "only-inf"],
)
def test_bad_buckets_are_named_as_such(buckets: list[float]) -> None:
    """A bucket list that is not increasing bounds (one at least below +Inf) raises
    ``ConfigError`` naming ``buckets``, and registers nothing; it is no registry clash."""
    registry = CollectorRegistry()
    with pytest.raises(ConfigError, match=r"^buckets must be increasing") as caught:
        PrometheusSubscriber(registry, buckets=buckets)
    assert "already has metrics" not in str(caught.value)
    assert list(registry.collect()) == []


def test_buckets_that_are_no_numbers_are_a_type_error() -> None:
    """``buckets=["fast", "slow"]``: ``TypeError`` naming ``buckets``, nothing registered."""
    registry = CollectorRegistry()
    with pytest.raises(TypeError, match=r"^buckets must be numbers"):
        PrometheusSubscriber(registry, buckets=["fast", "slow"])  # type: ignore[list-item]
    assert list(registry.collect()) == []


async def test_the_export_tables_list_every_metric() -> None:
    """The tables of the how-to and of the module's docstring name every metric a bound
    subscriber exports, and no other (``_total`` is the counters' sample suffix)."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(SupervisorConfig(controller=ControllerConfig())) as sup:
        metrics.bind(sup)
        exported = {m.name for m in registry.collect()}
    howto = (ROOT / "docs" / "howto-metrics.md").read_text(encoding="utf-8")
    for text, row in (
        (howto, r"^\| `(taskvisor_\w+)"),
        (prometheus.__doc__ or "", r"^``(taskvisor_\w+)"),
    ):
        tabled = {name.removesuffix("_total") for name in re.findall(row, text, re.MULTILINE)}
        assert tabled == exported


# -- gauges -----------------------------------------------------------------------------------


async def test_gauges_are_absent_until_bound() -> None:
    """Unbound, the subscriber exports counters only."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(subscribers=[metrics]) as sup:
        await sup.add(TaskSpec.once("forever", forever))
        assert value(registry, "taskvisor_registered_tasks") is None
        await sup.cancel("forever")


BIND_ELSEWHERE = (
    "metrics.bind() works only in the supervisor's trio run, in its thread; from another "
    "thread, go through trio.from_thread.run_sync(metrics.bind, sup)"
)


def test_bind_outside_a_trio_run_names_the_call() -> None:
    """``bind`` once the run is over raises ``RuntimeError`` naming ``bind`` and where it
    works, and binds nothing. Before, trio's bare "must be called from async context"."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)

    async def main() -> Supervisor:
        async with open_supervisor() as sup:
            return sup

    sup = trio.run(main)
    with pytest.raises(RuntimeError) as info:
        metrics.bind(sup)
    assert str(info.value) == BIND_ELSEWHERE
    assert value(registry, "taskvisor_registered_tasks") is None


async def test_bind_in_another_thread_names_the_way_through() -> None:
    """``bind`` in a worker thread, or in a trio run of another thread, raises
    ``RuntimeError`` naming ``trio.from_thread.run_sync``, which works. Before, a worker
    thread got trio's bare "must be called from async context", and another run's
    thread bound that run: the gauges were never exported."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)

    async def bind_there(sup: Supervisor) -> None:
        await trio.lowlevel.checkpoint()
        metrics.bind(sup)

    async with open_supervisor() as sup:
        await sup.add(TaskSpec.once("a", forever))
        with pytest.raises(RuntimeError) as in_worker:
            await trio.to_thread.run_sync(metrics.bind, sup)
        with pytest.raises(RuntimeError) as in_other_run:
            await trio.to_thread.run_sync(trio.run, bind_there, sup)
        assert str(in_worker.value) == str(in_other_run.value) == BIND_ELSEWHERE
        assert value(registry, "taskvisor_registered_tasks") is None
        await trio.to_thread.run_sync(trio.from_thread.run_sync, metrics.bind, sup)
        assert value(registry, "taskvisor_registered_tasks") == 1.0
        await sup.cancel("a")


async def test_bound_gauges_read_the_supervisor_at_collection() -> None:
    """Registered, alive and running follow the supervisor without any event."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor() as sup:  # not even subscribed: gauges need no events
        metrics.bind(sup)
        await sup.add(TaskSpec.once("a", forever))
        await sup.add(TaskSpec.once("b", forever))
        await trio.testing.wait_all_tasks_blocked()
        assert value(registry, "taskvisor_registered_tasks") == 2.0
        assert value(registry, "taskvisor_alive_tasks") == 2.0
        assert value(registry, "taskvisor_running_attempts") == 2.0
        assert value(registry, "taskvisor_waiting_for_permit") == 0.0
        await sup.cancel("a")
        assert value(registry, "taskvisor_registered_tasks") == 1.0
        await sup.cancel("b")
        assert value(registry, "taskvisor_alive_tasks") == 0.0


async def test_bound_gauges_show_slots_queued_and_held_work() -> None:
    """Live slots by status, queued and held submissions come from the snapshot."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    config = SupervisorConfig(controller=ControllerConfig(max_slot_queue=1))
    async with open_supervisor(config, subscribers=[metrics]) as sup:
        metrics.bind(sup)
        for i, wait in ((1, False), (2, False), (3, True)):
            spec = ControllerSpec.queue(TaskSpec.once(f"w{i}", forever), slot="k", wait=wait)
            await sup.submit(spec)
        await sup.submit(ControllerSpec.queue(TaskSpec.once("other", forever), slot="j"))
        await trio.testing.wait_all_tasks_blocked()
        assert value(registry, "taskvisor_slots", status="running") == 2.0
        assert value(registry, "taskvisor_slots", status="terminating") == 0.0
        assert value(registry, "taskvisor_queued_submissions") == 1.0
        assert value(registry, "taskvisor_held_submissions") == 1.0
        await sup.shutdown()
        assert value(registry, "taskvisor_slots", status="running") == 0.0


async def test_bound_gauges_show_limits_summed_over_keys() -> None:
    """Units held and waiters per limit, whatever the key: keys are often tenants."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    tenant = ConcurrencyLimit("tenant", 1)
    async with open_supervisor() as sup:
        metrics.bind(sup)
        assert value(registry, "taskvisor_limit_held", limit="tenant") is None
        for name, key in (("a1", "a"), ("a2", "a"), ("b1", "b")):
            await sup.add(TaskSpec.once(name, forever, limits=(tenant.key(key),)))
        await trio.testing.wait_all_tasks_blocked()
        assert value(registry, "taskvisor_limit_held", limit="tenant") == 2.0
        assert value(registry, "taskvisor_limit_waiting", limit="tenant") == 1.0
        await sup.shutdown()
        assert value(registry, "taskvisor_limit_held", limit="tenant") == 0.0


async def test_an_idle_limit_stays_exported_at_zero() -> None:
    """A limit seen in use is exported at 0 once its pools are idle, not dropped: the
    series never vanish between scrapes."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    db = ConcurrencyLimit("db", 1)
    async with open_supervisor() as sup:
        metrics.bind(sup)
        go = trio.Event()
        waiters = [await sup.add(TaskSpec.once(n, go.wait, limits=(db,))) for n in "ab"]
        await trio.testing.wait_all_tasks_blocked()
        assert value(registry, "taskvisor_limit_held", limit="db") == 1.0
        assert value(registry, "taskvisor_limit_waiting", limit="db") == 1.0
        go.set()
        for waiter in waiters:
            await waiter.wait()
        assert value(registry, "taskvisor_limit_held", limit="db") == 0.0
        assert value(registry, "taskvisor_limit_waiting", limit="db") == 0.0


async def test_bound_gauges_with_slot_labels_split_by_slot() -> None:
    """With an allow-list, slot gauges carry the slot label too."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry, slot_labels=["k"])
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config) as sup:
        metrics.bind(sup)
        for name, slot in (("k1", "k"), ("k2", "k"), ("x1", "x")):
            await sup.submit(ControllerSpec.queue(TaskSpec.once(name, forever), slot=slot))
        await trio.testing.wait_all_tasks_blocked()
        assert value(registry, "taskvisor_slots", slot="k", status="running") == 1.0
        assert value(registry, "taskvisor_slots", slot="other", status="running") == 1.0
        assert value(registry, "taskvisor_queued_submissions", slot="k") == 1.0
        assert value(registry, "taskvisor_queued_submissions", slot="other") == 0.0
        await sup.shutdown()


async def test_bound_gauges_can_be_scraped_from_another_thread() -> None:
    """A scrape from a worker thread (an HTTP exporter) hops into the trio thread."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor() as sup:
        metrics.bind(sup)
        await sup.add(TaskSpec.once("a", forever))
        text = await trio.to_thread.run_sync(generate_latest, registry)
        assert b"taskvisor_registered_tasks 1.0" in text
        await sup.cancel("a")


def test_after_the_run_ended_the_last_values_are_exported() -> None:
    """A scrape after ``trio.run`` returned reports the last values read."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)

    async def main() -> None:
        async with open_supervisor() as sup:
            metrics.bind(sup)
            await sup.add(TaskSpec.once("a", forever))
            assert value(registry, "taskvisor_registered_tasks") == 1.0
            await sup.cancel("a")

    trio.run(main)
    assert value(registry, "taskvisor_registered_tasks") == 1.0


async def test_events_published_and_dropped_follow_statistics() -> None:
    """The bound supervisor's event counters are exported as counters."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(subscribers=[metrics]) as sup:
        metrics.bind(sup)
        await (await sup.add(TaskSpec.once("a", trio.lowlevel.checkpoint))).wait()
        stats = sup.statistics()
        assert value(registry, "taskvisor_events_published_total") == stats.events_published
        assert value(registry, "taskvisor_events_dropped_total") == stats.events_dropped


async def test_stopped_attempt_whose_nursery_raises_counts_as_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """[Cancelled, ValueError] from a stopped attempt: a failed attempt, a cancelled task."""

    async def body() -> None:
        async def child() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise ValueError("cleanup")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await trio.sleep_forever()

    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(subscribers=[metrics]) as sup:
        await sup.add(TaskSpec.once("b", body))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("b")
    assert value(registry, "taskvisor_attempts_total", result="failed") == 1.0
    assert value(registry, "taskvisor_outcomes_total", outcome="cancelled") == 1.0


# -- forced work ----------------------------------------------------------


async def test_a_forced_exit_is_counted_and_is_no_attempt_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Forced at 1 s, returning at 5 s: one forced exit, no "succeeded" attempt."""

    async def overstays() -> str:
        with trio.CancelScope(shield=True):
            await trio.sleep(5.0)
        return "late"

    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    async with open_supervisor(SupervisorConfig(grace=1.0), subscribers=[metrics]) as sup:
        metrics.bind(sup)
        waiter = await sup.add(TaskSpec.once("overstays", overstays))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel("overstays")
        assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        assert value(registry, "taskvisor_forced_alive_tasks") == 1.0
        await trio.sleep(4.0)
        await trio.testing.wait_all_tasks_blocked()
        assert value(registry, "taskvisor_forced_alive_tasks") == 0.0
    assert value(registry, "taskvisor_forced_exits_total") == 1.0
    for result in ("succeeded", "failed", "timed_out", "cancelled"):
        assert value(registry, "taskvisor_attempts_total", result=result) == 0.0
    assert value(registry, "taskvisor_outcomes_total", outcome="force_aborted") == 1.0


async def test_forced_exits_carry_the_slot_label_when_allow_listed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With ``slot_labels``, forced exits are split by slot like the other counters."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry, slot_labels=["k"])
    assert value(registry, "taskvisor_forced_exits_total", slot="k") == 0.0
    config = SupervisorConfig(grace=0.0, controller=ControllerConfig())
    async with open_supervisor(config, subscribers=[metrics]) as sup:
        waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("t", forever), slot="k"))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel(waiter.id)  # grace=0: forced at the stop, exits at its next step
    assert value(registry, "taskvisor_forced_exits_total", slot="k") == 1.0
    assert value(registry, "taskvisor_forced_exits_total", slot="") == 0.0

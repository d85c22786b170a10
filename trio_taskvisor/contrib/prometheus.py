"""Prometheus metrics for a supervisor: ``PrometheusSubscriber``.

Needs the ``prometheus`` extra (``pip install 'trio_taskvisor[prometheus]'``)::

    metrics = PrometheusSubscriber()            # registers on prometheus_client.REGISTRY
    async with open_supervisor(config, subscribers=[metrics]) as sup:
        metrics.bind(sup)                       # optional: the gauges below
        ...

Exported (``taskvisor`` is the default ``namespace``):

====================================================  ========================================
metric                                                from
====================================================  ========================================
``taskvisor_attempts_total{result}``                  attempt events: ``succeeded``, ``failed``
                                                      (fatal included), ``timed_out``,
                                                      ``cancelled``
``taskvisor_attempt_duration_seconds{result}``        the same events' ``duration`` (histogram)
``taskvisor_forced_exits_total``                      ``FORCED_TASK_EXITED``: force-aborted tasks
                                                      that physically exited (their last attempt
                                                      is no attempt result)
``taskvisor_outcomes_total{outcome}``                 ``TASK_FINISHED.outcome``, and ``rejected``
                                                      for every rejection
``taskvisor_rejections_total{rejection}``             ``TASK_ADD_FAILED`` and
                                                      ``CONTROLLER_REJECTED`` by ``RejectionKind``
``taskvisor_lease_acquisitions_total``                ``CONTROLLER_LEASE_ACQUIRED``: cluster slot
                                                      leases this process took
``taskvisor_lease_losses_total``                      ``CONTROLLER_LEASE_LOST``: owners forced
                                                      because their lease was lost
``taskvisor_store_outages_total``                     ``CONTROLLER_STORE_UNAVAILABLE``: outages of
                                                      the slot store, once each
``taskvisor_metrics_missed_events_total``             events this subscriber lost to overflow
``taskvisor_registered_tasks``                        bound: ``statistics().registered``
``taskvisor_alive_tasks``                             bound: ``statistics().alive``
``taskvisor_forced_alive_tasks``                      bound: ``statistics().forced_alive``
``taskvisor_running_attempts``                        bound: ``statistics().running_attempts``
``taskvisor_waiting_for_permit``                      bound: ``statistics().waiting_for_permit``
``taskvisor_events_published_total``                  bound: ``statistics().events_published``
``taskvisor_events_dropped_total``                    bound: ``statistics().events_dropped``
``taskvisor_slots{status}``                           bound: live controller slots by status
                                                      (``remote``: owned by another process;
                                                      ``idle``: held work only)
``taskvisor_queued_submissions``                      bound: ``controller_snapshot().total_queued``
``taskvisor_held_submissions``                        bound: held wait-mode submissions
``taskvisor_limit_held{limit}``                       bound: ``limit_snapshot()``'s ``held``,
                                                      summed over the keys of each limit
``taskvisor_limit_waiting{limit}``                    bound: ``limit_snapshot()``'s ``waiting``,
                                                      summed over the keys of each limit
====================================================  ========================================

Every label value of every kind is exported from the start (at 0), so rates and
absent series never need special cases. A limit's name is known once a scrape saw its
pools in use: from then on it is exported, at 0 while they are idle.

Decisions the design leaves open:

* **Counters come from events; gauges come from the bound supervisor.** Counting
  ``TASK_ADDED`` minus ``TASK_REMOVED`` would drift for ever after one dropped event,
  so gauges are read from ``sup.statistics()`` and ``sup.controller_snapshot()`` at
  scrape time instead. A scrape from another thread (``prometheus_client``'s
  ``start_http_server``) hops into the supervisor's trio thread with
  ``trio.from_thread.run_sync`` and waits for it; a scrape in the trio thread itself
  (an ASGI ``/metrics`` handler) reads directly. After the trio run has ended, the last
  values read are exported. Without ``bind`` the gauges are not exported. ``bind`` works
  only in the supervisor's trio run, in its thread (elsewhere ``RuntimeError``: another
  thread goes through ``trio.from_thread.run_sync``). ``bind`` again to follow another
  supervisor; one subscriber can count the events of several supervisors but its gauges
  follow one.
* **A forced attempt is not an attempt result.** A force-aborted task's outcome is
  committed at the grace deadline and its events end there (``TASK_REMOVED``); when its
  body finally exits, ``FORCED_TASK_EXITED`` counts it in
  ``taskvisor_forced_exits_total``, never in ``taskvisor_attempts_total``.
* **Counters are lossy like events.** When this subscriber's queue overflows, the lost
  events are counted in ``taskvisor_metrics_missed_events_total`` (from its
  ``SUBSCRIBER_OVERFLOW`` markers); raise ``queue_capacity`` if it grows.
* **Cardinality.** No metric has a task or slot label by default. ``slot_labels`` is an
  allow-list: it adds a ``slot`` label to every metric that has a slot (attempts,
  durations, outcomes, rejections, forced exits, lease acquisitions and losses, slots,
  queued, held), whose value is the slot's name for the listed slots, ``"other"`` for
  every other slot, and ``""`` for work added with ``add`` (no slot). Do not list a slot
  called ``"other"``.
* ``registry=None`` means ``prometheus_client.REGISTRY``, as for ``prometheus_client``'s
  own metrics; two subscribers with the same ``namespace`` cannot share a registry (the
  second raises ``ConfigError`` and registers nothing; so does a subscriber whose metric
  names the registry already holds). ``unregister()`` removes this subscriber's metrics
  from its registry.
* ``namespace=""`` names every metric without a prefix (``attempts_total``,
  ``registered_tasks``), as ``prometheus_client`` joins the parts of a name; it is not
  refused, but such short names are easily taken by other exporters of one Prometheus.
* ``buckets`` must be strictly increasing upper bounds, at least one of them finite
  (``+Inf`` is added if missing): repeated bounds would export one ``le`` series twice.
  Anything else raises ``ConfigError`` (``TypeError`` for bounds that are no numbers)
  before anything is registered.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._config import check_capacity
from .._events import EventKind, TaskEvent
from .._exceptions import ConfigError
from .._outcome import OutcomeKind, RejectionKind
from .._slots import SlotStatus
from .._supervisor import Supervisor

__all__ = ["PrometheusSubscriber"]

_M = TypeVar("_M", bound=Collector)

_RESULTS: Final = {
    EventKind.ATTEMPT_SUCCEEDED: "succeeded",
    EventKind.ATTEMPT_FAILED: "failed",
    EventKind.ATTEMPT_TIMED_OUT: "timed_out",
    EventKind.ATTEMPT_CANCELLED: "cancelled",
}
_OTHER: Final = "other"
_NO_SLOT: Final = ""
# A tracked slot without an owner (only held work) has no status: "idle".
_STATUSES: Final = (*(status.value for status in SlotStatus), "idle")


@attrs.frozen
class _Sample:
    """The bound supervisor's gauges at one instant (label values -> value)."""

    registered: int
    alive: int
    forced_alive: int
    running_attempts: int
    waiting_for_permit: int
    events_published: int
    events_dropped: int
    slots: dict[tuple[str, ...], int]
    queued: dict[tuple[str, ...], int]
    held: dict[tuple[str, ...], int]
    limit_held: dict[tuple[str, ...], int]
    limit_waiting: dict[tuple[str, ...], int]


class PrometheusSubscriber:
    """Export a supervisor's events as Prometheus counters, gauges and a histogram.

    ``slot_labels`` lists the slots that get their own ``slot`` label value (the rest
    aggregate under ``"other"``); ``buckets`` are the attempt-duration histogram's
    increasing upper bounds in seconds. ``name`` and ``queue_capacity`` are the subscriber's.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "taskvisor",
        slot_labels: Iterable[str] = (),
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
        name: str = "PrometheusSubscriber",
        queue_capacity: int = 1024,
    ) -> None:
        if isinstance(slot_labels, str):
            raise TypeError(f"slot_labels must be an iterable of slot names, got {slot_labels!r}")
        buckets = _check_buckets(buckets)
        self.name = name
        """The subscriber's name in ``SUBSCRIBER_*`` events and ``subscriber_dropped``."""
        self.queue_capacity = check_capacity("queue_capacity", queue_capacity)
        """The size of its event queue; events that find it full are dropped (and counted)."""
        self.registry = REGISTRY if registry is None else registry
        """Where the metrics are registered; by default ``prometheus_client.REGISTRY``."""
        self.namespace = namespace
        """The prefix of every metric name (``taskvisor_...`` by default)."""
        self.slot_labels: frozenset[str] = frozenset(slot_labels)
        """Slots with their own ``slot`` label value (the rest: ``"other"``); empty: no label."""
        self._binding: tuple[Supervisor, trio.lowlevel.TrioToken] | None = None
        self._last: _Sample | None = None
        # Every limit name a scrape saw in use: exported from then on, at 0 when idle.
        self._limits: set[str] = set()

        # The label values of the optional slot label: () when there is no slot label.
        slot: tuple[str, ...] = ()
        self._slot_values: tuple[tuple[str, ...], ...] = ((),)
        if self.slot_labels:
            slot = ("slot",)
            values = [*sorted(self.slot_labels), _OTHER, _NO_SLOT]
            self._slot_values = tuple((value,) for value in values)
        registry = self.registry
        self._collectors: list[Collector] = []
        made_here: list[Collector] = []

        def made(
            kind: Callable[..., _M], name: str, doc: str, labels: Sequence[str] = (), **extra: Any
        ) -> _M:
            """One metric of this subscriber, in its namespace, not registered yet."""
            metric = kind(name, doc, labels, namespace=namespace, registry=None, **extra)
            made_here.append(metric)
            return metric

        self._attempts = made(
            Counter, "attempts", "Attempts that ended, by result.", ("result", *slot)
        )
        self._durations = made(
            Histogram,
            "attempt_duration_seconds",
            "Duration of attempts that ended, by result.",
            ("result", *slot),
            buckets=buckets,
        )
        self._outcomes = made(
            Counter, "outcomes", "Final task outcomes, by kind.", ("outcome", *slot)
        )
        self._rejections = made(
            Counter, "rejections", "Rejected work, by rejection kind.", ("rejection", *slot)
        )
        self._forced_exits = made(
            Counter, "forced_exits", "Force-aborted tasks that physically exited.", slot
        )
        self._leases = made(
            Counter,
            "lease_acquisitions",
            "Cluster slot leases acquired by this process (a new owner each).",
            slot,
        )
        self._lost_leases = made(
            Counter,
            "lease_losses",
            "Owners forced because their cluster slot lease was lost.",
            slot,
        )
        self._outages = made(
            Counter,
            "store_outages",
            "Outages of the slot store (counted once each, when they begin).",
        )
        self._missed = made(
            Counter,
            "metrics_missed_events",
            "Events this subscriber lost to a full queue (its counters miss them).",
        )
        self._gauges = _GaugeCollector(self, self._sample)
        made_here.append(self._gauges)
        # Only the registry's own refusal is a clash: the values were checked above.
        try:
            for collector in made_here:
                registry.register(collector)
                self._collectors.append(collector)
        except ValueError as exc:  # prometheus_client: "Duplicated timeseries ..."
            self.unregister()
            raise ConfigError(
                "the registry already has metrics named as this subscriber's "
                f"({_full_name(namespace, '...')}): give each subscriber of one registry a "
                "namespace of its own, or unregister() the earlier one (a test that makes "
                f"one per test does so at its end): {exc}"
            ) from exc
        for labels in self._slot_values:
            if labels:
                self._forced_exits.labels(*labels)
            for result in _RESULTS.values():
                self._attempts.labels(result, *labels)
                self._durations.labels(result, *labels)
            for outcome in OutcomeKind:
                self._outcomes.labels(outcome.value, *labels)
            for rejection in RejectionKind:
                self._rejections.labels(rejection.value, *labels)
            if labels:
                self._leases.labels(*labels)
                self._lost_leases.labels(*labels)

    def __repr__(self) -> str:
        return f"<PrometheusSubscriber namespace={self.namespace!r} name={self.name!r}>"

    def bind(self, supervisor: Supervisor) -> None:
        """Export the gauges of ``supervisor`` from now on.

        Call it in the supervisor's trio run, in its thread; elsewhere it raises
        ``RuntimeError`` and binds nothing.
        """
        try:
            token = trio.lowlevel.current_trio_token()
            supervisor.statistics()  # RuntimeError in a thread other than the supervisor's
        except RuntimeError:
            raise RuntimeError(
                "metrics.bind() works only in the supervisor's trio run, in its thread; from "
                "another thread, go through trio.from_thread.run_sync(metrics.bind, sup)"
            ) from None
        self._binding = (supervisor, token)
        self._last = None

    def unregister(self) -> None:
        """Remove every metric of this subscriber from its registry."""
        collectors, self._collectors = self._collectors, []
        for collector in collectors:
            self.registry.unregister(collector)

    async def on_event(self, event: TaskEvent) -> None:
        """Count ``event``. Never blocks."""
        kind = event.kind
        result = _RESULTS.get(kind)
        if result is not None:
            labels = self._slot(event.slot)
            self._attempts.labels(result, *labels).inc()
            if event.duration is not None:
                self._durations.labels(result, *labels).observe(event.duration)
        elif kind is EventKind.TASK_FINISHED:
            if event.outcome is not None:
                self._outcomes.labels(event.outcome.value, *self._slot(event.slot)).inc()
        elif kind is EventKind.TASK_ADD_FAILED or kind is EventKind.CONTROLLER_REJECTED:
            if event.rejection is not None:
                labels = self._slot(event.slot)
                self._rejections.labels(event.rejection.value, *labels).inc()
                self._outcomes.labels(OutcomeKind.REJECTED.value, *labels).inc()
        elif kind is EventKind.FORCED_TASK_EXITED:
            self._counter(self._forced_exits, event.slot).inc()
        elif kind is EventKind.CONTROLLER_LEASE_ACQUIRED:
            self._counter(self._leases, event.slot).inc()
        elif kind is EventKind.CONTROLLER_LEASE_LOST:
            self._counter(self._lost_leases, event.slot).inc()
        elif kind is EventKind.CONTROLLER_STORE_UNAVAILABLE:
            self._outages.inc()
        elif kind is EventKind.SUBSCRIBER_OVERFLOW and event.dropped:
            self._missed.inc(event.dropped)

    def _counter(self, counter: Counter, slot: str | None) -> Counter:
        """``counter`` itself, or its child for ``slot``'s label value."""
        labels = self._slot(slot)
        return counter.labels(*labels) if labels else counter

    def _slot(self, slot: str | None) -> tuple[str, ...]:
        if not self.slot_labels:
            return ()
        if slot is None:
            return (_NO_SLOT,)
        return (slot if slot in self.slot_labels else _OTHER,)

    # -- gauges ---------------------------------------------------------------------------

    def _take(self, supervisor: Supervisor) -> _Sample:
        """Read the gauges; runs in the supervisor's trio thread."""
        stats = supervisor.statistics()
        slots = {(*labels, status): 0 for labels in self._slot_values for status in _STATUSES}
        queued = dict.fromkeys(self._slot_values, 0)
        held = dict.fromkeys(self._slot_values, 0)
        if supervisor.config.controller is not None:
            for view in supervisor.controller_snapshot().slots:
                labels = self._slot(view.slot)
                key = (*labels, view.status.value)
                slots[key] = slots.get(key, 0) + 1
                queued[labels] = queued.get(labels, 0) + view.queue_depth
                held[labels] = held.get(labels, 0) + view.waiting
        pools = supervisor.limit_snapshot()
        self._limits.update(pool.name for pool in pools)
        limit_held: dict[tuple[str, ...], int] = {(name,): 0 for name in self._limits}
        limit_waiting = dict(limit_held)
        for pool in pools:  # summed over keys: keys are often tenants
            limit = (pool.name,)
            limit_held[limit] += pool.held
            limit_waiting[limit] += pool.waiting
        return _Sample(
            registered=stats.registered,
            alive=stats.alive,
            forced_alive=stats.forced_alive,
            running_attempts=stats.running_attempts,
            waiting_for_permit=stats.waiting_for_permit,
            events_published=stats.events_published,
            events_dropped=stats.events_dropped,
            slots=slots,
            queued=queued,
            held=held,
            limit_held=limit_held,
            limit_waiting=limit_waiting,
        )

    def _sample(self) -> _Sample | None:
        """The bound supervisor's gauges now, from whatever thread asks."""
        binding = self._binding
        if binding is None:
            return None
        supervisor, token = binding
        try:
            current = trio.lowlevel.current_trio_token()
        except RuntimeError:
            current = None
        if current is token:
            sample = self._take(supervisor)
        elif current is None:
            try:
                sample = trio.from_thread.run_sync(self._take, supervisor, trio_token=token)
            except trio.RunFinishedError:
                return self._last
        else:
            # Another trio run's thread cannot block on this one: report what we had.
            return self._last
        self._last = sample
        return sample


def _check_buckets(buckets: Sequence[float]) -> tuple[float, ...]:
    """The histogram's upper bounds: strictly increasing, at least one below ``+Inf``."""
    try:
        bounds = tuple(float(bound) for bound in buckets)
    except (TypeError, ValueError):
        raise TypeError(
            f"buckets must be numbers (upper bounds in seconds), got {buckets!r}"
        ) from None
    increasing = all(low < high for low, high in itertools.pairwise(bounds))
    if not bounds or not increasing or math.isnan(bounds[0]) or bounds[0] == math.inf:
        raise ConfigError(
            "buckets must be increasing upper bounds in seconds, each once, at least one "
            f"below +Inf, got {buckets!r}"
        )
    return bounds


def _full_name(namespace: str, metric: str) -> str:
    """``metric`` in ``namespace``, joined as ``prometheus_client`` joins a name's parts."""
    return f"{namespace}_{metric}" if namespace else metric


class _GaugeCollector:
    """The gauge families of a ``PrometheusSubscriber``, read at collection time."""

    def __init__(self, owner: PrometheusSubscriber, sample: Callable[[], _Sample | None]) -> None:
        self._owner = owner
        self._sample = sample  # the owner's: the supervisor's values at collection time

    def _families(self, sample: _Sample | None) -> Iterator[Metric]:
        namespace = self._owner.namespace
        slot = ("slot",) if self._owner.slot_labels else ()
        scalars = (
            ("registered_tasks", "Registered and stopping tasks.", "registered"),
            ("alive_tasks", "Tasks with an attempt physically in progress.", "alive"),
            (
                "forced_alive_tasks",
                "Force-aborted tasks still physically running.",
                "forced_alive",
            ),
            ("running_attempts", "Attempts in progress.", "running_attempts"),
            (
                "waiting_for_permit",
                "Tasks waiting for a max_concurrent permit.",
                "waiting_for_permit",
            ),
        )
        for metric, doc, field in scalars:
            family = GaugeMetricFamily(_full_name(namespace, metric), doc)
            if sample is not None:
                family.add_metric((), getattr(sample, field))
            yield family
        for metric, doc, field in (
            ("events_published", "Events published by the supervisor.", "events_published"),
            ("events_dropped", "Events dropped (bus, subscribers, streams).", "events_dropped"),
        ):
            counter = CounterMetricFamily(_full_name(namespace, metric), doc)
            if sample is not None:
                counter.add_metric((), getattr(sample, field))
            yield counter
        for metric, doc, labels, field in (
            ("slots", "Live controller slots, by status.", (*slot, "status"), "slots"),
            ("queued_submissions", "Submissions queued behind slot owners.", slot, "queued"),
            ("held_submissions", "Wait-mode submissions held for capacity.", slot, "held"),
            ("limit_held", "Limit units held in this process, by limit.", ("limit",), "limit_held"),
            (
                "limit_waiting",
                "Attempts and limited blocks waiting for a limit, by limit.",
                ("limit",),
                "limit_waiting",
            ),
        ):
            family = GaugeMetricFamily(_full_name(namespace, metric), doc, labels=labels)
            if sample is not None:
                values: dict[tuple[str, ...], int] = getattr(sample, field)
                for key, value in sorted(values.items()):
                    family.add_metric(key, value)
            yield family

    def describe(self) -> Iterable[Metric]:
        """The families without samples: lets the registry check names without a read."""
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        """The families with the bound supervisor's values; none when unbound."""
        sample = self._sample()
        if sample is None:
            return []
        return list(self._families(sample))

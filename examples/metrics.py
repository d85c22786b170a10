"""Metrics: export a supervisor's counters, gauges and attempt durations to Prometheus.

Needs the ``prometheus`` extra: ``pip install 'trio_taskvisor[prometheus]'``.

``PrometheusSubscriber`` counts attempts, outcomes and rejections from events, and
records attempt durations in a histogram. ``bind(sup)`` adds gauges read from the
supervisor itself at scrape time (registered, alive, slots by status, queued): they
stay right even when the subscriber loses events. No metric has a task or slot label
by default, to keep cardinality bounded; ``slot_labels`` is an allow-list of slots
that get their own label value (every other slot is ``"other"``).

In a service, serve the registry: ``prometheus_client.start_http_server(9000)`` (the
gauges then hop into the trio thread at each scrape), or an ASGI ``/metrics`` route.
Here the example prints the exposition text once the work is done.
"""

import trio
from prometheus_client import CollectorRegistry, generate_latest

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ControllerConfig,
    OutcomeError,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.contrib.prometheus import PrometheusSubscriber


async def fetch_rates() -> float:
    await trio.sleep(0.01)
    if current_context().attempt < 3:
        raise ConnectionError("rates service unavailable")
    return 1.08


rendering = trio.Event()


async def render_invoice(customer: str) -> str:
    rendering.set()
    await trio.sleep(0.3)
    return f"invoice for {customer}"


async def main() -> None:
    registry = CollectorRegistry()  # the default is prometheus_client.REGISTRY
    metrics = PrometheusSubscriber(registry, slot_labels=["billing"])
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config, subscribers=[metrics]) as sup:
        metrics.bind(sup)  # the gauges follow this supervisor
        spec = TaskSpec.restartable(
            "fetch-rates", fetch_rates, backoff=BackoffPolicy.constant(0.01)
        )
        await (await sup.add(spec)).wait()

        async def invoice(customer: str) -> None:
            try:
                await sup.run_in_slot(
                    "billing", render_invoice, customer, policy=AdmissionPolicy.DROP_IF_RUNNING
                )
            except OutcomeError as exc:  # the slot was busy: rejected SLOT_BUSY
                print(f"{customer}: {exc.outcome.rejection}")

        async with trio.open_nursery() as nursery:
            for customer in ("ada", "grace", "linus"):
                nursery.start_soon(invoice, customer)
            await rendering.wait()  # scrape while an invoice renders: the gauges
            await trio.sleep(0.05)
            show(registry, "during", ("taskvisor_registered_tasks", 'taskvisor_slots{slot="b'))
    # After the shutdown, which drains the subscribers: every event is counted.
    show(
        registry,
        "after",
        (
            "taskvisor_attempts_total",
            "taskvisor_attempt_duration_seconds_count",
            "taskvisor_outcomes_total",
            "taskvisor_rejections_total",
        ),
    )


def show(registry: CollectorRegistry, when: str, prefixes: tuple[str, ...]) -> None:
    """Print the non-zero samples of the metrics named by ``prefixes``."""
    print(f"-- scrape {when}")
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(prefixes) and not line.endswith(" 0.0"):
            print(line)


if __name__ == "__main__":
    trio.run(main)

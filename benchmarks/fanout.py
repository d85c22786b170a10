"""Scenario 6: event fan-out to K = 1, 4, 16 no-op subscribers.

Events cannot be published through the public API without running tasks, so the cost
of delivery is measured as a difference within each round: the burst of N no-op tasks
with K subscribers minus the same burst with no subscriber (where events are not even
built). That difference is everything events cost: building them, the bus, the fan-out
and the K lanes calling ``on_event``. Queues are large enough that nothing is dropped.

Baseline: a bare trio fan-out of the same number of events E: a producer sends E small
tuples into a bus channel with ``send_nowait`` (publishing never blocks, as in the
library), a fan-out task forwards each one with ``send_nowait`` into K
bounded channels, and K consumer tasks ``await on_event(ev)`` on a no-op. The table shows
microseconds per delivered event (E * K deliveries); the note gives events per second.
"""

from __future__ import annotations

import gc
import statistics
import time

import trio
from _harness import Plan, Result, Row, interleave, timed_trio
from lifecycle import NoopSubscriber, check_completed, noop, specs

from trio_taskvisor import SupervisorConfig, open_supervisor


async def _count_events(n: int) -> int:
    """Run the burst once with one subscriber and return how many events it received."""
    sub = NoopSubscriber("probe", 8 * n + 64)
    config = SupervisorConfig(
        max_registered_tasks=None, command_capacity=n + 16, bus_capacity=8 * n + 64
    )
    async with open_supervisor(config, subscribers=[sub]) as sup:
        await check_completed(await sup.add_batch(specs(n)))
    return sub.received


async def ours_with_subscribers(n: int, k: int) -> None:
    """The burst of N no-op tasks with K no-op subscribers (K = 0: no events built)."""
    subs = [NoopSubscriber(f"sub{i}", 8 * n + 64) for i in range(k)]
    config = SupervisorConfig(
        max_registered_tasks=None, command_capacity=n + 16, bus_capacity=8 * n + 64
    )
    async with open_supervisor(config, subscribers=subs) as sup:
        await check_completed(await sup.add_batch(specs(n)))
    if len({sub.received for sub in subs}) > 1:
        raise RuntimeError("subscribers received different numbers of events")


class _Consumer:
    """A no-op consumer with the same shape as a subscriber."""

    def __init__(self) -> None:
        self.received = 0

    async def on_event(self, event: object, /) -> None:
        """Count the event."""
        self.received += 1


async def bare_fanout(events: int, k: int) -> None:
    """The baseline: E events through one bus channel and K consumer channels."""
    consumers = [_Consumer() for _ in range(k)]
    bus_send, bus_recv = trio.open_memory_channel[tuple[int, str]](events + 64)
    lanes = [trio.open_memory_channel[tuple[int, str]](events + 64) for _ in range(k)]

    async def produce() -> None:
        async with bus_send:
            for seq in range(1, events + 1):
                bus_send.send_nowait((seq, "event"))

    async def fan_out() -> None:
        async with bus_recv:
            async for event in bus_recv:
                for send, _ in lanes:
                    send.send_nowait(event)
        for send, _ in lanes:
            send.close()

    async def lane(recv: trio.MemoryReceiveChannel[tuple[int, str]], consumer: _Consumer) -> None:
        async for event in recv:
            await consumer.on_event(event)

    async with trio.open_nursery() as nursery:
        for (_, recv), consumer in zip(lanes, consumers, strict=True):
            nursery.start_soon(lane, recv, consumer)
        nursery.start_soon(fan_out)
        nursery.start_soon(produce)
    if any(c.received != events for c in consumers):
        raise RuntimeError("a consumer missed events")


def _timed_nothing() -> float:
    gc.collect()
    start = time.perf_counter()
    trio.run(noop)
    return time.perf_counter() - start


def run_fanout(plan: Plan) -> list[Result]:
    """Scenario 6: delivery cost per event to K = 1, 4, 16 subscribers vs a bare fan-out."""
    results: list[Result] = []
    n = 300 if plan.quick else 2_000
    events = trio.run(_count_events, n)
    for k in (1, 4, 16):
        samples = interleave(
            {
                "with": timed_trio(ours_with_subscribers, n, k),
                "without": timed_trio(ours_with_subscribers, n, 0),
                "bare": timed_trio(bare_fanout, events, k),
                "empty": _timed_nothing,
            },
            rounds=plan.rounds(n),
            warmup=plan.warmup(n),
        )
        ours = [w - wo for w, wo in zip(samples["with"], samples["without"], strict=True)]
        bare = [b - e for b, e in zip(samples["bare"], samples["empty"], strict=True)]
        deliveries = events * k
        rate_ours = deliveries / statistics.median(ours) if statistics.median(ours) > 0 else 0.0
        rate_bare = deliveries / statistics.median(bare)
        results.append(
            Row(
                "6",
                f"fan-out, K={k}",
                deliveries,
                ours,
                bare,
                unit="us/event",
                per=deliveries,
                baseline_name="bare channel fan-out to K consumer tasks",
                note=(
                    f"{events} events from {n} tasks to each of {k}; ours = burst with K "
                    f"subscribers minus burst without; {rate_ours:,.0f} vs "
                    f"{rate_bare:,.0f} deliveries/s"
                ),
            )
        )
    return results

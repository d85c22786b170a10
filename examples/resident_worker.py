"""A resident worker: runs until Ctrl+C (SIGINT) or SIGTERM, then shuts down gracefully.

``run(specs, handle_signals=True)`` is the static mode: the specs run as one batch,
and the first SIGINT or SIGTERM starts the graceful shutdown (a second one gets trio's
default handling: KeyboardInterrupt). Each worker finishes the job in hand inside
``defer_cancel()``, so a stop never cuts a job in half; the grace window bounds that.

    python examples/resident_worker.py                 # until Ctrl+C
    python examples/resident_worker.py --duration 2    # or stop by itself after 2 s

``--duration`` leaves through cancellation instead of a signal: cancelling the scope
around ``run()`` still runs the same graceful shutdown (shielded, bounded by grace).
"""

import argparse
import logging
import math
import sys

import trio

from trio_taskvisor import (
    LoggingSubscriber,
    SupervisorConfig,
    TaskSpec,
    current_context,
    run,
)


async def worker(jobs: trio.MemoryReceiveChannel[int]) -> None:
    ctx = current_context()
    async for job in jobs:
        with ctx.defer_cancel():  # a job in hand is finished even when a stop arrives
            await trio.sleep(0.05)  # the work itself
            print(f"{ctx.name}: job {job} done", flush=True)


async def producer(jobs: trio.MemorySendChannel[int]) -> None:
    # Announce readiness once the workers wait for jobs and run() listens for signals.
    await trio.sleep(0.1)
    print("ready: press Ctrl+C to stop", flush=True)
    for job in range(1, 1_000_000):
        await jobs.send(job)
        await trio.sleep(0.2)


async def heartbeat() -> None:
    print("heartbeat", flush=True)


async def main(duration: float) -> None:
    send, receive = trio.open_memory_channel[int](0)
    specs = [
        TaskSpec.restartable("producer", producer, send),
        TaskSpec.restartable("worker-1", worker, receive),
        TaskSpec.restartable("worker-2", worker, receive.clone()),
        TaskSpec.periodic("heartbeat", 1.0, heartbeat),
    ]
    config = SupervisorConfig(grace=2.0)
    # Shutdown events go to the log: shutdown_requested, then every task_finished.
    with trio.move_on_after(duration):
        await run(specs, config, subscribers=[LoggingSubscriber()], handle_signals=True)
    print("stopped cleanly", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A resident worker: runs until Ctrl+C.")
    parser.add_argument("--duration", type=float, default=math.inf, metavar="SECONDS")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="log: %(message)s")
    trio.run(main, args.duration)

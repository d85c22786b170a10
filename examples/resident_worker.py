"""A resident worker: runs until Ctrl+C (SIGINT) or SIGTERM, then shuts down gracefully.

``open_supervisor(handle_signals=True)``: the first SIGINT or SIGTERM cancels the block's
body and runs the graceful shutdown; a second one, during it, forces every remaining
task at once. Each worker finishes the job in hand inside ``defer_cancel()``, so a stop
never cuts a job in half; the grace window bounds that.

Readiness instead of a guess: the workers are started with ``sup.start``, and each calls
``task_status.started()`` once it waits for jobs (as code written for ``nursery.start``
does), so "ready" is printed when they really are, not after a sleep.

    python examples/resident_worker.py                 # until Ctrl+C
    python examples/resident_worker.py --duration 2    # or stop by itself after 2 s

``--duration`` leaves through cancellation instead of a signal: cancelling the scope
around ``open_supervisor`` still runs the same graceful shutdown (shielded, bounded by
grace).
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
    open_supervisor,
)


async def worker(
    jobs: trio.MemoryReceiveChannel[int],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    ctx = current_context()
    task_status.started()  # waiting for jobs from here on: ready
    async for job in jobs:
        with ctx.defer_cancel():  # a job in hand is finished even when a stop arrives
            await trio.sleep(0.05)  # the work itself
            print(f"{ctx.name}: job {job} done", flush=True)


async def producer(jobs: trio.MemorySendChannel[int]) -> None:
    for job in range(1, 1_000_000):
        await jobs.send(job)
        await trio.sleep(0.2)


async def heartbeat() -> None:
    print("heartbeat", flush=True)


async def main(duration: float) -> None:
    send, receive = trio.open_memory_channel[int](0)
    config = SupervisorConfig(grace=2.0)
    # Shutdown events go to the log: shutdown_requested, then every task_finished.
    with trio.move_on_after(duration):
        async with open_supervisor(
            config, subscribers=[LoggingSubscriber()], handle_signals=True
        ) as sup:
            for name, jobs in (("worker-1", receive), ("worker-2", receive.clone())):
                await sup.start(TaskSpec.restartable(name, worker, jobs))
            await sup.add(TaskSpec.restartable("producer", producer, send))
            await sup.add(TaskSpec.periodic("heartbeat", 1.0, heartbeat))
            print("ready: press Ctrl+C to stop", flush=True)
            await trio.sleep_forever()
    print("stopped cleanly", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A resident worker: runs until Ctrl+C.")
    parser.add_argument("--duration", type=float, default=math.inf, metavar="SECONDS")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="log: %(message)s")
    trio.run(main, args.duration)

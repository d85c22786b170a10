"""CPU work in threads: cancellation, abandonment, and a thread's physical exit.

Sync code in a worker thread (``trio.to_thread.run_sync``) cannot be interrupted by
trio, so a supervised task that runs one has three ways to meet a stop:

* ``cooperative``: the thread calls ``trio.from_thread.check_cancelled()`` between
  chunks of work; a stop ends it at the next chunk. The clean option, when you own the
  loop.
* ``abandon``: ``run_sync(..., abandon_on_cancel=True)``; a stop ends the attempt at
  once (``CANCELLED``) and the thread is abandoned: it runs on to the end, and its
  result is thrown away. The attempt is physically done, so the task leaves
  ``alive_snapshot()`` and its name is free: the abandoned thread is no longer the
  supervisor's to wait for (nor anyone's: it is a daemon thread; keep its side
  effects safe to finish late, or to never finish if the process exits).
* ``blocking``: plain ``run_sync``; the stop waits for the thread. At the grace
  deadline the task is ``FORCE_ABORTED`` (its waiter resolves), but the attempt is
  still physically running: it stays in ``alive_snapshot()``, keeps its name reserved,
  and the shutdown waits for it, as trio must. Still running when the shutdown's own
  grace passes, it counts as stuck: leaving the block raises ``GraceExceededError``.
"""

import hashlib
import threading
import time

import trio

from trio_taskvisor import (
    GraceExceededError,
    SupervisorConfig,
    TaskNameInUseError,
    TaskSpec,
    open_supervisor,
)

DATA = b"x" * 65536
finished = {name: threading.Event() for name in ("cooperative", "abandon", "blocking")}


def crunch(name: str, seconds: float, *, cooperative: bool = False) -> str:
    """CPU-bound work for about ``seconds``; runs in a worker thread."""
    digest = hashlib.sha256()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            digest.update(DATA)
            time.sleep(0.001)  # (keeps this example light on a busy machine)
            if cooperative:
                trio.from_thread.check_cancelled()  # raises trio.Cancelled after a stop
    finally:
        finished[name].set()
    return digest.hexdigest()[:12]


async def cooperative() -> str:
    return await trio.to_thread.run_sync(lambda: crunch("cooperative", 1.5, cooperative=True))


async def abandon() -> str:
    return await trio.to_thread.run_sync(crunch, "abandon", 1.2, abandon_on_cancel=True)


async def blocking() -> str:
    return await trio.to_thread.run_sync(crunch, "blocking", 1.2)


async def main() -> None:
    try:
        await supervise()
    except GraceExceededError as exc:
        print(f"shutdown: {exc}")
    # Leaving the block waited for the blocking thread; the abandoned one is on its own.
    print(f"shutdown done; blocking thread finished: {finished['blocking'].is_set()}")
    await trio.to_thread.run_sync(finished["abandon"].wait)
    print("every thread has finished")


async def supervise() -> None:
    async with open_supervisor(SupervisorConfig(grace=0.5)) as sup:
        waiters = [
            await sup.add(TaskSpec.once(fn.__name__, fn)) for fn in (cooperative, abandon, blocking)
        ]
        await trio.sleep(0.1)  # every thread is busy now
        for waiter in waiters:
            t0 = trio.current_time()
            await sup.cancel(waiter.id)  # returns when the outcome is committed
            took = trio.current_time() - t0
            print(
                f"{waiter.name:<11} {waiter.outcome_nowait().kind.name:<13} after {took:.1f} s; "
                f"thread finished: {finished[waiter.name].is_set()}; "
                f"alive: {sup.is_alive(waiter.name)}"
            )
        try:
            await sup.add(TaskSpec.once("blocking", blocking))
        except TaskNameInUseError:
            print("'blocking' is still reserved: its thread has not exited")
        print("alive:", sup.alive_snapshot())


if __name__ == "__main__":
    trio.run(main)

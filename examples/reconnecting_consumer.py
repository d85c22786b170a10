"""A reconnecting queue consumer: restart with exponential backoff and jitter.

Each attempt connects to a (fake) broker and consumes until the connection drops. A
dropped or refused connection is an ordinary exception, so the supervisor retries it
after an exponential backoff with equal jitter (each delay is uniform in [base/2,
base]; jitter keeps a fleet of consumers from reconnecting in lock-step). Messages
are acknowledged one by one, so a new connection resumes after the last ack and
nothing is lost or handled twice. When the queue is drained the attempt returns: a
success, and a restartable task stops there.

The supervisor's random source is seeded, so the jittered delays are reproducible.
"""

import random

import trio

from trio_taskvisor import (
    BackoffPolicy,
    BackoffSource,
    EventKind,
    Jitter,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)


class Broker:
    """An in-memory broker whose connections are unreliable."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = messages
        self.acked = 0  # messages before this offset are done
        self.connections = 0
        # What goes wrong with each new connection: None = nothing, "refuse", or the
        # number of messages after which the connection drops.
        self.faults: list[str | int | None] = [3, "refuse", "refuse", 4, None]

    async def connect(self) -> int:
        await trio.sleep(0.01)  # the handshake
        self.connections += 1
        fault = self.faults[self.connections - 1] if self.connections <= len(self.faults) else None
        if fault == "refuse":
            raise ConnectionRefusedError("broker refused the connection")
        return fault if isinstance(fault, int) else len(self.messages)


async def consume(broker: Broker, handled: list[str]) -> int:
    ctx = current_context()
    budget = await broker.connect()
    print(f"attempt {ctx.attempt}: connected, resuming at message {broker.acked + 1}")
    for _ in range(budget):
        if broker.acked == len(broker.messages):
            break
        message = broker.messages[broker.acked]
        await trio.sleep(0.01)  # handle it
        handled.append(message)
        broker.acked += 1  # ack: a reconnect resumes after it
    if broker.acked < len(broker.messages):
        raise ConnectionResetError(f"connection lost after message {broker.acked}")
    return broker.acked


async def main() -> None:
    broker = Broker([f"order-{i}" for i in range(1, 13)])
    handled: list[str] = []
    spec = TaskSpec.restartable(
        "consumer",
        consume,
        broker,
        handled,
        backoff=BackoffPolicy.exponential(0.05, max=0.4, jitter=Jitter.EQUAL),
        # A failure streak longer than this gives up (FAILED). A success resets the
        # streak; for a consumer that never returns, None (unlimited) is the usual choice.
        max_retries=10,
    )
    config = SupervisorConfig(random=random.Random(7))
    async with open_supervisor(config) as sup, sup.events() as events:
        waiter = await sup.add(spec)

        async def show_backoff() -> None:
            async for event in events:
                if (
                    event.kind is EventKind.BACKOFF_SCHEDULED
                    and event.backoff_source is BackoffSource.FAILURE
                    and event.delay is not None
                ):
                    print(f"  {event.reason}; reconnecting in {event.delay:.3f} s")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(show_backoff)
            outcome = await waiter.wait()
            nursery.cancel_scope.cancel()

    print(f"{outcome.kind.name}: {outcome.value} messages over {broker.connections} connections")
    assert handled == broker.messages  # each exactly once, in order


if __name__ == "__main__":
    trio.run(main)

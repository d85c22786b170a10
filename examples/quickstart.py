"""Quick start: one restartable task, its backoff, and its final outcome."""

import trio

from trio_taskvisor import (
    BackoffPolicy,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)


async def fetch(url: str) -> int:
    attempt = current_context().attempt
    if attempt < 3:
        raise ConnectionError(f"{url} unreachable (attempt {attempt})")
    return 200


async def main() -> None:
    async with open_supervisor(SupervisorConfig(grace=5.0)) as sup:
        spec = TaskSpec.restartable(
            "fetch",
            fetch,
            "https://example.org",
            backoff=BackoffPolicy.exponential(0.1),
            max_retries=5,
        )
        waiter = await sup.add(spec)
        outcome = await waiter.wait()
        print(outcome.kind, outcome.value)  # OutcomeKind.COMPLETED 200


if __name__ == "__main__":
    trio.run(main)

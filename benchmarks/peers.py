"""Scenario 9: the peers a user would otherwise pick, each against bare trio in the same run.

* aiojobs on asyncio: ``spawn`` N no-op jobs, then ``await job.wait()`` for each, then
  ``close()`` (not ``wait_and_close``, which polls).
* anyio task group on trio: N ``start_soon`` no-ops in ``anyio.create_task_group()``,
  under ``anyio.run(..., backend="trio")``.
* triotp: ``supervisor.start`` of N TEMPORARY no-op children; and one TRANSIENT child
  failing R times (``max_restarts=R``) vs the bare per-attempt-scope retry loop.
  triotp logs every restart through logbook; a ``NullHandler`` is pushed so that no
  traceback is written to stderr (records are still created, as for any user who
  silences the log).

Our lifecycle burst (1a) and our restarts (3) run in the same interleaved rounds, so the
suite also reports them per task against each peer directly. A peer that is not
installed is skipped with a note; nothing fails.

triotp 0.2.1 (the latest release) pins ``trio<0.20`` and ``trio-util<0.8``; installing it
normally downgrades trio. Install it with ``pip install --no-deps triotp logbook
tenacity``: its supervisor module works on current trio.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import time
from collections.abc import Iterator
from typing import Any

from _harness import (
    Contender,
    Plan,
    Result,
    Row,
    Skipped,
    Target,
    interleave,
    ratio_row,
    timed_asyncio,
    timed_trio,
)
from lifecycle import bare_nursery, noop, ours_burst
from restarts import Flaky, bare_retry_loop, ours_restarts


def available(module: str) -> bool:
    """Tell whether an optional peer is installed and importable."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


# -- aiojobs ----------------------------------------------------------------------------------


async def _asyncio_noop() -> None:
    """The asyncio job body: return at once."""


async def aiojobs_spawn_wait(n: int) -> None:
    """Spawn N no-op jobs in an aiojobs scheduler, await each job, then close."""
    import aiojobs

    scheduler = aiojobs.Scheduler(limit=None, close_timeout=None)
    jobs = [await scheduler.spawn(_asyncio_noop()) for _ in range(n)]
    for job in jobs:
        await job.wait()
    await scheduler.close()


async def asyncio_task_group(n: int) -> None:
    """Bare asyncio for reference: N no-op tasks in an ``asyncio.TaskGroup``."""
    async with asyncio.TaskGroup() as group:
        for _ in range(n):
            group.create_task(_asyncio_noop())


# -- anyio -----------------------------------------------------------------------------------


async def anyio_task_group(n: int) -> None:
    """N ``start_soon`` no-ops in an anyio task group."""
    import anyio

    async with anyio.create_task_group() as group:
        for _ in range(n):
            group.start_soon(noop)


def timed_anyio_trio(n: int) -> Contender:
    """A contender timing one ``anyio.run(anyio_task_group, n, backend="trio")``."""
    import anyio

    def measure() -> float:
        gc.collect()
        start = time.perf_counter()
        anyio.run(anyio_task_group, n, backend="trio")
        return time.perf_counter() - start

    return measure


# -- triotp ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _silent_logbook() -> Iterator[None]:
    import logbook

    with logbook.NullHandler().applicationbound():
        yield


async def triotp_start(n: int) -> None:
    """Start a triotp supervisor with N TEMPORARY no-op children and wait for it."""
    from triotp import supervisor

    children = [
        supervisor.child_spec(
            id=f"c{i}", task=noop, args=[], restart=supervisor.restart_strategy.TEMPORARY
        )
        for i in range(n)
    ]
    await supervisor.start(children, supervisor.options())


async def triotp_restarts(r: int) -> None:
    """One TRANSIENT triotp child that fails R times, then returns."""
    from triotp import supervisor

    flaky = Flaky(r)
    child = supervisor.child_spec(
        id="flaky", task=flaky, args=[], restart=supervisor.restart_strategy.TRANSIENT
    )
    await supervisor.start([child], supervisor.options(max_restarts=r, max_seconds=3600))
    if flaky.calls != r + 1:
        raise RuntimeError(f"triotp made {flaky.calls} calls, expected {r + 1}")


def timed_triotp(fn: Any, *args: object) -> Contender:
    """Like ``timed_trio``, with triotp's logbook output silenced."""
    inner = timed_trio(fn, *args)

    def measure() -> float:
        with _silent_logbook():
            return inner()

    return measure


# -- the scenario ----------------------------------------------------------------------------


def run_peers(plan: Plan) -> list[Result]:
    """Scenario 9: each peer vs bare trio, and our burst and restarts vs each peer."""
    results: list[Result] = []
    n = 1_000 if plan.quick else 10_000
    missing = {m: not available(m) for m in ("aiojobs", "anyio", "triotp", "logbook")}
    contenders: dict[str, Contender] = {
        "ours": timed_trio(ours_burst, n),
        "bare": timed_trio(bare_nursery, n),
        "asyncio": timed_asyncio(asyncio_task_group, n),
    }
    if not missing["aiojobs"]:
        contenders["aiojobs"] = timed_asyncio(aiojobs_spawn_wait, n)
    if not missing["anyio"]:
        contenders["anyio"] = timed_anyio_trio(n)
    triotp_ok = not missing["triotp"] and not missing["logbook"]
    if triotp_ok:
        contenders["triotp"] = timed_triotp(triotp_start, n)
    samples: dict[str, list[float]] = {}
    if len(contenders) > 3:  # at least one peer beside ours and the two bare loops
        samples = interleave(contenders, rounds=plan.rounds(n), warmup=plan.warmup(n))

    def row(label: str, ours: str, base: str, **options: Any) -> Row:
        return ratio_row("9", label, n, samples, ours, base, per=n, **options)

    if "aiojobs" in samples:
        results.append(
            row(
                "aiojobs spawn + wait",
                "aiojobs",
                "bare",
                unit="us/job",
                note="aiojobs on asyncio; bare asyncio TaskGroup vs bare trio: "
                f"{_median_ratio(samples['asyncio'], samples['bare']):.2f}x",
            )
        )
        results.append(
            row(
                "ours burst vs aiojobs",
                "ours",
                "aiojobs",
                target=Target(2.7),
                baseline_name="aiojobs spawn, then await each job (asyncio)",
            )
        )
    else:
        results.append(Skipped("9", "aiojobs", "aiojobs is not installed"))
    if "anyio" in samples:
        results.append(row("anyio task group on trio", "anyio", "bare"))
        results.append(
            row(
                "ours burst vs anyio",
                "ours",
                "anyio",
                target=Target(1.0, strict=True, text="< 1x"),
                baseline_name="anyio task group on trio",
            )
        )
    else:
        results.append(Skipped("9", "anyio", "anyio is not installed"))
    if triotp_ok:
        results.append(row("triotp supervisor start", "triotp", "bare"))
        results.extend(_triotp_restarts(plan))
    else:
        results.append(Skipped("9", "triotp", "triotp (and logbook) is not installed"))
    return results


def _median_ratio(a: list[float], b: list[float]) -> float:
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return ratios[len(ratios) // 2]


def _triotp_restarts(plan: Plan) -> list[Result]:
    r = 1_000
    samples = interleave(
        {
            "ours": timed_trio(ours_restarts, r),
            "bare": timed_trio(bare_retry_loop, r),
            "triotp": timed_triotp(triotp_restarts, r),
        },
        rounds=plan.rounds(r),
        warmup=plan.warmup(r),
    )
    return [
        ratio_row(
            "9",
            "triotp restarts",
            r,
            samples,
            "triotp",
            "bare",
            per=r,
            unit="us/restart",
            baseline_name="bare retry loop, a CancelScope per attempt",
        ),
        ratio_row(
            "9",
            "ours restarts vs triotp",
            r,
            samples,
            "ours",
            "triotp",
            per=r,
            unit="us/restart",
            target=Target(1 / 3, text="<= 0.33x (3x rate)"),
            baseline_name="triotp TRANSIENT child restarts",
        ),
    ]

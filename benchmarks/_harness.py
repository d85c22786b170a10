"""Shared machinery of the benchmark suite: interleaved rounds, ratios, table, JSON.

Every figure the suite reports is a *ratio* of two costs measured in the same process,
interleaved round by round (ours, baseline, ours, baseline, ...), so that slow drifts of
a noisy machine (other processes, thermal throttling, a busy neighbour) hit both sides
alike. Absolute times are printed for orientation only; they are not comparable across
runs or machines.

A *contender* is a zero-argument callable that performs one measurement and returns its
cost (seconds, bytes, ...). ``timed_trio`` and friends build contenders that run
``gc.collect()`` and then time one whole ``trio.run(...)`` with ``time.perf_counter``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import trio

Contender = Callable[[], float]
"""One measurement: run something once and return its cost."""


# -- contenders -------------------------------------------------------------------------------


def timed_trio(fn: Callable[..., Awaitable[object]], *args: object) -> Contender:
    """Return a contender that times one ``trio.run(fn, *args)`` after ``gc.collect()``."""

    def measure() -> float:
        gc.collect()
        start = time.perf_counter()
        trio.run(fn, *args)
        return time.perf_counter() - start

    return measure


def timed_asyncio(fn: Callable[..., Coroutine[Any, Any, object]], *args: object) -> Contender:
    """Return a contender that times one ``asyncio.run(fn(*args))`` after ``gc.collect()``."""

    def measure() -> float:
        gc.collect()
        start = time.perf_counter()
        asyncio.run(fn(*args))
        return time.perf_counter() - start

    return measure


def reported_trio(fn: Callable[..., Awaitable[float]], *args: object) -> Contender:
    """Return a contender whose cost is what ``trio.run(fn, *args)`` returns.

    For scenarios that isolate one phase inside the run (shutdown) or measure something
    other than time (memory); ``gc.collect()`` still runs first.
    """

    def measure() -> float:
        gc.collect()
        return float(trio.run(fn, *args))

    return measure


def interleave(
    contenders: Mapping[str, Contender], *, rounds: int, warmup: int = 0
) -> dict[str, list[float]]:
    """Run every contender once per round, in order, for ``warmup + rounds`` rounds.

    Warm-up rounds are discarded. Returns the costs of each contender, one per round, so
    that ``result[a][i] / result[b][i]`` is the ratio of round ``i``.
    """
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for index in range(warmup + rounds):
        for name, contender in contenders.items():
            cost = contender()
            if index >= warmup:
                samples[name].append(cost)
    return samples


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, interpolated."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- rows ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A goal for the median ratio: ``ratio <= limit`` (or ``< limit`` when strict)."""

    limit: float
    strict: bool = False
    text: str = ""

    def holds(self, ratio: float) -> bool:
        """Tell whether ``ratio`` meets the target."""
        return ratio < self.limit if self.strict else ratio <= self.limit

    def describe(self) -> str:
        """Return the text shown in the table's target column."""
        if self.text:
            return self.text
        return f"{'<' if self.strict else '<='} {self.limit:g}x"


@dataclass
class Row:
    """One line of the result table.

    ``ours`` and ``baseline`` hold raw costs per round (seconds, or bytes when ``unit`` is
    a byte unit); the table shows them divided by ``per`` (the number of items) and
    scaled by ``scale``. ``ratios`` are per-round ``ours / baseline`` unless given.
    ``judged``, when given, is the figure the target checks instead of the median ratio
    (an absolute one, such as a p50 in milliseconds: the target's text names it).
    """

    scenario: str
    label: str
    n: int
    ours: list[float]
    baseline: list[float]
    unit: str = "us/task"
    per: int = 1
    scale: float = 1e6
    ratios: list[float] = field(default_factory=list)
    target: Target | None = None
    baseline_name: str = "bare trio"
    note: str = ""
    judged: float | None = None

    def __post_init__(self) -> None:
        if not self.ratios:
            self.ratios = [a / b for a, b in zip(self.ours, self.baseline, strict=True) if b]

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios."""
        return statistics.median(self.ratios) if self.ratios else math.nan

    def per_item(self, costs: Sequence[float]) -> float:
        """Return the median cost per item, in the row's display unit."""
        return statistics.median(costs) / self.per * self.scale if costs else math.nan

    @property
    def target_ok(self) -> bool | None:
        """Whether the median ratio (or ``judged``) meets the target (``None`` without one)."""
        figure = self.ratio if self.judged is None else self.judged
        if self.target is None or math.isnan(figure):
            return None
        return self.target.holds(figure)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict with the samples and the summary."""
        data = asdict(self)
        data["target"] = None if self.target is None else self.target.describe()
        data.update(
            ours_per_item=self.per_item(self.ours),
            baseline_per_item=self.per_item(self.baseline),
            ratio_median=self.ratio,
            ratio_min=min(self.ratios, default=math.nan),
            ratio_max=max(self.ratios, default=math.nan),
            target_ok=self.target_ok,
        )
        return data


@dataclass(frozen=True)
class Skipped:
    """A row that could not run (an optional peer is missing), with the reason."""

    scenario: str
    label: str
    reason: str


Result = Row | Skipped


def ratio_row(
    scenario: str,
    label: str,
    n: int,
    samples: Mapping[str, list[float]],
    ours: str,
    baseline: str,
    **options: Any,
) -> Row:
    """Build a row from two contenders of one ``interleave`` result."""
    return Row(scenario, label, n, list(samples[ours]), list(samples[baseline]), **options)


def scaling_row(scenario: str, label: str, small: Row, large: Row, target: Target) -> Row:
    """Compare our per-item cost at a large N with our per-item cost at a small N.

    The "ours" column is our per-item cost at ``large.n``, the "baseline" column our own
    per-item cost at ``small.n``; the ratio (rounds paired by index) is the growth of the
    per-item cost. Bare trio's growth over the same range is given in the note.
    """
    ours = [s / large.n for s in large.ours]
    base = [s / small.n for s in small.ours]
    rounds = min(len(ours), len(base))
    bare_small = statistics.median(small.baseline) / small.n
    bare_large = statistics.median(large.baseline) / large.n
    return Row(
        scenario,
        label,
        large.n,
        ours,
        base,
        unit=small.unit,
        ratios=[ours[i] / base[i] for i in range(rounds)],
        target=target,
        baseline_name=f"ours at N={small.n}",
        note=f"bare trio per-task growth over the same range: {bare_large / bare_small:.2f}x",
    )


# -- output ---------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _fmt_n(n: int) -> str:
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def format_table(results: Iterable[Result]) -> str:
    """Render the results as one plain-text table, with skipped rows and notes below."""
    header = ("scenario", "N", "unit", "ours", "baseline", "ratio", "min-max", "target", "ok")
    lines: list[tuple[str, ...]] = []
    notes: list[str] = []
    skipped: list[str] = []
    for result in results:
        if isinstance(result, Skipped):
            skipped.append(f"  {result.scenario} {result.label}: skipped ({result.reason})")
            continue
        ok = result.target_ok
        lines.append(
            (
                f"{result.scenario} {result.label}",
                _fmt_n(result.n),
                result.unit,
                _fmt(result.per_item(result.ours)),
                _fmt(result.per_item(result.baseline)),
                f"{_fmt(result.ratio)}x",
                f"{_fmt(min(result.ratios, default=math.nan))}-"
                f"{_fmt(max(result.ratios, default=math.nan))}",
                "" if result.target is None else result.target.describe(),
                "" if ok is None else ("yes" if ok else "NO"),
            )
        )
        if result.baseline_name != "bare trio" or result.note:
            detail = f"baseline = {result.baseline_name}"
            if result.note:
                detail += f"; {result.note}"
            notes.append(f"  {result.scenario} {result.label} N={_fmt_n(result.n)}: {detail}")
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    right = {1, 3, 4, 5, 6}

    def render(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    out = [render(header), "  ".join("-" * w for w in widths)]
    out.extend(render(row) for row in lines)
    if notes:
        out += ["", "notes:", *notes]
    if skipped:
        out += ["", "skipped:", *skipped]
    return "\n".join(out)


def serve_jobs(control: Connection, run: Callable[[str, Any], object]) -> None:
    """A worker process's loop: run each ``(name, args)`` job ``control`` sends, until
    ``None``; answer ``("result", value)`` or ``("error", traceback)``."""
    while (job := control.recv()) is not None:
        name, args = job
        try:
            result = run(name, args)
        except BaseException:
            control.send(("error", traceback.format_exc()))
        else:
            control.send(("result", result))


def machine_info() -> dict[str, Any]:
    """Describe the interpreter and machine (for the JSON report)."""
    import trio_taskvisor

    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "trio": trio.__version__,
        "trio_taskvisor": trio_taskvisor.__version__,
    }


def write_json(path: str, results: Sequence[Result], *, quick: bool, seconds: float) -> None:
    """Write every row (samples included), skipped rows and machine info to ``path``."""
    report = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": quick,
        "wall_seconds": seconds,
        "machine": machine_info(),
        "rows": [r.to_json() for r in results if isinstance(r, Row)],
        "skipped": [asdict(r) for r in results if isinstance(r, Skipped)],
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, default=str)
        handle.write("\n")


@dataclass(frozen=True)
class Plan:
    """Sizes and round counts of one suite run (full or quick)."""

    quick: bool

    def sizes(self, full: Sequence[int], quick: Sequence[int]) -> Sequence[int]:
        """Pick the sizes for this run."""
        return quick if self.quick else full

    def rounds(self, n: int) -> int:
        """How many measured rounds at size ``n``: fewer for the largest sizes."""
        if self.quick:
            return 3
        if n <= 2_000:
            return 7
        if n <= 20_000:
            return 5
        return 3

    def warmup(self, n: int) -> int:
        """Warm-up rounds at size ``n`` (none at the largest sizes: the process is warm)."""
        if self.quick:
            return 1 if n <= 2_000 else 0
        return 1 if n <= 20_000 else 0

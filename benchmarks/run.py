"""Run the trio_taskvisor benchmark suite and print one table of ratios.

Usage::

    python benchmarks/run.py                 # every scenario, full sizes (several minutes)
    python benchmarks/run.py --quick         # smoke run, small sizes (well under a minute)
    python benchmarks/run.py --json out.json --plot scaling.png
    python benchmarks/run.py --only lifecycle --only 4

Every ratio is ours / baseline, measured in the same process, interleaved round by
round; see ``benchmarks/README.md``. The script reports and never judges: it exits 0
whether or not the targets hold, and non-zero only when a scenario itself fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Plan, Result, Row, format_table, machine_info, write_json
from cluster import run_cluster
from controller import run_controller
from fanout import run_fanout
from keyed import run_keyed
from lifecycle import run_lifecycle, run_subscribers
from local_limits import run_limits
from memory import run_memory
from peers import run_peers
from restarts import run_restarts
from shutdown import run_shutdown

Scenario = Callable[[Plan], list[Result]]

SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "lifecycle": ("1", run_lifecycle),
    "subscribers": ("2", run_subscribers),
    "restarts": ("3", run_restarts),
    "controller": ("4", run_controller),
    "keyed": ("5", run_keyed),
    "fanout": ("6", run_fanout),
    "memory": ("7", run_memory),
    "shutdown": ("8", run_shutdown),
    "peers": ("9", run_peers),
    "cluster": ("10", run_cluster),
    "limits": ("11", run_limits),
}


def _scenario_name(value: str) -> str:
    by_number = {number: name for name, (number, _) in SCENARIOS.items()}
    name = by_number.get(value, value)
    if name not in SCENARIOS:
        choices = ", ".join(f"{n} ({number})" for n, (number, _) in SCENARIOS.items())
        raise argparse.ArgumentTypeError(f"unknown scenario {value!r}; choose from {choices}")
    return name


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    parser.add_argument("--json", metavar="PATH", help="write every row and sample as JSON")
    parser.add_argument("--plot", metavar="PATH", help="draw the scaling curves to a PNG")
    parser.add_argument(
        "--only",
        metavar="SCENARIO",
        action="append",
        type=_scenario_name,
        help="run only this scenario (name or number; repeatable): " + ", ".join(SCENARIOS),
    )
    args = parser.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install 'trio_taskvisor[bench]')")
    return args


def plot(results: Sequence[Result], path: str) -> None:
    """Draw per-item cost and ratio against N for every row measured at several sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[Row]] = {}
    for result in results:
        if isinstance(result, Row) and "scaling" not in result.label:
            families.setdefault(f"{result.scenario} {result.label}", []).append(result)
    curves = {name: rows for name, rows in families.items() if len({r.n for r in rows}) > 1}
    fig, (costs, ratios) = plt.subplots(1, 2, figsize=(13, 5.5))
    for name, rows in sorted(curves.items()):
        rows.sort(key=lambda r: r.n)
        ns = [r.n for r in rows]
        (line,) = costs.plot(ns, [r.per_item(r.ours) for r in rows], marker="o", label=name)
        costs.plot(
            ns, [r.per_item(r.baseline) for r in rows], marker="x", linestyle="--",
            color=line.get_color(),
        )  # fmt: skip
        medians = [r.ratio for r in rows]
        low = [r.ratio - min(r.ratios) for r in rows]
        high = [max(r.ratios) - r.ratio for r in rows]
        ratios.errorbar(ns, medians, yerr=[low, high], marker="o", capsize=3, label=name)
    for axis in (costs, ratios):
        axis.set_xscale("log")
        axis.set_xlabel("N")
        axis.grid(True, which="both", alpha=0.3)
    costs.set_yscale("log")
    costs.set_ylabel("microseconds per item (solid: ours, dashed: baseline)")
    costs.set_title("cost per item")
    ratios.set_ylabel("ours / baseline (median, min-max)")
    ratios.set_title("ratio")
    ratios.legend(fontsize="small")
    info = machine_info()
    fig.suptitle(
        f"trio_taskvisor {info['trio_taskvisor']}, trio {info['trio']}, "
        f"Python {info['python']}, {info['cpu_count']} CPUs"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected scenarios, print the table, write the JSON and plot if asked."""
    args = parse_args(argv)
    plan = Plan(quick=args.quick)
    selected = args.only or list(SCENARIOS)
    results: list[Result] = []
    started = time.perf_counter()
    for name in SCENARIOS:
        if name not in selected:
            continue
        number, scenario = SCENARIOS[name]
        t0 = time.perf_counter()
        print(f"[{number}] {name} ...", end="", file=sys.stderr, flush=True)
        results.extend(scenario(plan))
        print(f" {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    info = machine_info()
    print(
        f"trio_taskvisor {info['trio_taskvisor']} | trio {info['trio']} | "
        f"{info['implementation']} {info['python']} | {info['platform']} | "
        f"{info['cpu_count']} CPUs | {'quick' if plan.quick else 'full'} run, {elapsed:.1f}s"
    )
    print("ratio = ours / baseline per round (lower is better); ours and baseline are medians\n")
    print(format_table(results))
    if args.json:
        write_json(args.json, results, quick=plan.quick, seconds=elapsed)
        print(f"\nwrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

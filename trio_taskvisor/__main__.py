"""``python -m trio_taskvisor``: the demo, a short tour, and a look into a cluster.

Usage::

    python -m trio_taskvisor --version
    python -m trio_taskvisor demo [--duration SECONDS] [--plain | --live] [--seed N]
    python -m trio_taskvisor tour
    python -m trio_taskvisor slots URL [--namespace NS] [--watch | --json]

``demo`` (also what runs with no subcommand, with its defaults) is the README's demo:
about 20 s of a supervised service, shown live with ``rich`` (``pip install
'trio_taskvisor[demo]'``), or as log lines with ``--plain``. The live view needs a
terminal of at least 80x24: ``--plain`` is the default when stdout is not a terminal,
when the terminal is smaller, or when ``rich`` is missing (a hint on stderr says which);
``--live`` insists on the live view on a terminal smaller than 80x24; on a stdout that
is no terminal (a pipe, a file) it prints log lines too, with a hint on stderr, unless
``TTY_COMPATIBLE=1`` makes ``rich`` draw there anyway.
Ctrl+C starts the graceful shutdown; a second Ctrl+C forces it at once; either way the
summary is printed. See ``trio_taskvisor._cli.demo``.

``tour`` is the short walk-through (about 2 s, no extra dependency): a flaky fetch, a
periodic heartbeat, a fatal failure and a task that overstays the grace window, logged
event by event. See ``trio_taskvisor._cli.tour``.

``slots`` shows what a slot store holds, read only: every cluster slot (lease holder,
fence token, lease time left, cluster queue), every live instance and every limit pool,
once as text, as one JSON document (``--json``), or redrawn live until Ctrl+C
(``--watch``). It needs the ``redis`` extra. See ``trio_taskvisor._cli.slots``.

The exit status is 0 when the run ends as designed (the demo's and the tour's stubborn
task overrunning the grace window is part of the design), and ``128 + signal`` when a
signal ended it, as services do: 130 after a Ctrl+C (a first, graceful one in the demo,
or a second that forced its shutdown, or one that interrupted the tour), 143 after a
SIGTERM to the demo. ``slots`` exits with 0 (Ctrl+C or SIGTERM ends ``--watch`` with 0
too), or with 2 and a one-line error on stderr when the store cannot be read.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from ._cli import drop_stdout


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:  # argparse's own message would name this function
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m trio_taskvisor",
        description="trio_taskvisor demo and tour, and a look into a cluster's slot store.",
        epilog="python -m trio_taskvisor demo --help: the demo's options and views.",
    )
    parser.add_argument("--version", action="version", version=f"trio_taskvisor {__version__}")
    parser.set_defaults(command="demo", duration=20.0, plain=None, seed=None)
    commands = parser.add_subparsers(title="commands", metavar="{demo,tour,slots}")
    demo = commands.add_parser(
        "demo",
        help="a supervised service for about 20 s, shown live (the default)",
        description=(
            "A supervised service for --duration seconds, then a graceful shutdown. "
            "Shown live (needs rich: pip install 'trio_taskvisor[demo]') on a terminal of "
            "at least 80x24; log lines (--plain) otherwise: when stdout is not a terminal, "
            "the terminal is smaller, or rich is missing. Ctrl+C shuts down gracefully, "
            "a second Ctrl+C forces the shutdown at once; either way the summary is "
            "printed and the exit status is 128 + the signal (130 for Ctrl+C)."
        ),
    )
    demo.set_defaults(command="demo")
    demo.add_argument(
        "--duration",
        type=_seconds,
        default=20.0,
        metavar="SECONDS",
        help="how long the service runs before the graceful shutdown (default: 20)",
    )
    view = demo.add_mutually_exclusive_group()
    view.add_argument(
        "--plain",
        action="store_const",
        const=True,
        help="log lines instead of the live view (the default when stdout is not a "
        "terminal of at least 80x24, or rich is missing)",
    )
    view.add_argument(
        "--live",
        dest="plain",
        action="store_const",
        const=False,
        help="the live view even on a terminal smaller than 80x24 (a stdout that is no "
        "terminal still gets log lines, unless TTY_COMPATIBLE=1)",
    )
    demo.add_argument("--seed", type=int, help="seed the demo's randomness")
    tour = commands.add_parser("tour", help="a 2 s walk-through, logged event by event")
    tour.set_defaults(command="tour")
    slots = commands.add_parser(
        "slots",
        help="what a cluster's slot store holds (slots, instances, limit pools), read only",
        description=(
            "What a slot store holds, read only: every cluster slot (its lease holder's "
            "instance, fence token, lease time left, cluster queue head first), every live "
            "instance (heartbeat time left, the lease_ttl it runs with, slots owned, entries "
            "queued, limit units held) and every limit pool. It writes nothing. Needs the "
            "redis extra: pip install 'trio_taskvisor[redis]'. Exit status 0, or 2 with a "
            "one-line error when the store cannot be read."
        ),
    )
    slots.set_defaults(command="slots")
    slots.add_argument(
        "url",
        metavar="URL",
        help="the store's URL (redis://, rediss://, redis+sentinel://), as RedisSlotStore takes it",
    )
    slots.add_argument(
        "--namespace",
        default="taskvisor",
        metavar="NS",
        help="the slot namespace, as given to RedisSlotStore (default: taskvisor)",
    )
    output = slots.add_mutually_exclusive_group()
    output.add_argument(
        "--watch",
        action="store_true",
        help="redraw it live until Ctrl+C (with rich when installed, fitted to the terminal)",
    )
    output.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document with the keys slots, instances and pools",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "slots":
            from ._cli.slots import main as slots_main

            return slots_main(
                args.url, namespace=args.namespace, watch=args.watch, as_json=args.json
            )
        if args.command == "tour":
            from ._cli.tour import main as tour_main

            return tour_main()
        from ._cli.demo import main as demo_main

        return demo_main(duration=args.duration, plain=args.plain, seed=args.seed)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader went away (``| head``) as the demo ended
        drop_stdout()
        return 0


if __name__ == "__main__":
    sys.exit(main())

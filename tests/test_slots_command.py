"""``python -m trio_taskvisor slots``, without a server: the snapshot built from what
the server holds, its JSON document, its text fitted to a terminal, and the errors that
need no server (a bad URL, coredis missing). The reading itself, ``--watch`` in
terminals and the errors of real servers are in ``tests/cluster/test_cluster_slots_command.py``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import trio

from trio_taskvisor import SlotStoreUnavailableError
from trio_taskvisor._cli import slots
from trio_taskvisor._cli.slots import (
    ClusterView,
    InstanceRow,
    PoolRow,
    QueuedEntry,
    SlotRow,
    assemble,
    render,
    to_json,
)
from trio_taskvisor.redis import RedisSlotStore

from helpers import ROOT

A, B, C = "host-a:11:aaaaaaaa", "host-b:22:bbbbbbbb", "host-c:33:cccccccc"


def sample() -> ClusterView:
    """A holds t:2 (B queued behind it), B holds t:10 with a stop asked by A (C, whose
    heartbeat is gone, queued behind it), nobody holds t:1 (a hand-over: A's entry heads
    the queue). A's heartbeat says its lease_ttl, B's (of an earlier version) does not."""
    return assemble(
        leases={
            "t:2": (f"{A}/1", "1700000000000001", None, 900),
            "t:10": (f"{B}/4", "1700000000000002", A, 450),
            "t:gone": (None, None, None, -2),  # expired between the scan and the read
        },
        queues={"t:2": [f"{B}/5"], "t:10": [f"{C}/9"], "t:1": [f"{A}/3"], "t:empty": []},
        heartbeats={A: 950, B: 1000},
        lease_ttls={A: 1000},
    )


def test_assemble_reads_leases_queues_and_heartbeats() -> None:
    """Slots with a lease or a queue, numbers in names sorted by value; live instances
    with what they own and queue; an entry is live while its instance's heartbeat is."""
    view = sample()
    assert [s.slot for s in view.slots] == ["t:1", "t:2", "t:10"]
    t1, t2, t10 = view.slots
    assert t1 == SlotRow("t:1", None, None, None, None, None, (QueuedEntry(f"{A}/3", A, True),))
    assert t2 == SlotRow(
        "t:2", A, f"{A}/1", 1700000000000001, 0.9, None, (QueuedEntry(f"{B}/5", B, True),)
    )
    assert t10 == SlotRow(
        "t:10", B, f"{B}/4", 1700000000000002, 0.45, A, (QueuedEntry(f"{C}/9", C, False),)
    )
    assert view.instances == (
        InstanceRow(A, 0.95, ("t:2",), 1, 0, lease_ttl=1.0),
        InstanceRow(B, 1.0, ("t:10",), 1, 0, lease_ttl=None),
    )
    assert view.pools == ()


def test_an_instance_id_with_a_slash_is_kept_whole() -> None:
    """A task id never has a "/": the instance is everything before the last one."""
    view = assemble({}, {"s": ["a/b:1:ff/7"]}, {"a/b:1:ff": 500})
    assert view.slots[0].queue == (QueuedEntry("a/b:1:ff/7", "a/b:1:ff", True),)


def test_names_with_digits_that_are_no_numbers_sort_and_show() -> None:
    """A slot or an instance named with a character that is a digit but no decimal
    number ("²"), or with a number of more digits than ``int`` reads, is sorted and
    shown; numbers in any script's digits sort by value. Before, the sort key read "²"
    as a number: ``int`` raised ValueError, and the command failed."""
    huge = "9" * 5000
    odd = "host²:1:ff"
    view = assemble(
        leases={"area:10²": (f"{odd}/1", "7", None, 900), f"t:{huge}": (f"{A}/2", "8", None, 900)},
        queues={"t:\u0663": [f"{odd}/3"], "t:10": [f"{A}/4"], "t:02": [f"{A}/5"]},
        heartbeats={odd: 900, A: 900, "host:²": 900},
    )
    assert [s.slot for s in view.slots] == ["area:10²", "t:02", "t:\u0663", "t:10", f"t:{huge}"]
    assert [i.instance for i in view.instances] == [A, "host:²", odd]
    lines = text(view, 120, 40)
    assert [line.split()[0] for line in lines[3:8]] == [
        "area:10²", "t:02", "t:\u0663", "t:10", "t:" + "9" * 17 + "…" + "9" * 20
    ]  # fmt: skip
    assert lines[3].split()[1] == "3/1"


def test_numbers_the_server_does_not_keep_are_none() -> None:
    """A fence token or a ``lease_ttl`` that is no integer the server keeps (text, a
    number beyond 64 bits, of thousands of digits, in other digits than ASCII) is none.
    Before, a token of 5,000 digits raised ValueError (``int``'s limit)."""
    tokens = ["9" * 5000, "9" * 20, str(2**63), "\u0663", "x", str(2**63 - 1)]
    leases = {f"s:{n}": (f"{A}/{n}", token, None, 900) for n, token in enumerate(tokens)}
    view = assemble(leases, {}, {A: 900})
    assert [s.fence_token for s in view.slots] == [None, None, None, None, None, 2**63 - 1]
    assert [line.split()[2] for line in text(view)[3:9]] == ["-"] * 5 + [str(2**63 - 1)]


def test_json_document_has_the_three_lists() -> None:
    """``--json``: exactly ``slots``, ``instances`` and ``pools``, with every field."""
    document = json.loads(json.dumps(to_json(sample())))
    assert list(document) == ["slots", "instances", "pools"]
    assert document["slots"][2] == {
        "slot": "t:10",
        "holder": B,
        "entry": f"{B}/4",
        "fence_token": 1700000000000002,
        "lease_remaining": 0.45,
        "stop_requested_by": A,
        "queue": [{"entry": f"{C}/9", "instance": C, "live": False}],
    }
    assert document["instances"][0] == {
        "instance": A,
        "heartbeat_remaining": 0.95,
        "slots_owned": ["t:2"],
        "queued": 1,
        "units_held": 0,
        "lease_ttl": 1.0,
    }
    assert document["instances"][1]["lease_ttl"] is None
    assert document["pools"] == []


def test_json_pools_have_their_fields() -> None:
    """The pools section's shape, for when limits are kept on the server."""
    pool = PoolRow("partner-api", "acme", "rate", 0, (), 2, 0.25)
    document = to_json(ClusterView((), (), (pool,)))
    assert document["pools"] == [
        {
            "name": "partner-api",
            "key": "acme",
            "kind": "rate",
            "held": 0,
            "holders": {},
            "waiting": 2,
            "next_start_in": 0.25,
        }
    ]


def test_json_times_that_are_no_finite_number_are_null() -> None:
    """A time that is no finite number is ``null``: the document is standard JSON,
    which no ``Infinity`` or ``NaN`` is (``json.dumps`` writes them by default)."""
    inf, nan = float("inf"), float("nan")
    slot = SlotRow("s", A, f"{A}/1", 1, inf, None, ())
    instance = InstanceRow(A, nan, ("s",), 0, 0, lease_ttl=inf)
    pool = PoolRow("p", None, "rate", 0, (), 0, inf)
    document = to_json(ClusterView((slot,), (instance,), (pool,)))

    def refuse(constant: str) -> object:
        raise AssertionError(f"not JSON: {constant}")

    strict = json.loads(json.dumps(document, allow_nan=False), parse_constant=refuse)
    assert strict["slots"][0]["lease_remaining"] is None
    assert (strict["instances"][0]["heartbeat_remaining"], strict["instances"][0]["lease_ttl"]) == (
        None,
        None,
    )
    assert strict["pools"][0]["next_start_in"] is None


def text(view: ClusterView, width: int | None = None, height: int | None = None) -> list[str]:
    return [line for _, line in render(view, title="TITLE", width=width, height=height)]


def test_text_names_entries_by_instance_number() -> None:
    """Slot rows name entries "n/t" (instance n, task t); the instances section lists
    each number, a dead instance that a queue names as "gone"; marks are explained."""
    lines = text(sample())
    assert lines[0] == "TITLE"
    assert lines[1] == (
        "slots: 3, 2 held, 3 queued   ! = stop asked; † = instance gone; n/t = instance n, task t"
    )
    rows = {line.split()[0]: line.split() for line in lines[3:6]}
    assert rows["t:1"] == ["t:1", "-", "-", "-", "1:", "1/3"]
    assert rows["t:2"] == ["t:2", "1/1", "1700000000000001", "0.9", "s", "1:", "2/5"]
    assert rows["t:10"] == ["t:10", "2/4", "1700000000000002", "0.5", "s!", "1:", "3/9†"]
    assert lines[6] == "instances: 2 live, 1 gone (named by slots)"
    assert lines[7].split() == [
        "#", "INSTANCE", "HEARTBEAT", "LEASE", "TTL", "OWNS", "QUEUED", "UNITS"
    ]  # fmt: skip
    assert lines[8].split() == ["1", A, "0.9", "s", "1", "s", "1", "1", "0"]  # 0.95 s, rounded
    assert lines[9].split() == ["2", B, "1.0", "s", "-", "1", "1", "0"]
    assert lines[10].split() == ["3", C, "gone"]
    assert lines[11:] == ["limit pools: 0", "  none on the server"]


def test_names_that_do_not_print_are_shown_escaped() -> None:
    """Slot, instance, task, pool and key names come from the server, written by any
    process that reaches it: characters that do not print (a line break, a tab, the
    escape of a terminal's control sequence) are shown as ``repr`` shows them, so that
    a name neither breaks the table nor drives the operator's terminal. Before, they
    were printed as they are (a slot named "\\x1b[2J" cleared the screen). The JSON
    document keeps them as they are (``json.dumps`` escapes them)."""
    odd = "odd\x1b[2J:9:x"
    view = assemble(
        leases={"x\ny": (f"{odd}/\x07", "1", None, 900)},
        queues={"tab\there": [f"{odd}/2"]},
        heartbeats={odd: 950},
        pools={"c\x1b[1m k\rk": ("concurrency 1", (), 0, None)},
    )
    lines = text(view)
    assert all(line.isprintable() for line in lines)
    assert [line.split()[0] for line in lines[3:5]] == ["tab\\there", "x\\ny"]
    assert lines[4].split()[1] == "1/\\x07"
    assert lines[7].split()[1] == "odd\\x1b[2J:9:x"
    assert lines[10].split()[0] == "c\\x1b[1m[k\\rk]"
    error = [line for kind, line in render(view, title="T", error="no\x1b[2J") if kind == "error"]
    assert error == ["no\\x1b[2J"]
    assert to_json(view)["slots"][0]["slot"] == "tab\there"


def test_text_says_when_the_instances_run_with_different_lease_ttl() -> None:
    """During a rolling change of ``lease_ttl`` each instance shows its own (as the
    server grants its leases), and the instances' rule says that they differ; a
    heartbeat that does not say (an earlier version's) is not counted as different."""
    lease_ttls = {A: 250, B: 30_000}
    view = assemble({}, {}, {A: 200, B: 29_000, C: 900}, lease_ttls=lease_ttls)
    lines = text(view)
    assert lines[3] == "instances: 3 live   lease_ttl differs (a rolling change?)"
    assert [line.split()[4] for line in lines[5:8]] == ["0.25", "30", "-"]
    same = assemble({}, {}, {A: 200, B: 29_000, C: 900}, lease_ttls={A: 250, B: 250})
    assert text(same)[3] == "instances: 3 live"


def test_text_of_an_empty_namespace() -> None:
    """Nothing at all in the namespace: the first section says where to look."""
    assert text(ClusterView((), ())) == [
        "TITLE",
        "slots: 0, 0 held, 0 queued",
        "  none: nothing in this namespace (see --namespace)",
        "instances: 0 live",
        "  none",
        "limit pools: 0",
        "  none on the server",
    ]


def many(slots: int, instances: int) -> ClusterView:
    names = [f"host-{i}.example.internal:{1000 + i}:{i:08x}" for i in range(instances)]
    leases = {
        f"tenant-with-a-long-name:{n}": (f"{names[n % instances]}/{n}", str(10**15 + n), None, 999)
        for n in range(slots)
    }
    queues = {slot: [f"{name}/{n}" for n, name in enumerate(names * 3)] for slot in leases}
    return assemble(leases, queues, dict.fromkeys(names, 1000))


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (200, 60)])
@pytest.mark.parametrize(("slots", "instances"), [(0, 0), (3, 2), (60, 4), (5, 40), (60, 60)])
def test_text_fits_the_terminal(width: int, height: int, slots: int, instances: int) -> None:
    """No line wider than the terminal, no more lines than it has; rows that do not fit
    are counted, never dropped silently; the numbers are never cut."""
    lines = text(many(slots, instances), width, height)
    assert len(lines) <= height
    assert all(len(line) <= width for line in lines), lines
    assert "limit pools: 0" in lines  # every section keeps its rule

    def hidden(section: str) -> int:
        more = [line.split()[1] for line in lines if line.endswith(f" more {section}")]
        return int(more[0]) if more else 0

    slot_rows = [line for line in lines if line.startswith("tenant")]
    instance_rows = [line for line in lines if line[:1].isdigit()]
    assert len(slot_rows) + hidden("slots") == slots, lines
    assert len(instance_rows) + hidden("instances") == instances, lines
    for line in slot_rows:
        assert line.split()[2].startswith("10000000000000")  # the whole fence token


WIDE = "顧客:東京支店の請求書作成ジョブ-第二四半期"  # 25 characters, 48 columns
EMOJI = "🎉tenant🎉-with-a-longer-name🎉🎉"
COMBINING = "cafe\u0301-tenant-with-combining-marks-e\u0301\u0301"


def wide_view() -> ClusterView:
    names = (WIDE, EMOJI, COMBINING, "ascii-tenant")
    return assemble(
        leases={name: (f"{A}/{n}", str(10**15 + n), None, 900) for n, name in enumerate(names)},
        queues={name: [f"{B}/{n + 10}"] for n, name in enumerate(names)},
        heartbeats={A: 950, B: 950},
        pools={f"テナント {WIDE}": ("concurrency 3", (A,), 1, None)},
    )


@pytest.mark.parametrize("width", [80, 120, None])
def test_wide_and_combining_characters_keep_the_columns(width: int | None) -> None:
    """Names in CJK or with emoji (two columns a character) or with combining marks
    (none) are measured in terminal columns: every row's columns start where its head's
    do, and no line is wider than the terminal. Before, the characters were counted: the
    columns went out of line, and a row of wide names wider than the terminal wrapped."""
    lines = text(wide_view(), width, None if width is None else 24)
    columns = slots._cells
    if width is not None:
        assert all(columns(line) <= width for line in lines), lines
    head = next(line for line in lines if line.startswith("SLOT"))
    rows = lines[lines.index(head) + 1 : lines.index(head) + 5]
    for line in rows:
        fence = line.index(" 10000000000000") + 1
        assert columns(line[:fence]) == columns(head[: head.index("FENCE")]), rows
    if width is None:
        assert "…" not in "\n".join(lines)
    elif width == 80:
        assert any("…" in line for line in rows)  # the wide name was cut, in columns


def test_cutting_counts_columns() -> None:
    """A cut never splits a wide character past the width: it stops one column short."""
    assert slots._cut(WIDE, 10) == "顧客:東京…"  # 2 + 2 + 1 + 2 + 2 + 1 = 10 columns
    assert slots._cut(WIDE, 11) == "顧客:東京…"  # the next character would take 12
    assert slots._cut_middle(WIDE, 11) == "顧客:…半期"
    assert slots._cells(COMBINING) == len(COMBINING) - 3
    assert slots._cut(COMBINING, 5) == "cafe\u0301…"


def test_skipped_keys_are_named_within_the_terminal() -> None:
    """Keys of another kind (written by something else) are named on one line under the
    title, cut to the width, and counted in the height; a byte that is not UTF-8 (read
    as a surrogate escape) shows as ``\\xff``."""
    full = many(60, 4)
    skipped = tuple(f"tv:{{ns}}:lease:foreign-{n}\udcff" for n in range(30))
    view = ClusterView(full.slots, full.instances, full.pools, skipped)
    lines = text(view, 80, 24)
    assert len(lines) <= 24
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].startswith("skipped 30 keys of another kind: tv:{ns}:lease:foreign-0\\xff, ")
    assert lines[1].endswith("…")
    assert any(line.endswith(" more slots") for line in lines)


def test_malformed_keys_are_named_on_a_line_of_their_own() -> None:
    """Limit pools of settings this version does not write are named under the title,
    after the keys of another kind, each line counted in the height; one key is "1 key"."""
    full = many(60, 4)
    view = ClusterView(full.slots, full.instances, (), ("tv:{ns}:q:x",), ("tv:{ns}:lp:\x1b",))
    lines = text(view, 80, 24)
    assert len(lines) == 24
    assert lines[1:3] == [
        "skipped 1 key of another kind: tv:{ns}:q:x",
        "skipped 1 malformed key: tv:{ns}:lp:\\x1b",
    ]


@pytest.mark.parametrize("width", [80, 120])
def test_the_watchs_title_keeps_the_time_of_its_read(width: int) -> None:
    """A long namespace and URL are cut in the watch's title before the time of the
    read, which says how old the view is while reads fail. Before, the time went first."""
    store = RedisSlotStore("redis://a-long-host-name.example.internal:6379/0", namespace="n" * 60)
    watch = slots._Watch(store, ClusterView((), ()), read_at=0.0)
    _, title = watch.lines(width, 24)[0]
    stamp = time.strftime("%H:%M:%S", time.localtime(0.0))
    assert title.endswith(f"…  read at {stamp}  Ctrl+C: quit"), title
    assert title.startswith("slots of 'nnnn")
    assert slots._cells(title) <= width


def test_unbounded_text_cuts_nothing() -> None:
    """Printed once (no ``--watch``), names and queues are shown whole."""
    view = many(2, 30)
    joined = "\n".join(text(view))
    assert "…" not in joined
    assert all(row.instance in joined for row in view.instances)


@pytest.mark.parametrize("terminal", [True, False])
def test_a_snapshot_fits_a_terminal_and_goes_whole_into_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], terminal: bool
) -> None:
    """Printed once on an 80-column terminal, no line is wider (before, each long row
    wrapped in the middle of its queue) and every row is shown; into a pipe, whole."""
    view = many(2, 30)

    async def read(store: RedisSlotStore) -> ClusterView:
        return view

    monkeypatch.setattr(slots, "read_cluster", read)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    monkeypatch.setattr(slots.shutil, "get_terminal_size", lambda: os.terminal_size((80, 24)))
    store = RedisSlotStore("redis://127.0.0.1:6379/0")
    trio.run(functools.partial(slots.run, store, watch=False, as_json=False, live=False))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 + 2 + 2 + 30 + 2  # every row: title, rules, heads, rows, none
    if terminal:
        assert max(map(len, lines)) == 80
        assert "…" in lines[3]  # the first slot's queue, cut
    else:
        assert max(map(len, lines)) > 80
        assert all(row.instance in "\n".join(lines) for row in view.instances)


async def test_watch_waits_longer_after_a_long_read(
    autojump_clock: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--watch`` reads every ``REFRESH`` s, or after ``PACE`` times the last successful
    read's time: a large namespace's read is one long ``EXEC`` that the server serves
    nothing else during, and the view must not keep it busy. A failed read (here one
    that timed out) is followed by the next after ``REFRESH``, to show the recovery."""
    took = {"seconds": 0.0}

    async def read_cluster(store: object) -> ClusterView:
        await trio.sleep(took["seconds"])
        if took["seconds"] > 1:
            raise SlotStoreUnavailableError("slot store URL did not answer within 2.0 s")
        return ClusterView((), ())

    monkeypatch.setattr(slots, "read_cluster", read_cluster)
    watch = slots._Watch(RedisSlotStore("redis://127.0.0.1"), ClusterView((), ()), 0.0)
    assert watch.pause == slots.REFRESH == 0.5
    for seconds, pause in ((0.05, 0.5), (0.3, 1.2), (2.0, 0.5), (0.5, 2.0), (0.0, 0.5)):
        took["seconds"] = seconds
        await watch.read()
        assert watch.pause == pause
        assert (watch.error is not None) == (seconds > 1)


# -- errors that need no server ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["http://localhost"],
            "error: url scheme must be 'redis', 'rediss', 'redis+sentinel' or "
            "'rediss+sentinel', got 'http'\n",
        ),
        (
            ["redis://localhost/0", "--namespace", "a{b}"],
            "error: namespace must be non-empty, without '{' or '}', got 'a{b}'\n",
        ),
    ],
)
def test_an_invalid_url_or_namespace_exits_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """The URL and namespace are checked as ``RedisSlotStore`` checks them: one line, 2."""
    from trio_taskvisor.__main__ import main

    assert main(["slots", *args]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message)


def test_watch_and_json_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    from trio_taskvisor.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["slots", "redis://localhost/0", "--watch", "--json"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("watch", [True, False])
def test_ctrl_c_inside_the_clients_task_group(monkeypatch: pytest.MonkeyPatch, watch: bool) -> None:
    """Ctrl+C that arrives during a read comes out of trio in a group: it still ends
    ``--watch`` with status 0, and a single read as a ``KeyboardInterrupt`` (130)."""
    from trio_taskvisor._cli import slots

    async def interrupted(*args: object, **kwargs: object) -> None:
        raise BaseExceptionGroup("the client's task group", [KeyboardInterrupt()])

    monkeypatch.setattr(slots, "run", interrupted)
    if watch:
        assert slots.main("redis://localhost/0", watch=True) == 0
    else:
        from trio_taskvisor.__main__ import main

        assert main(["slots", "redis://localhost/0"]) == 130


def test_without_coredis_exits_2_naming_the_extra() -> None:
    """Without the redis extra: one line naming it, status 2."""
    code = (
        "import sys; sys.modules['coredis'] = None; from trio_taskvisor.__main__ import main; "
        "sys.exit(main(['slots', 'redis://127.0.0.1:6379/0']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "error: the slots command needs the redis extra: pip install 'trio_taskvisor[redis]'\n"
    )

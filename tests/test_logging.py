"""Logging: ``LoggingSubscriber`` event fields reach formatters as fields; the
supervisor's own ``log_failures`` records, with ``caplog``."""

from __future__ import annotations

import datetime
import enum
import json
import logging
import math
import re
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from test_docs import extract_blocks

from trio_taskvisor import (
    BackoffPolicy,
    BackoffSource,
    CriticalTaskError,
    EventKind,
    FatalError,
    GraceExceededError,
    LoggingSubscriber,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
    TaskCancelled,
    TaskEvent,
    TaskFailure,
    TaskId,
    TaskSpec,
    current_context,
    open_supervisor,
)

from helpers import ROOT, Attempts, deferring, failing, panic_actors

PREFIX = "taskvisor_"
HOWTO = ROOT / "docs" / "howto-logging.md"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: message, level, and every ``taskvisor_*`` field."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            key.removeprefix(PREFIX): value
            for key, value in vars(record).items()
            if key.startswith(PREFIX)
        }
        document = {"message": record.getMessage(), "level": record.levelname, **fields}
        return json.dumps(document, default=_plain)


def _plain(value: object) -> object:
    """Enums as their values, anything else JSON cannot encode as text."""
    return value.value if isinstance(value, enum.Enum) else str(value)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def json_logger(name: str) -> tuple[logging.Logger, ListHandler]:
    handler = ListHandler()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    return logger, handler


async def fails_first_attempt() -> None:
    """Fail attempt 1 with exit code 75; succeed on the next."""
    if current_context().attempt == 1:
        raise TaskFailure("upstream 503", exit_code=75)
    await trio.lowlevel.checkpoint()


async def test_json_formatter_gets_every_event_field(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each record carries the event's fields; enums and ids serialise as values."""
    logger, handler = json_logger("tests.logging.json")
    try:
        async with open_supervisor(subscribers=[LoggingSubscriber(logger)]) as sup:
            await (
                await sup.add(
                    TaskSpec.restartable(
                        "fetch", fails_first_attempt, backoff=BackoffPolicy.constant(1.0)
                    )
                )
            ).wait()
    finally:
        logger.removeHandler(handler)
    documents: list[dict[str, Any]] = [json.loads(line) for line in handler.lines]
    (failed,) = [d for d in documents if d["kind"] == "attempt_failed"]
    assert failed["level"] == "WARNING"
    assert failed["name"] == "fetch"
    assert failed["attempt"] == 1
    assert failed["reason"] == "upstream 503"
    assert failed["exit_code"] == 75
    assert isinstance(failed["task_id"], int)
    assert isinstance(failed["seq"], int)
    assert isinstance(failed["duration"], float)
    assert "fetch" in failed["message"]
    (finished,) = [d for d in documents if d["kind"] == "task_finished"]
    assert finished["outcome"] == "completed"
    assert finished["level"] == "INFO"
    (backoff,) = [d for d in documents if d["kind"] == "backoff_scheduled"]
    assert backoff["delay"] == 1.0
    assert backoff["backoff_source"] == "failure"


async def test_every_taskvisor_event_field_is_present_on_the_record() -> None:
    """The ``extra`` keys are exactly the event's attributes, prefixed ``taskvisor_``."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("tests.logging.fields")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = Keep()
    logger.addHandler(handler)
    try:
        async with open_supervisor(subscribers=[LoggingSubscriber(logger)]) as sup:
            await (await sup.add(TaskSpec.once("t", trio.lowlevel.checkpoint))).wait()
    finally:
        logger.removeHandler(handler)
    expected = {PREFIX + field.name for field in attrs.fields(TaskEvent)}
    for record in records:
        assert expected <= set(vars(record))
        assert record.taskvisor_kind.value in record.getMessage()


# -- log_failures: loud failures without a subscriber --------------------

LOGGER = "trio_taskvisor"


def taskvisor_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """(level, message) of the records the ``trio_taskvisor`` logger wrote."""
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


async def test_a_final_failure_is_logged_once_at_error_with_its_traceback(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Nobody awaits the waiter, no subscriber: the failure is still in the log."""
    caplog.set_level(logging.DEBUG, LOGGER)
    error = ValueError("bad row 7")

    async def import_rows() -> None:
        raise error

    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("import", import_rows))
        await trio.testing.wait_all_tasks_blocked()  # it ran, and failed
    assert taskvisor_records(caplog) == [
        (logging.ERROR, f"task 'import' ({waiter.id}) ended failed: bad row 7")
    ]
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.exc_info is not None
    assert record.exc_info[1] is error
    assert record.taskvisor_name == "import"  # type: ignore[attr-defined]
    assert record.taskvisor_outcome is OutcomeKind.FAILED  # type: ignore[attr-defined]


async def test_a_streak_logs_its_first_failed_attempt_at_warning(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the first failure of a streak, and only when it is retried."""
    caplog.set_level(logging.DEBUG, LOGGER)

    async def flaky() -> None:
        if current_context().attempt < 3:
            raise ConnectionError(f"refused ({current_context().attempt})")

    async with open_supervisor() as sup:
        spec = TaskSpec.restartable("poll", flaky, backoff=BackoffPolicy.constant(1.0))
        waiter = await sup.add(spec)
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert taskvisor_records(caplog) == [
        (
            logging.WARNING,
            f"task 'poll' ({waiter.id}) attempt 1 failed, retrying in 1 s: refused (1)",
        )
    ]


async def test_log_lines_show_durations_as_a_person_reads_them(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every duration of a log line is three digits and a spaced unit, never an exponent
    and under a millisecond in ms: the retry's line ("retrying in 3600 s", not "3.6e+03
    s"), ``LoggingSubscriber``'s ``delay`` and a forced task's exit ("0.197 ms after the
    force", not "0.000197s"), and the demo's event line for that exit."""
    from trio_taskvisor._cli.demo import Board

    caplog.set_level(logging.DEBUG, LOGGER)
    async with open_supervisor() as sup:
        spec = TaskSpec.restartable("poll", failing, backoff=BackoffPolicy.constant(3600.0))
        waiter = await sup.add(spec)
        await trio.sleep(1.0)
        await sup.remove(waiter.id)
    assert taskvisor_records(caplog)[0] == (
        logging.WARNING,
        f"task 'poll' ({waiter.id}) attempt 1 failed, retrying in 3600 s: boom",
    )
    caplog.clear()
    subscriber = LoggingSubscriber(logging.getLogger("tests.logging.durations"))
    board = Board(1.0)
    caplog.set_level(logging.DEBUG, "tests.logging.durations")
    for fields in (
        {"kind": EventKind.BACKOFF_SCHEDULED, "attempt": 1, "delay": 0.2384},
        {"kind": EventKind.FORCED_TASK_EXITED, "duration": 0.000197},
    ):
        event = TaskEvent(1, 0.0, 0.0, task_id=TaskId(7), name="job", **fields)
        await subscriber.on_event(event)
        await board.on_event(event)
    assert [r.getMessage() for r in caplog.records] == [
        "backoff_scheduled 'job' #7 attempt=1 delay=0.238 s",
        "forced_task_exited 'job' #7 0.197 ms after the force",
    ]
    assert board.recent[-1].text == "0.197 ms after the force"


async def test_the_records_name_the_line_that_logs_them(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A record's ``funcName`` and ``pathname`` are the library's line that logs it (as
    ``%(funcName)s`` shows), not the helper every record goes through."""
    caplog.set_level(logging.DEBUG, LOGGER)
    async with open_supervisor() as sup:
        spec = TaskSpec.restartable("poll", failing, max_retries=1)
        await (await sup.add(spec)).wait()
    retry, final = [r for r in caplog.records if r.name == LOGGER]
    assert (retry.funcName, retry.module) == ("_log_retry", "_actor")
    assert (final.funcName, final.module) == ("_failed", "_registry")


class RaisingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        raise RuntimeError("a filter's bug")


@pytest.mark.parametrize("on", ["logger", "handler"])
async def test_a_filter_that_raises_breaks_nothing(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str], on: str
) -> None:
    """The application's logging has a filter that raises, on the ``trio_taskvisor``
    logger or on one of its handlers (logging lets a filter's error through, where it
    reports a handler's): the retries and the failure end as they would, and each lost
    record is reported on stderr as logging reports a handler's error. Before, the
    first retry's record raised it in the actor, and the whole supervisor failed."""
    logger = logging.getLogger(LOGGER)
    handler = ListHandler()
    target: logging.Filterer = logger if on == "logger" else handler
    raising = RaisingFilter()
    target.addFilter(raising)
    logger.addHandler(handler)
    try:
        async with open_supervisor() as sup:
            spec = TaskSpec.restartable("poll", failing, max_retries=1)
            outcome = await (await sup.add(spec)).wait()
    finally:
        logger.removeHandler(handler)
        target.removeFilter(raising)
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.FAILED,
        "retry limit reached after 1 retry: boom",
    )
    err = capsys.readouterr().err
    assert err.count("--- Logging error ---") == 2  # the retry, the final failure
    assert "RuntimeError: a filter's bug" in err
    assert "Message: 'task %r (%s) attempt %d failed, retrying in %s: %s'" in err


async def test_each_new_streak_logs_its_first_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A healthy attempt (or a success) begins a new streak: its first failure is logged."""
    caplog.set_level(logging.DEBUG, LOGGER)
    body = Attempts((0.0, OSError("a")), (10.0, OSError("b")), (0.0, OSError("c")), (0.0, "ok"))
    async with open_supervisor() as sup:
        spec = TaskSpec.restartable(
            "poll", body, backoff=BackoffPolicy.constant(1.0), healthy_after=5.0
        )
        await (await sup.add(spec)).wait()
    warnings = [text for level, text in taskvisor_records(caplog) if level == logging.WARNING]
    assert [text.rpartition(": ")[2] for text in warnings] == ["a", "b"]


async def test_a_failed_only_attempt_logs_no_warning(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A first failed attempt that is also the final one: the ERROR record only."""
    caplog.set_level(logging.DEBUG, LOGGER)
    async with open_supervisor() as sup:
        await (await sup.add(TaskSpec.once("t", failing))).wait()
        fatal = Attempts((0.0, FatalError("no schema", exit_code=2)))
        await (await sup.add(TaskSpec.restartable("fatal", fatal))).wait()
    levels = sorted(taskvisor_records(caplog))
    assert [level for level, _ in levels] == [logging.ERROR, logging.ERROR]
    assert any("ended fatal: no schema" in text for _, text in levels)


async def test_cancelled_forced_and_completed_outcomes_are_not_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Only FAILED, FATAL and PANICKED outcomes are failures to log."""
    caplog.set_level(logging.DEBUG, LOGGER)
    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        await sup.add(TaskSpec.once("done", trio.lowlevel.checkpoint))
        await sup.add(TaskSpec.once("cancelled", trio.sleep_forever))
        await sup.add(TaskSpec.once("quits", Attempts((0.0, TaskCancelled("no work")))))
        forced = await sup.add(TaskSpec.once("forced", deferring, 5.0))
        await trio.testing.wait_all_tasks_blocked()
        await sup.cancel(forced.id)
    assert forced.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert [level for level, _ in taskvisor_records(caplog) if level >= logging.WARNING] == []


async def test_a_panicked_outcome_is_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An internal fault's PANICKED outcome is logged at ERROR (it has no error)."""
    caplog.set_level(logging.DEBUG, LOGGER)
    with pytest.raises(BaseExceptionGroup):  # noqa: PT012
        async with open_supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("t", trio.sleep_forever))
            await trio.testing.wait_all_tasks_blocked()
            panic_actors(sup)
            assert (await waiter.wait()).kind is OutcomeKind.PANICKED
    errors = [text for level, text in taskvisor_records(caplog) if level == logging.ERROR]
    assert errors == [
        f"task 't' ({waiter.id}) ended panicked: the supervisor's runner was cancelled"
    ]


class QuietLogging(LoggingSubscriber):
    """A subclass with a logger of its own."""


@pytest.mark.parametrize(
    "subscriber",
    [
        pytest.param(
            lambda: LoggingSubscriber(logging.getLogger("app.events")), id="its-own-logger"
        ),
        pytest.param(lambda: QuietLogging(logging.getLogger("app.quiet")), id="a-subclass"),
    ],
)
async def test_a_logging_subscriber_replaces_the_builtin_records(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    subscriber: Any,
) -> None:
    """Any LoggingSubscriber, whatever its logger, turns the built-in records off."""
    caplog.set_level(logging.DEBUG)
    async with open_supervisor(subscribers=[subscriber()]) as sup:
        await sup.add(TaskSpec.restartable("t", failing, max_retries=1))
        await trio.testing.wait_all_tasks_blocked()  # it ran, and failed for good
    assert taskvisor_records(caplog) == []
    assert any(
        r.name.startswith("app.") and "task_finished" in r.getMessage() for r in caplog.records
    )


async def test_log_failures_false_turns_the_records_off(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """``SupervisorConfig(log_failures=False)``: no built-in record."""
    caplog.set_level(logging.DEBUG, LOGGER)
    async with open_supervisor(SupervisorConfig(log_failures=False)) as sup:
        await sup.add(TaskSpec.restartable("t", failing, max_retries=1))
        await trio.testing.wait_all_tasks_blocked()  # it ran, and failed for good
    assert taskvisor_records(caplog) == []


async def test_periodic_waits_log_at_debug_and_retries_at_info(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """LoggingSubscriber: BACKOFF_SCHEDULED(SUCCESS) is routine (DEBUG); a retry's is INFO."""
    caplog.set_level(logging.DEBUG, "tests.logging.periodic")
    logger = logging.getLogger("tests.logging.periodic")
    body = Attempts((0.0, "ok"), (0.0, ValueError("blip")), (0.0, "ok"))
    async with open_supervisor(subscribers=[LoggingSubscriber(logger)]) as sup:
        await sup.add(TaskSpec.periodic("tick", 5.0, body, backoff=BackoffPolicy.constant(1.0)))
        await trio.sleep(6.5)
    levels = [
        (r.taskvisor_backoff_source, r.levelno)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.taskvisor_kind is EventKind.BACKOFF_SCHEDULED  # type: ignore[attr-defined]
    ]
    assert levels == [
        (BackoffSource.SUCCESS, logging.DEBUG),
        (BackoffSource.FAILURE, logging.INFO),
        (BackoffSource.SUCCESS, logging.DEBUG),
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {
                "kind": EventKind.CONTROLLER_REJECTED,
                "outcome": OutcomeKind.REJECTED,
                "rejection": RejectionKind.SUPERSEDED,
                "reason": "superseded by a newer submission",
            },
            "controller_rejected 'job' #7 - superseded by a newer submission",
            id="superseded",
        ),
        pytest.param(
            {
                "kind": EventKind.TASK_FINISHED,
                "outcome": OutcomeKind.FORCE_ABORTED,
                "reason": "did not stop within the grace window",
            },
            "task_finished 'job' #7 force_aborted - did not stop within the grace window",
            id="force-aborted",
        ),
        pytest.param(
            {
                "kind": EventKind.CONTROLLER_REJECTED,
                "outcome": OutcomeKind.REJECTED,
                "rejection": RejectionKind.SLOT_BUSY,
                "reason": "slot is busy",
            },
            "controller_rejected 'job' #7 slot_busy - slot is busy",
            id="slot-busy",
        ),
        pytest.param(
            {"kind": EventKind.TASK_FINISHED, "outcome": OutcomeKind.FAILED, "reason": "boom"},
            "task_finished 'job' #7 failed - boom",
            id="failed",
        ),
    ],
)
async def test_logging_subscriber_messages_never_repeat_a_label_in_the_reason(
    caplog: pytest.LogCaptureFixture, fields: dict[str, Any], message: str
) -> None:
    """A kind the reason already says is left out of the message (no "superseded -
    superseded ..."); labels the reason does not repeat stay."""
    caplog.set_level(logging.DEBUG, "tests.logging.labels")
    subscriber = LoggingSubscriber(logging.getLogger("tests.logging.labels"))
    event = TaskEvent(1, 0.0, 0.0, task_id=TaskId(7), name="job", **fields)
    await subscriber.on_event(event)
    assert [r.getMessage() for r in caplog.records] == [message]


async def test_a_forced_task_reads_force_aborted_wherever_it_is_shown(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    """A task forced at the end of the grace is ``force_aborted``, the outcome's kind, in
    the log line, the demo's recent events and its summary, as every outcome is named by
    its kind; the reason says why. Before, the reason began "force-aborted: ", so the
    line and the event read "force-aborted" and the counters "force_aborted"."""
    from trio_taskvisor._cli.demo import Board, summary

    caplog.set_level(logging.DEBUG, "tests.logging.forced")
    board = Board(1.0)
    board.stop_deadline = -math.inf  # the grace ran out: no second Ctrl+C forced it
    subscribers = [board, LoggingSubscriber(logging.getLogger("tests.logging.forced"))]
    with pytest.raises(GraceExceededError) as info:  # noqa: PT012
        async with open_supervisor(SupervisorConfig(grace=1.0), subscribers=subscribers) as sup:
            board.sup = sup
            waiter = await sup.add(TaskSpec.once("audit-writer", deferring, 10.0))
            board.waiters.append(waiter)
            await trio.sleep(0.1)
    board.grace_error = info.value
    why = "did not stop within the grace window"
    assert waiter.outcome_nowait().reason == why
    messages = [r.getMessage() for r in caplog.records]
    assert f"task_finished 'audit-writer' {waiter.id} force_aborted - {why}" in messages
    assert f"force_aborted: {why}" in [line.text for line in board.recent]
    rows = dict(summary(board))
    assert rows["outcomes"] == "1 task: 1 force_aborted"
    assert "audit-writer ended force_aborted after the 1.5 s grace" in rows["shutdown"]
    shown = [*messages, *(line.text for line in board.recent), *rows.values()]
    assert not [text for text in shown if "force-aborted" in text]


# -- LoggingSubscriber levels -------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"kind": EventKind.CONTROLLER_LEASE_LOST}, id="controller-lease-lost"),
        pytest.param(
            {"kind": EventKind.TASK_FINISHED, "outcome": OutcomeKind.LEASE_LOST},
            id="task-finished-lease-lost",
        ),
    ],
)
async def test_a_lost_lease_logs_at_error(
    caplog: pytest.LogCaptureFixture, fields: dict[str, Any]
) -> None:
    """A lost lease (its owner forced at once) is a loss: ERROR, as ``force_aborted``.
    Before, INFO: a logger at WARNING never showed it."""
    caplog.set_level(logging.DEBUG, "tests.logging.lease")
    subscriber = LoggingSubscriber(logging.getLogger("tests.logging.lease"))
    reason = "lease expired: no renewal confirmed within 0.8 s of its sending"
    await subscriber.on_event(
        TaskEvent(1, 0.0, 0.0, task_id=TaskId(7), name="job", reason=reason, **fields)
    )
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def documented_levels() -> dict[tuple[str, str | None], int]:
    """The Levels table of the logging how-to: (kind, outcome or backoff source) -> level.

    A clause "`task_finished` with outcome `failed` or `fatal`" names a kind and values of
    the field that decides its level; any other clause names kinds."""
    text = (ROOT / "docs" / "howto-logging.md").read_text(encoding="utf-8")
    table = text.partition("## Levels\n")[2].partition("\n\n")[0]
    levels: dict[tuple[str, str | None], int] = {}
    for row in table.splitlines()[2:]:
        level, events = row.strip("|").split("|")
        for clause in events.split(";"):
            names = re.findall(r"`(\w+)`", clause)
            keys = [(names[0], v) for v in names[1:]] if " with " in clause else names
            for key in keys:
                pair = key if isinstance(key, tuple) else (key, None)
                assert pair not in levels, f"{pair} is listed twice"
                levels[pair] = logging.getLevelNamesMapping()[level.strip().strip("`")]
    return levels


async def test_the_levels_table_lists_every_kind_at_its_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every event kind (every outcome of ``task_finished``, both sources of
    ``backoff_scheduled``) is in the how-to's Levels table, at the level it logs at."""
    caplog.set_level(logging.DEBUG, "tests.logging.table")
    subscriber = LoggingSubscriber(logging.getLogger("tests.logging.table"))
    variants: dict[EventKind, list[tuple[str | None, dict[str, Any]]]] = {
        EventKind.TASK_FINISHED: [(o.value, {"outcome": o}) for o in OutcomeKind],
        EventKind.BACKOFF_SCHEDULED: [(s.value, {"backoff_source": s}) for s in BackoffSource],
    }
    logged: dict[tuple[str, str | None], int] = {}
    for kind in EventKind:
        for value, fields in variants.get(kind, [(None, {})]):
            caplog.clear()
            await subscriber.on_event(TaskEvent(1, 0.0, 0.0, kind, name="job", **fields))
            [record] = caplog.records
            logged[kind.value, value] = record.levelno
    assert documented_levels() == logged


async def test_an_overflow_record_says_how_many_events_were_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``subscriber_overflow`` names the count in its message, as the how-to says. Before,
    only its ``taskvisor_dropped`` field had it."""
    caplog.set_level(logging.DEBUG, "tests.logging.overflow")
    subscriber = LoggingSubscriber(logging.getLogger("tests.logging.overflow"))
    event = TaskEvent(
        1, 0.0, 0.0, EventKind.SUBSCRIBER_OVERFLOW, name="LoggingSubscriber", dropped=242
    )
    await subscriber.on_event(event)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "subscriber_overflow 'LoggingSubscriber' dropped=242")
    ]


async def test_the_howtos_json_formatter_formats_the_librarys_own_records(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The JSON formatter of the logging how-to, as written there, formats the records
    the library writes without an event (a critical task's "shutting down"), which have
    no ``taskvisor_time``: their timestamp is the record's. Before, ``KeyError('time')``
    and the record was lost."""
    [block] = [b for b in extract_blocks(HOWTO) if "class JsonFormatter" in b.code]
    namespace: dict[str, Any] = {"logging": logging}
    exec(block.code, namespace)
    formatter: logging.Formatter = namespace["JsonFormatter"]()
    caplog.set_level(logging.DEBUG, LOGGER)

    async def migrate() -> None:
        raise ValueError("schema 7 unsupported")

    async def critical_failure() -> None:
        async with open_supervisor() as sup:
            await sup.add(TaskSpec.once("migrate", migrate, critical=True))
            await trio.sleep_forever()

    with pytest.raises(CriticalTaskError):
        await critical_failure()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("critical task")]
    document = json.loads(formatter.format(record))
    assert document["level"] == "ERROR"
    assert (document["name"], document["outcome"]) == ("migrate", "failed")
    assert "time" not in document
    stamp = datetime.datetime.fromisoformat(document["timestamp"])
    assert stamp.timestamp() == pytest.approx(record.created, abs=0.001)

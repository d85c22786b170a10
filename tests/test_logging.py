"""Structured logging: ``LoggingSubscriber`` event fields reach formatters as fields."""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

import attrs
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    LoggingSubscriber,
    TaskEvent,
    TaskFailure,
    TaskSpec,
    current_context,
    open_supervisor,
)

PREFIX = "taskvisor_"


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

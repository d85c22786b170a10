"""The library's exceptions survive ``pickle`` and ``copy`` (multiprocessing, a worker
process's result, an error reporter that copies): the same type, message and fields."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from trio_taskvisor import (
    ConfigError,
    CriticalTaskError,
    DeadlockError,
    FatalError,
    GraceExceededError,
    LeaseLostError,
    NoControllerError,
    OutcomeError,
    OutcomeKind,
    ResourceLimitError,
    SlotStoreUnavailableError,
    SupervisorClosedError,
    TaskCancelled,
    TaskFailure,
    TaskId,
    TaskNameInUseError,
    TaskOutcome,
)

FAILED = TaskOutcome(OutcomeKind.FAILED, error=ValueError("boom"), reason="boom")

ERRORS: list[Callable[[], BaseException]] = [
    lambda: ConfigError("bad"),
    lambda: TaskNameInUseError("worker"),
    lambda: ResourceLimitError("max_registered_tasks", 10),
    lambda: NoControllerError("cancel_slot"),
    lambda: DeadlockError("a waits for b"),
    lambda: SlotStoreUnavailableError("silent"),
    lambda: LeaseLostError("limit lease lost: p"),
    lambda: CriticalTaskError(FAILED, TaskId(3), "worker"),
    lambda: GraceExceededError(2.5, ("a", "b")),
    lambda: OutcomeError(FAILED),
    lambda: FatalError("stop", exit_code=3),
    lambda: TaskFailure("retry", exit_code=75),
    lambda: TaskCancelled("done"),
    lambda: TaskCancelled(),
    lambda: SupervisorClosedError(),
]


def fields(error: BaseException) -> dict[str, Any]:
    """What a user reads of ``error``: its type, message, notes and public fields (the
    outcome's error by its type and message, as exceptions do not compare equal)."""
    public = {k: v for k, v in vars(error).items() if not k.startswith("_")}
    outcome = public.pop("outcome", None)
    if outcome is not None:
        public["outcome"] = (outcome.kind, outcome.reason, repr(outcome.error))
    return {"type": type(error), "str": str(error), "args": error.args, **public}


@pytest.mark.parametrize("build", ERRORS)
@pytest.mark.parametrize("how", ["pickle", "copy"])
def test_an_exception_survives_pickle_and_copy(
    build: Callable[[], BaseException], how: str
) -> None:
    error = build()
    error.add_note("a note")
    again = pickle.loads(pickle.dumps(error)) if how == "pickle" else copy.copy(error)
    assert fields(again) == fields(error)
    assert again.__notes__ == ["a note"]

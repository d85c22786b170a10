"""The public surface: ``__all__``, module metadata, ``py.typed`` and the error tree."""

from __future__ import annotations

import importlib.resources
import inspect
import math
from collections.abc import Callable

import pytest
import trio

import trio_taskvisor
import trio_taskvisor.testing
from trio_taskvisor import (
    BackoffPolicy,
    ConfigError,
    CriticalTaskError,
    DeadlockError,
    FatalError,
    GraceExceededError,
    NoControllerError,
    OutcomeError,
    ResourceLimitError,
    SupervisorClosedError,
    SupervisorConfig,
    TaskCancelled,
    TaskFailure,
    TaskNameInUseError,
    TaskSpec,
)

from helpers import nothing

# Every public name the public contract defines, except the keyed controller's types below.
CORE_NAMES = {
    # entry points and the supervisor
    "open_supervisor",
    "run",
    "Supervisor",
    "SupervisorConfig",
    "SupervisorStatistics",
    "ControllerConfig",
    # defining work
    "TaskSpec",
    "TaskDefaults",
    "INHERIT",
    "RestartPolicy",
    "RestartLimit",  # section 12
    "BackoffPolicy",
    "Jitter",
    "TaskContext",
    "current_context",
    # identity, outcomes and observation
    "TaskId",
    "TaskWaiter",
    "TaskOutcome",
    "OutcomeKind",
    "RejectionKind",
    "Placement",  # section 11
    "TaskInfo",
    "TaskState",
    # events
    "TaskEvent",
    "EventKind",
    "BackoffSource",
    "LoggingSubscriber",
    # errors
    "ConfigError",
    "TaskNameInUseError",
    "ResourceLimitError",
    "NoControllerError",
    "DeadlockError",
    "GraceExceededError",
    "OutcomeError",
    "FatalError",
    "TaskFailure",
    "TaskCancelled",
    "SupervisorClosedError",
}
# The keyed controller's types.
CONTROLLER_NAMES = {
    "ControllerSpec",
    "AdmissionPolicy",
    "SlotStatus",
    "SlotView",
    "ControllerSnapshot",
    "PreparedSubmission",
}
# Cluster slots.
CLUSTER_NAMES = {"ClusterSlotInfo", "SlotStoreUnavailableError"}
# The service path's second round.
SERVICE_NAMES = {"CriticalTaskError"}
# Limits: concurrency and rate pools.
LIMIT_NAMES = {
    "ConcurrencyLimit",
    "RateLimit",
    "LimitKey",
    "LimitView",
    "ClusterLimitInfo",
    "LeaseLostError",
}
# Not part of the contract's names, exported on purpose: the Protocol that types ``subscribers=``.
EXTRA_NAMES = {"Subscriber"}


def test_all_is_sorted() -> None:
    """trio_taskvisor.__all__ is in sorted order, without repeats."""
    assert trio_taskvisor.__all__ == sorted(set(trio_taskvisor.__all__))


def test_all_has_every_design_name() -> None:
    """Every public name of the public contract, the controller types included, is in __all__."""
    every = CORE_NAMES | CONTROLLER_NAMES | CLUSTER_NAMES | SERVICE_NAMES | LIMIT_NAMES
    assert every - set(trio_taskvisor.__all__) == set()


def test_all_has_only_design_names() -> None:
    """__all__ exports nothing beyond the public contract's names and the Subscriber protocol."""
    allowed = (
        CORE_NAMES | CONTROLLER_NAMES | CLUSTER_NAMES | SERVICE_NAMES | LIMIT_NAMES | EXTRA_NAMES
    )
    assert set(trio_taskvisor.__all__) - allowed == set()


def test_every_name_in_all_exists() -> None:
    """Every name in __all__ is an attribute of the package."""
    missing = [n for n in trio_taskvisor.__all__ if not hasattr(trio_taskvisor, n)]
    assert missing == []


def test_exports_present_themselves_as_trio_taskvisor() -> None:
    """Every export that has a ``__module__`` reports ``trio_taskvisor``."""
    modules = {
        name: getattr(getattr(trio_taskvisor, name), "__module__", "trio_taskvisor")
        for name in trio_taskvisor.__all__
    }
    assert {n: m for n, m in modules.items() if m != "trio_taskvisor"} == {}


def test_testing_module_exports_event_recorder() -> None:
    """trio_taskvisor.testing exports EventRecorder."""
    assert trio_taskvisor.testing.__all__ == ["EventRecorder"]
    assert inspect.isclass(trio_taskvisor.testing.EventRecorder)


def test_version_comes_from_the_package_metadata() -> None:
    """``__version__`` is the installed distribution's, written only in pyproject.toml."""
    import importlib.metadata

    assert trio_taskvisor.__version__ == importlib.metadata.version("trio_taskvisor")


def test_unknown_module_attribute_raises_attribute_error() -> None:
    """Looking ``__version__`` up lazily leaves other missing names an AttributeError."""
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        trio_taskvisor.nope  # type: ignore[attr-defined]  # noqa: B018


def test_package_ships_py_typed() -> None:
    """The package carries the PEP 561 ``py.typed`` marker."""
    assert importlib.resources.files("trio_taskvisor").joinpath("py.typed").is_file()


# -- the error tree ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "base"),
    [
        (ConfigError, ValueError),
        (TaskNameInUseError, ValueError),
        (ResourceLimitError, RuntimeError),
        (NoControllerError, RuntimeError),
        (DeadlockError, RuntimeError),
        (CriticalTaskError, RuntimeError),
        (GraceExceededError, Exception),
        (OutcomeError, Exception),
        (FatalError, Exception),
        (TaskFailure, Exception),
        (TaskCancelled, Exception),
        (SupervisorClosedError, trio.ClosedResourceError),
    ],
)
def test_error_subclasses_its_design_base(error: type[Exception], base: type[Exception]) -> None:
    """Each error subclasses the documented base."""
    assert issubclass(error, base)


@pytest.mark.parametrize(
    "error",
    [
        GraceExceededError,
        OutcomeError,
        FatalError,
        TaskFailure,
        TaskCancelled,
    ],
)
def test_error_is_not_a_value_or_runtime_error(error: type[Exception]) -> None:
    """Errors documented directly off Exception are not ValueError or RuntimeError."""
    assert not issubclass(error, ValueError | RuntimeError)


def test_errors_do_not_subclass_each_other() -> None:
    """No error of the tree is a subclass of another one (the tree is flat)."""
    errors = [
        ConfigError,
        TaskNameInUseError,
        ResourceLimitError,
        NoControllerError,
        DeadlockError,
        CriticalTaskError,
        GraceExceededError,
        OutcomeError,
        FatalError,
        TaskFailure,
        TaskCancelled,
        SupervisorClosedError,
    ]
    pairs = [(a, b) for a in errors for b in errors if a is not b and issubclass(a, b)]
    assert pairs == []


def test_task_name_in_use_error_carries_the_name() -> None:
    """TaskNameInUseError(name) has ``.name``."""
    assert TaskNameInUseError("sync-42").name == "sync-42"


def test_resource_limit_error_carries_resource_and_limit() -> None:
    """ResourceLimitError(resource, limit) has ``.resource`` and ``.limit``."""
    error = ResourceLimitError("max_registered_tasks", 16)
    assert (error.resource, error.limit) == ("max_registered_tasks", 16)


def test_grace_exceeded_error_carries_grace_and_stuck() -> None:
    """GraceExceededError(grace, stuck) has ``.grace`` and a tuple ``.stuck``."""
    error = GraceExceededError(2.5, ("a", "b"))
    assert (error.grace, error.stuck) == (2.5, ("a", "b"))


@pytest.mark.parametrize("error_type", [FatalError, TaskFailure])
def test_task_raised_errors_carry_an_exit_code(error_type: type[FatalError | TaskFailure]) -> None:
    """FatalError and TaskFailure take ``reason`` and a keyword-only ``exit_code=None``."""
    assert error_type("bad", exit_code=3).exit_code == 3
    assert error_type("bad").exit_code is None
    assert str(error_type("bad")) == "bad"
    with pytest.raises(TypeError):
        error_type("bad", 3)  # type: ignore[call-arg]


def test_task_cancelled_reason_is_optional() -> None:
    """TaskCancelled takes an optional reason."""
    assert TaskCancelled().reason is None
    assert TaskCancelled("not needed").reason == "not needed"


@pytest.mark.parametrize(
    ("make", "parts"),
    [
        (lambda: SupervisorConfig(grace=-1.5), ("grace", "-1.5")),
        (lambda: SupervisorConfig(grace=math.nan), ("grace", "nan")),
        (lambda: SupervisorConfig(command_capacity=0), ("command_capacity", "0")),
        (lambda: SupervisorConfig(bus_capacity=-3), ("bus_capacity", "-3")),
        (lambda: SupervisorConfig(max_registered_tasks=0), ("max_registered_tasks", "0")),
        (lambda: BackoffPolicy(factor=0.5), ("factor", "0.5")),
        (lambda: TaskNameInUseError("sync-42"), ("sync-42",)),
        (lambda: ResourceLimitError("max_registered_tasks", 16), ("max_registered_tasks", "16")),
        (lambda: GraceExceededError(2.5, ("stuck-task",)), ("2.5", "stuck-task")),
    ],
    ids=[
        "grace",
        "grace-nan",
        "command_capacity",
        "bus_capacity",
        "max_registered_tasks",
        "factor",
        "name-in-use",
        "resource-limit",
        "grace-exceeded",
    ],
)
def test_error_messages_are_lower_case_and_name_the_value(
    make: Callable[[], object], parts: tuple[str, ...]
) -> None:
    """Error messages start in lower case and name the offending value."""
    try:
        error = make()
    except Exception as exc:
        error = exc
    message = str(error)
    assert not message[0].isupper(), message
    assert all(part in message for part in parts), message


def test_out_of_range_values_raise_config_error() -> None:
    """Out-of-range values raise ConfigError, which callers can catch as ValueError."""
    with pytest.raises(ConfigError):
        SupervisorConfig(grace=-1.0)
    with pytest.raises(ValueError, match="max_retries"):
        TaskSpec.restartable("t", nothing, max_retries=0)

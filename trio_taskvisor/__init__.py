"""trio_taskvisor: a task supervisor for trio.

Supervised tasks with restart policies, backoff and jitter, per-attempt timeouts, a
two-phase stop, one shared graceful shutdown, a reliable outcome for every task, and
typed lifecycle events. See ``open_supervisor``.
"""

import contextlib
from typing import TYPE_CHECKING

from ._bus import Subscriber as Subscriber
from ._config import ControllerConfig as ControllerConfig
from ._config import SupervisorConfig as SupervisorConfig
from ._config import TaskDefaults as TaskDefaults
from ._context import TaskContext as TaskContext
from ._context import current_context as current_context
from ._controller import ControllerSnapshot as ControllerSnapshot
from ._controller import SlotView as SlotView
from ._events import BackoffSource as BackoffSource
from ._events import EventKind as EventKind
from ._events import TaskEvent as TaskEvent
from ._exceptions import ConfigError as ConfigError
from ._exceptions import CriticalTaskError as CriticalTaskError
from ._exceptions import DeadlockError as DeadlockError
from ._exceptions import FatalError as FatalError
from ._exceptions import GraceExceededError as GraceExceededError
from ._exceptions import LeaseLostError as LeaseLostError
from ._exceptions import NoControllerError as NoControllerError
from ._exceptions import OutcomeError as OutcomeError
from ._exceptions import ResourceLimitError as ResourceLimitError
from ._exceptions import SlotStoreUnavailableError as SlotStoreUnavailableError
from ._exceptions import SupervisorClosedError as SupervisorClosedError
from ._exceptions import TaskCancelled as TaskCancelled
from ._exceptions import TaskFailure as TaskFailure
from ._exceptions import TaskNameInUseError as TaskNameInUseError
from ._limits import ClusterLimitInfo as ClusterLimitInfo
from ._limits import ConcurrencyLimit as ConcurrencyLimit
from ._limits import LimitKey as LimitKey
from ._limits import LimitView as LimitView
from ._limits import RateLimit as RateLimit
from ._logging import LoggingSubscriber as LoggingSubscriber
from ._outcome import OutcomeKind as OutcomeKind
from ._outcome import Placement as Placement
from ._outcome import RejectionKind as RejectionKind
from ._outcome import TaskId as TaskId
from ._outcome import TaskOutcome as TaskOutcome
from ._policies import BackoffPolicy as BackoffPolicy
from ._policies import Jitter as Jitter
from ._policies import RestartLimit as RestartLimit
from ._policies import RestartPolicy as RestartPolicy
from ._record import TaskState as TaskState
from ._registry import TaskInfo as TaskInfo
from ._slots import SlotStatus as SlotStatus
from ._slotstore import ClusterSlotInfo as ClusterSlotInfo
from ._spec import INHERIT as INHERIT
from ._spec import AdmissionPolicy as AdmissionPolicy
from ._spec import ControllerSpec as ControllerSpec
from ._spec import TaskSpec as TaskSpec
from ._supervisor import PreparedSubmission as PreparedSubmission
from ._supervisor import Supervisor as Supervisor
from ._supervisor import SupervisorStatistics as SupervisorStatistics
from ._supervisor import open_supervisor as open_supervisor
from ._supervisor import run as run
from ._waiter import TaskWaiter as TaskWaiter

__all__ = [
    "AdmissionPolicy",
    "BackoffPolicy",
    "BackoffSource",
    "ClusterLimitInfo",
    "ClusterSlotInfo",
    "ConcurrencyLimit",
    "ConfigError",
    "ControllerConfig",
    "ControllerSnapshot",
    "ControllerSpec",
    "CriticalTaskError",
    "DeadlockError",
    "EventKind",
    "FatalError",
    "GraceExceededError",
    "INHERIT",
    "Jitter",
    "LeaseLostError",
    "LimitKey",
    "LimitView",
    "LoggingSubscriber",
    "NoControllerError",
    "OutcomeError",
    "OutcomeKind",
    "Placement",
    "PreparedSubmission",
    "RateLimit",
    "RejectionKind",
    "ResourceLimitError",
    "RestartLimit",
    "RestartPolicy",
    "SlotStatus",
    "SlotStoreUnavailableError",
    "SlotView",
    "Subscriber",
    "Supervisor",
    "SupervisorClosedError",
    "SupervisorConfig",
    "SupervisorStatistics",
    "TaskCancelled",
    "TaskContext",
    "TaskDefaults",
    "TaskEvent",
    "TaskFailure",
    "TaskId",
    "TaskInfo",
    "TaskNameInUseError",
    "TaskOutcome",
    "TaskSpec",
    "TaskState",
    "TaskWaiter",
    "current_context",
    "open_supervisor",
    "run",
]


if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        # ``__version__`` from the installed distribution's metadata, so the version is
        # written in one place (pyproject.toml). Looked up on first use: importing
        # importlib.metadata at import time costs every process that never asks (a
        # larger heap for the collector to walk: 6% of benchmark row 1a's
        # instructions). Hidden from type checkers, which would otherwise accept any
        # name of the module.
        if name != "__version__":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("trio_taskvisor")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"


def _fixup_module_metadata() -> None:
    # Present every export as trio_taskvisor.X (reprs, docs, pickling of errors).
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("trio_taskvisor."):
            with contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = __name__


_fixup_module_metadata()
del _fixup_module_metadata

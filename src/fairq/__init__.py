"""fairq: a run queue on Redis/Valkey whose dequeue order stays fair across tenants.

The public API is importable from the package (lazily, so ``fairq --help`` stays fast)::

    from fairq import Fairq, RetryPolicy, Worker, FairqError
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairq.app import Fairq, Schedule
    from fairq.config import RetryPolicy, RunQueueConfig, VirtualTimeOptions
    from fairq.errors import (
        ConfigurationError,
        ConfigurationMismatchError,
        ConnectionLostError,
        EmbeddedServerError,
        FairqError,
        InvalidLimitError,
        InvalidNameError,
        PayloadError,
        PermanentError,
        QueueSizeLimitExceededError,
        RunFailedError,
        RunNotFoundError,
        ScriptProtocolError,
        ServerUnavailableError,
        TaskTimeoutError,
    )
    from fairq.keys import Environment
    from fairq.models import CancelOutcome, EnqueueStatus
    from fairq.outcomes import RunInfo, RunStatus
    from fairq.run_context import RunContext, current_run
    from fairq.tasks import RunHandle, Task, TriggerItem
    from fairq.worker import Worker

#: Public name -> module that defines it.
_EXPORTS = {
    "Fairq": "fairq.app",
    "Schedule": "fairq.app",
    "RetryPolicy": "fairq.config",
    "RunQueueConfig": "fairq.config",
    "VirtualTimeOptions": "fairq.config",
    "Environment": "fairq.keys",
    "CancelOutcome": "fairq.models",
    "EnqueueStatus": "fairq.models",
    "RunInfo": "fairq.outcomes",
    "RunStatus": "fairq.outcomes",
    "RunHandle": "fairq.tasks",
    "Task": "fairq.tasks",
    "TriggerItem": "fairq.tasks",
    "RunContext": "fairq.run_context",
    "Worker": "fairq.worker",
    "current_run": "fairq.run_context",
    "ConfigurationError": "fairq.errors",
    "ConfigurationMismatchError": "fairq.errors",
    "ConnectionLostError": "fairq.errors",
    "EmbeddedServerError": "fairq.errors",
    "FairqError": "fairq.errors",
    "InvalidLimitError": "fairq.errors",
    "InvalidNameError": "fairq.errors",
    "PayloadError": "fairq.errors",
    "PermanentError": "fairq.errors",
    "QueueSizeLimitExceededError": "fairq.errors",
    "RunFailedError": "fairq.errors",
    "RunNotFoundError": "fairq.errors",
    "ScriptProtocolError": "fairq.errors",
    "ServerUnavailableError": "fairq.errors",
    "TaskTimeoutError": "fairq.errors",
}

__all__ = [
    "CancelOutcome",
    "ConfigurationError",
    "ConfigurationMismatchError",
    "ConnectionLostError",
    "EmbeddedServerError",
    "EnqueueStatus",
    "Environment",
    "Fairq",
    "FairqError",
    "InvalidLimitError",
    "InvalidNameError",
    "PayloadError",
    "PermanentError",
    "QueueSizeLimitExceededError",
    "RetryPolicy",
    "RunContext",
    "RunFailedError",
    "RunHandle",
    "RunInfo",
    "RunNotFoundError",
    "RunQueueConfig",
    "RunStatus",
    "Schedule",
    "ScriptProtocolError",
    "ServerUnavailableError",
    "Task",
    "TaskTimeoutError",
    "TriggerItem",
    "VirtualTimeOptions",
    "Worker",
    "current_run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fairq' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

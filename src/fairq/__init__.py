"""fairq: a run queue on Redis/Valkey whose dequeue order stays fair across tenants.

The task API is importable from the package (lazily, so ``fairq --help`` stays fast)::

    from fairq import Fairq, RetryPolicy, Worker
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairq.app import Fairq, PermanentError, RunStatus, TriggerItem
    from fairq.config import RetryPolicy, RunQueueConfig
    from fairq.worker import Worker, current_run

#: Public name -> module that defines it.
_EXPORTS = {
    "Fairq": "fairq.app",
    "PermanentError": "fairq.app",
    "RunStatus": "fairq.app",
    "TriggerItem": "fairq.app",
    "RetryPolicy": "fairq.config",
    "RunQueueConfig": "fairq.config",
    "Worker": "fairq.worker",
    "current_run": "fairq.worker",
}

__all__ = [
    "Fairq",
    "PermanentError",
    "RetryPolicy",
    "RunQueueConfig",
    "RunStatus",
    "TriggerItem",
    "Worker",
    "current_run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fairq' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""The run a task is executing: :func:`current_run` and :class:`RunContext`.

Set by whoever runs the task (a worker, or eager mode) in the task's context; read by the
task. Progress reports go to a mapping the runner sends on (a worker coalesces them into
its next heartbeat).
"""

from __future__ import annotations

import contextvars
from collections.abc import MutableMapping

from fairq.errors import ConfigurationError
from fairq.models import Delivery


class RunContext:
    """The run a task is executing (see :func:`current_run`)."""

    def __init__(
        self, delivery: Delivery, progress: MutableMapping[str, tuple[float, str]]
    ) -> None:
        self.run_id = delivery.run_id
        self.queue = delivery.queue
        self.concurrency_key = delivery.concurrency_key
        self.tenant = delivery.tenant
        self.attempt = delivery.attempt
        self.lease_token = delivery.lease_token
        # set once, by the worker's event loop; read from any thread (a plain task's)
        self._cancelled = False
        self._progress = progress
        self._delivery = delivery

    @property
    def cancelled(self) -> bool:
        """Whether someone asked to cancel this run (plain tasks should check it)."""
        return self._cancelled

    def _mark_cancelled(self) -> None:
        """The worker heard a cancel request for this run."""
        self._cancelled = True

    def progress(self, fraction: float, message: str = "") -> None:
        """Report progress (0..1 and a note): kept with the run, sent with the next
        heartbeat (coalesced: no round trip per call). Thread-safe."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ConfigurationError("progress must be a number in 0..1")
        value = min(1.0, max(0.0, float(fraction)))
        self._progress[self.run_id] = (value, str(message)[:1000])


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "fairq_current_run", default=None
)


def current_run() -> RunContext | None:
    """The run the calling task is executing (None outside a task); works in plain tasks."""
    return _current.get()


__all__ = ["RunContext", "current_run"]

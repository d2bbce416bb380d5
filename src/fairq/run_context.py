"""The run a task is executing: :func:`current_run` and :class:`RunContext`.

Set by whoever runs the task (a worker, or eager mode) in the task's context; read by the
task. Progress reports go to a mapping the runner sends on (a worker coalesces them into
its next heartbeat).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import MutableMapping
from typing import Final

from fairq.errors import ConfigurationError, short
from fairq.models import Delivery

#: The longest progress note kept (characters).
MAX_PROGRESS_CHARS: Final = 1000


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
        heartbeat (coalesced: no round trip per call). Thread-safe.

        A fraction outside 0..1 is clamped; a note longer than
        :data:`MAX_PROGRESS_CHARS` characters is cut.

        Raises:
            ConfigurationError: the fraction is not a number (or is NaN), or the note is
                not a string of valid Unicode (a lone surrogate, as Python gives for a
                file name that is not UTF-8); nothing is recorded.
        """
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or math.isnan(fraction)
        ):
            raise ConfigurationError("progress must be a number in 0..1")
        if not isinstance(message, str):
            raise ConfigurationError(f"a progress note must be a string, got {short(message)}")
        note = message[:MAX_PROGRESS_CHARS]
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(
                "a progress note must be valid Unicode (it holds a lone surrogate: "
                "escape undecodable text, e.g. with os.fsencode(name).decode(errors='replace'))"
            ) from None
        self._progress[self.run_id] = (min(1.0, max(0.0, float(fraction))), note)


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "fairq_current_run", default=None
)


def current_run() -> RunContext | None:
    """The run the calling task is executing (None outside a task); works in plain tasks."""
    return _current.get()


__all__ = ["RunContext", "current_run"]

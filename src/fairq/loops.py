"""Background loops that outlive a bad value.

A worker runs several loops beside its runs (fetching, finishing, heartbeats, schedules,
the wake-up and cancel listener). Each step of such a loop that fails with an error
nobody expected (not a lost connection, which has its own retry) goes to a
:class:`LoopGuard`: it logs the error with its traceback, counts it, and sleeps a
backoff that doubles from :data:`MIN_BACKOFF_S` up to :data:`MAX_BACKOFF_S` before the
loop tries again; a step that works resets the backoff. The loop itself never ends
from one bad value, so one malformed progress note, schedule or message cannot stop a
worker's heartbeats for every run it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

#: Backoff bounds after an unexpected error in a loop step (s).
MIN_BACKOFF_S: Final = 0.05
MAX_BACKOFF_S: Final = 2.0


class LoopGuard:
    """Keeps one named loop going after unexpected errors (see the module docstring).

    Args:
        name: the loop, for the log (``heartbeat``, ``schedules``…).
        logger: where errors are logged.
        on_error: called once per error (a worker counts them in its stats).
    """

    def __init__(
        self, name: str, logger: logging.Logger, on_error: Callable[[], None] | None = None
    ) -> None:
        self.name = name
        self.errors = 0
        self._log = logger
        self._on_error = on_error
        self._delay = MIN_BACKOFF_S

    def succeeded(self) -> None:
        """A step worked: the next error waits the shortest backoff again."""
        self._delay = MIN_BACKOFF_S

    async def failed(self, exc: BaseException) -> None:
        """Log and count ``exc``, then sleep the backoff (which doubles, up to the bound)."""
        self.errors += 1
        if self._on_error is not None:
            self._on_error()
        delay = self._delay
        self._log.error(
            "%s: unexpected %s (%s); the loop goes on in %.2fs",
            self.name, type(exc).__name__, exc, delay, exc_info=exc,
        )  # fmt: skip
        self._delay = min(delay * 2, MAX_BACKOFF_S)
        await asyncio.sleep(delay)


__all__ = ["MAX_BACKOFF_S", "MIN_BACKOFF_S", "LoopGuard"]

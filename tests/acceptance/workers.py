"""A worker running on the test's event loop for the length of an ``async with`` block."""

from __future__ import annotations

import asyncio
from typing import Any

from fairq.app import Fairq
from fairq.worker import Worker


class RunningWorker:
    """``async with RunningWorker(app, **worker_options) as worker``: the worker runs until
    the block ends, then stops gracefully (``force=True``: returns its runs at once)."""

    def __init__(self, app: Fairq, *, force: bool = False, **options: Any) -> None:
        self.worker = Worker(app, **options)
        self.force = force
        self.task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> Worker:
        self.task = asyncio.create_task(self.worker.run())
        return self.worker

    async def __aexit__(self, *exc: object) -> None:
        self.worker.stop(force=True) if self.force else self.worker.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)


def quick_worker(app: Fairq, **options: Any) -> RunningWorker:
    """A worker that looks for work every 0.2 s and returns its runs at once when the
    block ends (the cancellation and timeout tests)."""
    options.setdefault("idle_timeout", 0.2)
    return RunningWorker(app, force=True, **options)

"""The blocking facade: runs an app's coroutines on a private event-loop thread.

One daemon thread per app, started on first use, with its own connection. Triggers
sent from several threads at once land on that loop, where the calls made while one is
in flight for their queue are sent together (one script call per queue).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from fairq.errors import FairqError

if TYPE_CHECKING:
    from fairq.app import Fairq
    from fairq.outcomes import RunInfo
    from fairq.tasks import RunHandle, Task, TriggerItem

T = TypeVar("T")
R = TypeVar("R")


class SyncFacade:
    """Runs the app's coroutines on a private event-loop thread, for blocking callers."""

    def __init__(self, app: Fairq) -> None:
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="fairq-sync", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the facade's loop and wait for its result."""
        loop = self._ensure()
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                coro.close()
                raise FairqError("the sync facade cannot be called from its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def trigger(self, task: Task[Any, R], item: TriggerItem[Any]) -> RunHandle[R]:
        """Blocking trigger of one run (see :meth:`fairq.tasks.Task.trigger`)."""

        async def send() -> RunHandle[R]:
            return await task.trigger(
                item.payload, concurrency_key=item.concurrency_key, tenant=item.tenant,
                delay=item.delay, ttl=item.ttl, priority=item.priority, run_id=item.run_id,
                timeout=item.timeout, keep_result=item.keep_result,
            )  # fmt: skip

        return self.run(send())

    def get_run(self, run_id: str) -> RunInfo | None:
        """Blocking :meth:`Fairq.get_run`."""
        return self.run(self.app.get_run(run_id))

    def close(self) -> None:
        """Close the facade's connection and stop its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(concurrent.futures.CancelledError, RuntimeError, FairqError):
            asyncio.run_coroutine_threadsafe(self.app.aclose(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()

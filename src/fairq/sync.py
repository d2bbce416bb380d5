"""The blocking facade: runs an app's coroutines on a private event-loop thread.

One daemon thread per app, started on first use, with its own connection. A blocking
trigger on one server skips that loop: the calling thread sends the enqueue itself
(:mod:`fairq.store.blocking`), and threads triggering into the same queue at once share
script calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from fairq import telemetry
from fairq.errors import FairqError
from fairq.server import is_cluster_url
from fairq.store.blocking import BlockingEnqueuer

if TYPE_CHECKING:
    from fairq.app import Fairq
    from fairq.outcomes import RunInfo
    from fairq.store import RunQueue
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
        self._blocking: BlockingEnqueuer | None = None
        self._no_blocking = False

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
        """Blocking trigger of one run (see :meth:`fairq.tasks.Task.trigger`): sent from
        the calling thread on a blocking connection (one server), through the facade's
        loop otherwise (a cluster, eager mode)."""
        blocking = None if self.app.eager else self._enqueuer()
        if blocking is not None:
            request = task.request_for(item)
            with telemetry.trigger_span([request]):
                result = blocking.enqueue_one(telemetry.with_trace_context(request))
            return task.handle_for(result)

        async def send() -> RunHandle[R]:
            return await task.trigger(
                item.payload, concurrency_key=item.concurrency_key, tenant=item.tenant,
                delay=item.delay, ttl=item.ttl, priority=item.priority, run_id=item.run_id,
                timeout=item.timeout, keep_result=item.keep_result, head_start=item.head_start,
            )  # fmt: skip

        return self.run(send())

    def _enqueuer(self) -> BlockingEnqueuer | None:
        """The blocking enqueuer (made on first use; None on a cluster)."""
        with self._lock:
            if self._blocking is not None or self._no_blocking:
                return self._blocking
        rq = self.run(self._checked_queue())
        url = self.run(self.app.resolved_url())
        with self._lock:
            if self._blocking is None and not self._no_blocking:
                if is_cluster_url(url):
                    self._no_blocking = True
                else:
                    self._blocking = BlockingEnqueuer(rq, url)
            return self._blocking

    async def _checked_queue(self) -> RunQueue:
        rq = await self.app.queue()
        await rq.check_meta()
        return rq

    def get_run(self, run_id: str) -> RunInfo | None:
        """Blocking :meth:`Fairq.get_run`."""
        return self.run(self.app.get_run(run_id))

    def close(self) -> None:
        """Close the facade's connections and stop its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            blocking, self._blocking, self._no_blocking = self._blocking, None, False
        if blocking is not None:
            blocking.close()
        if loop is None or thread is None:
            return
        with contextlib.suppress(concurrent.futures.CancelledError, RuntimeError, FairqError):
            asyncio.run_coroutine_threadsafe(self.app.aclose(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()

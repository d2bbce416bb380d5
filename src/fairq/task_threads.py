"""The threads a worker runs plain (not async) task functions in.

Python cannot stop a thread, so a plain function that overruns its timeout (or ignores
its cancellation past the grace) is *abandoned*: its run ends, and the thread runs on
until the function returns. :class:`TaskThreads` keeps count of those threads, by run:

* the pool holds ``2 × concurrency`` threads: one per run in flight, and as many again
  for abandoned ones. A worker whose abandoned threads number more than its
  concurrency takes that many fewer runs (:attr:`TaskThreads.excess`), so every run it
  holds has a thread free: a function starts as soon as its run does;
* a run's deadline counts from the moment its function starts in its thread, never
  from the submit, so no run can time out without having started;
* a later attempt of a run whose abandoned thread still runs waits for that thread
  (:meth:`TaskThreads.wait_for_strays`): two attempts of one run never overlap in one
  worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

#: Threads for abandoned functions kept per slot of concurrency, beyond the slot's own.
STRAYS_PER_SLOT: Final = 1


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned function's error as seen (nobody awaits it any more)."""
    if not future.cancelled():
        future.exception()


class TaskThreads:
    """The thread pool of one worker's plain task functions (see the module docstring).

    Args:
        concurrency: the worker's most runs in flight.
        on_change: called (on the event loop) when an abandoned thread ends.
    """

    def __init__(self, concurrency: int, on_change: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency * (1 + STRAYS_PER_SLOT), thread_name_prefix="fairq-task"
        )
        self._on_change = on_change
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Abandoned threads still running, by run id.
        self._strays: dict[str, set[Future[Any]]] = {}
        self._stray_ended: dict[str, asyncio.Event] = {}

    @property
    def strays(self) -> int:
        """Abandoned threads still running."""
        return sum(len(s) for s in self._strays.values())

    @property
    def excess(self) -> int:
        """Runs fewer than its concurrency the worker may hold now (abandoned threads
        beyond the pool's spare ones)."""
        return max(0, self.strays - self.concurrency * STRAYS_PER_SLOT)

    def has_strays(self, run_id: str) -> bool:
        return bool(self._strays.get(run_id))

    async def call(
        self,
        run_id: str,
        fn: Callable[[Any], Any],
        payload: Any,
        timeout: float | None,  # noqa: ASYNC109 - the run's deadline
    ) -> Any:
        """Run ``fn(payload)`` in a thread, in a copy of the caller's context; raise
        TimeoutError once it has run ``timeout`` seconds. When this call ends before the
        function (a timeout, a cancellation), its thread is counted as abandoned until
        the function returns."""
        loop = self._loop = asyncio.get_running_loop()
        began: asyncio.Future[None] = loop.create_future()

        def started() -> None:
            if not began.done():
                began.set_result(None)

        def run() -> Any:
            loop.call_soon_threadsafe(started)
            return fn(payload)

        work = self._pool.submit(contextvars.copy_context().run, run)
        result = asyncio.wrap_future(work)
        result.add_done_callback(_retrieved)
        try:
            await began  # the worker keeps a thread free for each of its runs: at once
            return await asyncio.wait_for(asyncio.shield(result), timeout)
        finally:
            if not work.cancel() and not work.done():  # (cancel: it had not started)
                self._abandon(run_id, work)

    def _abandon(self, run_id: str, work: Future[Any]) -> None:
        self._strays.setdefault(run_id, set()).add(work)
        self._stray_ended.setdefault(run_id, asyncio.Event()).clear()
        loop = self._loop
        assert loop is not None

        def ended(_: Future[Any]) -> None:  # in the abandoned thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._ended, run_id, work)

        work.add_done_callback(ended)

    def _ended(self, run_id: str, work: Future[Any]) -> None:
        strays = self._strays.get(run_id)
        if strays is not None:
            strays.discard(work)
            if not strays:
                del self._strays[run_id]
                self._stray_ended.pop(run_id, asyncio.Event()).set()
        self._on_change()

    async def wait_for_strays(self, run_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until the abandoned threads of ``run_id`` have ended (at most
        ``timeout`` seconds); whether they have."""
        event = self._stray_ended.get(run_id)
        if event is None or not self.has_strays(run_id):
            return True
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def shutdown(self) -> None:
        """Stop taking work; abandoned threads run on (they cannot be stopped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["STRAYS_PER_SLOT", "TaskThreads"]

"""Timeouts end to end: per task and per trigger, async (cancelled at its deadline) and
plain functions (the thread is abandoned, the run ends timed out), with retries."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.acceptance.workers import quick_worker

from fairq.app import Fairq
from fairq.config import RetryPolicy, RunQueueConfig
from fairq.errors import RunFailedError
from fairq.keys import Environment
from fairq.outcomes import RunStatus
from fairq.worker import current_run

NO_RETRY = RetryPolicy(max_attempts=1)
FAST_RETRY = RetryPolicy(max_attempts=3, min_delay_ms=5, max_delay_ms=5, randomize=False)


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix, lease_ms=1500))
    yield application
    await application.aclose()


async def ended(handle: Any) -> RunFailedError:
    with pytest.raises(RunFailedError) as caught:
        await handle.wait(timeout=10)
    return caught.value


async def test_an_async_task_is_cancelled_at_its_deadline(app: Fairq) -> None:
    saw: list[str] = []

    @app.task(queue="slow", timeout=0.3, retry=NO_RETRY)
    async def slow(payload: None) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            saw.append("cancelled")
            raise

    async with quick_worker(app, concurrency=2) as worker:
        began = time.monotonic()
        handle = await slow.trigger()
        error = await ended(handle)
        took = time.monotonic() - began
    assert error.status is RunStatus.TIMED_OUT
    assert saw == ["cancelled"]
    assert 0.3 <= took < 10  # its 0.3 s timeout, not its 30 s sleep
    info = await handle.info()
    assert info is not None and info.status is RunStatus.TIMED_OUT
    assert info.error is not None and "timed out after 0.3s" in info.error
    assert info.attempts == 1 and worker.stats.timed_out == 1


async def test_a_plain_function_is_abandoned_at_its_deadline_and_the_run_times_out(
    app: Fairq,
) -> None:
    release = threading.Event()
    finished = threading.Event()

    @app.task(queue="blocking", timeout=0.3, retry=NO_RETRY)
    def blocking(payload: None) -> str:
        release.wait(30)  # a call that cannot be interrupted
        finished.set()
        return "late"

    @app.task(queue="quick")
    def quick(payload: int) -> int:
        return payload * 2

    try:
        async with quick_worker(app, concurrency=2) as worker:
            handle = await blocking.trigger()
            error = await ended(handle)
            assert error.status is RunStatus.TIMED_OUT
            # the thread still runs (abandoned), but the worker goes on serving
            assert not finished.is_set()
            assert await (await quick.trigger(21)).wait(timeout=10) == 42
            rq = await app.queue()
            assert (await rq.queue_stats(app.env, "blocking")).running == 0
            assert worker.stats.timed_out == 1
    finally:
        release.set()
    assert finished.wait(5)
    # its late return changed nothing
    info = await handle.info()
    assert info is not None and info.status is RunStatus.TIMED_OUT and info.result is None


async def test_a_triggers_timeout_overrides_the_tasks(app: Fairq) -> None:
    @app.task(queue="nap", timeout=0.2, retry=NO_RETRY)
    async def nap(payload: float) -> str:
        await asyncio.sleep(payload)
        return "rested"

    @app.task(queue="unbounded", retry=NO_RETRY)
    async def unbounded(payload: float) -> str:
        await asyncio.sleep(payload)
        return "rested"

    async with quick_worker(app, concurrency=4):
        longer = await nap.trigger(0.5, timeout=5)
        shorter = await unbounded.trigger(5, timeout=0.2)
        assert await longer.wait(timeout=10) == "rested"
        assert (await ended(shorter)).status is RunStatus.TIMED_OUT


async def test_timed_out_attempts_are_retried_by_the_tasks_policy(app: Fairq) -> None:
    attempts: list[int] = []

    @app.task(queue="warming", timeout=0.2, retry=FAST_RETRY)
    async def warming(payload: None) -> int:
        run = current_run()
        assert run is not None
        attempts.append(run.attempt)
        if run.attempt < 2:
            await asyncio.sleep(10)  # the first two attempts time out
        return run.attempt

    @app.task(queue="stuck", timeout=0.2, retry=RetryPolicy(max_attempts=2, min_delay_ms=5,
              max_delay_ms=5, randomize=False))  # fmt: skip
    async def stuck(payload: None) -> None:
        await asyncio.sleep(10)

    async with quick_worker(app, concurrency=4) as worker:
        ok = await warming.trigger()
        bad = await stuck.trigger()
        assert await ok.wait(timeout=10) == 2
        error = await ended(bad)
    assert attempts == [0, 1, 2]
    # the last attempt's timeout ends the run timed out (not dead-lettered)
    assert error.status is RunStatus.TIMED_OUT
    info = await bad.info()
    assert info is not None and info.attempts == 2
    assert worker.stats.timed_out == 4 and worker.stats.retried == 3


async def test_a_tasks_own_timeout_error_is_an_ordinary_failure(app: Fairq) -> None:
    @app.task(queue="upstream", timeout=30, retry=NO_RETRY)
    async def upstream(payload: None) -> None:
        raise TimeoutError("the upstream API timed out")

    async with quick_worker(app, concurrency=2) as worker:
        error = await ended(await upstream.trigger())
    assert error.status is RunStatus.DEAD_LETTERED
    assert "the upstream API timed out" in str(error)
    assert worker.stats.timed_out == 0


class Threads:
    """What the plain functions of a test did: each attempt's start and end (monotonic
    seconds), and the most of them running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: dict[tuple[str, int], list[float]] = {}
        self.running = 0
        self.most = 0

    def begin(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.spans[key] = [time.monotonic()]
            self.running += 1
            self.most = max(self.most, self.running)

    def end(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.spans[key].append(time.monotonic())
            self.running -= 1


def hanging_task(app: Fairq, queue: str, seen: Threads, hang_s: float) -> Any:
    """A plain task (0.2 s timeout, no retry) returning its payload, that hangs
    ``hang_s`` seconds for payloads 0 and 1; ``seen`` records its threads."""

    @app.task(queue=queue, timeout=0.2, retry=NO_RETRY)
    def hang_or_return(payload: int) -> int:
        run = current_run()
        assert run is not None
        seen.begin((run.run_id, run.attempt))
        try:
            if payload < 2:
                time.sleep(hang_s)
            return payload
        finally:
            seen.end((run.run_id, run.attempt))

    return hang_or_return


async def test_a_retry_waits_for_the_abandoned_thread_of_its_earlier_attempt(app: Fairq) -> None:
    """Attempt 1 overruns its 0.3 s timeout by far; its retry is leased at once (no
    backoff) by the same worker, and starts only once the abandoned thread returned:
    two attempts of one run never run at once."""
    seen = Threads()

    @app.task(queue="convert", timeout=0.3, retry=FAST_RETRY)
    def convert(payload: None) -> str:
        run = current_run()
        assert run is not None
        key = (run.run_id, run.attempt)
        seen.begin(key)
        try:
            if run.attempt == 0:
                time.sleep(1.5)
            return "ok"
        finally:
            seen.end(key)

    async with quick_worker(app, concurrency=2) as worker:
        handle = await convert.trigger()
        assert await handle.wait(timeout=20) == "ok"
    first, second = seen.spans[(handle.run_id, 0)], seen.spans[(handle.run_id, 1)]
    assert len(first) == 2, "the retry ended while the first attempt's thread still ran"
    assert second[0] >= first[1] > first[0] + 1.0
    assert seen.most == 1
    assert worker.stats.timed_out == 1 and worker.stats.completed == 1


async def test_abandoned_threads_never_make_a_run_time_out_without_starting(app: Fairq) -> None:
    """Concurrency 2: two functions hang 2 s past a 0.2 s timeout, four more follow. The
    pool keeps a thread for each run beside the abandoned ones, and a deadline counts
    from the function's start, so all six start and the four quick ones complete."""
    seen = Threads()
    thumb = hanging_task(app, "thumb", seen, hang_s=2.0)

    async with quick_worker(app, concurrency=2) as worker:
        slow = [await thumb.trigger(i) for i in range(2)]
        for h in slow:  # both timed out: their threads are abandoned, still sleeping
            assert (await ended(h)).status is RunStatus.TIMED_OUT
        quick = [await thumb.trigger(i) for i in range(2, 6)]
        assert [await h.wait(timeout=10) for h in quick] == [2, 3, 4, 5]
    assert len(seen.spans) == 6  # every run started its function
    assert worker.stats.timed_out == 2 and worker.stats.completed == 4
    assert seen.most <= 4  # two runs in flight beside two abandoned threads


async def test_past_one_abandoned_thread_per_slot_the_worker_takes_fewer_runs(app: Fairq) -> None:
    """Concurrency 1: the pool has room for one abandoned thread. With two of them
    running the worker takes no run until one returns, so at most two threads run and
    the third run still starts (and completes) instead of timing out in the queue."""
    seen = Threads()
    scan = hanging_task(app, "scan", seen, hang_s=1.5)

    async with quick_worker(app, concurrency=1) as worker:
        handles = [await scan.trigger(i) for i in range(3)]
        for h in handles[:2]:
            assert (await ended(h)).status is RunStatus.TIMED_OUT
        assert await handles[2].wait(timeout=10) == 2
    starts = sorted(span[0] for span in seen.spans.values())
    first_end = min(span[1] for span in seen.spans.values() if len(span) == 2)
    assert len(starts) == 3 and starts[2] >= first_end  # the third waited for a thread
    assert seen.most == 2
    assert worker.stats.timed_out == 2 and worker.stats.completed == 1

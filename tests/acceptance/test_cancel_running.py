"""Cancelling a running run: the worker hears it through the server, the task sees it
(``CancelledError`` / ``current_run().cancelled``), the run ends cancelled and its slot
frees; a task that ignores it is abandoned at the grace deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
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
from fairq.models import CancelOutcome
from fairq.outcomes import RunStatus
from fairq.worker import Worker, current_run

NO_RETRY = RetryPolicy(max_attempts=1)
#: A heartbeat every 0.5 s.
LEASE_MS = 1500


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix, lease_ms=LEASE_MS))
    yield application
    await application.aclose()


async def cancelled(handle: Any) -> RunFailedError:
    with pytest.raises(RunFailedError) as caught:
        await handle.wait(timeout=10)
    assert caught.value.status is RunStatus.CANCELLED
    return caught.value


async def counted(worker: Worker, stat: str, n: int, within: float = 10.0) -> None:
    """Wait until the worker's ``stat`` reaches ``n`` (a worker updates its stats when a
    script's reply reaches it, after the run's outcome is already visible)."""
    deadline = asyncio.get_running_loop().time() + within
    while getattr(worker.stats, stat) < n:
        assert asyncio.get_running_loop().time() < deadline, (stat, worker.stats)
        await asyncio.sleep(0.01)


async def running(app: Fairq, queue: str) -> int:
    rq = await app.queue()
    return (await rq.queue_stats(app.env, queue)).running


async def test_an_async_run_sees_cancelled_error_and_ends_cancelled(app: Fairq) -> None:
    started = asyncio.Event()
    second = asyncio.Event()
    saw: list[str] = []
    began_runs: list[int] = []

    @app.task(queue="crawl", concurrency_limit=1, retry=NO_RETRY)
    async def crawl(payload: int) -> int:
        began_runs.append(payload)
        (second if started.is_set() else started).set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw.append("CancelledError")
            raise
        return payload

    async with quick_worker(app, concurrency=4) as worker:
        handles = {1: await crawl.trigger(1), 2: await crawl.trigger(2)}
        await asyncio.wait_for(started.wait(), 10)
        # two triggers in the same millisecond are equally old: either may take the slot
        handle, queued_next = handles[began_runs[0]], handles[3 - began_runs[0]]
        assert await running(app, "crawl") == 1
        began = time.monotonic()
        assert await handle.cancel() is CancelOutcome.CANCEL_REQUESTED
        # marked while it runs; the worker hears the cancel on its wake channel at once, so
        # by this read it may already have stopped the run and finished it cancelled
        info = await handle.info()
        assert info is not None
        assert info.cancel_requested or info.status is RunStatus.CANCELLED, info
        await cancelled(handle)
        # on the channel or the next heartbeat (0.5 s): long before its 60 s sleep ends
        assert time.monotonic() - began < 10
        assert saw == ["CancelledError"]
        # the slot is free again: the next run of the queue takes it
        await asyncio.wait_for(second.wait(), 5)
        assert await queued_next.cancel() is CancelOutcome.CANCEL_REQUESTED
        await cancelled(queued_next)
    assert worker.stats.cancelled == 2
    assert await running(app, "crawl") == 0


async def test_a_plain_function_sees_current_run_cancelled(app: Fairq) -> None:
    started = threading.Event()
    stopped_at: list[int] = []

    @app.task(queue="resize", retry=NO_RETRY)
    def resize(payload: None) -> str:
        run = current_run()
        assert run is not None
        started.set()
        for step in range(1000):
            if run.cancelled:
                stopped_at.append(step)
                return "partial"
            time.sleep(0.01)
        return "done"

    async with quick_worker(app, concurrency=2) as worker:
        handle = await resize.trigger()
        assert await asyncio.to_thread(started.wait, 10)
        assert await handle.cancel() is CancelOutcome.CANCEL_REQUESTED
        error = await cancelled(handle)
    assert stopped_at and stopped_at[0] < 300  # it stopped early, not at the end
    assert "cancelled while running" in str(error)
    assert worker.stats.cancelled == 1
    assert await running(app, "resize") == 0


async def test_a_run_that_ignores_its_cancellation_is_abandoned_at_the_grace_deadline(
    app: Fairq,
) -> None:
    release = threading.Event()
    started = threading.Event()

    @app.task(queue="stubborn", retry=NO_RETRY)
    def stubborn(payload: None) -> str:
        started.set()
        release.wait(30)  # never looks at current_run().cancelled
        return "too late"

    try:
        async with quick_worker(app, concurrency=2, cancel_grace=0.5) as worker:
            handle = await stubborn.trigger()
            assert await asyncio.to_thread(started.wait, 10)
            began = time.monotonic()
            assert await handle.cancel() is CancelOutcome.CANCEL_REQUESTED
            error = await cancelled(handle)
            took = time.monotonic() - began
            assert 0.5 <= took < 10  # the 0.5 s grace, not the 30 s wait
            assert "did not stop within 0.5s" in str(error)
            assert await running(app, "stubborn") == 0
            assert worker.stats.cancelled == 1
    finally:
        release.set()


async def test_an_async_run_that_swallows_cancelled_error_is_abandoned_too(
    app: Fairq,
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task(queue="swallow", retry=NO_RETRY)
    async def swallow(payload: None) -> str:
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # bad manners: keeps running
                await release.wait()
        return "too late"

    async with quick_worker(app, concurrency=2, cancel_grace=0.5):
        handle = await swallow.trigger()
        await asyncio.wait_for(started.wait(), 10)
        assert await handle.cancel() is CancelOutcome.CANCEL_REQUESTED
        error = await cancelled(handle)
        assert "did not stop within 0.5s" in str(error)
        assert await running(app, "swallow") == 0
        release.set()


async def test_fairq_cancel_stops_a_running_run(app: Fairq, redis_url: str, prefix: str) -> None:
    started = asyncio.Event()

    @app.task(queue="long", retry=NO_RETRY)
    async def long(payload: None) -> None:
        started.set()
        await asyncio.sleep(60)

    async with quick_worker(app, concurrency=2):
        handle = await long.trigger()
        await asyncio.wait_for(started.wait(), 10)
        env = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix}
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "fairq", "cancel", app.env.id, handle.run_id],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "running: its worker was asked to stop it" in out.stdout
        await cancelled(handle)


async def test_an_abandoned_async_run_gives_its_worker_slot_back(app: Fairq) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task(queue="swallow", retry=NO_RETRY)
    async def swallow(payload: None) -> None:
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    @app.task(queue="quick")
    async def quick(payload: int) -> int:
        return payload

    async with quick_worker(app, concurrency=1, cancel_grace=0.5):
        try:
            handle = await swallow.trigger()
            await asyncio.wait_for(started.wait(), 10)
            await handle.cancel()
            await cancelled(handle)
            # the run ended: the worker's only slot serves the next run
            assert await (await quick.trigger(5)).wait(timeout=3) == 5
        finally:
            release.set()


#: Retries at once, up to 3 attempts.
QUICK_RETRY = RetryPolicy(max_attempts=3, min_delay_ms=0, max_delay_ms=0, randomize=False)


@pytest.mark.parametrize("ending", ["fails", "times out"])
async def test_a_run_that_ends_badly_after_its_cancel_is_not_retried(
    app: Fairq, ending: str
) -> None:
    """A plain function whose attempt fails after its cancellation (it answers it with
    an error), or that ignores it and reaches its timeout: either would retry it, the
    cancel wins, and the run ends cancelled after that one attempt, however many
    attempts the policy allows."""
    attempts: list[int] = []
    started = threading.Event()

    @app.task(queue="export", retry=QUICK_RETRY)
    def export(payload: None) -> str:
        run = current_run()
        assert run is not None
        attempts.append(run.attempt)
        if run.attempt > 0:
            return "ran again"
        started.set()
        if ending == "times out":
            time.sleep(3.5)  # ignores the cancel; the timeout comes first
            return "too late"
        while not run.cancelled:
            time.sleep(0.01)
        raise RuntimeError("stopped half way")

    async with quick_worker(app, concurrency=2, cancel_grace=30) as worker:
        # (a 3 s timeout: the cancel comes first however slow the machine)
        handle = await export.trigger(timeout=3.0 if ending == "times out" else None)
        assert await asyncio.to_thread(started.wait, 10)
        assert await handle.cancel() is CancelOutcome.CANCEL_REQUESTED
        failure = await cancelled(handle)
        # the handle sees the outcome as soon as the script wrote it; the worker counts
        # the run when the script's reply reaches it, a moment later (stopping it first
        # would cut that short)
        await counted(worker, "cancelled", 1)
    assert attempts == [0]
    if ending == "fails":
        assert "stopped half way" in (failure.error or "")
    assert worker.stats.cancelled == 1 and worker.stats.retried == 0
    assert await running(app, "export") == 0

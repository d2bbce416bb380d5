"""The task API and the worker, end to end on a real server.

In-process workers for the run life cycle; worker *subprocesses* (the real
``python -m fairq worker`` entry point) for SIGTERM and kill -9.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.acceptance.workers import RunningWorker
from tests.state import run_state

from fairq.app import Fairq
from fairq.config import RetryPolicy, RunQueueConfig
from fairq.errors import PayloadError, PermanentError, QueueSizeLimitExceededError, RunFailedError
from fairq.keys import Environment
from fairq.models import CancelOutcome, EnqueueStatus
from fairq.outcomes import RunStatus
from fairq.tasks import TriggerItem
from fairq.worker import current_run

#: Retries without real backoff waits.
FAST_RETRY = RetryPolicy(max_attempts=3, min_delay_ms=5, max_delay_ms=5, randomize=False)


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``check`` until it is true (for conditions in another process only)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    yield application
    await application.aclose()
    application.close()


async def test_async_and_sync_tasks_complete_and_keep_their_results(app: Fairq) -> None:
    # Given an async task and a sync task
    seen_threads: list[str] = []

    @app.task(queue="add")
    async def add(payload: dict[str, int]) -> int:
        return payload["x"] + payload["y"]

    @app.task(queue="shout")
    def shout(payload: str) -> dict[str, Any]:
        seen_threads.append(threading.current_thread().name)
        run = current_run()
        assert run is not None
        return {"text": payload.upper(), "run": run.run_id}

    # When runs are triggered and a worker runs them
    async with RunningWorker(app, concurrency=4):
        h1 = await add.trigger({"x": 2, "y": 3}, concurrency_key="tenant-1")
        h2 = await shout.trigger("hello", run_id="my-run-1")
        # Then each returns its result, kept as the run's outcome
        assert await h1.wait(timeout=10) == 5
        assert await h2.wait(timeout=10) == {"text": "HELLO", "run": "my-run-1"}
    info = await app.get_run(h1.run_id)
    assert info is not None
    assert (info.status, info.result, info.queue, info.concurrency_key, info.attempts) == (
        RunStatus.COMPLETED, 5, "add", "tenant-1", 0,
    )  # fmt: skip
    # sync tasks ran in the worker's threads, not on the loop
    assert seen_threads and all(name.startswith("fairq-task") for name in seen_threads)
    # the outcome is retained for result_ttl_seconds
    rq = await app.queue()
    ttl = await rq.client.ttl(rq.keys.env(app.env).outcome(h1.run_id))
    assert 0 < ttl <= app.result_ttl_seconds
    # and the run itself is gone from the queue
    assert await run_state(rq, app.env, h1.run_id) is None


async def test_a_failed_attempt_is_retried_then_succeeds(app: Fairq) -> None:
    attempts: list[int] = []

    @app.task(queue="flaky", retry=FAST_RETRY)
    async def flaky(payload: None) -> str:
        run = current_run()
        assert run is not None
        attempts.append(run.attempt)
        if len(attempts) == 1:
            raise ConnectionError("upstream down")
        return "ok"

    async with RunningWorker(app, concurrency=2) as worker:
        handle = await flaky.trigger()
        assert await handle.wait(timeout=10) == "ok"
    assert attempts == [0, 1]
    info = await handle.info()
    assert info is not None and info.status is RunStatus.COMPLETED and info.attempts == 1
    assert worker.stats.retried == 1 and worker.stats.completed == 1


async def test_a_run_is_dead_lettered_after_its_last_attempt(app: Fairq) -> None:
    calls = 0

    @app.task(queue="broken", retry=FAST_RETRY)
    async def broken(payload: Any) -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"bad input {payload!r}")

    async with RunningWorker(app, concurrency=2) as worker:
        handle = await broken.trigger({"id": 7})
        with pytest.raises(RunFailedError) as caught:
            await handle.wait(timeout=10)
    assert caught.value.status is RunStatus.DEAD_LETTERED
    assert calls == FAST_RETRY.max_attempts
    info = await handle.info()
    assert info is not None
    assert info.status is RunStatus.DEAD_LETTERED
    assert info.attempts == 3
    assert info.error is not None and "ValueError: bad input {'id': 7}" in info.error
    rq = await app.queue()
    assert [d.run_id for d in await rq.dead_letters(app.env)] == [handle.run_id]
    assert worker.stats.dead_lettered == 1


async def test_a_permanent_error_fails_the_run_without_retry(app: Fairq) -> None:
    calls = 0

    @app.task(queue="strict", retry=FAST_RETRY)
    def strict(payload: Any) -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("account closed")

    async with RunningWorker(app, concurrency=1):
        handle = await strict.trigger(1)
        with pytest.raises(RunFailedError, match="account closed"):
            await handle.wait(timeout=10)
    info = await handle.info()
    assert info is not None and info.status is RunStatus.FAILED and calls == 1
    rq = await app.queue()
    assert await rq.dead_letters(app.env) == []


async def test_a_non_serialisable_payload_is_refused_at_trigger_time(app: Fairq) -> None:
    @app.task(queue="store")
    async def store(payload: Any) -> None: ...

    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        await store.trigger({"when": object()})
    with pytest.raises(PayloadError):
        await store.trigger_many([1, {"bad": {1, 2}}])
    rq = await app.queue()
    assert (await rq.queue_stats(app.env, "store")).queued == 0


async def test_batch_trigger_reports_size_limit_rejections_per_item(app: Fairq) -> None:
    @app.task(queue="capped")
    async def capped(payload: Any) -> None: ...

    rq = await app.queue()
    await rq.set_queue_size_limit(app.env, "capped", 2)
    handles = await capped.trigger_many(
        [TriggerItem(1, concurrency_key="a"), TriggerItem(2, concurrency_key="b"), 3]
    )
    assert [h.status for h in handles] == [
        EnqueueStatus.ENQUEUED, EnqueueStatus.ENQUEUED, EnqueueStatus.REJECTED,
    ]  # fmt: skip
    assert isinstance(handles[2].error, QueueSizeLimitExceededError)
    with pytest.raises(QueueSizeLimitExceededError):
        await capped.trigger(4)
    # a duplicate id changes nothing
    again = await capped.trigger_many([TriggerItem(1, run_id=handles[0].run_id)])
    assert again[0].status is EnqueueStatus.DUPLICATE


async def test_a_run_not_started_within_its_ttl_reports_expired(app: Fairq) -> None:
    @app.task(queue="timely")
    async def timely(payload: Any) -> None: ...

    handle = await timely.trigger(1, ttl=0.001)
    rq = await app.queue()
    assert await rq.expire_ttl(now_ms=int(time.time() * 1000) + 1_000) == 1
    # the expiry script itself keeps the outcome (there is no expiry stream to copy from)
    info = await handle.info()
    assert info is not None and info.status is RunStatus.EXPIRED
    assert await rq.client.exists(rq.keys.env(app.env).outcome(handle.run_id))
    assert await run_state(rq, app.env, handle.run_id) is None
    with pytest.raises(RunFailedError, match="expired"):
        await handle.wait(timeout=1)


async def test_status_while_queued_and_unknown_runs(app: Fairq) -> None:
    @app.task(queue="later")
    async def later(payload: Any) -> None: ...

    handle = await later.trigger(1, delay=3600, concurrency_key="k")
    info = await handle.info()
    assert info is not None and info.status is RunStatus.QUEUED and info.concurrency_key == "k"
    assert await app.get_run("never-triggered") is None


async def test_the_sync_facade_triggers_and_reads_runs(app: Fairq) -> None:
    @app.task(queue="blocking")
    def blocking(payload: int) -> int:
        return payload + 1

    def caller() -> tuple[Any, Any]:
        handle = blocking.trigger_sync(41)
        return handle, handle.wait_sync(timeout=10)

    async with RunningWorker(app, concurrency=1):
        handle, result = await asyncio.to_thread(caller)
    assert result == 42
    info = await asyncio.to_thread(app.sync.get_run, handle.run_id)
    assert info is not None and info.status is RunStatus.COMPLETED


async def test_a_worker_only_takes_its_own_queues(app: Fairq, redis_url: str, prefix: str) -> None:
    # Given a run in another environment of the same server
    other = Fairq("other:proj:prod", url=redis_url, config=RunQueueConfig(prefix=prefix))

    @other.task(queue="mine")
    async def theirs(payload: Any) -> None: ...

    @app.task(queue="mine")
    async def mine(payload: Any) -> str:
        return "app"

    foreign = await theirs.trigger(1)
    async with RunningWorker(app, concurrency=2):
        assert await (await mine.trigger(2)).wait(timeout=10) == "app"
    info = await other.get_run(foreign.run_id)
    assert info is not None and info.status is RunStatus.QUEUED
    await other.aclose()


# ---------------------------------------------------------------- worker processes

APP_MODULE = """
import asyncio, os, pathlib
from fairq.app import Fairq
from fairq.config import RunQueueConfig

app = Fairq(
    os.environ["TEST_ENV"],
    config=RunQueueConfig.from_env(lease_ms=int(os.environ.get("TEST_LEASE_MS", "30000"))),
)
MARKS = pathlib.Path(os.environ["TEST_MARKS"])


@app.task(queue="slow")
async def slow(payload):
    (MARKS / f"{payload['n']}.started").touch()
    await asyncio.sleep(payload["seconds"])
    (MARKS / f"{payload['n']}.done").touch()
    return payload["n"]
"""


def start_worker(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    env: Environment,
    *args: str,
    lease_ms: int = 30_000,
) -> subprocess.Popen[bytes]:
    (tmp_path / "marks").mkdir(exist_ok=True)
    (tmp_path / "procapp.py").write_text(APP_MODULE)
    environ = {
        **os.environ,
        "FAIRQ_REDIS_URL": redis_url,
        "FAIRQ_PREFIX": prefix,
        "TEST_ENV": env.id,
        "TEST_MARKS": str(tmp_path / "marks"),
        "TEST_LEASE_MS": str(lease_ms),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fairq", "worker", "procapp:app", *args],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def started(tmp_path: Path) -> set[int]:
    return {int(p.name.split(".")[0]) for p in (tmp_path / "marks").glob("*.started")}


def proc_app(redis_url: str, prefix: str, env: Environment, **config: Any) -> Fairq:
    return Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix, **config))


async def test_sigterm_lets_in_flight_runs_finish_and_leaves_the_rest_queued(
    tmp_path: Path, redis_url: str, prefix: str, env: Environment
) -> None:
    client = proc_app(redis_url, prefix, env)
    slow = client.task(queue="slow")(lambda payload: None)
    proc = start_worker(tmp_path, redis_url, prefix, env, "--concurrency", "2")
    try:
        # (3 s: the signal lands while the first two run, however slow the machine)
        handles = [await slow.trigger({"n": n, "seconds": 3}) for n in range(5)]
        await eventually(lambda: len(started(tmp_path)) == 2)
        # When the worker gets SIGTERM mid-run
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Then it exits cleanly after the two in-flight runs finished
    assert proc.returncode == 0, stderr.decode()
    assert b"2 completed" in stderr
    statuses = [(await h.info()).status for h in handles]  # type: ignore[union-attr]
    assert statuses.count(RunStatus.COMPLETED) == 2
    assert statuses.count(RunStatus.QUEUED) == 3
    await client.aclose()


async def test_sigterm_returns_runs_that_outlive_the_grace_period(
    tmp_path: Path, redis_url: str, prefix: str, env: Environment
) -> None:
    client = proc_app(redis_url, prefix, env)
    slow = client.task(queue="slow")(lambda payload: None)
    proc = start_worker(tmp_path, redis_url, prefix, env, "--concurrency", "2", "--grace", "0.3")
    try:
        handles = [await slow.trigger({"n": n, "seconds": 30}) for n in range(2)]
        await eventually(lambda: len(started(tmp_path)) == 2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.decode()
    assert b"2 returned to the queue" in stderr
    for h in handles:
        info = await h.info()
        # back in the queue, and the interrupted attempt does not count
        assert info is not None and (info.status, info.attempts) == (RunStatus.QUEUED, 0)
    await client.aclose()


async def test_runs_of_a_killed_worker_complete_in_another_worker(
    tmp_path: Path, redis_url: str, prefix: str, env: Environment
) -> None:
    # Given a worker process holding two runs (1 s leases)
    proc = start_worker(tmp_path, redis_url, prefix, env, "--concurrency", "2", lease_ms=1000)
    rescuer = proc_app(redis_url, prefix, env, lease_ms=1000)

    @rescuer.task(queue="slow")
    async def slow(payload: dict[str, Any]) -> str:
        return f"rescued {payload['n']}"

    try:
        handles = [await slow.trigger({"n": n, "seconds": 60}) for n in range(2)]
        await eventually(lambda: len(started(tmp_path)) == 2)
        # When it is killed outright
        proc.kill()
        await asyncio.to_thread(proc.wait, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    # Then another worker gets the runs once the leases lapse, and completes them
    async with RunningWorker(rescuer, concurrency=2, maintenance_interval=0.2):
        results = [await h.wait(timeout=15) for h in handles]
    assert results == ["rescued 0", "rescued 1"]
    assert not list((tmp_path / "marks").glob("*.done"))
    await rescuer.aclose()


async def test_a_cancelled_run_never_runs_and_reports_cancelled(app: Fairq) -> None:
    # Given a task and two runs queued while no worker runs
    ran: list[str] = []

    @app.task(queue="cancellable")
    async def job(payload: Any) -> None:
        ran.append(payload["name"])

    keep = await job.trigger({"name": "keep"}, concurrency_key="t1")
    drop = await job.trigger({"name": "drop"}, concurrency_key="t1")

    # When one is cancelled before a worker starts (and a cancel meant for a dead letter
    # leaves the queued one alone)
    assert (
        await app.cancel(keep.run_id, only_if=RunStatus.DEAD_LETTERED) is CancelOutcome.NOT_IN_STATE
    )
    assert await drop.cancel() is CancelOutcome.CANCELLED

    # Then the worker runs only the other, and the cancelled one reports so
    async with RunningWorker(app, concurrency=2):
        await keep.wait(timeout=10)
    assert ran == ["keep"]
    with pytest.raises(RunFailedError) as caught:
        await drop.wait(timeout=5)
    assert caught.value.status is RunStatus.CANCELLED
    # a completed run without a kept outcome is gone: nothing to cancel
    assert await app.cancel(keep.run_id) is CancelOutcome.UNKNOWN

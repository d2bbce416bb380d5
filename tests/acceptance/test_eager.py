"""Eager mode: ``Fairq(..., eager=True)`` runs triggered tasks in this process, with no
server (the one place tests run without one, by design)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fairq import (
    CancelOutcome,
    EnqueueStatus,
    Fairq,
    PayloadError,
    PermanentError,
    RetryPolicy,
    RunFailedError,
    RunStatus,
    TriggerItem,
    current_run,
)

#: Nothing listens here: an eager app that tried to connect would fail.
NOWHERE = "redis://127.0.0.1:1/0"


def eager_app() -> Fairq:
    return Fairq("acme:shop:test", url=NOWHERE, eager=True)


async def test_an_eager_trigger_runs_the_task_and_the_handle_holds_the_result() -> None:
    app = eager_app()
    seen: list[tuple[str, str | None, int]] = []

    @app.task(queue="add")
    async def add(payload: dict[str, int]) -> int:
        run = current_run()
        assert run is not None
        seen.append((run.run_id, run.concurrency_key, run.attempt))
        run.progress(0.5, "half")
        return payload["x"] + payload["y"]

    @app.task(queue="shout")
    def shout(payload: str) -> dict[str, object]:
        return {"text": payload.upper(), "thread": threading.current_thread().name}

    handle = await add.trigger({"x": 2, "y": 3}, concurrency_key="k1", run_id="r1")
    assert handle.status is EnqueueStatus.ENQUEUED
    assert seen == [("r1", "k1", 0)]  # it ran before trigger returned
    assert await handle.wait(timeout=1) == 5
    info = await handle.info()
    assert info is not None and (info.status, info.result, info.queue) == (
        RunStatus.COMPLETED, 5, "add",
    )  # fmt: skip
    assert await app.get_run("r1") == info
    # the same run id again is a duplicate: it does not run again
    again = await add.trigger({"x": 1, "y": 1}, run_id="r1")
    assert again.status is EnqueueStatus.DUPLICATE and len(seen) == 1
    # a plain function runs in a thread, like in a worker; results go through JSON
    result = await (await shout.trigger("hi")).wait()
    assert result["text"] == "HI" and result["thread"] != threading.current_thread().name
    # batches and the blocking API
    handles = await add.trigger_many([{"x": 1, "y": 1}, TriggerItem({"x": 2, "y": 2})])
    assert [await h.wait() for h in handles] == [2, 4]
    blocking = shout.trigger_sync("sync")
    assert blocking.wait_sync(timeout=1)["text"] == "SYNC"
    # an ended run cannot be cancelled
    assert await handle.cancel() is CancelOutcome.ALREADY_FINISHED
    assert await app.cancel("never-triggered") is CancelOutcome.UNKNOWN
    app.close()


async def test_eager_failures_follow_the_retry_policy_without_waiting() -> None:
    app = eager_app()
    attempts: list[int] = []
    slow_policy = RetryPolicy(max_attempts=3, min_delay_ms=60_000, max_delay_ms=60_000)

    @app.task(queue="flaky", retry=slow_policy)
    async def flaky(payload: None) -> str:
        run = current_run()
        assert run is not None
        attempts.append(run.attempt)
        if run.attempt < 2:
            raise ConnectionError("down")
        return "up"

    @app.task(queue="broken", retry=RetryPolicy(max_attempts=2, min_delay_ms=60_000))
    def broken(payload: None) -> None:
        raise ValueError("always")

    @app.task(queue="refused", retry=slow_policy)
    async def refused(payload: None) -> None:
        raise PermanentError("bad input")

    began = time.monotonic()
    assert await (await flaky.trigger()).wait() == "up"
    assert attempts == [0, 1, 2]
    with pytest.raises(RunFailedError) as dead:
        await (await broken.trigger()).wait()
    assert dead.value.status is RunStatus.DEAD_LETTERED
    assert "ValueError: always" in str(dead.value)
    with pytest.raises(RunFailedError) as failed:
        await (await refused.trigger()).wait()
    assert failed.value.status is RunStatus.FAILED
    assert time.monotonic() - began < 5  # no backoff waits


async def test_eager_timeouts_and_payload_checks() -> None:
    app = eager_app()

    @app.task(queue="slow", timeout=0.1, retry=RetryPolicy(max_attempts=1))
    async def slow(payload: None) -> None:
        await asyncio.sleep(10)

    @app.task(queue="echo")
    async def echo(payload: object) -> object:
        return payload

    with pytest.raises(RunFailedError) as timed_out:
        await (await slow.trigger()).wait()
    assert timed_out.value.status is RunStatus.TIMED_OUT
    with pytest.raises(PayloadError):
        await echo.trigger({"when": object()})
    # the task gets the payload as a worker would: decoded from JSON
    assert await (await echo.trigger({"t": (1, 2)})).wait() == {"t": [1, 2]}

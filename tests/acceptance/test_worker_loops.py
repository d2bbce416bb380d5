"""No bad value stops a worker's loops: each loop has a failure injected (a bad value
where the API cannot refuse it, or a step that raises), and the test shows the loop
still doing its work afterwards (leases renewed, ticks claimed, cancels heard, runs
finished)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.acceptance.workers import RunningWorker
from tests.consumer_waits import subscribed

from fairq.app import Fairq, Schedule
from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.errors import ConfigurationError
from fairq.keys import Environment
from fairq.models import CancelOutcome, Delivery
from fairq.outcomes import RunStatus
from fairq.schedules import Scheduler
from fairq.store import RunQueue
from fairq.worker import Worker, current_run

#: A lease short enough that a dead heartbeat shows within the run (heartbeat every 1 s),
#: and long enough that a live one survives the test process stalling for a second.
LEASE_MS = 3000
#: A run that outlives its lease several times over.
LONG_RUN_S = 9.0


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix, lease_ms=LEASE_MS))
    yield application
    await application.aclose()
    application.close()


class Failing:
    """Makes ``owner.<method>`` raise ``RuntimeError("injected <method> failure")`` on
    its first ``times`` calls, then behave; ``calls`` counts the calls, ``failures`` the
    injected failures."""

    def __init__(self, owner: Any, method: str, times: int) -> None:
        self.calls = self.failures = 0
        real = getattr(owner, method)

        async def flaky(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.failures < times:
                self.failures += 1
                raise RuntimeError(f"injected {method} failure")
            return await real(*args, **kw)

        setattr(owner, method, flaky)


def echo_task(app: Fairq) -> Any:
    @app.task(queue="echo")
    async def echo(payload: int) -> int:
        return payload

    return echo


def long_task(app: Fairq, tokens: list[int], bad_note: Any = None) -> Any:
    """A task that runs LONG_RUN_S and records each delivery's lease token; with
    ``bad_note``, it puts that (fraction, message) among the worker's progress notes
    every 0.1 s (bypassing ``progress()``, which refuses it)."""

    @app.task(queue="long", keep_result=True)
    async def long(payload: None) -> str:
        run = current_run()
        assert run is not None
        tokens.append(run.lease_token)
        end = time.monotonic() + LONG_RUN_S
        while time.monotonic() < end:
            if bad_note is not None:
                run._progress[run.run_id] = bad_note
            await asyncio.sleep(0.1)
        return "done"

    return long


async def test_a_progress_note_with_a_lone_surrogate_is_refused_and_the_leases_renewed(
    app: Fairq,
) -> None:
    """``progress()`` refuses a note that is not valid Unicode (the task sees the
    error); the run, several leases long, is delivered once and completes."""
    tokens: list[int] = []
    refused: list[str] = []

    @app.task(queue="files", keep_result=True)
    async def files(payload: None) -> str:
        run = current_run()
        assert run is not None
        tokens.append(run.lease_token)
        try:
            run.progress(0.5, "reading \udcff.csv")  # a non-UTF-8 file name, as Python gives it
        except ConfigurationError as exc:
            refused.append(str(exc))
        await asyncio.sleep(LONG_RUN_S)
        return "done"

    async with RunningWorker(app, concurrency=2, maintenance_interval=0.1) as worker:
        handle = await files.trigger()
        assert await handle.wait(timeout=LONG_RUN_S + 10) == "done"
    assert len(refused) == 1 and "valid Unicode" in refused[0]
    assert tokens == [1]
    assert worker.stats.lease_lost == 0


@pytest.mark.parametrize(
    "note", [(0.5, "bad \ud800"), (float("nan"), ""), ("half", ""), (0.5, 5)], ids=repr
)
async def test_the_heartbeat_drops_a_bad_note_and_still_renews_every_lease(
    app: Fairq, note: tuple[object, object]
) -> None:
    """A bad note put among the worker's notes over and over (every 0.1 s of a run three
    leases long) never stops the heartbeat: the run is delivered once and completes,
    and a good run beside it keeps its lease too."""
    tokens: list[int] = []
    long = long_task(app, tokens, bad_note=note)
    async with RunningWorker(app, concurrency=2, maintenance_interval=0.1) as worker:
        handle = await long.trigger()
        assert await handle.wait(timeout=LONG_RUN_S + 10) == "done"
    assert tokens == [1]
    assert worker.stats.lease_lost == 0
    assert worker.stats.loop_errors >= 1  # each dropped note is counted


async def test_the_heartbeat_loop_survives_a_call_that_raises(
    app: Fairq, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat call raises an unexpected error twice: the error is logged, the
    loop goes on, and the long run keeps its one lease to the end."""
    tokens: list[int] = []
    long = long_task(app, tokens)
    failing = Failing(await app.queue(), "heartbeat", 2)
    with caplog.at_level(logging.ERROR, logger="fairq.worker"):
        async with RunningWorker(app, concurrency=2, maintenance_interval=0.1) as worker:
            handle = await long.trigger()
            assert await handle.wait(timeout=LONG_RUN_S + 10) == "done"
    assert failing.failures == 2
    assert tokens == [1]
    assert worker.stats.lease_lost == 0
    assert worker.stats.loop_errors == 2
    assert any("injected heartbeat failure" in r.getMessage() for r in caplog.records)


async def test_a_bad_schedule_beside_a_good_one_does_not_stop_the_good_one(
    app: Fairq, env: Environment
) -> None:
    """A schedule built by hand with a payload JSON cannot hold (``app.schedule`` would
    refuse it) fails alone: the good schedule's ticks are claimed, on a logical clock."""

    @app.task(queue="tick")
    async def tick(payload: Any) -> None:
        return None

    # the bad one sorts first: its failure must not end the pass
    app.schedules["a-bad"] = Schedule(name="a-bad", task=tick, every_ms=1000, payload=float("nan"))
    app.schedule(tick, every=1, name="b-good")
    rq = await app.queue()
    scheduler = Scheduler(app)
    t0 = 1_700_000_000_000
    enqueued = [await scheduler.tick(rq, now_ms=t0 + i * 1000) for i in range(5)]
    assert enqueued == [1, 1, 1, 1, 1]
    stats = await rq.queue_stats(env, "tick")
    assert stats.queued == 5


async def test_the_schedule_loop_survives_a_pass_that_raises(
    app: Fairq, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler pass raises an unexpected error: the worker's schedule loop logs it
    and its next passes enqueue the ticks (the runs complete)."""
    done: list[int] = []
    two_done = asyncio.Event()

    @app.task(queue="pulse")
    async def pulse(payload: None) -> None:
        done.append(1)
        if len(done) >= 2:
            two_done.set()

    app.schedule(pulse, every=1, name="pulse-1s")
    real = Scheduler.tick
    calls = 0

    async def flaky(self: Scheduler, rq: RunQueue, **kw: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected scheduler failure")
        return await real(self, rq, **kw)

    monkeypatch.setattr(Scheduler, "tick", flaky)
    async with RunningWorker(app, concurrency=2, idle_timeout=0.2) as worker:
        await asyncio.wait_for(two_done.wait(), 10)
    assert len(done) >= 2
    assert worker.stats.loop_errors >= 1


async def test_garbage_on_the_wake_channel_does_not_deafen_the_cancel_listener(
    redis_url: str, prefix: str, env: Environment
) -> None:
    """Bytes that are not UTF-8 published on the wake-up channel (anyone on the server
    can) leave the listener alive: a cancel of a running run is heard at once, long
    before the next heartbeat (leases of 60 s: a heartbeat every 20 s)."""
    app = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix, lease_ms=60_000))
    started = asyncio.Event()

    @app.task(queue="slow")
    async def slow(payload: None) -> None:
        started.set()
        await asyncio.sleep(30)

    try:
        async with RunningWorker(app, concurrency=2) as worker:
            rq = await app.queue()
            handle = await slow.trigger()
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.sleep(0.2)  # the listener is subscribed (it was before the lease)
            for garbage in (b"\xff\xfe", b"cancel:\xc3"):
                await rq.client.publish(rq.keys.wake_channel, garbage)
            await asyncio.sleep(0.1)
            assert await handle.cancel() is CancelOutcome.CANCEL_REQUESTED
            t0 = time.monotonic()
            while (info := await handle.info()) is None or not info.status.finished:
                assert time.monotonic() - t0 < 5, "the cancel was not heard on the channel"
                await asyncio.sleep(0.05)
        assert info.status is RunStatus.CANCELLED
        assert worker.stats.cancelled == 1
    finally:
        await app.aclose()


async def test_the_listener_survives_a_cancel_hook_that_raises(make_queue: Any) -> None:
    """A consumer's cancel hook raises on the first cancel: the error is logged, the
    listener subscribes again, and the next cancel and wake-up hints are heard."""
    rq: RunQueue = await make_queue()
    heard: list[str] = []
    errors: list[int] = []

    def on_cancel(member: str) -> None:
        heard.append(member)
        if len(heard) == 1:
            raise RuntimeError("injected hook failure")

    consumer = Consumer(rq, on_cancel=on_cancel, on_loop_error=lambda: errors.append(1))
    try:
        await subscribed(consumer)
        await rq.client.publish(rq.keys.wake_channel, "cancel:o:p:e:r1")

        async def until(check: Any) -> None:
            deadline = time.monotonic() + 5
            while not check():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)

        await until(lambda: errors)
        # the listener set _wake before it counted the error, then sleeps its backoff
        # (0.05 s): set again, it is subscribed again
        consumer._wake.clear()
        await asyncio.wait_for(consumer._wake.wait(), 5)
        await rq.client.publish(rq.keys.wake_channel, "cancel:o:p:e:r2")
        await until(lambda: len(heard) == 2)
        consumer._wake.clear()
        await rq.client.publish(rq.keys.wake_channel, "work")
        await asyncio.wait_for(consumer._wake.wait(), 5)
    finally:
        await consumer.close()
    assert heard == ["o:p:e:r1", "o:p:e:r2"]
    assert errors == [1]


class _BrokenMetrics:
    def started(self, delivery: Delivery) -> None:
        raise RuntimeError("injected metrics failure")

    def finished(self, delivery: Delivery, outcome: str, seconds: float) -> None:
        raise RuntimeError("injected metrics failure")


async def test_a_metrics_observer_that_raises_stops_neither_runs_nor_the_worker(
    app: Fairq,
) -> None:
    """Every call of the worker's metrics observer raises: every run still completes
    and the worker keeps taking runs; the failures are counted."""

    @app.task(queue="add")
    async def add(payload: int) -> int:
        return payload + 1

    worker = Worker(app, concurrency=2, idle_timeout=0.2)
    worker.metrics = _BrokenMetrics()  # type: ignore[assignment]
    runner = asyncio.create_task(worker.run())
    try:
        handles = [await add.trigger(i) for i in range(5)]
        assert [await h.wait(timeout=10) for h in handles] == [1, 2, 3, 4, 5]
        assert not runner.done()
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 10)
    assert worker.stats.completed == 5
    assert worker.stats.loop_errors == 10  # started and finished, per run


async def test_the_finishing_loop_survives_a_finish_that_raises(app: Fairq) -> None:
    """The finish raises an unexpected error once: the runs of that call are finished
    again one by one, and later runs are finished as usual."""

    echo = echo_task(app)
    failing = Failing(await app.queue(), "finish", 1)
    async with RunningWorker(app, concurrency=4, idle_timeout=0.2) as worker:
        first = await echo.trigger_many(list(range(4)))
        assert [await h.wait(timeout=10) for h in first] == [0, 1, 2, 3]
        later = await echo.trigger(9)
        assert await later.wait(timeout=10) == 9
    assert failing.failures == 1
    assert worker.stats.lease_lost == 0
    assert worker.stats.completed == 5
    assert worker.stats.loop_errors == 1


async def test_the_fetch_loop_survives_a_dequeue_that_raises(app: Fairq) -> None:
    """The dequeue raises an unexpected error twice: the worker logs it, backs off and
    goes on taking runs."""

    echo = echo_task(app)
    failing = Failing(await app.queue(), "dequeue_batch", 2)
    async with RunningWorker(app, concurrency=2, idle_timeout=0.2) as worker:
        handle = await echo.trigger(7)
        assert await handle.wait(timeout=10) == 7
    assert failing.failures == 2
    assert worker.stats.loop_errors == 2


async def test_maintenance_that_raises_does_not_stop_dequeues(make_queue: Any) -> None:
    """Maintenance raises an unexpected error: the consumer's dequeue still returns the
    ready run, and the next maintenance runs."""
    rq: RunQueue = await make_queue()
    env = Environment("o", "p", "e")
    failing = Failing(rq, "maintain", 1)
    errors: list[int] = []
    consumer = Consumer(rq, maintenance_interval=0.05, on_loop_error=lambda: errors.append(1))
    try:
        await rq.enqueue(env, "q", "r1")
        batch = await consumer.next_batch(1, timeout=5)
        assert [d.run_id for d in batch] == ["r1"]
        await asyncio.sleep(0.1)
        await consumer.next_batch(1, timeout=0.3)
    finally:
        await consumer.close()
    assert errors == [1]
    assert failing.calls >= 2

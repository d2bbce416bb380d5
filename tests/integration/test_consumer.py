"""Consumer: waits without polling, wakes on hints within milliseconds, picks up
delayed runs when due, and keeps maintenance (lapsed leases, TTLs) going.

These tests use the wall clock: the consumer's whole point is real-time waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from tests.consumer_waits import noting_its_wait, subscribed
from tests.integration.commandstats import total_calls

from fairq import Fairq
from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.errors import ConfigurationError
from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.outcomes import RunStatus
from fairq.server import EmbeddedServer, connect, is_cluster_url
from fairq.store import RunQueue
from fairq.worker import Worker


async def started(rq: RunQueue, **kwargs: Any) -> Consumer:
    return await subscribed(Consumer(rq, **kwargs))


async def waiting(consumer: Consumer, max_count: int = 10, **kwargs: Any) -> asyncio.Task[Any]:
    """A next_batch call that has gone to sleep (found nothing)."""
    asleep = noting_its_wait(consumer)
    task = asyncio.create_task(consumer.next_batch(max_count, **kwargs))
    await asyncio.wait_for(asleep.wait(), 10)
    assert not task.done()
    return task


async def test_next_batch_returns_ready_work_at_once(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1")
    consumer = await started(rq, idle_timeout=30)
    try:
        t = time.perf_counter()
        (d,) = await consumer.next_batch(10)
        assert time.perf_counter() - t < 5  # at once, not after the 30 s idle timeout
        assert d.run_id == "r1"
    finally:
        await consumer.close()


async def test_next_batch_wakes_on_an_enqueue_hint(make_queue: Any, env: Environment) -> None:
    consumer_rq: RunQueue = await make_queue()
    producer: RunQueue = await make_queue()
    consumer = await started(consumer_rq, idle_timeout=30, maintenance_interval=30)
    try:
        task = await waiting(consumer)
        t = time.perf_counter()
        await producer.enqueue(env, "q", "r1")
        batch = await asyncio.wait_for(task, 5)
        elapsed = time.perf_counter() - t
        assert [d.run_id for d in batch] == ["r1"]
        assert elapsed < 5, elapsed  # a hint, not the 30 s idle timeout
    finally:
        await consumer.close()


async def test_next_batch_wakes_when_an_ack_frees_a_slot(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.enqueue(env, "q", "r1")
    await rq.enqueue(env, "q", "r2")
    consumer = await started(rq, idle_timeout=30, maintenance_interval=30)
    try:
        (first,) = await consumer.next_batch(10)
        task = await waiting(consumer)  # r2 is ready but gated
        t = time.perf_counter()
        await rq.ack([first])
        batch = await asyncio.wait_for(task, 5)
        assert [d.run_id for d in batch] == ["r2"]
        assert time.perf_counter() - t < 5  # the ack's hint, not the 30 s idle timeout
    finally:
        await consumer.close()


async def test_next_batch_wakes_when_a_paused_queue_resumes(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.pause_queue(env, "q")
    await rq.enqueue(env, "q", "r1")
    consumer = await started(rq, idle_timeout=30, maintenance_interval=30)
    try:
        task = await waiting(consumer)
        t = time.perf_counter()
        await rq.resume_queue(env, "q")
        batch = await asyncio.wait_for(task, 5)
        assert [d.run_id for d in batch] == ["r1"]
        assert time.perf_counter() - t < 5  # the resume's hint, not the 30 s idle timeout
    finally:
        await consumer.close()


async def test_delayed_run_is_picked_up_when_due(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    consumer = await started(rq, idle_timeout=30, maintenance_interval=30)
    try:
        t = time.perf_counter()  # before the enqueue: the delay counts from it
        await rq.enqueue(env, "q", "later", delay_ms=300)
        (d,) = await asyncio.wait_for(consumer.next_batch(10), 5)
        elapsed = time.perf_counter() - t
        assert d.run_id == "later"
        assert 0.25 <= elapsed < 5, elapsed  # when due, not after the 30 s idle timeout
    finally:
        await consumer.close()


async def test_delayed_run_enqueued_while_waiting_is_picked_up_when_due(
    make_queue: Any, env: Environment
) -> None:
    """The consumer is already asleep (nothing due) when a delayed run arrives."""
    rq: RunQueue = await make_queue()
    consumer = await started(rq, idle_timeout=30, maintenance_interval=30)
    try:
        task = await waiting(consumer)
        t = time.perf_counter()
        await rq.enqueue(env, "q", "later", delay_ms=300)
        (d,) = await asyncio.wait_for(task, 5)
        elapsed = time.perf_counter() - t
        assert d.run_id == "later"
        assert 0.25 <= elapsed < 5, elapsed  # when due, not after the 30 s idle timeout
    finally:
        await consumer.close()


async def test_backoff_retry_is_picked_up_when_due(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1")
    consumer = await started(rq, idle_timeout=30, maintenance_interval=30)
    try:
        (d,) = await consumer.next_batch(10)
        task = await waiting(consumer)
        await rq.nack(d, retry_at_ms=int(time.time() * 1000) + 300)
        (again,) = await asyncio.wait_for(task, 5)
        assert (again.run_id, again.attempt) == ("r1", 1)
    finally:
        await consumer.close()


async def test_next_batch_timeout_returns_empty(make_queue: Any) -> None:
    rq: RunQueue = await make_queue()
    consumer = await started(rq, idle_timeout=30)
    try:
        t = time.perf_counter()
        assert await consumer.next_batch(10, timeout=0.2) == []
        assert 0.15 <= time.perf_counter() - t < 5  # its timeout, not the 30 s idle one
    finally:
        await consumer.close()


async def test_maintenance_reclaims_lapsed_leases(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=200)
    await rq.enqueue(env, "q", "r1")
    (lost,) = await rq.dequeue(1)  # a holder that never heartbeats
    consumer = await started(rq, idle_timeout=30, maintenance_interval=0.1)
    try:
        (d,) = await asyncio.wait_for(consumer.next_batch(10), 5)
        assert (d.run_id, d.lease_token) == ("r1", lost.lease_token + 1)
    finally:
        await consumer.close()


async def test_maintenance_runs_on_its_timer_while_waiting(
    make_queue: Any, env: Environment
) -> None:
    """A long idle timeout does not delay lost-consumer recovery."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1")
    (lost,) = await rq.dequeue(1, lease_ms=60_000)
    consumer = await started(rq, idle_timeout=30, maintenance_interval=0.1)
    try:
        task = await waiting(consumer)  # asleep: nothing queued, nothing due
        t = time.perf_counter()
        # the holder's last heartbeat, once the consumer sleeps (a short first lease
        # could lapse before it does on a slow machine): it lapses 0.6 s after t at the
        # earliest
        await rq.heartbeat([lost], lease_ms=600)
        (d,) = await asyncio.wait_for(task, 5)
        assert (d.run_id, d.lease_token) == ("r1", lost.lease_token + 1)
        assert 0.5 <= time.perf_counter() - t < 5  # not after the 30 s idle timeout
    finally:
        await consumer.close()


async def test_a_long_interval_consumer_does_not_hold_off_maintenance(
    make_queue: Any, env: Environment
) -> None:
    """The shared maintenance lock lasts at most a second, whoever took it."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1")
    (lost,) = await rq.dequeue(1, lease_ms=100)
    lazy = await started(rq, idle_timeout=30, maintenance_interval=3600)
    busy = await started(await make_queue(), idle_timeout=30, maintenance_interval=0.1)
    try:
        await lazy.maintain()  # takes the lock first
        t = time.perf_counter()
        (d,) = await asyncio.wait_for(busy.next_batch(10), 5)
        assert (d.run_id, d.lease_token) == ("r1", lost.lease_token + 1)
        assert time.perf_counter() - t < 5  # not after the lazy one's 3600 s interval
    finally:
        await lazy.close()
        await busy.close()


async def test_maintenance_expires_ttls(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=100, delay_ms=10_000)
    consumer = await started(rq, idle_timeout=0.1, maintenance_interval=0.1)
    try:
        assert await consumer.next_batch(10, timeout=0.5) == []
        # expiry leaves an outcome (no stream any more) and a recent-runs entry
        info = await rq.get_run(env, "r1")
        assert info is not None and info.status is RunStatus.EXPIRED
        assert [(r.run_id, r.status) for r in await rq.recent_runs(env, "q")] == [
            ("r1", RunStatus.EXPIRED)
        ]
    finally:
        await consumer.close()


async def test_close_ends_a_waiting_next_batch(make_queue: Any) -> None:
    rq: RunQueue = await make_queue()
    consumer = await started(rq, idle_timeout=0.1)
    task = await waiting(consumer)
    await consumer.close()
    assert await asyncio.wait_for(task, 2) == []


async def test_an_idle_consumer_costs_the_server_almost_nothing(redis_url: str) -> None:
    """Measured on a private server, so nothing else in the session adds commands.
    Today's cost: per second at most 4 master reads + 4 head reads (one pipeline each)
    and the maintenance timer's lock + 8 due checks: 17 commands (38 - 42 in 3 s measured,
    printed with -s)."""
    if is_cluster_url(redis_url):
        pytest.skip("counts one server's INFO commandstats")
    with EmbeddedServer() as server:
        rq = RunQueue(await connect(server.url), RunQueueConfig(prefix="idle"))
        # the defaults: a 1 s idle timeout and 1 s maintenance interval
        consumer = await started(rq)
        try:
            task = await waiting(consumer)  # its first maintenance and dequeue done
            t = time.perf_counter()
            before = await total_calls(rq.client)
            await asyncio.sleep(3.0)
            after = await total_calls(rq.client)
            elapsed = time.perf_counter() - t
            task.cancel()
        finally:
            await consumer.close()
            await rq.close()
    # one more second's worth for a wake-up at either edge of the window (a slow
    # machine stretches the window, not the consumer's rate)
    print(f"\nidle: {after - before} commands in {elapsed:.2f} s")
    assert after - before < 20 * (elapsed + 1), (after - before, elapsed)


# ------------------------------------------------------------------ lingering


def _counting_dequeues(rq: RunQueue) -> list[int]:
    """Counts the consumer's dequeue calls (each call's batch size), on the real store."""
    sizes: list[int] = []
    dequeue_batch = rq.dequeue_batch

    async def counted(*args: Any, **kwargs: Any) -> Any:
        batch = await dequeue_batch(*args, **kwargs)
        sizes.append(len(batch.deliveries))
        return batch

    rq.dequeue_batch = counted  # type: ignore[method-assign]
    return sizes


async def test_after_a_partial_batch_the_next_dequeue_waits_and_takes_what_arrived(
    make_queue: Any, env: Environment
) -> None:
    """Runs arriving after a batch that leased fewer runs than asked for: the next
    dequeue waits ``linger`` and then leases what arrived meanwhile in one call
    (a consumer that does not linger asks again at once)."""
    consumer_rq: RunQueue = await make_queue()
    producer: RunQueue = await make_queue()
    await producer.enqueue(env, "q", "r1")
    consumer = await started(consumer_rq, idle_timeout=30, maintenance_interval=30, linger=0.5)
    sizes = _counting_dequeues(consumer_rq)
    try:
        t = time.perf_counter()  # before r1's batch: the linger counts from its end
        assert [d.run_id for d in await consumer.next_batch(10)] == ["r1"]
        task = asyncio.create_task(consumer.next_batch(10))
        # one call: a slow machine cannot let the linger end between r2 and r3
        await producer.enqueue_many(
            [EnqueueRequest(env, "q", "r2"), EnqueueRequest(env, "q", "r3")]
        )
        batch = await asyncio.wait_for(task, 5)
        elapsed = time.perf_counter() - t
    finally:
        await consumer.close()
    assert [d.run_id for d in batch] == ["r2", "r3"]
    assert sizes == [1, 2]  # one call for r2 and r3
    assert elapsed >= 0.3, elapsed


async def test_an_idle_consumer_and_one_with_a_full_batch_do_not_linger(
    make_queue: Any, env: Environment
) -> None:
    consumer_rq: RunQueue = await make_queue()
    producer: RunQueue = await make_queue()
    consumer = await started(consumer_rq, idle_timeout=30, maintenance_interval=30, linger=0.8)
    # whether each next_batch call was to linger (after a partial batch): a flag, not a
    # wall-clock bound a slow machine could break
    lingering: list[bool] = []
    linger = consumer._linger

    async def noting_the_linger() -> None:
        lingering.append(consumer._partial_at is not None)
        await linger()

    consumer._linger = noting_the_linger  # type: ignore[method-assign]
    try:
        # idle (its last dequeue found nothing): a new run is picked up on its hint at once
        task = await waiting(consumer, max_count=2)
        t = time.perf_counter()
        await producer.enqueue(env, "q", "r1")
        await producer.enqueue(env, "q", "r2")
        await producer.enqueue(env, "q", "r3")
        first = await asyncio.wait_for(task, 5)
        picked_up = time.perf_counter() - t
        # a batch of what it asked for (a backlog): the next dequeue follows at once
        if len(first) == 1:
            first += await consumer.next_batch(1)
        t = time.perf_counter()
        rest = await consumer.next_batch(2)
        back_to_back = time.perf_counter() - t
    finally:
        await consumer.close()
    assert [d.run_id for d in first + rest] == ["r1", "r2", "r3"]
    assert lingering and not any(lingering), lingering
    assert picked_up < 5, picked_up  # its hint, not the 30 s idle timeout
    assert back_to_back < 5, back_to_back


@pytest.mark.parametrize("linger", [-0.001, 1.5, float("nan"), True, "2ms"])
async def test_a_bad_linger_is_refused(make_queue: Any, linger: Any) -> None:
    rq: RunQueue = await make_queue()
    with pytest.raises(ConfigurationError, match="linger must be"):
        Consumer(rq, linger=linger)
    app = Fairq("o:p:e")

    @app.task(queue="q")
    def work(payload: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match="linger must be"):
        Worker(app, linger=linger)

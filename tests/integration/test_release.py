"""Release: free a leased run's concurrency slots while it stays leased."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.state import run_state

from fairq.keys import Environment
from fairq.models import AckStatus, NackOutcome, ReleaseStatus
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def test_release_frees_queue_and_env_concurrency(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)

    assert await rq.release([d], now_ms=T0) == [ReleaseStatus.RELEASED]

    assert (await rq.queue_stats(env, "q")).running == 0
    assert (await rq.env_stats(env)).running == 0
    # still leased: the holder may finish it
    assert await run_state(rq, env, "r1") == "running"
    assert await rq.ack([d]) == [AckStatus.ACKED]
    assert await run_state(rq, env, "r1") is None


async def test_released_slot_lets_another_run_start(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.set_env_limits(env, concurrency=1)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    (d1,) = await rq.dequeue(10, now_ms=T0 + 1)
    assert await rq.dequeue(10, now_ms=T0 + 1) == []

    await rq.release([d1])

    (d2,) = await rq.dequeue(10, now_ms=T0 + 1)
    assert d2.run_id == "r2"
    # finishing the released run frees nothing twice: r2 keeps its slot
    await rq.ack([d1])
    assert (await rq.queue_stats(env, "q")).running == 1
    assert (await rq.env_stats(env)).running == 1


async def test_release_twice_reports_no_slot(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    assert await rq.release([d]) == [ReleaseStatus.RELEASED]
    assert await rq.release([d]) == [ReleaseStatus.NOT_HELD]
    assert await run_state(rq, env, "r1") == "running"


async def test_releasing_a_never_dequeued_run_leaves_others_intact(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    (d1,) = await rq.dequeue(1, now_ms=T0 + 1)
    never_delivered = dataclasses.replace(d1, run_id="r2", lease_token=0)

    assert await rq.release([never_delivered]) == [ReleaseStatus.LEASE_LOST]

    assert (await rq.queue_stats(env, "q")).running == 1
    assert (await rq.env_stats(env)).running == 1
    assert await run_state(rq, env, "r2") == "queued"


async def test_release_with_a_stale_delivery_is_refused(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (old,) = await rq.dequeue(1, now_ms=T0)
    await rq.nack(old, retry_at_ms=T0, now_ms=T0)
    (new,) = await rq.dequeue(1, now_ms=T0)

    assert await rq.release([old]) == [ReleaseStatus.LEASE_LOST]

    assert (await rq.env_stats(env)).running == 1
    assert await rq.release([new]) == [ReleaseStatus.RELEASED]


async def test_release_of_a_keyed_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    for i in range(2):
        await rq.enqueue(env, "q", f"a{i}", concurrency_key="a", now_ms=T0 + i)
    (d,) = await rq.dequeue(10, now_ms=T0 + 1)

    await rq.release([d])

    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (1, 0)
    assert await rq.client.smembers(rq.keys.queue(env, "q").variant_inflight("a")) == set()
    assert [x.run_id for x in await rq.dequeue(10, now_ms=T0 + 1)] == ["a1"]


async def test_released_run_can_still_be_nacked(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "other", now_ms=T0 + 1)
    (d,) = await rq.dequeue(1, now_ms=T0)
    await rq.release([d])
    (other,) = await rq.dequeue(1, now_ms=T0 + 1)

    assert await rq.nack(d, retry_at_ms=T0 + 5, now_ms=T0 + 2) is NackOutcome.REQUEUED

    assert (await rq.env_stats(env)).running == 1  # only `other`
    (again,) = await rq.dequeue(1, now_ms=T0 + 5)
    assert (again.run_id, again.attempt) == ("r1", 1)
    assert other.run_id == "other"


async def test_released_run_whose_lease_lapses_frees_nothing_twice(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    (d,) = await rq.dequeue(1, now_ms=T0)
    await rq.release([d])
    (keep,) = await rq.dequeue(1, lease_ms=60_000, now_ms=T0 + 1)

    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000) == 1

    assert (await rq.env_stats(env)).running == 1  # r2 still holds its slot
    assert (await rq.queue_stats(env, "q")).running == 1
    assert await run_state(rq, env, "r1") == "queued"
    assert keep.run_id == "r2"

"""Leases: heartbeats extend them; a lapsed lease is reclaimed (slots freed, run
redelivered under a new delivery token); the old holder's late calls change nothing."""

from __future__ import annotations

from typing import Any

from tests.state import run_state

from fairq.keys import Environment
from fairq.models import AckStatus, Delivery, HeartbeatStatus, NackOutcome, ReleaseStatus
from fairq.store import RunQueue
from fairq.store.validate import MAX_PROGRESS_BYTES

T0 = 1_700_000_000_000


async def lease_deadline(rq: RunQueue, d: Delivery) -> int | None:
    shard = rq.keys.shard(rq.keys.shard_of(d.env))
    score = await rq.client.zscore(shard.leases, d.lease_member)
    return None if score is None else int(score)


async def snapshot(rq: RunQueue, env: Environment, queue: str = "q") -> tuple[Any, ...]:
    """Everything a late call from a former holder could disturb."""
    q = rq.keys.queue(env, queue)
    shard = rq.keys.shard(rq.keys.shard_of(env))
    return (
        await rq.queue_stats(env, queue, breakdown=True),
        (await rq.env_stats(env)).running,
        await rq.client.smembers(rq.keys.env(env).inflight),
        await rq.client.smembers(q.inflight),
        await rq.client.zrange(q.queued, 0, -1, withscores=True),
        await rq.client.zrange(shard.leases, 0, -1, withscores=True),
        await rq.client.zrange(shard.heads, 0, -1, withscores=True),
        await rq.client.hgetall(rq.keys.env(env).message("r1")),
    )


async def test_dequeue_leases_until_now_plus_lease(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=5_000)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0)
    d1, d2 = await rq.dequeue(1, now_ms=T0) + await rq.dequeue(1, lease_ms=700, now_ms=T0)
    assert await lease_deadline(rq, d1) == T0 + 5_000
    assert await lease_deadline(rq, d2) == T0 + 700


async def test_heartbeat_extends_the_lease(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)

    assert await rq.heartbeat([d], now_ms=T0 + 800) == [HeartbeatStatus.EXTENDED]

    assert await lease_deadline(rq, d) == T0 + 1_800
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_500) == 0
    assert await run_state(rq, env, "r1") == "running"
    assert await rq.heartbeat([d], lease_ms=10_000, now_ms=T0 + 1_700) == [HeartbeatStatus.EXTENDED]
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 11_699) == 0
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 11_700) == 1


async def test_lapsed_lease_is_reclaimed_and_redelivered(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.enqueue(env, "q", "r1", {"v": 1}, now_ms=T0)
    (first,) = await rq.dequeue(1, now_ms=T0)

    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 999) == 0
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000) == 1

    # slots freed, back in its queue at its old score, attempt unchanged
    assert await run_state(rq, env, "r1") == "queued"
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running, stats.oldest_score_ms) == (1, 0, T0)
    assert (await rq.env_stats(env)).running == 0
    assert await lease_deadline(rq, first) is None

    (second,) = await rq.dequeue(1, now_ms=T0 + 1_000)
    assert (second.run_id, second.attempt, second.payload) == ("r1", 0, {"v": 1})
    assert second.lease_token == first.lease_token + 1
    assert await rq.ack([second]) == [AckStatus.ACKED]


async def test_late_ack_from_the_old_holder_changes_nothing(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (old,) = await rq.dequeue(1, now_ms=T0)
    await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000)
    (new,) = await rq.dequeue(1, now_ms=T0 + 1_000)
    before = await snapshot(rq, env)

    assert await rq.ack([old], now_ms=T0 + 1_001) == [AckStatus.LEASE_LOST]
    assert await rq.heartbeat([old], now_ms=T0 + 1_001) == [HeartbeatStatus.LEASE_LOST]
    assert await rq.release([old], now_ms=T0 + 1_001) == [ReleaseStatus.LEASE_LOST]
    assert await rq.nack(old, now_ms=T0 + 1_001) is NackOutcome.LEASE_LOST

    assert await snapshot(rq, env) == before
    assert await rq.ack([new]) == [AckStatus.ACKED]


async def test_late_ack_before_redelivery_leaves_the_run_queued(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (old,) = await rq.dequeue(1, now_ms=T0)
    await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000)
    before = await snapshot(rq, env)

    assert await rq.ack([old]) == [AckStatus.LEASE_LOST]

    assert await snapshot(rq, env) == before
    assert await run_state(rq, env, "r1") == "queued"


async def test_reclaim_of_a_keyed_run_frees_its_variant(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.enqueue(env, "q", "a1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "a2", concurrency_key="a", now_ms=T0 + 1)
    await rq.dequeue(10, now_ms=T0 + 1)

    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_001) == 1

    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (2, 0)
    assert [(v.concurrency_key, v.queued, v.running) for v in stats.variants] == [("a", 2, 0)]
    (d,) = await rq.dequeue(10, now_ms=T0 + 1_000)
    assert (d.run_id, d.lease_token) == ("a1", 2)


async def test_reclaim_is_bounded_by_its_batch(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000, shard_count=1)
    for i in range(5):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0)
    assert len(await rq.dequeue(10, now_ms=T0)) == 5
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000, batch=2) == 2
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000, batch=2) == 2
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000, batch=2) == 1
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000, batch=2) == 0
    assert (await rq.queue_stats(env, "q")).queued == 5


async def test_heartbeat_reports_per_run(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000, shard_count=4)
    envs = [Environment("o", "p", name) for name in ("env1", "env3")]
    for e in envs:
        await rq.enqueue(e, "q", "r1", now_ms=T0)
    got = await rq.dequeue(10, now_ms=T0)
    assert len(got) == 2
    await rq.ack([got[0]])

    # the acked run is gone (UNKNOWN); the other's lease is extended
    assert await rq.heartbeat(got, now_ms=T0 + 10) == [
        HeartbeatStatus.UNKNOWN,
        HeartbeatStatus.EXTENDED,
    ]
    assert await rq.heartbeat([], now_ms=T0) == []


async def test_heartbeat_cannot_revive_a_reclaimed_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000)
    assert await rq.heartbeat([d], now_ms=T0 + 1_001) == [HeartbeatStatus.LEASE_LOST]
    shard = rq.keys.shard(rq.keys.shard_of(env))
    assert await rq.client.zcard(shard.leases) == 0
    assert await run_state(rq, env, "r1") == "queued"


async def test_a_long_non_ascii_progress_is_recorded_cut_to_the_scripts_bound(
    make_queue: Any, env: Environment
) -> None:
    """Given a running run, when its heartbeat reports 1,000 characters of progress that
    take two bytes each, then the heartbeat extends the lease and records the message
    cut to the bound the script checks in bytes (it used to cut to 1,000 characters,
    which the script refused as too long, failing the heartbeat)."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    message = "é" * 1_000
    statuses = await rq.heartbeat([d], progress={"r1": (0.5, message)}, now_ms=T0 + 1)
    assert statuses == [HeartbeatStatus.EXTENDED]
    info = await rq.get_run(env, "r1")
    assert info is not None and info.progress is not None
    fraction, note = info.progress
    assert fraction == 0.5 and message.startswith(note)
    assert len(f"0.5000:{note}".encode()) <= MAX_PROGRESS_BYTES < len(message.encode())
    assert len(note) == (MAX_PROGRESS_BYTES - len("0.5000:")) // 2

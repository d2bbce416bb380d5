"""TTL: a run not dequeued within its TTL is never delivered; it ends with the outcome
``expired`` (``get_run``, the queue's recent runs), written by the script that expires it
(a dequeue that meets it, or the maintenance timer); a delivered run loses its TTL."""

from __future__ import annotations

from typing import Any

from tests.state import heads, run_state

from fairq.keys import Environment
from fairq.models import NackOutcome
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def expired(rq: RunQueue, env: Environment, queue: str = "q") -> list[tuple[str, str | None]]:
    """(run id, concurrency key) of the queue's expired runs, oldest first."""
    recent = await rq.recent_runs(env, queue)
    return [
        (r.run_id, r.concurrency_key) for r in reversed(recent) if r.status is RunStatus.EXPIRED
    ]


async def assert_gone(rq: RunQueue, env: Environment, run_id: str, queue: str = "q") -> None:
    assert await run_state(rq, env, run_id) is None
    stats = await rq.queue_stats(env, queue)
    assert (stats.queued, stats.running) == (0, 0)
    shard = rq.keys.shard(rq.keys.shard_of(env))
    assert await rq.client.zscore(shard.ttl, f"{env.id}:{run_id}") is None


async def test_dequeue_never_delivers_an_expired_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=1_000, now_ms=T0)

    assert await rq.dequeue(10, now_ms=T0 + 1_000) == []

    await assert_gone(rq, env, "r1")
    assert await heads(rq, env) == {}
    assert await expired(rq, env) == [("r1", None)]
    info = await rq.get_run(env, "r1")
    assert info is not None
    assert (info.status, info.queue, info.finished_at_ms) == (RunStatus.EXPIRED, "q", T0 + 1_000)


async def test_expire_ttl_reports_runs_nobody_dequeued(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=1_000, now_ms=T0)
    await rq.enqueue(env, "q", "r2", ttl_ms=5_000, now_ms=T0)

    assert await rq.expire_ttl(now_ms=T0 + 999) == 0
    assert await rq.expire_ttl(now_ms=T0 + 1_000) == 1

    assert await run_state(rq, env, "r1") is None
    assert await run_state(rq, env, "r2") == "queued"
    assert await expired(rq, env) == [("r1", None)]
    assert [d.run_id for d in await rq.dequeue(10, now_ms=T0 + 1_000)] == ["r2"]


async def test_each_expiry_is_recorded_once_as_it_happens(
    make_queue: Any, env: Environment
) -> None:
    """(Was: the expiry stream resumes after its positions.) Each expiry adds one recent
    entry and one outcome, at the moment it happens, and nothing for later calls."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=10, now_ms=T0)
    await rq.expire_ttl(now_ms=T0 + 10)
    assert await expired(rq, env) == [("r1", None)]

    await rq.expire_ttl(now_ms=T0 + 20)
    assert await expired(rq, env) == [("r1", None)]

    await rq.enqueue(env, "q", "r2", ttl_ms=10, now_ms=T0)
    await rq.expire_ttl(now_ms=T0 + 10)
    assert await expired(rq, env) == [("r1", None), ("r2", None)]


async def test_expired_head_does_not_block_the_runs_behind_it(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "old", ttl_ms=500, now_ms=T0)
    await rq.enqueue(env, "q", "young", now_ms=T0 + 1)

    got = await rq.dequeue(1, now_ms=T0 + 600)

    assert [d.run_id for d in got] == ["young"]
    assert await expired(rq, env) == [("old", None)]


async def test_delivered_run_loses_its_ttl(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=100_000)
    await rq.enqueue(env, "q", "r1", ttl_ms=1_000, now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0 + 500)

    assert await rq.expire_ttl(now_ms=T0 + 5_000) == 0
    assert await run_state(rq, env, "r1") == "running"

    # requeued by a nack, it stays deliverable long after the old deadline
    await rq.nack(d, retry_at_ms=T0 + 6_000, now_ms=T0 + 5_000)
    assert await rq.expire_ttl(now_ms=T0 + 60_000) == 0
    (again,) = await rq.dequeue(1, now_ms=T0 + 60_000)
    assert again.run_id == "r1"
    assert await expired(rq, env) == []


async def test_nack_after_the_ttl_deadline_requeues_fine(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=1_000, now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0 + 100)

    assert await rq.nack(d, retry_at_ms=T0 + 2_000, now_ms=T0 + 2_000) is NackOutcome.REQUEUED

    (again,) = await rq.dequeue(1, now_ms=T0 + 2_000)
    assert (again.run_id, again.attempt) == ("r1", 1)


async def test_reclaimed_run_does_not_regain_its_ttl(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(lease_ms=1_000)
    await rq.enqueue(env, "q", "r1", ttl_ms=1_500, now_ms=T0)
    await rq.dequeue(1, now_ms=T0)
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 1_000) == 1

    assert await rq.expire_ttl(now_ms=T0 + 2_000) == 0
    (again,) = await rq.dequeue(1, now_ms=T0 + 2_000)
    assert again.run_id == "r1"


async def test_keyed_run_expiry_cleans_its_variant(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="a:b", ttl_ms=100, now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="c", ttl_ms=100, now_ms=T0)

    assert await rq.expire_ttl(now_ms=T0 + 100) == 2

    q = rq.keys.queue(env, "q")
    assert await rq.client.zcard(q.ck_index) == 0
    assert await heads(rq, env) == {}
    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.variants) == (0, [])
    assert sorted(await expired(rq, env)) == [("r1", "a:b"), ("r2", "c")]


async def test_keyed_run_expires_through_dequeue_too(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="k", ttl_ms=100, now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="k", now_ms=T0 + 1)

    got = await rq.dequeue(10, now_ms=T0 + 200)

    assert [d.run_id for d in got] == ["r2"]
    assert await expired(rq, env) == [("r1", "k")]
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (0, 1)


async def test_delayed_run_whose_ttl_passes_first_expires(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", delay_ms=5_000, ttl_ms=1_000, now_ms=T0)
    assert await rq.dequeue(10, now_ms=T0 + 5_000) == []
    await assert_gone(rq, env, "r1")
    assert await expired(rq, env) == [("r1", None)]


async def test_expiry_is_reported_once(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=100, now_ms=T0)
    assert await rq.dequeue(10, now_ms=T0 + 100) == []
    assert await rq.expire_ttl(now_ms=T0 + 200) == 0
    assert len(await expired(rq, env)) == 1


async def test_expired_run_id_can_be_enqueued_again(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", ttl_ms=100, now_ms=T0)
    await rq.expire_ttl(now_ms=T0 + 100)
    await rq.enqueue(env, "q", "r1", now_ms=T0 + 200)
    (d,) = await rq.dequeue(1, now_ms=T0 + 200)
    assert (d.run_id, d.lease_token) == ("r1", 1)

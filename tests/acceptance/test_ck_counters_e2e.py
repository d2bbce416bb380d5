"""End to end: the seed's live check of CK counters and the atomic queue size limit.

Seed 003 verified, against a live environment: 24 keyed enqueues across 4 variants
with 8 started → Queued 16 / Running 8; with a size limit of 16, 12 more enqueues → 8
accepted and 4 rejected; with the counter deleted while 31 runs sat in variants, one
more enqueue → the counter read 32 (31 seeded, then counted).

Ported to the rewritten store: ``rq.run_state`` moved to ``tests/state.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from tests.state import run_state

from fairq.errors import QueueSizeLimitExceededError
from fairq.keys import Environment
from fairq.models import AckStatus, Delivery, EnqueueRequest, EnqueueStatus
from fairq.store import RunQueue

MakeQueue = Callable[..., Awaitable[RunQueue]]

T0 = 1_000_000
QUEUE = "task/report"
VARIANTS = ("tenant-a", "tenant-b", "tenant-c", "tenant-d")


async def start(rq: RunQueue, count: int, now: int) -> list[Delivery]:
    """Start ``count`` runs the way workers do (the shard dequeue, several calls)."""
    started: list[Delivery] = []
    while len(started) < count:
        got = await rq.dequeue(count - len(started), now_ms=now)
        assert got, "nothing left to start"
        started.extend(got)
    return started


async def counters(rq: RunQueue, env: Environment) -> tuple[int | None, int | None]:
    q = rq.keys.queue(env, QUEUE)
    raw = await rq.client.mget([q.ck_queued_counter, q.ck_running_counter])
    return tuple(None if v is None else int(v) for v in raw)  # type: ignore[return-value]


async def set_limit(rq: RunQueue, env: Environment, scope: str, limit: int | None) -> None:
    if scope == "queue":
        await rq.set_queue_size_limit(env, QUEUE, limit)
    else:
        await rq.remove_env_limits(env)
        if limit is not None:
            await rq.set_env_limits(env, queue_size_limit=limit)


@pytest.mark.parametrize("scope", ["queue", "env"])
async def test_seed_end_to_end(make_queue: MakeQueue, env: Environment, scope: str) -> None:
    """The seed's three observations, with the limit set on the queue or as the
    environment's default.

    Between the first and second observation the seed's live system kept working: with
    16 queued and a limit of 16 no enqueue could have been accepted, so 8 accepted means
    8 runs had left the queue. We make that explicit: the 8 started runs finish and
    workers start 8 more (Queued 8 / Running 8), and we also show the limit refusing a
    run while the queue sits at 16.
    """
    rq = await make_queue()
    q = rq.keys.queue(env, QUEUE)
    now = T0

    # 1. 24 keyed enqueues across 4 variants, 8 started → Queued 16 / Running 8
    for i in range(24):
        await rq.enqueue(
            env, QUEUE, f"run-{i}", {"i": i}, concurrency_key=VARIANTS[i % 4], now_ms=now
        )
    first = await start(rq, 8, now + 1)
    stats = await rq.queue_stats(env, QUEUE, breakdown=True)
    assert (stats.queued, stats.running) == (16, 8)
    assert {v.concurrency_key: (v.queued, v.running) for v in stats.variants} == {
        ck: (4, 2) for ck in VARIANTS
    }
    assert await counters(rq, env) == (16, 8)
    (listed,) = await rq.queues_stats(env, [QUEUE])
    assert (listed.queued, listed.running) == (16, 8)

    # at 16 queued, a limit of 16 refuses the next run
    await set_limit(rq, env, scope, 16)
    with pytest.raises(QueueSizeLimitExceededError):
        await rq.enqueue(env, QUEUE, "refused-at-16", None, concurrency_key="tenant-a", now_ms=now)

    # the live system moves on: the 8 started runs finish, workers start 8 more
    assert await rq.ack(first, now_ms=now + 2) == [AckStatus.ACKED] * 8
    second = await start(rq, 8, now + 3)
    assert len(second) == 8
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.queued, stats.running, stats.queue_size_limit) == (8, 8, 16)

    # 2. limit 16, 12 more enqueues → 8 accepted, 4 rejected (nothing written for those)
    accepted: list[str] = []
    rejected: list[QueueSizeLimitExceededError] = []
    for i in range(12):
        run_id = f"more-{i}"
        try:
            status = await rq.enqueue(
                env, QUEUE, run_id, {"i": i}, concurrency_key=VARIANTS[i % 4], ttl_ms=60_000,
                now_ms=now + 4,
            )  # fmt: skip
        except QueueSizeLimitExceededError as exc:
            rejected.append(exc)
            assert await run_state(rq, env, run_id) is None
            for ck in VARIANTS:
                assert await rq.client.zscore(q.variant_queued(ck), run_id) is None
        else:
            assert status is EnqueueStatus.ENQUEUED
            accepted.append(run_id)
    assert (len(accepted), len(rejected)) == (8, 4)
    assert accepted == [f"more-{i}" for i in range(8)]
    for exc in rejected:
        assert (exc.queue, exc.maximum_size) == (QUEUE, 16)
        assert "16" in str(exc)
    shard = rq.keys.shard(rq.keys.shard_of(env))
    assert await rq.client.zcard(shard.ttl) == 8  # only accepted runs carry a TTL entry
    assert await counters(rq, env) == (16, 8)
    assert (await rq.queue_stats(env, QUEUE)).queued == 16

    # 3. the counter deleted while 31 runs sit in variants; one more enqueue → 32
    await set_limit(rq, env, scope, None)
    for i in range(15):
        await rq.enqueue(
            env, QUEUE, f"fill-{i}", None, concurrency_key=VARIANTS[i % 4], now_ms=now + 5
        )
    assert (await rq.queue_stats(env, QUEUE)).queued == 31
    await rq.client.delete(q.ck_queued_counter)
    await rq.enqueue(env, QUEUE, "the-32nd", None, concurrency_key="tenant-e", now_ms=now + 6)
    assert (await counters(rq, env))[0] == 32
    assert 86_390 <= await rq.client.ttl(q.ck_queued_counter) <= 86_400
    assert (await rq.queue_stats(env, QUEUE)).queued == 32


async def test_batch_enqueue_reports_each_item(make_queue: MakeQueue, env: Environment) -> None:
    """``enqueue_many`` never raises for the limit: each item is enqueued, a duplicate,
    or rejected; duplicates take no room; keyless and keyed runs share the limit."""
    rq = await make_queue()
    await rq.set_queue_size_limit(env, QUEUE, 6)
    for i in range(2):
        await rq.enqueue(env, QUEUE, f"pre-{i}", None, concurrency_key="tenant-a", now_ms=T0)
    batch = [
        EnqueueRequest(env, QUEUE, "pre-0", concurrency_key="tenant-a"),  # duplicate
        EnqueueRequest(env, QUEUE, "b-0", concurrency_key="tenant-b"),
        EnqueueRequest(env, QUEUE, "b-1"),  # keyless
        EnqueueRequest(env, QUEUE, "b-2", concurrency_key="tenant-c"),
        EnqueueRequest(env, QUEUE, "b-1"),  # duplicate within the batch
        EnqueueRequest(env, QUEUE, "b-3", concurrency_key="tenant-b"),
        EnqueueRequest(env, QUEUE, "b-4", concurrency_key="tenant-d"),  # 7th: over
        EnqueueRequest(env, QUEUE, "b-5"),  # over
        EnqueueRequest(env, "elsewhere", "b-6", concurrency_key="tenant-a"),  # other queue
    ]
    results = await rq.enqueue_many(batch, now_ms=T0 + 1)
    assert [r.run_id for r in results] == [r.run_id for r in batch]
    E, D, R = EnqueueStatus.ENQUEUED, EnqueueStatus.DUPLICATE, EnqueueStatus.REJECTED
    assert [r.status for r in results] == [D, E, E, E, D, E, R, R, E]
    assert [r.queue_size_limit for r in results if r.status is R] == [6, 6]
    assert await run_state(rq, env, "b-4") is None
    assert await run_state(rq, env, "b-5") is None
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.queued, stats.queue_size_limit) == (6, 6)
    assert (await counters(rq, env))[0] == 5


async def test_env_default_size_limit(make_queue: MakeQueue, env: Environment) -> None:
    """The environment's ``queue_size_limit`` applies to each queue without its own; a
    queue limit overrides it (0 = no cap); the configured default applies last."""
    rq = await make_queue(default_queue_size_limit=3)
    await rq.set_env_limits(env, queue_size_limit=2)
    for queue in ("q1", "q2"):  # per queue, not env-wide
        for i in range(2):
            await rq.enqueue(env, queue, f"{queue}-{i}", None, concurrency_key="k", now_ms=T0)
        with pytest.raises(QueueSizeLimitExceededError) as info:
            await rq.enqueue(env, queue, f"{queue}-x", None, concurrency_key="k", now_ms=T0)
        assert (info.value.queue, info.value.maximum_size) == (queue, 2)
    assert (await rq.env_stats(env)).queue_size_limit == 2
    assert (await rq.queue_stats(env, "q1")).queue_size_limit == 2

    await rq.set_queue_size_limit(env, "q1", 3)  # the queue's own limit wins
    assert await rq.enqueue(env, "q1", "q1-2", None, concurrency_key="k", now_ms=T0) is (
        EnqueueStatus.ENQUEUED
    )
    with pytest.raises(QueueSizeLimitExceededError):
        await rq.enqueue(env, "q1", "q1-3", None, now_ms=T0)
    await rq.set_queue_size_limit(env, "q1", 0)  # 0 = no cap, even under an env default
    for i in range(3, 8):
        await rq.enqueue(env, "q1", f"q1-{i}", None, concurrency_key="k", now_ms=T0)

    await rq.remove_env_limits(env)  # back to the configured default (3)
    assert await rq.enqueue(env, "q2", "q2-2", None, now_ms=T0) is EnqueueStatus.ENQUEUED
    with pytest.raises(QueueSizeLimitExceededError) as info:
        await rq.enqueue(env, "q2", "q2-3", None, concurrency_key="k", now_ms=T0)
    assert info.value.maximum_size == 3

"""Enqueue: runs land in their queue (or CK variant), idempotently, in score order."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from tests.integration.commandstats import command_counts, reset_stats, script_calls
from tests.state import run_state

from fairq import RunQueueConfig
from fairq import keys as K
from fairq.errors import QueueSizeLimitExceededError
from fairq.keys import Environment
from fairq.models import AckStatus, EnqueueRequest, EnqueueStatus
from fairq.server import connect
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def master_members(rq: RunQueue, env: Environment) -> dict[str, float]:
    shard = rq.keys.shard(rq.keys.shard_of(env))
    return {m.decode(): s for m, s in await rq.client.zrange(shard.heads, 0, -1, withscores=True)}


async def test_enqueue_makes_a_run_queued(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    status = await rq.enqueue(env, "task/a", "r1", {"x": 1}, now_ms=T0)

    assert status is EnqueueStatus.ENQUEUED
    assert await run_state(rq, env, "r1") == "queued"
    stats = await rq.queue_stats(env, "task/a")
    assert (stats.queued, stats.running, stats.oldest_score_ms) == (1, 0, T0)
    assert await master_members(rq, env) == {K.heads_member("q", env, "task/a"): T0}
    assert await rq.environments() == [env]
    assert await rq.queues(env) == ["task/a"]
    assert min((await master_members(rq, env)).values()) == T0


async def test_enqueued_run_is_delivered_with_its_payload(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    payload = {"text": "héllo ✓", "n": [1, 2.5, None, True], "nested": {"a": {}}}
    await rq.enqueue(env, "q", "r1", payload, now_ms=T0)

    (d,) = await rq.dequeue(10, now_ms=T0)

    assert (d.env, d.queue, d.run_id, d.concurrency_key) == (env, "q", "r1", None)
    assert d.payload == payload
    assert (d.attempt, d.lease_token, d.score_ms, d.enqueued_at_ms) == (0, 1, T0, T0)


@pytest.mark.parametrize("payload", [None, 0, "text", [1, "a"], {"k": None}])
async def test_any_json_payload_round_trips(
    make_queue: Any, env: Environment, payload: object
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", payload, now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    assert d.payload == payload


async def test_enqueue_of_an_existing_run_id_is_a_no_op(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", "first", now_ms=T0)

    again = await rq.enqueue(env, "q", "r1", "second", delay_ms=5_000, now_ms=T0 + 10)
    other_queue = await rq.enqueue(env, "other", "r1", "third", now_ms=T0 + 20)

    assert again is other_queue is EnqueueStatus.DUPLICATE
    assert (await rq.queue_stats(env, "q")).queued == 1
    assert (await rq.queue_stats(env, "other")).queued == 0
    (d,) = await rq.dequeue(10, now_ms=T0)
    assert (d.payload, d.score_ms) == ("first", T0)


async def test_enqueue_of_a_running_run_id_changes_nothing(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", "first", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)

    assert await rq.enqueue(env, "q", "r1", "again", now_ms=T0 + 1) is EnqueueStatus.DUPLICATE

    assert await run_state(rq, env, "r1") == "running"
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (0, 1)
    assert (await rq.env_stats(env)).running == 1
    assert await rq.dequeue(10, now_ms=T0 + 1) == []
    assert await rq.ack([d]) == [AckStatus.ACKED]


async def test_enqueue_of_a_dead_lettered_run_id_changes_nothing(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    await rq.nack(d, max_attempts=1, now_ms=T0)

    assert await rq.enqueue(env, "q", "r1", now_ms=T0 + 1) is EnqueueStatus.DUPLICATE
    assert await run_state(rq, env, "r1") == "dlq"
    assert (await rq.queue_stats(env, "q")).queued == 0


async def _has_command(rq: RunQueue, name: str) -> bool:
    names = await rq.client.command_list()
    return name.lower() in {n.decode() if isinstance(n, bytes) else n for n in names}


async def test_a_keyless_enqueue_creates_its_run_in_one_command_where_the_server_has_hsetex(
    make_queue: Any, env: Environment
) -> None:
    """The duplicate check and the run hash are one HSETEX ... FNX (where the server has
    it): a keyless enqueue into a queue that already holds runs, in an environment with
    no options, is the script, its probe of the config (HLEN: no fields, nothing to
    read), the hash, the queue's ZADD and the heads index's ZADD LT (no TIME: a logical
    clock)."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "first", now_ms=T0)
    await reset_stats(rq.client)
    assert await rq.enqueue(env, "q", "second", now_ms=T0 + 1) is EnqueueStatus.ENQUEUED
    counts = await command_counts(rq.client)
    if await _has_command(rq, "HSETEX"):
        assert counts == {"fcall": 1, "hlen": 1, "hsetex": 1, "zadd": 2}
    else:
        assert counts == {"fcall": 1, "hlen": 1, "exists": 1, "hset": 1, "zadd": 2}
    await reset_stats(rq.client)
    assert await rq.enqueue(env, "q", "second", now_ms=T0 + 2) is EnqueueStatus.DUPLICATE
    counts = await command_counts(rq.client)
    assert "zadd" not in counts and "hset" not in counts  # nothing written


@pytest.mark.single_server  # one ACL user on one server
async def test_a_user_who_may_not_run_hsetex_enqueues_by_exists_and_hset(
    redis_url: str, prefix: str, env: Environment
) -> None:
    """Where HSETEX is missing (an older server) or denied, the script falls back to
    EXISTS + HSET: runs are created, duplicates (queued, running) are still refused, and
    the queue holds each run once."""
    admin = await connect(redis_url)
    user = f"nohsetex-{prefix}"
    await admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-hsetex")
    host = redis_url.split("//", 1)[1]
    rq = RunQueue(await connect(f"redis://{user}:pw@{host}"), RunQueueConfig(prefix=prefix))
    try:
        assert await rq.enqueue(env, "q", "r1", "first", now_ms=T0) is EnqueueStatus.ENQUEUED
        assert await rq.enqueue(env, "q", "r1", "again", now_ms=T0) is EnqueueStatus.DUPLICATE
        assert await rq.enqueue(env, "q", "r2", now_ms=T0 + 1) is EnqueueStatus.ENQUEUED
        (d,) = await rq.dequeue(1, now_ms=T0 + 1)
        assert (d.run_id, d.payload) == ("r1", "first")
        assert await rq.enqueue(env, "q", "r1", now_ms=T0 + 2) is EnqueueStatus.DUPLICATE
        stats = await rq.queue_stats(env, "q")
        assert (stats.queued, stats.running) == (1, 1)
        assert await run_state(rq, env, "r1") == "running"
    finally:
        await rq.purge()
        await rq.close()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_runs_are_served_in_score_order(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    for i, offset in enumerate([30, 10, 20, 0]):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0 + offset)
    got = [d.run_id for d in await rq.dequeue(10, now_ms=T0 + 100)]
    assert got == ["r3", "r1", "r2", "r0"]


async def test_delay_hides_a_run_until_it_is_due(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "later", delay_ms=5_000, now_ms=T0)
    await rq.enqueue(env, "q", "at", available_at_ms=T0 + 2_000, now_ms=T0)

    assert await rq.dequeue(10, now_ms=T0 + 1_999) == []
    assert min((await master_members(rq, env)).values()) == T0 + 2_000
    assert (await rq.dequeue_batch(10, now_ms=T0 + 1_999)).wait_ms == 1
    assert [d.run_id for d in await rq.dequeue(10, now_ms=T0 + 2_000)] == ["at"]
    assert await rq.dequeue(10, now_ms=T0 + 4_999) == []
    (d,) = await rq.dequeue(10, now_ms=T0 + 5_000)
    assert (d.run_id, d.score_ms, d.enqueued_at_ms) == ("later", T0 + 5_000, T0)


async def test_available_at_overrides_delay(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r", delay_ms=9_000, available_at_ms=T0 + 1_000, now_ms=T0)
    assert (await rq.queue_stats(env, "q")).oldest_score_ms == T0 + 1_000


async def test_priority_orders_a_run_as_if_it_were_older(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "old", now_ms=T0)
    await rq.enqueue(env, "q", "urgent", head_start_ms=60_000, now_ms=T0 + 1_000)

    got = await rq.dequeue(10, now_ms=T0 + 1_000)

    assert [d.run_id for d in got] == ["urgent", "old"]
    assert got[0].score_ms == T0 + 1_000 - 60_000


async def test_enqueue_with_a_concurrency_key(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="tenant-a", now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="tenant-a", now_ms=T0 + 1)
    await rq.enqueue(env, "q", "r3", concurrency_key="tenant:b", now_ms=T0 + 2)
    await rq.enqueue(env, "q", "r4", now_ms=T0 + 3)

    stats = await rq.queue_stats(env, "q", breakdown=True)

    assert (stats.queued, stats.running, stats.oldest_score_ms) == (4, 0, T0)
    by_key = {v.concurrency_key: (v.queued, v.oldest_score_ms) for v in stats.variants}
    assert by_key == {"tenant-a": (2, T0), "tenant:b": (1, T0 + 2)}


async def test_enqueue_many_reports_each_run_in_order(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(shard_count=4)
    envs = [Environment("o", "p", f"env{i}") for i in range(4)]
    requests = [
        EnqueueRequest(
            envs[i % 4], f"q{i % 3}", f"r{i}", i, concurrency_key=("k" if i % 2 else None)
        )
        for i in range(12)
    ]
    requests.append(EnqueueRequest(envs[0], "q0", "r0", "duplicate"))

    results = await rq.enqueue_many(requests, now_ms=T0)

    assert [r.run_id for r in results] == [r.run_id for r in requests]
    assert [r.status for r in results] == [EnqueueStatus.ENQUEUED] * 12 + [EnqueueStatus.DUPLICATE]
    assert sorted(await rq.environments()) == sorted(envs)
    delivered = []
    for _ in range(20):
        batch = await rq.dequeue(100, now_ms=T0)
        if not batch:
            break
        delivered += batch
    assert sorted(d.run_id for d in delivered) == sorted(f"r{i}" for i in range(12))
    assert {d.run_id: d.payload for d in delivered} == {f"r{i}": i for i in range(12)}


async def test_queue_size_limit_rejects_without_writing(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_size_limit(env, "q", 2)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="k", now_ms=T0)

    with pytest.raises(QueueSizeLimitExceededError) as info:
        await rq.enqueue(env, "q", "r3", now_ms=T0)

    assert (info.value.queue, info.value.maximum_size) == ("q", 2)
    assert await run_state(rq, env, "r3") is None
    assert (await rq.queue_stats(env, "q")).queued == 2
    results = await rq.enqueue_many([EnqueueRequest(env, "q", "r4")], now_ms=T0)
    assert results[0].status is EnqueueStatus.REJECTED
    assert results[0].queue_size_limit == 2
    # a dequeue makes room again
    await rq.dequeue(1, now_ms=T0)
    assert await rq.enqueue(env, "q", "r3", now_ms=T0) is EnqueueStatus.ENQUEUED


async def test_env_queue_size_limit_applies_to_each_queue(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, queue_size_limit=1)
    await rq.enqueue(env, "a", "r1", now_ms=T0)
    await rq.enqueue(env, "b", "r2", now_ms=T0)
    with pytest.raises(QueueSizeLimitExceededError):
        await rq.enqueue(env, "a", "r3", now_ms=T0)
    # a queue's own limit wins over the env's
    await rq.set_queue_size_limit(env, "a", 5)
    assert await rq.enqueue(env, "a", "r3", now_ms=T0) is EnqueueStatus.ENQUEUED
    # removing the queue limit falls back to the env's
    await rq.set_queue_size_limit(env, "a", None)
    with pytest.raises(QueueSizeLimitExceededError):
        await rq.enqueue(env, "a", "r4", now_ms=T0)


async def test_environments_on_many_shards_are_all_listed(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(shard_count=8)
    envs = [Environment("o1234", "p1234", name) for name in ("env1", "env2", "env3", "e1234")]
    for e in envs:
        await rq.enqueue(e, "q", "r", now_ms=T0)
    assert await rq.environments() == sorted(envs)
    assert len({rq.keys.shard_of(e) for e in envs}) > 1
    got = await rq.dequeue(10, now_ms=T0)
    assert sorted(d.env for d in got) == sorted(envs)


# ------------------------------------------------------------ group commit (enqueue_one)


async def test_a_sequential_caller_sends_each_run_at_once(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue_one(EnqueueRequest(env, "gc", "warm"), now_ms=1_000)
    await reset_stats(rq.client)
    for i in range(20):
        result = await rq.enqueue_one(EnqueueRequest(env, "gc", f"s{i}"), now_ms=1_000)
        assert result.status is EnqueueStatus.ENQUEUED
    assert await script_calls(rq.client) == 20


async def test_calls_made_while_one_is_in_flight_go_together(
    make_queue: Any, env: Environment
) -> None:
    """200 concurrent callers: the first is sent at once, the other 199 wait for it and
    go in one more script call; each gets its own result, a size-limit rejection only
    for the runs past the limit, and a duplicate only for its own repeated id."""
    rq: RunQueue = await make_queue()
    await rq.set_queue_size_limit(env, "gc", 150)
    await rq.enqueue_one(EnqueueRequest(env, "gc", "c0"), now_ms=1_000)  # c0: a duplicate
    await reset_stats(rq.client)
    results = await asyncio.gather(
        *(rq.enqueue_one(EnqueueRequest(env, "gc", f"c{i}"), now_ms=1_000) for i in range(200))
    )
    assert await script_calls(rq.client) == 2
    assert [r.run_id for r in results] == [f"c{i}" for i in range(200)]
    statuses = [r.status for r in results]
    assert statuses[0] is EnqueueStatus.DUPLICATE
    assert statuses[1:150] == [EnqueueStatus.ENQUEUED] * 149
    assert statuses[150:] == [EnqueueStatus.REJECTED] * 50
    assert (await rq.queue_stats(env, "gc")).queued == 150


async def test_callers_waiting_on_a_cancelled_call_are_still_sent(
    make_queue: Any, env: Environment
) -> None:
    """The caller whose call is in flight is cancelled: the callers that waited for it
    are sent all the same, and each gets its own result."""
    rq: RunQueue = await make_queue()
    leader = asyncio.create_task(rq.enqueue_one(EnqueueRequest(env, "gc2", "f0"), now_ms=1_000))
    await asyncio.sleep(0)  # the leader's call is now in flight
    waiting = [
        asyncio.create_task(rq.enqueue_one(EnqueueRequest(env, "gc2", f"f{i}"), now_ms=1_000))
        for i in range(1, 5)
    ]
    await asyncio.sleep(0)
    leader.cancel()
    results = await asyncio.gather(*waiting)
    assert [r.status for r in results] == [EnqueueStatus.ENQUEUED] * 4
    with contextlib.suppress(asyncio.CancelledError):
        await leader  # cancelled (a cluster client may finish its command first)
    for i in range(1, 5):
        assert await run_state(rq, env, f"f{i}") == "queued"

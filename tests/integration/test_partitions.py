"""An environment spread over several partitions: placement, serving, finishing, reading,
settings and the migration from one partition, on a real server (a 3-master cluster
under ``FAIRQ_TEST_CLUSTER=3``, where the partitions land on different masters).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from fairq.consumer import Consumer
from fairq.errors import ConfigurationError, InvalidLimitError
from fairq.keys import Environment, encode_tenant, tenant_partition
from fairq.models import AckStatus, CancelOutcome, Delivery, EnqueueRequest, NackOutcome
from fairq.server import is_cluster_url
from fairq.store import RunQueue
from fairq.store.blocking import BlockingEnqueuer

QUEUE = "jobs"
NOW = 1_000_000
TENANTS = [f"tenant{i}" for i in range(24)]


async def spread_queue(
    make_queue: Any, env: Environment, partitions: int, **config: Any
) -> RunQueue:
    rq: RunQueue = await make_queue(shard_count=8, **config)
    await rq.set_partitions(env, partitions)
    return rq


async def enqueue_tenants(rq: RunQueue, env: Environment, per_tenant: int = 2) -> list[str]:
    requests = [
        EnqueueRequest(env, QUEUE, f"r-{t}-{i}", {"t": t}, tenant=t)
        for t in TENANTS
        for i in range(per_tenant)
    ]
    await rq.enqueue_many(requests, now_ms=NOW)
    return [r.run_id for r in requests]


async def drain(rq: RunQueue, *, max_count: int, **where: Any) -> list[Delivery]:
    """Dequeue (and ack, each acked) until nothing comes; every delivery, in order."""
    served: list[Delivery] = []
    for _ in range(1_000):
        batch = await rq.dequeue(max_count, now_ms=NOW, **where)
        if not batch:
            return served
        served += batch
        assert await rq.ack(batch, now_ms=NOW) == [AckStatus.ACKED] * len(batch)
    raise AssertionError("the queue never drained")


async def run_key_exists(rq: RunQueue, env: Environment, partition: int, run_id: str) -> bool:
    return bool(await rq.client.exists(rq.keys.env(env, partition).message(run_id)))


async def test_one_partition_is_todays_layout_and_writes_no_placement_key(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(shard_count=8)
    await rq.enqueue(env, QUEUE, "r1", tenant="acme", now_ms=NOW)
    assert await rq.client.exists(f"{rq.keys.tag(rq.keys.shard_of(env))}:m:{env.id}:r1") == 1
    (d,) = await rq.dequeue(5, env=env, queues=[QUEUE], now_ms=NOW)
    assert d.partition == 0
    assert await rq.ack([d], now_ms=NOW) == [AckStatus.ACKED]
    assert await rq.client.exists(rq.keys.placement) == 0


async def test_runs_go_to_their_tenants_partition(make_queue: Any, env: Environment) -> None:
    rq = await spread_queue(make_queue, env, 3)
    await enqueue_tenants(rq, env, per_tenant=1)
    used = Counter()
    for t in TENANTS:
        p = tenant_partition(encode_tenant(t), "", 3)
        used[p] += 1
        assert await run_key_exists(rq, env, p, f"r-{t}-0")
        for other in {0, 1, 2} - {p}:
            assert not await run_key_exists(rq, env, other, f"r-{t}-0")
    assert set(used) == {0, 1, 2}
    # keyed runs without a tenant follow their key (the key is their tenant)
    await rq.enqueue(env, QUEUE, "keyed", concurrency_key="tenant5", now_ms=NOW)
    assert await run_key_exists(rq, env, tenant_partition("tenant5", "", 3), "keyed")
    # keyless runs without a tenant stay in partition 0
    await rq.enqueue(env, QUEUE, "plain", now_ms=NOW)
    assert await run_key_exists(rq, env, 0, "plain")


async def test_the_partitions_are_distinct_shards_and_distinct_masters_on_a_cluster(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 6)
    shards = rq.keys.partition_shards(env, 6)
    assert len(set(shards)) == 6
    assert shards[0] == rq.keys.shard_of(env)
    assert rq.keys.partition_shards(env, 3) == shards[:3]
    if isinstance(rq.client, RedisCluster):
        nodes = {rq.client.get_node_from_key(rq.keys.shard(s).heads).name for s in shards}
        assert len(nodes) > 1


async def test_a_worker_serves_every_partition_and_finishes_in_the_right_one(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 3)
    runs = await enqueue_tenants(rq, env)
    served = await drain(rq, max_count=7, env=env, queues=[QUEUE])
    assert sorted(d.run_id for d in served) == sorted(runs)
    assert {d.partition for d in served} == {0, 1, 2}
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.queued, stats.running, stats.partitions) == (0, 0, 3)


async def test_a_consumer_of_every_shard_serves_every_partition(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 3)
    runs = await enqueue_tenants(rq, env)
    served = await drain(rq, max_count=10)
    assert sorted(d.run_id for d in served) == sorted(runs)


async def test_nack_heartbeat_and_release_reach_the_runs_partition(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 3)
    await enqueue_tenants(rq, env, per_tenant=1)
    batch = await rq.dequeue(30, env=env, queues=[QUEUE], now_ms=NOW)
    assert {d.partition for d in batch} == {0, 1, 2}
    assert all(s.name == "EXTENDED" for s in await rq.heartbeat(batch, now_ms=NOW))
    assert all(s.name == "RELEASED" for s in await rq.release(batch, now_ms=NOW))
    far = next(d for d in batch if d.partition == 2)
    assert await rq.nack(far, retry_delay_ms=0, now_ms=NOW) is NackOutcome.REQUEUED
    (again,) = await rq.dequeue(5, env=env, queues=[QUEUE], now_ms=NOW + 1)
    assert (again.run_id, again.partition, again.attempt) == (far.run_id, 2, 1)


async def test_readers_sum_and_merge_the_partitions(make_queue: Any, env: Environment) -> None:
    rq = await spread_queue(make_queue, env, 3)
    await enqueue_tenants(rq, env)
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.queued, stats.running) == (2 * len(TENANTS), 0)
    batch = await rq.dequeue(10, env=env, queues=[QUEUE], now_ms=NOW)
    env_stats = await rq.env_stats(env)
    assert (env_stats.running, env_stats.partitions) == (10, 3)
    assert await rq.queues(env) == [QUEUE]
    # a run is found by its id in whichever partition holds it
    far = next(t for t in TENANTS if tenant_partition(encode_tenant(t), "", 3) == 2)
    info = await rq.get_run(env, f"r-{far}-1")
    assert info is not None and info.tenant == far
    assert await rq.cancel(env, f"r-{far}-1", now_ms=NOW) is CancelOutcome.CANCELLED
    assert await rq.get_run(env, "never") is None
    # dead letters of every partition, oldest first
    for d in batch[:4]:
        await rq.nack(d, max_attempts=1, now_ms=NOW + 10 * batch.index(d))
    letters = await rq.dead_letters(env)
    assert [x.run_id for x in letters] == [d.run_id for d in batch[:4]]
    assert len({d.partition for d in batch[:4]}) >= 1
    await rq.redrive(env, batch[3].run_id, now_ms=NOW)
    assert [x.run_id for x in await rq.dead_letters(env)] == [d.run_id for d in batch[:3]]
    await rq.ack(batch[4:], now_ms=NOW)
    history = await rq.history(env, QUEUE, window_ms=60_000, now_ms=NOW)
    assert sum(b.served for b in history) == 10 + 0  # every partition's serves
    recent = await rq.recent_runs(env, QUEUE)
    assert {r.run_id for r in recent} >= {d.run_id for d in batch[4:]}


async def test_growing_copies_the_settings_and_drops_ones_removed_since(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(shard_count=8)
    await rq.set_queue_options(env, QUEUE, max_size=500, paused=True)
    await rq.set_key_concurrency(env, QUEUE, "k1", 2)
    await rq.set_tenant_weight(env, "acme", 3)
    await rq.set_env_weight(env, 2)
    await rq.set_partitions(env, 3)
    for p in (1, 2):
        e, q = rq.keys.env(env, p), rq.keys.queue(env, QUEUE, p)
        assert await rq.client.hget(e.config, f"q:{QUEUE}:max_size") == b"500"
        assert await rq.client.hget(e.config, f"q:{QUEUE}:paused") == b"1"
        assert await rq.client.hget(q.key_caps, "k1") == b"2"
        assert await rq.client.hget(e.tenant_weights, "acme") == b"3.0"
        shard = rq.keys.shard(rq.keys.partition_shard(env, p))
        assert await rq.client.hget(shard.env_weights, env.id) == b"2.0"
    # a change made now reaches every partition
    await rq.resume_queue(env, QUEUE)
    for p in range(3):
        assert await rq.client.hget(rq.keys.env(env, p).config, f"q:{QUEUE}:paused") is None
    # shrink, change partition 0 alone meanwhile, grow again: the stale setting goes
    await rq.set_partitions(env, 1, now_ms=NOW)
    await rq.set_partitions(env, 1, now_ms=NOW + 60_000)
    await rq.set_key_concurrency(env, QUEUE, "k1", None)
    await rq.set_partitions(env, 3)
    assert await rq.client.hget(rq.keys.queue(env, QUEUE, 2).key_caps, "k1") is None


async def test_shrinking_keeps_serving_the_old_partitions_until_they_drain(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 3)
    runs = await enqueue_tenants(rq, env, per_tenant=1)
    placement = await rq.set_partitions(env, 1, now_ms=NOW)
    assert (placement.partitions, placement.draining) == (1, 3)
    await rq.enqueue(env, QUEUE, "late", tenant=TENANTS[1], now_ms=NOW)
    assert await run_key_exists(rq, env, 0, "late")
    with pytest.raises(ConfigurationError, match="less than"):
        await rq.set_partitions(env, 1, now_ms=NOW + 1_000)
    with pytest.raises(ConfigurationError, match="still hold runs"):
        await rq.set_partitions(env, 1, now_ms=NOW + 60_000)
    served = await drain(rq, max_count=10, env=env, queues=[QUEUE])
    assert sorted(d.run_id for d in served) == sorted([*runs, "late"])
    done = await rq.set_partitions(env, 1, now_ms=NOW + 60_000)
    assert (done.partitions, done.draining) == (1, 0)
    assert await rq.client.hget(rq.keys.placement, env.id) is None


async def test_another_process_learns_the_placement(
    make_queue: Any, env: Environment, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = await spread_queue(make_queue, env, 3)
    producer: RunQueue = await make_queue(shard_count=8)
    assert (await producer.placement(env)).partitions == 3
    await admin.set_partitions(env, 1, now_ms=NOW)
    # its copy is kept for PLACEMENT_REFRESH_S, then read again
    assert (await producer.placement(env)).partitions == 3
    monkeypatch.setattr("fairq.store.placement.PLACEMENT_REFRESH_S", 0.0)
    assert (await producer.placement(env)).served == 3
    assert (await producer.placement(env)).partitions == 1


@pytest.mark.parametrize("bad", [0, -1, 9, 1.5, True, "3"])
async def test_a_bad_partition_count_is_refused_and_changes_nothing(
    make_queue: Any, env: Environment, bad: object
) -> None:
    rq: RunQueue = await make_queue(shard_count=8)
    with pytest.raises(InvalidLimitError, match="partition count"):
        await rq.set_partitions(env, bad)  # type: ignore[arg-type]
    assert await rq.client.exists(rq.keys.placement) == 0


async def test_a_consumer_waits_for_a_delayed_run_in_another_partition(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 3)
    far = next(t for t in TENANTS if tenant_partition(encode_tenant(t), "", 3) == 2)
    await rq.enqueue(env, QUEUE, "later", tenant=far, delay_ms=5_000, now_ms=NOW)
    batch = await rq.dequeue_batch(5, env=env, queues=[QUEUE], now_ms=NOW)
    assert (batch.deliveries, batch.wait_ms) == ([], 5_000)


async def test_a_consumer_of_the_environment_leases_from_every_partition(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread_queue(make_queue, env, 3)
    runs = await enqueue_tenants(rq, env)
    served: list[str] = []
    async with Consumer(rq, env=env, queues=[QUEUE], linger=0) as consumer:
        while len(served) < len(runs):
            batch = await consumer.next_batch(8, timeout=5)
            assert batch
            served += [d.run_id for d in batch]
            assert await rq.ack(batch) == [AckStatus.ACKED] * len(batch)
    assert sorted(served) == sorted(runs)


def test_the_cli_spreads_an_environment_and_shows_its_partitions(
    redis_url: str, prefix: str, env: Environment
) -> None:
    environ = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fairq", "partitions", *args],
            env=environ, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = cli(env.id, "3", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["partitions"] == 3 and [r["partition"] for r in data["rows"]] == [0, 1, 2]
    assert len({r["shard"] for r in data["rows"]}) == 3
    bad = cli(env.id, "0")
    assert bad.returncode == 1 and "partition count" in bad.stderr
    shown = cli(env.id)
    assert shown.returncode == 0 and "3 partition(s)" in shown.stdout


async def test_blocking_triggers_go_to_their_tenants_partition(
    make_queue: Any, env: Environment, redis_url: str
) -> None:
    if is_cluster_url(redis_url):
        pytest.skip("the blocking enqueuer serves one server (a cluster uses the event loop)")
    rq = await spread_queue(make_queue, env, 3)
    enqueuer = BlockingEnqueuer(rq, redis_url)
    try:
        for t in TENANTS[:6]:
            request = EnqueueRequest(env, QUEUE, f"b-{t}", {}, tenant=t)
            await asyncio.to_thread(enqueuer.enqueue_one, request)
    finally:
        enqueuer.close()
    for t in TENANTS[:6]:
        assert await run_key_exists(rq, env, tenant_partition(encode_tenant(t), "", 3), f"b-{t}")

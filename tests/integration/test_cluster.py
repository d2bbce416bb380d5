"""fairq on a Redis/Valkey Cluster: one slot per script call, every operation on a
3-master cluster, shards spread over the masters, consumers covering every shard.

The CROSSSLOT check runs on whatever server the session uses (it is a client-side
assertion over the KEYS every store method passes, plus a keyspace check that every key a
script wrote carries a shard's hash tag). The other tests need a cluster: they use the
session's cluster under ``FAIRQ_TEST_CLUSTER=N``, else start a 3-master one for this module.

Ported to the rewritten store: scripts live in ``fairq.store.scripts`` (one build per
order for the order-dependent ones, named ``op[age]`` / ``op[fair]``); the expiry stream
is gone (an expired run's outcome says ``expired``); ``next_due_ms`` is gone (nothing is
due when a dequeue brings nothing and knows of nothing held back: ``wait_ms is None``).
The exercise now also sets a limit (``configure``) and leases one flow directly
(``dequeue_variant``), so that every script is still called. Only the documented
global keys (``<prefix>:meta``, ``<prefix>:maintenance-lock``, never touched by a
script) may lack a shard's hash tag, and the placement record (``<prefix>:placement``),
since one environment of the exercise is spread over 3 partitions.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from fairq.cluster import EmbeddedCluster, shard_nodes
from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.models import (
    AckStatus,
    EnqueueRequest,
    HeartbeatStatus,
    NackOutcome,
    ReleaseStatus,
)
from fairq.outcomes import RunStatus
from fairq.server import connect, is_cluster_url
from fairq.store import RunQueue
from fairq.store.scripts import Script, registry, script_names, uses_order

#: Masters of the cluster these tests start when the session is not already a cluster.
MASTERS = 3
#: Shards per master: the documented rule (docs/cluster.md).
SHARDS_PER_MASTER = 8

NOW = 1_000_000


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster_url(redis_url: str) -> Iterator[str]:
    """A cluster: the session's (FAIRQ_TEST_CLUSTER) or a 3-master one for this module."""
    if is_cluster_url(redis_url):
        yield redis_url
        return
    with EmbeddedCluster(MASTERS) as cluster:
        yield cluster.url


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[RedisCluster]:
    client = await connect(cluster_url)
    assert isinstance(client, RedisCluster)
    yield client
    await client.aclose()


def masters_of(client: RedisCluster) -> list[str]:
    return sorted(n.name for n in client.get_nodes() if n.server_type == "primary")


async def cluster_queue(url: str, prefix: str, **overrides: Any) -> RunQueue:
    client = await connect(url)
    assert isinstance(client, RedisCluster)
    shards = SHARDS_PER_MASTER * len(masters_of(client))
    vtime = overrides.pop("vtime", None)
    config = RunQueueConfig(prefix=prefix, shard_count=shards, **overrides)
    if vtime is not None:
        config = config.with_vtime(**vtime)
    return RunQueue(client, config, rng=random.Random(11))


@pytest.fixture
def recorded_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Every script call made through the registry: ``(script name, KEYS)``."""
    calls: list[tuple[str, list[str]]] = []
    original = Script.__call__

    async def recording(self: Script, client: Any, keys: list[str], args: list[Any]) -> Any:
        calls.append((self.name, list(keys)))
        return await original(self, client, keys, args)

    monkeypatch.setattr(Script, "__call__", recording)
    return calls


async def nothing_due(rq: RunQueue, *, now_ms: int | None = None) -> bool:
    """Nothing queued anywhere: a dequeue over every shard brings nothing and knows of
    nothing held back (the old ``next_due_ms() is None``). Leases what it finds."""
    batch = await rq.dequeue_batch(50, now_ms=now_ms)
    return batch.deliveries == [] and batch.wait_ms is None


# --------------------------------------------------------------------------- workload


def environments(count: int) -> list[Environment]:
    return [Environment(f"org{i % 3}", f"proj{i % 2}", f"env-{i}") for i in range(count)]


def covering_environments(rq: RunQueue, per_shard: int) -> list[Environment]:
    """``per_shard`` environments on every shard of ``rq``."""
    chosen: dict[int, list[Environment]] = defaultdict(list)
    for env in environments(100 * per_shard * rq.keys.shard_count):
        shard = chosen[rq.keys.shard_of(env)]
        if len(shard) < per_shard:
            shard.append(env)
    assert len(chosen) == rq.keys.shard_count
    return sorted(e for envs in chosen.values() for e in envs)


#: Concurrency keys that once broke the reference (``*``, ``:``) and some that could
#: break a hash tag (``{``, ``}``).
AWKWARD_KEYS = ["*", "a:b", "{x}", "}{", "tenant 1", "ü"]


async def exercise_every_operation(rq: RunQueue) -> set[str]:
    """Run every RunQueue operation that calls a script over many envs, queues and keys.

    Returns the environments' shard ids that received work.
    """
    envs = covering_environments(rq, per_shard=3)
    # the first environment is spread over 3 partitions; its runs name tenants of each
    await rq.set_partitions(envs[0], 3)
    requests = []
    for i, env in enumerate(envs):
        for j in range(3):
            tenant = f"tenant{j}" if i == 0 else None
            requests.append(
                EnqueueRequest(env, f"q{j % 2}/sub", f"run-{i}-{j}", {"i": i}, tenant=tenant)
            )
        requests.append(
            EnqueueRequest(
                env, "keyed", f"ck-{i}", None, concurrency_key=AWKWARD_KEYS[i % len(AWKWARD_KEYS)]
            )
        )
        requests.append(EnqueueRequest(env, "short", f"ttl-{i}", None, ttl_ms=10))
        requests.append(EnqueueRequest(env, "keyed", f"cancel-{i}", None, concurrency_key="c"))
    # audit: an admin action recorded on every environment's shard
    for e in envs:
        await rq.record_audit(e, who="test", action="limits", target="queue keyed")
    # configure: a limit on every environment's keyed queue (no enqueue here reaches it)
    for env in envs:
        await rq.set_queue_size_limit(env, "keyed", 100)
    results = await rq.enqueue_many(requests, now_ms=NOW)
    assert {r.status.name for r in results} == {"ENQUEUED"}
    for i, env in enumerate(envs):
        assert (await rq.cancel(env, f"cancel-{i}", now_ms=NOW)).name == "CANCELLED"
    duplicate = await rq.enqueue(envs[0], "q0/sub", "run-0-0", now_ms=NOW)
    assert duplicate.name == "DUPLICATE"

    assert await rq.expire_ttl(now_ms=NOW + 100) == len(envs)
    for i, env in enumerate(envs):
        info = await rq.get_run(env, f"ttl-{i}")
        assert info is not None and info.status is RunStatus.EXPIRED, (env, info)

    # seed_counters: a reader rebuilds the lazy CK counters when they are missing.
    q = rq.keys.queue(envs[0], "keyed")
    await rq.client.delete(q.ck_queued_counter)
    stats = await rq.queue_stats(envs[0], "keyed", breakdown=True)
    assert stats.queued == 1

    # dequeue_variant: one flow of one queue, leased directly (the awkward key of env 0)
    (direct,) = await rq.dequeue_variant(
        envs[0], "keyed", AWKWARD_KEYS[0], lease_ms=60_000, now_ms=NOW + 200
    )
    assert (direct.run_id, direct.concurrency_key) == ("ck-0", AWKWARD_KEYS[0])
    delivered = [direct]
    while batch := await rq.dequeue(50, lease_ms=60_000, now_ms=NOW + 200):
        delivered.extend(batch)
    assert len(delivered) == 4 * len(envs)
    assert set(await rq.heartbeat(delivered, lease_ms=60_000, now_ms=NOW + 300)) == {
        HeartbeatStatus.EXTENDED
    }
    assert await rq.release(delivered[:5], now_ms=NOW + 300) == [ReleaseStatus.RELEASED] * 5

    failing = delivered[0]
    assert await rq.nack(failing, max_attempts=1, now_ms=NOW + 400) is NackOutcome.DEAD_LETTERED
    assert [d.run_id for d in await rq.dead_letters(failing.env)] == [failing.run_id]
    await rq.redrive(failing.env, failing.run_id, now_ms=NOW + 500)
    retried = delivered[1]
    assert await rq.nack(retried, retry_at_ms=NOW + 500, now_ms=NOW + 400) is NackOutcome.REQUEUED

    assert await rq.sample_shares(now_ms=NOW + 500) >= 1  # the retried run waits
    lost = delivered[2]  # its consumer vanishes: the lease lapses and the run comes back
    done = delivered[3:]
    statuses = await rq.ack(done, now_ms=NOW + 600)
    assert set(statuses) == {AckStatus.ACKED}
    assert await rq.reclaim_lapsed_leases(now_ms=NOW + 120_000) == 1

    again = await rq.dequeue(50, now_ms=NOW + 120_000)
    assert sorted(d.run_id for d in again) == sorted(r.run_id for r in (failing, retried, lost))
    assert set(await rq.ack(again, now_ms=NOW + 120_001)) == {AckStatus.ACKED}
    assert await nothing_due(rq, now_ms=NOW + 120_001)
    return {str(rq.keys.shard_of(e)) for e in envs}


# --------------------------------------------------------------------------- CROSSSLOT


@pytest.mark.parametrize("fair", [False, True], ids=["age-order", "fair-order"])
async def test_every_script_call_keeps_its_keys_in_one_slot(
    redis_url: str, prefix: str, recorded_calls: list[tuple[str, list[str]]], fair: bool
) -> None:
    # Given a run queue on the session's server (single node or cluster)
    rq = RunQueue(
        await connect(redis_url),
        RunQueueConfig(prefix=prefix, shard_count=8).with_vtime(enabled=fair),
        rng=random.Random(3),
    )
    try:
        # When every operation runs over many environments, queues and awkward keys
        await exercise_every_operation(rq)
        # Then every script call passed KEYS of one hash slot
        assert recorded_calls
        for name, keys in recorded_calls:
            slots = {key_slot(k.encode()) for k in keys}
            assert len(slots) == 1, f"{name} would fail with CROSSSLOT: {keys}"
        # and every script (of this order) was exercised
        order = "fair" if fair else "age"
        expected = {s.name for s in registry().all() if s.order in (None, order)}
        assert {name for name, _ in recorded_calls} == expected
        # and every key left in the keyspace carries a shard's hash tag (so keys a script
        # derived from KEYS or from a message hash share the slot of the KEYS it got)
        tag = re.compile(r"^\{" + re.escape(prefix) + r"\.(\d+)\}:")
        ours = re.compile(r"(?<![\w.-])" + re.escape(prefix) + r"(?![\w-])")
        keys = [k.decode() async for k in rq.client.scan_iter(match=f"*{prefix}*", count=1000)]
        assert keys
        # the documented global keys: no script touches them
        global_keys = {rq.keys.meta, rq.keys.maintenance_lock, rq.keys.placement}
        assert rq.keys.meta in keys
        for key in keys:
            if ours.search(key) and key not in global_keys:
                assert tag.match(key), f"key outside every shard's hash tag: {key}"
    finally:
        await rq.close()


def test_the_registry_holds_every_script_the_store_may_call() -> None:
    """Every operation the store's code calls by name has a script (in both orders when
    it has an order), and the registry holds exactly the lua files' builds."""
    store = resources.files("fairq.store")
    called: set[str] = set()
    for entry in store.iterdir():
        if entry.name.endswith(".py"):
            called |= set(
                re.findall(r"(?:\.call|call_for_env|_per_shard)\(\s*\"(\w+)\"", entry.read_text())
            )
    assert {"enqueue", "dequeue", "ack", "seed_counters", "configure"} <= called
    names = script_names()
    assert called <= set(names)
    for op in called:
        assert registry().get(op, "age").operation == op
        assert registry().get(op, "fair").operation == op
    expected = [f"{n}[{o}]" for n in names if uses_order(n) for o in ("age", "fair")]
    expected += [n for n in names if not uses_order(n)]
    assert sorted(s.name for s in registry().all()) == sorted(expected)


# --------------------------------------------------------------------------- on a cluster


@pytest.mark.cluster
@pytest.mark.parametrize("fair", [False, True], ids=["age-order", "fair-order"])
async def test_every_operation_runs_on_a_three_master_cluster(
    cluster_url: str, prefix: str, fair: bool
) -> None:
    # Given a run queue on a cluster, sharded over every master
    rq = await cluster_queue(cluster_url, prefix, vtime={"enabled": fair})
    try:
        # When every operation runs, Then none fails (CROSSSLOT, MOVED, NOSCRIPT…)
        used = await exercise_every_operation(rq)
        assert len(used) == rq.keys.shard_count
    finally:
        await rq.close()


@pytest.mark.cluster
async def test_scripts_are_loaded_on_the_node_that_owns_the_slot(
    cluster_client: RedisCluster, cluster_url: str, prefix: str
) -> None:
    """Ported: scripts are function libraries now (FCALL; a missing library is loaded,
    then the call repeated), so the caches emptied and inspected are the nodes' function
    libraries (FUNCTION FLUSH / FUNCTION LIST) instead of their script caches."""
    # Given every node's function libraries are gone
    rq = await cluster_queue(cluster_url, prefix)
    try:
        primaries = cluster_client.get_primaries()
        await cluster_client.execute_command("FUNCTION", "FLUSH", target_nodes=primaries)
        envs = covering_environments(rq, per_shard=1)
        # When runs are enqueued and dequeued on every shard (FCALL -> not found -> load)
        await rq.enqueue_many([EnqueueRequest(e, "q", "r1", 1) for e in envs], now_ms=NOW)
        delivered = await rq.dequeue(1000, now_ms=NOW)
        # Then each call loaded its library on its key's node and succeeded
        assert len(delivered) == len(envs)
        enqueue = registry().get("enqueue", "age").function
        for node in primaries:
            loaded = await cluster_client.execute_command(
                "FUNCTION", "LIST", "LIBRARYNAME", enqueue, target_nodes=node
            )
            assert len(loaded) == 1, f"enqueue not loaded on {node.name}"
    finally:
        await rq.close()


@pytest.mark.cluster
async def test_master_queue_shards_spread_over_every_master(
    cluster_client: RedisCluster, cluster_url: str
) -> None:
    # Given the default prefix and the documented shard count (8 x masters)
    rq = await cluster_queue(cluster_url, "fairq")
    try:
        masters = masters_of(cluster_client)
        # When shards are mapped to the nodes owning their hash tags
        spread = shard_nodes(cluster_client, rq.keys)
        # Then every master serves at least one shard, and every shard has one master
        assert sorted(spread) == masters
        assert all(spread[m] for m in masters), spread
        assert sorted(s for shards in spread.values() for s in shards) == list(
            range(rq.keys.shard_count)
        )
    finally:
        await rq.close()


@pytest.mark.cluster
async def test_one_dequeue_call_reaches_shards_on_every_node(cluster_url: str, prefix: str) -> None:
    # Given one run on each shard (so on every node)
    rq = await cluster_queue(cluster_url, prefix)
    try:
        by_shard = {rq.keys.shard_of(e): e for e in covering_environments(rq, per_shard=1)}
        await rq.enqueue_many(
            [EnqueueRequest(e, "q", f"r{s}", s) for s, e in by_shard.items()], now_ms=NOW
        )
        # When one consumer call asks for more than there is
        delivered = await rq.dequeue(1000, now_ms=NOW)
        # Then it gets the run of every shard
        assert sorted(rq.keys.shard_of(d.env) for d in delivered) == sorted(by_shard)
    finally:
        await rq.close()


@pytest.mark.cluster
async def test_consumers_cover_every_shard_exactly_once(cluster_url: str, prefix: str) -> None:
    # Given 10 runs in each of 5 environments per shard, and three consumers
    seed = await cluster_queue(cluster_url, prefix)
    envs = covering_environments(seed, per_shard=5)
    runs = {(e.id, f"r{j}") for e in envs for j in range(10)}
    await seed.enqueue_many(
        [EnqueueRequest(Environment.parse(e), "q", r, None) for e, r in sorted(runs)]
    )
    queues = [await cluster_queue(cluster_url, prefix) for _ in range(3)]
    consumers = [Consumer(rq, idle_timeout=0.05) for rq in queues]
    seen: Counter[tuple[str, str]] = Counter()
    shards_by_consumer: dict[int, set[int]] = defaultdict(set)

    async def consume(index: int) -> None:
        consumer = consumers[index]
        while sum(seen.values()) < len(runs):
            batch = await consumer.next_batch(25, timeout=0.2)
            for d in batch:
                seen[(d.env.id, d.run_id)] += 1
                shards_by_consumer[index].add(seed.keys.shard_of(d.env))
            if batch:
                await consumer.rq.ack(batch)

    try:
        # When they drain the queue concurrently
        await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(3))), 60)
        # Then every run was delivered exactly once, and the consumers together served
        # every shard
        assert set(seen) == runs
        assert max(seen.values()) == 1
        assert set().union(*shards_by_consumer.values()) == set(range(seed.keys.shard_count))
        assert await nothing_due(seed)
    finally:
        for c in consumers:
            await c.close()
        for rq in [seed, *queues]:
            await rq.close()


async def next_message(pubsub: Any) -> Any:
    """The next published message (skipping subscribe confirmations), or None after 5 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while (remaining := deadline - loop.time()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=remaining)
        if message is not None:
            return message
    return None


@pytest.mark.cluster
async def test_a_hint_published_by_a_script_reaches_subscribers_on_every_node(
    cluster_client: RedisCluster, cluster_url: str, prefix: str
) -> None:
    # Given a subscriber on the wake channel at every master
    rq = await cluster_queue(cluster_url, prefix)
    subscribers = []
    try:
        for node in cluster_client.get_primaries():
            client = aioredis.Redis(host=node.host, port=int(node.port))
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(rq.keys.wake_channel)
            subscribers.append((client, pubsub))
        # When a script on one shard publishes (enqueue wakes consumers)
        await rq.enqueue(environments(1)[0], "q", "r1", now_ms=NOW)
        # Then every node's subscriber hears it (classic PUBLISH is cluster-wide)
        for _client, pubsub in subscribers:
            assert await next_message(pubsub) is not None
    finally:
        for client, pubsub in subscribers:
            await pubsub.aclose()
            await client.aclose()
        await rq.close()

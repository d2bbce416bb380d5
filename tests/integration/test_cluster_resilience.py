"""A cluster master restarts (same port, its own AOF) while consumers run.

Consumers see connection errors while the node is away, retry, and carry on when it is
back. Afterwards every run has been acked exactly once; no run was handed out twice
while its lease still held. The only runs that need a lease expiry to come back are
those leased by a dequeue call whose reply the restart swallowed (redis-py's cluster
client may even retry such a call by itself, leasing a second batch).

This module starts its own 3-master cluster (``appendfsync always``), so restarting a
node never disturbs the session's server.

Ported to the rewritten store: ``Delivery.delivery`` is ``lease_token``; ``run_state``
moved to tests/state.py; ``next_due_ms() is None`` ("nothing queued that a consumer
could see") is read from the shards' queue-heads indexes without leasing anything. The
store turns a broken connection into ``ConnectionLostError`` (an ``OSError``) and any
other server error into ``FairqError``; the test still rides out only connection
errors, so a server error during the restart fails it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from tests.state import run_state

from fairq.cluster import EmbeddedCluster, shard_nodes
from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.models import AckStatus, Delivery, EnqueueRequest
from fairq.server import connect
from fairq.store import RunQueue, wall_clock_ms

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MASTERS = 3
SHARDS = 8 * MASTERS
#: Long enough that no lease lapses while the test runs (so a second delivery would be
#: a bug, not a lease expiry).
LEASE_MS = 120_000
RUNS = 1200
CONSUMERS = 3
BATCH = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(MASTERS, appendfsync="always", node_timeout_ms=15_000) as c:
        yield c


@dataclass
class Ledger:
    """What the consumers saw."""

    deliveries: Counter[tuple[str, str]] = field(default_factory=Counter)
    acked: Counter[tuple[str, str]] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    after_restart: set[tuple[str, str]] = field(default_factory=set)
    restarted: bool = False
    #: Set once a quarter of the runs are acked: the moment to restart a node.
    quarter_done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> int:
        return sum(self.acked.values())


async def open_queue(url: str, prefix: str) -> RunQueue:
    return RunQueue(
        await connect(url),
        RunQueueConfig(prefix=prefix, shard_count=SHARDS, lease_ms=LEASE_MS),
        rng=random.Random(5),
    )


async def queued_heads(rq: RunQueue) -> int:
    """Queue-heads entries over every shard: 0 when nothing is queued anywhere (what the
    old ``next_due_ms() is None`` said), read without leasing anything."""
    total = 0
    for shard in rq.keys.shards():
        total += int(await rq.client.zcard(shard.heads))
    return total


async def ack_until_answered(rq: RunQueue, batch: list[Delivery], ledger: Ledger) -> None:
    """Ack, retrying through connection errors.

    An ack is idempotent: repeating one whose reply was lost answers UNKNOWN (the run is
    gone). Nobody else holds these leases (and no run here has a TTL), so UNKNOWN means an
    earlier attempt went through: ours, or one the cluster client retried by itself.
    """
    while True:
        try:
            statuses = await rq.ack(batch)
        except (RedisError, OSError) as exc:
            ledger.errors[f"ack: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.05)
            continue
        for d, status in zip(batch, statuses, strict=True):
            assert status is not AckStatus.LEASE_LOST, f"{d.run_id}: lease lost without expiry"
            ledger.acked[(d.env.id, d.run_id)] += 1
        if ledger.done >= RUNS // 4:
            ledger.quarter_done.set()
        return


async def consume(consumer: Consumer, ledger: Ledger, stop: asyncio.Event) -> None:
    """A worker loop: lease a batch, record it, ack it; ride out connection errors."""
    while not stop.is_set():
        try:
            batch = await consumer.next_batch(BATCH, timeout=0.1)
        except (RedisError, OSError) as exc:
            ledger.errors[f"dequeue: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.05)
            continue
        for d in batch:
            ledger.deliveries[(d.env.id, d.run_id)] += 1
            if ledger.restarted:
                ledger.after_restart.add((d.env.id, d.run_id))
        if batch:
            await ack_until_answered(consumer.rq, batch, ledger)
        await asyncio.sleep(0.005)  # pace the work so the restart lands mid-stream


@pytest.mark.parametrize("kill", [False, True], ids=["clean-restart", "crash-and-2s-outage"])
async def test_consumers_ride_out_a_master_restart_without_loss_or_double_delivery(
    cluster: EmbeddedCluster, prefix: str, kill: bool
) -> None:
    # Given runs on every shard of a 3-master cluster, and three consumers draining them
    seed = await open_queue(cluster.url, prefix)
    assert isinstance(seed.client, RedisCluster)
    spread = shard_nodes(seed.client, seed.keys)
    victim_name = max(spread, key=lambda name: len(spread[name]))
    victim = next(i for i, n in enumerate(cluster.nodes) if f"127.0.0.1:{n.port}" == victim_name)
    envs: list[Environment] = []
    for i in range(400):
        env = Environment("org", "proj", f"env{i}")
        if sum(seed.keys.shard_of(e) == seed.keys.shard_of(env) for e in envs) < 3:
            envs.append(env)
    assert {seed.keys.shard_of(e) for e in envs} == set(range(SHARDS))
    runs = {(envs[i % len(envs)].id, f"run{i}") for i in range(RUNS)}
    await seed.enqueue_many(
        [EnqueueRequest(Environment.parse(e), "q", r, None) for e, r in sorted(runs)]
    )
    ledger = Ledger()
    stop = asyncio.Event()
    queues = [await open_queue(cluster.url, prefix) for _ in range(CONSUMERS)]
    consumers = [Consumer(rq, idle_timeout=0.05, maintenance_interval=3600) for rq in queues]
    tasks = [asyncio.create_task(consume(c, ledger, stop)) for c in consumers]
    try:
        await asyncio.wait_for(ledger.quarter_done.wait(), 60)
        # When the master serving the most shards restarts on its port, from its AOF (a
        # clean restart is absorbed by the client's retries; a crash with a 2 s outage
        # surfaces errors that the consumers ride out)
        done_before_restart = ledger.done
        await asyncio.to_thread(cluster.restart_node, victim, kill=kill, down_s=2.0 if kill else 0)
        ledger.restarted = True
        done_during_restart = ledger.done - done_before_restart
        # Then the consumers carry on until nothing is left that they can see
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while ledger.done < RUNS and loop.time() < deadline:
            before = ledger.done
            await asyncio.sleep(1.0)
            if ledger.done == before and await queued_heads(seed) == 0:
                break  # the rest (if any) is leased by a dequeue whose reply was lost
    finally:
        stop.set()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        for c in consumers:
            await c.close()

    try:
        print(
            f"acked before the restart: {done_before_restart}, while the node was away: "
            f"{done_during_restart}; consumer-visible errors: {dict(ledger.errors)}"
        )
        assert done_before_restart < RUNS // 2, "the restart should land mid-stream"
        # no consumer loop died: every error the restart surfaced was one they ride out
        died = [repr(e) for e in ended if isinstance(e, BaseException)]
        assert not died, f"consumer loops died: {died}"
        assert ledger.after_restart, "consumers did not continue after the restart"
        restarted_shards = set(spread[victim_name])
        assert any(
            seed.keys.shard_of(Environment.parse(e)) in restarted_shards
            for e, _ in ledger.after_restart
        ), "nothing was served from the restarted node's shards after it came back"
        # no run was handed out twice while its lease held
        assert max(ledger.deliveries.values()) == 1
        # every run survived the restart: it was acked, or it is still leased by a dequeue
        # whose reply the restart swallowed (the call failed, or the client retried it
        # internally: at most one call in flight per consumer), and comes back once that
        # lease lapses
        leased_by_lost_replies = runs - set(ledger.acked)
        failed_dequeues = sum(n for k, n in ledger.errors.items() if k.startswith("dequeue"))
        assert len(leased_by_lost_replies) <= (failed_dequeues + CONSUMERS) * BATCH
        for env_id, run_id in leased_by_lost_replies:
            assert await run_state(seed, Environment.parse(env_id), run_id) == "running"
        assert await seed.reclaim_lapsed_leases(now_ms=wall_clock_ms() + 2 * LEASE_MS) == len(
            leased_by_lost_replies
        )
        recovered: dict[tuple[str, str], list[int]] = defaultdict(list)
        while batch := await seed.dequeue(100, now_ms=wall_clock_ms() + 2 * LEASE_MS):
            for d in batch:
                recovered[(d.env.id, d.run_id)].append(d.lease_token)
            await ack_until_answered(seed, batch, ledger)
        assert set(recovered) == leased_by_lost_replies
        assert all(deliveries[0] >= 2 for deliveries in recovered.values())
        # and in the end every run was acked exactly once
        assert set(ledger.acked) == runs
        assert max(ledger.acked.values()) == 1
        assert await queued_heads(seed) == 0
    finally:
        for rq in [seed, *queues]:
            await rq.close()

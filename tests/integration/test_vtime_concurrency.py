"""Fair order under concurrency: several consumer processes, the op-count budget, and
flag-on / flag-off processes sharing one server (mixed versions).

Ported to the two-level store: tenant tags live in V:tt (kept after a tenant drains),
the floor is its ``~floor`` member, the candidates in B:tq (see notes/migration.md)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from tests.integration.commandstats import reset_stats, total_calls
from tests.state import fair_keys, tenant_tags

from fairq import keys as K
from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.models import Delivery
from fairq.server import connect
from fairq.store import RunQueue

QUEUE = "jobs"
T0 = 1_000_000
NOW = T0 + 100_000


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def _consume(url: str, prefix: str, env_id: str, seed: int) -> list[str]:
    rq = RunQueue(
        await connect(url), RunQueueConfig(prefix=prefix).with_vtime(enabled=True),
        rng=random.Random(seed),
    )  # fmt: skip
    env = Environment.parse(env_id)
    # start barrier: both processes begin together (spawn start-up takes a while)
    await rq.client.incr(f"{prefix}:ready")
    while not await rq.client.exists(f"{prefix}:go"):  # noqa: ASYNC110 (cross-process barrier)
        await asyncio.sleep(0.005)
    served: list[str] = []
    held: list[Delivery] = []
    idle = 0
    try:
        while True:
            batch = await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=5, now_ms=NOW)
            served += [d.run_id for d in batch]
            if held:
                await rq.ack(held, now_ms=NOW)
            held = batch
            if batch:
                idle = 0
                continue
            idle += 1
            if idle > 3 and not held and (await rq.queue_stats(env, QUEUE)).queued == 0:
                return served
            await asyncio.sleep(0.001)  # yield to the other consumer; not used for ordering
    finally:
        await rq.close()


def consumer_process(url: str, prefix: str, env_id: str, seed: int) -> list[str]:
    """Entry point of one spawned consumer process (its own RunQueue and connection)."""
    return asyncio.run(_consume(url, prefix, env_id, seed))


async def test_two_consumer_processes_one_base_queue_no_corruption(
    make_queue: Any, env: Environment, redis_url: str, prefix: str
) -> None:
    """Plan 15/16. Two spawned consumer processes drain 6 keys x 30 runs (env limit 4):
    every run is served exactly once, the floor sampled between script calls never
    decreases, no tenant's tag ever rewinds, and the candidates (B:tq) end empty.
    Adapted: drained tenants keep their tags in V:tt, each exactly 30 (one per serve)."""
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    await rq.set_env_limits(env, concurrency=4)
    expected = set()
    for k in range(6):
        for i in range(30):
            run = f"k{k}-{i}"
            expected.add(run)
            await rq.enqueue(env, QUEUE, run, None, concurrency_key=f"k{k}",
                             available_at_ms=T0 + k * 1000 + i, now_ms=T0)  # fmt: skip
    q, e = rq.keys.queue(env, QUEUE), rq.keys.env(env)
    floors: list[float] = []
    last_tag: dict[str, float] = {}
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        futures = [
            loop.run_in_executor(pool, consumer_process, redis_url, prefix, env.id, seed)
            for seed in (1, 2)
        ]
        while int(await rq.client.get(f"{prefix}:ready") or 0) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await rq.client.set(f"{prefix}:go", 1)
        while not all(f.done() for f in futures):
            raw = await rq.client.zscore(e.tenant_tags, K.FLOOR_MEMBER)
            if raw is not None:
                floors.append(float(raw))
            entries: Any = await rq.client.zrange(e.tenant_tags, 0, -1, withscores=True)
            for member, score in entries:
                ck = _s(member)
                assert float(score) >= last_tag.get(ck, float("-inf")), f"tag of {ck} rewound"
                last_tag[ck] = float(score)
            await asyncio.sleep(0.002)
        results = [await f for f in futures]
    served = results[0] + results[1]
    assert len(served) == len(set(served)) == len(expected)
    assert set(served) == expected
    assert all(r for r in results), "both consumers took part"
    assert floors == sorted(floors) and len(floors) > 5
    assert await rq.client.zcard(q.ready_tenants) == 0
    assert await tenant_tags(rq, env) == {f"k{k}": 30.0 for k in range(6)}


async def test_concurrent_enqueue_during_dequeue_never_rewinds_a_tag(
    make_queue: Any, env: Environment
) -> None:
    """Plan 16. Enqueues on a hot key interleaved with dequeue batches: its tag (V:tt)
    never decreases (registration never writes V:tt; serves only advance it)."""
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    e = rq.keys.env(env)
    seen: list[float] = []
    for r in range(40):
        for i in range(2):
            await rq.enqueue(env, QUEUE, f"hot{r}-{i}", None, concurrency_key="hot",
                             available_at_ms=T0 + r, now_ms=T0)  # fmt: skip
        await rq.enqueue(env, QUEUE, f"cold{r}", None, concurrency_key=f"c{r % 5}",
                         available_at_ms=T0 + r, now_ms=T0)  # fmt: skip
        await rq.ack(
            await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=3, now_ms=NOW), now_ms=NOW
        )
        tag = await rq.client.zscore(e.tenant_tags, "hot")
        if tag is not None:
            seen.append(tag)
    assert seen == sorted(seen) and seen[-1] > 10


# ---------------------------------------------------------------- op-count budget


async def _dequeue_calls_cost(
    rq: RunQueue, env: Environment, data: list[Row], calls: int, max_count: int
) -> tuple[int, int]:
    """Load data, then count the commands of `calls` dequeue calls (acks excluded)."""
    for ck, run, at, tenant in data:
        await rq.enqueue(env, QUEUE, run, None, concurrency_key=ck, tenant=tenant,
                         available_at_ms=at, now_ms=at)  # fmt: skip
    total = served = 0
    for _ in range(calls):
        await reset_stats(rq.client)
        batch = await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=max_count, now_ms=NOW)
        total += await total_calls(rq.client)
        served += len(batch)
        await rq.ack(batch, now_ms=NOW)
    return total, served


#: (key, run, score, tenant) of one run to load.
Row = tuple[str, str, int, str | None]


def _steady_data() -> list[Row]:
    return [
        (f"k{k:02d}", f"k{k:02d}-{i}", T0 + i * 100 + k, None) for k in range(20) for i in range(40)
    ]


def _churn_data() -> list[Row]:
    """Every key has 2 runs: most serves drain their key (parking on every drain)."""
    return [
        (f"c{k:03d}", f"c{k:03d}-{i}", T0 + i * 1000 + k, None)
        for k in range(300)
        for i in range(2)
    ]


def _tenant_data() -> list[Row]:
    """The tenant level: 6 named tenants x 5 keys x 12 runs (key sets, key floors), and
    churning keys of their own (2 runs each: keys leave and join their tenant's set)."""
    rows: list[Row] = [
        (f"t{t}k{k}", f"t{t}k{k}-{i}", T0 + i * 100 + t * 5 + k, f"tenant{t}")
        for t in range(6) for k in range(5) for i in range(12)
    ]  # fmt: skip
    rows += [
        (f"t{t}c{k:02d}", f"t{t}c{k:02d}-{i}", T0 + i * 1000 + k, f"tenant{t}")
        for t in range(6) for k in range(20) for i in range(2)
    ]  # fmt: skip
    return rows


@pytest.mark.parametrize("dataset", ["steady", "churn", "tenants"])
@pytest.mark.parametrize("max_count", [1, 10])
async def test_op_count_budget_per_dequeue_call(
    make_queue: Any, dataset: str, max_count: int
) -> None:
    """Plan 17. On identical data, 50 dequeue calls with the flag on cost at most
    50 x (6 + 2 x max_count) more commands (INFO commandstats, Lua calls included) than
    the age order. Adapted: includes the tenant level (named tenants with several keys:
    key sets, key floors, tenant tags)."""
    data = {"steady": _steady_data, "churn": _churn_data, "tenants": _tenant_data}[dataset]()
    off: RunQueue = await make_queue()
    on: RunQueue = await make_queue(vtime={"enabled": True})
    off_cost, off_served = await _dequeue_calls_cost(
        off, Environment("org1", "proj1", "off"), data, 50, max_count
    )
    on_cost, on_served = await _dequeue_calls_cost(
        on, Environment("org1", "proj1", "on"), data, 50, max_count
    )
    assert on_served == off_served == 50 * max_count
    assert on_cost <= off_cost + 50 * (6 + 2 * max_count), (on_cost, off_cost)


# ---------------------------------------------------------------- mixed versions


async def test_flag_on_and_flag_off_processes_interleaved_lose_nothing(
    make_queue: Any, env: Environment
) -> None:
    """A flag-on and a flag-off RunQueue on one prefix, enqueueing, dequeueing, nacking
    and acking in turn: every run is served exactly once and nothing is left behind."""
    on: RunQueue = await make_queue(vtime={"enabled": True})
    off: RunQueue = await make_queue()
    rng = random.Random(5)
    expected: set[str] = set()
    acked: list[str] = []
    nacked: set[str] = set()
    for r in range(60):
        who = (on, off)[r % 2]
        for i in range(3):
            run = f"r{r}-{i}"
            expected.add(run)
            await who.enqueue(env, QUEUE, run, None, concurrency_key=f"k{rng.randrange(6)}",
                              available_at_ms=T0 + r * 10 + i, now_ms=T0)  # fmt: skip
        consumer = (off, on)[(r // 3) % 2]
        batch = await consumer.dequeue_from_queue(env, QUEUE, keyed=True, max_count=4, now_ms=NOW)
        for d in batch:
            if d.run_id not in nacked and rng.random() < 0.15:
                nacked.add(d.run_id)
                await (on, off)[rng.randrange(2)].nack(d, retry_at_ms=NOW, now_ms=NOW)
            else:
                await consumer.ack([d], now_ms=NOW)
                acked.append(d.run_id)
    for consumer in (off, on) * 100:
        batch = await consumer.dequeue_from_queue(env, QUEUE, keyed=True, max_count=10, now_ms=NOW)
        await consumer.ack(batch, now_ms=NOW)
        acked += [d.run_id for d in batch]
    assert len(acked) == len(set(acked)) and set(acked) == expected
    stats = await on.queue_stats(env, QUEUE)
    assert (stats.queued, stats.running) == (0, 0)


async def test_stale_vtime_keys_after_turning_the_flag_off_are_inert_and_expire(
    make_queue: Any, env: Environment
) -> None:
    """Run with the flag on, then off: the age order ignores the leftover fair-order keys
    (same serve order as a queue that never had them), and every leftover key has a TTL.
    The flag-on process pins max_per_key_per_call 1 (the fair default is now the whole
    call) so that it leaves the old state: one run served per key."""
    on: RunQueue = await make_queue(
        vtime={"enabled": True, "state_ttl_seconds": 600}, max_per_key_per_call=1
    )
    for k in range(4):
        for i in range(5):
            await on.enqueue(env, QUEUE, f"k{k}-{i}", None, concurrency_key=f"k{k}",
                             available_at_ms=T0 + i * 10 + k, now_ms=T0)  # fmt: skip
    await on.ack(await on.dequeue_from_queue(env, QUEUE, keyed=True, max_count=10, now_ms=NOW))
    q, e = on.keys.queue(env, QUEUE), on.keys.env(env)
    leftovers = [e.tenant_tags, q.ready_tenants]  # the floor is a member of V:tt
    assert all([await on.client.exists(k) for k in leftovers])
    assert set(leftovers) <= set(await fair_keys(on))
    off: RunQueue = await make_queue()
    order = []
    for _ in range(4):
        batch = await off.dequeue_from_queue(env, QUEUE, keyed=True, max_count=1, now_ms=NOW)
        order += [d.run_id for d in batch]
        await off.ack(batch, now_ms=NOW)
    assert order == ["k0-1", "k1-1", "k2-1", "k3-1"]  # head order, untouched by the tags
    for key in leftovers:
        assert 0 < await on.client.ttl(key) <= 600

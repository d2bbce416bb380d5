"""Hashes that grow with the number of tenants stay cheap to write.

A server keeps a small hash as one list it scans field by field (up to 512 fields on
Valkey 9). Three of a queue's hashes grow with its tenants or flows: the history bucket
(a field per tenant served), the shares bucket (two per flow finished) and the per-tenant
in-flight counters. The buckets get a wide marker field once they hold WIDE_AT fields (the
server then keeps them as hash tables), which no reader counts; the in-flight counters hold
only the tenants with runs in flight.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.integration.limits_support import T0, Order, both_orders, queue_for

from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.store import RunQueue
from fairq.store.history import HISTORY_BUCKET_MS, WIDE_AT, WIDE_FIELD
from fairq.store.share_record import SHARES_BUCKET_MS
from fairq.store.shares import parse_bucket

pytestmark = pytest.mark.asyncio

#: Tenants enough to pass WIDE_AT fields in both buckets.
TENANTS = WIDE_AT + 8


async def serve_one_per_tenant(rq: RunQueue, env: Environment, tenants: int) -> list[Any]:
    """One keyed run per tenant, all served at T0 + 1 000 (one history bucket)."""
    requests = [
        EnqueueRequest(env, "q", f"r{i}", None, concurrency_key=f"k{i}", tenant=f"t{i}",
                       available_at_ms=T0 + i)
        for i in range(tenants)
    ]  # fmt: skip
    await rq.enqueue_many(requests, now_ms=T0 + tenants)
    served: list[Any] = []
    while len(served) < tenants:
        batch = await rq.dequeue_from_queue(env, "q", keyed=True, max_count=10, now_ms=T0 + 1_000)
        assert batch, "every run is ready"
        served += batch
    return served


@both_orders
async def test_a_history_bucket_of_many_tenants_is_wide_and_counts_the_same(
    make_queue: Any, env: Environment, order: Order
) -> None:
    rq = await queue_for(make_queue, order)
    served = await serve_one_per_tenant(rq, env, TENANTS)
    await rq.ack(served, now_ms=T0 + 1_500)
    key = rq.keys.queue(env, "q").history((T0 + 1_000) // HISTORY_BUCKET_MS)
    assert await rq.client.hexists(key, WIDE_FIELD)
    assert await rq.client.object("encoding", key) in (b"hashtable", "hashtable")
    bucket = (await rq.history(env, "q", window_ms=10_000, now_ms=T0 + 1_500))[-1]
    assert (bucket.served, bucket.completed) == (TENANTS, TENANTS)
    assert bucket.by_tenant == {f"t{i}": 1 for i in range(TENANTS)}
    assert bucket.other_tenants == 0


async def test_a_history_bucket_of_few_tenants_stays_compact(
    make_queue: Any, env: Environment
) -> None:
    rq = await queue_for(make_queue, "age")
    served = await serve_one_per_tenant(rq, env, 4)
    await rq.ack(served, now_ms=T0 + 1_500)
    key = rq.keys.queue(env, "q").history((T0 + 1_000) // HISTORY_BUCKET_MS)
    assert not await rq.client.hexists(key, WIDE_FIELD)
    assert (await rq.history(env, "q", window_ms=10_000, now_ms=T0 + 1_500))[-1].by_tenant == {
        f"t{i}": 1 for i in range(4)
    }


@both_orders
async def test_a_shares_bucket_of_many_flows_is_wide_and_counts_the_same(
    make_queue: Any, env: Environment, order: Order
) -> None:
    rq = await queue_for(make_queue, order)
    served = await serve_one_per_tenant(rq, env, TENANTS)
    await rq.ack(served, now_ms=T0 + 1_500)
    key = rq.keys.queue(env, "q").shares((T0 + 1_000) // SHARES_BUCKET_MS)
    raw = await rq.client.hgetall(key)
    assert WIDE_FIELD.encode() in raw
    received = parse_bucket(raw)
    assert sorted(received.runs) == sorted(f"t{i}/k{i}" for i in range(TENANTS))
    assert set(received.runs.values()) == {1.0}
    assert set(received.run_ms.values()) == {500.0}


@both_orders
async def test_the_tenant_in_flight_counters_hold_only_tenants_with_runs_in_flight(
    make_queue: Any, env: Environment, order: Order
) -> None:
    rq = await queue_for(make_queue, order)
    await rq.set_tenant_concurrency(env, "q", "t1", 1)
    served = await serve_one_per_tenant(rq, env, TENANTS)
    key = rq.keys.queue(env, "q").tenant_running
    assert await rq.client.hlen(key) == TENANTS + 1  # and the seeded marker ''
    still = [d for d in served if d.run_id in ("r1", "r2")]
    await rq.ack([d for d in served if d not in still], now_ms=T0 + 1_500)
    held = await rq.client.hgetall(key)
    assert {k.decode(): int(v) for k, v in held.items()} == {"": 0, "t1": 1, "t2": 1}
    # a tenant at its cap is still held there, one that left the hash is served again
    await rq.enqueue_many(
        [EnqueueRequest(env, "q", f"again{t}", None, concurrency_key=f"k{t}b", tenant=f"t{t}",
                        available_at_ms=T0 + 2_000) for t in (1, 3)],
        now_ms=T0 + 2_000,
    )  # fmt: skip
    again = await rq.dequeue_from_queue(env, "q", keyed=True, max_count=10, now_ms=T0 + 2_000)
    assert [d.run_id for d in again] == ["again3"]
    await rq.ack(still + again, now_ms=T0 + 2_500)
    assert {k.decode() for k in await rq.client.hkeys(key)} == {""}

"""The documented maxima work end to end on a real server: no script fails with "too
many results to unpack" (Lua's ``unpack`` limit) or any other size error at the top of
its range.

* dequeue with ``max_count=1000`` (``MAX_DEQUEUE_COUNT``) in the age order and the fair
  order, on a queue with 8,000 registered keys (served before, still queued) and 4,000
  keys new to it;
* one ``ack`` / ``finish`` / ``heartbeat`` / ``release`` call of 1000 deliveries, and
  1000 nacks at once (``nack`` takes one delivery: 100 in flight at a time);
* ``enqueue_many`` of 10,000 runs in one call (10 script calls of
  ``MAX_RUNS_PER_CALL`` = 1000), and one script call of exactly 1000 runs;
* ``configure`` with ``MAX_CHANGES`` (10,000) weights and caps in one atomic call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.state import ck_index

from fairq.config import MAX_DEQUEUE_COUNT
from fairq.keys import Environment, encode_concurrency_key
from fairq.models import (
    AckStatus,
    Delivery,
    EnqueueRequest,
    EnqueueStatus,
    Finish,
    HeartbeatStatus,
    NackOutcome,
    ReleaseStatus,
)
from fairq.outcomes import KeptOutcome
from fairq.store import RunQueue
from fairq.store.admin import MAX_CHANGES, Change
from fairq.store.enqueue import MAX_RUNS_PER_CALL

#: Long and topology-independent: run on the single server only.
pytestmark = pytest.mark.single_server

OLD_KEYS = 8000
NEW_KEYS = 4000


async def _enqueue_keys(
    rq: RunQueue, env: Environment, tag: str, keys: range, *, head_start_ms: int = 0
) -> None:
    requests = [
        EnqueueRequest(
            env,
            "q",
            f"{tag}-{k}",
            {"k": k},
            concurrency_key=f"key-{k}",
            head_start_ms=head_start_ms,
        )
        for k in keys
    ]
    for i in range(0, len(requests), 10_000):
        results = await rq.enqueue_many(requests[i : i + 10_000])
        assert {r.status for r in results} == {EnqueueStatus.ENQUEUED}


async def _full_batch(rq: RunQueue, env: Environment, order: str) -> list[Delivery]:
    batch = await rq.dequeue(MAX_DEQUEUE_COUNT, env=env, queues=["q"])
    assert len(batch) == MAX_DEQUEUE_COUNT
    assert len({d.run_id for d in batch}) == MAX_DEQUEUE_COUNT
    if order == "age":  # one run per key per call in the age order
        assert len({d.concurrency_key for d in batch}) == MAX_DEQUEUE_COUNT
    return batch


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_dequeue_1000_from_12000_keys_and_finish_1000_at_once(
    make_queue: Any, env: Environment, order: str
) -> None:
    """Both orders serve full 1000-run batches from 8,000 registered + 4,000 new keys;
    every batch call of 1000 deliveries (heartbeat, release, ack, finish) and 1000
    concurrent nacks answer for each of them."""
    rq: RunQueue = await make_queue(vtime={"enabled": order == "fair"})
    await rq.set_env_limits(env, concurrency=1_000_000)
    # 8,000 keys, two runs each (the first round ordered first), one batch served
    await _enqueue_keys(rq, env, "first", range(OLD_KEYS), head_start_ms=60_000)
    await _enqueue_keys(rq, env, "second", range(OLD_KEYS))
    served = await _full_batch(rq, env, order)
    assert await rq.ack(served) == [AckStatus.ACKED] * MAX_DEQUEUE_COUNT
    # 4,000 keys new to the queue
    await _enqueue_keys(rq, env, "new", range(OLD_KEYS, OLD_KEYS + NEW_KEYS))
    assert len(await ck_index(rq, env, "q")) == OLD_KEYS + NEW_KEYS

    first = await _full_batch(rq, env, order)
    second = await _full_batch(rq, env, order)
    assert await rq.heartbeat(first) == [HeartbeatStatus.EXTENDED] * MAX_DEQUEUE_COUNT
    assert await rq.release(first) == [ReleaseStatus.RELEASED] * MAX_DEQUEUE_COUNT
    nacks: list[NackOutcome] = []
    for i in range(0, MAX_DEQUEUE_COUNT, 100):
        nacks += await asyncio.gather(
            *(rq.nack(d, retry_delay_ms=0, increment_attempt=False) for d in first[i : i + 100])
        )
    assert nacks == [NackOutcome.REQUEUED] * MAX_DEQUEUE_COUNT
    finishes = [Finish(d, "completed", KeptOutcome()) for d in second]
    assert await rq.finish(finishes) == [AckStatus.ACKED] * MAX_DEQUEUE_COUNT
    stats = await rq.queue_stats(env, "q")
    assert stats.running == 0
    assert stats.queued == OLD_KEYS * 2 + NEW_KEYS - 2 * MAX_DEQUEUE_COUNT
    await rq.purge()  # 20,000 runs: do not leave them to every later SCAN


async def test_enqueue_many_10000_in_one_call_and_1000_in_one_script_call(
    make_queue: Any, env: Environment
) -> None:
    """10,000 runs of one queue in one enqueue_many (split in script calls of 1000), and
    exactly MAX_RUNS_PER_CALL runs of 1000 distinct keys in one script call."""
    rq: RunQueue = await make_queue()
    many = [EnqueueRequest(env, "bulk", f"b{i}", {"i": i}) for i in range(10_000)]
    results = await rq.enqueue_many(many)
    assert [r.run_id for r in results] == [r.run_id for r in many]
    assert {r.status for r in results} == {EnqueueStatus.ENQUEUED}
    one_call = [
        EnqueueRequest(env, "keys", f"k{i}", {"i": i}, concurrency_key=f"c{i}", tenant=f"t{i % 50}")
        for i in range(MAX_RUNS_PER_CALL)
    ]
    assert {r.status for r in await rq.enqueue_many(one_call)} == {EnqueueStatus.ENQUEUED}
    again = await rq.enqueue_many(one_call)
    assert {r.status for r in again} == {EnqueueStatus.DUPLICATE}
    assert (await rq.queue_stats(env, "bulk")).queued == 10_000
    assert (await rq.queue_stats(env, "keys")).queued == MAX_RUNS_PER_CALL
    await rq.purge()


async def test_configure_10000_weights_and_caps_in_one_call(
    make_queue: Any, env: Environment
) -> None:
    """MAX_CHANGES settings (key weights, key caps, tenant weights) apply in one call,
    every one stored."""
    rq: RunQueue = await make_queue()
    third = MAX_CHANGES // 3
    changes = (
        [Change("key_weights", "q", encode_concurrency_key(f"w{i}"), "2.5") for i in range(third)]
        + [Change("key_caps", "q", encode_concurrency_key(f"c{i}"), "3") for i in range(third)]
        + [Change("tenant_weights", None, f"t{i}", "4.0") for i in range(MAX_CHANGES - 2 * third)]
    )
    assert len(changes) == MAX_CHANGES
    await rq.configure(env, changes)
    q = rq.keys.queue(env, "q")
    e = rq.keys.env(env)
    assert await rq.client.hlen(q.key_weights) == third
    assert await rq.client.hlen(q.key_caps) == third
    assert await rq.client.hlen(e.tenant_weights) == MAX_CHANGES - 2 * third
    assert await rq.client.hget(q.key_weights, "w123") == b"2.5"
    assert await rq.client.hget(q.key_caps, f"c{third - 1}") == b"3"

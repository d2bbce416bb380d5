"""The CK index (age order): one queue-heads member per base queue kind, one index entry
per non-empty variant scored by its head, rebalanced by every state change.

Ported to the rewritten store: the shard's master queue is now the queue-heads index
(``s.heads``, members ``q:E:Q`` / ``ck:E:Q``, built by ``keys.heads_member``)."""

from __future__ import annotations

from typing import Any

import pytest
from tests import state

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import AckStatus, NackOutcome
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def master(rq: RunQueue, env: Environment) -> dict[str, int]:
    """The env's members of its shard's queue-heads index -> head score."""
    return {m: int(score) for m, score in (await state.heads(rq, env)).items()}


async def index(rq: RunQueue, env: Environment, queue: str = "q") -> dict[str, int]:
    """The CK index, decoded: concurrency key -> head score."""
    raw = await rq.client.zrange(rq.keys.queue(env, queue).ck_index, 0, -1, withscores=True)
    return {K.decode_concurrency_key(m.decode()): int(s) for m, s in raw}


def ck_member(env: Environment, queue: str = "q") -> str:
    return K.heads_member(K.KIND_CK, env, queue)


def q_member(env: Environment, queue: str = "q") -> str:
    return K.heads_member(K.KIND_QUEUE, env, queue)


async def test_keyed_enqueue_adds_an_index_entry_and_one_master_member(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="ck-a", now_ms=T0)

    assert await index(rq, env) == {"ck-a": T0}
    assert await master(rq, env) == {ck_member(env): T0}  # no per-variant member


async def test_three_keys_one_master_member_three_index_entries(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    for i, ck in enumerate(["a", "b", "c"]):
        await rq.enqueue(env, "q", f"r{i}", concurrency_key=ck, now_ms=T0 + 10 - i)

    assert await index(rq, env) == {"a": T0 + 10, "b": T0 + 9, "c": T0 + 8}
    assert await master(rq, env) == {ck_member(env): T0 + 8}  # the oldest head


async def test_a_batched_dequeue_spans_variants(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="b", now_ms=T0 + 1)

    got = await rq.dequeue(10, now_ms=T0 + 1)

    assert sorted((d.run_id, d.concurrency_key) for d in got) == [("r1", "a"), ("r2", "b")]


async def test_variants_are_served_oldest_head_first(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    for i, ck in enumerate(["new", "old", "mid"]):
        score = {"new": T0 + 30, "old": T0 + 10, "mid": T0 + 20}[ck]
        await rq.enqueue(env, "q", f"r{i}", concurrency_key=ck, available_at_ms=score, now_ms=T0)
    order = []
    for _ in range(3):
        (d,) = await rq.dequeue(1, now_ms=T0 + 100)
        order.append(d.concurrency_key)
    assert order == ["old", "mid", "new"]


async def test_drained_variants_leave_the_index(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "a1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "b1", concurrency_key="b", now_ms=T0 + 1)
    await rq.enqueue(env, "q", "b2", concurrency_key="b", now_ms=T0 + 2)

    await rq.dequeue(10, now_ms=T0 + 2)

    assert await index(rq, env) == {"b": T0 + 2}  # a drained; b re-scored to its new head
    assert await master(rq, env) == {ck_member(env): T0 + 2}


async def test_an_empty_index_removes_the_master_member(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "a1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "b1", concurrency_key="b", now_ms=T0)

    await rq.dequeue(10, now_ms=T0)

    assert await index(rq, env) == {}
    assert await master(rq, env) == {}
    assert await rq.client.exists(rq.keys.queue(env, "q").ck_index) == 0


async def test_mixed_keyed_and_keyless_runs_make_two_master_members(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "plain", now_ms=T0 + 5)
    await rq.enqueue(env, "q", "keyed", concurrency_key="a", now_ms=T0)

    assert await master(rq, env) == {q_member(env): T0 + 5, ck_member(env): T0}

    got = await rq.dequeue(10, now_ms=T0 + 5)
    assert sorted(d.run_id for d in got) == ["keyed", "plain"]
    assert await master(rq, env) == {}


async def test_ack_keeps_index_and_master_consistent(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "a1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "a2", concurrency_key="a", now_ms=T0 + 1)
    (d,) = await rq.dequeue(10, now_ms=T0 + 1)
    assert d.run_id == "a1"

    assert await rq.ack([d]) == [AckStatus.ACKED]

    assert await index(rq, env) == {"a": T0 + 1}
    assert await master(rq, env) == {ck_member(env): T0 + 1}
    (d2,) = await rq.dequeue(10, now_ms=T0 + 1)
    await rq.ack([d2])
    assert await index(rq, env) == {}
    assert await master(rq, env) == {}


async def test_nack_rebalances_index_and_master(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "a1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "b1", concurrency_key="b", now_ms=T0 + 50)
    got = await rq.dequeue(10, now_ms=T0 + 50)
    assert await master(rq, env) == {}
    a1 = next(d for d in got if d.run_id == "a1")

    assert await rq.nack(a1, retry_at_ms=T0 + 20, now_ms=T0 + 60) is NackOutcome.REQUEUED

    assert await index(rq, env) == {"a": T0 + 20}
    assert await master(rq, env) == {ck_member(env): T0 + 20}
    b1 = next(d for d in got if d.run_id == "b1")
    await rq.nack(b1, retry_at_ms=T0 + 10, now_ms=T0 + 60)
    assert await index(rq, env) == {"a": T0 + 20, "b": T0 + 10}
    assert await master(rq, env) == {ck_member(env): T0 + 10}


async def test_future_heads_keep_the_master_member_at_their_time(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "a1", concurrency_key="a", delay_ms=1_000, now_ms=T0)
    batch = await rq.dequeue_batch(10, now_ms=T0)
    assert (batch.deliveries, batch.wait_ms) == ([], 1_000)  # held back until its head
    assert await master(rq, env) == {ck_member(env): T0 + 1_000}
    assert await index(rq, env) == {"a": T0 + 1_000}
    assert len(await rq.dequeue(10, now_ms=T0 + 1_000)) == 1


async def test_gated_variant_keeps_its_index_entry(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    for i in range(3):
        await rq.enqueue(env, "q", f"a{i}", concurrency_key="a", now_ms=T0 + i)
    await rq.enqueue(env, "q", "b0", concurrency_key="b", now_ms=T0 + 5)
    await rq.dequeue(10, now_ms=T0 + 5)  # a0 and b0

    assert await rq.dequeue(10, now_ms=T0 + 5) == []  # a is at its limit

    assert await index(rq, env) == {"a": T0 + 1}
    assert await master(rq, env) == {ck_member(env): T0 + 1}


@pytest.mark.parametrize("tricky", ["*", "%2A", ":", "ck:*", "{x}"])
async def test_a_tricky_key_does_not_strand_the_base_queue(
    make_queue: Any, env: Environment, tricky: str
) -> None:
    """The reference's CK ``*`` collided with its wildcard member; here it is a variant."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "star", concurrency_key=tricky, now_ms=T0)
    await rq.enqueue(env, "q", "other", concurrency_key="other", now_ms=T0 + 1)
    await rq.enqueue(env, "q", "star2", concurrency_key=tricky, now_ms=T0 + 2)
    assert len(await master(rq, env)) == 1
    assert await index(rq, env) == {tricky: T0, "other": T0 + 1}

    got = await rq.dequeue(10, now_ms=T0 + 2)
    assert sorted((d.run_id, d.concurrency_key) for d in got) == [
        ("other", "other"),
        ("star", tricky),
    ]
    assert len(await master(rq, env)) == 1  # star2 is still waiting

    star = next(d for d in got if d.run_id == "star")
    other = next(d for d in got if d.run_id == "other")
    await rq.nack(star, retry_at_ms=T0 + 3, now_ms=T0 + 3)
    assert len(await master(rq, env)) == 1
    await rq.ack([other])
    assert len(await master(rq, env)) == 1

    rest = []
    for _ in range(3):
        rest += await rq.dequeue(10, now_ms=T0 + 3)
    assert sorted(d.run_id for d in rest) == ["star", "star2"]
    await rq.ack(rest)
    assert await master(rq, env) == {}
    assert await index(rq, env) == {}
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (0, 0)


async def test_a_keyed_queue_and_a_keyless_queue_with_a_colon_key_do_not_mix(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="a:b", now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="a", now_ms=T0)
    assert await index(rq, env) == {"a:b": T0, "a": T0}
    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert sorted((v.concurrency_key, v.queued) for v in stats.variants) == [("a", 1), ("a:b", 1)]


async def test_window_of_three_times_max_count_variants(make_queue: Any, env: Environment) -> None:
    """A call looks at the 3n oldest ready variants; variants at their limit use up the
    window (the age order's known weakness, fixed by the fair order)."""
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    for i in range(4):  # 4 old variants, each with 2 runs
        await rq.enqueue(env, "q", f"old{i}a", concurrency_key=f"old{i}", now_ms=T0 + i)
        await rq.enqueue(env, "q", f"old{i}b", concurrency_key=f"old{i}", now_ms=T0 + 10 + i)
    await rq.enqueue(env, "q", "young", concurrency_key="young", now_ms=T0 + 100)
    # fill the four old variants' slots
    got = await rq.dequeue_from_queue(env, "q", keyed=True, max_count=4, now_ms=T0 + 100)
    assert sorted(d.run_id for d in got) == [f"old{i}a" for i in range(4)]

    # n = 1: the window holds 3 variants, all gated, so "young" is not reached
    assert await rq.dequeue_from_queue(env, "q", keyed=True, max_count=1, now_ms=T0 + 100) == []
    # n = 2: a window of 6 reaches it
    got = await rq.dequeue_from_queue(env, "q", keyed=True, max_count=2, now_ms=T0 + 100)
    assert [d.run_id for d in got] == ["young"]


async def test_counters_follow_keyed_runs(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    for ck, n in (("a", 2), ("b", 1)):
        for i in range(n):
            await rq.enqueue(env, "q", f"{ck}{i}", concurrency_key=ck, now_ms=T0)
    await rq.enqueue(env, "q", "plain", now_ms=T0)
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (4, 0)

    got = await rq.dequeue(10, now_ms=T0)
    assert len(got) == 3  # a0, b0, plain
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (1, 3)

    await rq.ack(got)
    q = rq.keys.queue(env, "q")
    assert int(await rq.client.get(q.ck_queued_counter)) == 1
    assert int(await rq.client.get(q.ck_running_counter)) == 0

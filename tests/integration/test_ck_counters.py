"""CK-aware Queued/Running counters (issue 3, seed 003).

A queue's keyed runs live under per-variant keys, so the base queue's own sorted set
and in-flight set say nothing about them. Two counters per base queue,
``B:ckqueued`` and ``B:ckrunning``, carry the totals across every variant; the
readers add them to the keyless counts.

The tests come in three groups, meant to be read beside the design documents:

* the seed's test plan, by intention (lazy init, churn, floor at zero, ...);
* the reference's ``ckCounters`` suite (15 cases, runqueue-semantics.md §6), in our
  words, adapted where fairq differs (each adaptation is said in the docstring);
* the reference's drift sources (§4.2), each shown designed out.

fairq differences that shape the tests: dequeue leases directly (no separate
"dequeued" set, so claimed == running); enqueue of an existing run id is always a
no-op; a script collects its counter deltas and applies them once at the end, seeding
a missing counter from the truth (include/counters.lua).

Ported to the rewritten store: ``B:ckbusy`` is gone by design. The running truth a
missing ``B:ckrunning`` is seeded from is the environment's in-flight set
(``V:inflight``), which holds every slot holder, also of variants with nothing queued;
where a test read ``ckbusy`` it now asserts the same property on the variant in-flight
sets and ``V:inflight``. ``release`` returns ``ReleaseStatus`` values.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from importlib import resources

from tests import state

from fairq.config import RetryPolicy
from fairq.keys import Environment, QueueKeys, encode_concurrency_key
from fairq.models import (
    AckStatus,
    Delivery,
    EnqueueRequest,
    EnqueueStatus,
    NackOutcome,
    ReleaseStatus,
)
from fairq.store import RunQueue
from fairq.store.scripts import assemble, script_names, uses_order

MakeQueue = Callable[..., Awaitable[RunQueue]]

#: The logical clock every test starts from (ms).
T0 = 1_000_000
#: The queue every test uses.
QUEUE = "task/ck"


# --------------------------------------------------------------------------- helpers


def qkeys(rq: RunQueue, env: Environment, queue: str = QUEUE) -> QueueKeys:
    return rq.keys.queue(env, queue)


async def counter(rq: RunQueue, key: str) -> int | None:
    """A raw counter value (None when the key does not exist)."""
    raw = await rq.client.get(key)
    return None if raw is None else int(raw)


async def queued_counter(rq: RunQueue, env: Environment, queue: str = QUEUE) -> int | None:
    return await counter(rq, qkeys(rq, env, queue).ck_queued_counter)


async def running_counter(rq: RunQueue, env: Environment, queue: str = QUEUE) -> int | None:
    return await counter(rq, qkeys(rq, env, queue).ck_running_counter)


async def enqueue_ck(
    rq: RunQueue, env: Environment, ck: str | None, count: int, *, first: int = 0,
    queue: str = QUEUE, now: int = T0, tag: str = "r",
) -> list[str]:  # fmt: skip
    """Enqueue ``count`` runs named ``<tag>-<ck>-<i>`` (keyless when ``ck`` is None)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", ck or "none")
    ids = [f"{tag}-{name}-{i}" for i in range(first, first + count)]
    for run_id in ids:
        status = await rq.enqueue(
            env, queue, run_id, {"id": run_id}, concurrency_key=ck, now_ms=now
        )
        assert status is EnqueueStatus.ENQUEUED
    return ids


async def take_ck(
    rq: RunQueue, env: Environment, count: int, *, queue: str = QUEUE, now: int = T0 + 1
) -> list[Delivery]:
    """Lease exactly ``count`` keyed runs of ``queue`` (several calls if needed)."""
    out: list[Delivery] = []
    for _ in range(count):
        got = await rq.dequeue_from_queue(
            env, queue, keyed=True, max_count=count - len(out), now_ms=now
        )
        out.extend(got)
        if len(out) >= count or not got:
            break
    assert len(out) == count, f"wanted {count} keyed runs, leased {len(out)}"
    return out


async def variant_truth(rq: RunQueue, env: Environment, queue: str = QUEUE) -> tuple[int, int]:
    """(queued, running) across every variant, from the variant keys themselves."""
    q = qkeys(rq, env, queue)
    total_q = total_r = 0
    async for raw in rq.client.scan_iter(match=f"{q.base}:ck:*", count=500):
        key = raw.decode()
        if key.endswith(":queued"):
            total_q += int(await rq.client.zcard(key))
        elif key.endswith(":inflight"):
            total_r += int(await rq.client.scard(key))
    return total_q, total_r


async def keys_of(rq: RunQueue, env: Environment, queue: str = QUEUE) -> set[str]:
    q = qkeys(rq, env, queue)
    found: set[str] = set()
    async for raw in rq.client.scan_iter(match=f"{q.base}:*", count=500):
        found.add(raw.decode())
    return found


# --------------------------------------------------------------------------- seed test plan


async def test_lazy_init_from_pre_existing_backlog(make_queue: MakeQueue, env: Environment) -> None:
    """A backlog that predates the counter is counted by the first CK enqueue."""
    rq = await make_queue()
    # Given 7 + 4 runs already waiting in two variants, and no counter
    await enqueue_ck(rq, env, "a", 7)
    await enqueue_ck(rq, env, "b", 4)
    await rq.client.delete(qkeys(rq, env).ck_queued_counter)
    assert await queued_counter(rq, env) is None
    # When one more keyed run is enqueued
    await enqueue_ck(rq, env, "c", 1)
    # Then the counter was seeded from the variants (11) and then counted the new run
    assert await queued_counter(rq, env) == 12
    assert (await variant_truth(rq, env))[0] == 12
    assert (await rq.queue_stats(env, QUEUE)).queued == 12


async def test_churn(make_queue: MakeQueue, env: Environment) -> None:
    """Rounds of enqueue / dequeue / ack / nack keep both counters equal to the truth."""
    rq = await make_queue()
    now = T0
    serial = 0
    for round_no in range(12):
        for ck in ("a", "b", "c"):
            await enqueue_ck(rq, env, ck, 3, first=serial, now=now)
        serial += 3
        now += 10
        leased = await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=5, now_ms=now)
        for i, d in enumerate(leased):
            if i % 3 == 0:
                assert await rq.nack(d, retry_at_ms=now, now_ms=now) is NackOutcome.REQUEUED
            elif i % 3 == 1:
                assert await rq.ack([d], now_ms=now) == [AckStatus.ACKED]
            # else: left running
        truth = await variant_truth(rq, env)
        assert (await queued_counter(rq, env), await running_counter(rq, env)) == truth, round_no
        stats = await rq.queue_stats(env, QUEUE)
        assert (stats.queued, stats.running) == truth


async def test_floor_at_zero(make_queue: MakeQueue, env: Environment) -> None:
    """A counter that reads lower than the truth (corrupted from outside) never goes
    negative: decrements stop at 0."""
    rq = await make_queue()
    q = qkeys(rq, env)
    # Given 3 running keyed runs whose counter was overwritten with 1 (TTL kept)
    await enqueue_ck(rq, env, "a", 3)
    leased = await take_ck(rq, env, 3)
    assert await running_counter(rq, env) == 3
    await rq.client.set(q.ck_running_counter, 1, keepttl=True)
    # When all three finish
    assert await rq.ack(leased, now_ms=T0 + 2) == [AckStatus.ACKED] * 3
    # Then the counter stops at 0
    assert await running_counter(rq, env) == 0
    assert (await rq.queue_stats(env, QUEUE)).running == 0


async def test_non_ck_queue_never_gets_a_counter(make_queue: MakeQueue, env: Environment) -> None:
    """Regression: a purely keyless queue, through every operation that touches counters
    on keyed runs, creates no counter (queued, running, per-tenant running), no CK index
    and no variant key."""
    rq = await make_queue(retry=RetryPolicy(max_attempts=2, randomize=False), lease_ms=1000)
    q = qkeys(rq, env)
    # a size limit makes enqueue compute the queue size (the CK part must read 0)
    await rq.set_queue_size_limit(env, QUEUE, 100)
    ids = await enqueue_ck(rq, env, None, 6)
    await rq.enqueue(env, QUEUE, "ttl-run", None, ttl_ms=5, now_ms=T0)
    leased = await rq.dequeue_from_queue(env, QUEUE, keyed=False, max_count=4, now_ms=T0 + 1)
    assert len(leased) == 4
    assert await rq.ack([leased[0]], now_ms=T0 + 2) == [AckStatus.ACKED]
    assert await rq.nack(leased[1], retry_at_ms=T0 + 2, now_ms=T0 + 2) is NackOutcome.REQUEUED
    assert await rq.release([leased[2]], now_ms=T0 + 2) == [ReleaseStatus.RELEASED]
    assert await rq.expire_ttl(now_ms=T0 + 10, batch=1000) == 1
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 5000, batch=1000) == 2
    again = await rq.dequeue_from_queue(env, QUEUE, keyed=False, max_count=10, now_ms=T0 + 5001)
    for d in again:
        if d.attempt >= 1:
            assert await rq.nack(d, now_ms=T0 + 5002) is NackOutcome.DEAD_LETTERED
            await rq.redrive(env, d.run_id, now_ms=T0 + 5003)
    stats = await rq.queue_stats(env, QUEUE, breakdown=True)
    assert stats.variants == []
    assert stats.queued + stats.running >= 1
    present = await keys_of(rq, env)
    for key in (q.ck_queued_counter, q.ck_running_counter, q.ck_index, q.tenant_running):
        assert key not in present
    assert not [k for k in present if ":ck:" in k]
    assert len(ids) == 6


async def test_mixed_ck_and_non_ck_on_one_base_queue(
    make_queue: MakeQueue, env: Environment
) -> None:
    """Keyless and keyed runs of one base queue add up in every reader.

    Ported: the reader now seeds a missing Running counter (to 0 here) whenever
    variants hold runs, as readers.py documents; so that the keyless dequeue is still
    shown to create no counter, the seeded one is deleted before it."""
    rq = await make_queue()
    await enqueue_ck(rq, env, None, 4)
    await enqueue_ck(rq, env, "a", 3)
    await enqueue_ck(rq, env, "b", 2)
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (5, None)
    stats = await rq.queue_stats(env, QUEUE, breakdown=True)
    assert (stats.queued, stats.running) == (9, 0)
    assert {v.concurrency_key: v.queued for v in stats.variants} == {"a": 3, "b": 2}
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (5, 0)
    await rq.client.delete(qkeys(rq, env).ck_running_counter)
    # keyless dequeues leave the CK counters alone; keyed dequeues move them
    got = await rq.dequeue_from_queue(env, QUEUE, keyed=False, max_count=2, now_ms=T0 + 1)
    assert [d.concurrency_key for d in got] == [None, None]
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (5, None)
    await take_ck(rq, env, 2)
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (3, 2)
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.queued, stats.running) == (2 + 3, 2 + 2)


async def test_idempotent_re_enqueue(make_queue: MakeQueue, env: Environment) -> None:
    """Enqueueing an existing run id again (queued, running or dead-lettered) changes
    nothing: no counter moves, no slot is freed."""
    rq = await make_queue(retry=RetryPolicy(max_attempts=1))
    await enqueue_ck(rq, env, "a", 3)
    # queued
    assert await rq.enqueue(env, QUEUE, "r-a-0", None, concurrency_key="a", now_ms=T0) is (
        EnqueueStatus.DUPLICATE
    )
    # in another variant: still the same run id, still a no-op
    assert await rq.enqueue(env, QUEUE, "r-a-0", None, concurrency_key="z", now_ms=T0) is (
        EnqueueStatus.DUPLICATE
    )
    assert await queued_counter(rq, env) == 3
    # running
    (d,) = await take_ck(rq, env, 1)
    assert await rq.enqueue(env, QUEUE, d.run_id, None, concurrency_key="a", now_ms=T0) is (
        EnqueueStatus.DUPLICATE
    )
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (2, 1)
    # dead-lettered
    assert await rq.nack(d, now_ms=T0 + 2) is NackOutcome.DEAD_LETTERED
    assert await rq.enqueue(env, QUEUE, d.run_id, None, concurrency_key="a", now_ms=T0) is (
        EnqueueStatus.DUPLICATE
    )
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (2, 0)
    assert await variant_truth(rq, env) == (2, 0)


async def test_counter_ttl_is_one_day(make_queue: MakeQueue, env: Environment) -> None:
    """Both counters carry the default TTL (86,400 s) from their seeding."""
    rq = await make_queue()
    await enqueue_ck(rq, env, "a", 2)
    await take_ck(rq, env, 1)
    q = qkeys(rq, env)
    for key in (q.ck_queued_counter, q.ck_running_counter):
        assert 86_390 <= await rq.client.ttl(key) <= 86_400


async def test_counter_ttl_option_honoured_and_not_extended(
    make_queue: MakeQueue, env: Environment
) -> None:
    """``counter_ttl_seconds`` sets the TTL; increments and decrements never extend it,
    so a counter is re-seeded from the truth at least once per TTL."""
    rq = await make_queue(counter_ttl_seconds=60)
    q = qkeys(rq, env)
    await enqueue_ck(rq, env, "a", 3)
    await take_ck(rq, env, 1)
    for key in (q.ck_queued_counter, q.ck_running_counter):
        assert 50 <= await rq.client.ttl(key) <= 60
        # Given the counters' remaining life is now 30 s
        await rq.client.expire(key, 30)
    # When they are incremented and decremented many times
    await enqueue_ck(rq, env, "b", 5)
    leased = await take_ck(rq, env, 2)
    await rq.ack(leased, now_ms=T0 + 5)
    # Then their TTLs did not grow
    for key in (q.ck_queued_counter, q.ck_running_counter):
        assert 0 < await rq.client.ttl(key) <= 30
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (
        await variant_truth(rq, env)
    )


async def test_nack_re_seeds_after_counter_expiry(make_queue: MakeQueue, env: Environment) -> None:
    """A nack that finds both counters gone (expired) seeds each from the truth before
    moving it."""
    rq = await make_queue()
    q = qkeys(rq, env)
    await enqueue_ck(rq, env, "a", 4)
    await enqueue_ck(rq, env, "b", 2)
    leased = await take_ck(rq, env, 3)
    # Given both counters expired while 3 runs wait and 3 run
    await rq.client.delete(q.ck_queued_counter, q.ck_running_counter)
    # When one running run is nacked
    assert await rq.nack(leased[0], retry_at_ms=T0 + 5, now_ms=T0 + 2) is NackOutcome.REQUEUED
    # Then: running seeded 3, minus 1; queued seeded 3, plus 1
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (4, 2)
    for key in (q.ck_queued_counter, q.ck_running_counter):
        assert 86_390 <= await rq.client.ttl(key) <= 86_400


# --------------------------------------------------------------------------- reference ckCounters


class TestReferenceCkCounters:
    """The reference's 15 ``ckCounters`` cases (runqueue-semantics.md §6), in our words."""

    async def test_queued_aggregates_every_variant(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """1. Queued of the base queue is the sum over variants (4); the breakdown keeps
        each variant's own count (2, 1, 1)."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 2)
        await enqueue_ck(rq, env, "b", 1)
        await enqueue_ck(rq, env, "c", 1)
        stats = await rq.queue_stats(env, QUEUE, breakdown=True)
        assert stats.queued == 4
        assert {v.concurrency_key: v.queued for v in stats.variants} == {"a": 2, "b": 1, "c": 1}

    async def test_lazy_init_counts_ten_plus_five_backlog(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """2. 10 + 5 runs already queued without a counter, one more enqueue → 16."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 10)
        await enqueue_ck(rq, env, "b", 5)
        await rq.client.delete(qkeys(rq, env).ck_queued_counter)
        await enqueue_ck(rq, env, "a", 1, first=10)
        assert await queued_counter(rq, env) == 16

    async def test_keyless_enqueue_creates_no_counter(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """3. Keyless enqueues never create a counter."""
        rq = await make_queue()
        await enqueue_ck(rq, env, None, 5)
        assert await queued_counter(rq, env) is None
        assert await running_counter(rq, env) is None
        assert (await rq.queue_stats(env, QUEUE)).queued == 5

    async def test_mixed_three_keyless_two_keyed(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """4. 3 keyless + 2 keyed → 5 queued; the counter holds the keyed 2."""
        rq = await make_queue()
        await enqueue_ck(rq, env, None, 3)
        await enqueue_ck(rq, env, "a", 2)
        assert (await rq.queue_stats(env, QUEUE)).queued == 5
        assert await queued_counter(rq, env) == 2

    async def test_dequeue_decrements_queued_to_zero(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """5. Dequeueing every keyed run takes Queued down to 0."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 2)
        await enqueue_ck(rq, env, "b", 1)
        await take_ck(rq, env, 3)
        assert await queued_counter(rq, env) == 0
        assert (await rq.queue_stats(env, QUEUE)).queued == 0

    async def test_running_after_three_dequeues(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """6. Three dequeued keyed runs → Running 3.

        fairq: dequeue leases directly, so "popped from the worker queue" and "claimed"
        are the same moment."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 2)
        await enqueue_ck(rq, env, "b", 2)
        await take_ck(rq, env, 3)
        assert await running_counter(rq, env) == 3
        assert (await rq.queue_stats(env, QUEUE)).running == 3

    async def test_decrement_floors_at_zero(self, make_queue: MakeQueue, env: Environment) -> None:
        """7. A counter at 0 (set so from outside) stays 0 when a run leaves the queue."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 1)
        await rq.client.set(qkeys(rq, env).ck_queued_counter, 0, keepttl=True)
        await take_ck(rq, env, 1)
        assert await queued_counter(rq, env) == 0

    async def test_counter_ttl_default(self, make_queue: MakeQueue, env: Environment) -> None:
        """8. The counter's TTL after a keyed enqueue is 86,390–86,400 s."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 1)
        assert 86_390 <= await rq.client.ttl(qkeys(rq, env).ck_queued_counter) <= 86_400

    async def test_duplicate_enqueue_does_not_inflate(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """9. The same run enqueued twice counts once (also within one batch)."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 1)
        req = EnqueueRequest(env, QUEUE, "r-a-0", None, concurrency_key="a")
        results = await rq.enqueue_many([req, req], now_ms=T0)
        assert [r.status for r in results] == [EnqueueStatus.DUPLICATE] * 2
        assert await queued_counter(rq, env) == 1

    async def test_duplicate_nack_does_not_inflate(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """10. Nacking the same delivery twice requeues once.

        fairq: the second nack is refused outright (its lease token is spent), so it
        cannot reach the ZADD; the reference relied on ZADD returning 0."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 2)
        (d,) = await take_ck(rq, env, 1)
        assert await rq.nack(d, retry_at_ms=T0 + 5, now_ms=T0 + 2) is NackOutcome.REQUEUED
        assert await rq.nack(d, retry_at_ms=T0 + 5, now_ms=T0 + 2) is NackOutcome.LEASE_LOST
        assert (await queued_counter(rq, env), await running_counter(rq, env)) == (2, 0)

    async def test_duplicate_dequeue_does_not_inflate(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """11. A run is counted running once however often consumers try to take it.

        fairq: a claimed run leaves its variant's queue in the same script, so a second
        dequeue cannot see it; a double ack or a release after ack cannot deflate."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 1)
        (d,) = await take_ck(rq, env, 1)
        assert await rq.dequeue_from_queue(env, QUEUE, keyed=True, now_ms=T0 + 2) == []
        assert await rq.dequeue(10, now_ms=T0 + 2) == []
        assert await running_counter(rq, env) == 1
        await enqueue_ck(rq, env, "b", 1)
        (other,) = await take_ck(rq, env, 1, now=T0 + 3)
        assert await rq.ack([d], now_ms=T0 + 4) == [AckStatus.ACKED]
        assert await rq.ack([d], now_ms=T0 + 4) == [AckStatus.UNKNOWN]
        assert await rq.release([d], now_ms=T0 + 4) == [ReleaseStatus.UNKNOWN]
        assert await running_counter(rq, env) == 1
        assert await rq.ack([other], now_ms=T0 + 4) == [AckStatus.ACKED]
        assert await running_counter(rq, env) == 0

    async def test_nack_reseeds_after_expiry(self, make_queue: MakeQueue, env: Environment) -> None:
        """12. Counter gone, 2 runs still queued, one running run nacked → 3."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 3)
        (d,) = await take_ck(rq, env, 1)
        await rq.client.delete(qkeys(rq, env).ck_queued_counter)
        assert await rq.nack(d, retry_at_ms=T0 + 5, now_ms=T0 + 2) is NackOutcome.REQUEUED
        assert await queued_counter(rq, env) == 3

    async def test_running_only_variant_counted_when_seeding(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """13. Seeding Running counts a variant that has runs in flight but none queued → 5.

        Reference: a fast-pathed variant is absent from the CK index, so its seeding had
        to add the variant's own set by hand. fairq has no fast path; the same gap (a
        variant drained of queued runs leaves the index) is closed by seeding Running
        from the environment's in-flight set, which holds every slot holder."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "solo", 1)
        await take_ck(rq, env, 1)  # "solo" is now running-only: not in the CK index
        await enqueue_ck(rq, env, "a", 5)
        await take_ck(rq, env, 1)
        await take_ck(rq, env, 1)
        await take_ck(rq, env, 1)
        q = qkeys(rq, env)
        assert await rq.client.zscore(q.ck_index, "solo") is None
        await rq.client.delete(q.ck_running_counter)
        await take_ck(rq, env, 1)
        assert await running_counter(rq, env) == 5

    async def test_release_reseeds_running(self, make_queue: MakeQueue, env: Environment) -> None:
        """14. Counter gone, 2 running, one released → seeded 2, then 1."""
        rq = await make_queue()
        await enqueue_ck(rq, env, "a", 1)
        await enqueue_ck(rq, env, "b", 1)
        leased = await take_ck(rq, env, 2)
        await rq.client.delete(qkeys(rq, env).ck_running_counter)
        assert await rq.release([leased[0]], now_ms=T0 + 2) == [ReleaseStatus.RELEASED]
        assert await running_counter(rq, env) == 1

    async def test_counter_ttl_seconds_option(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """15. ``counter_ttl_seconds=60`` gives a TTL of 50–60 s."""
        rq = await make_queue(counter_ttl_seconds=60)
        await enqueue_ck(rq, env, "a", 1)
        await take_ck(rq, env, 1)
        for key in (qkeys(rq, env).ck_queued_counter, qkeys(rq, env).ck_running_counter):
            assert 50 <= await rq.client.ttl(key) <= 60


# --------------------------------------------------------------------------- drift sources (§4.2)


class TestDriftSourcesDesignedOut:
    """The reference lists three ways its counters drift. Each is closed in fairq."""

    async def test_re_enqueue_of_in_flight_run_is_a_no_op(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """Drift 1: the reference's re-enqueue freed a running run's slots without a
        decrement. fairq's enqueue of an existing run id writes nothing, so the run keeps
        its slot, Running stays exact, and a later ack takes it to 0."""
        rq = await make_queue()
        q = qkeys(rq, env)
        await enqueue_ck(rq, env, "a", 1)
        (d,) = await take_ck(rq, env, 1)
        before = await rq.client.hgetall(rq.keys.env(env).message(d.run_id))
        assert await rq.enqueue(
            env, QUEUE, d.run_id, {"again": 1}, concurrency_key="a", now_ms=T0 + 2
        ) is (EnqueueStatus.DUPLICATE)
        assert await rq.client.hgetall(rq.keys.env(env).message(d.run_id)) == before
        assert await rq.client.sismember(q.variant_inflight("a"), d.run_id)
        assert (await queued_counter(rq, env), await running_counter(rq, env)) == (0, 1)
        assert await rq.ack([d], now_ms=T0 + 3) == [AckStatus.ACKED]
        assert (await queued_counter(rq, env), await running_counter(rq, env)) == (0, 0)

    async def test_running_only_variants_are_seen_when_seeding(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """Drift 2: seeding Running from the CK index missed variants with nothing
        queued. fairq seeds Running from the environment's in-flight set (every slot
        holder, whatever its variant still has queued): with the index empty and three
        variants running, both the reader and the next counter operation see all of them.

        Ported: ``B:ckbusy`` is gone; the same property is asserted on the truth it was
        seeded from (the variant in-flight sets and ``V:inflight``), before and after."""
        rq = await make_queue()
        q = qkeys(rq, env)
        e = rq.keys.env(env)
        for ck in ("a", "b", "c"):
            await enqueue_ck(rq, env, ck, 2)
        leased = await take_ck(rq, env, 6)
        assert await rq.client.exists(q.ck_index) == 0
        for ck in ("a", "b", "c"):
            assert await rq.client.scard(q.variant_inflight(ck)) == 2
        assert {state.s(m) for m in await rq.client.smembers(e.inflight)} == {
            d.run_id for d in leased
        }
        await rq.client.delete(q.ck_running_counter)
        assert (await rq.queue_stats(env, QUEUE)).running == 6  # reader re-seeds
        await rq.client.delete(q.ck_running_counter)
        assert await rq.ack([leased[0]], now_ms=T0 + 2) == [AckStatus.ACKED]
        assert await running_counter(rq, env) == 5
        assert await rq.ack(leased[1:], now_ms=T0 + 2) == [AckStatus.ACKED] * 5
        assert await running_counter(rq, env) == 0
        for ck in ("a", "b", "c"):
            assert await rq.client.exists(q.variant_inflight(ck)) == 0
        assert await rq.client.exists(e.inflight) == 0

    async def test_no_untracked_script_version_exists(self) -> None:
        """Drift 3 (mixed versions): the reference shipped tracked and untracked twins of
        its CK scripts, and old writers ran beside new ones during a deploy. fairq has
        one script per operation (built once per order), and every variant membership
        change moves the counters in the same helper.

        Ported: the rewritten store changes variant keys in the helpers of runs.lua and
        claim.lua, which record the counter delta right beside each change (counters.lua
        applies them at the end of the script). So: no Lua function writes a variant's
        queued set without ``ck_queued_add`` or its in-flight set without
        ``ck_running_add``; no file but counters.lua names a counter key; and every
        script build that can move runs includes the counters and flushes them."""
        assert script_names()
        assert not [n for n in script_names() if "tracked" in n.lower()]
        lua = resources.files("fairq.store").joinpath("lua")
        entries = [*lua.iterdir(), *lua.joinpath("include").iterdir()]
        texts = {e.name: e.read_text() for e in entries if e.name.endswith(".lua")}
        assert "counters.lua" in texts and "runs.lua" in texts and "claim.lua" in texts
        write = re.compile(
            r"(?:redis\.call|call_chunked)\(\s*'(ZADD|ZREM|ZPOPMIN|ZPOPMAX|ZREMRANGEBY\w+|"
            r"ZUNIONSTORE|ZINTERSTORE|SADD|SREM|SPOP|SMOVE|DEL|UNLINK|RENAME\w*)'\s*,\s*"
            r"(variant_key\([^)]*'(queued|inflight)'\)|qkey|queued_key|flow_(slots|queued)_key\([^)]*\))"
        )
        offenders: list[str] = []
        writers: set[str] = set()
        for name, text in texts.items():
            if name == "counters.lua":
                continue
            offenders += [
                f"{name}: names {m.group(0)}"
                for m in re.finditer(r"ck_(queued|running)_counter|'tenant_running'", text)
            ]
            # one chunk per Lua function, nested in a block or not (and the script body
            # before the first one)
            for chunk in re.split(r"\n(?=\s*(?:local )?function \w+\()", text):
                head = re.match(r"\s*(?:local )?function (\w+)", chunk)
                where = f"{name}:{head.group(1) if head else '<body>'}"
                for m in write.finditer(chunk):
                    writers.add(where)
                    slots = m.group(3) == "inflight" or m.group(4) == "slots"
                    helper = "ck_running_add" if slots else "ck_queued_add"
                    if helper + "(" not in chunk:
                        offenders.append(f"{where}: {m.group(0)} without {helper}")
        assert offenders == []
        # the check saw the writers it is about (a renamed helper cannot empty it)
        assert {"runs.lua:place_queued", "runs.lua:unqueue", "runs.lua:free_slots"} <= writers
        assert {"claim.lua:claim", "claim.lua:claim_settle"} <= writers
        built = 0
        for name in script_names():
            for order in ("age", "fair") if uses_order(name) else (None,):
                source = assemble(name, order).text
                if re.search(r"\b(place_queued|unqueue|free_slots|claim)\(X", source):
                    built += 1
                    assert "local function counters_flush" in source, (name, order)
                    assert re.search(r"^state_flush\(X\)", source, re.MULTILINE), (name, order)
        assert built >= 10

    async def test_outside_drift_is_bounded_by_the_ttl(
        self, make_queue: MakeQueue, env: Environment
    ) -> None:
        """Whatever still writes variant keys behind the counters' back (an old
        deployment, a manual fix) is corrected when the counter expires: the next
        operation re-seeds from the truth."""
        rq = await make_queue()
        q = qkeys(rq, env)
        await enqueue_ck(rq, env, "a", 2)
        # an untracked writer adds a run to a variant directly
        await rq.client.zadd(q.variant_queued("a"), {"ghost": T0})
        await enqueue_ck(rq, env, "a", 1, first=2)
        assert await queued_counter(rq, env) == 3  # drifted by one
        await rq.client.delete(q.ck_queued_counter)  # the TTL ran out
        await enqueue_ck(rq, env, "a", 1, first=3)
        assert await queued_counter(rq, env) == 5 == (await variant_truth(rq, env))[0]


# --------------------------------------------------------------------------- readers


async def test_readers_re_seed_missing_counters(make_queue: MakeQueue, env: Environment) -> None:
    """With both counters gone, ``queue_stats`` and ``queues_stats`` still report the
    truth, and leave seeded counters behind."""
    rq = await make_queue()
    q = qkeys(rq, env)
    await enqueue_ck(rq, env, None, 2)
    await enqueue_ck(rq, env, "a", 4)
    await enqueue_ck(rq, env, "b", 3)
    await take_ck(rq, env, 2)
    await enqueue_ck(rq, env, None, 1, queue="other", tag="o")
    await rq.client.delete(q.ck_queued_counter, q.ck_running_counter)
    stats = await rq.queues_stats(env, [QUEUE, "other"], breakdown=True)
    assert [(s.queued, s.running) for s in stats] == [(2 + 5, 2), (1, 0)]
    assert sum(v.queued for v in stats[0].variants) == 5
    assert sum(v.running for v in stats[0].variants) == 2
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == (5, 2)
    assert await queued_counter(rq, env, "other") is None


async def test_counters_exact_under_the_fair_order(make_queue: MakeQueue, env: Environment) -> None:
    """The fair-order scripts share the counter helpers: same counts as the age order."""
    rq = await make_queue(vtime={"enabled": True})
    await enqueue_ck(rq, env, "a", 5)
    await enqueue_ck(rq, env, "b", 3)
    leased = await take_ck(rq, env, 4)
    await rq.nack(leased[0], retry_at_ms=T0 + 2, now_ms=T0 + 2)
    await rq.ack(leased[1:2], now_ms=T0 + 2)
    truth = await variant_truth(rq, env)
    assert truth == (5, 2)
    assert (await queued_counter(rq, env), await running_counter(rq, env)) == truth


async def test_encoded_concurrency_keys_count_like_plain_ones(
    make_queue: MakeQueue, env: Environment
) -> None:
    """Keys that need encoding (``:``, ``*``, spaces, non-ASCII) are counted per variant."""
    rq = await make_queue()
    odd = ["tenant:1", "*", "a b", "ünï"]
    for i, ck in enumerate(odd):
        await enqueue_ck(rq, env, ck, 2, tag=f"odd{i}")
    assert await rq.client.exists(qkeys(rq, env).variant_queued(encode_concurrency_key("*")))
    stats = await rq.queue_stats(env, QUEUE, breakdown=True)
    assert stats.queued == 8
    assert sorted(v.concurrency_key for v in stats.variants) == sorted(odd)

"""Ack: a finished run frees its slots and is forgotten; only its lease holder may ack."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.state import heads, run_state

from fairq.keys import Environment
from fairq.models import AckStatus
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def test_ack_frees_queue_and_env_concurrency(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", {"a": 1}, now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    assert (await rq.queue_stats(env, "q")).running == 1
    assert (await rq.env_stats(env)).running == 1

    assert await rq.ack([d], now_ms=T0 + 5) == [AckStatus.ACKED]

    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running, stats.oldest_score_ms) == (0, 0, None)
    assert (await rq.env_stats(env)).running == 0
    assert await run_state(rq, env, "r1") is None
    assert await heads(rq, env) == {}
    assert await rq.dequeue(10, now_ms=T0 + 10) == []


async def test_ack_deletes_the_run_and_its_lease(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    shard = rq.keys.shard(rq.keys.shard_of(env))
    message = rq.keys.env(env).message("r1")
    assert await rq.client.exists(message) == 1
    assert await rq.client.zscore(shard.leases, d.lease_member) is not None

    await rq.ack([d])

    assert await rq.client.exists(message) == 0
    assert await rq.client.zscore(shard.leases, d.lease_member) is None
    # nothing comes back when the (former) lease deadline passes
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 10 * 60_000) == 0


async def test_second_ack_reports_an_unknown_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    assert await rq.ack([d]) == [AckStatus.ACKED]
    assert await rq.ack([d]) == [AckStatus.UNKNOWN]


async def test_ack_of_a_queued_run_is_refused(make_queue: Any, env: Environment) -> None:
    """fairq's version of "ack before dequeue": without a delivery there is no lease."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    (d,) = await rq.dequeue(1, now_ms=T0)
    never_delivered = dataclasses.replace(d, run_id="r2", lease_token=0)

    assert await rq.ack([never_delivered]) == [AckStatus.LEASE_LOST]

    assert await run_state(rq, env, "r2") == "queued"
    assert (await rq.queue_stats(env, "q")).queued == 1
    assert (await rq.env_stats(env)).running == 1  # r1's slot is untouched


async def test_ack_with_a_wrong_delivery_token_changes_nothing(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)

    forged = dataclasses.replace(d, lease_token=d.lease_token + 1)
    assert await rq.ack([forged]) == [AckStatus.LEASE_LOST]
    assert await run_state(rq, env, "r1") == "running"
    assert (await rq.env_stats(env)).running == 1
    assert await rq.ack([d]) == [AckStatus.ACKED]


async def test_ack_frees_a_slot_for_the_next_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    (d,) = await rq.dequeue(10, now_ms=T0 + 1)
    assert await rq.dequeue(10, now_ms=T0 + 1) == []

    await rq.ack([d])

    assert [x.run_id for x in await rq.dequeue(10, now_ms=T0 + 1)] == ["r2"]


async def test_ack_of_a_keyed_run_frees_its_variant(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.enqueue(env, "q", "a1", concurrency_key="a", now_ms=T0)
    await rq.enqueue(env, "q", "a2", concurrency_key="a", now_ms=T0 + 1)
    (d,) = await rq.dequeue(10, now_ms=T0 + 1)
    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (1, 1)

    await rq.ack([d])

    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (1, 0)
    assert [(v.concurrency_key, v.running) for v in stats.variants] == [("a", 0)]
    q = rq.keys.queue(env, "q")
    assert await rq.client.smembers(q.variant_inflight("a")) == set()
    assert [x.run_id for x in await rq.dequeue(10, now_ms=T0 + 1)] == ["a2"]


async def test_batched_ack_across_shards_keeps_order(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(shard_count=8)
    envs = [Environment("o", "p", name) for name in ("env1", "env2", "env3", "env4", "e1234")]
    for e in envs:
        await rq.enqueue(e, "q", "r", now_ms=T0)
        await rq.enqueue(e, "q", "s", now_ms=T0 + 1)
    got = []
    for _ in range(5):
        got += await rq.dequeue(100, now_ms=T0 + 1)
    assert len(got) == 10
    stale = got[3]
    assert await rq.ack([stale]) == [AckStatus.ACKED]

    statuses = await rq.ack(list(reversed(got)))

    expected = [AckStatus.UNKNOWN if d is stale else AckStatus.ACKED for d in reversed(got)]
    assert statuses == expected
    for e in envs:
        assert (await rq.env_stats(e)).running == 0
        assert (await rq.queue_stats(e, "q")).running == 0


async def test_ack_of_nothing_is_fine(make_queue: Any) -> None:
    rq: RunQueue = await make_queue()
    assert await rq.ack([]) == []


async def test_batch_results_follow_positions_even_for_a_repeated_run(make_queue, env) -> None:
    """Given one delivery listed twice in one ack call,
    when it is acked, then the first entry reports ACKED and the repeat UNKNOWN."""
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, now_ms=1_000)
    (delivery,) = await rq.dequeue_from_queue(env, "q", keyed=False, now_ms=2_000)
    assert await rq.ack([delivery, delivery], now_ms=3_000) == [AckStatus.ACKED, AckStatus.UNKNOWN]


async def test_a_refused_finish_writes_no_outcome(make_queue: Any, env: Environment) -> None:
    """The outcome is written by the ack script itself, only for a run it acks: a finish
    under a lost lease (the run was reclaimed and delivered again) leaves none."""
    from fairq.models import Finish
    from fairq.outcomes import KeptOutcome

    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (first,) = await rq.dequeue(1, lease_ms=1_000, now_ms=T0)
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + 2_000) == 1
    (second,) = await rq.dequeue(1, now_ms=T0 + 2_000)
    stale = Finish(first, "completed", KeptOutcome("1"))
    assert await rq.finish([stale], now_ms=T0 + 2_001) == [AckStatus.LEASE_LOST]
    assert await rq.client.exists(rq.keys.env(env).outcome("r1")) == 0
    fresh = Finish(second, "completed", KeptOutcome("2"))
    assert await rq.finish([fresh], now_ms=T0 + 2_002) == [AckStatus.ACKED]
    assert await rq.client.exists(rq.keys.env(env).outcome("r1")) == 1


# ------------------------------------------------------------------ the outcome it writes


async def test_finish_records_the_outcome_from_the_run_and_the_worker_parts(
    make_queue: Any, env: Environment
) -> None:
    """Given a keyed run of a named tenant on its second attempt, when its worker finishes
    it as failed with an error, a traceback and a result, then the ack script writes the
    outcome: the worker's texts exactly (quotes, newlines, non-ASCII), the result spliced
    in as JSON (an integer beyond a double's precision intact), and from the run itself
    its queue, key, tenant, attempts (this failed one counted), lease start and the
    script's clock."""
    from fairq.models import Finish
    from fairq.outcomes import KeptOutcome, RunStatus

    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="k é", tenant="acme", now_ms=T0)
    (first,) = await rq.dequeue(1, now_ms=T0 + 1)
    await rq.nack(first, retry_at_ms=T0 + 2, now_ms=T0 + 2)
    (d,) = await rq.dequeue(1, now_ms=T0 + 10)
    error = 'ValueError: "bad" row\n7 ünïcode ☃'
    traceback = 'Traceback (most recent call last):\n  File "job.py"\nValueError\n'
    result = '{"big": 12345678901234567890, "list": [1, "two"]}'
    kept = KeptOutcome(result, error, traceback)
    assert await rq.finish([Finish(d, "failed", kept)], now_ms=T0 + 50) == [AckStatus.ACKED]
    info = await rq.get_run(env, "r1")
    assert info is not None
    assert (info.status, info.queue, info.concurrency_key, info.tenant) == (
        RunStatus.FAILED, "q", "k é", "acme",
    )  # fmt: skip
    assert (info.attempts, info.error, info.traceback) == (2, error, traceback)
    assert (info.started_at_ms, info.finished_at_ms) == (T0 + 10, T0 + 50)
    assert info.result == {"big": 12345678901234567890, "list": [1, "two"]}


async def test_a_completed_run_keeps_its_attempts_and_a_none_error_is_absent(
    make_queue: Any, env: Environment
) -> None:
    from fairq.models import Finish
    from fairq.outcomes import KeptOutcome, RunStatus

    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    await rq.finish([Finish(d, "completed", KeptOutcome("[1]"))], now_ms=T0 + 5)
    info = await rq.get_run(env, "r1")
    assert info is not None
    assert (info.status, info.attempts, info.result, info.error, info.traceback) == (
        RunStatus.COMPLETED, 0, [1], None, None,
    )  # fmt: skip
    raw = await rq.client.get(rq.keys.env(env).outcome("r1"))
    assert b'"error"' not in raw and b'"tenant":""' in raw


async def test_a_badly_packed_outcome_is_refused_before_anything_is_written(
    make_queue: Any, env: Environment
) -> None:
    """The script checks every run's kept outcome before its first write: a packing cut
    short refuses the whole call, and the run stays leased."""
    from fairq.errors import InvalidLimitError

    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    tag = rq.keys.tag_of(env)
    for packed in ("5 - abc", "x - null", "- - ", "3 -"):
        args = [d.lease_member, str(d.lease_token), packed, "completed"]
        with pytest.raises(InvalidLimitError, match="kept outcome"):
            await rq.call("ack", "age", tag, args, T0 + 1)
    assert await run_state(rq, env, "r1") == "running"
    assert await rq.client.exists(rq.keys.env(env).outcome("r1")) == 0

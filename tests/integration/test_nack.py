"""Nack: requeue with attempts and exponential backoff; dead-letter at the last attempt."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.state import run_state

from fairq.config import RetryPolicy
from fairq.keys import Environment
from fairq.models import Delivery, NackOutcome
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def lease_one(rq: RunQueue, now: int) -> Delivery:
    (d,) = await rq.dequeue(1, now_ms=now)
    return d


async def test_nack_frees_concurrency_and_requeues_with_attempt_one(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", {"p": 1}, now_ms=T0)
    d = await lease_one(rq, T0)

    assert await rq.nack(d, now_ms=T0 + 10) is NackOutcome.REQUEUED

    assert await run_state(rq, env, "r1") == "queued"
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (1, 0)
    assert (await rq.env_stats(env)).running == 0
    again = await lease_one(rq, T0 + 60_000)
    assert (again.run_id, again.attempt, again.lease_token) == ("r1", 1, 2)
    assert again.payload == {"p": 1}
    assert again.enqueued_at_ms == T0


@pytest.mark.parametrize("attempt, low, high", [(1, 1_000, 2_000), (2, 2_000, 4_000)])
async def test_nack_backs_off_exponentially_with_jitter(
    make_queue: Any, env: Environment, attempt: int, low: int, high: int
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    now = T0
    for _ in range(attempt):
        d = await lease_one(rq, now)
        await rq.nack(d, now_ms=now)
        retry_at = (await rq.queue_stats(env, "q")).oldest_score_ms
        assert retry_at is not None
        if d.attempt + 1 == attempt:
            assert now + low <= retry_at <= now + high
            assert await rq.dequeue(10, now_ms=retry_at - 1) == []
            # the wait hint points at the retry: due 1 ms after that clock
            assert (await rq.dequeue_batch(10, now_ms=retry_at - 1)).wait_ms == 1
        now = retry_at


async def test_backoff_is_capped_at_one_hour(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=100))
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)
    # the backoff follows the attempt the delivery reports (here: many failures already)
    late = dataclasses.replace(d, attempt=20)
    await rq.nack(late, now_ms=T0)
    retry_at = (await rq.queue_stats(env, "q")).oldest_score_ms
    assert retry_at == T0 + 3_600_000


async def test_last_attempt_goes_to_the_dead_letter_queue(
    make_queue: Any, env: Environment
) -> None:
    """maxAttempts 2: the first nack requeues, the second dead-letters."""
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=2))
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)
    assert await rq.nack(d, retry_at_ms=T0 + 1, now_ms=T0) is NackOutcome.REQUEUED
    d = await lease_one(rq, T0 + 1)
    assert d.attempt == 1

    assert await rq.nack(d, now_ms=T0 + 2) is NackOutcome.DEAD_LETTERED

    assert await run_state(rq, env, "r1") == "dlq"
    assert (await rq.env_stats(env)).dead_lettered == 1
    assert (await rq.env_stats(env)).running == 0
    stats = await rq.queue_stats(env, "q")
    assert (stats.queued, stats.running) == (0, 0)
    assert await rq.dequeue(10, now_ms=T0 + 10**9) == []
    (dead,) = await rq.dead_letters(env)
    assert (dead.run_id, dead.attempt, dead.dead_lettered_at_ms) == ("r1", 2, T0 + 2)


async def test_max_attempts_can_be_given_per_nack(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)
    assert await rq.nack(d, max_attempts=1, now_ms=T0) is NackOutcome.DEAD_LETTERED


async def test_default_policy_allows_twelve_attempts(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    outcomes = []
    for i in range(12):
        d = await lease_one(rq, T0 + i)
        outcomes.append(await rq.nack(d, retry_at_ms=T0 + i + 1, now_ms=T0 + i))
    assert outcomes == [NackOutcome.REQUEUED] * 11 + [NackOutcome.DEAD_LETTERED]


async def test_retry_at_sets_the_new_score(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)

    await rq.nack(d, retry_at_ms=T0 + 42_000, now_ms=T0)

    assert (await rq.queue_stats(env, "q")).oldest_score_ms == T0 + 42_000
    assert await rq.dequeue(1, now_ms=T0 + 41_999) == []
    again = await lease_one(rq, T0 + 42_000)
    assert again.score_ms == T0 + 42_000


async def test_nack_without_incrementing_keeps_the_attempt(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1))
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)

    outcome = await rq.nack(d, increment_attempt=False, now_ms=T0 + 5)

    # never dead-letters, and retries at once
    assert outcome is NackOutcome.REQUEUED
    assert (await rq.queue_stats(env, "q")).oldest_score_ms == T0 + 5
    again = await lease_one(rq, T0 + 5)
    assert (again.attempt, again.lease_token) == (0, 2)


async def test_nacked_run_queues_behind_older_runs(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    d = await lease_one(rq, T0 + 1)
    await rq.nack(d, retry_at_ms=T0 + 2, now_ms=T0 + 2)
    got = await rq.dequeue(10, now_ms=T0 + 3)
    assert [x.run_id for x in got] == ["r2", "r1"]


async def test_nack_frees_a_gated_slot(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    d = await lease_one(rq, T0 + 1)
    await rq.nack(d, retry_at_ms=T0 + 1_000, now_ms=T0 + 1)
    assert [x.run_id for x in await rq.dequeue(10, now_ms=T0 + 1)] == ["r2"]


async def test_nack_with_a_stale_delivery_reports_lease_lost(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)
    await rq.nack(d, retry_at_ms=T0, now_ms=T0)
    fresh = await lease_one(rq, T0)

    assert await rq.nack(d, now_ms=T0) is NackOutcome.LEASE_LOST

    assert await run_state(rq, env, "r1") == "running"
    assert (await rq.env_stats(env)).running == 1
    assert await rq.nack(fresh, retry_at_ms=T0, now_ms=T0) is NackOutcome.REQUEUED


async def test_nack_after_ack_reports_an_unknown_run(make_queue: Any, env: Environment) -> None:
    """The full outcome: the run is gone (UNKNOWN), not merely someone else's (LEASE_LOST)."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    d = await lease_one(rq, T0)
    await rq.ack([d])
    assert await rq.nack(d, now_ms=T0) is NackOutcome.UNKNOWN
    assert await run_state(rq, env, "r1") is None


async def test_nack_of_a_keyed_run_returns_it_to_its_variant(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", concurrency_key="tenant:1", now_ms=T0)
    d = await lease_one(rq, T0)
    await rq.nack(d, retry_at_ms=T0 + 100, now_ms=T0)
    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (1, 0)
    assert [(v.concurrency_key, v.queued, v.oldest_score_ms) for v in stats.variants] == [
        ("tenant:1", 1, T0 + 100)
    ]
    again = await lease_one(rq, T0 + 100)
    assert (again.concurrency_key, again.attempt) == ("tenant:1", 1)


async def test_a_dead_letter_keeps_its_outcome_only_when_asked(
    make_queue: Any, env: Environment
) -> None:
    """Given two runs at their last attempt, when one is nacked asking to keep its outcome
    and the other not, then only the first has one: dead_lettered, its queue, key, tenant
    and attempts, the attempt's error and traceback, its lease start and the script's
    clock (a retry keeps none, whatever it asks)."""
    from fairq.outcomes import RunStatus

    rq: RunQueue = await make_queue()
    for run in ("kept", "bare", "retried"):
        await rq.enqueue(env, "q", run, concurrency_key=f"k-{run}", tenant="acme", now_ms=T0)
    got = {d.run_id: d for d in await rq.dequeue(3, now_ms=T0 + 1)}
    kept, bare, retried = got["kept"], got["bare"], got["retried"]
    args = {"max_attempts": 1, "error": "E: boom", "traceback": "tb\n", "now_ms": T0 + 9}
    assert await rq.nack(kept, keep_outcome=True, **args) is NackOutcome.DEAD_LETTERED
    assert await rq.nack(bare, **args) is NackOutcome.DEAD_LETTERED
    assert (
        await rq.nack(retried, max_attempts=2, keep_outcome=True, now_ms=T0 + 9)
        is NackOutcome.REQUEUED
    )
    outcome_of = rq.keys.env(env).outcome
    assert [await rq.client.exists(outcome_of(r.run_id)) for r in (kept, bare, retried)] == [
        1, 0, 0,
    ]  # fmt: skip
    info = await rq.get_run(env, kept.run_id)
    assert info is not None
    assert (info.status, info.concurrency_key, info.tenant, info.attempts) == (
        RunStatus.DEAD_LETTERED, "k-kept", "acme", 1,
    )  # fmt: skip
    raw = await rq.client.get(outcome_of(kept.run_id))
    from fairq.outcomes import decode_outcome

    stored = decode_outcome(kept.run_id, raw)
    assert (stored.error, stored.traceback) == ("E: boom", "tb\n")
    assert (stored.started_at_ms, stored.finished_at_ms, stored.result) == (T0 + 1, T0 + 9, None)

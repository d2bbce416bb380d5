"""Dead-letter queue: listing, and redrive back to the run's queue with attempt 0."""

from __future__ import annotations

from typing import Any

import pytest
from tests.state import run_state

from fairq.config import RetryPolicy
from fairq.errors import RunNotFoundError
from fairq.keys import Environment
from fairq.models import EnqueueStatus, NackOutcome
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def dead_letter(
    rq: RunQueue, env: Environment, run_id: str, *, now: int, ck: str | None = None
) -> None:
    await rq.enqueue(env, "q", run_id, {"run": run_id}, concurrency_key=ck, now_ms=now)
    got = await rq.dequeue(100, now_ms=now)
    (d,) = [x for x in got if x.run_id == run_id]
    assert await rq.nack(d, now_ms=now) is NackOutcome.DEAD_LETTERED


async def test_dead_letters_are_listed_oldest_first(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1))
    await dead_letter(rq, env, "r2", now=T0 + 5)
    await dead_letter(rq, env, "r1", now=T0 + 10, ck="tenant:*")

    dead = await rq.dead_letters(env)

    assert [(x.run_id, x.queue, x.attempt) for x in dead] == [("r2", "q", 1), ("r1", "q", 1)]
    # scores are milliseconds, not seconds
    assert [x.dead_lettered_at_ms for x in dead] == [T0 + 5, T0 + 10]
    assert [x.concurrency_key for x in dead] == [None, "tenant:*"]
    assert dead[1].payload_json == '{"run":"r1"}'
    assert (await rq.env_stats(env)).dead_lettered == 2
    assert len(await rq.dead_letters(env, limit=1)) == 1


async def test_redrive_makes_a_run_dequeuable_again_with_attempt_zero(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1))
    await dead_letter(rq, env, "r1", now=T0)

    await rq.redrive(env, "r1", now_ms=T0 + 100)

    assert await rq.dead_letters(env) == []
    assert (await rq.env_stats(env)).dead_lettered == 0
    assert await run_state(rq, env, "r1") == "queued"
    assert (await rq.queue_stats(env, "q")).oldest_score_ms == T0 + 100
    (d,) = await rq.dequeue(10, now_ms=T0 + 100)
    assert (d.run_id, d.attempt, d.lease_token, d.payload) == ("r1", 0, 2, {"run": "r1"})
    assert (await rq.env_stats(env)).running == 1


async def test_redriven_run_gets_its_full_retry_budget_again(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=2))
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    await rq.nack(d, retry_at_ms=T0, now_ms=T0)
    (d,) = await rq.dequeue(1, now_ms=T0)
    assert await rq.nack(d, now_ms=T0) is NackOutcome.DEAD_LETTERED

    await rq.redrive(env, "r1", now_ms=T0)

    (d,) = await rq.dequeue(1, now_ms=T0)
    assert await rq.nack(d, retry_at_ms=T0, now_ms=T0) is NackOutcome.REQUEUED


async def test_redrive_of_a_keyed_run_returns_it_to_its_variant(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1))
    await dead_letter(rq, env, "r1", now=T0, ck="*")
    await rq.enqueue(env, "q", "other", concurrency_key="b", now_ms=T0 + 1)

    await rq.redrive(env, "r1", now_ms=T0 + 2)

    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert sorted((v.concurrency_key, v.queued) for v in stats.variants) == [("*", 1), ("b", 1)]
    got = await rq.dequeue(10, now_ms=T0 + 2)
    assert sorted((x.run_id, x.concurrency_key) for x in got) == [("other", "b"), ("r1", "*")]


async def test_redrive_of_an_unknown_run_raises(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    with pytest.raises(RunNotFoundError) as info:
        await rq.redrive(env, "nope", now_ms=T0)
    assert info.value.run_id == "nope"


async def test_redrive_of_a_live_run_raises_and_changes_nothing(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "queued", now_ms=T0)
    await rq.enqueue(env, "q", "running", now_ms=T0 - 1)
    (d,) = await rq.dequeue(1, now_ms=T0)
    assert d.run_id == "running"

    for run_id in ("queued", "running"):
        with pytest.raises(RunNotFoundError):
            await rq.redrive(env, run_id, now_ms=T0)

    assert await run_state(rq, env, "queued") == "queued"
    assert await run_state(rq, env, "running") == "running"
    assert (await rq.queue_stats(env, "q")).queued == 1


async def test_redrive_twice_raises_the_second_time(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1))
    await dead_letter(rq, env, "r1", now=T0)
    await rq.redrive(env, "r1", now_ms=T0)
    with pytest.raises(RunNotFoundError):
        await rq.redrive(env, "r1", now_ms=T0)
    assert (await rq.queue_stats(env, "q")).queued == 1


async def test_dead_lettered_run_id_cannot_be_enqueued_again(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1))
    await dead_letter(rq, env, "r1", now=T0)
    assert await rq.enqueue(env, "q", "r1", now_ms=T0) is EnqueueStatus.DUPLICATE
    assert len(await rq.dead_letters(env)) == 1


async def test_dead_letters_are_per_environment(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(retry=RetryPolicy(max_attempts=1), shard_count=2)
    a, b = Environment("o", "p", "env1"), Environment("o", "p", "env3")
    await dead_letter(rq, a, "r1", now=T0)
    assert [x.run_id for x in await rq.dead_letters(a)] == ["r1"]
    assert await rq.dead_letters(b) == []
    with pytest.raises(RunNotFoundError):
        await rq.redrive(b, "r1", now_ms=T0)

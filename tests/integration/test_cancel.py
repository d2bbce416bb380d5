"""Cancelling a run: a queued one never gets delivered, a dead letter leaves the DLQ
(both end ``cancelled``), a running one is marked for its worker to stop; counts and
indexes follow."""

from __future__ import annotations

from typing import Any

import pytest
from tests.state import ready_tenants, run_state

from fairq.errors import InvalidLimitError, InvalidNameError
from fairq.keys import Environment
from fairq.models import AckStatus, CancelOutcome, HeartbeatStatus
from fairq.outcomes import RunStatus


async def _keys(rq: Any) -> dict[str, Any]:
    """Every key of the test prefix with its contents (to show nothing changed)."""
    out: dict[str, Any] = {}
    async for key in rq.client.scan_iter(match=f"*{rq.keys.prefix}*"):
        kind = (await rq.client.type(key)).decode()
        if kind == "hash":
            out[key] = await rq.client.hgetall(key)
        elif kind == "zset":
            out[key] = await rq.client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = sorted(await rq.client.smembers(key))
        elif kind == "string":
            out[key] = await rq.client.get(key)
    return out


@pytest.mark.parametrize("fair", [False, True], ids=["age-order", "fair-order"])
async def test_a_cancelled_queued_run_is_never_delivered(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    rq = await make_queue(vtime={"enabled": fair})
    await rq.enqueue(env, "q", "keep", {}, concurrency_key="a", now_ms=1_000)
    await rq.enqueue(env, "q", "drop", {}, concurrency_key="a", now_ms=1_001)
    await rq.enqueue(env, "q", "plain", {}, now_ms=1_002)

    assert await rq.cancel(env, "drop", now_ms=2_000) is CancelOutcome.CANCELLED
    assert await rq.cancel(env, "plain", now_ms=2_000) is CancelOutcome.CANCELLED

    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (1, 0)
    assert [(v.concurrency_key, v.queued) for v in stats.variants] == [("a", 1)]
    served = await rq.dequeue(10, now_ms=3_000)
    assert [d.run_id for d in served] == ["keep"]
    assert await run_state(rq, env, "drop") is None


@pytest.mark.parametrize("fair", [False, True], ids=["age-order", "fair-order"])
async def test_cancelling_the_last_run_of_a_variant_drains_it(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    rq = await make_queue(vtime={"enabled": fair})
    await rq.enqueue(env, "q", "only", {}, concurrency_key="solo", now_ms=1_000)
    q = rq.keys.queue(env, "q")

    assert await rq.cancel(env, "only", now_ms=2_000) is CancelOutcome.CANCELLED

    assert await rq.client.zcard(q.ck_index) == 0
    assert await rq.client.zcard(rq.keys.shard(rq.keys.shard_of(env)).heads) == 0
    # the variant left the order's candidates (its tenant's tag stays, as parked credit)
    assert "solo" not in await ready_tenants(rq, env, "q")
    assert int(await rq.client.get(q.ck_queued_counter) or 0) == 0


async def test_cancelling_a_running_run_asks_its_worker_and_changes_nothing_else(
    make_queue: Any, env: Environment
) -> None:
    """A running run is not removed: it is marked, its worker hears it (heartbeat), stops
    it and finishes it as cancelled. No other key changes."""
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, concurrency_key="a", now_ms=1_000)
    (delivery,) = await rq.dequeue(1, now_ms=2_000)
    before = await _keys(rq)

    assert await rq.cancel(env, "r1", now_ms=3_000) is CancelOutcome.CANCEL_REQUESTED

    after = await _keys(rq)
    message = rq.keys.env(env).message("r1").encode()
    assert {k for k in after if after[k] != before.get(k)} == {message}
    assert await run_state(rq, env, "r1") == "running"
    assert await rq.heartbeat([delivery], now_ms=3_500) == [HeartbeatStatus.CANCEL_REQUESTED]
    assert await rq.ack([delivery], now_ms=4_000) == [AckStatus.ACKED]


async def test_cancelling_a_dead_letter_removes_it(make_queue: Any, env: Environment) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, now_ms=1_000)
    (delivery,) = await rq.dequeue(1, now_ms=2_000)
    await rq.nack(delivery, max_attempts=1, now_ms=3_000)
    assert [d.run_id for d in await rq.dead_letters(env)] == ["r1"]

    assert await rq.cancel(env, "r1", now_ms=4_000) is CancelOutcome.REMOVED_FROM_DLQ

    assert await rq.dead_letters(env) == []
    assert (await rq.env_stats(env)).dead_lettered == 0


async def test_a_cancelled_run_with_a_ttl_is_not_reported_as_expired(
    make_queue: Any, env: Environment
) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, ttl_ms=1_000, now_ms=1_000)
    assert await rq.cancel(env, "r1", now_ms=1_500) is CancelOutcome.CANCELLED

    assert await rq.expire_ttl(now_ms=10_000) == 0
    info = await rq.get_run(env, "r1")
    assert info is not None and info.status is RunStatus.CANCELLED
    assert [r.status for r in await rq.recent_runs(env, "q")] == [RunStatus.CANCELLED]


async def test_unknown_and_invalid_runs(make_queue: Any, env: Environment) -> None:
    rq = await make_queue()
    assert await rq.cancel(env, "never", now_ms=1_000) is CancelOutcome.UNKNOWN
    with pytest.raises(InvalidNameError):
        await rq.cancel(env, "a:b", now_ms=1_000)


# ------------------------------------------------------------------ only_if


async def _dead_letter(rq: Any, env: Environment, run_id: str) -> None:
    await rq.enqueue(env, "q", run_id, {}, now_ms=1_000)
    (delivery,) = await rq.dequeue(1, now_ms=2_000)
    await rq.nack(delivery, max_attempts=1, now_ms=3_000)


@pytest.mark.parametrize("fair", [False, True], ids=["age-order", "fair-order"])
async def test_a_dead_letter_redriven_after_it_was_seen_is_not_deleted(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    """The interleaving `fairq dlq delete` and the dashboard meet: an operator sees a dead
    letter, someone redrives it, then the delete arrives. Asked to act only on a dead
    letter, the cancel leaves the redriven run queued, and it is delivered."""
    rq = await make_queue(vtime={"enabled": fair})
    await _dead_letter(rq, env, "r1")
    seen = await rq.get_run(env, "r1")
    assert seen is not None and seen.status is RunStatus.DEAD_LETTERED
    await rq.redrive(env, "r1", now_ms=4_000)
    before = await _keys(rq)

    outcome = await rq.cancel(env, "r1", only_if=RunStatus.DEAD_LETTERED, now_ms=5_000)

    assert outcome is CancelOutcome.NOT_IN_STATE
    assert await _keys(rq) == before
    assert [d.run_id for d in await rq.dequeue(1, now_ms=6_000)] == ["r1"]


async def test_only_if_acts_on_a_run_in_that_state(make_queue: Any, env: Environment) -> None:
    rq = await make_queue()
    await _dead_letter(rq, env, "dead")
    await rq.enqueue(env, "q", "queued", {}, now_ms=3_500)

    assert (
        await rq.cancel(env, "dead", only_if=RunStatus.DEAD_LETTERED, now_ms=4_000)
        is CancelOutcome.REMOVED_FROM_DLQ
    )
    assert (
        await rq.cancel(env, "queued", only_if=RunStatus.QUEUED, now_ms=4_000)
        is CancelOutcome.CANCELLED
    )
    assert await rq.dead_letters(env) == []
    assert await rq.dequeue(10, now_ms=5_000) == []


async def test_only_if_leaves_a_run_in_another_state_unchanged(
    make_queue: Any, env: Environment
) -> None:
    rq = await make_queue()
    await _dead_letter(rq, env, "dead")
    await rq.enqueue(env, "q", "busy", {}, now_ms=3_500)
    (delivery,) = await rq.dequeue(1, now_ms=3_600)
    await rq.enqueue(env, "q", "waiting", {}, now_ms=3_700)
    before = await _keys(rq)

    asked = {
        "dead": RunStatus.QUEUED,
        "busy": RunStatus.DEAD_LETTERED,
        "waiting": RunStatus.RUNNING,
    }
    for run_id, state in asked.items():
        assert (
            await rq.cancel(env, run_id, only_if=state, now_ms=4_000) is CancelOutcome.NOT_IN_STATE
        ), run_id
    assert await _keys(rq) == before
    # in its own state it is acted on: the running run is asked to stop
    assert (
        await rq.cancel(env, "busy", only_if=RunStatus.RUNNING, now_ms=4_000)
        is CancelOutcome.CANCEL_REQUESTED
    )
    assert await rq.heartbeat([delivery], now_ms=4_500) == [HeartbeatStatus.CANCEL_REQUESTED]
    # a run fairq knows nothing of is unknown, whatever state was asked for
    assert (
        await rq.cancel(env, "never", only_if=RunStatus.QUEUED, now_ms=4_000)
        is CancelOutcome.UNKNOWN
    )


@pytest.mark.parametrize("state", [RunStatus.COMPLETED, RunStatus.CANCELLED, "dlq"])
async def test_only_if_a_state_no_run_can_be_cancelled_in_is_refused(
    make_queue: Any, env: Environment, state: Any
) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, now_ms=1_000)
    before = await _keys(rq)
    with pytest.raises(InvalidLimitError, match=r"only_if .*must be one of"):
        await rq.cancel(env, "r1", only_if=state, now_ms=2_000)
    assert await _keys(rq) == before


async def test_the_script_refuses_an_unknown_state_and_writes_nothing(
    make_queue: Any, env: Environment
) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, now_ms=1_000)
    before = await _keys(rq)
    with pytest.raises(InvalidLimitError, match="state must be one of"):
        await rq.call_for_env("cancel", env, [env.id, "r1", "done"], 2_000)
    assert await _keys(rq) == before

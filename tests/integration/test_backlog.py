"""Autoscaling signals (RunQueue.queue_backlog): the ready runs more workers could serve
now vs those held by caps, rates and pauses, and the delayed ones. Checked against what a
dequeue then does: one call big enough for everything starts exactly the servable runs.

Logical clock: every call passes ``now_ms``.
"""

from __future__ import annotations

from typing import Any

from tests.integration.limits_support import T0, Order, both_orders, enqueue_runs, queue_for

from fairq.keys import Environment
from fairq.store import RunQueue
from fairq.store.backlog import HELD_GATES, env_backlog

Q = "scaled"
NOW = T0 + 10_000


async def _queue(make_queue: Any, order: Order, env: Environment) -> RunQueue:
    """A capped key (cap 2, 10 ready runs), a rate-limited tenant (1/s, burst 3, 10 ready
    runs), 5 keyless runs and 4 runs of another key due in 5 s."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=1000)
    await rq.set_key_concurrency(env, Q, "capped", 2)
    await rq.set_rate_limit(env, Q, 1.0, burst=3, tenant="R")
    await enqueue_runs(rq, env, Q, "c", 10, key="capped")
    await enqueue_runs(rq, env, Q, "r", 10, key="r1", tenant="R", at=T0 + 20)
    await enqueue_runs(rq, env, Q, "n", 5, at=T0 + 40)
    await enqueue_runs(rq, env, Q, "d", 4, key="later", at=NOW + 5_000)
    return rq


def _held(**gates: int) -> dict[str, int]:
    return {g: gates.get(g, 0) for g in HELD_GATES}


@both_orders
async def test_servable_is_what_a_dequeue_starts(
    make_queue: Any, env: Environment, order: Order
) -> None:
    rq = await _queue(make_queue, order, env)
    b = await rq.queue_backlog(env, Q, now_ms=NOW)
    assert (b.servable, b.delayed, b.running) == (10, 4, 0)
    assert b.held == _held(key_cap=8, tenant_rate=7)
    got = await rq.dequeue(1000, env=env, queues=[Q], now_ms=NOW)
    assert len(got) == b.servable
    after = await rq.queue_backlog(env, Q, now_ms=NOW)
    assert (after.servable, after.delayed, after.running) == (0, 4, 10)
    assert after.held == _held(key_cap=8, tenant_rate=7)
    # two seconds on: two more tokens for the tenant, the delayed runs still not due
    later = await rq.queue_backlog(env, Q, now_ms=NOW + 2_000)
    assert (later.servable, later.held["tenant_rate"]) == (2, 5)
    # the capped key's runs finish: its two slots are servable again
    await rq.ack([d for d in got if d.concurrency_key == "capped"], now_ms=NOW + 2_000)
    freed = await rq.queue_backlog(env, Q, now_ms=NOW + 2_000)
    assert (freed.servable, freed.held["key_cap"], freed.running) == (4, 6, 8)
    due = await rq.queue_backlog(env, Q, now_ms=NOW + 5_100)
    # 4 runs due, the key's 2 free slots, 3 tokens (the burst caps what 5 s refilled)
    assert (due.delayed, due.servable) == (0, 4 + 2 + 3)


@both_orders
async def test_a_paused_queue_holds_its_whole_ready_backlog(
    make_queue: Any, env: Environment, order: Order
) -> None:
    rq = await _queue(make_queue, order, env)
    await rq.pause_queue(env, Q)
    b = await rq.queue_backlog(env, Q, now_ms=NOW)
    assert (b.servable, b.delayed) == (0, 4)
    assert b.held == _held(paused=25)
    assert await rq.dequeue(1000, env=env, queues=[Q], now_ms=NOW) == []
    await rq.resume_queue(env, Q)
    assert (await rq.queue_backlog(env, Q, now_ms=NOW)).servable == 10


@both_orders
async def test_total_and_env_caps_hold_the_rest(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A queue total of 6 over the 10 servable runs: 6 servable, 4 more held by it; an
    environment limit of 4 below that: 4 servable."""
    rq = await _queue(make_queue, order, env)
    await rq.set_queue_total_concurrency(env, Q, 6)
    b = await rq.queue_backlog(env, Q, now_ms=NOW)
    assert b.servable == 6 and b.held_total == 25 - 6 and b.held["queue_total"] == 4
    await rq.set_env_limits(env, concurrency=4)
    b = await rq.queue_backlog(env, Q, now_ms=NOW)
    # held under the tightest gate: the environment's 4 slots bind before the total's 6
    assert b.servable == 4 and b.held_total == 25 - 4
    assert b.held["queue_total"] == 0 and b.held["env_limit"] >= 10 - 4
    got = await rq.dequeue(1000, env=env, queues=[Q], now_ms=NOW)
    assert len(got) == 4
    assert (await rq.queue_backlog(env, Q, now_ms=NOW)).servable == 0


async def test_env_backlog_caps_the_sum_of_its_queues(make_queue: Any, env: Environment) -> None:
    """Two queues of 5 keyless runs, the environment's limit 7: each queue alone could use
    5, the environment's figure is 7 servable and 3 held by its limit."""
    rq = await queue_for(make_queue, "fair")
    await rq.set_env_limits(env, concurrency=7)
    for queue in ("q1", "q2"):
        await enqueue_runs(rq, env, queue, queue, 5)
    parts = await rq.queues_backlog(env, ["q1", "q2"], now_ms=NOW)
    assert [p.servable for p in parts] == [5, 5]
    total = env_backlog(parts, 7, NOW)
    assert (total.servable, total.held["env_limit"]) == (7, 3)
    got = await rq.dequeue(1000, env=env, queues=["q1", "q2"], now_ms=NOW)
    assert len(got) == total.servable


@both_orders
async def test_priority_levels_share_the_gates(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A key capped at 2 with 3 runs at level 1 and 3 at the default level, 4 keyless runs
    at level 2: the cap holds across levels (2 servable of the key's 6), the keyless runs
    are all servable; a dequeue starts the level-1 runs first, exactly the servable ones."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=1000)
    await rq.set_key_concurrency(env, Q, "capped", 2)
    for i in range(6):
        level = 1 if i < 3 else None
        await rq.enqueue(env, Q, f"c{i}", None, concurrency_key="capped", priority=level,
                         available_at_ms=T0 + i, now_ms=T0)  # fmt: skip
    for i in range(4):
        await rq.enqueue(env, Q, f"n{i}", None, priority=2, available_at_ms=T0 + 10 + i,
                         now_ms=T0)  # fmt: skip
    b = await rq.queue_backlog(env, Q, now_ms=NOW)
    assert (b.servable, b.held["key_cap"], b.delayed) == (6, 4, 0)
    got = await rq.dequeue(1000, env=env, queues=[Q], now_ms=NOW)
    assert len(got) == b.servable
    assert {d.run_id for d in got if d.concurrency_key} == {"c0", "c1"}

"""A fair state per consumer pool: the set of queues a consumer serves is its pool; a
consumer of every queue (no list, or a list covering every queue the environment has
had) keeps the environment's own state. Logical clocks."""

from __future__ import annotations

from typing import Any

from tests.state import s

from fairq import keys as K
from fairq.keys import Environment
from fairq.store import RunQueue

T0 = 1_000_000


async def tags_of(rq: RunQueue, env: Environment, pool: int) -> dict[str, float]:
    raw = await rq.client.zrange(
        K.pool_name(rq.keys.env(env).prefix, pool) + ":tt", 0, -1, withscores=True
    )
    return {s(m): float(v) for m, v in raw if s(m) != K.FLOOR_MEMBER}


async def fair_env(make_queue: Any, env: Environment, queues: list[str]) -> RunQueue:
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    await rq.set_env_limits(env, concurrency=100)
    for i, q in enumerate(queues):
        await rq.enqueue(env, q, f"seed{i}", None, concurrency_key="seed", now_ms=T0)
    return rq


async def test_a_consumer_of_every_queue_keeps_the_environments_state(
    make_queue: Any, env: Environment
) -> None:
    """Its list names both queues, only one has ready work, and it dequeues across
    environments (no env given): the environment's own tags move, no pool's appear."""
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    await rq.enqueue(env, "q2", "later", None, available_at_ms=T0 + 60_000, now_ms=T0)
    await rq.enqueue(env, "q1", "a", None, concurrency_key="a", tenant="A", now_ms=T0 + 2)
    (run,) = await rq.dequeue(10, queues=["q1", "q2"], now_ms=T0 + 3)
    assert run.run_id == "a"
    assert "A" in await tags_of(rq, env, 0)
    for p in (K.pool_id(["q1"]), K.pool_id(["q1", "q2"])):
        assert await tags_of(rq, env, p) == {}


async def test_consumers_of_different_queues_keep_their_own_tags(
    make_queue: Any, env: Environment
) -> None:
    """Tenant A has work on q1 and q2; the consumer of q1 serves it 5 times: A's tag in
    q1's pool moves, in q2's pool it does not (so there A is not pushed behind B)."""
    rq = await fair_env(make_queue, env, ["q1", "q2"])
    await rq.ack(await rq.dequeue(10, queues=["q1", "q2"], now_ms=T0 + 1), now_ms=T0 + 1)
    for i in range(5):
        await rq.enqueue(env, "q1", f"a1-{i}", None, concurrency_key="a", tenant="A", now_ms=T0)
        await rq.enqueue(env, "q2", f"a2-{i}", None, concurrency_key="a", tenant="A", now_ms=T0)
        await rq.enqueue(env, "q2", f"b2-{i}", None, concurrency_key="b", tenant="B", now_ms=T0)
    for step in range(5):
        got = await rq.dequeue(1, env=env, queues=["q1"], now_ms=T0 + 10 + step)
        await rq.ack(got, now_ms=T0 + 10 + step)
    p1, p2 = K.pool_id(["q1"]), K.pool_id(["q2"])
    assert (await tags_of(rq, env, p1))["A"] >= 5
    order = []
    for step in range(4):
        got = await rq.dequeue(1, env=env, queues=["q2"], now_ms=T0 + 20 + step)
        order += [d.tenant for d in got]
        await rq.ack(got, now_ms=T0 + 20 + step)
    # one state for both pools would put A (tag 5) behind B's four runs: here A is served
    # at once and at least as often as B (the first new tenant of a round joins at the
    # floor, the next one a quantum later)
    assert order[0] == "A" and order.count("A") >= 2, order
    assert (await tags_of(rq, env, p2)).keys() >= {"A", "B"}

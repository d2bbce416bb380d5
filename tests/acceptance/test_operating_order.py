"""Flipping a queue's order (age <-> fair) on the server while a consumer drains it loses
nothing: every run is delivered exactly once and acked, and the counters end at zero."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.store import RunQueue


async def test_flipping_the_order_while_a_consumer_drains_loses_nothing(
    make_queue: Callable[..., Any], env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    admin: RunQueue = await make_queue()  # another process flips the order
    await rq.set_queue_concurrency(env, "flip", 4)
    ids = [f"r{i}" for i in range(240)]
    for i, run_id in enumerate(ids):
        key = None if i % 5 == 0 else f"tenant-{i % 7}"
        await rq.enqueue(env, "flip", run_id, {"i": i}, concurrency_key=key,
                         tenant="big" if i % 7 == 1 else None)  # fmt: skip
    delivered: list[str] = []
    orders = ["fair", "age", None, "fair", "age", "fair"]
    deadline = time.monotonic() + 60
    async with Consumer(rq, env=env, queues=["flip"], idle_timeout=0.2) as consumer:
        step = 0
        while len(delivered) < len(ids):
            assert time.monotonic() < deadline, f"drained {len(delivered)} of {len(ids)}"
            if len(delivered) >= step * 40 and step < len(orders):
                await admin.set_queue_options(env, "flip", order=orders[step])
                step += 1
            batch = await consumer.next_batch(7, timeout=2)
            delivered += [d.run_id for d in batch]
            await rq.ack(batch)
            await asyncio.sleep(0)
        assert step == len(orders)  # every flip happened mid-drain
        assert await consumer.next_batch(10, timeout=0.3) == []
    assert sorted(delivered) == sorted(ids)  # each exactly once
    stats = await rq.queue_stats(env, "flip", breakdown=True)
    assert (stats.queued, stats.running) == (0, 0)
    assert all((v.queued, v.running) == (0, 0) for v in stats.variants)

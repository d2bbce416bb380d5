"""RunQueue.purge deletes every key of its prefix, on one server and on a cluster (where a
pipeline's ``unlink()`` is a coroutine in redis-py 8: called without ``await`` it deleted
nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.server import connect
from fairq.store import RunQueue

T0 = 1_000_000


async def keys_of(rq: RunQueue) -> list[Any]:
    found: list[Any] = []
    for pattern in ("{" + rq.keys.prefix + ".*", rq.keys.prefix + ":*"):
        found += [key async for key in rq.client.scan_iter(match=pattern, count=1000)]
    return found


async def fill_then_purge(url: str, prefix: str, env: Environment) -> None:
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix))
    try:
        for i in range(30):
            await rq.enqueue(env, f"q{i % 3}", f"r{i}", {"i": i}, now_ms=T0 + i)
        leased = (await rq.dequeue_batch(5, env=env, now_ms=T0 + 100)).deliveries
        await rq.ack(leased[:2], now_ms=T0 + 200)
        before = len(await keys_of(rq))
        assert before > 30

        assert await rq.purge() == before
        assert await keys_of(rq) == []
        assert (await rq.queue_stats(env, "q0")).queued == 0
    finally:
        await rq.close()


async def test_purge_deletes_every_key_of_the_prefix(
    redis_url: str, prefix: str, env: Environment
) -> None:
    await fill_then_purge(redis_url, prefix, env)


@pytest.mark.cluster
async def test_purge_deletes_every_key_of_the_prefix_on_a_cluster(
    cluster_url: str, prefix: str, env: Environment
) -> None:
    await fill_then_purge(cluster_url, prefix, env)

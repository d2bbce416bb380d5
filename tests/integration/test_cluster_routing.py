"""Script calls on a Redis Cluster go to their keys' node without asking a node where the
keys are (store/cluster_routing.py): no ``COMMAND GETKEYS`` per call.

The routing replaces a private part of redis-py (its commands parser: redis-py has no
public way to name a command's keys), so this test is what the pinned redis-py range in
pyproject.toml rests on. It runs on the session's cluster (``FAIRQ_TEST_CLUSTER=N``) or on
a cluster of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from fairq.keys import Environment
from fairq.server import connect
from fairq.store import RunQueue
from fairq.store.cluster_routing import FcallKeysParser, route_fcall_by_keys

pytestmark = pytest.mark.cluster

T0 = 1_000_000


@pytest.fixture
async def rq(cluster_url: str, prefix: str) -> AsyncIterator[RunQueue]:
    from fairq.config import RunQueueConfig

    queue = RunQueue(await connect(cluster_url), RunQueueConfig(prefix=prefix))
    yield queue
    await queue.purge()
    await queue.close()


async def calls_by_command(client: Any) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT, summed over the nodes."""
    per_node = await client.info("commandstats", target_nodes=RedisCluster.ALL_NODES)
    counts: dict[str, int] = {}
    for stats in per_node.values():
        for name, row in stats.items():
            command = name.removeprefix("cmdstat_")
            counts[command] = counts.get(command, 0) + int(row["calls"])
    return counts


async def test_script_calls_on_a_cluster_ask_no_node_for_their_keys(
    rq: RunQueue, env: Environment
) -> None:
    client = rq.client
    assert isinstance(client, RedisCluster)
    await rq.enqueue(env, "q", "warm-up", now_ms=T0)  # libraries loaded, slots known
    await client.config_resetstat(target_nodes=RedisCluster.ALL_NODES)

    for i in range(5):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0 + i)
    got = (await rq.dequeue_batch(6, env=env, now_ms=T0 + 10)).deliveries
    assert len(got) == 6
    await rq.ack(got, now_ms=T0 + 20)

    counts = await calls_by_command(client)
    assert counts.get("fcall", 0) >= 7  # 5 enqueues, a dequeue, an ack
    assert counts.get("command|getkeys", 0) == 0, counts


async def test_the_parser_finds_fcall_keys_and_leaves_other_commands_to_redis_py(
    rq: RunQueue,
) -> None:
    client = rq.client
    parser = client.commands_parser
    assert isinstance(parser, FcallKeysParser)
    route_fcall_by_keys(client)  # a second time changes nothing
    assert client.commands_parser is parser
    assert await parser.get_keys("FCALL", "f", 2, "{a}x", "{a}y", "arg") == ("{a}x", "{a}y")
    assert await parser.get_keys("fcall_ro", "f", 0, "arg") == ()
    assert list(await parser.get_keys("GET", "plain")) == ["plain"]

"""Processes sharing a prefix must agree on its shard count: the first use records it on
the server, and a process configured with another count refuses before writing anything
(else a producer and a consumer would silently split an environment between shards)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.state import keyspace

from fairq.errors import ConfigurationMismatchError
from fairq.keys import Environment
from fairq.store import RunQueue


async def test_a_process_with_another_shard_count_refuses_and_writes_nothing(
    make_queue: Any, env: Environment
) -> None:
    first: RunQueue = await make_queue(shard_count=8)
    await first.enqueue(env, "q", "r1", None)
    other: RunQueue = await make_queue(shard_count=16)
    before = await keyspace(first)
    with pytest.raises(ConfigurationMismatchError, match="FAIRQ_SHARD_COUNT=8") as caught:
        await other.enqueue(env, "q", "r2", None)
    assert "docs/cluster.md" in str(caught.value)
    with pytest.raises(ConfigurationMismatchError):
        await other.dequeue(1, env=env, queues=["q"])
    assert await keyspace(first) == before
    # the agreeing process carries on
    agreeing: RunQueue = await make_queue(shard_count=8)
    assert [d.run_id for d in await agreeing.dequeue(5, env=env, queues=["q"])] == ["r1"]


async def test_the_first_process_records_its_shard_count(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(shard_count=4)
    assert await rq.client.hget(rq.keys.meta, "shard_count") is None
    await rq.enqueue(env, "q", "r1", None)
    assert await rq.client.hget(rq.keys.meta, "shard_count") == b"4"

"""A worker's consumer leases through the same gated dequeue as everyone: an environment
at its concurrency limit gives it nothing until a slot frees, and the freed slot wakes
it (no polling)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.consumer_waits import noting_its_wait, subscribed
from tests.integration.commandstats import command_counts, reset_stats

from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.store import RunQueue


async def test_a_consumer_gets_nothing_from_an_env_at_its_limit_until_a_slot_frees(
    make_queue: Any, env: Environment
) -> None:
    holder: RunQueue = await make_queue()
    await holder.set_env_limits(env, concurrency=1, burst_factor=1)
    await holder.enqueue(env, "a", "held", None)
    await holder.enqueue(env, "b", "waiting", None)
    (held,) = await holder.dequeue(1, env=env, queues=["a"])
    consumer = Consumer(await make_queue(), env=env, queues=["a", "b"], idle_timeout=30)
    async with consumer:
        assert await consumer.next_batch(5, timeout=0.3) == []
        waiting = asyncio.create_task(consumer.next_batch(5, timeout=20))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        started = time.monotonic()
        await holder.ack([held])
        got = await waiting
        woke_after = time.monotonic() - started
    assert [d.run_id for d in got] == ["waiting"]
    assert woke_after < 5  # woken by the freed slot's hint, not by its 30 s idle timeout


async def test_a_consumer_of_every_environment_waits_for_the_freed_slot_without_polling(
    make_queue: Any, env: Environment
) -> None:
    """Without env=: the shards' heads are read in one round trip, the only ready env is
    at its limit, its script says so (gated), and the consumer then waits for the freed
    slot's hint instead of asking again and again."""
    holder: RunQueue = await make_queue()
    await holder.set_env_limits(env, concurrency=1, burst_factor=1)
    await holder.enqueue(env, "a", "held", None)
    await holder.enqueue(env, "a", "waiting", None)
    (held,) = await holder.dequeue(1, env=env, queues=["a"])
    rq: RunQueue = await make_queue()
    consumer = Consumer(rq, idle_timeout=30, maintenance_interval=3600)
    asleep = noting_its_wait(consumer)
    # the hints it hears: on a cluster, one the holder's calls published may reach its
    # subscription late (the cluster bus relays it), and then rightly wakes it once
    heard: list[str] = []
    hear = consumer._hear

    def noting_hints(hint: str) -> None:
        heard.append(hint)
        hear(hint)

    consumer._hear = noting_hints  # type: ignore[method-assign]
    async with await subscribed(consumer):  # (its first hint would end the wait below)
        waiting = asyncio.create_task(consumer.next_batch(5, timeout=20))
        await asyncio.wait_for(asleep.wait(), 10)  # its (gated) dequeue is done
        since = len(heard)
        await reset_stats(rq.client)
        await asyncio.sleep(0.5)
        calls = await command_counts(rq.client)
        woken = len(heard) - since
        assert not waiting.done()
        # no dequeue script while it waits, but for a hint's (none on one server)
        assert calls.get("fcall", 0) <= woken, (calls, heard)
        assert sum(calls.values()) < 20 * (woken + 1), calls  # and no reads in a loop
        started = time.monotonic()
        await holder.ack([held])
        got = await waiting
    assert [d.run_id for d in got] == ["waiting"]
    assert time.monotonic() - started < 5

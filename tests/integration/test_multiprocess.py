"""Several consumer processes (multiprocessing, spawn; each its own RunQueue + Consumer)
share one server: every message is delivered and acked exactly once, and a consumer
killed mid-lease loses nothing."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections import Counter
from typing import Any

from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.models import AckStatus, EnqueueRequest
from fairq.server import connect
from fairq.store import RunQueue

ENV = Environment("org1", "proj1", "prod")
QUEUE = "work"
KEYS = [f"tenant-{i}" for i in range(6)]
PER_KEY = 200

_SPAWN = multiprocessing.get_context("spawn")


async def _consume(
    url: str, prefix: str, lease_ms: int, maintenance_interval: float
) -> list[tuple[str, int]]:
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, lease_ms=lease_ms))
    acked: list[tuple[str, int]] = []
    try:
        async with Consumer(
            rq, idle_timeout=0.2, maintenance_interval=maintenance_interval
        ) as consumer:
            while True:
                batch = await consumer.next_batch(50, timeout=0.5)
                if not batch:
                    stats = await rq.queue_stats(ENV, QUEUE)
                    if stats.queued == 0 and stats.running == 0:
                        return acked
                    continue
                statuses = await rq.ack(batch)
                acked += [
                    (d.run_id, d.lease_token)
                    for d, status in zip(batch, statuses, strict=True)
                    if status is AckStatus.ACKED
                ]
    finally:
        await rq.close()


def consumer_process(
    url: str, prefix: str, lease_ms: int, maintenance_interval: float, results: Any
) -> None:
    """Drain the queue, then report ``(pid, [(run id, delivery) acked])``."""
    acked = asyncio.run(_consume(url, prefix, lease_ms, maintenance_interval))
    results.put((os.getpid(), acked))


async def _hold(url: str, prefix: str, held: Any) -> None:
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, lease_ms=500))
    async with Consumer(rq, idle_timeout=0.2, maintenance_interval=0.1) as consumer:
        batch = await consumer.next_batch(20, timeout=10)
        held.put([(d.run_id, d.lease_token) for d in batch])
        await asyncio.sleep(3600)  # never acks, never heartbeats: killed here


def holder_process(url: str, prefix: str, held: Any) -> None:
    """Lease one batch, report it, then hang until killed."""
    asyncio.run(_hold(url, prefix, held))


async def _enqueue_all(rq: RunQueue) -> set[str]:
    requests = [
        EnqueueRequest(ENV, QUEUE, f"{ck}-{i}", {"n": i}, concurrency_key=ck)
        for ck in KEYS
        for i in range(PER_KEY)
    ]
    results = await rq.enqueue_many(requests)
    assert len(results) == len(KEYS) * PER_KEY
    return {r.run_id for r in requests}


def _collect(results: Any, count: int) -> list[tuple[str, int]]:
    acked: list[tuple[str, int]] = []
    for _ in range(count):
        _pid, got = results.get(timeout=60)
        acked += got
    return acked


async def test_four_consumer_processes_get_every_message_exactly_once(
    make_queue: Any, redis_url: str, prefix: str
) -> None:
    rq: RunQueue = await make_queue()
    expected = await _enqueue_all(rq)
    results = _SPAWN.Queue()
    procs = [
        _SPAWN.Process(target=consumer_process, args=(redis_url, prefix, 30_000, 1.0, results))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        acked = await asyncio.to_thread(_collect, results, len(procs))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    counts = Counter(run_id for run_id, _ in acked)
    assert set(counts) == expected
    assert max(counts.values()) == 1
    assert {delivery for _, delivery in acked} == {1}  # no lease ever lapsed
    stats = await rq.queue_stats(ENV, QUEUE)
    assert (stats.queued, stats.running) == (0, 0)
    assert (await rq.env_stats(ENV)).running == 0


async def test_a_consumer_killed_mid_lease_loses_nothing(
    make_queue: Any, redis_url: str, prefix: str
) -> None:
    rq: RunQueue = await make_queue()
    expected = await _enqueue_all(rq)
    held_queue = _SPAWN.Queue()
    holder = _SPAWN.Process(target=holder_process, args=(redis_url, prefix, held_queue))
    holder.start()
    try:
        held = await asyncio.to_thread(held_queue.get, True, 60)
        assert held
        # survivors start draining while the holder still holds its leases
        results = _SPAWN.Queue()
        survivors = [
            _SPAWN.Process(target=consumer_process, args=(redis_url, prefix, 30_000, 0.1, results))
            for _ in range(3)
        ]
        for p in survivors:
            p.start()
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=10)
        acked = await asyncio.to_thread(_collect, results, len(survivors))
    finally:
        if holder.is_alive():
            holder.kill()
        for p in locals().get("survivors", []):
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    counts = Counter(run_id for run_id, _ in acked)
    assert set(counts) == expected  # nothing lost
    assert max(counts.values()) == 1  # every run completed exactly once
    held_ids = {run_id for run_id, _ in held}
    redelivered = {run_id for run_id, delivery in acked if delivery > 1}
    # only the killed holder's runs came back, each under a new delivery token
    assert redelivered == held_ids
    stats = await rq.queue_stats(ENV, QUEUE)
    assert (stats.queued, stats.running) == (0, 0)
    assert (await rq.env_stats(ENV)).running == 0

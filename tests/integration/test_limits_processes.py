"""The total cap under four consumer processes (multiprocessing, spawn; each its own
connection and RunQueue), on the server's clock, in both orders.

Each process loops dequeue (1..4 runs) -> ``queue_stats`` -> hold a moment -> ack over
one queue's keyless, keyed and named-tenant runs. Two server-side views of the runs in
flight must stay within the cap: the ``running`` count each process reads right after
each dequeue, and the ledger the ack script writes (the queue's recent runs: finish time
and run time on the script clock, so every run's lease interval), swept for the largest
overlap. Every run is acked exactly once and the counters end at zero.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
from collections import Counter
from typing import Any

from tests.integration.limits_support import Order, both_orders, queue_for

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.models import AckStatus, EnqueueRequest
from fairq.server import connect
from fairq.store import RunQueue

ENV = Environment("org1", "proj1", "prod")
QUEUE = "capped"
CAP = 5
PROCESSES = 4
RECENT = 5_000

_SPAWN = multiprocessing.get_context("spawn")


def _config(prefix: str, order: Order) -> RunQueueConfig:
    return RunQueueConfig(prefix=prefix, recent_runs=RECENT).with_vtime(enabled=order == "fair")


async def _consume(url: str, prefix: str, order: Order, seed: int) -> tuple[list[str], int, int]:
    """Drain the queue; returns (acked run ids, largest running count seen, dequeues)."""
    rq = RunQueue(await connect(url), _config(prefix, order), rng=random.Random(seed))
    rnd = random.Random(seed)
    acked: list[str] = []
    seen = calls = 0
    try:
        while True:
            batch = await rq.dequeue(rnd.randint(1, 4), env=ENV, queues=[QUEUE])
            calls += 1
            stats = await rq.queue_stats(ENV, QUEUE)
            seen = max(seen, stats.running)
            if not batch:
                if stats.queued == 0 and stats.running == 0:
                    return acked, seen, calls
                await asyncio.sleep(0.001)  # (not for ordering: only to let others ack)
                continue
            if rnd.random() < 0.5:
                await asyncio.sleep(rnd.random() * 0.003)
            statuses = await rq.ack(batch)
            assert statuses == [AckStatus.ACKED] * len(batch)
            acked += [d.run_id for d in batch]
    finally:
        await rq.close()


def consumer_process(url: str, prefix: str, order: Order, seed: int, results: Any) -> None:
    """Report ``(pid, acked run ids, largest running count seen, dequeue calls)``."""
    acked, seen, calls = asyncio.run(_consume(url, prefix, order, seed))
    results.put((os.getpid(), acked, seen, calls))


def _max_overlap(intervals: list[tuple[int, int]]) -> int:
    """Most intervals [start, end) open at once (an end at t closes before a start at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = peak = 0
    for _, delta in events:
        open_now += delta
        peak = max(peak, open_now)
    return peak


@both_orders
async def test_total_cap_holds_under_four_consumer_processes(
    make_queue: Any, redis_url: str, prefix: str, order: Order
) -> None:
    """1,200 runs (keyless, six keys, two named tenants) drained by four processes under a
    total cap of 5: no process ever reads more than 5 running, the ack ledger never has
    more than 5 leases open at once, both reach 5 (the cap was contended), and every run
    is acked exactly once."""
    rq = await queue_for(make_queue, order, recent_runs=RECENT)
    await rq.set_queue_total_concurrency(ENV, QUEUE, CAP)
    requests = [EnqueueRequest(ENV, QUEUE, f"n{i}") for i in range(400)]
    requests += [
        EnqueueRequest(ENV, QUEUE, f"k{i}", concurrency_key=f"k{i % 6}") for i in range(600)
    ]
    requests += [
        EnqueueRequest(ENV, QUEUE, f"t{i}", concurrency_key=f"u{i % 4}", tenant=f"T{i % 2}")
        for i in range(200)
    ]
    await rq.enqueue_many(requests)
    results = _SPAWN.Queue()
    procs = [
        _SPAWN.Process(target=consumer_process, args=(redis_url, prefix, order, i, results))
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        reports = [await asyncio.to_thread(results.get, True, 60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    acked = Counter(run for _, runs, _, _ in reports for run in runs)
    assert set(acked) == {r.run_id for r in requests}
    assert max(acked.values()) == 1
    seen = max(s for _, _, s, _ in reports)
    ledger = await rq.recent_runs(ENV, QUEUE, limit=RECENT)
    assert len(ledger) == len(requests)
    intervals = []
    for r in ledger:
        assert r.duration_ms is not None
        intervals.append((r.finished_at_ms - r.duration_ms, r.finished_at_ms))
    peak = _max_overlap(intervals)
    calls = sum(c for _, _, _, c in reports)
    print(f"\n[{order}] {len(requests)} runs, {calls} dequeue calls by {PROCESSES} processes: "
          f"largest running read {seen}, ledger peak {peak} (cap {CAP})")  # fmt: skip
    assert seen == CAP
    assert peak <= CAP
    assert all(len(runs) > 0 for _, runs, _, _ in reports)  # every process took part
    stats = await rq.queue_stats(ENV, QUEUE)
    assert (stats.queued, stats.running) == (0, 0)
    assert (await rq.env_stats(ENV)).running == 0

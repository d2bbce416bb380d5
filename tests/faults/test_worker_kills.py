"""``kill -9`` of worker processes under load loses no run, and every duplicate delivery
is one whose earlier holder was killed.

Four real ``fairq worker`` processes (the CLI entry point, 2 s leases, reclaim by their
own consumers' maintenance) drain 3,000 runs while the test kills a random busy worker
every ~0.15 s and starts a replacement, 30 kills in all. Afterwards the ledgers the task
wrote (see :mod:`tests.faults._procs`) and the store are checked against each other.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from tests.faults._procs import WorkerPool, drained, eventually

from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

RUNS = 3000
KILLS = 30
WORKERS = 4
LEASE_MS = 2000
#: How long a task sleeps while the kills go on (then runs finish at once).
TASK_MS = 60
#: Bound of the kill phase and of the drain after it (s).
KILL_PHASE_S = 60.0
DRAIN_S = 45.0


async def _leased(rq: RunQueue) -> int:
    """Leases held on every shard of the prefix."""
    return sum([await rq.client.zcard(s.leases) for s in rq.keys.shards()])


async def test_kill_9_of_workers_loses_nothing_and_explains_every_duplicate(
    make_queue: Any, redis_url: str, prefix: str, env: Environment, tmp_path: Path
) -> None:
    """Every run completes; every delivery but a run's last went to a killed process;
    the completing process is the last delivery's; nothing stays queued, running,
    leased or dead-lettered."""
    rq: RunQueue = await make_queue(lease_ms=LEASE_MS)
    run_ids = [f"r{i:05d}" for i in range(RUNS)]
    results = await rq.enqueue_many(
        [EnqueueRequest(env, "work", r, {"ms": TASK_MS}) for r in run_ids]
    )
    assert len(results) == RUNS
    pool = WorkerPool(tmp_path, redis_url, prefix, env, LEASE_MS)
    rng = random.Random(11)
    started = time.monotonic()
    try:
        for _ in range(WORKERS):
            pool.spawn()
        # kill a random worker that is running tasks, then replace it
        phase_end = time.monotonic() + KILL_PHASE_S
        while len(pool.killed) < KILLS and time.monotonic() < phase_end:
            await asyncio.sleep(0.15)
            busy = [pid for pid in pool.procs if pool.has_run(pid)]
            if not busy:
                continue
            pool.kill(rng.choice(sorted(busy)))
            pool.spawn()
        kill_phase = time.monotonic() - started
        assert len(pool.killed) >= KILLS, f"only {len(pool.killed)} kills in {kill_phase:.1f}s"
        (pool.ledger / "fast").touch()

        await eventually(lambda: drained(rq, env), DRAIN_S, "the queue drains after the kills")
        codes = pool.stop_all()
    finally:
        pool.stop_all()
    assert all(code == 0 for code in codes.values()), codes

    deliveries = pool.deliveries()
    # every run ran, and completed, by the process of its last delivery
    assert set(deliveries) == set(run_ids)
    infos = []
    for i in range(0, RUNS, 100):
        infos += await asyncio.gather(*(rq.get_run(env, r) for r in run_ids[i : i + 100]))
    duplicates = unlogged = 0
    for run_id, info in zip(run_ids, infos, strict=True):
        assert info is not None and info.status is RunStatus.COMPLETED, (run_id, info)
        seen = deliveries[run_id]
        last = seen[-1]
        assert info.result == last.pid and last.ended, (run_id, seen, info.result)
        # every earlier delivery was held by a process that was then killed
        for earlier in seen[:-1]:
            assert earlier.pid in pool.killed, (run_id, seen, sorted(pool.killed))
        # a lease token the ledger lacks went to a process killed before the task began
        unlogged += last.token - len(seen)
        if last.token > 1:
            duplicates += 1
    assert duplicates >= 1, "no kill interrupted a run: the test proved nothing"
    # counters and leases: nothing in flight anywhere
    stats = await rq.queue_stats(env, "work")
    assert (stats.queued, stats.running) == (0, 0)
    assert (await rq.env_stats(env)).running == 0
    assert await rq.client.scard(rq.keys.env(env).inflight) == 0
    assert await _leased(rq) == 0
    assert await rq.dead_letters(env) == []
    await rq.purge()  # 3,000 kept outcomes: do not leave them to every later SCAN
    print(
        f"\n{RUNS} runs, {len(pool.killed)} kills, {pool.spawned} workers started, "
        f"{duplicates} runs delivered again (all after a killed holder), {unlogged} "
        f"deliveries to processes killed before the task began; kill phase "
        f"{kill_phase:.1f}s, total {time.monotonic() - started:.1f}s"
    )

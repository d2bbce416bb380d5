"""Caps and rate limits hold while workers are killed, and no slot leaks.

Three real ``fairq worker`` processes drain runs of three keys under a per-key cap of 2,
a total cap of 5 and a queue rate of 30 runs/s (burst 5), while the test kills a busy
worker every ~0.6 s (8 kills) and starts a replacement. From the ledger (each
delivery's start and end, or its process's death): never more than 2 runs of a key or
5 in all at once, never more starts in a window than the token bucket allows; and once
the runs are done and the dead workers' leases have lapsed, nothing is left running,
leased or counted anywhere.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from tests.faults._procs import WorkerPool, drained, eventually
from tests.faults._timed import TIMED_APP, most_at_once, spans

from fairq.keys import Environment, encode_concurrency_key
from fairq.models import EnqueueRequest
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

RUNS = 240
KEYS = ("k0", "k1", "k2")
KEY_CAP, TOTAL_CAP = 2, 5
RATE, BURST = 30.0, 5
KILLS = 8
LEASE_MS = 3000
#: How late a task may log its start after its dequeue (s), for the rate check.
START_JITTER_S = 0.1


async def test_caps_and_rates_hold_under_kills_and_no_slot_leaks(
    make_queue: Any, redis_url: str, prefix: str, env: Environment, tmp_path: Path
) -> None:
    rq: RunQueue = await make_queue(lease_ms=LEASE_MS)
    await rq.set_queue_options(env, "work", concurrency=KEY_CAP, total=TOTAL_CAP)
    await rq.set_rate_limit(env, "work", RATE, burst=BURST)
    rng = random.Random(5)
    run_ids = [f"r{i:04d}" for i in range(RUNS)]
    await rq.enqueue_many([
        EnqueueRequest(env, "work", r, {"ms": rng.randint(40, 120)}, rng.choice(KEYS))
        for r in run_ids
    ])  # fmt: skip
    pool = WorkerPool(tmp_path, redis_url, prefix, env, LEASE_MS, concurrency=4,
                      app_source=TIMED_APP)  # fmt: skip
    died: dict[int, float] = {}
    try:
        for _ in range(3):
            pool.spawn()
        deadline = time.monotonic() + 60
        while len(died) < KILLS and time.monotonic() < deadline:
            await asyncio.sleep(0.6)
            busy = [pid for pid in pool.procs if pool.has_run(pid)]
            if busy:
                pid = rng.choice(sorted(busy))
                died[pid] = pool.kill(pid)
                pool.spawn()
        assert len(died) == KILLS, f"only {len(died)} kills"

        await eventually(lambda: drained(rq, env), 90, "the queue drains after the kills")
        codes = pool.stop_all()
    finally:
        pool.stop_all()
    assert all(code == 0 for code in codes.values()), codes

    seen = spans(pool.ledger)
    intervals: dict[str, list[tuple[float, float]]] = {k: [] for k in KEYS}
    for s in seen:
        end = s.end if s.end is not None else died.get(s.pid)
        assert end is not None, f"{s} never ended, and its process was not killed"
        intervals[s.key].append((s.start, end))
    # caps: per key, and in all (a killed run's slot lasts at least until its death)
    assert max(most_at_once(v) for v in intervals.values()) <= KEY_CAP
    assert most_at_once([i for v in intervals.values() for i in v]) <= TOTAL_CAP
    # the rate: starts in any window of w seconds <= burst + rate * (w + jitter)
    starts = [s.start for s in seen]
    for window in (1.0, 3.0):
        allowed = BURST + RATE * (window + START_JITTER_S)
        most = max(sum(1 for t in starts[i:] if t < t0 + window) for i, t0 in enumerate(starts))
        assert most <= allowed, (window, most, allowed)
    # every run completed; the kills did interrupt some
    infos = []
    for i in range(0, RUNS, 60):
        infos += await asyncio.gather(*(rq.get_run(env, r) for r in run_ids[i : i + 60]))
    assert all(info is not None and info.status is RunStatus.COMPLETED for info in infos)
    interrupted = sum(1 for s in seen if s.end is None)
    assert interrupted >= 1, "no kill interrupted a run: the test proved nothing"
    # no slot leaked: nothing running, leased or counted in flight
    assert (await rq.env_stats(env)).running == 0
    assert await rq.client.scard(rq.keys.env(env).inflight) == 0
    queue = rq.keys.queue(env, "work")
    for key in KEYS:
        assert await rq.client.scard(queue.variant_inflight(encode_concurrency_key(key))) == 0
    assert sum([await rq.client.zcard(s.leases) for s in rq.keys.shards()]) == 0
    # and the caps still serve: a new run of each key starts at once
    await rq.enqueue_many([EnqueueRequest(env, "work", f"after-{k}", {}, k) for k in KEYS])
    got = await rq.dequeue(10, env=env, queues=["work"])
    assert sorted(d.concurrency_key or "" for d in got) == sorted(KEYS)
    await rq.purge()
    print(f"\n{len(seen)} deliveries, {interrupted} interrupted by {KILLS} kills; caps and "
          f"rate held")  # fmt: skip

"""Cancels racing retries, lease lapses and completions, with real workers killed.

Three ``fairq worker`` processes run 240 runs (a third of them fail their first two
attempts, so retries are frequent) while the test kills a busy worker every ~0.5 s (10
kills, so leases lapse) and cancels 120 runs at random moments. A cancel always wins:
once a cancel of a running run was answered CANCEL_REQUESTED, no new delivery of that
run starts (at most the one already under way logs its start a moment later), and the
run ends ``cancelled``, or ``completed`` when the attempt under way completed first;
never dead-lettered, never run again. A queued or dead-lettered run cancelled ends
cancelled and never starts after. Nothing is left running or leased afterwards.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from tests.faults._procs import WorkerPool, drained, eventually
from tests.faults._timed import TIMED_APP, spans

from fairq.keys import Environment
from fairq.models import CancelOutcome, EnqueueRequest
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

RUNS = 240
CANCELS = 120
KILLS = 10
LEASE_MS = 2000
#: How long after its dequeue a delivery may log its start (s): a delivery under way
#: when the cancel came may start its task this much later, no other.
LATE_START_S = 2.0


async def test_a_cancel_always_wins_over_retries_lapses_and_kills(
    make_queue: Any, redis_url: str, prefix: str, env: Environment, tmp_path: Path
) -> None:
    rq: RunQueue = await make_queue(lease_ms=LEASE_MS)
    rng = random.Random(29)
    run_ids = [f"c{i:04d}" for i in range(RUNS)]
    payloads = {r: {"ms": rng.randint(50, 400), "fail_below": 2 if rng.random() < 0.33 else 0}
                for r in run_ids}  # fmt: skip
    await rq.enqueue_many([EnqueueRequest(env, "work", r, payloads[r]) for r in run_ids])
    pool = WorkerPool(tmp_path, redis_url, prefix, env, LEASE_MS, concurrency=6,
                      app_source=TIMED_APP)  # fmt: skip
    asked: dict[str, tuple[float, CancelOutcome]] = {}
    kills = 0

    async def kill_now_and_then() -> None:
        """A busy worker killed (and replaced) every ~0.5 s, KILLS times at most."""
        nonlocal kills
        deadline = time.monotonic() + 30
        while kills < KILLS and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            busy = [pid for pid in pool.procs if pool.has_run(pid)]
            if busy:
                pool.kill(rng.choice(sorted(busy)))
                pool.spawn()
                kills += 1

    try:
        for _ in range(3):
            pool.spawn()
        await eventually(lambda: any(pool.has_run(p) for p in pool.procs), 20, "workers run")
        killer = asyncio.create_task(kill_now_and_then())
        while len(asked) < CANCELS:
            await asyncio.sleep(rng.uniform(0.0, 0.12))
            # mostly a run the ledger shows under way, else any not asked yet
            running = [s.run_id for s in spans(pool.ledger) if s.end is None]
            pick = [r for r in running if r not in asked] if rng.random() < 0.7 else []
            run_id = rng.choice(pick or [r for r in run_ids if r not in asked])
            outcome = await rq.cancel(env, run_id)
            asked[run_id] = (time.time(), outcome)
        await killer

        await eventually(lambda: drained(rq, env), 90, "the queue drains")
        codes = pool.stop_all()
    finally:
        pool.stop_all()
    assert all(code == 0 for code in codes.values()), codes
    assert kills >= KILLS // 2, kills

    by_run: dict[str, list[float]] = {}
    for s in spans(pool.ledger):
        by_run.setdefault(s.run_id, []).append(s.start)
    outcomes: dict[CancelOutcome, int] = {}
    for run_id, (at, outcome) in asked.items():
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        info = await rq.get_run(env, run_id)
        assert info is not None, run_id
        later = [t for t in by_run.get(run_id, []) if t > at]
        if outcome is CancelOutcome.CANCEL_REQUESTED:
            # at most the delivery under way starts its task after the cancel, soon
            assert len(later) <= 1 and all(t < at + LATE_START_S for t in later), (run_id, later)
            assert info.status in (RunStatus.CANCELLED, RunStatus.COMPLETED), (run_id, info)
        elif outcome in (CancelOutcome.CANCELLED, CancelOutcome.REMOVED_FROM_DLQ):
            assert later == [], (run_id, later)
            assert info.status is RunStatus.CANCELLED, (run_id, info)
    # the races happened: cancels of running runs, some of which a retry or lapse followed
    assert outcomes.get(CancelOutcome.CANCEL_REQUESTED, 0) >= 20, outcomes
    assert sum([await rq.client.zcard(s.leases) for s in rq.keys.shards()]) == 0
    assert await rq.client.scard(rq.keys.env(env).inflight) == 0
    await rq.purge()
    print(f"\n{len(asked)} cancels {outcomes}; {kills} kills; a cancel always won")

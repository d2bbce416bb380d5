"""A cluster-wide cap under four consumer processes and ``kill -9``, on the server's clock.

An environment spread over 3 partitions (on a 3-master cluster under
``FAIRQ_TEST_CLUSTER=3``, each partition on its own master) has a concurrency limit of
5; 600 runs of 12 tenants (in every partition) are drained by four processes
(``multiprocessing``, spawn; each a :class:`fairq.consumer.Consumer` of the environment,
whose maintenance reclaims lapsed leases and rebalances the quotas). While they run, the
test samples the runs in flight over all partitions and kills two of them (SIGKILL), then
starts two more. Every sample must be within the cap; every run completes, and is acked
once; a run delivered more than once was first delivered to a killed process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.models import AckStatus, Delivery, EnqueueRequest, Finish
from fairq.outcomes import KeptOutcome, RunStatus
from fairq.server import connect
from fairq.store import RunQueue

ENV = Environment("org1", "proj1", "spread")
QUEUE = "work"
CAP = 5
PARTITIONS = 3
RUNS = 600
LEASE_MS = 3_000  # 100 times a hold: a live holder descheduled a while keeps its lease
SHARDS = 8

_SPAWN = multiprocessing.get_context("spawn")


def _config(prefix: str) -> RunQueueConfig:
    return RunQueueConfig(prefix=prefix, shard_count=SHARDS, lease_ms=LEASE_MS).with_vtime(
        enabled=True
    )


async def _consume(url: str, prefix: str, ledger: Path, seed: int) -> None:
    """Lease, note each delivery (flushed before the run 'works'), hold, ack; until the
    environment is empty."""
    rq = RunQueue(await connect(url), _config(prefix), rng=random.Random(seed))
    rnd = random.Random(seed)
    consumer = Consumer(rq, env=ENV, queues=[QUEUE], idle_timeout=0.2, maintenance_interval=0.2)
    try:
        with ledger.open("a", buffering=1) as out:
            while True:
                batch = await consumer.next_batch(rnd.randint(1, 4), timeout=0.5)
                if not batch:
                    stats = await rq.queue_stats(ENV, QUEUE)
                    if stats.queued == 0 and stats.running == 0:
                        return
                    continue
                for d in batch:
                    out.write(f"D {d.run_id} {d.lease_token}\n")
                await asyncio.sleep(0.01 + rnd.random() * 0.02)  # (the run's work)
                statuses = await rq.finish([Finish(d, "completed", _done(d)) for d in batch])
                for d, status in zip(batch, statuses, strict=True):
                    out.write(f"A {d.run_id} {d.lease_token} {status.name}\n")
    finally:
        await consumer.close()
        await rq.close()


def _done(d: Delivery) -> KeptOutcome:
    """The outcome a consumer keeps: completed (the test reads it back)."""
    return KeptOutcome()


def consumer_process(url: str, prefix: str, ledger: str, seed: int) -> None:
    asyncio.run(_consume(url, prefix, Path(ledger), seed))


def _ledger_lines(where: Path) -> list[tuple[int, str]]:
    """Every line the consumers wrote, with the seed of the process that wrote it."""
    return [
        (int(f.stem[1:]), line)
        for f in sorted(where.glob("*.log"))
        for line in f.read_text().splitlines()
        if line
    ]


async def _in_flight(rq: RunQueue) -> int:
    return sum([await rq.client.scard(rq.keys.env(ENV, p).inflight) for p in range(PARTITIONS)])


async def test_the_cap_holds_under_four_processes_and_kills(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    rq = RunQueue(await connect(redis_url), _config(prefix))
    try:
        await rq.set_env_limits(ENV, concurrency=CAP)
        await rq.set_partitions(ENV, PARTITIONS)
        tenants = [f"tenant{i}" for i in range(12)]
        requests = [
            EnqueueRequest(ENV, QUEUE, f"r{i:04d}", None, tenant=tenants[i % 12])
            for i in range(RUNS)
        ]
        await rq.enqueue_many(requests)
        procs: dict[int, Any] = {}

        def spawn(seed: int) -> None:
            proc = _SPAWN.Process(
                target=consumer_process,
                args=(redis_url, prefix, str(tmp_path / f"c{seed}.log"), seed),
            )
            proc.start()
            procs[seed] = proc

        for seed in range(4):
            spawn(seed)
        killed: set[int] = set()
        samples: list[int] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            samples.append(await _in_flight(rq))
            acked = sum(1 for _, line in _ledger_lines(tmp_path) if line[0] == "A")
            if len(killed) < 2 and acked > 150 * (len(killed) + 1):
                victim = min(set(procs) - killed)
                os.kill(procs[victim].pid, signal.SIGKILL)  # mid-work: its leases lapse
                killed.add(victim)
                spawn(10 + victim)
            if not any(p.is_alive() for p in procs.values()):
                break
            await asyncio.sleep(0.005)
        for p in procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        assert len(killed) == 2
        assert max(samples) <= CAP, max(samples)
        assert max(samples) == CAP  # the cap was contended
        delivered: dict[str, list[tuple[int, int]]] = defaultdict(list)  # (token, seed)
        acked_ok: dict[str, int] = defaultdict(int)
        for seed, line in _ledger_lines(tmp_path):
            kind, run, *rest = line.split()
            if kind == "D":
                delivered[run].append((int(rest[0]), seed))
            elif rest[1] == AckStatus.ACKED.name:
                acked_ok[run] += 1
        # nothing lost: every run completed (its outcome, written with its ack: a process
        # killed between its ack and its ledger line finished a run without noting it)
        infos = []
        for i in range(0, RUNS, 50):
            infos += await asyncio.gather(
                *(rq.get_run(ENV, r.run_id) for r in requests[i : i + 50])
            )
        odd = [(r.run_id, i) for r, i in zip(requests, infos, strict=True)
               if i is None or i.status is not RunStatus.COMPLETED]  # fmt: skip
        assert not odd, odd[:3]
        assert max(acked_ok.values()) == 1  # no run acked twice
        for run, seen in delivered.items():  # a redelivery follows a killed holder
            holders = [seed for _, seed in sorted(seen)]
            assert all(s in killed for s in holders[:-1]), (run, seen)
        stats = await rq.queue_stats(ENV, QUEUE)
        assert (stats.queued, stats.running) == (0, 0)
        print(f"\n{RUNS} runs, 4 processes, 2 killed: largest in flight sampled "
              f"{max(samples)} (cap {CAP}) over {len(samples)} samples")  # fmt: skip
    finally:
        await rq.close()

"""How close a run's estimated start is to its real one, and what reading a position or
a queue's backlog costs.

Accuracy: each workload enqueues backlogs on a few tenants, drains the queue at a steady
10 runs/s on a logical clock (one run per 100 ms, acked at once) for 3 s, reads the
position of every run still queued, drains the rest and compares each estimate with the
time the run really started. Reported per workload and order: the mean and largest
absolute error (s), and the 90th percentile of |error| / real wait.

Cost: commands the server ran per ``run_position`` and per ``queue_backlog`` call (INFO
commandstats) and round trips, on a queue with F keyed flows.

    python bench/position_estimate.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from collections.abc import Sequence
from typing import Any

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue

ENV = Environment("bench", "position", "prod")
Q = "jobs"
STEP_MS = 100
WARM_STEPS = 30
#: A history bucket's start: the drain begins on one.
START = 10_000_000

#: name -> [(tenant, its keys, runs, tenant weight)]
WORKLOADS: dict[str, list[tuple[str, list[str], int, float]]] = {
    "three tenants": [("A", ["a"], 6, 1.0), ("B", ["b1", "b2"], 20, 1.0), ("C", ["c"], 30, 1.0)],
    "weighted 1:2:1": [("A", ["a"], 30, 1.0), ("B", ["b"], 30, 2.0), ("C", ["c"], 30, 1.0)],
    "ten tenants, uneven": [(f"T{i}", [f"k{i}"], 5 + 7 * i, 1.0) for i in range(10)],
}


async def _store(url: str, prefix: str, fair: bool) -> RunQueue:
    config = RunQueueConfig(prefix=prefix).with_vtime(enabled=fair)
    return RunQueue(await connect(url), config, rng=random.Random(1))


async def _drain(rq: RunQueue, start: int, steps: int | None) -> dict[str, int]:
    started: dict[str, int] = {}
    t, i = start, 0
    while steps is None or i < steps:
        got = await rq.dequeue(1, env=ENV, queues=[Q], now_ms=t)
        if not got:
            break
        started.update((d.run_id, t) for d in got)
        await rq.ack(got, now_ms=t)
        t, i = t + STEP_MS, i + 1
    return started


async def accuracy(url: str, name: str, fair: bool) -> dict[str, Any]:
    rq = await _store(url, f"acc{int(fair)}{abs(hash(name)) % 10_000}", fair)
    try:
        requests = []
        for tenant, keys, n, weight in WORKLOADS[name]:
            if weight != 1.0:
                await rq.set_tenant_weight(ENV, tenant, weight)
            for i in range(n):
                requests.append(
                    EnqueueRequest(ENV, Q, f"{tenant}-{i}", None, tenant=tenant,
                                   concurrency_key=keys[i % len(keys)],
                                   available_at_ms=START - 10_000 + len(requests))
                )  # fmt: skip
        await rq.enqueue_many(requests, now_ms=START - 1)
        warm = await _drain(rq, START, WARM_STEPS)
        now = START + WARM_STEPS * STEP_MS
        estimates = {}
        for r in requests:
            if r.run_id not in warm:
                p = await rq.run_position(ENV, r.run_id, now_ms=now)
                assert p is not None and p.estimate is not None
                estimates[r.run_id] = p.estimate.at_ms
        real = await _drain(rq, now, None)
        errors = [(estimates[run] - real[run]) / 1000 for run in estimates]
        relative = sorted(
            abs(estimates[run] - real[run]) / max(real[run] - now, STEP_MS) for run in estimates
        )
        return {
            "runs": len(errors),
            "mean_abs_error_s": round(statistics.fmean(abs(e) for e in errors), 3),
            "max_abs_error_s": round(max(abs(e) for e in errors), 3),
            "p90_relative_error": round(relative[int(0.9 * (len(relative) - 1))], 3),
            "longest_real_wait_s": round(max(real.values()) / 1000 - now / 1000, 1),
        }
    finally:
        await rq.close()


async def _commands(rq: RunQueue) -> int:
    return sum((await rq.command_stats()).values())


async def cost(url: str, flows: int) -> dict[str, Any]:
    rq = await _store(url, f"cost{flows}", True)
    try:
        requests = [
            EnqueueRequest(ENV, Q, f"r{i}", None, concurrency_key=f"k{i % flows}",
                           available_at_ms=START + i)
            for i in range(flows * 2)
        ]  # fmt: skip
        await rq.enqueue_many(requests, now_ms=START)
        now = START + flows * 2 + 1
        await rq.run_position(ENV, "r0", now_ms=now)  # the placement record, read once
        before = await _commands(rq)
        await rq.run_position(ENV, "r0", now_ms=now)
        position = await _commands(rq) - before - 1  # less the INFO of the count itself
        before = await _commands(rq)
        await rq.queue_backlog(ENV, Q, now_ms=now)
        backlog = await _commands(rq) - before - 1
        return {"flows": flows, "commands_per_position": position,
                "commands_per_backlog": backlog, "pipelines_per_position": 3,
                "pipelines_per_backlog": 2}  # fmt: skip
    finally:
        await rq.close()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with EmbeddedServer() as server:
        out: dict[str, Any] = {"step_ms": STEP_MS, "warm_up_runs": WARM_STEPS, "accuracy": {}}
        for name in WORKLOADS:
            out["accuracy"][name] = {
                order: await accuracy(server.url, name, order == "fair")
                for order in ("age", "fair")
            }
        out["cost"] = [await cost(server.url, f) for f in args.flows]
        return out


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, nargs="+", default=[10, 100, 1000])
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse())), indent=2))

"""An environment spread over S partitions: what a run costs, and how far shares deviate.

Two measurements, one JSON document:

* ``cost``: one consumer drains ``--n`` no-op runs of 12 named tenants (weights 1, 2, 4
  in turn) with ``dequeue_batch(10, env=...)`` + ``ack``, in the fair order, for every S
  of ``--partitions``. Per run: server commands (``INFO commandstats``, every master,
  inside scripts included), round trips the consumer waited for (every awaited client
  call; the background read of the next partition view is counted apart: it overlaps
  the ack) and script calls.
* ``shares``: the largest deviation of a tenant's share from its fair share, and its
  largest lag behind its fair count (runs), over the first 2,000 serves of a backlog, for
  tenants of weights 1 : 2 : 4 and for a 1-key against a 9-key tenant, each tenant in a
  partition of its own, for every S, batch size b (``--batches``) and number of
  consumers C (``--consumers``: C RunQueues dequeue at once, each from its own view, as
  consumer processes do), on a logical clock.

    python bench/partitions.py [--n 4000] [--partitions 1,3,6] [--batches 1,10,50]
                               [--consumers 1,4] [--cluster 3]

``--cluster N`` runs against an N-master embedded cluster instead of one server (the
partitions then land on different masters). Server instructions per batch: see
``bench/server_instructions.py --workloads spread:S:12``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fairq.config import RunQueueConfig
from fairq.keys import Environment, encode_tenant, tenant_partition
from fairq.models import EnqueueRequest
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue
from fairq.store._core import StoreCore
from fairq.store.spread import SpreadOps

T0 = 1_000_000
QUEUE = "bench"
SHARDS = 24


@contextlib.asynccontextmanager
async def server(masters: int) -> AsyncIterator[str]:
    if masters:
        from fairq.cluster import EmbeddedCluster

        with EmbeddedCluster(masters) as cluster:
            yield cluster.url
    else:
        with EmbeddedServer() as embedded:
            yield embedded.url


async def queue(url: str, prefix: str) -> RunQueue:
    config = RunQueueConfig(prefix=prefix, shard_count=SHARDS, default_env_concurrency=100_000)
    return RunQueue(await connect(url), config.with_vtime(enabled=True), rng=random.Random(1))


#: Set while the store reads the next partition state in the background (a context
#: variable: the tasks a cluster client starts for a pipeline inherit it).
_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("background", default=False)


class Trips:
    """Counts the awaited client calls (each is a round trip) of every store, the
    background reads of the next partition state apart."""

    def __init__(self) -> None:
        self.waited = 0
        self.background = 0
        self._read = StoreCore.read
        self._view = SpreadOps.spread_view

    def __enter__(self) -> Trips:
        trips = self

        async def read(store: StoreCore, awaitable: Any) -> Any:
            if _BACKGROUND.get():
                trips.background += 1
            else:
                trips.waited += 1
            return await trips._read(store, awaitable)

        async def view(store: SpreadOps, *args: Any) -> Any:
            task = asyncio.current_task()
            if task is not None and task.get_name() == "fairq-view":
                _BACKGROUND.set(True)
            return await trips._view(store, *args)

        StoreCore.read = read  # type: ignore[method-assign]
        SpreadOps.spread_view = view  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        StoreCore.read = self._read  # type: ignore[method-assign]
        SpreadOps.spread_view = self._view  # type: ignore[method-assign]


async def commands(rq: RunQueue) -> Counter[str]:
    return Counter(await rq.command_stats())


async def cost(url: str, partitions: int, n: int) -> dict[str, Any]:
    """Per-run costs of draining ``n`` runs with S = ``partitions``."""
    rq = await queue(url, f"cost{partitions}")
    env = Environment("bench", "spread", f"s{partitions}")
    if partitions > 1:
        await rq.set_partitions(env, partitions)
    tenants = [f"tenant{i}" for i in range(12)]
    for i, t in enumerate(tenants):
        await rq.set_tenant_weight(env, t, (1, 2, 4)[i % 3])
    requests = [EnqueueRequest(env, QUEUE, f"r{i}", {}, tenant=tenants[i % 12]) for i in range(n)]
    for i in range(0, n, 1000):
        await rq.enqueue_many(requests[i : i + 1000])
    warm = await rq.dequeue_batch(10, env=env, queues=[QUEUE])  # scripts loaded
    await rq.ack(warm.deliveries)
    before = await commands(rq)
    done, calls, started = len(warm.deliveries), 0, time.perf_counter()
    with Trips() as trips:
        while done < n:
            batch = await rq.dequeue_batch(10, env=env, queues=[QUEUE])
            await rq.ack(batch.deliveries)
            done += len(batch.deliveries)
            calls += 1
    elapsed = time.perf_counter() - started
    after = await commands(rq)
    measured = n - len(warm.deliveries)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    delta.pop("info", None)
    scripts = delta.get("fcall", 0) + delta.get("evalsha", 0)
    await rq.close()
    return {
        "runs": measured,
        "batches": calls,
        "commands_per_run": round(sum(delta.values()) / measured, 2),
        "script_calls_per_run": round(scripts / measured, 3),
        "round_trips_per_run": round(trips.waited / measured, 3),
        "background_reads_per_run": round(trips.background / measured, 3),
        "runs_per_s_here": round(measured / elapsed),
    }


def tenants_apart(count: int, partitions: int) -> list[str]:
    names: dict[int, str] = {}
    i = 0
    while len(names) < count:
        names.setdefault(
            tenant_partition(encode_tenant(f"tenant{i}"), "", partitions), f"tenant{i}"
        )
        i += 1
    return list(names.values())


async def shares(
    url: str, workload: str, partitions: int, batch: int, consumers: int, runs: int = 2_000
) -> dict[str, Any]:
    """Deviation from the fair shares of one workload with S, b and C."""
    prefix = f"sh-{workload}-{partitions}-{batch}-{consumers}"
    stores = [await queue(url, prefix) for _ in range(consumers)]
    rq = stores[0]
    env = Environment("bench", "shares", "e")
    if partitions > 1:
        await rq.set_partitions(env, partitions)
    names = tenants_apart(3 if workload == "weights" else 2, max(partitions, 3))
    weights = (
        dict(zip(names, (1, 2, 4), strict=False))
        if workload == "weights"
        else dict.fromkeys(names, 1)
    )
    keys = dict.fromkeys(names, 1) if workload == "weights" else {names[0]: 1, names[1]: 9}
    for t, w in weights.items():
        if w != 1:
            await rq.set_tenant_weight(env, t, w)
    requests = [
        EnqueueRequest(env, QUEUE, f"{t}-{i}", None, tenant=t, concurrency_key=f"{t}-{i % keys[t]}",
                       available_at_ms=T0 - 10_000 + i)
        for t in names
        for i in range(runs)
    ]  # fmt: skip
    for i in range(0, len(requests), 1000):
        await rq.enqueue_many(requests[i : i + 1000], now_ms=T0)
    counts: Counter[str] = Counter()
    total_w = sum(weights.values())
    lag = 0.0
    step = 0
    while sum(counts.values()) < runs:
        now = T0 + step * 1000
        got = await asyncio.gather(
            *(s.dequeue(batch, env=env, queues=[QUEUE], now_ms=now) for s in stores)
        )
        for deliveries in got:
            counts.update(d.tenant for d in deliveries)
            await rq.ack(deliveries, now_ms=now)
        served = sum(counts.values())
        lag = max(lag, *(served * w / total_w - counts[t] for t, w in weights.items()))
        step += 1
    served = sum(counts.values())
    deviation = max(abs(counts[t] / served / (w / total_w) - 1) for t, w in weights.items())
    for s in stores:
        await s.close()
    return {
        "S": partitions, "b": batch, "C": consumers, "served": served,
        "shares": {t: round(counts[t] / served, 4) for t in names},
        "largest_share_deviation": round(deviation, 4), "largest_lag_runs": round(lag, 1),
    }  # fmt: skip


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"n": args.n, "masters": args.cluster or 1, "cost": {}, "shares": []}
    async with server(args.cluster) as url:
        for s in numbers(args.partitions):
            out["cost"][f"S={s}"] = await cost(url, s, args.n)
            print("cost", s, json.dumps(out["cost"][f"S={s}"]), file=sys.stderr, flush=True)
        for workload in ("weights", "keys"):
            for s in numbers(args.partitions):
                for b in numbers(args.batches):
                    for c in numbers(args.consumers):
                        row = {"workload": workload, **await shares(url, workload, s, b, c)}
                        out["shares"].append(row)
                        print("shares", json.dumps(row), file=sys.stderr, flush=True)
    return out


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--partitions", default="1,3,6")
    parser.add_argument("--batches", default="1,10,50")
    parser.add_argument("--consumers", default="1,4")
    parser.add_argument("--cluster", type=int, default=0, help="masters (0: one server)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse())), indent=2))

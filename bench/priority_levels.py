"""What priority levels cost: server commands and wall time per run with every run at one
level against runs spread over five, in the age and the fair order.

One consumer drains ``--n`` no-op runs of ``--keys`` keys (named tenants: ``--tenants``)
with ``dequeue_batch(10, env=...)`` + ``ack``; the runs are enqueued in batches of 100
beforehand. Per run: server commands (``INFO commandstats``, inside scripts included) of
the enqueue and of the drain, and the drain's wall time; the two layouts run in turn,
``--reps`` times each, and the JSON gives each layout's figures and their ratio.

    python bench/priority_levels.py [--n 3000] [--keys 100] [--tenants 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue


async def commands(client: Any) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if not k.startswith("cmdstat_info"))


async def one(
    url: str, order: str, levels: int, args: argparse.Namespace, rep: int
) -> dict[str, float]:
    client = await connect(url)
    await client.flushall()
    config = RunQueueConfig(prefix=f"pl{rep}").with_vtime(enabled=order == "fair")
    rq = RunQueue(client, config)
    env = Environment("o", "p", f"{order}{levels}")
    await rq.set_env_limits(env, concurrency=1000)
    await rq.set_queue_options(env, "q", order=order)
    requests = [
        EnqueueRequest(env, "q", f"r{i}", None, f"k{i % args.keys}",
                       tenant=f"t{i % args.tenants}", priority=1 + i % 5 if levels == 5 else None)
        for i in range(args.n)
    ]  # fmt: skip
    await client.config_resetstat()
    for i in range(0, args.n, 100):
        await rq.enqueue_many(requests[i : i + 100])
    enqueue_cmds = await commands(client)
    await client.config_resetstat()
    started, done = time.perf_counter(), 0
    while done < args.n:
        batch = await rq.dequeue_batch(10, env=env)
        if not batch.deliveries:
            break
        await rq.ack(batch.deliveries)
        done += len(batch.deliveries)
    wall = time.perf_counter() - started
    drain_cmds = await commands(client)
    await client.aclose()
    return {
        "enqueue_cmds_per_run": enqueue_cmds / args.n,
        "drain_cmds_per_run": drain_cmds / done,
        "drain_us_per_run": wall / done * 1e6,
        "served": done,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"n": args.n, "keys": args.keys, "tenants": args.tenants}
    with EmbeddedServer() as server:
        for order in ("age", "fair"):
            rows: dict[int, list[dict[str, float]]] = {1: [], 5: []}
            for rep in range(args.reps):
                for levels in (1, 5):  # in turn, so both see the same machine load
                    rows[levels].append(await one(server.url, order, levels, args, rep))
            mean = {
                lv: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for lv, rs in rows.items()
            }
            out[order] = {
                "one_level": mean[1], "five_levels": mean[5],
                "ratio": {k: mean[5][k] / mean[1][k] for k in mean[1] if k != "served"},
            }  # fmt: skip
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))

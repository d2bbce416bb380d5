"""fairq throughput benchmark: enqueue, then dequeue + ack with 1 and 4 consumer processes.

Prints one JSON document. For each server it measures:

* ``enqueue``: msgs/s for batched producers (``enqueue_many``, ``--enqueue-batch`` runs
  per call) and for one-at-a-time ``enqueue``;
* ``consume_1`` / ``consume_4``: dequeue + ack msgs/s with 1 and 4 consumer *processes*
  (each a :class:`fairq.consumer.Consumer` leasing ``--batch`` runs per call and acking
  each batch with one call per shard);
* per delivered message: round trips (client-side: every packed write a connection sends,
  a pipeline counting once per node it reaches), script calls and server commands (from
  ``INFO commandstats`` on every node; commands run inside Lua count too);
* ``cycle_round_trips_per_message``: enqueue + dequeue + ack, amortised: the aim is <= 3.

``--cluster N`` runs the same workload on one embedded node and on an N-master embedded
cluster in one run, and reports the cluster / single-node ratios. ``--profile`` runs one
consumer in-process under cProfile and adds where its time goes.

Usage::

    python bench/throughput.py                  # one embedded node
    python bench/throughput.py --cluster 3      # one node vs a 3-master cluster
    python bench/throughput.py --url redis://host:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis.asyncio.connection as redis_connection

from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.server import AnyRedis, EmbeddedServer, connect, info_per_node, is_cluster_url
from fairq.store import RunQueue

#: This script, run again as each consumer process.
SCRIPT_PATH = os.path.abspath(__file__)
#: Commands the benchmark itself sends for bookkeeping; not counted as fairq's work.
BOOKKEEPING = {"info", "config|resetstat", "config", "cluster|nodes", "cluster|slots",
               "cluster|shards", "command", "command|docs", "ping", "hello", "client|setinfo",
               "client|setname", "cluster", "select"}  # fmt: skip


# --------------------------------------------------------------------------- round trips


class RoundTrips:
    """Counts packed writes on every redis-py asyncio connection of this process."""

    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        original = redis_connection.AbstractConnection.send_packed_command

        async def counting(self: Any, command: Any, check_health: bool = True) -> None:
            cls.count += 1
            await original(self, command, check_health)

        redis_connection.AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
        cls._installed = True


# --------------------------------------------------------------------------- server stats


async def primaries(client: AnyRedis) -> list[Any]:
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        return list(client.get_primaries())
    return [None]


async def reset_stats(client: AnyRedis) -> None:
    for node in await primaries(client):
        if node is None:
            await client.config_resetstat()
        else:
            await client.execute_command("CONFIG RESETSTAT", target_nodes=node)


async def command_stats(client: AnyRedis) -> dict[str, int]:
    """Calls per command, summed over every master."""
    totals: dict[str, int] = {}
    for info in (await info_per_node(client, "commandstats")).values():
        for key, value in info.items():
            name = key.removeprefix("cmdstat_")
            calls = int(value["calls"]) if isinstance(value, dict) else 0
            totals[name] = totals.get(name, 0) + calls
    return totals


async def server_cpu_s(client: AnyRedis) -> float:
    """CPU seconds (user + system) every master has used so far."""
    total = 0.0
    for info in (await info_per_node(client, "cpu")).values():
        total += float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0))
    return total


def summarise_commands(stats: dict[str, int], messages: int) -> dict[str, Any]:
    fairq = {k: v for k, v in stats.items() if k not in BOOKKEEPING}
    total = sum(fairq.values())
    # the scripts run as function libraries (FCALL); EVALSHA / EVAL kept for older builds
    scripts = sum(fairq.get(name, 0) for name in ("fcall", "fcall_ro", "evalsha", "eval"))
    top = sorted(fairq.items(), key=lambda kv: -kv[1])[:8]
    return {
        "server_commands_per_message": round(total / messages, 3),
        "script_calls_per_message": round(scripts / messages, 4),
        "top_commands": dict(top),
    }


# --------------------------------------------------------------------------- workload


def environments(count: int) -> list[Environment]:
    return [Environment("bench", "proj", f"env{i}") for i in range(count)]


def config(args: argparse.Namespace, prefix: str) -> RunQueueConfig:
    return RunQueueConfig(prefix=prefix, shard_count=args.shards, lease_ms=120_000)


async def enqueue_all(rq: RunQueue, args: argparse.Namespace, count: int) -> None:
    envs = environments(args.envs)
    payload = "x" * args.payload_bytes
    rng = random.Random(1)
    batch: list[EnqueueRequest] = []
    for i in range(count):
        env = envs[rng.randrange(len(envs))]
        batch.append(EnqueueRequest(env, f"q{i % args.queues}", f"r{i}", payload))
        if len(batch) >= args.enqueue_batch:
            await rq.enqueue_many(batch)
            batch = []
    if batch:
        await rq.enqueue_many(batch)


async def queued_left(rq: RunQueue) -> int:
    """Runs still queued over every environment and queue of the prefix."""
    left = 0
    for env in await rq.environments():
        names = await rq.queues(env)
        left += sum(s.queued for s in await rq.queues_stats(env, names)) if names else 0
    return left


async def measure_enqueue(url: str, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    rq = RunQueue(await connect(url), config(args, prefix))
    try:
        await reset_stats(rq.client)
        trips = RoundTrips.count
        server_cpu = await server_cpu_s(rq.client)
        client_cpu = time.process_time()
        start = time.perf_counter()
        await enqueue_all(rq, args, args.messages)
        elapsed = time.perf_counter() - start
        client_cpu = time.process_time() - client_cpu
        server_cpu = await server_cpu_s(rq.client) - server_cpu
        trips = RoundTrips.count - trips
        stats = await command_stats(rq.client)
        single = min(2000, args.messages)
        envs = environments(args.envs)
        start = time.perf_counter()
        for i in range(single):
            await rq.enqueue(envs[i % len(envs)], "single", f"s{i}", None)
        single_elapsed = time.perf_counter() - start
        return {
            "messages": args.messages,
            "batch": args.enqueue_batch,
            "msgs_per_s": round(args.messages / elapsed),
            "round_trips_per_message": round(trips / args.messages, 4),
            "client_cpu_us_per_message": round(client_cpu * 1e6 / args.messages, 1),
            "server_cpu_us_per_message": round(server_cpu * 1e6 / args.messages, 1),
            "one_at_a_time_msgs_per_s": round(single / single_elapsed),
            **summarise_commands(stats, args.messages),
        }
    finally:
        await rq.close()


async def consume(
    url: str, args: argparse.Namespace, prefix: str, start_at: float
) -> dict[str, Any]:
    """One consumer: drain until a short wait finds nothing. Returns its figures."""
    rq = RunQueue(await connect(url), config(args, prefix))
    consumer = Consumer(rq, idle_timeout=0.05, maintenance_interval=3600)
    await consumer.start()
    delay = start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    trips = RoundTrips.count
    count = 0
    first = time.time()
    last = first
    cpu = time.process_time()
    try:
        while True:
            batch = await consumer.next_batch(args.batch, timeout=0.3)
            if not batch:
                break
            await rq.ack(batch)
            count += len(batch)
            last = time.time()
    finally:
        await consumer.close()
        await rq.close()
    return {
        "count": count,
        "first": first,
        "last": last,
        "round_trips": RoundTrips.count - trips,
        "cpu_s": time.process_time() - cpu,
    }


def consumer_main(argv: list[str]) -> None:
    """Entry point of a consumer process: ``throughput.py _consume URL PREFIX START ...``."""
    url, prefix, start_at, *rest = argv
    args = parse_args(rest)
    RoundTrips.install()
    result = asyncio.run(consume(url, args, prefix, float(start_at)))
    print(json.dumps(result))


async def measure_consume(
    url: str, args: argparse.Namespace, prefix: str, processes: int
) -> dict[str, Any]:
    client = await connect(url)
    rq = RunQueue(client, config(args, prefix))
    try:
        await enqueue_all(rq, args, args.messages)
        await reset_stats(client)
        server_cpu = await server_cpu_s(client)
        start_at = time.time() + 1.5 + 0.3 * processes  # after every process has connected
        passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in option_values(args).items()]
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                SCRIPT_PATH,
                "_consume",
                url,
                prefix,
                str(start_at),
                *passthrough,
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(processes)
        ]
        results = []
        for p in procs:
            out, _ = await asyncio.wait_for(p.communicate(), 600)
            if p.returncode != 0:
                raise RuntimeError(f"consumer process failed ({p.returncode})")
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        stats = await command_stats(client)
        server_cpu = await server_cpu_s(client) - server_cpu
        delivered = sum(r["count"] for r in results)
        elapsed = max(r["last"] for r in results) - min(r["first"] for r in results)
        trips = sum(r["round_trips"] for r in results)
        remaining = await queued_left(rq)
        return {
            "processes": processes,
            "delivered": delivered,
            "msgs_per_s": round(delivered / elapsed),
            "per_process_msgs_per_s": [
                round(r["count"] / max(1e-9, r["last"] - r["first"])) for r in results
            ],
            "round_trips_per_message": round(trips / max(1, delivered), 4),
            "client_cpu_us_per_message": round(
                sum(r["cpu_s"] for r in results) * 1e6 / max(1, delivered), 1
            ),
            "server_cpu_us_per_message": round(server_cpu * 1e6 / max(1, delivered), 1),
            "left_undelivered": remaining,
            **summarise_commands(stats, max(1, delivered)),
        }
    finally:
        await rq.close()


async def profile_consumer(url: str, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """Drain ``--messages`` runs with one in-process consumer under cProfile."""
    rq = RunQueue(await connect(url), config(args, prefix))
    try:
        await enqueue_all(rq, args, args.messages)
    finally:
        await rq.close()
    profiler = cProfile.Profile()
    profiler.enable()
    result = await consume(url, args, prefix, 0.0)
    profiler.disable()
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer).sort_stats("tottime")
    stats.print_stats(15)
    lines = [ln for ln in buffer.getvalue().splitlines() if ln.strip()]
    elapsed = result["last"] - result["first"]
    return {
        "msgs_per_s": round(result["count"] / max(1e-9, elapsed)),
        "top_by_own_time": lines[-16:],
    }


# --------------------------------------------------------------------------- driver


async def run_target(url: str, args: argparse.Namespace) -> dict[str, Any]:
    tag = f"bench{os.getpid()}x{random.randrange(1 << 30)}"
    out: dict[str, Any] = {"url": url, "cluster": is_cluster_url(url)}
    out["enqueue"] = await measure_enqueue(url, args, tag + "e")
    # the runs enqueued above are drained by the first consumer phase (plus its own)
    out["consume_1"] = await measure_consume(url, args, tag + "e", 1)
    out["consume_4"] = await measure_consume(url, args, tag + "f", 4)
    enq = out["enqueue"]["round_trips_per_message"]
    out["cycle_round_trips_per_message"] = {
        label: round(enq + out[label]["round_trips_per_message"], 4)
        for label in ("consume_1", "consume_4")
    }
    if args.profile:
        out["profile_1_consumer"] = await profile_consumer(url, args, tag + "p")
    return out


@contextmanager
def server_for(kind: str, masters: int) -> Iterator[str]:
    if kind == "cluster":
        from fairq.cluster import EmbeddedCluster

        with EmbeddedCluster(masters) as cluster:
            yield cluster.url
    else:
        with EmbeddedServer() as server:
            yield server.url


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("messages", "batch", "enqueue_batch", "envs",
                                          "queues", "shards", "payload_bytes")}  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="measure this server only (redis://, redis+cluster://…)")
    p.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="N",
        help="also run on an N-master embedded cluster and report the ratio",
    )
    p.add_argument("--messages", type=int, default=20_000, help="runs per phase")
    p.add_argument("--batch", type=int, default=100, help="runs leased per dequeue call")
    p.add_argument("--enqueue-batch", type=int, default=100, help="runs per enqueue_many call")
    p.add_argument("--envs", type=int, default=8, help="environments the runs spread over")
    p.add_argument("--queues", type=int, default=2, help="queues per environment")
    p.add_argument(
        "--shards",
        type=int,
        default=0,
        help="shard_count (default: 4, or 4 x masters with --cluster)",
    )
    p.add_argument("--payload-bytes", type=int, default=16)
    p.add_argument("--profile", action="store_true", help="profile one in-process consumer")
    args = p.parse_args(argv)  # fmt: skip
    if args.shards <= 0:
        args.shards = 8 * max(1, args.cluster)
    return args


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    RoundTrips.install()
    result: dict[str, Any] = {
        "settings": option_values(args),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    if args.url:
        result["server"] = await run_target(args.url, args)
        return result
    with server_for("single", 1) as url:
        result["single_node"] = await run_target(url, args)
    if args.cluster:
        with server_for("cluster", args.cluster) as url:
            result[f"cluster_{args.cluster}_masters"] = await run_target(url, args)
        single, multi = result["single_node"], result[f"cluster_{args.cluster}_masters"]
        result["cluster_over_single_node"] = {
            "enqueue": round(multi["enqueue"]["msgs_per_s"] / single["enqueue"]["msgs_per_s"], 2),
            "consume_1": round(
                multi["consume_1"]["msgs_per_s"] / single["consume_1"]["msgs_per_s"], 2
            ),
            "consume_4": round(
                multi["consume_4"]["msgs_per_s"] / single["consume_4"]["msgs_per_s"], 2
            ),
        }
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_consume":
        consumer_main(argv[1:])
        return
    args = parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()

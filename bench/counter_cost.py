"""What the CK Queued/Running counters cost the server, per enqueue, dequeue and ack.

Runs on a private embedded Valkey and reads ``INFO commandstats`` (which counts the
commands a Lua script calls) after ``CONFIG RESETSTAT``. Three set-ups do the same
work, N runs each:

* ``keyless``: runs without a concurrency key (never touch a counter);
* ``ck``: runs spread over V concurrency-key variants, with fairq's scripts;
* ``ck_without_counters``: the same, with ``lua/include/counters.lua`` swapped for a
  stub that does the bare ZADD/ZREM/SADD/SREM (no counters, no ``B:ckbusy``).

``ck - ck_without_counters`` is what the counters add; ``ck - keyless`` is what keyed
runs cost in all (the CK index upkeep included). Also reported: one enqueue that finds
its counter gone (the re-seed, which reads every variant once).

Usage: ``python bench/counter_cost.py [--runs N] [--variants V]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.scripts import Script, ScriptRegistry
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue

#: Commands the client itself sends (not work done for a run): left out of the figures.
CLIENT_COMMANDS = frozenset(
    {"config|resetstat", "info", "ping", "hello", "client|setinfo", "select", "script|load"}
)

#: counters.lua with the counting taken out: what the scripts would do without counters.
NO_COUNTERS_LUA = """\
local function ck_queued_value(B)
  local total = 0
  for _, ck in ipairs(redis.call('ZRANGE', B .. ':ckindex', 0, -1)) do
    total = total + redis.call('ZCARD', variant_queued_key(B, ck))
  end
  return total
end
local function ck_running_seed(B) return 0 end
local function ck_queue_add(B, ck, score, run)
  return redis.call('ZADD', variant_queued_key(B, ck), score, run)
end
local function ck_queue_remove(B, ck, run)
  return redis.call('ZREM', variant_queued_key(B, ck), run)
end
local function ck_slot_take(B, ck, run)
  return redis.call('SADD', variant_inflight_key(B, ck), run)
end
local function ck_slot_free(B, ck, run)
  return redis.call('SREM', variant_inflight_key(B, ck), run)
end
"""

ENV = Environment("bench", "counters", "prod")
QUEUE = "task/bench"
NOW = 1_000_000


def without_counters() -> ScriptRegistry:
    """A registry whose scripts include the no-counter stub instead of counters.lua."""
    counters = resources.files("fairq").joinpath("lua", "include", "counters.lua").read_text()
    registry = ScriptRegistry()
    for script in registry.all():
        if counters in script.source:
            source = script.source.replace(counters, NO_COUNTERS_LUA)
            sha = hashlib.sha1(source.encode()).hexdigest()
            registry._scripts[script.name] = Script(script.name, source, sha)
    return registry


async def preload(rq: RunQueue) -> None:
    """Load every script first, so no NOSCRIPT retry lands in a measurement."""
    for script in rq._scripts.all():
        await rq.client.script_load(script.source)


async def measure(rq: RunQueue, work: Callable[[], Awaitable[None]]) -> dict[str, int]:
    """Commands the server ran for ``work`` (client bookkeeping excluded)."""
    await rq.client.config_resetstat()
    await work()
    stats: dict[str, Any] = await rq.client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {k: v for k, v in sorted(calls.items()) if k not in CLIENT_COMMANDS}


def per_op(calls: dict[str, int], n: int) -> dict[str, Any]:
    return {
        "total": round(sum(calls.values()) / n, 2),
        "by_command": {k: round(v / n, 2) for k, v in calls.items()},
    }


def difference(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    names = sorted(set(a["by_command"]) | set(b["by_command"]))
    delta = {k: round(a["by_command"].get(k, 0) - b["by_command"].get(k, 0), 2) for k in names}
    return {
        "total": round(a["total"] - b["total"], 2),
        "by_command": {k: v for k, v in delta.items() if v},
    }


async def run_setup(
    url: str, prefix: str, *, keyed: bool, variants: int, runs: int, registry: ScriptRegistry | None
) -> dict[str, dict[str, Any]]:
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, shard_count=1))
    if registry is not None:
        rq._scripts = registry  # bench only: swap the scripts the store calls
    await rq.set_env_limits(ENV, concurrency=1_000_000)
    await preload(rq)
    leased = []

    def ck(i: int) -> str | None:
        return f"tenant-{i % variants}" if keyed else None

    async def enqueue() -> None:
        for i in range(runs):
            await rq.enqueue(ENV, QUEUE, f"run-{i}", {"i": i}, concurrency_key=ck(i), now_ms=NOW)

    async def dequeue() -> None:
        for _ in range(runs):
            got = await rq.dequeue_from_queue(ENV, QUEUE, keyed=keyed, max_count=1, now_ms=NOW + 1)
            assert len(got) == 1
            leased.extend(got)

    async def ack() -> None:
        for d in leased:
            await rq.ack([d], now_ms=NOW + 2)

    out: dict[str, dict[str, Any]] = {}
    for phase, work in (("enqueue", enqueue), ("dequeue", dequeue), ("ack", ack)):
        calls = await measure(rq, work)
        evalsha = calls.pop("evalsha", 0)
        assert evalsha == runs, (phase, evalsha)
        out[phase] = per_op(calls, runs)
    await rq.close()
    return out


async def reseed_cost(url: str, prefix: str, variants: int) -> dict[str, Any]:
    """One keyed enqueue that finds the queued counter gone, with ``variants`` non-empty."""
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, shard_count=1))
    await preload(rq)
    for i in range(variants):
        await rq.enqueue(ENV, QUEUE, f"seed-{i}", None, concurrency_key=f"t-{i}", now_ms=NOW)
    steady = await measure(rq, lambda: _one(rq, "steady", "t-0"))  # counter present: the usual cost
    await rq.client.delete(rq.keys.queue(ENV, QUEUE).ck_queued_counter)
    cold = await measure(rq, lambda: _one(rq, "cold", "t-0"))
    await rq.close()
    for calls in (steady, cold):
        calls.pop("evalsha", None)
    return {
        "variants": variants,
        "enqueue_counter_present": sum(steady.values()),
        "enqueue_counter_missing": sum(cold.values()),
        "by_command_missing": cold,
    }


async def _one(rq: RunQueue, run_id: str, ck: str) -> None:
    await rq.enqueue(ENV, QUEUE, run_id, None, concurrency_key=ck, now_ms=NOW)


async def main(runs: int, variants: int) -> dict[str, Any]:
    with EmbeddedServer() as server:
        probe = await connect(server.url)
        info = await probe.info("server")
        await probe.aclose()
        keyless = await run_setup(
            server.url, "bench-keyless", keyed=False, variants=variants, runs=runs, registry=None
        )
        ck = await run_setup(
            server.url, "bench-ck", keyed=True, variants=variants, runs=runs, registry=None
        )
        bare = await run_setup(
            server.url, "bench-bare", keyed=True, variants=variants, runs=runs,
            registry=without_counters(),
        )  # fmt: skip
        reseed = await reseed_cost(server.url, "bench-reseed", variants)
    report: dict[str, Any] = {
        "server": f"valkey {info.get('valkey_version', info.get('redis_version'))}",
        "runs": runs,
        "variants": variants,
        "note": "server commands per operation, script-internal commands included, the "
        "one EVALSHA per operation excluded",
    }
    for phase in ("enqueue", "dequeue", "ack"):
        report[f"per_{phase}"] = {
            "keyless": keyless[phase],
            "ck": ck[phase],
            "ck_without_counters": bare[phase],
            "added_by_counters": difference(ck[phase], bare[phase]),
            "ck_minus_keyless": difference(ck[phase], keyless[phase]),
        }
    report["reseed"] = reseed
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2_000, help="runs per set-up")
    parser.add_argument("--variants", type=int, default=10, help="concurrency keys")
    args = parser.parse_args()
    json.dump(asyncio.run(main(args.runs, args.variants)), sys.stdout, indent=2)
    sys.stdout.write("\n")

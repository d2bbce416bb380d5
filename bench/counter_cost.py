"""What the CK Queued/Running counters cost the server, per enqueue, dequeue and ack.

Runs on a private embedded Valkey and reads ``INFO commandstats`` (which counts the
commands a Lua script calls) after ``CONFIG RESETSTAT``. Three set-ups do the same
work, N runs each:

* ``keyless``: runs without a concurrency key (never touch a counter);
* ``ck``: runs spread over V concurrency-key variants, with fairq's scripts;
* ``ck_without_counters``: the same, with ``store/lua/include/counters.lua`` swapped for
  a stub that keeps no counters (its readers count the truth each time: the variants'
  queued sets, the environment's in-flight set).

``ck - ck_without_counters`` is what the counters add; ``ck - keyless`` is what keyed
runs cost in all (the CK index upkeep included). Also reported: one enqueue that finds
its counter gone (the re-seed, which reads every variant once).

Usage: ``python bench/counter_cost.py [--runs N] [--variants V]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue
from fairq.store.scripts import ScriptRegistry, _package_reader

#: Commands the client itself sends (not work done for a run): left out of the figures.
CLIENT_COMMANDS = frozenset(
    {"config|resetstat", "info", "ping", "hello", "client|setinfo", "select", "function|load"}
)
#: The one command per operation that runs its script.
SCRIPT_CALL = "fcall"

#: counters.lua with the counting taken out: no counter keys; a script that needs a count
#: reads the truth (what the scripts would have to do without the counters).
NO_COUNTERS_LUA = """\
--@require state
local function queued_truth(B)
  local total = 0
  for _, ck in ipairs(redis.call('ZRANGE', queue_key(B, 'ck_index'), 0, -1)) do
    total = total + redis.call('ZCARD', variant_key(B, ck, 'queued'))
  end
  return total
end
local function running_truth(tag, V, env_id, queue)
  local keyed, tenants = 0, {}
  for _, run in ipairs(redis.call('SMEMBERS', env_key(V, 'inflight'))) do
    local f = redis.call('HMGET', run_key(tag, env_id .. ':' .. run), 'q', 'k', 'ta')
    if f[1] == queue then
      if f[2] and f[2] ~= '' then keyed = keyed + 1 end
      if f[3] and f[3] ~= '' then tenants[f[3]] = (tenants[f[3]] or 0) + 1 end
    end
  end
  return keyed, tenants
end
local function ck_queued(X, B, V, env_id, queue) return queued_truth(B) end
local function ck_running(X, B, V, env_id, queue)
  local keyed = running_truth(X.tag, V, env_id, queue)
  return keyed
end
local function ck_queued_add(X, B, V, env_id, queue, delta) end
local function ck_running_add(X, B, V, env_id, queue, delta) end
local function tenant_running(X, B, V, env_id, queue, tenant)
  local _, tenants = running_truth(X.tag, V, env_id, queue)
  return tenants[tenant] or 0
end
local function tenant_running_add(X, B, V, env_id, queue, tenant, delta) end
local function counters_flush(X) end
"""

ENV = Environment("bench", "counters", "prod")
QUEUE = "task/bench"
NOW = 1_000_000


def without_counters() -> ScriptRegistry:
    """A registry whose scripts include the no-counter stub instead of counters.lua (its
    libraries get other names, so both builds live on one server)."""

    def read(relative: str) -> str | None:
        if relative == "include/counters.lua":
            return NO_COUNTERS_LUA
        return _package_reader(relative)

    return ScriptRegistry(read)


async def preload(rq: RunQueue) -> None:
    """Load every script's library first, so no load lands in a measurement."""
    for script in rq._scripts.all():
        await rq.client.execute_command("FUNCTION", "LOAD", "REPLACE", script.source)


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
        fcalls = calls.pop(SCRIPT_CALL, 0)
        assert fcalls == runs, (phase, fcalls)
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
        calls.pop(SCRIPT_CALL, None)
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
        "one FCALL per operation excluded",
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

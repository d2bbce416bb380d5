"""Where a dequeue's server time goes, phase by phase: the fair order's serve engine and
the age order's, on the same data, measured inside the server.

``bench/server_instructions.py`` says how much work a dequeue does; this says where. It
copies this checkout's package to a scratch directory and adds probes to the copy's Lua
(the real scripts are never touched): every phase function of the fair serve engine
(``E.gather``, ``E.serve_round``, ``E.write_back`` ... in
``store/lua/include/order_fair_serve.lua``), the claim of runs (``claim`` in
``include/claim.lua``, shared by both orders), the serve hook and the ack's order hooks
are wrapped in a function that adds Lua's own clock (``os.clock``, CPU time of the server
process) around the call. Each library's totals go to its own hash at the end of every
script (``HOOK.finish``), and the figures sum them. The whole script's time is the
server's own figure (``INFO commandstats``, ``usec`` of ``FCALL``) for the dequeue and
for the ack, each read alone.

Phases nest (``fair_serve`` holds ``gather`` and ``serve_round``; ``gather`` holds
``discover`` (``discover_heads``, ``adopt_discovered``) and ``attach_tenants``;
``serve_round`` holds ``load_keys``, ``best_key``, ``serve_flow`` (which holds
``claim``) and ``hold_back``):
each figure is inclusive. A probe costs about a microsecond of its own, so a phase that
runs many times per call reads high by that much per run; the script totals include
every probe. Compare orders and workloads with each other, not with the figures of an
unprobed server (``server_instructions.py`` gives those).

Workloads are ``ORDER:KEYS:TENANTS`` as in ``server_instructions.py``: ``--n`` keyed runs
on KEYS keys, owned by TENANTS named tenants (0: each key its own tenant), dequeued 10 at
a time and acked by one consumer. The orders' workloads are interleaved rep by rep.

    python bench/serve_phases.py [--workloads fair:1000:100,age:1000:100] [--n 3000]
                                 [--reps 3] [--table]

Prints one JSON document (microseconds per dequeue call, medians over the reps, and how
many times per call each phase ran); ``--table`` prints a table after it too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORKLOADS = "fair:1000:100,age:1000:100,fair:1000:0,age:1000:0"
#: Batches before measuring (libraries loaded, caches warm).
WARM_BATCHES = 20
LUA = Path("fairq") / "store" / "lua"

#: The order hooks that get a probe (the ones that do work in that order).
FAIR_HOOKS = ("charge", "slot_freed", "use_pool")
AGE_HOOKS = ("slot_freed",)
#: The fair engine's phase functions (fields of its table E) that get a probe.
FAIR_PHASES = (
    "fair_serve", "gather", "discover", "discover_heads", "adopt_discovered", "attach_tenants",
    "serve_round", "load_keys", "best_key", "serve_flow", "hold_back", "fair_finish",
    "borrow_idle_slots", "write_back",
)  # fmt: skip


def _probe_source() -> str:
    """The wrapper (on HOOK, which every build has: a library's main chunk has no room for
    more locals): time a call, count it, hand back all it returned (nils included)."""
    return """
do
  local P = {}
  HOOK.prof = P
  local function timed(name, t0, ...)
    P[name] = (P[name] or 0) + os.clock() - t0
    P['#' .. name] = (P['#' .. name] or 0) + 1
    return ...
  end
  HOOK.probe = function(name, f)
    return function(...) return timed(name, os.clock(), f(...)) end
  end
end
"""


def _hooks_source(order: str, names: tuple[str, ...]) -> str:
    """Wrap an order's hooks; its HOOK.finish (the end of every script) also writes the
    library's totals to its own hash (one HSET per script run)."""
    wrap = "".join(f"HOOK.{n} = HOOK.probe('{n}', HOOK.{n})\n" for n in names)
    return f"""
{wrap}do
  local finish = HOOK.finish
  local key = nil -- (globals such as string are there only when a script runs)
  HOOK.finish = function(X)
    finish(X)
    key = key or 'fairq-serve-phases:{order}:' .. string.sub(tostring(HOOK), 8)
    local args = {{}}
    for k, v in pairs(HOOK.prof) do
      args[#args + 1] = k
      args[#args + 1] = string.format('%.9f', v)
    end
    if #args > 0 then redis.call('HSET', key, unpack(args)) end
  end
end
"""


def probed_copy(work: Path) -> Path:
    """A copy of this checkout's package with probes in its Lua; returns its src dir."""
    src = work / "src"
    shutil.copytree(ROOT / "src" / "fairq", src / "fairq",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    include = src / LUA / "include"

    def append(name: str, lua: str) -> None:
        path = include / name
        path.write_text(path.read_text() + lua)

    append("state.lua", _probe_source())
    # claim: a main-chunk local (assigned in a block): re-assigned wrapped, no new local
    append("claim.lua", "claim = HOOK.probe('claim', claim)\n")
    append("order_fair.lua", _hooks_source("fair", FAIR_HOOKS))
    append("order_age.lua", _hooks_source("age", AGE_HOOKS))
    append("order_age_serve.lua", "HOOK.serve = HOOK.probe('serve', HOOK.serve)\n")
    # the fair engine's table E lives in one block that ends its file: wrap its phases
    fair = include / "order_fair_serve.lua"
    text = fair.read_text().rstrip()
    if not text.endswith("\nend"):
        raise SystemExit("serve_phases: order_fair_serve.lua no longer ends in its block")
    wrap = "".join(f"  E.{n} = HOOK.probe('{n}', E.{n})\n" for n in FAIR_PHASES)
    serve = "  HOOK.serve = HOOK.probe('serve', HOOK.serve)\n"
    fair.write_text(text[: -len("end")] + wrap + serve + "end\n")
    return src


async def _phase_totals(client: Any, order: str) -> dict[str, float]:
    """The probes' totals so far, summed over the order's libraries (one hash each)."""
    out: dict[str, float] = {}
    for key in await client.keys(f"fairq-serve-phases:{order}:*"):
        for name, value in (await client.hgetall(key)).items():
            out[name.decode()] = out.get(name.decode(), 0.0) + float(value)
    return out


async def _script_usec(client: Any) -> float:
    stats = await client.info("commandstats")
    return float(stats.get("cmdstat_fcall", {}).get("usec", 0))


async def run_workload(url: str, spec: str, n: int, rep: int) -> dict[str, float]:
    """One workload's microseconds per dequeue call: the scripts' and each phase's."""
    from fairq import RunQueueConfig
    from fairq.keys import Environment
    from fairq.server import connect
    from fairq.store import RunQueue
    from server_instructions import T0, load_keyed

    order, keys_text, tenants_text = spec.split(":")
    keys, tenants = int(keys_text), int(tenants_text)
    config = RunQueueConfig(prefix=f"sp{rep}", default_env_concurrency=100_000)
    rq = RunQueue(
        await connect(url), config.with_vtime(enabled=order == "fair"), rng=random.Random(1)
    )
    env = Environment("bench", "p", f"{order}-{keys}-{tenants}")
    await load_keyed(rq, env, n, keys, tenants)
    client = rq.client
    dequeue_us = ack_us = 0.0
    calls = done = 0
    before: dict[str, float] = {}
    while done < n:
        if calls == WARM_BATCHES:
            before = await _phase_totals(client, order)
        await client.config_resetstat()
        batch = await rq.dequeue_from_queue(env, "bench", keyed=True, max_count=10, now_ms=T0 + n)
        took = await _script_usec(client)
        await client.config_resetstat()
        await rq.ack(batch, now_ms=T0 + n)
        if calls >= WARM_BATCHES:
            dequeue_us += took
            ack_us += await _script_usec(client)
        if not batch:
            break
        done += len(batch)
        calls += 1
    after = await _phase_totals(client, order)
    await rq.close()
    measured = max(1, calls - WARM_BATCHES)
    out = {"dequeue_script": dequeue_us / measured, "ack_script": ack_us / measured}
    for name, total in after.items():
        delta = total - before.get(name, 0.0)
        if name.startswith("#"):
            out[name] = delta / measured  # runs per call
        else:
            out[name] = delta / measured * 1e6
    return out


async def measure(workloads: list[str], n: int, reps: int) -> dict[str, Any]:
    from fairq.server import EmbeddedServer

    raw: dict[str, list[dict[str, float]]] = {w: [] for w in workloads}
    with EmbeddedServer() as server:
        for rep in range(reps):
            order = workloads if rep % 2 == 0 else workloads[::-1]
            for spec in order:
                raw[spec].append(await run_workload(server.url, spec, n, rep))
                print(f"rep {rep} {spec} done", file=sys.stderr, flush=True)
    medians: dict[str, dict[str, float]] = {}
    for spec, rows in raw.items():
        names = sorted(set().union(*rows))
        medians[spec] = {k: round(statistics.median(r.get(k, 0.0) for r in rows), 2) for k in names}
    return {"n": n, "reps": reps, "us_per_dequeue_call": medians, "raw": raw}


def table(result: dict[str, Any]) -> str:
    medians: dict[str, dict[str, float]] = result["us_per_dequeue_call"]
    rows = ["dequeue_script", "ack_script", "serve", "claim", *FAIR_PHASES, *FAIR_HOOKS]
    specs = list(medians)
    lines = ["| µs per call | " + " | ".join(specs) + " |", "|---" * (len(specs) + 1) + "|"]
    for row in rows:
        cells = []
        for spec in specs:
            m = medians[spec]
            if row not in m:
                cells.append("")
                continue
            count = m.get("#" + row)
            cells.append(f"{m[row]:.0f}" + (f" ({count:g}×)" if count and count != 1 else ""))
        if any(cells):
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    parser.add_argument("--n", type=int, default=3000, help="runs per workload")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--table", action="store_true", help="also print a table")
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    with tempfile.TemporaryDirectory(prefix="fairq-phases-") as work:
        sys.path.insert(0, str(probed_copy(Path(work))))
        result = asyncio.run(measure(workloads, args.n, args.reps))
    print(json.dumps(result, indent=2))
    if args.table:
        print(table(result))


if __name__ == "__main__":
    main()

"""CK-queue throughput: dequeue + ack runs/s and server commands per run, age order vs
fair order, with 1 and 10 busy concurrency keys, at max_per_key_per_call 1 and 10; with
``--tenants``, at 10 / 1,000 / 10,000 keys, each its own tenant or owned by 1 or 100 named
tenants: each case runs age and fair back to back (which first alternating), ``--reps``
times, and reports the median fair / age ratio of the pairs with its range (pairing keeps
the ratio meaningful when the machine's speed drifts). With ``--interleave`` a pair is one
run of both orders on the same data, in turns of 16 dequeue + ack cycles of each, each
turn timed alone: a drift of the machine's speed within seconds falls on both alike.

    python bench/ck_throughput.py [--runs 3000] [--max-count 10]
                                  [--tenants [--reps 5] [--keys 10,1000,10000]
                                   [--interleave]]
                                  [--url redis://...]

Prints one JSON document: a row per (busy keys, max_per_key_per_call, order). Commands
per run come from INFO commandstats through ``RunQueue.command_stats`` (Lua's
redis.call included, INFO/CONFIG excluded).
Without --url an embedded Valkey is started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue
from server_instructions import T0, load_keyed  # type: ignore[import-not-found]

#: The queue load_keyed fills.
QUEUE = "bench"
#: The busy-key counts of the --tenants matrix (by default).
MATRIX_KEYS = (10, 1000, 10_000)


async def _commands(rq: RunQueue) -> int:
    """Server commands so far (the store's INFO commandstats), bookkeeping excluded."""
    stats = await rq.command_stats()
    return sum(n for k, n in stats.items() if k.split("|", 1)[0] not in ("info", "config"))


ENV = Environment("bench", "p", "e")


async def loaded_queue(
    url: str,
    prefix: str,
    *,
    keys: int,
    max_per_key: int | None,
    fair: bool,
    runs: int,
    tenants: int = 0,
) -> RunQueue:
    """A store under ``prefix`` with ``runs`` runs of queue ``bench`` queued on ``keys``
    keys (owned by ``tenants`` named tenants; 0: each key its own), run i due at T0 + i."""
    config = RunQueueConfig(prefix=prefix, max_per_key_per_call=max_per_key,
                            default_env_concurrency=1000)  # fmt: skip
    rq = RunQueue(await connect(url), config.with_vtime(enabled=fair), rng=random.Random(1))
    await load_keyed(rq, ENV, runs, keys, tenants)  # (the same data as the callgrind bench's)
    return rq


async def cycle(rq: RunQueue, runs: int, max_count: int) -> int:
    """One dequeue of up to ``max_count`` runs and the ack of what it got: how many."""
    batch = await rq.dequeue_from_queue(ENV, QUEUE, keyed=True, max_count=max_count,
                                        now_ms=T0 + runs)  # fmt: skip
    if batch:
        await rq.ack(batch, now_ms=T0 + runs)
    return len(batch)


async def measure(
    url: str,
    prefix: str,
    *,
    keys: int,
    max_per_key: int | None,
    fair: bool,
    runs: int,
    max_count: int,
    tenants: int = 0,
) -> dict[str, Any]:
    rq = await loaded_queue(url, prefix, keys=keys, max_per_key=max_per_key, fair=fair,
                            runs=runs, tenants=tenants)  # fmt: skip
    before = await _commands(rq)
    done = calls = 0
    started = time.perf_counter()
    while done < runs:
        got = await cycle(rq, runs, max_count)
        calls += 1
        if not got:
            break
        done += got
    elapsed = time.perf_counter() - started
    commands = await _commands(rq) - before
    await rq.purge()
    await rq.close()
    return {
        "busy_keys": keys,
        "tenants": tenants or None,
        "max_per_key_per_call": max_per_key,
        "order": "fair" if fair else "age",
        "runs": done,
        "dequeue_calls": calls,
        "runs_per_call": round(done / calls, 2),
        "runs_per_second": round(done / elapsed),
        "commands_per_run": round(commands / done, 2),
    }


#: Cycles of one order in a row in an interleaved run (see :func:`interleaved`).
BLOCK = 16


async def interleaved(
    url: str, prefix: str, *, keys: int, runs: int, max_count: int, tenants: int
) -> dict[bool, float]:
    """Runs/s of the age order (False) and the fair order (True) on the same data, in
    turns of BLOCK dequeue + ack cycles of each (which goes first alternating), each turn
    timed alone: both orders meet the machine's speed at the same moments, so its drift
    (on a shared host, large within seconds) falls on both alike. (Turns of one cycle
    each would bill one order for the caches the other's scripts left behind: an age
    cycle right after a fair one ran about 3 % slower than one after an age cycle.)"""
    queues = {
        fair: await loaded_queue(url, f"{prefix}{'f' if fair else 'a'}", keys=keys,
                                 max_per_key=None, fair=fair, runs=runs, tenants=tenants)
        for fair in (False, True)
    }  # fmt: skip
    spent = {False: 0.0, True: 0.0}
    done = {False: 0, True: 0}
    left = {False: True, True: True}
    turn = 0
    while left[False] or left[True]:
        for fair in (False, True) if turn % 2 == 0 else (True, False):
            started = time.perf_counter()
            for _ in range(BLOCK):
                if not left[fair]:
                    break
                got = await cycle(queues[fair], runs, max_count)
                done[fair] += got
                left[fair] = got > 0 and done[fair] < runs
            spent[fair] += time.perf_counter() - started
        turn += 1
    for rq in queues.values():
        await rq.purge()
        await rq.close()
    return {fair: done[fair] / spent[fair] for fair in (False, True)}


async def tenant_matrix(
    url: str,
    runs: int,
    max_count: int,
    reps: int,
    key_counts: tuple[int, ...] = MATRIX_KEYS,
    interleave: bool = False,
) -> dict[str, Any]:
    """Age vs fair at 10 / 1,000 / 10,000 keys, each its own tenant (0) or owned by 1 or
    100 named tenants (store defaults for max_per_key_per_call: 1 in the age order, the
    whole call in the fair order); ``reps`` age / fair pairs per case, each two runs back
    to back, or with ``interleave`` one run of both in turns (:func:`interleaved`)."""
    rows = []
    n = 0
    for keys in key_counts:
        for tenants in (0, 1, 100):
            pairs: list[dict[bool, dict[str, Any]]] = []
            for rep in range(reps):
                pair: dict[bool, dict[str, Any]] = {}
                if interleave:
                    n += 1
                    speeds = await interleaved(
                        url, f"ti{n}x{random.randrange(10**6)}", keys=keys,
                        runs=max(runs, keys), max_count=max_count, tenants=tenants,
                    )  # fmt: skip
                    for fair in (False, True):
                        pair[fair] = {"runs_per_second": round(speeds[fair]),
                                      "commands_per_run": None}  # fmt: skip
                else:
                    # which order runs first alternates, so a drift of the machine's speed
                    # within a pair does not favour either
                    for fair in (False, True) if rep % 2 == 0 else (True, False):
                        n += 1
                        pair[fair] = await measure(
                            url, f"tm{n}x{random.randrange(10**6)}", keys=keys,
                            max_per_key=None, fair=fair, runs=max(runs, keys),
                            max_count=max_count, tenants=tenants,
                        )  # fmt: skip
                pairs.append(pair)
            ratios = sorted(p[True]["runs_per_second"] / p[False]["runs_per_second"] for p in pairs)
            rows.append(
                {
                    "busy_keys": keys,
                    "tenants": tenants or "each key its own",
                    "age_runs_per_second": statistics.median(
                        p[False]["runs_per_second"] for p in pairs
                    ),
                    "fair_runs_per_second": statistics.median(
                        p[True]["runs_per_second"] for p in pairs
                    ),
                    "fair_over_age_runs_per_second": round(statistics.median(ratios), 2),
                    "fair_over_age_range": [round(ratios[0], 2), round(ratios[-1], 2)],
                    "fair_over_age_pairs": [round(r, 3) for r in ratios],
                    "commands_per_run": {
                        "age": pairs[0][False]["commands_per_run"],
                        "fair": pairs[0][True]["commands_per_run"],
                    },
                }
            )
    return {"max_count": max_count, "reps": reps, "interleaved": interleave, "rows": rows}


async def main_async(
    url: str,
    runs: int,
    max_count: int,
    tenants: bool,
    reps: int = 1,
    key_counts: tuple[int, ...] = MATRIX_KEYS,
    interleave: bool = False,
) -> dict[str, Any]:
    rows = []
    n = 0
    for fair in (False, True):  # warm-up (script load, server caches); discarded
        await measure(url, f"warm{int(fair)}x{random.randrange(10**6)}", keys=10, max_per_key=1,
                      fair=fair, runs=500, max_count=max_count)  # fmt: skip
    if tenants:
        return await tenant_matrix(url, runs, max_count, reps, key_counts, interleave)
    for keys in (1, 10):
        for max_per_key in (1, 10):
            for fair in (False, True):
                n += 1
                rows.append(await measure(url, f"bench{n}x{random.randrange(10**6)}", keys=keys,
                                          max_per_key=max_per_key, fair=fair, runs=runs,
                                          max_count=max_count))  # fmt: skip
    return {"max_count": max_count, "runs_per_case": runs, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--max-count", type=int, default=10)
    parser.add_argument("--url")
    parser.add_argument("--tenants", action="store_true", help="the keys x tenants matrix")
    parser.add_argument("--reps", type=int, default=5, help="age/fair pairs per matrix case")
    parser.add_argument(
        "--keys",
        default=",".join(map(str, MATRIX_KEYS)),
        help="the matrix's busy-key counts (comma-separated)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="matrix: time age and fair in turns within one run, not in two runs",
    )
    args = parser.parse_args()
    key_counts = tuple(int(k) for k in args.keys.split(","))
    run = (args.runs, args.max_count, args.tenants, args.reps, key_counts, args.interleave)
    if args.url:
        result = asyncio.run(main_async(args.url, *run))
    else:
        with EmbeddedServer() as server:
            result = asyncio.run(main_async(server.url, *run))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

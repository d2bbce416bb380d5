"""What one round trip costs the server, beside what one small command in it costs.

The peers benchmark's CPU column (``used_cpu_user + used_cpu_sys`` per job) counts the
server's system calls as well as its instructions, so two systems that run the same
commands in a different number of round trips differ there. This measures the two parts
on the embedded server: ``--pings`` PINGs, one per round trip, then the same number in
round trips of two (a pipeline), alternating, ``--reps`` times. The server CPU of a round
trip of one command and of two give the round trip's own cost and a command's.

Prints one JSON document: per rep the server CPU (µs) per round trip of one and of two,
and their medians.

Usage::

    python bench/round_trip_cost.py [--pings 20000] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

import redis.asyncio as aioredis

from fairq.server import EmbeddedServer


async def _server_cpu_s(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _per_round_trip(client: Any, round_trips: int, per_trip: int) -> float:
    """Server CPU (µs) per round trip of ``per_trip`` PINGs, over ``round_trips``."""
    before = await _server_cpu_s(client)
    for _ in range(round_trips):
        if per_trip == 1:
            await client.ping()
        else:
            pipe = client.pipeline(transaction=False)
            for _ in range(per_trip):
                pipe.ping()
            await pipe.execute()
    return (await _server_cpu_s(client) - before) * 1e6 / round_trips


async def measure(url: str, pings: int, reps: int) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    await client.ping()
    one: list[float] = []
    two: list[float] = []
    try:
        for _ in range(reps):
            one.append(await _per_round_trip(client, pings, 1))
            two.append(await _per_round_trip(client, pings // 2, 2))
    finally:
        await client.aclose()
    m1, m2 = statistics.median(one), statistics.median(two)
    return {
        "settings": {"pings": pings, "reps": reps},
        "us_per_round_trip_of_one": [round(x, 2) for x in one],
        "us_per_round_trip_of_two": [round(x, 2) for x in two],
        "median_round_trip_of_one": round(m1, 2),
        "median_round_trip_of_two": round(m2, 2),
        # a round trip's own cost, and one more command's, from the two medians
        "median_round_trip_alone": round(2 * m1 - m2, 2),
        "median_command": round(m2 - m1, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pings", type=int, default=20_000, help="PINGs per measurement")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (alternating)")
    args = parser.parse_args()
    with EmbeddedServer() as server:
        print(json.dumps(asyncio.run(measure(server.url, args.pings, args.reps)), indent=1))


if __name__ == "__main__":
    main()

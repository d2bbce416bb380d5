"""Where one awaited trigger's time goes on the client: each layer of the call timed alone.

An awaited ``Task.trigger`` is one round trip, but between the caller and the socket it
passes several layers, each adding its own Python. This times, interleaved in blocks on
one embedded server and one connection, the same enqueue entered at each layer:

* ``ping``: an awaited ``PING`` on fairq's script connection (the round trip alone);
* ``script``: the enqueue script called with ready arguments (round trip + script);
* ``call_for_env``: the store's script call for an environment (picks the build,
  prepends the context, checks for a fair-order refusal);
* ``enqueue_one``: ``RunQueue.enqueue_one`` of a ready request (validates and encodes
  the run, finds its partition, groups concurrent calls, parses the reply);
* ``trigger``: ``Task.trigger`` (builds the request from the task's defaults, the
  tracing hooks, the run handle).

Each figure is µs per call (total time over all blocks / calls); the differences between
neighbours are what each layer adds. Every variant enqueues keyless runs with fresh ids
into its own queue of the same environment, in the age order.

    python bench/client_layers.py [--block 250] [--rounds 24]

Prints one JSON document. Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from fairq import Fairq, RetryPolicy
from fairq.models import EnqueueRequest
from fairq.server import EmbeddedServer, free_port
from fairq.store.enqueue import encode_request, enqueue_args

LAYERS = ("ping", "script", "call_for_env", "enqueue_one", "trigger")


async def _noop(payload: dict[str, Any]) -> None:
    return None


async def measure(url: str, block: int, rounds: int) -> dict[str, float]:
    app = Fairq(env="bench:layers:run", url=url)
    task = app.task(queue="trigger", retry=RetryPolicy(max_attempts=1))(_noop)
    for i in range(200):
        await task.trigger({"i": i})
    rq = await app.queue()
    env, client = app.env, rq._script_client
    tag = rq.keys.tag_of(env, 0)
    limit = rq.config.max_payload_bytes

    def request(queue: str, run_id: str, i: int) -> EnqueueRequest:
        return EnqueueRequest(env, queue, run_id, {"i": i})

    def encoded(queue: str, run_id: str, i: int) -> list[str]:
        return enqueue_args(env, queue, [encode_request(request(queue, run_id, i), limit)])

    total = dict.fromkeys(LAYERS, 0.0)
    for r in range(rounds):
        started = time.perf_counter()
        for _ in range(block):
            await client.execute_command("PING")
        total["ping"] += time.perf_counter() - started

        calls = [
            rq.script_argv("enqueue", "age", encoded("script", f"s{r}_{i}", i), None)
            for i in range(block)
        ]
        started = time.perf_counter()
        for script, argv in calls:
            await script(client, [tag], argv)
        total["script"] += time.perf_counter() - started

        args = [encoded("call", f"c{r}_{i}", i) for i in range(block)]
        started = time.perf_counter()
        for a in args:
            await rq.call_for_env("enqueue", env, a, None, 0)
        total["call_for_env"] += time.perf_counter() - started

        requests = [request("one", f"e{r}_{i}", i) for i in range(block)]
        started = time.perf_counter()
        for q in requests:
            await rq.enqueue_one(q)
        total["enqueue_one"] += time.perf_counter() - started

        started = time.perf_counter()
        for i in range(block):
            await task.trigger({"i": i})
        total["trigger"] += time.perf_counter() - started
    await app.aclose()
    return {name: round(t / (block * rounds) * 1e6, 1) for name, t in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=250, help="calls per layer per round")
    parser.add_argument("--rounds", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fairq-layers-") as work:
        server = EmbeddedServer(port=free_port(), data_dir=Path(work))
        server.start()
        try:
            us = asyncio.run(measure(server.url, args.block, args.rounds))
        finally:
            server.stop()
    added = {
        f"{outer} - {inner}": round(us[outer] - us[inner], 1)
        for inner, outer in itertools.pairwise(LAYERS)
    }
    print(
        json.dumps(
            {"block": args.block, "rounds": args.rounds, "us_per_call": us, "added": added},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

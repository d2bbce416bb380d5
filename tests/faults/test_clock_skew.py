"""A consumer whose wall clock runs 30 s ahead steals nothing.

Leases, reclaim, TTL expiry and availability are judged by the scripts on the server's
``TIME``, never on a client's clock. The skewed consumer is a subprocess whose
``time.time`` / ``time.time_ns`` are patched (+30 s) before fairq is imported; it runs a
:class:`fairq.consumer.Consumer` with 0.1 s maintenance, calls reclaim and TTL expiry
itself, and holds its own runs on 2 s leases by heart-beating them. Meanwhile the test
process (honest clock) holds other runs on 2 s leases, heart-beating them.

A control at the end passes a logical clock 30 s ahead explicitly (``now_ms``, the API's
way to *ask* for another clock): then the same leases do lapse, so the skewed process's
zero reclaims are not an artefact of leases that could not lapse anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from fairq.keys import Environment
from fairq.models import AckStatus, Delivery, HeartbeatStatus
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

SKEW_S = 30.0
LEASE_MS = 2000
#: How long the skewed consumer keeps going (s): more than two lease lengths.
HOLD_S = 4.5

SKEWED = """
import time
_real, _real_ns = time.time, time.time_ns
time.time = lambda: _real() + SKEW
time.time_ns = lambda: _real_ns() + int(SKEW * 1e9)

import asyncio, json, sys
from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.server import connect
from fairq.store import RunQueue


async def main(url, prefix, env_id, hold_s):
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, lease_ms=LEASE))
    env = Environment.parse(env_id)
    report = {"skew_ms": 0, "delivered": [], "reclaimed": 0, "expired": 0, "beats": []}
    try:
        report["skew_ms"] = int(time.time() * 1000) - await rq.server_time_ms()
        async with Consumer(rq, env=env, queues=["work"], maintenance_interval=0.1) as c:
            held = await c.next_batch(10, timeout=5)
            report["delivered"] = [d.run_id for d in held]
            loop = asyncio.get_running_loop()
            end = loop.time() + hold_s
            while loop.time() < end:
                await c.maintain(force=True)
                report["reclaimed"] += await rq.reclaim_lapsed_leases()
                report["expired"] += await rq.expire_ttl()
                more = await c.next_batch(10, timeout=0.05)
                report["delivered"] += [d.run_id for d in more]
                held += more
                report["beats"] += [s.value for s in await rq.heartbeat(held)]
                await asyncio.sleep(0.5)
            report["acks"] = [s.value for s in await rq.ack(held)]
    finally:
        await rq.close()
    print(json.dumps(report))


asyncio.run(main(*sys.argv[1:4], float(sys.argv[4])))
"""


async def _heartbeat(rq: RunQueue, held: list[Delivery], beats: list[HeartbeatStatus]) -> None:
    while True:
        beats += await rq.heartbeat(held)
        await asyncio.sleep(0.5)


async def test_a_consumer_30_s_ahead_steals_no_lease_and_keeps_its_own(
    make_queue: Any, redis_url: str, prefix: str, env: Environment, tmp_path: Path
) -> None:
    """The skewed consumer reclaims nothing, expires nothing, is served only what is
    ready on the server's clock, and keeps its own heart-beaten leases; the honest
    holder's leases survive; a TTL run and a delayed run stay queued."""
    rq: RunQueue = await make_queue(lease_ms=LEASE_MS)
    # the honest holder's runs, leased (2 s) and heart-beaten by this process
    for i in range(5):
        await rq.enqueue(env, "held", f"held-{i}")
    mine = await rq.dequeue(10, env=env, queues=["held"])
    assert sorted(d.run_id for d in mine) == [f"held-{i}" for i in range(5)]
    # ready runs for the skewed consumer, one due in 10 s, one with a 10 s TTL
    for i in range(3):
        await rq.enqueue(env, "work", f"own-{i}")
    await rq.enqueue(env, "work", "later", delay_ms=10_000)
    await rq.enqueue(env, "ttlq", "ttl-run", ttl_ms=10_000)

    beats: list[HeartbeatStatus] = []
    beating = asyncio.create_task(_heartbeat(rq, mine, beats))
    script = tmp_path / "skewed.py"
    script.write_text(f"SKEW = {SKEW_S!r}\nLEASE = {LEASE_MS}\n" + SKEWED)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), redis_url, prefix, env.id, str(HOLD_S),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "FAIRQ_REDIS_URL": redis_url},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
    assert proc.returncode == 0, err.decode()[-2000:]
    report = json.loads(out.decode().strip().splitlines()[-1])

    # the subprocess really ran 30 s ahead of the server
    assert abs(report["skew_ms"] - SKEW_S * 1000) < 2000, report["skew_ms"]
    # availability on the server's clock: the ready runs, not the one due in 10 s
    assert sorted(report["delivered"]) == ["own-0", "own-1", "own-2"]
    # it stole nothing and expired nothing
    assert (report["reclaimed"], report["expired"]) == (0, 0)
    # its own leases held for > 2 lease lengths, and its acks were accepted
    assert report["beats"] and set(report["beats"]) == {HeartbeatStatus.EXTENDED.value}
    assert report["acks"] == [AckStatus.ACKED.value] * 3
    # the honest holder never lost a lease
    assert beats and set(beats) == {HeartbeatStatus.EXTENDED}
    assert await rq.ack(mine) == [AckStatus.ACKED] * 5
    for run_id in ("later", "ttl-run"):
        info = await rq.get_run(env, run_id)
        assert info is not None and info.status is RunStatus.QUEUED, (run_id, info)

    # control: asking explicitly for a clock 30 s ahead does lapse a live lease
    await rq.enqueue(env, "held", "control")
    (control,) = await rq.dequeue(1, env=env, queues=["held"])
    ahead = await rq.server_time_ms() + int(SKEW_S * 1000)
    assert await rq.reclaim_lapsed_leases(now_ms=ahead) == 1
    assert await rq.ack([control]) == [AckStatus.LEASE_LOST]

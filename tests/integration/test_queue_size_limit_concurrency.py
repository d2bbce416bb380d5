"""The queue size limit holds under concurrency, and counts keyless and keyed runs.

The reference checked the limit outside its enqueue, against a count cached for a
second, so concurrent triggers could overshoot it. fairq checks it inside the enqueue
script, per run: four OS processes racing to enqueue 1,600 runs into a queue limited
to 1,000 leave exactly 1,000 queued.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from fairq.config import RunQueueConfig
from fairq.errors import QueueSizeLimitExceededError
from fairq.keys import Environment
from fairq.models import EnqueueRequest, EnqueueStatus
from fairq.server import connect
from fairq.store import RunQueue

MakeQueue = Callable[..., Awaitable[RunQueue]]

QUEUE = "task/limited"
LIMIT = 1_000
PROCESSES = 4
PER_PROCESS = 400
VARIANTS = ("a", "b", "c", "d", "e", "f", "g", "h")
T0 = 1_000_000


async def _enqueue_all(url: str, prefix: str, worker: int, batched: bool) -> dict[str, int]:
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix))
    env = Environment("org1", "proj1", "prod")
    rnd = random.Random(worker)
    counts = {"enqueued": 0, "rejected": 0}
    requests = [
        EnqueueRequest(
            env,
            QUEUE,
            f"w{worker}-{i}",
            {"i": i},
            concurrency_key=None if rnd.random() < 0.3 else rnd.choice(VARIANTS),
        )
        for i in range(PER_PROCESS)
    ]
    try:
        if batched:
            for start in range(0, PER_PROCESS, 10):
                for result in await rq.enqueue_many(requests[start : start + 10], now_ms=T0):
                    key = "enqueued" if result.status is EnqueueStatus.ENQUEUED else "rejected"
                    counts[key] += 1
        else:
            for r in requests:
                try:
                    await rq.enqueue(
                        r.env, r.queue, r.run_id, r.payload,
                        concurrency_key=r.concurrency_key, now_ms=T0,
                    )  # fmt: skip
                    counts["enqueued"] += 1
                except QueueSizeLimitExceededError:
                    counts["rejected"] += 1
    finally:
        await rq.close()
    return counts


def _worker(url: str, prefix: str, worker: int, start: Any, results: Any) -> None:
    """Child process: wait for the common start, enqueue, report the counts."""
    start.wait(timeout=60)
    results.put((worker, asyncio.run(_enqueue_all(url, prefix, worker, batched=worker % 2 == 1))))


@pytest.mark.timeout(120)
async def test_four_processes_never_overshoot_the_limit(
    make_queue: MakeQueue, env: Environment, redis_url: str, prefix: str
) -> None:
    """4 processes x 400 enqueues (single and batched, keyless and keyed) into a queue
    limited to 1,000: exactly 1,000 accepted, 1,000 queued, 600 rejected."""
    rq = await make_queue()
    await rq.set_queue_size_limit(env, QUEUE, LIMIT)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(redis_url, prefix, w, start, results))
        for w in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        counts: dict[int, dict[str, int]] = {}
        for _ in range(PROCESSES):
            worker, c = await asyncio.to_thread(results.get, True, 90)
            counts[worker] = c
    finally:
        for p in procs:
            p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)
    accepted = sum(c["enqueued"] for c in counts.values())
    rejected = sum(c["rejected"] for c in counts.values())
    assert (accepted, rejected) == (LIMIT, PROCESSES * PER_PROCESS - LIMIT)
    # every process got some in: the race was real
    assert all(c["enqueued"] > 0 for c in counts.values()), counts

    # the truth, from the keys themselves
    q = rq.keys.queue(env, QUEUE)
    keyless = int(await rq.client.zcard(q.queued))
    keyed = 0
    for ck in VARIANTS:
        keyed += int(await rq.client.zcard(q.variant_queued(ck)))
    assert keyless + keyed == LIMIT
    assert keyless > 0 and keyed > 0
    assert int(await rq.client.get(q.ck_queued_counter)) == keyed
    assert (await rq.queue_stats(env, QUEUE)).queued == LIMIT


async def test_limit_counts_keyless_and_keyed_runs(make_queue: MakeQueue, env: Environment) -> None:
    """6 keyless + 4 keyed runs fill a limit of 10: the next run is refused whether it
    is keyless or keyed, and finishing any run makes room for either kind."""
    rq = await make_queue()
    await rq.set_queue_size_limit(env, QUEUE, 10)
    for i in range(6):
        await rq.enqueue(env, QUEUE, f"plain-{i}", None, now_ms=T0)
    for i in range(4):
        await rq.enqueue(env, QUEUE, f"keyed-{i}", None, concurrency_key=VARIANTS[i % 2], now_ms=T0)
    for ck in (None, "a", "new-variant"):
        with pytest.raises(QueueSizeLimitExceededError) as info:
            await rq.enqueue(env, QUEUE, "one-too-many", None, concurrency_key=ck, now_ms=T0)
        assert (info.value.queue, info.value.maximum_size) == (QUEUE, 10)
    # a keyed run leaves the queue: a keyless run fits
    (d,) = await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=1, now_ms=T0 + 1)
    assert d.concurrency_key is not None
    assert await rq.enqueue(env, QUEUE, "plain-6", None, now_ms=T0) is EnqueueStatus.ENQUEUED
    # a keyless run leaves the queue: a keyed run fits
    (d,) = await rq.dequeue_from_queue(env, QUEUE, keyed=False, max_count=1, now_ms=T0 + 1)
    assert await rq.enqueue(env, QUEUE, "keyed-9", None, concurrency_key="z", now_ms=T0) is (
        EnqueueStatus.ENQUEUED
    )
    with pytest.raises(QueueSizeLimitExceededError):
        await rq.enqueue(env, QUEUE, "one-too-many", None, concurrency_key="z", now_ms=T0)
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.queued, stats.running) == (10, 2)

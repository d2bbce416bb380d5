"""Process-local Prometheus metrics, and the served-run record the dashboard charts.

Everything here is optional: nothing in the store calls it, so a process that never
imports it pays nothing. A worker (or any consumer) that wants its dequeues to show up
calls :func:`record_dequeue` after each dequeue call:

* ``fairq_dequeue_latency_seconds{env,queue}`` (histogram): how long each delivered run
  waited between becoming available (its score) and being dequeued.
* ``fairq_dequeue_call_seconds`` (histogram): how long the dequeue calls themselves took,
  when the caller passes ``call_seconds``.
* The *served record*: per base queue, one Redis HASH per :data:`SERVED_BUCKET_MS` window,
  ``<queue base>:served:<bucket>`` with field = encoded concurrency key (``""`` for keyless
  runs) and value = runs dequeued in that window. The key shares the queue's hash tag (so
  it is cluster-safe), each key expires after :data:`SERVED_RETENTION_SECONDS`, and a
  window holds at most one field per key served in it: bounded in time and size. It is
  written client-side in one pipelined round trip after the dequeue, never by the dequeue
  script, so it adds no work to the hot path of consumers that do not opt in.

The histograms live in :data:`REGISTRY`, fairq's own :class:`CollectorRegistry` (not
prometheus-client's global one); the dashboard's ``/metrics`` serves it next to its
per-queue gauges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Histogram

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue, wall_clock_ms

#: fairq's metric registry (never prometheus-client's global one).
REGISTRY: Final = CollectorRegistry(auto_describe=True)

#: Wait of each delivered run, from available to dequeued, per queue.
DEQUEUE_LATENCY: Final = Histogram(
    "fairq_dequeue_latency_seconds",
    "Time each dequeued run waited between becoming available and being dequeued.",
    ["env", "queue"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
#: Duration of dequeue calls made in this process.
DEQUEUE_CALL: Final = Histogram(
    "fairq_dequeue_call_seconds",
    "Duration of dequeue calls made by this process.",
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)

#: Width of one served-record window (ms).
SERVED_BUCKET_MS: Final = 10_000
#: How long a served-record window is kept (s).
SERVED_RETENTION_SECONDS: Final = 900


def served_key(rq: RunQueue, env: Environment, queue: str, bucket: int) -> str:
    """The served-record HASH of one queue and window (``bucket = ms // SERVED_BUCKET_MS``)."""
    return f"{rq.keys.queue(env, queue).base}:served:{bucket}"


def observe_dequeue(
    deliveries: Iterable[Delivery], *, call_seconds: float | None = None, now_ms: int | None = None
) -> None:
    """Observe the latency histograms for one dequeue call (no I/O)."""
    now = wall_clock_ms() if now_ms is None else now_ms
    if call_seconds is not None:
        DEQUEUE_CALL.observe(max(0.0, call_seconds))
    for d in deliveries:
        DEQUEUE_LATENCY.labels(d.env.id, d.queue).observe(max(0, now - d.score_ms) / 1000.0)


async def record_dequeue(
    rq: RunQueue,
    deliveries: Sequence[Delivery],
    *,
    call_seconds: float | None = None,
    now_ms: int | None = None,
) -> None:
    """Observe the histograms and add the deliveries to the served record (one round trip).

    Args:
        rq: the queue the runs were dequeued from.
        deliveries: what the dequeue call returned (may be empty).
        call_seconds: how long the dequeue call took, if measured.
        now_ms: the clock (default: wall clock); picks the served-record window.
    """
    now = wall_clock_ms() if now_ms is None else now_ms
    observe_dequeue(deliveries, call_seconds=call_seconds, now_ms=now)
    if not deliveries:
        return
    counts: dict[tuple[Environment, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for d in deliveries:
        ck = "" if d.concurrency_key is None else K.encode_concurrency_key(d.concurrency_key)
        counts[(d.env, d.queue)][ck] += 1
    bucket = now // SERVED_BUCKET_MS
    pipe = rq.client.pipeline(transaction=False)
    for (env, queue), per_key in counts.items():
        key = served_key(rq, env, queue, bucket)
        for ck, n in per_key.items():
            pipe.hincrby(key, ck, n)
        pipe.expire(key, SERVED_RETENTION_SECONDS)
    await pipe.execute()


async def read_served(
    rq: RunQueue, env: Environment, queue: str, *, window_ms: int, now_ms: int | None = None
) -> list[tuple[int, dict[str | None, int]]]:
    """The served record of one queue over the last ``window_ms``, oldest window first.

    Returns:
        ``(window start ms, {concurrency key or None for keyless: runs served})`` for every
        window in range, empty windows included.
    """
    now = wall_clock_ms() if now_ms is None else now_ms
    last = now // SERVED_BUCKET_MS
    first = last - max(1, window_ms // SERVED_BUCKET_MS) + 1
    pipe = rq.client.pipeline(transaction=False)
    for bucket in range(first, last + 1):
        pipe.hgetall(served_key(rq, env, queue, bucket))
    raw = await pipe.execute()
    out: list[tuple[int, dict[str | None, int]]] = []
    for bucket, fields in zip(range(first, last + 1), raw, strict=True):
        window: dict[str | None, int] = {}
        for ck, n in fields.items():
            text = ck.decode() if isinstance(ck, bytes) else str(ck)
            window[K.decode_concurrency_key(text) if text else None] = int(n)
        out.append((bucket * SERVED_BUCKET_MS, window))
    return out


__all__ = [
    "DEQUEUE_CALL",
    "DEQUEUE_LATENCY",
    "REGISTRY",
    "SERVED_BUCKET_MS",
    "SERVED_RETENTION_SECONDS",
    "observe_dequeue",
    "read_served",
    "record_dequeue",
    "served_key",
]

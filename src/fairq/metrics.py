"""The served record the dashboard charts, and fairq's own Prometheus registry.

"Served" means dequeued. The dequeue scripts count what they serve, per queue and per
tenant, in 10-second history buckets kept for an hour (see :mod:`fairq.keys`,
``B:h:<bucket>``): in the same atomic step, with no extra round trip, and shared by
every process. :func:`read_served` reads them in the shape the dashboard's chart uses.

:data:`REGISTRY` is fairq's own :class:`CollectorRegistry` (never prometheus-client's
global one); the dashboard's ``/metrics`` serves it next to its per-queue gauges. What
this process observes lands there, with no I/O:

* ``fairq_dequeue_latency_seconds{env,queue}``: how long each run this process dequeued
  waited between becoming available (its score) and being dequeued
  (:class:`fairq.consumer.Consumer` observes every batch it leases);
* ``fairq_dequeue_call_seconds``: how long those dequeue calls took;
* ``fairq_runs_started_total{env,queue}``, ``fairq_runs_finished_total{env,queue,outcome}``
  and ``fairq_run_duration_seconds{env,queue}``: the runs this process's workers ran.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram

from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue, wall_clock_ms
from fairq.store.readers import HISTORY_BUCKET_MS

#: fairq's metric registry (never prometheus-client's global one).
REGISTRY: Final = CollectorRegistry(auto_describe=True)

#: Width of one served-record window (ms).
SERVED_BUCKET_MS: Final = HISTORY_BUCKET_MS
#: The served-share entry of the tenants a full history bucket counts together (a real
#: tenant named "~" is merged with them in the chart).
OVERFLOW_TENANT: Final = "~"

#: Wait of each dequeued run, from available to dequeued, per queue.
DEQUEUE_LATENCY: Final = Histogram(
    "fairq_dequeue_latency_seconds",
    "Time each run this process dequeued waited between becoming available and its dequeue.",
    ["env", "queue"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
#: Duration of the dequeue calls this process made.
DEQUEUE_CALL: Final = Histogram(
    "fairq_dequeue_call_seconds",
    "Duration of the dequeue calls this process made.",
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
RUNS_STARTED: Final = Counter(
    "fairq_runs_started", "Runs this process's workers started.", ["env", "queue"],
    registry=REGISTRY,
)  # fmt: skip
RUNS_FINISHED: Final = Counter(
    "fairq_runs_finished",
    "Runs this process's workers ended, by outcome (completed, failed, retried, ...).",
    ["env", "queue", "outcome"],
    registry=REGISTRY,
)
RUN_DURATION: Final = Histogram(
    "fairq_run_duration_seconds",
    "Run time of the attempts this process's workers ran.",
    ["env", "queue"],
    registry=REGISTRY,
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)


def observe_dequeue(
    deliveries: Iterable[Delivery], *, call_seconds: float | None = None, now_ms: int | None = None
) -> None:
    """Observe one dequeue call in the latency histograms (no I/O)."""
    now = wall_clock_ms() if now_ms is None else now_ms
    if call_seconds is not None:
        DEQUEUE_CALL.observe(max(0.0, call_seconds))
    for d in deliveries:
        DEQUEUE_LATENCY.labels(d.env.id, d.queue).observe(max(0, now - d.score_ms) / 1000.0)


class RunMetrics:
    """The worker's observer of run events (see :attr:`fairq.worker.Worker.metrics`)."""

    def started(self, delivery: Delivery) -> None:
        RUNS_STARTED.labels(delivery.env.id, delivery.queue).inc()

    def finished(self, delivery: Delivery, outcome: str, seconds: float) -> None:
        RUNS_FINISHED.labels(delivery.env.id, delivery.queue, outcome).inc()
        RUN_DURATION.labels(delivery.env.id, delivery.queue).observe(max(0.0, seconds))


async def read_served(
    rq: RunQueue, env: Environment, queue: str, *, window_ms: int, now_ms: int | None = None
) -> list[tuple[int, dict[str | None, int]]]:
    """Runs of one queue served per tenant over the last ``window_ms``, oldest window first.

    Returns:
        ``(window start ms, {tenant (a key serving as its own tenant: the key) or None
        for the queue's keyless runs: runs served})`` for every window, empty included.
    """
    buckets = await rq.history(
        env, queue, window_ms=max(window_ms, SERVED_BUCKET_MS), now_ms=now_ms
    )
    windows = []
    for b in buckets:
        served = dict(b.by_tenant)
        if b.other_tenants:
            served[OVERFLOW_TENANT] = served.get(OVERFLOW_TENANT, 0) + b.other_tenants
        windows.append((b.start_ms, served))
    return windows


__all__ = [
    "DEQUEUE_CALL",
    "DEQUEUE_LATENCY",
    "OVERFLOW_TENANT",
    "REGISTRY",
    "RUNS_FINISHED",
    "RUNS_STARTED",
    "RUN_DURATION",
    "SERVED_BUCKET_MS",
    "RunMetrics",
    "observe_dequeue",
    "read_served",
]

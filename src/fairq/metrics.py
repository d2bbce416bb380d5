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
  (outcome: completed, failed, retried, dead_lettered, timed_out, cancelled, lease_lost,
  unknown) and ``fairq_run_duration_seconds{env,queue}``: the runs this process's workers
  ran.

Label cardinality is bounded: at most :data:`MAX_LABELLED_QUEUES` (env, queue) pairs get
series of their own per process; runs of further queues are counted under
``env="~other", queue="~other"``. ``fairq worker --metrics-port N`` serves the registry
(:func:`serve`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue, wall_clock_ms
from fairq.store.history import HISTORY_BUCKET_MS

#: fairq's metric registry (never prometheus-client's global one).
REGISTRY: Final = CollectorRegistry(auto_describe=True)

#: Width of one served-record window (ms).
SERVED_BUCKET_MS: Final = HISTORY_BUCKET_MS
#: The served-share entry of the tenants a full history bucket counts together (a real
#: tenant named "~" is merged with them in the chart).
OVERFLOW_TENANT: Final = "~"

#: Most (env, queue) label pairs one process gives series of their own.
MAX_LABELLED_QUEUES: Final = 200
#: The labels of the runs of queues beyond :data:`MAX_LABELLED_QUEUES`.
OTHER_LABEL: Final = "~other"
_labelled: set[tuple[str, str]] = set()
_labelled_lock = threading.Lock()


def queue_labels(env_id: str, queue: str) -> tuple[str, str]:
    """``(env, queue)`` for a series, or the overflow pair once the bound is reached."""
    pair = (env_id, queue)
    if pair in _labelled:
        return pair
    with _labelled_lock:
        if pair in _labelled or len(_labelled) < MAX_LABELLED_QUEUES:
            _labelled.add(pair)
            return pair
    return (OTHER_LABEL, OTHER_LABEL)


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


@functools.lru_cache(maxsize=4096)
def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, kept: the lookup costs more than the observation, and
    the label sets are bounded (:func:`queue_labels` caps the queues)."""
    return metric.labels(*labels)


def observe_dequeue(
    deliveries: Iterable[Delivery], *, call_seconds: float | None = None, now_ms: int | None = None
) -> None:
    """Observe one dequeue call in the latency histograms (no I/O)."""
    now = wall_clock_ms() if now_ms is None else now_ms
    if call_seconds is not None:
        DEQUEUE_CALL.observe(max(0.0, call_seconds))
    for d in deliveries:
        _child(DEQUEUE_LATENCY, *queue_labels(d.env.id, d.queue)).observe(
            max(0, now - d.score_ms) / 1000.0
        )


class RunMetrics:
    """The worker's observer of run events (see :attr:`fairq.worker.Worker.metrics`)."""

    def started(self, delivery: Delivery) -> None:
        _child(RUNS_STARTED, *queue_labels(delivery.env.id, delivery.queue)).inc()

    def finished(self, delivery: Delivery, outcome: str, seconds: float) -> None:
        labels = queue_labels(delivery.env.id, delivery.queue)
        _child(RUNS_FINISHED, *labels, outcome).inc()
        _child(RUN_DURATION, *labels).observe(max(0.0, seconds))


def serve(port: int, host: str = "127.0.0.1") -> Any:
    """Serve :data:`REGISTRY` at ``http://host:port/metrics`` from a daemon thread
    (``fairq worker --metrics-port``). Returns the HTTP server (``shutdown()`` stops it)."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server


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
    "MAX_LABELLED_QUEUES",
    "OTHER_LABEL",
    "OVERFLOW_TENANT",
    "REGISTRY",
    "RUNS_FINISHED",
    "RUNS_STARTED",
    "RUN_DURATION",
    "SERVED_BUCKET_MS",
    "RunMetrics",
    "observe_dequeue",
    "queue_labels",
    "read_served",
    "serve",
]

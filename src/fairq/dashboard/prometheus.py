"""``GET /metrics``: the queues as Prometheus gauges, plus fairq's process histograms.

Every scrape reads a fresh :class:`~fairq.dashboard.views.Overview` into a registry of its
own, so the output holds fairq's series only (no Python process or GC collectors).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairq import metrics
from fairq.dashboard.views import Overview, load_overview
from fairq.store import RunQueue

#: Content type of the Prometheus text exposition.
PROMETHEUS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


class SnapshotCollector(Collector):
    """Per-queue gauges from one overview, plus :data:`fairq.metrics.REGISTRY`."""

    def __init__(self, snapshot: Overview) -> None:
        self.snapshot = snapshot

    def collect(self) -> list[Metric]:
        labels = ["env", "queue"]

        def gauge(name: str, doc: str, names: list[str] = labels) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=names)

        queued = gauge("fairq_queue_queued", "Runs queued (keyless + every CK variant).")
        running = gauge("fairq_queue_running", "Runs in flight (keyless + every CK variant).")
        wait = gauge("fairq_queue_oldest_wait_seconds", "Age of the oldest available queued run.")
        paused = gauge("fairq_queue_paused", "1 when the queue is paused.")
        dlq = gauge("fairq_env_dead_lettered", "Dead-lettered runs.", ["env"])
        env_running = gauge("fairq_env_running", "Runs holding an environment slot.", ["env"])
        for e in self.snapshot.environments:
            dlq.add_metric([e.env], e.dead_lettered)
            env_running.add_metric([e.env], e.running)
            for q in e.queues:
                key = [e.env, q.queue]
                queued.add_metric(key, q.queued)
                running.add_metric(key, q.running)
                wait.add_metric(key, q.oldest_wait_s or 0.0)
                paused.add_metric(key, 1.0 if q.paused else 0.0)
        own: list[Metric] = [queued, running, wait, paused, dlq, env_running]
        return own + list(metrics.REGISTRY.collect())


async def metrics_text(rq: RunQueue) -> bytes:
    """The Prometheus exposition of the queues right now (a fresh registry per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(await load_overview(rq)))
    return generate_latest(registry)


__all__ = ["PROMETHEUS_CONTENT_TYPE", "SnapshotCollector", "metrics_text"]

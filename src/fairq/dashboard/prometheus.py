"""``GET /metrics``: the queues as Prometheus gauges (with the autoscaling signals: each
queue's servable, held and delayed backlog), plus fairq's process histograms.

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
from fairq.store.backlog import HELD_GATES

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
        return own + backlog_gauges(self.snapshot) + list(metrics.REGISTRY.collect())


def backlog_gauges(snapshot: Overview) -> list[Metric]:
    """The autoscaling signals: per queue and per environment, ready runs more workers
    could start now, ready runs held (by gate: a bounded label, HELD_GATES) and runs not
    due yet."""
    q_labels, e_labels = ["env", "queue"], ["env"]
    servable = GaugeMetricFamily(
        "fairq_queue_backlog_servable",
        "Ready runs no gate holds: more workers could start them now.", labels=q_labels,
    )  # fmt: skip
    held = GaugeMetricFamily(
        "fairq_queue_backlog_held",
        "Ready runs held by a cap, rate limit or pause (more workers would not help).",
        labels=[*q_labels, "gate"],
    )
    delayed = GaugeMetricFamily(
        "fairq_queue_backlog_delayed", "Queued runs not due yet.", labels=q_labels
    )
    env_servable = GaugeMetricFamily(
        "fairq_env_backlog_servable",
        "Ready runs of the environment's queues more workers could start now (its limit "
        "applied once).", labels=e_labels,
    )  # fmt: skip
    env_held = GaugeMetricFamily(
        "fairq_env_backlog_held", "Ready runs of the environment held, by gate.",
        labels=[*e_labels, "gate"],
    )  # fmt: skip
    for e in snapshot.environments:
        if e.backlog is not None:
            env_servable.add_metric([e.env], e.backlog.servable)
            for gate in HELD_GATES:
                env_held.add_metric([e.env, gate], e.backlog.held.get(gate, 0))
        for q in e.queues:
            if q.backlog is None:
                continue
            servable.add_metric([e.env, q.queue], q.backlog.servable)
            delayed.add_metric([e.env, q.queue], q.backlog.delayed)
            for gate in HELD_GATES:
                held.add_metric([e.env, q.queue, gate], q.backlog.held.get(gate, 0))
    return [servable, held, delayed, env_servable, env_held]


async def metrics_text(rq: RunQueue) -> bytes:
    """The Prometheus exposition of the queues right now (a fresh registry per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(await load_overview(rq, backlog=True)))
    return generate_latest(registry)


__all__ = ["PROMETHEUS_CONTENT_TYPE", "SnapshotCollector", "metrics_text"]

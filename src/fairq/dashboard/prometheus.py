"""``GET /metrics``: the queues as Prometheus gauges (with the autoscaling signals: each
queue's servable, held and delayed backlog), plus fairq's process histograms.

Every scrape reads a fresh :class:`~fairq.dashboard.views.Overview` into a registry of its
own, so the output holds fairq's series only (no Python process or GC collectors).

Shares received vs entitled (:meth:`fairq.store.RunQueue.tenant_shares`, the last 5
minutes) are gauges per tenant with bounded labels: the :data:`METRIC_TOP_TENANTS` tenants
of a queue that received most, then every other summed under ``tenant="(other)"``.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairq import metrics
from fairq.dashboard.shares import tenant_label
from fairq.dashboard.views import Overview, load_overview
from fairq.keys import Environment
from fairq.models import TenantShares
from fairq.store import RunQueue
from fairq.store.backlog import HELD_GATES

#: Content type of the Prometheus text exposition.
PROMETHEUS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: Tenants of a queue with series of their own (the rest: ``tenant="(other)"``).
METRIC_TOP_TENANTS: Final = 10
#: The window of the share gauges (s).
METRIC_SHARES_WINDOW_S: Final = 300
#: The ``tenant`` label of the tenants summed together.
OTHER_TENANTS: Final = "(other)"


def share_series(
    shares: TenantShares, top: int = METRIC_TOP_TENANTS
) -> list[tuple[str, float, float]]:
    """(tenant label, received, entitled): the ``top`` tenants that received most, then
    the rest (and the flows a full bucket counted together) summed as "(other)"."""
    out = [(tenant_label(t.tenant), t.received, t.entitled) for t in shares.tenants[:top]]
    rest = shares.tenants[top:]
    if rest or shares.other:
        received = sum(t.received for t in rest) + shares.other
        out.append((OTHER_TENANTS, received, sum(t.entitled for t in rest)))
    return out


class SnapshotCollector(Collector):
    """Per-queue gauges from one overview, plus :data:`fairq.metrics.REGISTRY`."""

    def __init__(self, snapshot: Overview, shares: list[TenantShares] | None = None) -> None:
        self.snapshot = snapshot
        self.shares = shares or []

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
        return (
            own
            + backlog_gauges(self.snapshot)
            + share_gauges(self.shares)
            + list(metrics.REGISTRY.collect())
        )


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


def share_gauges(shares: list[TenantShares]) -> list[Metric]:
    """Received, entitled and their ratio per tenant (bounded: share_series)."""
    names = ["env", "queue", "tenant", "unit"]
    window = f"over the last {METRIC_SHARES_WINDOW_S // 60} minutes"
    received = GaugeMetricFamily(
        "fairq_tenant_received",
        f"Runs (or slot-seconds with charge=duration) a tenant received {window}.",
        labels=names,
    )
    entitled = GaugeMetricFamily(
        "fairq_tenant_entitled",
        f"What a tenant was entitled to {window}: its weight's share while backlogged.",
        labels=names,
    )
    ratio = GaugeMetricFamily(
        "fairq_tenant_share_ratio",
        f"received / entitled {window} (no series while entitled to nothing).",
        labels=names,
    )
    for s in shares:
        for tenant, got, owed in share_series(s):
            key = [s.env.id, s.queue, tenant, s.unit]
            received.add_metric(key, got)
            entitled.add_metric(key, owed)
            if owed > 0:
                ratio.add_metric(key, got / owed)
    return [received, entitled, ratio]


async def metrics_text(rq: RunQueue) -> bytes:
    """The Prometheus exposition of the queues right now (a fresh registry per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    overview = await load_overview(rq, backlog=True)
    shares = []
    for e in overview.environments:
        env = Environment.parse(e.env)
        for q in e.queues:
            shares.append(await rq.tenant_shares(env, q.queue, window=METRIC_SHARES_WINDOW_S))
    registry.register(SnapshotCollector(overview, shares))
    return generate_latest(registry)


__all__ = [
    "METRIC_TOP_TENANTS",
    "OTHER_TENANTS",
    "PROMETHEUS_CONTENT_TYPE",
    "SnapshotCollector",
    "metrics_text",
    "share_gauges",
    "share_series",
]

"""The served record the dashboard charts, and fairq's own Prometheus registry.

"Served" means dequeued. The dequeue scripts count what they serve, per queue and per
tenant, in 10-second history buckets kept for an hour (see :mod:`fairq.keys`,
``B:h:<bucket>``): in the same atomic step, with no extra round trip, and shared by
every process. :func:`read_served` reads them in the shape the dashboard's chart uses.

:data:`REGISTRY` is fairq's own :class:`CollectorRegistry` (never prometheus-client's
global one); processes that observe runs (workers) register their metrics there.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry

from fairq.keys import Environment
from fairq.store import RunQueue
from fairq.store.readers import HISTORY_BUCKET_MS

#: fairq's metric registry (never prometheus-client's global one).
REGISTRY: Final = CollectorRegistry(auto_describe=True)

#: Width of one served-record window (ms).
SERVED_BUCKET_MS: Final = HISTORY_BUCKET_MS


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
    return [(b.start_ms, dict(b.by_tenant)) for b in buckets]


__all__ = ["REGISTRY", "SERVED_BUCKET_MS", "read_served"]

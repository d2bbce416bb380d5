"""Served share per concurrency key: what the queue page's chart shows.

"Served" means dequeued. The dequeue scripts stay untouched (no extra write on the hot
path), so the dashboard uses two sources, best first:

1. **The served record** (:mod:`fairq.metrics`): consumers that call
   :func:`fairq.metrics.record_dequeue` after each dequeue add their deliveries to
   per-queue 10-second windows on the server (expiring, one field per key). This is exact,
   shared across processes, and survives dashboard restarts. Used whenever the window
   shown holds any record for the queue.
2. **An estimate from sampling**, when no consumer records: each time the queue's JSON
   endpoint is polled (every 1.5 s while the page is open) the dashboard compares each
   variant's *queued* count with the previous poll; a drop is counted as runs served in
   that interval. It lives in this process's memory, bounded (:data:`MAX_TRACKED_QUEUES`
   queues, :data:`SERVED_WINDOW_MS` of history). Arrivals in the same interval hide
   serves, so it undercounts keys whose runs are served as fast as they arrive; it is
   right for backlogged keys, which is where fairness is decided. The page says which
   source it shows.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from fairq import metrics
from fairq.keys import Environment
from fairq.models import QueueStats
from fairq.store import RunQueue

#: How far back the served-share chart reaches (ms).
SERVED_WINDOW_MS: Final = 300_000
#: Keys drawn separately in the chart; the rest are summed as "other".
CHART_TOP_KEYS: Final = 8
#: Queues whose sampled served estimate is kept in memory (least recently polled dropped).
MAX_TRACKED_QUEUES: Final = 64

#: One served-share window: (start ms, {concurrency key or None: runs served}).
ServedWindow = tuple[int, dict[str | None, int]]


@dataclass
class _QueueSamples:
    """Sampled served estimate of one queue: the last queued count per key, and windows."""

    last_queued: dict[str | None, int] | None = None
    windows: dict[int, dict[str | None, int]] = field(default_factory=dict)


class ServedSampler:
    """The in-memory fallback: served ≈ drop in each variant's queued count between polls."""

    def __init__(self, max_queues: int = MAX_TRACKED_QUEUES) -> None:
        self._queues: OrderedDict[tuple[str, str], _QueueSamples] = OrderedDict()
        self._max_queues = max_queues

    def observe(self, stats: QueueStats, now_ms: int) -> None:
        """Record one poll of a queue (its ``breakdown=True`` stats)."""
        key = (stats.env.id, stats.queue)
        samples = self._queues.pop(key, None) or _QueueSamples()
        self._queues[key] = samples
        while len(self._queues) > self._max_queues:
            self._queues.popitem(last=False)
        queued: dict[str | None, int] = {v.concurrency_key: v.queued for v in stats.variants}
        keyless = stats.queued - sum(queued.values())
        if keyless > 0 or not stats.variants:
            queued[None] = max(0, keyless)
        previous = samples.last_queued
        samples.last_queued = queued
        if previous is not None:
            bucket = now_ms // metrics.SERVED_BUCKET_MS * metrics.SERVED_BUCKET_MS
            window = samples.windows.setdefault(bucket, {})
            for ck, before in previous.items():
                drop = before - queued.get(ck, 0)
                if drop > 0:
                    window[ck] = window.get(ck, 0) + drop
        horizon = now_ms - SERVED_WINDOW_MS - metrics.SERVED_BUCKET_MS
        for bucket in [b for b in samples.windows if b < horizon]:
            del samples.windows[bucket]

    def windows(self, env: Environment, queue: str, now_ms: int) -> list[ServedWindow]:
        """The estimate in the same shape as :func:`fairq.metrics.read_served`."""
        samples = self._queues.get((env.id, queue))
        last = now_ms // metrics.SERVED_BUCKET_MS
        first = last - SERVED_WINDOW_MS // metrics.SERVED_BUCKET_MS + 1
        stored = samples.windows if samples else {}
        return [
            (b * metrics.SERVED_BUCKET_MS, dict(stored.get(b * metrics.SERVED_BUCKET_MS, {})))
            for b in range(first, last + 1)
        ]

    def tracked(self) -> list[tuple[str, str]]:
        """The (environment id, queue) pairs held, least recently polled first."""
        return list(self._queues)


def served_share(windows: list[ServedWindow], *, top: int = CHART_TOP_KEYS) -> dict[str, Any]:
    """Chart data: per window, runs served per key (the ``top`` busiest keys, then "other").

    Returns:
        ``{"windows": [start ms...], "total": n, "series": [{"key", "label", "counts",
        "share"}]}`` where ``share`` is the key's fraction of all serves in the range.
    """
    totals: dict[str | None, int] = {}
    for _, counts in windows:
        for ck, n in counts.items():
            totals[ck] = totals.get(ck, 0) + n
    grand = sum(totals.values())
    ranked = sorted(totals, key=lambda ck: (-totals[ck], "" if ck is None else ck))
    shown, rest = ranked[:top], set(ranked[top:])
    series: list[dict[str, Any]] = []
    for ck in shown:
        series.append(
            {
                "key": ck,
                "label": "(no key)" if ck is None else ck,
                "counts": [counts.get(ck, 0) for _, counts in windows],
                "share": totals[ck] / grand if grand else 0.0,
            }
        )
    if rest:
        series.append(
            {
                "key": None,
                "label": f"other ({len(rest)} keys)",
                "counts": [
                    sum(n for ck, n in counts.items() if ck in rest) for _, counts in windows
                ],
                "share": sum(totals[ck] for ck in rest) / grand if grand else 0.0,
            }
        )
    return {"windows": [start for start, _ in windows], "total": grand, "series": series}


async def served_chart(
    rq: RunQueue, sampler: ServedSampler, stats: QueueStats, now_ms: int
) -> dict[str, Any]:
    """One poll of a queue's served share: feed the sampler, then pick the best source.

    Args:
        stats: the queue's ``breakdown=True`` stats of this poll.

    Returns:
        :func:`served_share` plus ``source`` (``recorded`` | ``sampled``) and ``bucket_ms``.
    """
    sampler.observe(stats, now_ms)
    recorded = await metrics.read_served(
        rq, stats.env, stats.queue, window_ms=SERVED_WINDOW_MS, now_ms=now_ms
    )
    if any(counts for _, counts in recorded):
        source, windows = "recorded", recorded
    else:
        source, windows = "sampled", sampler.windows(stats.env, stats.queue, now_ms)
    return {"source": source, "bucket_ms": metrics.SERVED_BUCKET_MS, **served_share(windows)}


__all__ = [
    "CHART_TOP_KEYS",
    "MAX_TRACKED_QUEUES",
    "SERVED_WINDOW_MS",
    "ServedSampler",
    "ServedWindow",
    "served_chart",
    "served_share",
]

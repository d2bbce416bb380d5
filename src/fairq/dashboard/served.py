"""Served share per tenant: what the queue page's chart shows.

"Served" means dequeued. Every dequeue script (whoever calls it: a worker, a consumer, a
plain ``RunQueue.dequeue``) counts the runs it serves, per queue and per tenant, in the
queue's 10-second history buckets, in the same atomic step (:mod:`fairq.metrics`,
:func:`fairq.metrics.read_served`). So the chart is exact, shared by every process, and
survives dashboard restarts; nothing needs to opt in and nothing is estimated.

A key that is its own tenant (no tenant named at enqueue) is shown under the key; the
keyless runs of the queue's default tenant under ``None``.
"""

from __future__ import annotations

from typing import Any, Final

from fairq import metrics
from fairq.keys import Environment
from fairq.metrics import OVERFLOW_TENANT
from fairq.store import RunQueue

#: How far back the served-share chart reaches (ms).
SERVED_WINDOW_MS: Final = 300_000
#: Tenants drawn separately in the chart; the rest are summed as "other".
CHART_TOP_KEYS: Final = 8
#: Where the chart's numbers come from (the JSON's ``served.source``).
SOURCE: Final = "history"

#: One served-share window: (start ms, {tenant or None: runs served}).
ServedWindow = tuple[int, dict[str | None, int]]


def _label(tenant: str | None) -> str:
    if tenant is None:
        return "(no key)"
    if tenant == OVERFLOW_TENANT:
        return "(more tenants)"
    return tenant


def served_share(windows: list[ServedWindow], *, top: int = CHART_TOP_KEYS) -> dict[str, Any]:
    """Chart data: per window, runs served per tenant (the ``top`` busiest, then "other").

    Returns:
        ``{"windows": [start ms...], "total": n, "series": [{"key", "label", "counts",
        "share"}]}`` where ``share`` is the tenant's fraction of all serves in the range.
    """
    totals: dict[str | None, int] = {}
    for _, counts in windows:
        for tenant, n in counts.items():
            totals[tenant] = totals.get(tenant, 0) + n
    grand = sum(totals.values())
    ranked = sorted(totals, key=lambda t: (-totals[t], "" if t is None else t))
    shown, rest = ranked[:top], set(ranked[top:])
    series: list[dict[str, Any]] = []
    for tenant in shown:
        series.append(
            {
                "key": tenant,
                "label": _label(tenant),
                "counts": [counts.get(tenant, 0) for _, counts in windows],
                "share": totals[tenant] / grand if grand else 0.0,
            }
        )
    if rest:
        series.append(
            {
                "key": None,
                "label": f"other ({len(rest)} tenants)",
                "counts": [sum(n for t, n in counts.items() if t in rest) for _, counts in windows],
                "share": sum(totals[t] for t in rest) / grand if grand else 0.0,
            }
        )
    return {"windows": [start for start, _ in windows], "total": grand, "series": series}


async def served_chart(rq: RunQueue, env: Environment, queue: str, now_ms: int) -> dict[str, Any]:
    """One queue's served share over the last :data:`SERVED_WINDOW_MS` (from its history).

    Returns:
        :func:`served_share` plus ``source`` (:data:`SOURCE`) and ``bucket_ms``.
    """
    windows = await metrics.read_served(rq, env, queue, window_ms=SERVED_WINDOW_MS, now_ms=now_ms)
    return {"source": SOURCE, "bucket_ms": metrics.SERVED_BUCKET_MS, **served_share(windows)}


__all__ = [
    "CHART_TOP_KEYS",
    "OVERFLOW_TENANT",
    "SERVED_WINDOW_MS",
    "SOURCE",
    "ServedWindow",
    "served_chart",
    "served_share",
]

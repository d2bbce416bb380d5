"""Shares received vs entitled per tenant: the queue page's panel, ``fairq stats --tenants``
and the ``/metrics`` gauges read it from here.

What a tenant received (runs, or slot-seconds with ``charge="duration"``) and what it was
entitled to while backlogged, over the last 1, 5 and 15 minutes on the server's clock
(:meth:`fairq.store.RunQueue.tenant_shares`). The panel shows the tenants that received
most over 5 minutes and sums the rest as "other", so its size is bounded.
"""

from __future__ import annotations

from typing import Any, Final

from fairq.keys import Environment
from fairq.models import KeyShare, TenantShare, TenantShares
from fairq.store import RunQueue
from fairq.store.share_record import SHARES_WINDOWS_S

#: Tenants shown one by one (the rest are summed as "other").
SHARES_TOP: Final = 8
#: The window the chart and the ranking use (s): the middle one.
RANKING_WINDOW_S: Final = 300


def tenant_label(tenant: str | None) -> str:
    """How a tenant is shown (None: the queue's keyless runs of no named tenant)."""
    return "(no tenant)" if tenant is None else tenant


def format_amount(value: float) -> str:
    """A received or entitled amount: whole runs plain, else one decimal."""
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def format_ratio(value: float | None) -> str:
    """received / entitled to two decimals (``—``: entitled to nothing)."""
    return "—" if value is None else f"{value:.2f}"


def _ratio(received: float, entitled: float) -> float | None:
    return received / entitled if entitled > 0 else None


def _key_json(keys: list[KeyShare | None]) -> dict[str, Any]:
    received = [0.0 if k is None else k.received for k in keys]
    entitled = [0.0 if k is None else k.entitled for k in keys]
    return {
        "received": received,
        "entitled": entitled,
        "ratio": [_ratio(r, e) for r, e in zip(received, entitled, strict=True)],
    }


def _row(tenant: str | None, per_window: list[TenantShare | None]) -> dict[str, Any]:
    keys: dict[str | None, list[KeyShare | None]] = {}
    for i, t in enumerate(per_window):
        for k in t.by_key if t else ():
            keys.setdefault(k.key, [None] * len(per_window))[i] = k
    received = [0.0 if t is None else t.received for t in per_window]
    entitled = [0.0 if t is None else t.entitled for t in per_window]
    return {
        "tenant": tenant,
        "label": tenant_label(tenant),
        "received": received,
        "entitled": entitled,
        "ratio": [_ratio(r, e) for r, e in zip(received, entitled, strict=True)],
        "share": [0.0 if t is None else t.share for t in per_window],
        "keys": [{"key": key, **_key_json(ks)} for key, ks in keys.items()],
    }


def shares_panel(per_window: list[TenantShares], *, top: int = SHARES_TOP) -> dict[str, Any]:
    """The panel's data: one row per tenant (the ``top`` that received most over the
    ranking window), then "other"; each value a list, one entry per window.

    Returns:
        ``{"unit", "windows": [s...], "received": [...], "unsampled": [...], "samples":
        [...], "rows": [{"tenant", "label", "received", "entitled", "ratio", "share",
        "keys"}], "other": {"count", "received", "entitled", "ratio"} | None}``.
    """
    windows = [s.window_s for s in per_window]
    rank = windows.index(RANKING_WINDOW_S) if RANKING_WINDOW_S in windows else len(windows) - 1
    tables = [{t.tenant: t for t in s.tenants} for s in per_window]
    names = sorted(
        {name for table in tables for name in table},
        key=lambda n: (
            -(tables[rank][n].received if n in tables[rank] else 0.0),
            -max(table[n].received if n in table else 0.0 for table in tables),
            n or "",
        ),
    )
    rows = [_row(n, [table.get(n) for table in tables]) for n in names[:top]]
    rest = names[top:]
    other = None
    if rest or any(s.other for s in per_window):
        received = [sum(t[n].received for n in rest if n in t) + s.other
                    for t, s in zip(tables, per_window, strict=True)]  # fmt: skip
        entitled = [sum(t[n].entitled for n in rest if n in t) for t in tables]
        other = {
            "count": len(rest),
            "received": received,
            "entitled": entitled,
            "ratio": [_ratio(r, e) for r, e in zip(received, entitled, strict=True)],
        }
    return {
        "unit": per_window[0].unit if per_window else "runs",
        "windows": windows,
        "received": [s.received for s in per_window],
        "unsampled": [s.unsampled for s in per_window],
        "samples": [s.samples for s in per_window],
        "rows": rows,
        "other": other,
    }


async def load_shares(
    rq: RunQueue,
    env: Environment,
    queue: str,
    *,
    now_ms: int | None = None,
    top: int = SHARES_TOP,
) -> dict[str, Any]:
    """One queue's :func:`shares_panel` over the last 1, 5 and 15 minutes (one read)."""
    per_window = await rq.tenant_shares_windows(env, queue, windows=SHARES_WINDOWS_S,
                                                now_ms=now_ms)  # fmt: skip
    return shares_panel(per_window, top=top)


__all__ = [
    "RANKING_WINDOW_S",
    "SHARES_TOP",
    "format_amount",
    "format_ratio",
    "load_shares",
    "shares_panel",
    "tenant_label",
]

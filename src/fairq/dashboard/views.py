"""View models of the queues: what the dashboard pages, their JSON and ``fairq stats`` show.

They are built from the public readers of :class:`~fairq.store.RunQueue` only
(:meth:`~fairq.store.RunQueue.environments`, :meth:`~fairq.store.RunQueue.queues`,
:meth:`~fairq.store.RunQueue.queues_stats`, :meth:`~fairq.store.RunQueue.env_stats`,
:meth:`~fairq.store.RunQueue.dead_letters`). Queued | Running count keyless runs plus
every concurrency-key (CK) variant, from the CK counters, so an overview costs a constant
number of commands per queue.

Each view has ``to_json()``: the dashboard's JSON endpoints return exactly that, its pages
are rendered from it, and ``fairq stats --json`` prints it (with the keys of each queue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Final

from fairq.dashboard.served import served_chart
from fairq.dashboard.shares import load_shares
from fairq.keys import Environment
from fairq.models import DeadLetter, EnvStats, QueueStats, VariantStats
from fairq.outcomes import RunInfo
from fairq.store import Backlog, RecentRun, RunQueue, wall_clock_ms
from fairq.store.backlog import env_backlog
from fairq.store.history import HISTORY_BUCKET_MS

#: Variant rows returned for a queue page.
MAX_VARIANT_ROWS: Final = 200
#: Dead letters listed on a queue page.
MAX_DEAD_LETTERS: Final = 100
#: Characters of a dead letter's payload shown.
PAYLOAD_PREVIEW_CHARS: Final = 200
#: Recently finished runs listed on a queue page.
MAX_RECENT_RUNS: Final = 10
#: How far back the queue page's charts reach (ms), and the width of one point (ms).
CHART_WINDOW_MS: Final = 3_600_000
CHART_POINT_MS: Final = 60_000


def oldest_wait_s(oldest_score_ms: int | None, now_ms: int) -> float | None:
    """Seconds the oldest available run has waited (None when nothing is queued)."""
    return None if oldest_score_ms is None else max(0, now_ms - oldest_score_ms) / 1000.0


def format_wait(seconds: float | None) -> str:
    """``1.2 s``, ``3 m 04 s``, ``2 h 05 m``; ``—`` for nothing queued."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} m"


def _busiest_first(v: VariantStats) -> tuple[int, str, str]:
    return -(v.queued + v.running), v.concurrency_key or "", v.tenant or ""


def _size_limit(value: int | None) -> int | None:
    # A stored 0 means "no cap", like an unset one.
    return value or None


@dataclass(frozen=True, slots=True)
class VariantView:
    """One concurrency-key variant of a queue."""

    #: The concurrency key (None: a named tenant's runs without one).
    key: str | None
    queued: int
    running: int
    oldest_wait_s: float | None
    virtual_tag: float | None
    weight: float
    #: The tenant named at enqueue (None: the key is its own tenant).
    tenant: str | None = None
    #: The key's own concurrency cap (None: the queue's limit).
    cap: int | None = None

    @classmethod
    def of(cls, v: VariantStats, now_ms: int) -> VariantView:
        return cls(
            key=v.concurrency_key,
            queued=v.queued,
            running=v.running,
            oldest_wait_s=oldest_wait_s(v.oldest_score_ms, now_ms),
            virtual_tag=v.virtual_tag,
            weight=v.weight,
            tenant=v.tenant,
            cap=v.cap,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "queued": self.queued,
            "running": self.running,
            "oldest_wait_s": self.oldest_wait_s,
            "virtual_tag": self.virtual_tag,
            "weight": self.weight,
            "tenant": self.tenant,
            "cap": self.cap,
        }


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue: counts over keyless runs and every variant, and its limits."""

    queue: str
    queued: int
    running: int
    #: Per concurrency key; None: no queue limit; 0: paused.
    concurrency_limit: int | None
    #: Cap on queued runs (the queue's, else its environment's); None: no cap.
    queue_size_limit: int | None
    paused: bool
    oldest_wait_s: float | None
    #: Busiest first; empty unless asked for (``breakdown=True``).
    variants: tuple[VariantView, ...] = ()
    #: ``age`` or ``fair`` (the queue's, else its environment's, else the default).
    order: str = "age"
    #: Runs in flight across all keys and keyless runs; None: no total cap.
    total_concurrency_limit: int | None = None
    #: Runs started per second (the queue's rate limit); None: none.
    rate: float | None = None
    #: Queued runs not due yet (delayed, backing off).
    delayed: int = 0
    #: When the first queued run is due (ms), when every queued run is still delayed.
    next_due_ms: int | None = None
    #: Runs one dequeue call takes from one key.
    max_per_key: int | None = None
    #: ``count`` or ``duration`` (what the fair order charges per run).
    charge: str = "count"
    #: Capped keys / tenants may borrow idle slots.
    borrow: bool = False
    #: Ready runs more workers could serve now vs held by gates, and delayed ones (read
    #: only when asked for: ``backlog=True``).
    backlog: Backlog | None = None
    #: (level, queued, running) per priority level with runs, highest first; empty
    #: while every run of the queue is at its default level.
    by_level: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def of(cls, stats: QueueStats, now_ms: int) -> QueueView:
        variants = sorted(stats.variants, key=_busiest_first)
        return cls(
            queue=stats.queue,
            queued=stats.queued,
            running=stats.running,
            concurrency_limit=stats.concurrency_limit,
            queue_size_limit=_size_limit(stats.queue_size_limit),
            paused=stats.paused,
            oldest_wait_s=oldest_wait_s(stats.oldest_score_ms, now_ms),
            variants=tuple(VariantView.of(v, now_ms) for v in variants),
            order=stats.order,
            total_concurrency_limit=stats.total_concurrency_limit,
            rate=stats.rate,
            delayed=stats.delayed,
            next_due_ms=stats.oldest_score_ms
            if stats.oldest_score_ms is not None and stats.oldest_score_ms > now_ms
            else None,
            max_per_key=stats.max_per_key_per_call,
            charge=stats.charge,
            borrow=stats.borrow,
        )

    def to_json(self, *, keys: bool = False) -> dict[str, Any]:
        """The queue's row; with ``keys``, its variants under ``"keys"``."""
        row: dict[str, Any] = {
            "queue": self.queue,
            "queued": self.queued,
            "running": self.running,
            "concurrency_limit": self.concurrency_limit,
            "queue_size_limit": self.queue_size_limit,
            "paused": self.paused,
            "oldest_wait_s": self.oldest_wait_s,
            "order": self.order,
            "total_concurrency_limit": self.total_concurrency_limit,
            "rate": self.rate,
            "delayed": self.delayed,
            "next_due_ms": self.next_due_ms,
            "max_per_key": self.max_per_key,
            "charge": self.charge,
            "borrow": self.borrow,
        }
        if self.backlog is not None:
            row["backlog"] = self.backlog.to_json()
        if self.by_level:
            row["levels"] = [{"level": lv, "queued": q, "running": r} for lv, q, r in self.by_level]
        if keys:
            row["keys"] = [v.to_json() for v in self.variants]
        return row


@dataclass(frozen=True, slots=True)
class EnvView:
    """One environment: its own counts and limits, and its queues."""

    env: str
    running: int
    concurrency_limit: int
    burst_factor: float
    queue_size_limit: int | None
    dead_lettered: int
    queues: tuple[QueueView, ...]
    #: The environment's default order for its queues.
    order: str = "age"
    #: Its queues' backlogs together, its limit applied once (see QueueView.backlog).
    backlog: Backlog | None = None

    @classmethod
    def of(cls, stats: EnvStats, queues: list[QueueStats], now_ms: int) -> EnvView:
        return cls(
            env=stats.env.id,
            running=stats.running,
            concurrency_limit=stats.concurrency_limit,
            burst_factor=stats.burst_factor,
            queue_size_limit=_size_limit(stats.queue_size_limit),
            dead_lettered=stats.dead_lettered,
            queues=tuple(QueueView.of(q, now_ms) for q in queues),
            order=stats.order,
        )

    @property
    def queued(self) -> int:
        """Runs queued over every queue of the environment."""
        return sum(q.queued for q in self.queues)

    def to_json(self, *, keys: bool = False) -> dict[str, Any]:
        return {
            "env": self.env,
            "running": self.running,
            "concurrency_limit": self.concurrency_limit,
            "burst_factor": self.burst_factor,
            "queue_size_limit": self.queue_size_limit,
            "dead_lettered": self.dead_lettered,
            "order": self.order,
            **({} if self.backlog is None else {"backlog": self.backlog.to_json()}),
            "queues": [q.to_json(keys=keys) for q in self.queues],
        }


@dataclass(frozen=True, slots=True)
class Overview:
    """Every environment (or one) with its queues, at one moment."""

    now_ms: int
    fair_order: bool
    environments: tuple[EnvView, ...]

    def to_json(self, *, keys: bool = False) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "fair_order": self.fair_order,
            "environments": [e.to_json(keys=keys) for e in self.environments],
        }


async def load_overview(
    rq: RunQueue,
    *,
    env: Environment | None = None,
    breakdown: bool = False,
    backlog: bool = False,
    now_ms: int | None = None,
) -> Overview:
    """Every environment (or only ``env``) with its limits, DLQ size and queues.

    Args:
        breakdown: also read every queue's concurrency-key variants.
        backlog: also read every queue's backlog split (servable, held, delayed).
    """
    now = wall_clock_ms() if now_ms is None else now_ms
    envs = [env] if env is not None else await rq.environments()
    views: list[EnvView] = []
    for e in envs:
        names = await rq.queues(e)
        stats = await rq.queues_stats(e, names, breakdown=breakdown) if names else []
        view = await with_levels(rq, e, EnvView.of(await rq.env_stats(e), stats, now), stats)
        if backlog:
            view = await with_backlog(rq, e, view, now_ms)
        views.append(view)
    return Overview(now_ms=now, fair_order=rq.fair, environments=tuple(views))


async def with_level_counts(
    rq: RunQueue, env: Environment, view: QueueView, stats: QueueStats
) -> QueueView:
    """``view`` with its per-level counts, when its runs have used several levels."""
    if not stats.levels_used:
        return view
    counts = await rq.level_counts(env, view.queue)
    return replace(view, by_level=tuple((lv, c.queued, c.running) for lv, c in counts.items()))


async def with_levels(
    rq: RunQueue, env: Environment, view: EnvView, stats: list[QueueStats]
) -> EnvView:
    """``view`` with the per-level counts of the queues whose runs use several levels
    (read only for those)."""
    queues = [
        await with_level_counts(rq, env, q, s) for q, s in zip(view.queues, stats, strict=True)
    ]
    return replace(view, queues=tuple(queues))


async def with_backlog(
    rq: RunQueue, env: Environment, view: EnvView, now_ms: int | None
) -> EnvView:
    """``view`` with its queues' backlogs and the environment's (reads only)."""
    names = [q.queue for q in view.queues]
    parts = await rq.queues_backlog(env, names, now_ms=now_ms) if names else []
    free = math.floor(view.concurrency_limit * view.burst_factor) - view.running
    at = parts[0].now_ms if parts else (wall_clock_ms() if now_ms is None else now_ms)
    return replace(
        view,
        queues=tuple(replace(q, backlog=b) for q, b in zip(view.queues, parts, strict=True)),
        backlog=env_backlog(parts, free, at),
    )


@dataclass(frozen=True, slots=True)
class DeadLetterView:
    run_id: str
    queue: str
    key: str | None
    attempt: int
    dead_lettered_at_ms: int
    #: The start of the payload (:data:`PAYLOAD_PREVIEW_CHARS`).
    payload: str
    #: The start of its last attempt's error (:data:`PAYLOAD_PREVIEW_CHARS`).
    error: str | None = None
    tenant: str | None = None

    @classmethod
    def of(cls, d: DeadLetter) -> DeadLetterView:
        return cls(
            run_id=d.run_id,
            queue=d.queue,
            key=d.concurrency_key,
            attempt=d.attempt,
            dead_lettered_at_ms=d.dead_lettered_at_ms,
            payload=d.payload_json[:PAYLOAD_PREVIEW_CHARS],
            error=None if d.error is None else d.error[:PAYLOAD_PREVIEW_CHARS],
            tenant=d.tenant,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "queue": self.queue,
            "key": self.key,
            "attempt": self.attempt,
            "dead_lettered_at_ms": self.dead_lettered_at_ms,
            "payload": self.payload,
            "error": self.error,
            "tenant": self.tenant,
        }


@dataclass(frozen=True, slots=True)
class QueueDetail:
    """One queue's page: counts, variants, the environment's dead letters, served share,
    shares received vs entitled."""

    now_ms: int
    env: str
    #: Whether this queue is served in the fair order.
    fair_order: bool
    queue: QueueView
    env_running: int
    env_concurrency_limit: int
    dead_lettered: int
    dead_letters: tuple[DeadLetterView, ...]
    #: :func:`fairq.dashboard.served.served_chart`.
    served: dict[str, Any]
    #: The queue's most recently finished runs, newest first.
    recent: tuple[RecentRun, ...] = ()
    #: :func:`fairq.dashboard.shares.shares_panel`: received vs entitled per tenant.
    shares: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The page's data; at most :data:`MAX_VARIANT_ROWS` variants (busiest first)."""
        return {
            "now_ms": self.now_ms,
            "env": self.env,
            "fair_order": self.fair_order,
            "queue": self.queue.to_json(),
            "env_running": self.env_running,
            "env_concurrency_limit": self.env_concurrency_limit,
            "variant_count": len(self.queue.variants),
            "variants": [v.to_json() for v in self.queue.variants[:MAX_VARIANT_ROWS]],
            "dead_letters": [d.to_json() for d in self.dead_letters],
            "dead_lettered": self.dead_lettered,
            "served": self.served,
            "recent": [recent_to_json(r) for r in self.recent],
            "shares": self.shares,
        }


async def load_queue_detail(
    rq: RunQueue,
    env: Environment,
    queue: str,
    *,
    now_ms: int | None = None,
) -> QueueDetail:
    """One queue's page data, with its served share (the dequeue scripts' history) and
    its shares received vs entitled (:mod:`fairq.dashboard.shares`)."""
    now = wall_clock_ms() if now_ms is None else now_ms
    stats = await rq.queue_stats(env, queue, breakdown=True)
    served = await served_chart(rq, env, queue, now)
    es = await rq.env_stats(env)
    dead = await rq.dead_letters(env, limit=MAX_DEAD_LETTERS)
    recent = await rq.recent_runs(env, queue, limit=MAX_RECENT_RUNS)
    shares = await load_shares(rq, env, queue, now_ms=now_ms)
    return QueueDetail(
        now_ms=now,
        env=env.id,
        fair_order=stats.order == "fair",
        queue=await with_level_counts(rq, env, QueueView.of(stats, now), stats),
        env_running=es.running,
        env_concurrency_limit=es.concurrency_limit,
        dead_lettered=es.dead_lettered,
        dead_letters=tuple(DeadLetterView.of(d) for d in dead),
        served=served,
        recent=tuple(recent),
        shares=shares,
    )


def recent_to_json(r: RecentRun) -> dict[str, Any]:
    """A recently finished run (queue page, ``fairq runs recent --json``)."""
    return {
        "run_id": r.run_id,
        "status": r.status.value,
        "finished_at_ms": r.finished_at_ms,
        "attempts": r.attempts,
        "duration_ms": r.duration_ms,
        "concurrency_key": r.concurrency_key,
        "tenant": r.tenant,
    }


def run_to_json(info: RunInfo) -> dict[str, Any]:
    """A run in detail (the dashboard's run page, ``fairq runs show --json``)."""
    return {
        "run_id": info.run_id,
        "status": info.status.value,
        "queue": info.queue,
        "concurrency_key": info.concurrency_key,
        "tenant": info.tenant,
        "attempts": info.attempts,
        "enqueued_at_ms": info.enqueued_at_ms,
        "due_at_ms": info.due_at_ms,
        "started_at_ms": info.started_at_ms,
        "finished_at_ms": info.finished_at_ms,
        "duration_ms": info.duration_ms,
        "payload": info.payload_json,
        "result": info.result,
        "error": info.error,
        "traceback": info.traceback,
        "cancel_requested": info.cancel_requested,
        "progress": None if info.progress is None else list(info.progress),
    }


async def find_run(
    rq: RunQueue, run_id: str, env: Environment | None = None, *, max_envs: int = 50
) -> tuple[Environment, RunInfo] | None:
    """A run by id: in ``env``, else in the first of (at most ``max_envs``) environments
    that knows it (one read per environment tried)."""
    envs = [env] if env is not None else (await rq.environments())[:max_envs]
    for e in envs:
        info = await rq.get_run(e, run_id)
        if info is not None:
            return e, info
    return None


async def load_charts(
    rq: RunQueue, env: Environment, queue: str, *, now_ms: int | None = None
) -> dict[str, Any]:
    """The queue page's charts over the last hour, one point per minute (from the queue's
    10-second history buckets: one pipeline of 360 reads, polled every 15 s by the page):
    runs served / completed / failed / dead-lettered per minute, mean run time and mean
    wait (available to dequeued), and the environment's dead-letter count now."""
    now = wall_clock_ms() if now_ms is None else now_ms
    buckets = await rq.history(env, queue, window_ms=CHART_WINDOW_MS, now_ms=now)
    per_point = CHART_POINT_MS // HISTORY_BUCKET_MS
    points: list[dict[str, Any]] = []
    for i in range(0, len(buckets), per_point):
        group = buckets[i : i + per_point]
        served = sum(b.served for b in group)
        completed = sum(b.completed for b in group)
        finished = completed + sum(b.failed + b.timed_out for b in group)
        run_ms = sum(b.run_ms for b in group)
        wait_ms = sum(b.wait_ms for b in group)
        points.append(
            {
                "start_ms": group[0].start_ms,
                "served": served,
                "completed": completed,
                "failed": sum(b.failed + b.timed_out for b in group),
                "retried": sum(b.retried for b in group),
                "dead_lettered": sum(b.dead_lettered for b in group),
                "mean_run_ms": run_ms / finished if finished else None,
                "mean_wait_ms": wait_ms / served if served else None,
            }
        )
    dead = (await rq.env_stats(env)).dead_lettered
    return {"now_ms": now, "point_ms": CHART_POINT_MS, "points": points, "dead_lettered": dead}


__all__ = [
    "MAX_DEAD_LETTERS",
    "MAX_VARIANT_ROWS",
    "DeadLetterView",
    "EnvView",
    "Overview",
    "QueueDetail",
    "QueueView",
    "VariantView",
    "find_run",
    "format_wait",
    "load_charts",
    "load_overview",
    "load_queue_detail",
    "oldest_wait_s",
    "recent_to_json",
    "run_to_json",
]

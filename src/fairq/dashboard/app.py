"""The live dashboard: a Starlette app over one :class:`~fairq.store.RunQueue`.

Pages are rendered on the server (Jinja2) with the numbers of the moment, then a little
vanilla JS (``static/dashboard.js``, shipped in the package: no CDN) polls a JSON endpoint
every 1.5 s and updates them in place, and draws the served-share chart on a canvas.

Routes
------
``GET /``                               environments and their queues (Queued | Running…)
``GET /api/overview``                   the same, as JSON
``GET /queues/{env}/{queue}``           one queue: CK variants, the env's DLQ, served share
``GET /api/queues/{env}/{queue}``       the same, as JSON
``POST /envs/{env}/dlq/{run}/redrive``  move a dead-lettered run back to its queue
``GET /metrics``                        Prometheus text format
``GET /static/...``                     the JS and CSS

Queued | Running come from :meth:`RunQueue.queues_stats` (keyless runs plus the CK
counters), so they are CK-aware and cost a constant number of commands per queue.

Served share per key: where it comes from
-----------------------------------------
"Served" means dequeued. The dequeue scripts stay untouched (no extra write on the hot
path), so the dashboard uses two sources, best first:

1. **The served record** (:mod:`fairq.metrics`): consumers that call
   :func:`fairq.metrics.record_dequeue` after each dequeue add their deliveries to
   per-queue 10-second Redis HASH windows (expiring, one field per key). This is exact,
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

Security
--------
With a token (required by ``fairq dashboard`` beyond loopback) every request must carry
it: ``?token=...`` once (it is then kept in an HttpOnly, SameSite=Strict cookie) or an
``Authorization: Bearer ...`` header. Without a token the app is meant for 127.0.0.1 only.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qs, quote, urlsplit

import jinja2
import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from fairq import metrics
from fairq.errors import FairqError, RunNotFoundError
from fairq.keys import Environment
from fairq.models import QueueStats, VariantStats
from fairq.store import RunQueue, wall_clock_ms

#: How far back the served-share chart reaches (ms).
SERVED_WINDOW_MS: Final = 300_000
#: Keys drawn separately in the chart; the rest are summed as "other".
CHART_TOP_KEYS: Final = 8
#: Queues whose sampled served estimate is kept in memory (least recently polled dropped).
MAX_TRACKED_QUEUES: Final = 64
#: Variant rows returned for a queue page.
MAX_VARIANT_ROWS: Final = 200
#: Dead letters listed on a queue page.
MAX_DEAD_LETTERS: Final = 100
#: Cookie that keeps the access token after ``?token=``.
TOKEN_COOKIE: Final = "fairq_dashboard_token"

#: Content type of the Prometheus text exposition.
PROMETHEUS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

_PACKAGE: Final = "fairq.dashboard"
#: One served-share window: (start ms, {concurrency key or None: runs served}).
ServedWindow = tuple[int, dict[str | None, int]]


# ---------------------------------------------------------------------- served share


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


# ---------------------------------------------------------------------- views of the store


def _oldest_wait_s(oldest_score_ms: int | None, now_ms: int) -> float | None:
    return None if oldest_score_ms is None else max(0, now_ms - oldest_score_ms) / 1000.0


def _queue_row(stats: QueueStats, now_ms: int) -> dict[str, Any]:
    return {
        "queue": stats.queue,
        "queued": stats.queued,
        "running": stats.running,
        "concurrency_limit": stats.concurrency_limit,
        "queue_size_limit": stats.queue_size_limit or None,
        "paused": stats.paused,
        "oldest_wait_s": _oldest_wait_s(stats.oldest_score_ms, now_ms),
    }


def _variant_row(v: VariantStats, now_ms: int) -> dict[str, Any]:
    return {
        "key": v.concurrency_key,
        "queued": v.queued,
        "running": v.running,
        "oldest_wait_s": _oldest_wait_s(v.oldest_score_ms, now_ms),
        "virtual_tag": v.virtual_tag,
        "weight": v.weight,
    }


async def overview(rq: RunQueue, now_ms: int | None = None) -> dict[str, Any]:
    """Every environment with its limits, DLQ size and queues (CK-aware counts)."""
    now = wall_clock_ms() if now_ms is None else now_ms
    envs: list[dict[str, Any]] = []
    for env in await rq.environments():
        names = await rq.queues(env)
        stats = await rq.queues_stats(env, names) if names else []
        es = await rq.env_stats(env)
        envs.append(
            {
                "env": env.id,
                "running": es.running,
                "concurrency_limit": es.concurrency_limit,
                "burst_factor": es.burst_factor,
                "queue_size_limit": es.queue_size_limit,
                "dead_lettered": es.dead_lettered,
                "queues": [_queue_row(s, now) for s in stats],
            }
        )
    return {"now_ms": now, "fair_order": rq.fair, "environments": envs}


async def queue_detail(
    rq: RunQueue, sampler: ServedSampler, env: Environment, queue: str, now_ms: int | None = None
) -> dict[str, Any]:
    """One queue: counts, variants, the environment's dead letters and served share."""
    now = wall_clock_ms() if now_ms is None else now_ms
    stats = await rq.queue_stats(env, queue, breakdown=True)
    sampler.observe(stats, now)
    es = await rq.env_stats(env)
    dead = await rq.dead_letters(env, limit=MAX_DEAD_LETTERS)
    recorded = await metrics.read_served(rq, env, queue, window_ms=SERVED_WINDOW_MS, now_ms=now)
    if any(counts for _, counts in recorded):
        source, windows = "recorded", recorded
    else:
        source, windows = "sampled", sampler.windows(env, queue, now)
    variants = sorted(stats.variants, key=lambda v: (-(v.queued + v.running), v.concurrency_key))
    return {
        "now_ms": now,
        "env": env.id,
        "fair_order": rq.fair,
        "queue": _queue_row(stats, now),
        "env_running": es.running,
        "env_concurrency_limit": es.concurrency_limit,
        "variant_count": len(stats.variants),
        "variants": [_variant_row(v, now) for v in variants[:MAX_VARIANT_ROWS]],
        "dead_letters": [
            {
                "run_id": d.run_id,
                "queue": d.queue,
                "key": d.concurrency_key,
                "attempt": d.attempt,
                "dead_lettered_at_ms": d.dead_lettered_at_ms,
                "payload": d.payload_json[:200],
            }
            for d in dead
        ],
        "dead_lettered": es.dead_lettered,
        "served": {
            "source": source,
            "bucket_ms": metrics.SERVED_BUCKET_MS,
            **served_share(windows),
        },
    }


# ---------------------------------------------------------------------- Prometheus


class _SnapshotCollector(Collector):
    """Per-queue gauges from one overview snapshot, plus fairq's process histograms."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
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
        for e in self.snapshot["environments"]:
            dlq.add_metric([e["env"]], e["dead_lettered"])
            env_running.add_metric([e["env"]], e["running"])
            for q in e["queues"]:
                key = [e["env"], q["queue"]]
                queued.add_metric(key, q["queued"])
                running.add_metric(key, q["running"])
                wait.add_metric(key, q["oldest_wait_s"] or 0.0)
                paused.add_metric(key, 1.0 if q["paused"] else 0.0)
        own: list[Metric] = [queued, running, wait, paused, dlq, env_running]
        return own + list(metrics.REGISTRY.collect())


async def metrics_text(rq: RunQueue) -> bytes:
    """The Prometheus exposition of the queues right now (a fresh registry per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(await overview(rq)))
    return generate_latest(registry)


# ---------------------------------------------------------------------- access token


class TokenMiddleware:
    """Refuse every request that does not carry the token (query, cookie or Bearer)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        bearer = header[7:].strip() if header.lower().startswith("bearer ") else None
        from_query = request.query_params.get("token")
        if self._ok(bearer) or self._ok(request.cookies.get(TOKEN_COOKIE)):
            await self.app(scope, receive, send)
            return
        if self._ok(from_query):
            # Keep it in a cookie and drop it from the address bar.
            target = request.url.remove_query_params("token")
            location = target.path + (f"?{target.query}" if target.query else "")
            redirect = RedirectResponse(location, status_code=303)
            redirect.set_cookie(TOKEN_COOKIE, self.token.decode(), httponly=True, samesite="strict")
            await redirect(scope, receive, send)
            return
        refusal = PlainTextResponse(
            "401: this dashboard needs its access token: open it with ?token=... "
            "or send 'Authorization: Bearer ...'.",
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await refusal(scope, receive, send)


# ---------------------------------------------------------------------- the app


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(_PACKAGE, "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["urlpart"] = lambda value: quote(str(value), safe="")
    env.filters["wait"] = format_wait
    env.filters["limit"] = lambda value: "—" if value is None else str(value)
    return Jinja2Templates(env=env)


def format_wait(seconds: float | None) -> str:
    """``1.2 s``, ``3 m 04 s``, ``2 h 05 m``; ``—`` for nothing queued."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} m"


def _env_param(request: Request) -> Environment:
    return Environment.parse(request.path_params["env"])


#: Host headers a token-less dashboard answers (loopback only: a page on another site
#: that rebinds its DNS name to 127.0.0.1 must not read the JSON).
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")


def create_app(
    rq: RunQueue, *, token: str | None, allowed_hosts: Sequence[str] | None = None
) -> Starlette:
    """The dashboard app for one queue connection.

    Args:
        rq: the queue to show (its client must belong to the server's event loop).
        token: when set, every request must carry it (see the module docstring).
        allowed_hosts: Host headers to answer; default: any with a token, loopback
            names only without one.

    Returns:
        A Starlette app; serve it with uvicorn (``fairq dashboard`` does).
    """
    templates = _templates()
    sampler = ServedSampler()

    def page(name: str, request: Request, context: dict[str, Any]) -> Response:
        return templates.TemplateResponse(request, name, context)

    async def index(request: Request) -> Response:
        return page("index.html", request, {"data": await overview(rq)})

    async def api_overview(request: Request) -> Response:
        return JSONResponse(await overview(rq))

    async def queue_page(request: Request) -> Response:
        env, queue = _env_param(request), request.path_params["queue"]
        data = await queue_detail(rq, sampler, env, queue)
        return page(
            "queue.html", request, {"data": data, "flash": request.query_params.get("flash")}
        )

    async def api_queue(request: Request) -> Response:
        env, queue = _env_param(request), request.path_params["queue"]
        return JSONResponse(await queue_detail(rq, sampler, env, queue))

    async def redrive(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            # A form posted by another site to a dashboard on this machine.
            return PlainTextResponse("403: cross-site request refused", status_code=403)
        env, run_id = _env_param(request), request.path_params["run_id"]
        # A plain urlencoded form; parsed here so the app needs no python-multipart.
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        back = (form.get("next") or ["/"])[0]
        if not back.startswith("/") or back.startswith("//"):
            back = "/"
        try:
            await rq.redrive(env, run_id)
            status, flash = 200, f"redriven {run_id}"
        except RunNotFoundError:
            status, flash = 404, f"{run_id} is no longer in the dead-letter queue"
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse({"run_id": run_id, "redriven": status == 200}, status_code=status)
        sep = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{sep}flash={quote(flash)}", status_code=303)

    async def prometheus(request: Request) -> Response:
        return Response(await metrics_text(rq), media_type=PROMETHEUS_CONTENT_TYPE)

    async def fairq_error(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(f"400: {exc}", status_code=400)

    routes = [
        Route("/", index),
        Route("/api/overview", api_overview),
        Route("/queues/{env}/{queue:path}", queue_page),
        Route("/api/queues/{env}/{queue:path}", api_queue),
        Route("/envs/{env}/dlq/{run_id}/redrive", redrive, methods=["POST"]),
        Route("/metrics", prometheus),
        Mount("/static", StaticFiles(packages=[(_PACKAGE, "static")]), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={FairqError: fairq_error})
    if token:
        app.add_middleware(TokenMiddleware, token=token)
    hosts = list(allowed_hosts) if allowed_hosts is not None else None
    if hosts is None and not token:
        hosts = list(LOOPBACK_HOSTS)
    if hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    return app


def create_server(
    rq: RunQueue, *, host: str = "127.0.0.1", port: int = 8765, token: str | None = None
) -> uvicorn.Server:
    """A ``uvicorn.Server`` for the dashboard; run it with ``await server.serve()`` on the
    loop that owns ``rq`` and stop it with ``server.should_exit = True`` (e.g. from
    ``fairq demo --dashboard``)."""
    config = uvicorn.Config(
        create_app(rq, token=token), host=host, port=port, log_level="warning", lifespan="off"
    )
    return uvicorn.Server(config)


__all__ = [
    "ServedSampler",
    "TokenMiddleware",
    "create_app",
    "create_server",
    "format_wait",
    "metrics_text",
    "overview",
    "queue_detail",
    "served_share",
]

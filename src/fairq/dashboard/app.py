"""The live dashboard: a Starlette app over one :class:`~fairq.store.RunQueue`.

Pages are rendered on the server (Jinja2) with the numbers of the moment, then a little
vanilla JS (``static/dashboard.js``, shipped in the package: no CDN) polls a JSON endpoint
every 1.5 s and updates them in place, and draws the served-share chart on a canvas.

Routes
------
``GET /``                               environments and their queues (Queued | Running…)
``GET /api/overview``                   the same, as JSON
``GET /queues/{env}/{queue}``           one queue: CK variants, the env's DLQ, served share
                                        (per tenant, from the dequeue scripts' history),
                                        received vs entitled per tenant
``GET /api/queues/{env}/{queue}``       the same, as JSON
``POST /envs/{env}/dlq/{run}/redrive``  move a dead-lettered run back to its queue
``GET /api/queues/{env}/{queue}/charts`` the last hour per minute (throughput, run time,
                                        wait, dead letters), from the queue's history
``GET /runs?run=ID[&env=E]``            find a run by id (every environment without ``env``)
``GET /runs/{env}/{run}``               one run: payload, attempts, error and traceback
``GET /api/runs/{env}/{run}``           the same, as JSON
``POST /envs/{env}/actions/{action}``   pause, resume, cancel, redrive, redrive_all,
                                        delete, limits, key_weight, key_cap,
                                        tenant_weight, tenant_cap (form fields below);
                                        confirmed in the page, audited (:mod:`.audit`)
``GET /metrics``                        Prometheus text format
``GET /static/...``                     the JS and CSS

Names in URLs are percent-encoded whole (``quote(name, safe="")``): a queue called
``a/../jobs`` is ``/queues/org%3Aproj%3Aprod/a%2F..%2Fjobs``, one path segment a browser
never resolves to another queue's page. Unencoded slashes in a queue name are accepted
too (``/queues/org:proj:prod/video/encode``).

While the server is unreachable (refused, or not answering within ``store_timeout_s``)
pages answer 503 with a page that retries by itself, JSON endpoints and ``/metrics`` 503
with the reason; the dashboard reconnects on its own when the server is back.

The parts: :mod:`~fairq.dashboard.views` (what is shown), :mod:`~fairq.dashboard.served`
(served share), :mod:`~fairq.dashboard.shares` (received vs entitled),
:mod:`~fairq.dashboard.prometheus` (``/metrics``) and
:mod:`~fairq.dashboard.security` (token, cross-site refusal, headers, body cap).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import jinja2
import uvicorn
from redis.exceptions import ClusterDownError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from fairq.dashboard import audit
from fairq.dashboard.prometheus import PROMETHEUS_CONTENT_TYPE, metrics_text
from fairq.dashboard.security import (
    LOOPBACK_HOSTS,
    MAX_BODY_BYTES,
    TOKEN_COOKIE,
    BodyLimitMiddleware,
    CrossSiteMiddleware,
    SecurityHeadersMiddleware,
    TokenMiddleware,
    local_path,
)
from fairq.dashboard.shares import format_amount, format_ratio
from fairq.dashboard.views import (
    find_run,
    format_wait,
    load_charts,
    load_overview,
    load_queue_detail,
    run_to_json,
)
from fairq.errors import FairqError, InvalidLimitError, RunNotFoundError, ServerUnavailableError
from fairq.keys import Environment
from fairq.models import CancelOutcome
from fairq.outcomes import RunStatus
from fairq.store import RunQueue
from fairq.store.admin import Change, queue_option
from fairq.store.readers import MAX_DEAD_LETTERS

#: Seconds a request waits for the server before the dashboard calls it unreachable.
STORE_TIMEOUT_S: Final = 10.0
#: Seconds after which the "not answering" page reloads itself (and ``Retry-After``).
RETRY_AFTER_S: Final = 5

_PACKAGE: Final = "fairq.dashboard"
_log = logging.getLogger("fairq.dashboard")
T = TypeVar("T")

#: Errors that mean "the server is not reachable right now" (503, not 500).
UNAVAILABLE_ERRORS: Final[tuple[type[Exception], ...]] = (
    ServerUnavailableError,
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    ConnectionError,
    TimeoutError,
)


# ---------------------------------------------------------------------- URLs


def urlpart(value: object) -> str:
    """One path segment: every character that is not unreserved percent-encoded."""
    return quote(str(value), safe="")


def queue_path(env: str, queue: str) -> str:
    """The page of a queue (``env`` is the ``org:project:env`` id)."""
    return f"/queues/{urlpart(env)}/{urlpart(queue)}"


def queue_api_path(env: str, queue: str) -> str:
    """The JSON of a queue's page."""
    return f"/api/queues/{urlpart(env)}/{urlpart(queue)}"


def redrive_path(env: str, run_id: str) -> str:
    """Where the redrive button of a dead letter posts."""
    return f"/envs/{urlpart(env)}/dlq/{urlpart(run_id)}/redrive"


def run_path(env: str, run_id: str) -> str:
    """The page of a run."""
    return f"/runs/{urlpart(env)}/{urlpart(run_id)}"


def action_path(env: str, action: str) -> str:
    """Where an action's form posts."""
    return f"/envs/{urlpart(env)}/actions/{action}"


#: The actions ``POST /envs/{env}/actions/{action}`` takes.
ACTIONS: Final = (
    "pause", "resume", "cancel", "redrive", "redrive_all", "delete", "limits", "key_weight",
    "key_cap", "tenant_weight", "tenant_cap",
)  # fmt: skip
#: Words of a limit field that remove the setting.
CLEAR_WORDS: Final = ("none", "unset", "default")
#: Dead letters one "redrive all" moves at most (the rest: press again).
MAX_REDRIVE_ALL: Final = 10_000
#: Dead letters a ``redrive_all`` reads more per round.
REDRIVE_PAGE = 500


class ActionError(Exception):
    """A form that cannot be applied (400 with the reason)."""


def _field(form: dict[str, list[str]], name: str, *, required: bool = True) -> str:
    value = (form.get(name) or [""])[0].strip()
    if required and not value:
        raise ActionError(f"missing field {name!r}")
    return value


def _number(raw: str, name: str, kind: type[int] | type[float]) -> int | float | None:
    """A form number; '' or a clear word removes the setting (None)."""
    if raw.lower() in CLEAR_WORDS:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ActionError(f"{name}: {raw!r} is not a number or 'none'") from None


def _who(request: Request, token: str | None) -> str:
    peer = request.scope.get("client")  # (host, port) of the connection
    host = str(peer[0]) if peer else "?"
    return f"dashboard {host}" + (" (token)" if token else " (loopback)")


def display_url(url: str) -> str:
    """A server URL fit to show: the host, port and path the client connects to, without
    user name, password, query (which may hold a password) or fragment."""
    parts = urlsplit(url)
    if not parts.scheme:
        return parts.netloc.rpartition("@")[2] + parts.path
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


# ---------------------------------------------------------------------- the actions

#: What an action did: (status, flash, audit target, audit detail).
_ActionResult = tuple[int, str, str, str]
_ActionHandler = Callable[
    [RunQueue, Environment, str, dict[str, list[str]]], Awaitable[_ActionResult]
]


async def _apply_action(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """Do one action; returns (status, flash, audit target, audit detail)."""
    handler = _ACTION_HANDLERS.get(action)
    if handler is None:
        raise ActionError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    return await handler(rq, env, action, form)


async def _pause_or_resume(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``pause`` or ``resume`` the form's ``queue`` (its limits are kept)."""
    queue = _field(form, "queue")
    await rq.configure(env, [queue_option(queue, "paused", True if action == "pause" else None)])
    return 200, f"{queue}: {action}d (its limits are kept)", f"queue {queue}", ""


async def _redrive_run(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``redrive``: move the dead letter ``run`` back to its queue (404 once it is gone)."""
    run_id = _field(form, "run")
    try:
        await rq.redrive(env, run_id)
    except RunNotFoundError:
        return 404, f"{run_id} is no longer in the dead-letter queue", "", ""
    return 200, f"redriven {run_id}", f"run {run_id}", ""


async def _cancel_run(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``cancel`` the queued run ``run``, or ``delete`` the dead letter ``run``."""
    run_id = _field(form, "run")
    # one script call that acts only if the run is still where the page showed
    # it: a dead letter redriven, or a queued run started, meanwhile is left alone
    wanted = RunStatus.DEAD_LETTERED if action == "delete" else RunStatus.QUEUED
    outcome = await rq.cancel(env, run_id, only_if=wanted)
    if action == "delete" and not outcome.cancelled:
        return 404, f"{run_id} is not in the dead-letter queue", "", ""
    if not outcome.cancelled:
        return 409, f"{run_id} is not queued: nothing to cancel", "", ""
    done_word = "deleted" if outcome is CancelOutcome.REMOVED_FROM_DLQ else "cancelled"
    return 200, f"{done_word} {run_id}", f"run {run_id}", ""


async def _redrive_all(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``redrive_all``: the env's dead letters (of ``queue`` only, when given)."""
    queue = _field(form, "queue", required=False)
    done = await _redrive_dead_letters(rq, env, queue)
    scope = f"queue {queue}" if queue else "every queue"
    return 200, f"redriven {done} dead letter(s)", scope, f"{done} run(s)"


async def _redrive_dead_letters(rq: RunQueue, env: Environment, queue: str) -> int:
    """Redrive up to :data:`MAX_REDRIVE_ALL` dead letters (of ``queue`` only, unless it is
    ''), oldest first, :data:`REDRIVE_PAGE` more read at a time; returns how many were
    redriven. Dead letters of other queues stay first in the list, so each read reaches
    past those it has passed over (up to :data:`MAX_DEAD_LETTERS` in one read)."""
    done, seen, passed = 0, set(), 0
    while done < MAX_REDRIVE_ALL:
        limit = min(MAX_DEAD_LETTERS, passed + REDRIVE_PAGE)
        fresh = [d for d in await rq.dead_letters(env, limit=limit) if d.run_id not in seen]
        if not fresh:
            break
        for d in fresh:
            seen.add(d.run_id)
            if queue and d.queue != queue:
                passed += 1
                continue
            try:
                await rq.redrive(env, d.run_id)
                done += 1
            except RunNotFoundError:
                pass  # redriven or deleted by someone else meanwhile
    return done


async def _set_limits(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``limits``: set or remove the ``queue``'s options filled in on the form."""
    queue = _field(form, "queue")
    changes, said = _limit_changes(queue, form)
    if not changes:
        raise ActionError("nothing to change: fill in at least one field")
    await rq.configure(env, changes)
    return 200, f"{queue}: " + ", ".join(said), f"queue {queue}", ", ".join(said)


def _limit_changes(queue: str, form: dict[str, list[str]]) -> tuple[list[Change], list[str]]:
    """The changes the limits form asks of ``queue``, and how each is said in the flash."""
    changes: list[Change] = []
    said: list[str] = []
    for name, kind in (("concurrency", int), ("max_size", int), ("total", int),
                       ("max_per_key", int)):  # fmt: skip
        raw = _field(form, name, required=False)
        if raw:
            value = _number(raw, name, kind)
            changes.append(queue_option(queue, name, value))
            said.append(f"{name} {'removed' if value is None else value}")
    for name in ("order", "charge"):
        raw = _field(form, name, required=False).lower()
        if raw:
            changes.append(queue_option(queue, name, None if raw in CLEAR_WORDS else raw))
            said.append(f"{name} {raw}")
    return changes, said


async def _set_key_option(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``key_weight`` or ``key_cap``: a concurrency key's weight or cap in ``queue``."""
    queue, key = _field(form, "queue"), _field(form, "key")
    raw = _field(form, "value")
    if action == "key_weight":
        weight = _number(raw, "weight", float)
        await rq.set_concurrency_key_weight(env, queue, key, weight)
        detail = f"weight {'1 (reset)' if weight is None else f'{weight:g}'}"
    else:
        cap = _number(raw, "cap", int)
        await rq.set_key_concurrency(env, queue, key, None if cap is None else int(cap))
        detail = f"cap {'removed' if cap is None else cap}"
    return 200, f"{queue} key {key}: {detail}", f"queue {queue} key {key}", detail


async def _set_tenant_option(
    rq: RunQueue, env: Environment, action: str, form: dict[str, list[str]]
) -> _ActionResult:
    """``tenant_weight`` (env-wide) or ``tenant_cap`` (in ``queue``) of a tenant."""
    tenant, raw = _field(form, "tenant"), _field(form, "value")
    if action == "tenant_weight":
        weight = _number(raw, "weight", float)
        await rq.set_tenant_weight(env, tenant, weight)
        detail = f"weight {'1 (reset)' if weight is None else f'{weight:g}'}"
        return 200, f"tenant {tenant}: {detail}", f"tenant {tenant}", detail
    queue = _field(form, "queue")
    cap = _number(raw, "cap", int)
    await rq.set_tenant_concurrency(env, queue, tenant, None if cap is None else int(cap))
    detail = f"cap {'removed' if cap is None else cap}"
    return (
        200,
        f"{queue} tenant {tenant}: {detail}",
        f"queue {queue} tenant {tenant}",
        detail,
    )


#: The function that does each of :data:`ACTIONS`.
_ACTION_HANDLERS: Final[dict[str, _ActionHandler]] = {
    "pause": _pause_or_resume,
    "resume": _pause_or_resume,
    "cancel": _cancel_run,
    "delete": _cancel_run,
    "redrive": _redrive_run,
    "redrive_all": _redrive_all,
    "limits": _set_limits,
    "key_weight": _set_key_option,
    "key_cap": _set_key_option,
    "tenant_weight": _set_tenant_option,
    "tenant_cap": _set_tenant_option,
}


# ---------------------------------------------------------------------- the app


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(_PACKAGE, "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["urlpart"] = urlpart
    env.filters["wait"] = format_wait
    env.filters["limit"] = lambda value: "—" if value is None else str(value)
    env.filters["amount"] = format_amount
    env.filters["ratio"] = format_ratio
    env.globals.update(
        queue_path=queue_path, queue_api_path=queue_api_path, redrive_path=redrive_path,
        run_path=run_path, action_path=action_path,
    )  # fmt: skip
    return Jinja2Templates(env=env)


def _env_param(request: Request) -> Environment:
    return Environment.parse(request.path_params["env"])


def _accepts_json(request: Request) -> bool:
    """Whether the client asked for JSON (``Accept: application/json``)."""
    return request.headers.get("accept", "").startswith("application/json")


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or _accepts_json(request)


async def _read_form(request: Request) -> tuple[dict[str, list[str]], str]:
    """A POST's urlencoded form (parsed here so the app needs no python-multipart) and
    the local path to go back to (its ``next`` field, ``/`` when missing or not local)."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    back = local_path((form.get("next") or ["/"])[0]) or "/"
    return form, back


def _back_with_flash(back: str, flash: str) -> Response:
    """303 back to the page a form came from, with the message to show there."""
    sep = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{sep}flash={quote(flash)}", status_code=303)


class _Dashboard(Starlette):
    """Starlette with :class:`SecurityHeadersMiddleware` outside everything, so even a
    500 from Starlette's own error middleware carries the security headers."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeadersMiddleware(super().build_middleware_stack())


@dataclass(frozen=True)
class _Context:
    """What the handlers share: the queue, the token, the templates, the server timeout."""

    rq: RunQueue
    token: str | None
    templates: Jinja2Templates
    store_timeout_s: float

    async def within(self, work: Awaitable[T]) -> T:
        """Await ``work``, for at most ``store_timeout_s`` (then ``TimeoutError``: a 503)."""
        async with asyncio.timeout(self.store_timeout_s):
            return await work

    def page(
        self, name: str, request: Request, context: dict[str, Any], status: int = 200
    ) -> Response:
        """The template ``name`` rendered with ``context``."""
        return self.templates.TemplateResponse(request, name, context, status_code=status)


@dataclass(frozen=True)
class _QueueViews:
    """The GET handlers of the overview, a queue's page and charts, and ``/metrics``."""

    ctx: _Context

    async def index(self, request: Request) -> Response:
        """``GET /``: the environments and their queues."""
        data = (await self.ctx.within(load_overview(self.ctx.rq, backlog=True))).to_json()
        return self.ctx.page("index.html", request, {"data": data})

    async def api_overview(self, request: Request) -> Response:
        """``GET /api/overview``: the same, as JSON."""
        overview = await self.ctx.within(load_overview(self.ctx.rq, backlog=True))
        return JSONResponse(overview.to_json())

    async def queue_page(self, request: Request) -> Response:
        """``GET /queues/{env}/{queue}``: one queue, with the env's audit trail."""
        env, queue = _env_param(request), request.path_params["queue"]
        data = (await self.ctx.within(load_queue_detail(self.ctx.rq, env, queue))).to_json()
        flash = request.query_params.get("flash")
        trail = await self.ctx.within(audit.entries(self.ctx.rq, env))
        return self.ctx.page("queue.html", request, {"data": data, "flash": flash, "audit": trail})

    async def api_queue(self, request: Request) -> Response:
        """``GET /api/queues/{env}/{queue}``: one queue, as JSON."""
        env, queue = _env_param(request), request.path_params["queue"]
        detail = await self.ctx.within(load_queue_detail(self.ctx.rq, env, queue))
        return JSONResponse(detail.to_json())

    async def api_charts(self, request: Request) -> Response:
        """``GET /api/queues/{env}/{queue}/charts``: the queue's last hour per minute."""
        env, queue = _env_param(request), request.path_params["queue"]
        return JSONResponse(await self.ctx.within(load_charts(self.ctx.rq, env, queue)))

    async def prometheus(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text format."""
        text = await self.ctx.within(metrics_text(self.ctx.rq))
        return Response(text, media_type=PROMETHEUS_CONTENT_TYPE)


@dataclass(frozen=True)
class _RunViews:
    """The GET handlers of runs: search by id, a run's page and its JSON."""

    ctx: _Context

    async def search(self, request: Request) -> Response:
        """``GET /runs?run=ID[&env=E]``: 303 to the run's page, or the search page (404)."""
        run_id = request.query_params.get("run", "").strip()
        raw_env = request.query_params.get("env", "").strip()
        env = Environment.parse(raw_env) if raw_env else None
        found = await self.ctx.within(find_run(self.ctx.rq, run_id, env)) if run_id else None
        if found is not None:
            return RedirectResponse(run_path(found[0].id, run_id), status_code=303)
        context = {"run_id": run_id, "env": raw_env, "info": None, "flash": None}
        return self.ctx.page("run.html", request, context, status=404 if run_id else 200)

    async def run_with_position(self, env: Environment, run_id: str) -> dict[str, Any] | None:
        """A run's JSON, with where it stands while it is queued (``position``)."""
        info = await self.ctx.within(self.ctx.rq.get_run(env, run_id))
        if info is None:
            return None
        position = None
        if info.status is RunStatus.QUEUED:
            position = await self.ctx.within(self.ctx.rq.run_position(env, run_id))
        return {**run_to_json(info), "position": position and position.to_json()}

    async def run_page(self, request: Request) -> Response:
        """``GET /runs/{env}/{run}``: one run (404 when unknown)."""
        env, run_id = _env_param(request), request.path_params["run_id"]
        info = await self.run_with_position(env, run_id)
        context = {
            "run_id": run_id, "env": env.id, "flash": request.query_params.get("flash"),
            "info": info,
        }  # fmt: skip
        return self.ctx.page("run.html", request, context, status=200 if info else 404)

    async def api_run(self, request: Request) -> Response:
        """``GET /api/runs/{env}/{run}``: one run, as JSON (404 when unknown)."""
        env, run_id = _env_param(request), request.path_params["run_id"]
        info = await self.run_with_position(env, run_id)
        if info is None:
            return JSONResponse({"run_id": run_id, "error": "unknown run"}, status_code=404)
        return JSONResponse(info)


@dataclass(frozen=True)
class _Posts:
    """The POST handlers: the actions and the dead-letter redrive button, both audited.

    Cross-site posts never get here (CrossSiteMiddleware); with a token, neither do
    requests without it (TokenMiddleware)."""

    ctx: _Context

    async def action(self, request: Request) -> Response:
        """``POST /envs/{env}/actions/{action}``: do it, then 303 back (or JSON)."""
        env, name = _env_param(request), request.path_params["action"]
        form, back = await _read_form(request)
        try:
            status, flash, target, detail = await self.ctx.within(
                _apply_action(self.ctx.rq, env, name, form)
            )
        except (ActionError, InvalidLimitError) as exc:
            status, flash, target, detail = 400, str(exc), "", ""
        if status == 200:
            await self.ctx.within(audit.record(
                self.ctx.rq, env, who=_who(request, self.ctx.token), action=name,
                target=target, detail=detail,
            ))  # fmt: skip
        if _accepts_json(request):
            return JSONResponse({"action": name, "ok": status == 200, "message": flash},
                                status_code=status)  # fmt: skip
        return _back_with_flash(back, flash)

    async def redrive(self, request: Request) -> Response:
        """``POST /envs/{env}/dlq/{run}/redrive``: redrive a dead letter, 303 back (or JSON)."""
        env, run_id = _env_param(request), request.path_params["run_id"]
        _, back = await _read_form(request)
        try:
            await self.ctx.within(self.ctx.rq.redrive(env, run_id))
            status, flash = 200, f"redriven {run_id}"
        except RunNotFoundError:
            status, flash = 404, f"{run_id} is no longer in the dead-letter queue"
        if status == 200:
            await self.ctx.within(audit.record(
                self.ctx.rq, env, who=_who(request, self.ctx.token), action="redrive",
                target=f"run {run_id}",
            ))  # fmt: skip
        if _accepts_json(request):
            return JSONResponse({"run_id": run_id, "redriven": status == 200}, status_code=status)
        return _back_with_flash(back, flash)


def _unavailable_text(shown_url: str | None) -> str:
    """What the 503s say: the server (as :func:`display_url` shows it) is not answering."""
    if shown_url:
        return f"the fairq server at {shown_url} is not answering; retrying"
    return "the fairq server is not answering; retrying"


@dataclass
class _Unavailable:
    """The 503 answer while the server is unreachable: JSON, text for ``/metrics``, or a
    page that reloads itself; logged at most once per 30 s."""

    ctx: _Context
    shown_url: str | None
    text: str
    retry_after_s: int
    last_logged: float = 0.0

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        """The exception handler of :data:`UNAVAILABLE_ERRORS`."""
        self._log(exc)
        headers = {"Retry-After": str(self.retry_after_s)}
        if _wants_json(request):
            body = {
                "error": "server_unavailable",
                "detail": self.text,
                "server": self.shown_url,
                "retry_after_s": self.retry_after_s,
            }
            return JSONResponse(body, status_code=503, headers=headers)
        if request.url.path == "/metrics":
            return PlainTextResponse(f"503: {self.text}", status_code=503, headers=headers)
        context = {"message": self.text, "retry_after_s": self.retry_after_s}
        response = self.ctx.page("unavailable.html", request, context, status=503)
        response.headers.update(headers)
        return response

    def _log(self, exc: Exception) -> None:
        """One warning line per 30 s, not one per poll."""
        now = time.monotonic()
        if now - self.last_logged >= 30:
            self.last_logged = now
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            _log.warning("%s (%s)", self.text, reason)


async def _fairq_error(request: Request, exc: Exception) -> Response:
    """A :class:`~fairq.errors.FairqError` (a bad name, a bad limit...): 400 with it."""
    return PlainTextResponse(f"400: {exc}", status_code=400)


def _check_options(store_timeout_s: float, retry_after_s: int, max_body_bytes: int) -> None:
    """Raise ``ValueError`` for a :func:`create_app` option out of range."""
    if store_timeout_s <= 0:
        raise ValueError(f"store_timeout_s must be positive, got {store_timeout_s!r}")
    if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int) or retry_after_s < 1:
        raise ValueError(f"retry_after_s must be a whole number >= 1, got {retry_after_s!r}")
    if max_body_bytes < 0:
        raise ValueError(f"max_body_bytes must be >= 0, got {max_body_bytes!r}")


def _routes(ctx: _Context) -> list[BaseRoute]:
    """Every route of the dashboard, in matching order (``/charts`` before its queue)."""
    views, runs, posts = _QueueViews(ctx), _RunViews(ctx), _Posts(ctx)
    return [
        Route("/", views.index),
        Route("/api/overview", views.api_overview),
        Route("/queues/{env}/{queue:path}", views.queue_page),
        Route("/api/queues/{env}/{queue:path}/charts", views.api_charts),
        Route("/api/queues/{env}/{queue:path}", views.api_queue),
        Route("/runs", runs.search),
        Route("/runs/{env}/{run_id}", runs.run_page),
        Route("/api/runs/{env}/{run_id}", runs.api_run),
        Route("/envs/{env}/dlq/{run_id}/redrive", posts.redrive, methods=["POST"]),
        Route("/envs/{env}/actions/{action}", posts.action, methods=["POST"]),
        Route("/metrics", views.prometheus),
        Mount("/static", StaticFiles(packages=[(_PACKAGE, "static")]), name="static"),
    ]


def _middleware(
    token: str | None, allowed_hosts: Sequence[str] | None, max_body_bytes: int
) -> list[Middleware]:
    """The middleware, outermost first: trusted hosts (loopback names only without a
    token, unless ``allowed_hosts`` says otherwise), body cap, cross-site refusal, token."""
    hosts = list(allowed_hosts) if allowed_hosts is not None else None
    if hosts is None and not token:
        hosts = list(LOOPBACK_HOSTS)
    middleware: list[Middleware] = []
    if hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=hosts))
    middleware.append(Middleware(BodyLimitMiddleware, max_bytes=max_body_bytes))
    middleware.append(Middleware(CrossSiteMiddleware))
    if token:
        middleware.append(Middleware(TokenMiddleware, token=token))
    return middleware


def _exception_handlers(unavailable: _Unavailable) -> dict[Any, Any]:
    """400 for a :class:`~fairq.errors.FairqError`, 503 for :data:`UNAVAILABLE_ERRORS`."""
    handlers: dict[Any, Any] = {FairqError: _fairq_error}
    handlers.update(dict.fromkeys(UNAVAILABLE_ERRORS, unavailable.unavailable))
    return handlers


def create_app(
    rq: RunQueue,
    *,
    token: str | None,
    allowed_hosts: Sequence[str] | None = None,
    server_url: str | None = None,
    store_timeout_s: float = STORE_TIMEOUT_S,
    retry_after_s: int = RETRY_AFTER_S,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The dashboard app for one queue connection.

    Args:
        rq: the queue to show (its client must belong to the server's event loop).
        token: when set, every request must carry it (see :mod:`fairq.dashboard.security`).
        allowed_hosts: Host headers to answer; default: any with a token, loopback
            names only without one.
        server_url: the server ``rq`` talks to, named on the "not answering" page
            (credentials are never shown).
        store_timeout_s: how long a request waits for the server before answering 503.
        retry_after_s: how soon the "not answering" page reloads itself (``Retry-After``).
        max_body_bytes: largest request body accepted (413 beyond).

    Returns:
        A Starlette app; serve it with uvicorn (``fairq dashboard`` does).
    """
    _check_options(store_timeout_s, retry_after_s, max_body_bytes)
    ctx = _Context(rq=rq, token=token, templates=_templates(), store_timeout_s=store_timeout_s)
    shown_url = display_url(server_url) if server_url else None
    unavailable = _Unavailable(
        ctx, shown_url=shown_url, text=_unavailable_text(shown_url), retry_after_s=retry_after_s
    )
    return _Dashboard(
        routes=_routes(ctx),
        middleware=_middleware(token, allowed_hosts, max_body_bytes),
        exception_handlers=_exception_handlers(unavailable),
    )


def create_server(
    rq: RunQueue,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    **app_options: Any,
) -> uvicorn.Server:
    """A ``uvicorn.Server`` for the dashboard; run it with ``await server.serve()`` on the
    loop that owns ``rq`` and stop it with ``server.should_exit = True`` (e.g. from
    ``fairq demo --dashboard``). ``app_options`` go to :func:`create_app`
    (``server_url``, ``store_timeout_s``...)."""
    app = create_app(rq, token=token, **app_options)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    return uvicorn.Server(config)


__all__ = [
    "RETRY_AFTER_S",
    "STORE_TIMEOUT_S",
    "TOKEN_COOKIE",
    "UNAVAILABLE_ERRORS",
    "action_path",
    "create_app",
    "create_server",
    "display_url",
    "queue_api_path",
    "queue_path",
    "redrive_path",
    "run_path",
]

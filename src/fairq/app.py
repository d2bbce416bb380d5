"""The app: one environment, its tasks, and a connection per event loop.

::

    from fairq import Fairq, RetryPolicy

    app = Fairq(env="acme:shop:prod", fair=True)

    @app.task(queue="emails", concurrency_limit=10, retry=RetryPolicy(max_attempts=5))
    async def send_email(payload: dict) -> str:
        ...
        return "sent"

    handle = await send_email.trigger({"to": "a@b.c"}, concurrency_key="user-42",
                                      tenant="acme")
    print(await handle.wait(timeout=30))        # "sent"

Tasks, triggers and handles live in :mod:`fairq.tasks`; outcomes in
:mod:`fairq.outcomes`; the blocking facade in :mod:`fairq.sync`; workers in
:mod:`fairq.worker`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeVar, overload

from fairq.config import RetryPolicy, RunQueueConfig
from fairq.errors import ConfigurationError, short
from fairq.keys import Environment
from fairq.models import CancelOutcome
from fairq.outcomes import RunInfo, RunStatus
from fairq.server import connect, heal_shared_server_async, resolve_url
from fairq.store import RunPosition, RunQueue, wall_clock_ms
from fairq.sync import SyncFacade
from fairq.tasks import Duration, Task, TenantFrom, to_ms

#: Default environment of an app that names none.
DEFAULT_ENV = "local:app:dev"
#: Default retention of run outcomes (results and errors), seconds.
DEFAULT_RESULT_TTL_SECONDS = 86_400

P = TypeVar("P")
R = TypeVar("R")

CatchUp = Literal["none", "latest", "all"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A periodic trigger of a task (see :meth:`Fairq.schedule`).

    Attributes:
        name: unique per app; each tick of a schedule is enqueued exactly once.
        task: the task it triggers.
        cron: a cron expression (5 fields), or None for an interval schedule.
        every_ms: the interval, for an interval schedule.
        timezone: the cron expression's time zone (IANA name).
        payload: the payload of every run.
        concurrency_key / tenant: the runs' key and tenant.
        catch_up: after downtime, enqueue no missed tick (``none``), the latest missed
            one (``latest``) or every missed one (``all``, at most ``max_catch_up``).
        max_catch_up: the most missed ticks ``all`` enqueues.
        priority: the runs' priority level (None: the task's).
    """

    name: str
    task: Task[Any, Any]
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    payload: Any = None
    concurrency_key: str | None = None
    tenant: str | None = None
    catch_up: CatchUp = "latest"
    max_catch_up: int = 100
    priority: int | None = None


class _TaskDecorator(Protocol):
    @overload
    def __call__(self, fn: Callable[[P], Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[[P], R], /) -> Task[P, R]: ...


def _queue_options(
    *,
    fair: bool | None,
    max_per_key_per_call: int | None,
    total_concurrency: int | None,
    rate: str | float | None,
    charge: Literal["count", "duration"] | None,
    priority_levels: int | None,
    max_wait_promote: Duration | None,
) -> dict[str, object]:
    """The queue options a task's keyword options set (by their store names), for a
    starting worker to write on the server; a bad ``rate`` raises here."""
    options: dict[str, object] = {}
    if fair is not None:
        options["order"] = "fair" if fair else "age"
    if max_per_key_per_call is not None:
        options["max_per_key"] = max_per_key_per_call
    if total_concurrency is not None:
        options["total"] = total_concurrency
    if charge is not None:
        options["charge"] = charge
    if priority_levels is not None:
        options["priority_levels"] = priority_levels
    if max_wait_promote is not None:
        options["max_wait_promote"] = (
            max_wait_promote.total_seconds()
            if isinstance(max_wait_promote, timedelta)
            else max_wait_promote
        )
    if rate is not None:
        from fairq.store.options import parse_rate

        options["rate"] = parse_rate(rate)
    return options


class Fairq:
    """A fairq application: one environment, its tasks, and a connection per event loop.

    Args:
        env: ``org:project:env``; concurrency limits, queues and dead letters are per env.
        url: the server (``redis://…``, ``unix://…``); default ``FAIRQ_REDIS_URL``, else the
            user's shared embedded server (started on first need).
        config: store options (default: :meth:`RunQueueConfig.from_env`, i.e. ``FAIRQ_*``).
        fair: the fair order for this app's queues. A worker writes it on the server as
            the environment's order when the environment has none, so every process
            agrees (``fairq limits`` can change it at any time).
        result_ttl_seconds: how long run outcomes (results, errors) are kept.
        eager: run triggered tasks at once, in this process, without a server (unit
            tests); the handle then holds the result or the error (see
            :func:`fairq.tasks.run_eagerly` for what differs from a worker).
    """

    def __init__(
        self,
        env: str | Environment = DEFAULT_ENV,
        url: str | None = None,
        config: RunQueueConfig | None = None,
        *,
        fair: bool | None = None,
        result_ttl_seconds: int = DEFAULT_RESULT_TTL_SECONDS,
        eager: bool = False,
    ) -> None:
        self.env = env if isinstance(env, Environment) else Environment.parse(env)
        if url is not None and not isinstance(url, str):
            raise ConfigurationError(f"url must be a string, got {short(url)}")
        self.url = url
        config = config or RunQueueConfig.from_env()
        if not isinstance(config, RunQueueConfig):
            raise ConfigurationError("config must be a RunQueueConfig")
        if fair is not None:
            if not isinstance(fair, bool):
                raise ConfigurationError(f"fair must be True, False or None, got {short(fair)}")
            config = config.with_vtime(enabled=fair)
        if (
            isinstance(result_ttl_seconds, bool)
            or not isinstance(result_ttl_seconds, int)
            or not 1 <= result_ttl_seconds <= 365 * 86_400
        ):
            got = short(result_ttl_seconds)
            raise ConfigurationError(
                f"result_ttl_seconds must be an integer in 1..31536000, got {got}"
            )
        self.config = replace(config, outcome_ttl_seconds=result_ttl_seconds)
        self.fair = fair
        self.result_ttl_seconds = result_ttl_seconds
        if not isinstance(eager, bool):
            raise ConfigurationError("eager must be True or False")
        self.eager = eager
        #: Outcomes of eager runs by run id (the newest 10,000).
        self._eager_runs: dict[str, RunInfo] = {}
        #: Registered tasks by queue name.
        self.tasks: dict[str, Task[Any, Any]] = {}
        #: Registered schedules by name.
        self.schedules: dict[str, Schedule] = {}
        self._queues: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Task[RunQueue]
        ] = weakref.WeakKeyDictionary()
        self._resolved_url: str | None = None
        self.sync = SyncFacade(self)

    def __repr__(self) -> str:
        return f"<Fairq env={self.env.id} tasks={sorted(self.tasks)}>"

    # ------------------------------------------------------------------ tasks

    @overload
    def task(self, fn: Callable[[P], Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: Callable[[P], R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        queue: str | None = None,
        name: str | None = None,
        concurrency_limit: int | None = None,
        queue_size_limit: int | None = None,
        retry: RetryPolicy | None = None,
        ttl_ms: int | None = None,
        timeout: Duration | None = None,
        keep_result: bool | None = None,
        tenant_from: TenantFrom | None = None,
        schedule: str | Duration | None = None,
        fair: bool | None = None,
        max_per_key_per_call: int | None = None,
        total_concurrency: int | None = None,
        rate: str | float | None = None,
        charge: Literal["count", "duration"] | None = None,
        priority: int | None = None,
        priority_levels: int | None = None,
        max_wait_promote: Duration | None = None,
    ) -> _TaskDecorator: ...

    def task(
        self,
        fn: Callable[[Any], Any] | None = None,
        /,
        *,
        queue: str | None = None,
        name: str | None = None,
        concurrency_limit: int | None = None,
        queue_size_limit: int | None = None,
        retry: RetryPolicy | None = None,
        ttl_ms: int | None = None,
        timeout: Duration | None = None,
        keep_result: bool | None = None,
        tenant_from: TenantFrom | None = None,
        schedule: str | Duration | None = None,
        fair: bool | None = None,
        max_per_key_per_call: int | None = None,
        total_concurrency: int | None = None,
        rate: str | float | None = None,
        charge: Literal["count", "duration"] | None = None,
        priority: int | None = None,
        priority_levels: int | None = None,
        max_wait_promote: Duration | None = None,
    ) -> Any:
        """Register a task (``@app.task`` or ``@app.task(queue=..., ...)``).

        Args:
            queue: its queue (default: the function's name). One task per queue.
            name: display name (default: ``module.function``).
            concurrency_limit: the queue's concurrency limit (per concurrency key, when
                runs have keys); a worker writes it when it starts.
            queue_size_limit: cap on the queue's queued runs (written like the limit).
            retry: backoff and attempts (default: the app config's policy).
            ttl_ms: default TTL of its runs (ms): expire if not started in time.
            timeout: fail a run that runs longer than this (seconds); retries follow
                ``retry``.
            keep_result: keep completed runs' outcomes even without a result (None =
                keep results that are not None).
            tenant_from: derive a run's tenant: a callable of the payload, or
                ``"prefix:<sep>"`` (the concurrency key up to the first ``<sep>``).
            schedule: trigger the task periodically (payload None): a cron expression
                (UTC), or an interval in seconds / a timedelta. For a time zone, a
                payload, a key or a catch-up policy use :meth:`schedule`.
            fair / max_per_key_per_call / total_concurrency / rate / charge: the queue's
                order and limits, written on the server by a starting worker.
            priority: the priority level of its runs that give none (1 is the highest;
                default: the queue's middle level).
            priority_levels / max_wait_promote: the queue's number of priority levels
                (1..9, default 5) and the seconds a run waits before it moves up one
                level (default: never), written like the limits.

        Raises:
            ConfigurationError: the queue already has a task, or a bad option.
        """
        options = _queue_options(
            fair=fair, max_per_key_per_call=max_per_key_per_call,
            total_concurrency=total_concurrency, rate=rate, charge=charge,
            priority_levels=priority_levels, max_wait_promote=max_wait_promote,
        )  # fmt: skip

        def register(function: Callable[[Any], Any]) -> Task[Any, Any]:
            return self._register_task(
                function, queue=queue, name=name, concurrency_limit=concurrency_limit,
                queue_size_limit=queue_size_limit, retry=retry, ttl_ms=ttl_ms,
                timeout=timeout, keep_result=keep_result, tenant_from=tenant_from,
                options=options, priority=priority, schedule=schedule,
            )  # fmt: skip

        if fn is not None:
            return register(fn)
        return register

    def _register_task(
        self,
        function: Callable[[Any], Any],
        *,
        queue: str | None,
        name: str | None,
        concurrency_limit: int | None,
        queue_size_limit: int | None,
        retry: RetryPolicy | None,
        ttl_ms: int | None,
        timeout: Duration | None,
        keep_result: bool | None,
        tenant_from: TenantFrom | None,
        options: dict[str, object],
        priority: int | None,
        schedule: str | Duration | None,
    ) -> Task[Any, Any]:
        """Make ``function`` the task of its queue (what ``@app.task`` does to the
        function it decorates), and schedule it if ``schedule`` says so."""
        queue_name = queue or getattr(function, "__name__", None)
        if not queue_name:
            raise ConfigurationError("a task needs a queue name")
        if queue_name in self.tasks:
            raise ConfigurationError(
                f"queue {queue_name!r} already belongs to task {self.tasks[queue_name].name!r}"
            )
        task_name = name or f"{function.__module__}.{getattr(function, '__qualname__', queue_name)}"
        t: Task[Any, Any] = Task(
            self, function, name=task_name, queue=queue_name,
            concurrency_limit=concurrency_limit, queue_size_limit=queue_size_limit,
            retry=retry, ttl_ms=ttl_ms, timeout=timeout, keep_result=keep_result,
            tenant_from=tenant_from, options=options, priority=priority,
        )  # fmt: skip
        self.tasks[queue_name] = t
        if isinstance(schedule, str):
            self.schedule(t, cron=schedule)
        elif schedule is not None:
            self.schedule(t, every=schedule)
        return t

    def schedule(
        self,
        task: Task[Any, Any],
        *,
        cron: str | None = None,
        every: Duration | None = None,
        name: str | None = None,
        payload: Any = None,
        timezone: str = "UTC",
        concurrency_key: str | None = None,
        tenant: str | None = None,
        catch_up: CatchUp = "latest",
        max_catch_up: int = 100,
        priority: int | None = None,
    ) -> Schedule:
        """Trigger ``task`` periodically: on a cron expression, or every ``every`` seconds.
        Workers of the app enqueue each tick exactly once, however many run.

        Args:
            cron: a 5-field cron expression, read in ``timezone``.
            every: an interval (seconds or a timedelta, at least 1 s); ticks fall on
                multiples of it since the Unix epoch.
            name: unique per app (default ``<queue>@<cron>`` / ``<queue>@every<N>ms``);
                the server keeps each schedule's last tick under this name.
            payload / concurrency_key / tenant / priority: of every run it triggers.
            timezone: an IANA name (``Europe/Paris``); daylight-saving changes follow
                cron's rules (a skipped local time does not run, a repeated one once).
            catch_up: after a downtime, ``none`` skips the missed ticks, ``latest``
                (default) runs the latest of them, ``all`` runs each (at most
                ``max_catch_up``, the newest ones).

        The schedule's runs are checked here exactly as :meth:`Task.trigger` checks a
        run, so a schedule that is accepted can enqueue its ticks; its payload is
        copied (changing the object afterwards changes nothing).

        Raises:
            ConfigurationError: neither or both of cron / every, a bad cron expression,
                an unknown time zone, a duplicate name.
            InvalidLimitError: a name that is not 1..200 characters of text without ``:``.
            PayloadError: a payload that is not JSON-serialisable, too deep or too large.
            InvalidNameError: a concurrency key or tenant that cannot be a name.
        """
        from fairq.schedules import validate_schedule

        if not isinstance(task, Task) or task.app is not self:
            raise ConfigurationError("schedule() needs a task of this app")
        every_ms = to_ms("every", every)
        schedule_name = name or (
            f"{task.queue}@{cron}" if cron else f"{task.queue}@every{every_ms}ms"
        )
        s = validate_schedule(
            Schedule(
                name=schedule_name, task=task, cron=cron, every_ms=every_ms,
                timezone=timezone, payload=payload, concurrency_key=concurrency_key,
                tenant=tenant, catch_up=catch_up, max_catch_up=max_catch_up, priority=priority,
            )
        )  # fmt: skip
        if schedule_name in self.schedules:
            raise ConfigurationError(f"schedule {schedule_name!r} already exists")
        self.schedules[schedule_name] = s
        return s

    # ------------------------------------------------------------------ connection

    def use_server(self, url: str, *, prefix: str | None = None) -> None:
        """Point the app at another server (and optionally another key prefix), e.g. a
        test's private server. Call it before the app connects; an open connection of
        the running loop is dropped (close it first with :meth:`aclose`)."""
        if not isinstance(url, str) or not url:
            raise ConfigurationError(f"url must be a non-empty string, got {short(url)}")
        self.url = url
        self._resolved_url = None
        self._queues = weakref.WeakKeyDictionary()
        if prefix is not None:
            self.config = replace(self.config, prefix=prefix)

    async def resolved_url(self) -> str:
        """The server URL in use (resolving FAIRQ_REDIS_URL / the shared server once)."""
        if self._resolved_url is None:
            self._resolved_url = await asyncio.to_thread(resolve_url, self.url)
        return self._resolved_url

    async def heal(self) -> None:
        """After a lost connection: restart the shared server if it is ours and down (at
        the same address); clients reconnect by themselves on their next command."""
        if self._resolved_url is not None:
            await heal_shared_server_async(self._resolved_url)

    async def _open(self) -> RunQueue:
        return RunQueue(await connect(await self.resolved_url()), self.config)

    async def queue(self) -> RunQueue:
        """The :class:`RunQueue` of the running event loop (connected on first use)."""
        loop = asyncio.get_running_loop()
        pending = self._queues.get(loop)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = loop.create_task(self._open())
            self._queues[loop] = pending
        if pending.done():  # (connected: no shield to make)
            return pending.result()
        return await asyncio.shield(pending)

    async def aclose(self) -> None:
        """Close the running loop's connection (other loops' connections are unaffected)."""
        loop = asyncio.get_running_loop()
        pending = self._queues.pop(loop, None)
        if pending is not None and pending.done() and pending.exception() is None:
            await pending.result().close()

    def close(self) -> None:
        """Close the sync facade (blocking code's counterpart of :meth:`aclose`)."""
        self.sync.close()

    # ------------------------------------------------------------------ settings

    async def apply_limits(self) -> list[str]:
        """Write the tasks' declared queue limits and options, and the app's fair
        default (as the environment's order, when it has none); one line per change.

        A paused queue stays paused (pausing is a separate flag; limits are kept).
        """
        rq = await self.queue()
        done: list[str] = []
        if self.fair is not None:
            configured = await rq.env_order_setting(self.env)
            if configured is None:
                await rq.set_env_options(self.env, order="fair" if self.fair else "age")
                done.append(f"env {self.env}: order {'fair' if self.fair else 'age'}")
        for t in self.tasks.values():
            options = dict(t.options)
            if t.concurrency_limit is not None:
                options["concurrency"] = t.concurrency_limit
            if t.queue_size_limit is not None:
                options["max_size"] = t.queue_size_limit
            if options:
                await rq.set_queue_options(self.env, t.queue, **options)
                done.append(
                    f"{t.queue}: " + ", ".join(f"{k} {v}" for k, v in sorted(options.items()))
                )
        return done

    # ------------------------------------------------------------------ runs

    async def cancel(self, run_id: str, *, only_if: RunStatus | None = None) -> CancelOutcome:
        """Cancel a run: a queued run is never delivered, a dead-lettered one leaves the
        DLQ (either then reports ``cancelled``); a running run's worker is asked to stop
        it (``CANCEL_REQUESTED``), and it ends ``cancelled``.

        ``only_if`` (``QUEUED``, ``RUNNING`` or ``DEAD_LETTERED``): act only on a run in
        that state, checked in the same server call; otherwise nothing changes and the
        answer is ``NOT_IN_STATE`` (see :meth:`fairq.store.RunQueue.cancel`)."""
        if self.eager:
            known = run_id in self._eager_runs
            return CancelOutcome.ALREADY_FINISHED if known else CancelOutcome.UNKNOWN
        rq = await self.queue()
        return await rq.cancel(self.env, run_id, only_if=only_if)

    async def get_run(self, run_id: str) -> RunInfo | None:
        """A run's status and result or error; None when fairq knows nothing of it
        (never triggered, completed without a kept outcome, or its retention passed)."""
        if self.eager:
            return self._eager_runs.get(run_id)
        rq = await self.queue()
        return await rq.get_run(self.env, run_id)

    async def run_position(self, run_id: str) -> RunPosition | None:
        """Where a run stands: a queued run's runs ahead in its flow, its tenant's rank,
        the gates holding it and an estimated start; any other run its status (see
        :meth:`fairq.store.RunQueue.run_position`). None when fairq knows nothing of it."""
        if self.eager:
            info = self._eager_runs.get(run_id)
            return None if info is None else RunPosition.of_info(info, wall_clock_ms())
        rq = await self.queue()
        return await rq.run_position(self.env, run_id)


__all__ = ["DEFAULT_ENV", "Fairq", "Schedule"]

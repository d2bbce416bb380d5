"""The task API: an app object, tasks registered with a decorator, triggers, run status.

::

    from fairq import Fairq, RetryPolicy

    app = Fairq(env="acme:shop:prod")

    @app.task(queue="emails", concurrency_limit=10, retry=RetryPolicy(max_attempts=5))
    async def send_email(payload: dict) -> str:
        ...
        return "sent"

    handle = await send_email.trigger({"to": "a@b.c"}, concurrency_key="tenant-42")
    print(await handle.wait(timeout=30))        # "sent"

A task is a function (async, or plain and then run in a worker thread) taking the run's
JSON payload. Each task owns one queue (the queue name identifies the task to workers,
so the stored payload stays exactly what the caller passed). Workers
(:class:`fairq.worker.Worker`, ``fairq worker module:app``) run them.

Run status: while a run exists in the queue its state comes from the queue itself
(``queued``, ``running``, ``dead_lettered``). When it ends, the worker writes its outcome
(``completed`` with the result, ``failed`` with the error, ``dead_lettered``) to
``T:r:O:P:E:<run>`` (see :mod:`fairq.keys`) *before* acking it, kept for
``result_ttl_seconds``; runs that expired before delivery are copied from the shard's
expiry stream by workers (and looked up there directly as a fallback).

Every coroutine method has a blocking twin for non-async callers (``task.trigger_sync``,
``app.sync.get_run``); they run the async code on a private event-loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import inspect
import json
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar, overload

from fairq import keys as K
from fairq.config import RetryPolicy, RunQueueConfig
from fairq.errors import (
    ConfigurationError,
    FairqError,
    PayloadError,
    QueueSizeLimitExceededError,
)
from fairq.keys import Environment
from fairq.models import CancelOutcome, EnqueueRequest, EnqueueStatus
from fairq.server import connect, resolve_url
from fairq.store import RunQueue, encode_payload, wall_clock_ms

#: Default environment of an app that names none.
DEFAULT_ENV = "local:app:dev"
#: Default retention of run outcomes (results and errors), seconds.
DEFAULT_RESULT_TTL_SECONDS = 86_400
#: How many recent expiry-stream entries :meth:`Fairq.get_run` scans as a fallback.
EXPIRED_LOOKBACK = 2_000

R = TypeVar("R")
T = TypeVar("T")

#: What ``delay``, ``ttl`` and ``priority`` accept: seconds, or a timedelta.
Duration = float | int | timedelta


class RunStatus(enum.StrEnum):
    """Where a run is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Whether the run will not run again by itself (a dead letter can be redriven)."""
        return self in (
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.EXPIRED,
            RunStatus.DEAD_LETTERED,
            RunStatus.CANCELLED,
        )


#: Queue-side message states -> run status.
_STATE_STATUS = {
    "queued": RunStatus.QUEUED,
    "running": RunStatus.RUNNING,
    "dlq": RunStatus.DEAD_LETTERED,
}


class PermanentError(Exception):
    """Raise it from a task to fail the run now: no retry, no dead letter (status ``failed``)."""


class RunFailedError(FairqError):
    """:meth:`RunHandle.wait` found the run failed, expired or dead-lettered."""

    def __init__(self, run_id: str, status: RunStatus, error: str | None) -> None:
        self.run_id = run_id
        self.status = status
        self.error = error
        detail = f": {error}" if error else ""
        super().__init__(f"run {run_id!r} ended {status.value}{detail}")


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run's status and, once it ended, its result or error.

    Attributes:
        run_id: the run.
        status: see :class:`RunStatus`.
        queue: its queue (None when only the expiry stream knew it and had no queue).
        concurrency_key: its concurrency key, if any.
        attempts: failed attempts so far (0 for a run that never failed).
        result: the task's return value (JSON), for ``completed``.
        error: the last error (``ExcType: message``), for failures and retries.
        finished_at_ms: when it ended (wall clock, ms), for finished runs.
    """

    run_id: str
    status: RunStatus
    queue: str | None = None
    concurrency_key: str | None = None
    attempts: int = 0
    result: Any = None
    error: str | None = None
    finished_at_ms: int | None = None


def outcome_json(
    status: RunStatus,
    *,
    queue: str,
    concurrency_key: str | None,
    attempts: int,
    result_json: str = "null",
    error: str | None = None,
    finished_at_ms: int | None = None,
) -> str:
    """Encode a run outcome as stored in ``T:r:...`` (``result_json`` is already JSON)."""
    head = json.dumps(
        {
            "status": status.value,
            "queue": queue,
            "ck": concurrency_key,
            "attempts": attempts,
            "error": error,
            "finished_at": finished_at_ms,
        },
        separators=(",", ":"),
    )
    return head[:-1] + ',"result":' + result_json + "}"


def _ms(name: str, value: Duration | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"{name} must be a number of seconds or a timedelta, got {value!r}"
        )
    if seconds < 0:
        raise ConfigurationError(f"{name} must not be negative, got {value!r}")
    return round(seconds * 1000)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def new_run_id() -> str:
    """A fresh, unique run id."""
    return "run_" + uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class TriggerItem:
    """One run of :meth:`Task.trigger_many` with its own options (see :meth:`Task.trigger`)."""

    payload: Any = None
    concurrency_key: str | None = None
    delay: Duration | None = None
    ttl: Duration | None = None
    priority: Duration | None = None
    run_id: str | None = None


@dataclass(slots=True)
class RunHandle:
    """What a trigger returns: the run id, what the enqueue did, and ways to follow the run.

    Attributes:
        run_id: the run.
        task: its task.
        status: ``ENQUEUED``, ``DUPLICATE`` (the id existed: nothing changed) or
            ``REJECTED`` (batch triggers only: the queue was at its size limit).
        error: for ``REJECTED``, the :class:`QueueSizeLimitExceededError`.
    """

    run_id: str
    task: Task[Any]
    status: EnqueueStatus
    error: QueueSizeLimitExceededError | None = None

    @property
    def enqueued(self) -> bool:
        return self.status is EnqueueStatus.ENQUEUED

    @property
    def rejected(self) -> bool:
        return self.status is EnqueueStatus.REJECTED

    async def info(self) -> RunInfo | None:
        """The run's current status (see :meth:`Fairq.get_run`)."""
        return await self.task.app.get_run(self.run_id)

    async def wait(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline on the run, not one await
        *,
        poll_interval: float = 0.05,
    ) -> Any:
        """Wait until the run ends and return its result.

        Raises:
            RunFailedError: it failed, expired, was dead-lettered or cancelled.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = min(poll_interval, 0.01)
        while True:
            info = await self.info()
            if info is not None and info.status.finished:
                if info.status is RunStatus.COMPLETED:
                    return info.result
                raise RunFailedError(self.run_id, info.status, info.error)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"run {self.run_id!r} did not finish within {timeout}s")
            pause = delay if deadline is None else min(delay, max(0.0, deadline - loop.time()))
            await asyncio.sleep(pause)
            delay = min(poll_interval * 10, delay * 2)

    async def cancel(self) -> CancelOutcome:
        """Cancel the run if it has not started (see :meth:`Fairq.cancel`)."""
        return await self.task.app.cancel(self.run_id)

    def info_sync(self) -> RunInfo | None:
        """Blocking :meth:`info`."""
        return self.task.app.sync.run(self.info())

    def wait_sync(self, timeout: float | None = None) -> Any:
        """Blocking :meth:`wait`."""
        return self.task.app.sync.run(self.wait(timeout))


class Task(Generic[R]):
    """A registered task (created by :meth:`Fairq.task`). Call it to run the function
    directly, or :meth:`trigger` it to queue a run for a worker."""

    def __init__(
        self,
        app: Fairq,
        fn: Callable[[Any], R] | Callable[[Any], Awaitable[R]],
        *,
        name: str,
        queue: str,
        concurrency_limit: int | None,
        queue_size_limit: int | None,
        retry: RetryPolicy | None,
        ttl_ms: int | None,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = K.validate_name("queue", queue, allow_slash=True)
        self.concurrency_limit = concurrency_limit
        self.queue_size_limit = queue_size_limit
        self.retry = retry or app.config.retry
        self.ttl_ms = ttl_ms
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, payload: Any) -> Any:
        """Run the function in this process (no queue): handy in tests."""
        return self.fn(payload)

    def _request(self, item: TriggerItem, now: int) -> EnqueueRequest:
        run_id = item.run_id or new_run_id()
        try:
            encode_payload(item.payload, self.app.config.max_payload_bytes)
        except PayloadError as exc:
            raise PayloadError(f"task {self.name!r}, run {run_id!r}: {exc}") from None
        ttl_ms = _ms("ttl", item.ttl)
        return EnqueueRequest(
            env=self.app.env,
            queue=self.queue,
            run_id=run_id,
            payload=item.payload,
            concurrency_key=item.concurrency_key,
            delay_ms=_ms("delay", item.delay) or 0,
            priority_ms=_ms("priority", item.priority) or 0,
            ttl_ms=ttl_ms if ttl_ms is not None else self.ttl_ms,
        )

    async def trigger(
        self,
        payload: Any = None,
        *,
        concurrency_key: str | None = None,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        priority: Duration | None = None,
        run_id: str | None = None,
    ) -> RunHandle:
        """Queue one run of this task.

        Args:
            payload: any JSON-serialisable value; the task receives it decoded.
            concurrency_key: the tenant (user, account…) the run belongs to: each key is
                its own sub-queue, limited by the queue's concurrency limit, and served
                fairly against the other keys when fair order is on.
            delay: run no earlier than this many seconds from now.
            ttl: expire the run (never run it) if it has not started within this many
                seconds (default: the task's ``ttl_ms``).
            priority: a time credit in seconds: the run orders as if queued this much earlier.
            run_id: your own id (letters, digits, ``_ . -``); triggering an existing id
                again changes nothing and returns ``DUPLICATE``. Default: a fresh id.

        Raises:
            PayloadError: the payload is not JSON-serialisable or is too large.
            QueueSizeLimitExceededError: the queue is at its size limit.
            InvalidNameError, ConfigurationError, InvalidLimitError: bad arguments.
        """
        item = TriggerItem(payload, concurrency_key, delay, ttl, priority, run_id)
        (handle,) = await self.trigger_many([item])
        if handle.error is not None:
            raise handle.error
        return handle

    async def trigger_many(self, items: Sequence[TriggerItem | Any]) -> list[RunHandle]:
        """Queue many runs in one round trip. Items are :class:`TriggerItem` or bare payloads.

        Every item is validated before anything is written (one bad payload raises and
        queues nothing). A run the queue's size limit refuses is *not* raised: its handle
        has ``status=REJECTED`` and ``error`` set; the others are queued.
        """
        now = wall_clock_ms()
        normalised = [i if isinstance(i, TriggerItem) else TriggerItem(payload=i) for i in items]
        requests = [self._request(item, now) for item in normalised]
        if not requests:
            return []
        rq = await self.app.queue()
        results = await rq.enqueue_many(requests, now_ms=now)
        return [
            RunHandle(
                run_id=r.run_id,
                task=self,
                status=r.status,
                error=QueueSizeLimitExceededError(self.queue, r.queue_size_limit)
                if r.status is EnqueueStatus.REJECTED
                else None,
            )
            for r in results
        ]

    def trigger_sync(
        self,
        payload: Any = None,
        *,
        concurrency_key: str | None = None,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        priority: Duration | None = None,
        run_id: str | None = None,
    ) -> RunHandle:
        """Blocking :meth:`trigger`, for code that is not async."""
        return self.app.sync.run(
            self.trigger(
                payload, concurrency_key=concurrency_key, delay=delay, ttl=ttl,
                priority=priority, run_id=run_id,
            )
        )  # fmt: skip

    def trigger_many_sync(self, items: Sequence[TriggerItem | Any]) -> list[RunHandle]:
        """Blocking :meth:`trigger_many`."""
        return self.app.sync.run(self.trigger_many(items))


class SyncFacade:
    """Runs the app's coroutines on a private event-loop thread, for blocking callers.

    One daemon thread per app, started on first use; it keeps its own connection.
    """

    def __init__(self, app: Fairq) -> None:
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="fairq-sync", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the facade's loop and wait for its result."""
        loop = self._ensure()
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                coro.close()
                raise FairqError("the sync facade cannot be called from its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_run(self, run_id: str) -> RunInfo | None:
        """Blocking :meth:`Fairq.get_run`."""
        return self.run(self.app.get_run(run_id))

    def close(self) -> None:
        """Close the facade's connection and stop its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(concurrent.futures.CancelledError, RuntimeError):
            asyncio.run_coroutine_threadsafe(self.app.aclose(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


class Fairq:
    """A fairq application: one environment, its tasks, and a connection per event loop.

    Args:
        env: ``org:project:env``; concurrency limits, queues and dead letters are per env.
        url: the server (``redis://…``); default ``FAIRQ_REDIS_URL``, else the user's
            shared embedded server (started on first need).
        config: store options (default: :meth:`RunQueueConfig.from_env`, i.e. ``FAIRQ_*``).
        fair: shortcut for ``config.vtime.enabled`` (fair order across concurrency keys).
            Every process using a queue must agree on it.
        result_ttl_seconds: how long run outcomes (results, errors) are kept.
    """

    def __init__(
        self,
        env: str | Environment = DEFAULT_ENV,
        url: str | None = None,
        config: RunQueueConfig | None = None,
        *,
        fair: bool | None = None,
        result_ttl_seconds: int = DEFAULT_RESULT_TTL_SECONDS,
    ) -> None:
        self.env = env if isinstance(env, Environment) else Environment.parse(env)
        self.url = url
        config = config or RunQueueConfig.from_env()
        if fair is not None:
            config = config.with_vtime(enabled=fair)
        self.config = config
        if isinstance(result_ttl_seconds, bool) or not 1 <= int(result_ttl_seconds) <= 365 * 86_400:
            raise ConfigurationError(
                f"result_ttl_seconds must be in 1..31536000, got {result_ttl_seconds}"
            )
        self.result_ttl_seconds = int(result_ttl_seconds)
        #: Registered tasks by queue name.
        self.tasks: dict[str, Task[Any]] = {}
        self._queues: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Task[RunQueue]
        ] = weakref.WeakKeyDictionary()
        self._resolved_url: str | None = None
        self.sync = SyncFacade(self)

    def __repr__(self) -> str:
        return f"<Fairq env={self.env.id} tasks={sorted(self.tasks)}>"

    # ------------------------------------------------------------------ tasks

    @overload
    def task(self, fn: Callable[[Any], Awaitable[R]], /) -> Task[R]: ...

    @overload
    def task(self, fn: Callable[[Any], R], /) -> Task[R]: ...

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
    ) -> Callable[[Callable[[Any], Any]], Task[Any]]: ...

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
    ) -> Task[Any] | Callable[[Callable[[Any], Any]], Task[Any]]:
        """Register a task (``@app.task`` or ``@app.task(queue=..., ...)``).

        Args:
            queue: its queue (default: the function's name). One task per queue.
            name: display name (default: ``module.function``).
            concurrency_limit: the queue's concurrency limit (per concurrency key, when
                runs have keys); a worker writes it when it starts, unless the queue is
                paused. ``fairq limits`` can change it at runtime.
            queue_size_limit: cap on the queue's queued runs (written like the limit).
            retry: backoff and attempts (default: the app config's policy).
            ttl_ms: default TTL of its runs (ms): expire if not started in time.

        Raises:
            ConfigurationError: the queue already has a task.
        """

        def register(function: Callable[[Any], Any]) -> Task[Any]:
            queue_name = queue or getattr(function, "__name__", None)
            if not queue_name:
                raise ConfigurationError("a task needs a queue name")
            if queue_name in self.tasks:
                raise ConfigurationError(
                    f"queue {queue_name!r} already belongs to task {self.tasks[queue_name].name!r}"
                )
            task_name = (
                name or f"{function.__module__}.{getattr(function, '__qualname__', queue_name)}"
            )
            t: Task[Any] = Task(
                self, function, name=task_name, queue=queue_name,
                concurrency_limit=concurrency_limit, queue_size_limit=queue_size_limit,
                retry=retry, ttl_ms=ttl_ms,
            )  # fmt: skip
            self.tasks[queue_name] = t
            return t

        if fn is not None:
            return register(fn)
        return register

    # ------------------------------------------------------------------ connection

    async def resolved_url(self) -> str:
        """The server URL in use (resolving FAIRQ_REDIS_URL / the shared server once)."""
        if self._resolved_url is None:
            self._resolved_url = await asyncio.to_thread(resolve_url, self.url)
        return self._resolved_url

    async def _open(self) -> RunQueue:
        return RunQueue(await connect(await self.resolved_url()), self.config)

    async def queue(self) -> RunQueue:
        """The :class:`RunQueue` of the running event loop (connected on first use)."""
        loop = asyncio.get_running_loop()
        pending = self._queues.get(loop)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = loop.create_task(self._open())
            self._queues[loop] = pending
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

    # ------------------------------------------------------------------ limits

    async def apply_limits(self) -> list[str]:
        """Write the tasks' declared queue limits; returns what was done, one line each.

        A paused queue (concurrency 0) stays paused.
        """
        rq = await self.queue()
        done: list[str] = []
        for t in self.tasks.values():
            if t.concurrency_limit is None and t.queue_size_limit is None:
                continue
            stats = await rq.queue_stats(self.env, t.queue)
            if t.concurrency_limit is not None:
                if stats.paused:
                    done.append(f"{t.queue}: paused; concurrency limit left at 0")
                elif stats.concurrency_limit != t.concurrency_limit:
                    await rq.set_queue_concurrency(self.env, t.queue, t.concurrency_limit)
                    done.append(f"{t.queue}: concurrency limit {t.concurrency_limit}")
            if t.queue_size_limit is not None:
                await rq.set_queue_size_limit(self.env, t.queue, t.queue_size_limit)
                done.append(f"{t.queue}: size limit {t.queue_size_limit}")
        return done

    # ------------------------------------------------------------------ run status

    def outcome_key(self, rq: RunQueue, run_id: str) -> str:
        """Where a run's outcome is stored."""
        return K.run_outcome_key(rq.keys, self.env, run_id)

    async def cancel(self, run_id: str) -> CancelOutcome:
        """Cancel a run that has not started: a queued run is never delivered, a
        dead-lettered one leaves the DLQ; either is then reported as ``cancelled``.
        A running run is not interrupted (``CancelOutcome.RUNNING``)."""
        K.validate_name("run id", run_id)
        rq = await self.queue()
        queue, ck, attempts = await rq.client.hmget(
            rq.keys.env(self.env).message(run_id), ["q", "k", "a"]
        )
        outcome = await rq.cancel(self.env, run_id)
        if outcome in (CancelOutcome.CANCELLED, CancelOutcome.REMOVED_FROM_DLQ):
            record = outcome_json(
                RunStatus.CANCELLED,
                queue=_s(queue) if queue else "",
                concurrency_key=K.decode_concurrency_key(_s(ck)) if ck else None,
                attempts=int(attempts or 0),
                finished_at_ms=wall_clock_ms(),
            )
            await rq.client.set(self.outcome_key(rq, run_id), record, ex=self.result_ttl_seconds)
        return outcome

    async def get_run(self, run_id: str) -> RunInfo | None:
        """A run's status and result or error; None when fairq knows nothing of it
        (never triggered, or its outcome's retention passed)."""
        K.validate_name("run id", run_id)
        rq = await self.queue()
        pipe = rq.client.pipeline(transaction=False)
        pipe.hmget(rq.keys.env(self.env).message(run_id), ["st", "a", "q", "k"])
        pipe.get(self.outcome_key(rq, run_id))
        message, outcome_raw = await pipe.execute()
        outcome = json.loads(outcome_raw) if outcome_raw else None
        if message[0] is not None:
            state = _s(message[0])
            return RunInfo(
                run_id=run_id,
                status=_STATE_STATUS.get(state, RunStatus.QUEUED),
                queue=_s(message[2]) if message[2] else None,
                concurrency_key=K.decode_concurrency_key(_s(message[3])) if message[3] else None,
                attempts=int(message[1] or 0),
                error=outcome.get("error") if outcome else None,
                finished_at_ms=outcome.get("finished_at") if outcome and state == "dlq" else None,
            )
        if outcome is not None:
            return RunInfo(
                run_id=run_id,
                status=RunStatus(outcome["status"]),
                queue=outcome.get("queue"),
                concurrency_key=outcome.get("ck"),
                attempts=int(outcome.get("attempts") or 0),
                result=outcome.get("result"),
                error=outcome.get("error"),
                finished_at_ms=outcome.get("finished_at"),
            )
        return await self._expired_info(rq, run_id)

    async def _expired_info(self, rq: RunQueue, run_id: str) -> RunInfo | None:
        shard = rq.keys.shard(rq.keys.shard_of(self.env))
        entries = await rq.client.xrevrange(shard.expired, count=EXPIRED_LOOKBACK)
        for _entry_id, fields in entries or []:
            f = {_s(k): _s(v) for k, v in (fields or {}).items()}
            if f.get("run") == run_id and f.get("env") == self.env.id:
                return RunInfo(
                    run_id=run_id,
                    status=RunStatus.EXPIRED,
                    queue=f.get("queue"),
                    concurrency_key=K.decode_concurrency_key(f["ck"]) if f.get("ck") else None,
                    finished_at_ms=int(float(f["at"])) if f.get("at") else None,
                )
        return None

    async def record_expired(self, *, count: int = 500) -> int:
        """Copy new entries of the env's shard expiry stream into run outcomes.

        Idempotent and safe to run from several workers (a cursor key remembers where it
        got to; overlapping copies write the same outcome). Returns how many it wrote.
        """
        rq = await self.queue()
        shard = rq.keys.shard(rq.keys.shard_of(self.env))
        cursor_key = K.expired_cursor_key(shard)
        raw_cursor = await rq.client.get(cursor_key)
        start = f"({_s(raw_cursor)}" if raw_cursor else "-"
        entries = await rq.client.xrange(shard.expired, min=start, count=count)
        if not entries:
            return 0
        pipe = rq.client.pipeline(transaction=False)
        for _entry_id, fields in entries:
            f = {_s(k): _s(v) for k, v in (fields or {}).items()}
            org, project, name = f["env"].split(":")
            env = Environment(org, project, name)
            value = outcome_json(
                RunStatus.EXPIRED,
                queue=f["queue"],
                concurrency_key=K.decode_concurrency_key(f["ck"]) if f.get("ck") else None,
                attempts=0,
                finished_at_ms=int(float(f["at"])),
            )
            pipe.set(K.run_outcome_key(rq.keys, env, f["run"]), value, ex=self.result_ttl_seconds)
        pipe.set(cursor_key, _s(entries[-1][0]))
        await pipe.execute()
        return len(entries)


__all__ = [
    "DEFAULT_ENV",
    "Fairq",
    "PermanentError",
    "RetryPolicy",
    "RunFailedError",
    "RunHandle",
    "RunInfo",
    "RunStatus",
    "Task",
    "TriggerItem",
    "outcome_json",
]

"""Tasks, triggers and run handles: the typed user API of :class:`fairq.Fairq`.

A task is a function (async, or plain and then run in a worker thread) taking one
JSON payload. ``Task[P, R]`` carries the payload type ``P`` and the result type ``R`` of
the function it wraps, so ``task.trigger(payload)`` checks the payload and
``await handle.wait()`` returns ``R`` under a type checker.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import os
import threading
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from fairq import keys as K
from fairq import telemetry
from fairq.config import RetryPolicy
from fairq.errors import (
    ConfigurationError,
    InvalidLimitError,
    PayloadError,
    PermanentError,
    QueueSizeLimitExceededError,
    RunFailedError,
    TaskTimeoutError,
    short,
)
from fairq.models import CancelOutcome, Delivery, EnqueueRequest, EnqueueResult, EnqueueStatus
from fairq.outcomes import RunInfo, RunStatus
from fairq.run_context import RunContext, _current

if TYPE_CHECKING:
    from fairq.app import Fairq
    from fairq.store.position import RunPosition

P = TypeVar("P")
R = TypeVar("R")

#: What ``delay``, ``ttl``, ``timeout`` and ``head_start`` accept: seconds, or a timedelta.
Duration = float | int | timedelta
#: How a task derives a run's tenant: a callable of the payload, or the concurrency
#: key's prefix up to a separator (``"prefix:/"`` = up to the first ``/``).
TenantFrom = Callable[[Any], str | None] | str


#: The payload of a trigger that gives none (the task receives None).
_NO_PAYLOAD: Any = None


def _checked_priority(value: object) -> int:
    from fairq.store.validate import priority

    return priority(value)


def to_ms(name: str, value: Duration | None) -> int | None:
    """Seconds (or a timedelta) to whole milliseconds.

    Raises:
        ConfigurationError: not a finite, non-negative number of seconds or a timedelta.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float
            raise ConfigurationError(
                f"{name} must be a number of seconds in 0..10 years, got {short(value)}"
            ) from None
    else:
        raise ConfigurationError(
            f"{name} must be a number of seconds or a timedelta, got {short(value)}"
        )
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {short(value)}")
    if seconds < 0:
        raise ConfigurationError(f"{name} must not be negative, got {short(value)}")
    if seconds > 10 * 365 * 86_400:
        raise ConfigurationError(f"{name} must be at most 10 years, got {short(value)}")
    return round(seconds * 1000)


class RunIds:
    """Fresh run ids that sort in the order this process made them.

    Runs queued at the same score (in one millisecond, or in one batch) are served in the
    order of their ids, so ids that sort by creation make such runs first-in, first-out.
    An id is ``run_`` and 32 hex digits: the milliseconds since the epoch (12), a sequence
    number inside that millisecond (4), and 8 random bytes (16), which keep ids made by
    different processes apart. The milliseconds never go back, even when the clock does.
    """

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._ms = 0
        self._seq = 0
        # a child forked while another thread held the lock gets a fresh one
        reset = weakref.WeakMethod(self._new_lock)
        os.register_at_fork(after_in_child=lambda: (method := reset()) and method())

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def __call__(self) -> str:
        now = self._clock_ns() // 1_000_000
        with self._lock:
            if now > self._ms:
                self._ms, self._seq = now, 0
            elif self._seq < 0xFFFF:
                self._seq += 1
            else:  # 65,536 ids in one millisecond: borrow the next one
                self._ms, self._seq = self._ms + 1, 0
            ms, seq = self._ms, self._seq
        return f"run_{ms:012x}{seq:04x}{os.urandom(8).hex()}"


#: A fresh, unique run id (see :class:`RunIds`).
new_run_id = RunIds()


def tenant_of(rule: TenantFrom | None, payload: Any, concurrency_key: str | None) -> str | None:
    """A run's tenant by a task's ``tenant_from`` rule (None when the rule gives none)."""
    if rule is None:
        return None
    if isinstance(rule, str):
        separator = rule.removeprefix("prefix:")
        if concurrency_key is None or not separator:
            return None
        head, found, _ = concurrency_key.partition(separator)
        return head if found and head else None
    tenant = rule(payload)
    if tenant is not None and not isinstance(tenant, str):
        raise ConfigurationError(f"tenant_from must return a string or None, got {short(tenant)}")
    return tenant


@dataclass(frozen=True, slots=True)
class TriggerItem(Generic[P]):
    """One run of :meth:`Task.trigger_many` with its own options (see :meth:`Task.trigger`)."""

    payload: P
    concurrency_key: str | None = None
    tenant: str | None = None
    delay: Duration | None = None
    ttl: Duration | None = None
    #: Its priority level (1 is the highest; None = the task's, else the queue's middle level).
    priority: int | None = None
    run_id: str | None = None
    timeout: Duration | None = None
    keep_result: bool | None = None
    #: A time credit: the run orders as if queued this much earlier, inside its level.
    head_start: Duration | None = None


@dataclass(slots=True)
class RunHandle(Generic[R]):
    """What a trigger returns: the run id, what the enqueue did, and ways to follow the run.

    Attributes:
        run_id: the run.
        task: its task.
        status: ``ENQUEUED``, ``DUPLICATE`` (the id existed: nothing changed) or
            ``REJECTED`` (batch triggers only: the queue was at its size limit).
        error: for ``REJECTED``, the :class:`QueueSizeLimitExceededError`.
    """

    run_id: str
    task: Task[Any, R]
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

    async def position(self) -> RunPosition | None:
        """Where the run stands (see :meth:`Fairq.run_position`): while queued, the runs
        ahead of it in its flow, its tenant's rank, the gates holding it and an
        estimated start; once running or finished, its status."""
        return await self.task.app.run_position(self.run_id)

    async def wait(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline on the run, not one await
        *,
        poll_interval: float = 0.05,
    ) -> R:
        """Wait until the run ends and return its result.

        A run that was seen queued or running and then left no outcome completed
        without a kept result (see :mod:`fairq.outcomes`): ``None`` is returned.

        Raises:
            RunFailedError: it failed, timed out, expired, was dead-lettered or cancelled.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = min(poll_interval, 0.01)
        seen = self.status is EnqueueStatus.ENQUEUED
        while True:
            info = await self.info()
            if info is None and seen:
                return cast(R, None)
            if info is not None:
                seen = True
                if info.status.finished:
                    if info.status is RunStatus.COMPLETED:
                        return cast(R, info.result)
                    raise RunFailedError(self.run_id, info.status, info.error)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"run {self.run_id!r} did not finish within {timeout}s")
            pause = delay if deadline is None else min(delay, max(0.0, deadline - loop.time()))
            await asyncio.sleep(pause)
            delay = min(poll_interval * 10, delay * 2)

    async def cancel(self) -> CancelOutcome:
        """Cancel the run (see :meth:`Fairq.cancel`)."""
        return await self.task.app.cancel(self.run_id)

    def info_sync(self) -> RunInfo | None:
        """Blocking :meth:`info`."""
        return self.task.app.sync.run(self.info())

    def position_sync(self) -> RunPosition | None:
        """Blocking :meth:`position`."""
        return self.task.app.sync.run(self.position())

    def wait_sync(self, timeout: float | None = None) -> R:
        """Blocking :meth:`wait`."""
        return self.task.app.sync.run(self.wait(timeout))

    def cancel_sync(self) -> CancelOutcome:
        """Blocking :meth:`cancel`."""
        return self.task.app.sync.run(self.cancel())


class Task(Generic[P, R]):
    """A registered task (created by :meth:`Fairq.task`). Call it to run the function
    directly, or :meth:`trigger` it to queue a run for a worker."""

    def __init__(
        self,
        app: Fairq,
        fn: Callable[[P], R] | Callable[[P], Awaitable[R]],
        *,
        name: str,
        queue: str,
        concurrency_limit: int | None = None,
        queue_size_limit: int | None = None,
        retry: RetryPolicy | None = None,
        ttl_ms: int | None = None,
        timeout: Duration | None = None,
        keep_result: bool | None = None,
        tenant_from: TenantFrom | None = None,
        options: dict[str, object] | None = None,
        priority: int | None = None,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = K.validate_name("queue", queue, allow_slash=True)
        self.concurrency_limit = concurrency_limit
        self.queue_size_limit = queue_size_limit
        self.retry = retry or app.config.retry
        self.ttl_ms = ttl_ms
        self.timeout_ms = to_ms("timeout", timeout)
        if self.timeout_ms == 0:
            raise ConfigurationError("timeout must be positive")
        if keep_result is not None and not isinstance(keep_result, bool):
            raise ConfigurationError(
                f"keep_result must be True, False or None, got {short(keep_result)}"
            )
        self.keep_result = keep_result
        if tenant_from is not None and not (callable(tenant_from) or isinstance(tenant_from, str)):
            raise ConfigurationError("tenant_from must be a callable or 'prefix:<separator>'")
        self.tenant_from = tenant_from
        #: The priority level of its runs that give none (None: the queue's middle level).
        self.priority = None if priority is None else _checked_priority(priority)
        #: Queue settings written on the server by :meth:`Fairq.apply_limits`.
        self.options = dict(options or {})
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, payload: P) -> R | Awaitable[R]:
        """Run the function in this process (no queue)."""
        return self.fn(payload)

    def _request(
        self,
        payload: Any,
        concurrency_key: str | None,
        tenant: str | None,
        delay: Duration | None,
        ttl: Duration | None,
        priority: int | None,
        run_id: str | None,
        timeout: Duration | None,
        keep_result: bool | None,
        head_start: Duration | None,
    ) -> EnqueueRequest:
        """The store request of one run (a trigger's arguments or a TriggerItem's fields)."""
        try:
            ttl_ms = to_ms("ttl", ttl)
            timeout_ms = to_ms("timeout", timeout)
            if timeout_ms == 0:
                raise ConfigurationError("timeout must be positive")
            tenant = tenant or tenant_of(self.tenant_from, payload, concurrency_key)
            if keep_result is not None and not isinstance(keep_result, bool):
                raise InvalidLimitError("keep_result", keep_result, "must be True, False or None")
            keep = keep_result if keep_result is not None else self.keep_result
            return EnqueueRequest(
                env=self.app.env,
                queue=self.queue,
                run_id=run_id or new_run_id(),
                payload=payload,
                concurrency_key=concurrency_key,
                delay_ms=to_ms("delay", delay) or 0,
                head_start_ms=to_ms("head_start", head_start) or 0,
                priority=priority if priority is not None else self.priority,
                ttl_ms=ttl_ms if ttl_ms is not None else self.ttl_ms,
                tenant=tenant,
                keep_outcome=bool(keep),
                timeout_ms=timeout_ms,
            )
        except PayloadError as exc:
            raise PayloadError(f"task {self.name!r}: {exc}") from None

    def _handle(self, run_id: str, status: EnqueueStatus, limit: int) -> RunHandle[R]:
        error = (
            QueueSizeLimitExceededError(self.queue, limit)
            if status is EnqueueStatus.REJECTED
            else None
        )
        return RunHandle(run_id=run_id, task=self, status=status, error=error)

    async def trigger(
        self,
        payload: P = _NO_PAYLOAD,
        *,
        concurrency_key: str | None = None,
        tenant: str | None = None,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        priority: int | None = None,
        run_id: str | None = None,
        timeout: Duration | None = None,  # noqa: ASYNC109 - the run's timeout, not this call's
        keep_result: bool | None = None,
        head_start: Duration | None = None,
    ) -> RunHandle[R]:
        """Queue one run of this task (one round trip).

        Args:
            payload: any JSON-serialisable value; the task receives it decoded (default
                None).
            concurrency_key: the key (user, account…) the run belongs to: each key is its
                own sub-queue, limited by the queue's per-key concurrency limit.
            tenant: the fairness group it belongs to (default: by the task's
                ``tenant_from``, else the concurrency key, else the queue).
            delay: run no earlier than this many seconds from now.
            ttl: expire the run (never run it) if it has not started within this many
                seconds (default: the task's ``ttl_ms``).
            priority: its priority level: 1 is the highest, up to the queue's
                ``priority_levels`` (default 5); every ready run of a level starts before
                any of the next level, and the fair order applies inside a level. Default:
                the task's ``priority``, else the queue's middle level (3 of 5).
            run_id: your own id (letters, digits, ``_ . -``); triggering an existing id
                again changes nothing and returns ``DUPLICATE``. Default: a fresh id.
            timeout: fail the run as timed out after this many seconds of running
                (default: the task's ``timeout``).
            keep_result: keep the outcome even if the task returns None.
            head_start: a time credit in seconds: inside its level, the run orders as if
                queued this much earlier.

        Raises:
            PayloadError: the payload is not JSON-serialisable, too deep or too large.
            QueueSizeLimitExceededError: the queue is at its size limit.
            InvalidNameError, ConfigurationError, InvalidLimitError: bad arguments.
        """
        # (the arguments as they are: a TriggerItem of them would cost a microsecond more)
        request = self._request(
            payload,
            concurrency_key,
            tenant,
            delay,
            ttl,
            priority,
            run_id,
            timeout,
            keep_result,
            head_start,
        )
        if self.app.eager:
            return await self._run_eagerly(request)
        rq = await self.app.queue()
        with telemetry.trigger_span([request]):
            result = await rq.enqueue_one(telemetry.with_trace_context(request))
        return self.handle_for(result)

    def request_for(self, item: TriggerItem[P]) -> EnqueueRequest:
        """The store request of one trigger (the blocking facade sends it itself)."""
        return self._request(
            item.payload,
            item.concurrency_key,
            item.tenant,
            item.delay,
            item.ttl,
            item.priority,
            item.run_id,
            item.timeout,
            item.keep_result,
            item.head_start,
        )

    def handle_for(self, result: EnqueueResult) -> RunHandle[R]:
        """The handle of an enqueued run; raises when the queue refused it (size limit)."""
        handle = self._handle(result.run_id, result.status, result.queue_size_limit)
        if handle.error is not None:
            raise handle.error
        return handle

    async def trigger_many(self, items: Sequence[TriggerItem[P] | P]) -> list[RunHandle[R]]:
        """Queue many runs in one round trip per queue. Items are :class:`TriggerItem`
        or bare payloads.

        Every item is validated before anything is written (one bad payload raises and
        queues nothing). A run the queue's size limit refuses is *not* raised: its handle
        has ``status=REJECTED`` and ``error`` set; the others are queued.
        """
        normalised = [i if isinstance(i, TriggerItem) else TriggerItem(payload=i) for i in items]
        requests = [self.request_for(item) for item in normalised]
        if not requests:
            return []
        if self.app.eager:
            return [await self._run_eagerly(r) for r in requests]
        rq = await self.app.queue()
        with telemetry.trigger_span(requests):
            results = await rq.enqueue_many([telemetry.with_trace_context(r) for r in requests])
        return [self._handle(r.run_id, r.status, r.queue_size_limit) for r in results]

    async def _run_eagerly(self, request: EnqueueRequest) -> RunHandle[R]:
        """Eager mode: run the triggered run here and now (see :func:`run_eagerly`)."""
        runs = self.app._eager_runs
        if request.run_id in runs:
            return self._handle(request.run_id, EnqueueStatus.DUPLICATE, 0)
        info = await run_eagerly(self, request)
        runs[request.run_id] = info
        while len(runs) > EAGER_RUNS_KEPT:
            del runs[next(iter(runs))]
        return self._handle(request.run_id, EnqueueStatus.ENQUEUED, 0)

    def trigger_sync(
        self,
        payload: P = _NO_PAYLOAD,
        *,
        concurrency_key: str | None = None,
        tenant: str | None = None,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        priority: int | None = None,
        run_id: str | None = None,
        timeout: Duration | None = None,
        keep_result: bool | None = None,
        head_start: Duration | None = None,
    ) -> RunHandle[R]:
        """Blocking :meth:`trigger`, for code that is not async (calls made from several
        threads at once are sent together)."""
        return self.app.sync.trigger(
            self,
            TriggerItem(
                payload,
                concurrency_key,
                tenant,
                delay,
                ttl,
                priority,
                run_id,
                timeout,
                keep_result,
                head_start,
            ),
        )

    def trigger_many_sync(self, items: Sequence[TriggerItem[P] | P]) -> list[RunHandle[R]]:
        """Blocking :meth:`trigger_many`."""
        return self.app.sync.run(self.trigger_many(items))


#: Eager runs whose outcome an eager app keeps (the oldest are forgotten first).
EAGER_RUNS_KEPT = 10_000


def _eager_result(value: Any) -> Any:
    # a worker stores the result as JSON (a value JSON cannot hold as its str())
    return json.loads(json.dumps(value, separators=(",", ":"), default=str))


async def run_eagerly(task: Task[Any, Any], request: EnqueueRequest) -> RunInfo:
    """Run one triggered run in this process, at once: what ``Fairq(eager=True)`` does.

    It follows a worker where it can: the payload goes through JSON (an unserialisable
    payload is refused, the task receives the decoded copy), the result too;
    :func:`fairq.current_run` works (``attempt``, ``progress``, ``cancelled``); a plain
    function runs in a thread; the timeout applies (an async task is cancelled, a plain
    function's thread abandoned); failures are retried by the task's policy, and the
    last failure ends the run ``dead_lettered`` (``failed`` for a
    :class:`fairq.PermanentError`, ``timed_out`` for a timeout).

    What differs: there is no server and no queue, so ``delay``, ``priority``, ``ttl``,
    the concurrency and rate limits and the fair order do not apply (the trigger returns
    once the run ended); retries do not wait for their backoff; schedules never fire;
    a run cannot be cancelled (it has ended when the trigger returns); outcomes live in
    the app's memory (the newest 10,000), whatever ``keep_result`` says.
    """
    from fairq.store.validate import payload as encode_payload

    payload_json = encode_payload(request.payload, task.app.config.max_payload_bytes)
    timeout_ms = request.timeout_ms or task.timeout_ms
    timeout = None if timeout_ms is None else timeout_ms / 1000
    enqueued = round(time.time() * 1000)
    attempt = 0
    while True:
        delivery = Delivery(
            env=request.env, queue=request.queue, run_id=request.run_id,
            payload_json=payload_json, concurrency_key=request.concurrency_key,
            attempt=attempt, lease_token=attempt + 1, score_ms=enqueued,
            enqueued_at_ms=enqueued, tenant=request.tenant, timeout_ms=request.timeout_ms,
            keep_outcome=request.keep_outcome,
        )  # fmt: skip
        context = RunContext(delivery, {})
        ctx = contextvars.copy_context()
        ctx.run(_current.set, context)
        started = round(time.time() * 1000)
        status: RunStatus | None = None
        error: BaseException | None = None
        try:
            if task.is_async:
                inner = asyncio.create_task(
                    cast(Coroutine[Any, Any, Any], task.fn(json.loads(payload_json))),
                    context=ctx,
                )
                result = await asyncio.wait_for(inner, timeout)
            else:
                call = functools.partial(ctx.run, task.fn, json.loads(payload_json))
                future = asyncio.get_running_loop().run_in_executor(None, call)
                result = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError as exc:
            error = exc
            late = timeout is not None and time.time() * 1000 - started >= timeout * 990
            if late:
                error = TaskTimeoutError(request.run_id, cast(float, timeout))
                status = RunStatus.TIMED_OUT
        except PermanentError as exc:
            error, status = exc, RunStatus.FAILED
        except Exception as exc:
            error = exc
        else:
            return RunInfo(
                run_id=request.run_id, status=RunStatus.COMPLETED, queue=request.queue,
                concurrency_key=request.concurrency_key, tenant=request.tenant,
                attempts=attempt, result=_eager_result(result),
                started_at_ms=started, finished_at_ms=round(time.time() * 1000),
            )  # fmt: skip
        attempt += 1
        last = attempt >= task.retry.max_attempts
        if status is RunStatus.FAILED or last:
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            return RunInfo(
                run_id=request.run_id, status=status or RunStatus.DEAD_LETTERED,
                queue=request.queue, concurrency_key=request.concurrency_key,
                tenant=request.tenant, attempts=attempt, error=text,
                traceback="".join(traceback.format_exception(error)),
                started_at_ms=started, finished_at_ms=round(time.time() * 1000),
            )  # fmt: skip

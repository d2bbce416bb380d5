"""The worker: leases runs of an app's tasks, runs them, and finishes, retries or
dead-letters them.

* Async tasks run on the event loop; plain functions in a thread pool sized to
  ``concurrency``. At most ``concurrency`` runs are in flight per worker (the server's
  env / queue / key / tenant limits apply on top, across all workers).
* Dequeueing goes through :class:`fairq.consumer.Consumer` and the store's dequeue
  (the same code as any dequeue): one round trip per batch, no polling.
* Finished runs are finished in batches, outcome and ack in one atomic call per shard
  (:meth:`fairq.store.RunQueue.finish`): while one call is in flight the next collect.
* Leases are extended in one batched heartbeat every ``lease / 3`` (on the server's
  clock); progress a task reports rides along with it (at most once a second).
* A failing run is nacked with the task's backoff; at its last attempt the server
  dead-letters it. :class:`fairq.PermanentError` fails it at once.
* Timeouts: an async task is cancelled at its deadline; a plain function's thread
  cannot be interrupted, so its run is failed as timed out at the deadline and the
  thread is abandoned (:mod:`fairq.task_threads`: the pool keeps a thread for each run
  beside the abandoned ones, a deadline counts from the function's start, and a retry of
  the run waits here until the abandoned thread has returned).
* Cancellation of a running run (``handle.cancel()``): the worker hears it on the wake
  channel (and from the next heartbeat), cancels an async task (it sees
  ``asyncio.CancelledError``) or sets ``current_run().cancelled`` for a plain one, and
  finishes the run as cancelled; one that does not stop within ``cancel_grace`` seconds
  is finished as cancelled anyway (its thread is abandoned).
* SIGTERM / SIGINT: stop taking work, let in-flight runs finish for ``grace_period``
  seconds, then give the rest back (nack without counting an attempt). A second signal
  skips the grace period. A worker killed outright loses nothing: its leases lapse and
  the maintenance of any live consumer requeues the runs.
* The server going away: dequeues, finishes and heartbeats retry with bounded backoff
  (restarting the shared server if it is ours), and resume by themselves.
* Any other error in one of the worker's loops (fetching, finishing, heartbeats,
  schedules, the wake-up and cancel listener, maintenance, a metrics observer) is logged
  with its traceback, counted in ``stats.loop_errors``, and the loop goes on after a
  bounded backoff (:mod:`fairq.loops`): no bad value stops a worker's heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairq import telemetry
from fairq.app import Fairq
from fairq.consumer import DEFAULT_LINGER_S, Consumer, check_linger
from fairq.errors import ConfigurationError, ConnectionLostError, FairqError, PermanentError
from fairq.loops import LoopGuard
from fairq.metrics import RunMetrics
from fairq.models import AckStatus, Delivery, Finish, HeartbeatStatus, NackOutcome
from fairq.outcomes import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, KeptOutcome, RunStatus
from fairq.run_context import RunContext, _current, current_run
from fairq.schedules import Scheduler
from fairq.store import RunQueue, validate
from fairq.store._core import wall_clock_ms
from fairq.task_threads import TaskThreads
from fairq.tasks import Task

log = logging.getLogger("fairq.worker")
run_log = logging.getLogger("fairq.run")

#: Most runs in flight one worker accepts.
MAX_CONCURRENCY: Final = 1000
#: How often reported progress is sent at most (s).
PROGRESS_INTERVAL_S: Final = 1.0


@dataclass(slots=True)
class WorkerStats:
    """What a worker did so far."""

    started: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    timed_out: int = 0
    cancelled: int = 0
    dead_lettered: int = 0
    returned: int = 0
    lease_lost: int = 0
    reconnects: int = 0
    #: Unexpected errors the worker's loops logged and survived.
    loop_errors: int = 0


@dataclass(slots=True)
class _InFlight:
    delivery: Delivery
    context: RunContext
    started: float = field(default_factory=time.monotonic)
    cancel_at: float | None = None
    #: Waiting for an abandoned thread of an earlier attempt before its function starts.
    waiting: bool = False


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (a non-UTF-8 file name in an error message) written
    as escapes: the store refuses text that is not valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return _valid_unicode(text[:MAX_ERROR_CHARS])[:MAX_ERROR_CHARS]


def _traceback_text(exc: BaseException) -> str:
    # bounded (the store keeps the end, where the error is, when it must cut)
    text = _valid_unicode("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return text if len(text) <= MAX_TRACEBACK_CHARS else "…" + text[-(MAX_TRACEBACK_CHARS - 1) :]


def _result_json(value: Any) -> str:
    # a value JSON cannot hold is stored as its str(): the run did complete
    return json.dumps(value, separators=(",", ":"), default=str)


def _check_options(
    app: Fairq,
    *,
    concurrency: int,
    max_count: int | None,
    grace_period: float,
    cancel_grace: float,
    idle_timeout: float,
    maintenance_interval: float,
    linger: float,
    max_runs: int | None,
) -> None:
    """Raise :class:`ConfigurationError` for the first bad :class:`Worker` option."""
    if not isinstance(app, Fairq):
        raise ConfigurationError("Worker needs a fairq.Fairq app")
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise ConfigurationError(f"concurrency must be an integer in 1..{MAX_CONCURRENCY}")
    if max_count is not None and (
        isinstance(max_count, bool) or not isinstance(max_count, int) or not 1 <= max_count <= 1000
    ):
        raise ConfigurationError("max_count must be an integer in 1..1000")
    for name, value in (
        ("grace_period", grace_period), ("cancel_grace", cancel_grace),
        ("idle_timeout", idle_timeout), ("maintenance_interval", maintenance_interval),
    ):  # fmt: skip
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= 86_400
        ):
            raise ConfigurationError(f"{name} must be a number of seconds in 0..86400")
    if idle_timeout <= 0 or maintenance_interval <= 0:
        raise ConfigurationError("idle_timeout and maintenance_interval must be positive")
    check_linger(linger)
    if max_runs is not None and (
        isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1
    ):
        raise ConfigurationError("max_runs must be a positive integer")


def _task_queues(app: Fairq, queues: Sequence[str] | None) -> list[str]:
    """The task queues a worker serves: ``queues``, or every task's of the app."""
    names = list(queues) if queues is not None else list(app.tasks)
    unknown = [q for q in names if q not in app.tasks]
    if unknown:
        raise ConfigurationError(f"no task for queue(s) {unknown}; app has {sorted(app.tasks)}")
    if not names:
        raise ConfigurationError("the app has no tasks to run")
    return names


class Worker:
    """Runs an app's tasks.

    Args:
        app: the :class:`Fairq` app whose tasks to run.
        concurrency: most runs in flight in this worker (and threads for plain tasks).
        max_count: most runs leased per dequeue (default: ``concurrency``).
        queues: only these task queues (default: every task of the app).
        grace_period: seconds in-flight runs get to finish after a stop request.
        cancel_grace: seconds a cancelled run gets to stop before it is finished anyway
            (and, for a plain function without a timeout, how long a new attempt waits
            for the abandoned thread of an earlier one before it goes back to the queue).
        max_runs: stop after this many runs ended (None: run until stopped).
        burst: stop once the queues have nothing ready and nothing is in flight.
        idle_timeout: longest sleep without a wake-up hint (seconds).
        maintenance_interval: how often lapsed leases / TTLs are processed (seconds).
        linger: after a dequeue that leased some runs but fewer than it asked for, how long
            the next dequeue waits for more to arrive (seconds; see :class:`Consumer`).
        install_signal_handlers: stop gracefully on SIGTERM / SIGINT (main thread only).
        run_schedules: enqueue the app's schedules' ticks (default True).
    """

    def __init__(
        self,
        app: Fairq,
        *,
        concurrency: int = 10,
        max_count: int | None = None,
        queues: Sequence[str] | None = None,
        grace_period: float = 30.0,
        cancel_grace: float = 10.0,
        max_runs: int | None = None,
        burst: bool = False,
        idle_timeout: float = 1.0,
        maintenance_interval: float = 1.0,
        linger: float = DEFAULT_LINGER_S,
        install_signal_handlers: bool = False,
        run_schedules: bool = True,
    ) -> None:
        _check_options(
            app, concurrency=concurrency, max_count=max_count, grace_period=grace_period,
            cancel_grace=cancel_grace, idle_timeout=idle_timeout,
            maintenance_interval=maintenance_interval, linger=linger, max_runs=max_runs,
        )  # fmt: skip
        self.app = app
        self.concurrency = concurrency
        self.max_count = max(1, min(max_count or concurrency, concurrency, 1000))
        self.queues = _task_queues(app, queues)
        self.grace_period = grace_period
        self.cancel_grace = cancel_grace
        self.max_runs = max_runs
        self.burst = burst
        self.idle_timeout = idle_timeout
        self.maintenance_interval = maintenance_interval
        self.linger = linger
        self.install_signal_handlers = install_signal_handlers
        self.run_schedules = run_schedules
        self.stats = WorkerStats()
        #: Observer of run events (``started`` / ``finished``): the process's Prometheus
        #: counters in :mod:`fairq.metrics` by default; None observes nothing.
        self.metrics: RunMetrics | None = RunMetrics()
        self._stopping = asyncio.Event()
        self._forced = False
        self._inflight: dict[asyncio.Task[None], _InFlight] = {}
        self._by_member: dict[str, asyncio.Task[None]] = {}
        self._slot_free = asyncio.Event()
        self._finished: list[Finish] = []
        self._ack_wake = asyncio.Event()
        self._acks_closed = False
        self._threads: TaskThreads | None = None
        self._rq: RunQueue | None = None
        self._consumer: Consumer | None = None
        self._ended = 0
        self._progress: dict[str, tuple[float, str]] = {}
        #: Runs finished while their task still runs (a cancel past its grace).
        self._abandoned: set[str] = set()
        #: Abandoned runs still unwinding (their slot is already free): task -> lease member.
        self._orphans: dict[asyncio.Task[None], str] = {}

    # ------------------------------------------------------------------ control

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop (graceful; ``force`` skips the grace period).

        Safe to call from a signal handler on the worker's loop; a second call forces.
        """
        if self._stopping.is_set():
            force = True
        self._forced = self._forced or force
        self._stopping.set()
        if self._consumer is not None:
            self._consumer.closed = True
            self._consumer.wake()
        self._slot_free.set()

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping.is_set():
            log.warning("%s again: returning in-flight runs now", name)
        else:
            log.warning(
                "%s: finishing %d in-flight run(s) (up to %ss), then exiting",
                name, len(self._inflight), self.grace_period,
            )  # fmt: skip
        self.stop()

    def _on_cancel(self, member: str) -> None:
        task = self._by_member.get(member)
        if task is not None:
            self._request_cancel(task)

    def _request_cancel(self, task: asyncio.Task[None]) -> None:
        run = self._inflight.get(task)
        if run is None or run.cancel_at is not None:
            return
        run.context._mark_cancelled()
        run.cancel_at = time.monotonic() + self.cancel_grace
        log.info("run %s: cancellation requested", run.delivery.run_id)
        if self.app.tasks[run.delivery.queue].is_async or run.waiting:
            task.cancel(msg="fairq: run cancelled")
        # a plain function sees current_run().cancelled; past cancel_grace it is abandoned

    async def _connection_lost(self) -> None:
        self.stats.reconnects += 1
        await self.app.heal()

    def _count_loop_error(self) -> None:
        self.stats.loop_errors += 1

    def _guard(self, name: str) -> LoopGuard:
        return LoopGuard(name, log, self._count_loop_error)

    def _observe(self, event: str, *args: Any) -> None:
        """Tell the metrics observer (if any) about a run; an observer that fails is
        logged and counted, never allowed to stop the run or the loop that called it."""
        if self.metrics is None:
            return
        try:
            getattr(self.metrics, event)(*args)
        except Exception:
            self._count_loop_error()
            log.exception("metrics: the observer's %s() failed", event)

    # ------------------------------------------------------------------ main loop

    async def run(self) -> WorkerStats:
        """Run until stopped (or ``max_runs`` / ``burst``); returns the stats."""
        loop = asyncio.get_running_loop()
        # first, before anything awaits: a signal from now on stops the worker gracefully
        installed: list[signal.Signals] = []
        if self.install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        self._rq = rq = await self.app.queue()
        self._threads = TaskThreads(self.concurrency, self._slot_free.set)
        self._consumer = Consumer(
            rq, env=self.app.env, queues=self.queues, idle_timeout=self.idle_timeout,
            maintenance_interval=self.maintenance_interval, linger=self.linger,
            on_cancel=self._on_cancel,
            on_connection_lost=self._connection_lost,
            on_loop_error=self._count_loop_error,
        )  # fmt: skip
        for line in await self._retrying(self.app.apply_limits):
            log.info("limits: %s", line)
        acks = asyncio.create_task(self._ack_loop(), name="fairq-acks")
        helpers = [
            asyncio.create_task(self._heartbeat_loop(), name="fairq-heartbeat"),
            asyncio.create_task(self._schedule_loop(), name="fairq-schedules"),
        ]
        try:
            await self._consumer.start()
            await self._fetch_loop()
            await self._drain()
        finally:
            self._consumer.closed = True
            # let the ack loop finish its current batch (a cancelled flush could lose it)
            self._acks_closed = True
            self._ack_wake.set()
            with contextlib.suppress(FairqError):
                await acks
            for h in helpers:
                h.cancel()
            for h in helpers:
                with contextlib.suppress(asyncio.CancelledError, FairqError):
                    await h
            with contextlib.suppress(FairqError):
                await self._flush_acks()
            await self._consumer.close()
            self._threads.shutdown()
            for sig in installed:
                loop.remove_signal_handler(sig)
        return self.stats

    async def _retrying(self, call: Any) -> Any:
        """Run a store call until it works (a lost connection is retried with backoff)."""
        retry_s = 0.05
        while True:
            try:
                return await call()
            except ConnectionLostError as exc:
                if self.stopping:
                    raise
                assert self._consumer is not None
                retry_s = await self._consumer.lost(exc, retry_s)

    async def _fetch_loop(self) -> None:
        assert self._consumer is not None
        guard = self._guard("fetch")
        idle_polls = 0
        while not self.stopping:
            free = self._free_slots()
            if free <= 0:
                self._slot_free.clear()
                if self._free_slots() <= 0:
                    await self._slot_free.wait()
                continue
            timeout = 0.2 if self.burst else None
            try:
                batch = await self._consumer.next_batch(min(free, self.max_count), timeout=timeout)
            except Exception as exc:  # a dequeue that failed is tried again
                await guard.failed(exc)
                continue
            guard.succeeded()
            for delivery in batch:
                self._start(delivery)
            if self.burst:
                idle_polls = 0 if (batch or self._inflight) else idle_polls + 1
                if idle_polls >= 2:
                    self.stop()

    def _free_slots(self) -> int:
        """Runs this worker may lease now: its concurrency, less the runs in flight and
        the abandoned threads beyond the pool's spare ones."""
        assert self._threads is not None
        return self.concurrency - len(self._inflight) - self._threads.excess

    def _start(self, delivery: Delivery) -> None:
        self.stats.started += 1
        context = RunContext(delivery, self._progress)
        # the run's own task, with current_run() set in its context: an async task
        # function runs right in it (no second task per run)
        run_context = contextvars.copy_context()
        run_context.run(_current.set, context)
        task = asyncio.create_task(
            self._execute(delivery, context),
            name=f"fairq-run-{delivery.run_id}",
            context=run_context,
        )
        self._inflight[task] = _InFlight(delivery, context)
        self._by_member[delivery.lease_member] = task
        task.add_done_callback(self._done)
        self._observe("started", delivery)

    def _done(self, task: asyncio.Task[None]) -> None:
        run = self._inflight.pop(task, None)
        if run is not None:
            self._by_member.pop(run.delivery.lease_member, None)
            self._progress.pop(run.delivery.run_id, None)
            self._abandoned.discard(run.delivery.lease_member)
        orphan = self._orphans.pop(task, None)
        if orphan is not None:
            self._abandoned.discard(orphan)
        self._slot_free.set()

    def _count_end(self) -> None:
        self._ended += 1
        if self.max_runs is not None and self._ended >= self.max_runs:
            self.stop()

    async def _drain(self) -> None:
        """After a stop request: wait for in-flight runs, then return the rest."""
        if not self._inflight:
            return
        if not self._forced:
            deadline = time.monotonic() + self.grace_period
            while self._inflight and not self._forced:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._slot_free.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_free.wait(), remaining)
        leftovers = dict(self._inflight)
        if not leftovers:
            return
        log.warning("returning %d unfinished run(s) to the queue", len(leftovers))
        for task in leftovers:
            task.cancel(msg="fairq: worker stopping")
        await asyncio.gather(*leftovers, return_exceptions=True)
        assert self._rq is not None
        for run in leftovers.values():
            with contextlib.suppress(FairqError):
                outcome = await self._rq.nack(
                    run.delivery, increment_attempt=False, retry_delay_ms=0
                )
                if outcome is NackOutcome.REQUEUED:
                    self.stats.returned += 1
                elif outcome is NackOutcome.CANCELLED:
                    self.stats.cancelled += 1

    # ------------------------------------------------------------------ one run

    def _timeout_s(self, task: Task[Any, Any], delivery: Delivery) -> float | None:
        ms = delivery.timeout_ms or task.timeout_ms
        return None if ms is None else ms / 1000

    async def _call(
        self,
        task: Task[Any, Any],
        delivery: Delivery,
        timeout: float | None,  # noqa: ASYNC109 - the run's deadline
    ) -> Any:
        """Run the task function in the run's task (whose context has current_run() set);
        a plain function in a pool thread, with that context."""
        payload = delivery.payload
        if task.is_async:
            if timeout is None:
                return await task.fn(payload)
            async with asyncio.timeout(timeout):
                return await task.fn(payload)
        assert self._threads is not None
        # the thread cannot be interrupted: at the deadline (or a cancel) the run ends
        # here and the thread is abandoned until the function returns
        return await self._threads.call(delivery.run_id, task.fn, payload, timeout)

    async def _execute(self, delivery: Delivery, context: RunContext) -> None:
        strays = self._threads is not None and self._threads.has_strays(delivery.run_id)
        if strays and not await self._after_strays(delivery, context):
            return
        with telemetry.run_span(delivery) as span:
            await self._attempt(delivery, context, span)

    async def _after_strays(self, delivery: Delivery, context: RunContext) -> bool:
        """A new attempt of a run whose abandoned thread still runs here: wait for the
        thread (the run keeps its slot and lease meanwhile), at most the run's timeout
        (else cancel_grace); whether the attempt may start. Past that, the run goes back
        to its queue (its attempt not counted), for another worker or a later try."""
        assert self._threads is not None and self._rq is not None
        task = asyncio.current_task()
        run = self._inflight.get(task) if task is not None else None
        bound = self._timeout_s(self.app.tasks[delivery.queue], delivery) or self.cancel_grace
        log.info("run %s: waiting for the thread of its abandoned attempt", delivery.run_id)
        if run is not None:
            run.waiting = True
        try:
            if await self._threads.wait_for_strays(delivery.run_id, bound):
                return True
        except asyncio.CancelledError:
            if context.cancelled and not self._forced:
                self.stats.cancelled += 1
                self._finish(delivery, RunStatus.CANCELLED, wall_clock_ms(),
                             error="cancelled before it started")  # fmt: skip
                return False
            raise  # shutdown: _drain gives the run back
        finally:
            if run is not None:
                run.waiting = False
        log.warning(
            "run %s: its abandoned attempt's thread still runs after %gs; given back",
            delivery.run_id, bound,
        )  # fmt: skip
        with contextlib.suppress(FairqError):
            outcome = await self._rq.nack(
                delivery, increment_attempt=False, retry_delay_ms=round(bound * 1000)
            )
            if outcome is NackOutcome.CANCELLED:
                self.stats.cancelled += 1
            else:
                self.stats.returned += 1
        return False

    async def _attempt(
        self, delivery: Delivery, context: RunContext, span: telemetry.RunSpan
    ) -> None:
        task = self.app.tasks[delivery.queue]
        started = wall_clock_ms()
        timeout = self._timeout_s(task, delivery)
        try:
            result = await self._call(task, delivery, timeout)
        except asyncio.CancelledError:
            if delivery.lease_member in self._abandoned:
                return
            if context.cancelled and not self._forced:
                span.outcome("cancelled")
                self.stats.cancelled += 1
                self._finish(
                    delivery, RunStatus.CANCELLED, started, error="cancelled while running"
                )
                return
            span.outcome("returned")
            raise  # shutdown: _drain gives the run back
        except TimeoutError as exc:
            if timeout is None or (wall_clock_ms() - started) < timeout * 1000 * 0.99:
                # the task's own TimeoutError
                span.outcome(await self._retry(task, delivery, exc, started), exc)
                return
            self.stats.timed_out += 1
            error = f"TaskTimeoutError: run timed out after {timeout:g}s"
            if delivery.attempt + 1 >= task.retry.max_attempts:
                span.outcome("timed_out", exc)
                self._finish(delivery, RunStatus.TIMED_OUT, started, error=error, exc=exc)
            else:
                span.outcome(await self._retry(task, delivery, exc, started, error=error), exc)
        except PermanentError as exc:
            span.outcome("failed", exc)
            self.stats.failed += 1
            self._finish(delivery, RunStatus.FAILED, started, error=_error_text(exc), exc=exc)
        except Exception as exc:
            span.outcome(await self._retry(task, delivery, exc, started), exc)
        else:
            if context.cancelled:
                span.outcome("cancelled")
                # a plain function that returned after its cancellation was requested
                self.stats.cancelled += 1
                self._finish(
                    delivery, RunStatus.CANCELLED, started, error="cancelled while running"
                )
                return
            span.outcome("completed")
            self.stats.completed += 1
            self._finish(delivery, RunStatus.COMPLETED, started, result=result)

    def _finish(
        self,
        delivery: Delivery,
        status: RunStatus,
        started: int,
        *,
        result: Any = None,
        error: str | None = None,
        exc: BaseException | None = None,
    ) -> None:
        if delivery.lease_member in self._abandoned:
            return
        task = self.app.tasks[delivery.queue]
        keep = status is not RunStatus.COMPLETED or result is not None or delivery.keep_outcome
        if task.keep_result is False and status is RunStatus.COMPLETED:
            keep = False
        if task.keep_result is True:
            keep = True
        outcome = None
        if keep:
            # the ack script adds the run's queue, key, tenant, attempts and times
            outcome = KeptOutcome(
                _result_json(result) if status is RunStatus.COMPLETED else "null",
                error,
                None if exc is None else _traceback_text(exc),
            )
        word = {RunStatus.COMPLETED: "completed", RunStatus.CANCELLED: "cancelled",
                RunStatus.TIMED_OUT: "timed_out"}.get(status, "failed")  # fmt: skip
        self._finished.append(Finish(delivery, word, outcome))
        self._ack_wake.set()
        self._log_run(delivery, status.value, started, error)
        self._observe("finished", delivery, status.value, (wall_clock_ms() - started) / 1000)
        self._count_end()

    def _log_run(self, delivery: Delivery, outcome: str, started: int, error: str | None) -> None:
        run_log.info(
            "run %s %s",
            delivery.run_id,
            outcome,
            extra={
                "run_id": delivery.run_id, "queue": delivery.queue,
                "concurrency_key": delivery.concurrency_key, "tenant": delivery.tenant,
                "attempt": delivery.attempt + 1, "duration_ms": wall_clock_ms() - started,
                "outcome": outcome, "error": error,
            },
        )  # fmt: skip

    async def _retry(
        self,
        task: Task[Any, Any],
        delivery: Delivery,
        exc: BaseException,
        started: int,
        *,
        error: str | None = None,
    ) -> str:
        """Nack a failed attempt (retry later, or dead-letter at the last; a run whose
        cancel was asked meanwhile ends cancelled); returns what happened: retried,
        dead_lettered, cancelled, lease_lost, unknown or nack_failed."""
        assert self._rq is not None
        rq = self._rq
        attempts = delivery.attempt + 1
        policy = task.retry
        error = error or _error_text(exc)
        try:
            result = await rq.nack(
                delivery,
                retry_delay_ms=policy.delay_ms(attempts, rq.rng),
                max_attempts=policy.max_attempts,
                error=error,
                traceback=_traceback_text(exc),
                keep_outcome=True,  # (kept only if this attempt dead-letters the run)
            )
        except FairqError as e:  # the lease will lapse and the run come back
            log.warning("nack of %s failed (%s); its lease will lapse", delivery.run_id, e)
            return "nack_failed"
        if result is NackOutcome.DEAD_LETTERED:
            self.stats.dead_lettered += 1
            self._log_run(delivery, "dead_lettered", started, error)
            self._count_end()
        elif result is NackOutcome.CANCELLED:  # its cancel, asked meanwhile, wins
            self.stats.cancelled += 1
            self._log_run(delivery, "cancelled", started, error)
            self._count_end()
        elif result is NackOutcome.REQUEUED:
            self.stats.retried += 1
            self._log_run(delivery, "retried", started, error)
        else:
            self.stats.lease_lost += 1
        word = "retried" if result is NackOutcome.REQUEUED else result.value
        self._observe("finished", delivery, word, (wall_clock_ms() - started) / 1000)
        return word

    # ------------------------------------------------------------------ helpers

    async def _flush_acks(self) -> None:
        if not self._finished or self._rq is None:
            return
        batch, self._finished = self._finished, []
        statuses: list[AckStatus | None]
        try:
            statuses = list(await self._rq.finish(batch))
        except ConnectionLostError as exc:
            log.warning("finishing %d run(s) failed (%s); retrying", len(batch), exc)
            self._finished[:0] = batch
            await self._connection_lost()
            await asyncio.sleep(0.2)
            return
        except Exception:  # one bad finish must not hold back the rest
            self._count_loop_error()
            log.exception("finishing %d run(s) failed; finishing each alone", len(batch))
            statuses = await self._finish_each(batch)
        for f, st in zip(batch, statuses, strict=True):
            if st is None:
                continue
            if st is not AckStatus.ACKED:
                self.stats.lease_lost += 1
                log.warning(
                    "run %s: finish found %s (it may run again)", f.delivery.run_id, st.value
                )

    async def _finish_each(self, batch: list[Finish]) -> list[AckStatus | None]:
        """After a finish failed unexpectedly: each run again, alone, so that one bad run
        costs only itself (None: it could not be finished; its lease lapses and it runs
        again). A lost connection puts the rest back for the ack loop's retry."""
        assert self._rq is not None
        statuses: list[AckStatus | None] = []
        for i, item in enumerate(batch):
            try:
                statuses += await self._rq.finish([item])
            except ConnectionLostError:
                self._finished[:0] = batch[i:]
                return statuses + [None] * (len(batch) - i)
            except Exception as exc:
                log.error(
                    "run %s: cannot be finished (%s); its lease will lapse and it will run again",
                    item.delivery.run_id, exc,
                )  # fmt: skip
                statuses.append(None)
        return statuses

    async def _ack_loop(self) -> None:
        guard = self._guard("finishing")
        while not self._acks_closed:
            await self._ack_wake.wait()
            self._ack_wake.clear()
            try:
                await self._flush_acks()
            except Exception as exc:  # finishes go on
                await guard.failed(exc)
            else:
                guard.succeeded()
        while self._finished:
            await self._flush_acks()
            if self._finished:
                await asyncio.sleep(0.2)

    async def _heartbeat_loop(self) -> None:
        assert self._rq is not None
        interval = self._rq.config.lease_ms / 3000
        guard = self._guard("heartbeat")
        tick = min(interval, PROGRESS_INTERVAL_S)
        pause, last = tick, time.monotonic()
        while True:
            await asyncio.sleep(pause)
            pause, now = tick, time.monotonic()
            if now - last < interval and not self._progress:
                self._check_cancel_deadlines(now)
                continue
            try:
                self._check_cancel_deadlines(now)
                await self._heartbeat()
            except ConnectionLostError as exc:
                log.warning("heartbeat failed (%s)", exc)
                continue
            except Exception as exc:  # tried again after the backoff alone: leases lapse
                await guard.failed(exc)
                pause = 0
                continue
            guard.succeeded()
            last = now

    async def _heartbeat(self) -> None:
        """Extend the leases of the runs in flight, with their progress notes."""
        assert self._rq is not None
        runs = list(self._inflight.items())
        if not runs:
            return
        progress = self._take_progress()
        statuses = await self._rq.heartbeat([r.delivery for _, r in runs], progress=progress)
        for (task, run), st in zip(runs, statuses, strict=True):
            if st is HeartbeatStatus.CANCEL_REQUESTED:
                self._request_cancel(task)
            elif not st.alive:
                log.warning("run %s: lease lost (it may run again elsewhere)", run.delivery.run_id)

    def _take_progress(self) -> dict[str, tuple[float, str]]:
        """The progress notes to send (taken: each is sent once). A note the store
        would refuse is dropped here, so that it cannot fail the heartbeat of every run
        (``current_run().progress`` refuses them; this guards notes put there otherwise)."""
        notes = dict(self._progress)
        self._progress.clear()
        good: dict[str, tuple[float, str]] = {}
        for run_id, note in notes.items():
            try:
                validate.progress_note(*note)
            except (FairqError, TypeError, ValueError) as exc:
                self._count_loop_error()
                log.error("run %s: progress note dropped (%s)", run_id, exc)
                continue
            good[run_id] = note
        return good

    def _check_cancel_deadlines(self, now: float) -> None:
        """A cancelled run that did not stop within cancel_grace ends cancelled anyway."""
        for task, run in list(self._inflight.items()):
            if run.cancel_at is not None and now >= run.cancel_at and not task.done():
                log.warning(
                    "run %s did not stop within %ss of its cancellation; abandoned",
                    run.delivery.run_id, self.cancel_grace,
                )  # fmt: skip
                self.stats.cancelled += 1
                self._finish(
                    run.delivery, RunStatus.CANCELLED, wall_clock_ms(),
                    error=f"did not stop within {self.cancel_grace:g}s of its cancellation",
                )  # fmt: skip
                self._abandoned.add(run.delivery.lease_member)
                task.cancel(msg="fairq: run abandoned after its cancellation")
                # a task that swallows the cancellation may unwind for a long time: its
                # slot (and its heartbeat) end now; the task stays referenced till it ends
                self._inflight.pop(task, None)
                self._by_member.pop(run.delivery.lease_member, None)
                self._progress.pop(run.delivery.run_id, None)
                self._orphans[task] = run.delivery.lease_member
                self._slot_free.set()

    async def _schedule_loop(self) -> None:
        if not self.run_schedules or not self.app.schedules:
            return
        assert self._rq is not None
        scheduler = Scheduler(self.app)
        guard = self._guard("schedules")
        while True:
            try:
                await scheduler.tick(self._rq)
            except ConnectionLostError as exc:
                log.warning("schedules: %s", exc)
            except Exception as exc:  # the next pass comes
                await guard.failed(exc)
            else:
                guard.succeeded()
            await asyncio.sleep(1.0)


async def run_worker(app: Fairq, **options: Any) -> WorkerStats:
    """Build a :class:`Worker` with ``options`` and run it until stopped."""
    return await Worker(app, **options).run()


__all__ = ["RunContext", "Worker", "WorkerStats", "current_run", "run_worker"]

"""The worker: leases runs of an app's tasks, runs them, and acks, retries or dead-letters.

* Async tasks run on the event loop; plain functions run in a thread pool sized to
  ``concurrency``. At most ``concurrency`` runs are in flight per worker (the server's
  env / queue / key limits apply on top, across all workers).
* Waiting costs nothing: the worker's consumer sleeps on the server's wake-up hints
  (see :mod:`fairq.consumer`), and only dequeues from the app's own queues.
* Leases are extended in one batched ``heartbeat`` call every ``lease / 3``.
* Finished runs are acked in batches: while one ack call is in flight the next ones
  collect. The run's outcome (result or error) is written just before its ack.
* A failing run is nacked with the task's backoff; at its last attempt the server
  dead-letters it. :class:`fairq.app.PermanentError` fails it at once.
* SIGTERM / SIGINT: stop taking work, let in-flight runs finish for ``grace_period``
  seconds, then give the rest back (nack without counting an attempt). A second signal
  skips the grace period. A worker killed outright loses nothing: its leases lapse and
  the maintenance pass of any live consumer requeues the runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import signal
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from fairq import keys as K
from fairq.app import Fairq, PermanentError, RunStatus, Task, outcome_json
from fairq.consumer import Consumer
from fairq.metrics import record_dequeue
from fairq.models import AckStatus, Delivery, NackOutcome
from fairq.store import RunQueue, wall_clock_ms

log = logging.getLogger("fairq.worker")

#: Longest error text kept in a run's outcome.
MAX_ERROR_CHARS = 4_000


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run a task is executing (see :func:`current_run`)."""

    run_id: str
    queue: str
    concurrency_key: str | None
    attempt: int
    delivery: int


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "fairq_current_run", default=None
)


def current_run() -> RunContext | None:
    """The run the calling task is executing (None outside a task); works in sync tasks too."""
    return _current.get()


@dataclass(slots=True)
class WorkerStats:
    """What a worker did so far."""

    started: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    dead_lettered: int = 0
    returned: int = 0
    lease_lost: int = 0


class _AppConsumer(Consumer):
    """A consumer that only dequeues the app's environment and task queues.

    ``RunQueue.dequeue`` serves every environment; a worker must not lease runs it has
    no function for. So it reads the scores of its own master-queue members (one
    ``ZMSCORE``) and runs the dequeue script of each ready one, oldest head first.
    """

    def __init__(self, rq: RunQueue, app: Fairq, queues: Sequence[str], **kwargs: Any) -> None:
        super().__init__(rq, **kwargs)
        self.app = app
        shard = rq.keys.shard(rq.keys.shard_of(app.env))
        self._master = shard.master
        self._members = [
            (K.master_member(kind, app.env, q), q, kind == K.KIND_CK)
            for q in queues
            for kind in (K.KIND_QUEUE, K.KIND_CK)
        ]

    async def _scores(self) -> list[tuple[float, str, bool]]:
        raw = await self.rq.client.zmscore(self._master, [m for m, _, _ in self._members])
        return sorted(
            (float(score), queue, keyed)
            for (_, queue, keyed), score in zip(self._members, raw, strict=True)
            if score is not None
        )

    async def dequeue(self, max_count: int) -> tuple[list[Delivery], int | None]:
        """Lease up to ``max_count`` runs; also returns the earliest future head (ms)."""
        now = wall_clock_ms()
        out: list[Delivery] = []
        next_due: int | None = None
        for score, queue, keyed in await self._scores():
            if score > now:
                next_due = int(score) if next_due is None else min(next_due, int(score))
                continue
            if len(out) >= max_count:
                break
            out += await self.rq.dequeue_from_queue(
                self.app.env, queue, keyed=keyed, max_count=max_count - len(out), now_ms=now
            )
        return out, next_due


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[:MAX_ERROR_CHARS]


def _result_json(value: Any) -> str:
    # a value JSON cannot hold is stored as its str(): the run did complete
    return json.dumps(value, separators=(",", ":"), default=str)


@dataclass(slots=True)
class _Finished:
    delivery: Delivery
    outcome: str


class Worker:
    """Runs an app's tasks.

    Args:
        app: the :class:`Fairq` app whose tasks to run.
        concurrency: most runs in flight in this worker (and threads for sync tasks).
        max_count: most runs leased per dequeue (default: ``concurrency``).
        queues: only these task queues (default: every task of the app).
        grace_period: seconds in-flight runs get to finish after a stop request.
        max_runs: stop after this many runs ended (None: run until stopped).
        burst: stop once the queues have nothing ready and nothing is in flight.
        idle_timeout: longest sleep without a wake-up hint (seconds).
        maintenance_interval: how often lapsed leases / TTLs are processed (seconds).
        install_signal_handlers: stop gracefully on SIGTERM / SIGINT (main thread only).
    """

    def __init__(
        self,
        app: Fairq,
        *,
        concurrency: int = 10,
        max_count: int | None = None,
        queues: Sequence[str] | None = None,
        grace_period: float = 30.0,
        max_runs: int | None = None,
        burst: bool = False,
        idle_timeout: float = 1.0,
        maintenance_interval: float = 1.0,
        install_signal_handlers: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app = app
        self.concurrency = concurrency
        self.max_count = max(1, min(max_count or concurrency, concurrency))
        names = list(queues) if queues is not None else list(app.tasks)
        unknown = [q for q in names if q not in app.tasks]
        if unknown:
            raise ValueError(f"no task for queue(s) {unknown}; app has {sorted(app.tasks)}")
        if not names:
            raise ValueError("the app has no tasks to run")
        self.queues = names
        self.grace_period = grace_period
        self.max_runs = max_runs
        self.burst = burst
        self.idle_timeout = idle_timeout
        self.maintenance_interval = maintenance_interval
        self.install_signal_handlers = install_signal_handlers
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._forced = False
        self._inflight: dict[asyncio.Task[None], Delivery] = {}
        self._slot_free = asyncio.Event()
        self._finished: list[_Finished] = []
        self._ack_wake = asyncio.Event()
        self._acks_closed = False
        self._executor: ThreadPoolExecutor | None = None
        self._rq: RunQueue | None = None
        self._consumer: _AppConsumer | None = None
        self._ended = 0

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
            self._consumer._wake.set()
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

    # ------------------------------------------------------------------ main loop

    async def run(self) -> WorkerStats:
        """Run until stopped (or ``max_runs`` / ``burst``); returns the stats."""
        loop = asyncio.get_running_loop()
        self._rq = rq = await self.app.queue()
        self._executor = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="fairq-task"
        )
        self._consumer = _AppConsumer(
            rq, self.app, self.queues,
            idle_timeout=self.idle_timeout, maintenance_interval=self.maintenance_interval,
        )  # fmt: skip
        installed: list[signal.Signals] = []
        if self.install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        for line in await self.app.apply_limits():
            log.info("limits: %s", line)
        acks = asyncio.create_task(self._ack_loop(), name="fairq-acks")
        helpers = [
            asyncio.create_task(self._heartbeat_loop(), name="fairq-heartbeat"),
            asyncio.create_task(self._expired_loop(), name="fairq-expired"),
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
            with contextlib.suppress(RedisError, OSError):
                await acks
            for h in helpers:
                h.cancel()
            for h in helpers:
                with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                    await h
            await self._flush_acks()
            await self._consumer.close()
            self._executor.shutdown(wait=False, cancel_futures=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
        return self.stats

    async def _fetch_loop(self) -> None:
        assert self._consumer is not None
        idle_polls = 0
        while not self.stopping:
            free = self.concurrency - len(self._inflight)
            if free <= 0:
                self._slot_free.clear()
                if self.concurrency - len(self._inflight) <= 0:
                    await self._slot_free.wait()
                continue
            timeout = 0.2 if self.burst else None
            try:
                batch = await self._consumer.next_batch(min(free, self.max_count), timeout=timeout)
            except (RedisError, OSError) as exc:
                log.warning("dequeue failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for delivery in batch:
                self._start(delivery)
            if batch:
                # the dashboard's served-share chart and the wait histogram
                with contextlib.suppress(RedisError, OSError):
                    await record_dequeue(self._consumer.rq, batch)
            if self.burst:
                idle_polls = 0 if (batch or self._inflight) else idle_polls + 1
                if idle_polls >= 2:
                    self.stop()

    def _start(self, delivery: Delivery) -> None:
        self.stats.started += 1
        task = asyncio.create_task(self._execute(delivery), name=f"fairq-run-{delivery.run_id}")
        self._inflight[task] = delivery
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
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
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)
        assert self._rq is not None
        for delivery in leftovers.values():
            with contextlib.suppress(RedisError, OSError):
                outcome = await self._rq.nack(
                    delivery, increment_attempt=False, retry_at_ms=wall_clock_ms()
                )
                if outcome is NackOutcome.REQUEUED:
                    self.stats.returned += 1

    # ------------------------------------------------------------------ one run

    async def _call(self, task: Task[Any], delivery: Delivery, payload: Any) -> Any:
        ctx = contextvars.copy_context()
        run = RunContext(
            delivery.run_id,
            delivery.queue,
            delivery.concurrency_key,
            delivery.attempt,
            delivery.delivery,
        )
        ctx.run(_current.set, run)
        if task.is_async:
            coro = task.fn(payload)
            return await asyncio.create_task(coro, context=ctx)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, functools.partial(ctx.run, task.fn, payload)
        )

    async def _execute(self, delivery: Delivery) -> None:
        task = self.app.tasks[delivery.queue]
        try:
            payload = delivery.payload
            result = await self._call(task, delivery, payload)
        except asyncio.CancelledError:
            raise  # shutdown: _drain gives the run back
        except PermanentError as exc:
            self.stats.failed += 1
            self._finish(
                delivery, RunStatus.FAILED, error=_error_text(exc), attempts=delivery.attempt + 1
            )
        except Exception as exc:
            await self._retry(task, delivery, exc)
        else:
            self.stats.completed += 1
            self._finish(
                delivery,
                RunStatus.COMPLETED,
                result_json=_result_json(result),
                attempts=delivery.attempt,
            )

    def _finish(
        self,
        delivery: Delivery,
        status: RunStatus,
        *,
        attempts: int,
        result_json: str = "null",
        error: str | None = None,
    ) -> None:
        outcome = outcome_json(
            status, queue=delivery.queue, concurrency_key=delivery.concurrency_key,
            attempts=attempts, result_json=result_json, error=error, finished_at_ms=wall_clock_ms(),
        )  # fmt: skip
        self._finished.append(_Finished(delivery, outcome))
        self._ack_wake.set()
        self._count_end()

    async def _retry(self, task: Task[Any], delivery: Delivery, exc: Exception) -> None:
        assert self._rq is not None
        rq = self._rq
        attempts = delivery.attempt + 1
        policy = task.retry
        error = _error_text(exc)
        last = attempts >= policy.max_attempts
        status = RunStatus.DEAD_LETTERED if last else RunStatus.QUEUED
        outcome = outcome_json(
            status, queue=delivery.queue, concurrency_key=delivery.concurrency_key,
            attempts=attempts, error=error, finished_at_ms=wall_clock_ms() if last else None,
        )  # fmt: skip
        log.info(
            "run %s failed (attempt %d of %d): %s",
            delivery.run_id,
            attempts,
            policy.max_attempts,
            error,
        )
        try:
            await rq.client.set(
                self.app.outcome_key(rq, delivery.run_id), outcome, ex=self.app.result_ttl_seconds
            )
            result = await rq.nack(
                delivery,
                retry_at_ms=wall_clock_ms() + policy.delay_ms(attempts, rq.rng),
                max_attempts=policy.max_attempts,
            )
        except (RedisError, OSError) as e:  # the lease will lapse and the run come back
            log.warning("nack of %s failed (%s); its lease will lapse", delivery.run_id, e)
            return
        if result is NackOutcome.DEAD_LETTERED:
            self.stats.dead_lettered += 1
            self._count_end()
        elif result is NackOutcome.REQUEUED:
            self.stats.retried += 1
        else:
            self.stats.lease_lost += 1

    # ------------------------------------------------------------------ helpers

    async def _flush_acks(self) -> None:
        if not self._finished or self._rq is None:
            return
        rq = self._rq
        batch, self._finished = self._finished, []
        try:
            pipe = rq.client.pipeline(transaction=False)
            for f in batch:
                pipe.set(
                    self.app.outcome_key(rq, f.delivery.run_id),
                    f.outcome,
                    ex=self.app.result_ttl_seconds,
                )
            await pipe.execute()
            statuses = await rq.ack([f.delivery for f in batch])
        except (RedisError, OSError) as exc:
            log.warning("ack of %d run(s) failed (%s); retrying", len(batch), exc)
            self._finished[:0] = batch
            await asyncio.sleep(0.2)
            return
        for f, st in zip(batch, statuses, strict=True):
            if st is not AckStatus.ACKED:
                self.stats.lease_lost += 1
                log.warning("run %s: ack found %s (it may run again)", f.delivery.run_id, st.value)

    async def _ack_loop(self) -> None:
        while not self._acks_closed:
            await self._ack_wake.wait()
            self._ack_wake.clear()
            await self._flush_acks()
        await self._flush_acks()

    async def _heartbeat_loop(self) -> None:
        assert self._rq is not None
        interval = self._rq.config.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            deliveries = list(self._inflight.values())
            if not deliveries:
                continue
            try:
                alive = await self._rq.heartbeat(deliveries)
            except (RedisError, OSError) as exc:
                log.warning("heartbeat failed (%s)", exc)
                continue
            for d, ok in zip(deliveries, alive, strict=True):
                if not ok:
                    log.warning("run %s: lease lost (it may run again elsewhere)", d.run_id)

    async def _expired_loop(self) -> None:
        while True:
            try:
                await self.app.record_expired()
            except (RedisError, OSError) as exc:
                log.warning("recording expired runs failed (%s)", exc)
            await asyncio.sleep(max(self.maintenance_interval, 0.5))


async def run_worker(app: Fairq, **options: Any) -> WorkerStats:
    """Build a :class:`Worker` with ``options`` and run it until stopped."""
    return await Worker(app, **options).run()


__all__ = ["RunContext", "Worker", "WorkerStats", "current_run", "run_worker"]

"""A consumer: leases batches of runs without busy polling, keeps maintenance going, and
survives the server going away.

Waiting: scripts that make work available (enqueue, nack, redrive, reclaim) publish a
hint when a queue's head changes, and scripts that free slots publish one when a
consumer had found ready work behind a limit (see :mod:`fairq.store.hints`). A consumer
stays subscribed; before each dequeue attempt it clears its event, so a hint that
arrives while it dequeues is never lost. When a dequeue finds nothing it sleeps until a
hint, the moment the dequeue said something held back becomes ready (a delayed run, a
backoff, a rate limit's next token), or ``idle_timeout`` — whichever is first.

Lingering: a dequeue that leased some runs but fewer than it asked for means runs are
arriving one by one. The next dequeue then waits until ``linger`` seconds (2 ms by
default) after that one, so that it leases the runs that arrived meanwhile in one call
instead of one call per run (each call, and each run's wake-up hint, costs the server
more than the run's share of a batch). A consumer that found nothing, or a full batch,
does not linger: an idle consumer still picks up a new run at once, and one under a
backlog dequeues back to back.

Maintenance (requeueing runs whose lease lapsed, expiring runs whose TTL passed) runs
on a timer, also while a consumer waits (:meth:`fairq.store.RunQueue.maintain`).

Every dequeue call is observed in :mod:`fairq.metrics` (latency of each run leased, and
of the call), in memory; the served record itself is written by the dequeue scripts.

A lost connection (the server restarted, or is away): the consumer logs it, calls its
``on_connection_lost`` hook (the app's: restart the shared server if it is down) and
retries with bounded backoff; it resumes by itself when the server is back. Any other
error of the wake-up listener, of maintenance or of the metrics is logged and retried
the same way (:class:`fairq.loops.LoopGuard`): none of them stops the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from fairq import keys as K
from fairq import metrics
from fairq.errors import ConfigurationError, ConnectionLostError, InvalidNameError, short
from fairq.keys import Environment
from fairq.loops import MAX_BACKOFF_S, MIN_BACKOFF_S, LoopGuard
from fairq.models import Delivery
from fairq.store import RunQueue
from fairq.store.hints import HintSubscription

log = logging.getLogger("fairq.consumer")

#: Backoff bounds after a lost connection (s): those of any loop that failed.
MIN_RETRY_S: Final = MIN_BACKOFF_S
MAX_RETRY_S: Final = MAX_BACKOFF_S
#: How long after a partial batch the next dequeue waits for more runs (s), by default.
DEFAULT_LINGER_S: Final = 0.002
#: The longest linger a consumer accepts (s).
MAX_LINGER_S: Final = 1.0


def check_linger(linger: object) -> None:
    """Raises ConfigurationError unless ``linger`` is a number of seconds a consumer takes."""
    if (
        isinstance(linger, bool)
        or not isinstance(linger, int | float)
        or not math.isfinite(linger)
        or not 0 <= linger <= MAX_LINGER_S
    ):
        raise ConfigurationError(
            f"linger must be a number of seconds in [0, {MAX_LINGER_S}], got {short(linger)}"
        )


def _observe(deliveries: list[Delivery], call_seconds: float) -> None:
    """Observe a dequeue in the metrics; a failure there is logged, never raised (the
    runs are leased: they must reach the caller)."""
    try:
        metrics.observe_dequeue(deliveries, call_seconds=call_seconds)
    except Exception:
        log.exception("metrics: observing a dequeue failed")


class Consumer:
    """Leases batches from a :class:`RunQueue`.

    Args:
        rq: the run queue.
        env: only this environment (and then ``queues``: only these queues of it).
        queues: the queues to serve (with ``env``).
        idle_timeout: longest sleep without a hint (seconds).
        maintenance_interval: how often lapsed leases and TTLs are processed (seconds).
        linger: after a dequeue that leased fewer runs than asked (but some), how long
            after it the next dequeue waits for more to arrive (seconds; 0 = never).
        on_cancel: called with a run's lease member when its cancellation is requested.
        on_connection_lost: awaited after a lost connection, before retrying.
        on_loop_error: called once per unexpected error a loop of the consumer survived.
    """

    def __init__(
        self,
        rq: RunQueue,
        *,
        env: Environment | None = None,
        queues: Sequence[str] | None = None,
        idle_timeout: float = 1.0,
        maintenance_interval: float = 1.0,
        linger: float = DEFAULT_LINGER_S,
        on_cancel: Callable[[str], None] | None = None,
        on_connection_lost: Callable[[], Awaitable[None]] | None = None,
        on_loop_error: Callable[[], None] | None = None,
    ) -> None:
        if not isinstance(rq, RunQueue):
            raise ConfigurationError(f"a Consumer needs a RunQueue, got {short(rq)}")
        if env is not None and not isinstance(env, Environment):
            raise ConfigurationError(f"env must be an Environment or None, got {short(env)}")
        for name, value in (("idle_timeout", idle_timeout),
                            ("maintenance_interval", maintenance_interval)):  # fmt: skip
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 < value <= 86_400
            ):
                raise ConfigurationError(
                    f"{name} must be a number of seconds in (0, 86400], got {short(value)}"
                )
        check_linger(linger)
        names = None if queues is None else list(queues)
        try:
            for q in names or []:
                K.validate_name("queue", q, allow_slash=True)
        except InvalidNameError as exc:
            raise ConfigurationError(str(exc)) from None
        self.rq = rq
        self.env = env
        self.queues = names
        self.idle_timeout = idle_timeout
        self.maintenance_interval = maintenance_interval
        self.linger = linger
        #: loop time of the last dequeue that leased some runs but fewer than asked (only
        #: kept when this consumer lingers)
        self._partial_at: float | None = None
        self.on_cancel = on_cancel
        self.on_connection_lost = on_connection_lost
        self._listen_guard = LoopGuard("wake-up listener", log, on_loop_error)
        self._maintain_guard = LoopGuard("maintenance", log, on_loop_error)
        self._wake = asyncio.Event()
        self._hints = HintSubscription(rq)
        self._listener: asyncio.Task[None] | None = None
        self._next_maintenance = 0.0
        self.closed = False

    async def start(self) -> Consumer:
        """Subscribe to wake-up hints (idempotent)."""
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="fairq-wake-listener")
        return self

    async def _listen(self) -> None:
        """Hear hints until closed; a failure (a hook that raised, anything the
        subscription did not expect) is logged and the subscription made again."""
        while not self.closed:
            try:
                async with contextlib.aclosing(self._hints.messages()) as hints:
                    async for hint in hints:
                        self._hear(hint)
                        self._listen_guard.succeeded()
                return
            except Exception as exc:  # the listener must outlive any hint
                self._wake.set()  # anything may have happened meanwhile
                await self._listen_guard.failed(exc)

    def _hear(self, hint: str) -> None:
        if hint.startswith("cancel:"):
            if self.on_cancel is not None:
                self.on_cancel(hint[len("cancel:") :])
            return
        self._wake.set()

    def wake(self) -> None:
        """End a wait now (a stop request, or new local capacity)."""
        self._wake.set()

    async def close(self) -> None:
        self.closed = True
        await self._hints.close()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def maintain(self, *, force: bool = False) -> None:
        """Reclaim lapsed leases and expire TTLs, at most once per interval across consumers."""
        loop = asyncio.get_running_loop()
        if not force and loop.time() < self._next_maintenance:
            return
        self._next_maintenance = loop.time() + self.maintenance_interval
        try:
            await self.rq.maintain(interval_s=self.maintenance_interval, force=force)
        except ConnectionLostError:
            raise
        except Exception as exc:  # dequeues go on; maintenance at the next interval
            await self._maintain_guard.failed(exc)
        else:
            self._maintain_guard.succeeded()

    async def wait_for_hint(self, wait: float) -> None:
        """Sleep up to ``wait`` seconds, or until a hint arrives; maintenance keeps its
        timer meanwhile (a reclaim publishes a hint, which ends the wait)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        while not self.closed:
            now = loop.time()
            if now >= end:
                return
            step = min(end - now, max(0.0, self._next_maintenance - now))
            try:
                await asyncio.wait_for(self._wake.wait(), step)
                return
            except TimeoutError:
                pass
            if loop.time() >= self._next_maintenance:
                await self.maintain()

    async def _linger(self) -> None:
        """After a partial batch: wait until ``linger`` after it (runs are arriving one
        by one; the next dequeue takes those that arrived meanwhile together)."""
        if self._partial_at is None:
            return
        delay = self._partial_at + self.linger - asyncio.get_running_loop().time()
        self._partial_at = None
        if delay > 0 and not self.closed:
            await asyncio.sleep(delay)

    async def lost(self, exc: ConnectionLostError, retry_s: float) -> float:
        """A lost connection: log, heal, back off. Returns the next backoff."""
        log.warning("server %s unavailable (%s); retrying in %.2fs", exc.url, exc.reason, retry_s)
        if self.on_connection_lost is not None:
            with contextlib.suppress(Exception):
                await self.on_connection_lost()
        await asyncio.sleep(retry_s)
        return min(retry_s * 2, MAX_RETRY_S)

    async def next_batch(
        self,
        max_count: int = 10,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Delivery]:
        """Lease up to ``max_count`` runs, waiting (without polling) until some are ready.

        Returns an empty list only when ``timeout`` (seconds) passes or the consumer
        closes. Connection losses are retried (with the hook and backoff) meanwhile.
        """
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        retry_s = MIN_RETRY_S
        await self._linger()
        while not self.closed:
            self._wake.clear()
            try:
                await self.maintain()
                started = time.perf_counter()
                batch = await self.rq.dequeue_batch(max_count, env=self.env, queues=self.queues)
                _observe(batch.deliveries, time.perf_counter() - started)
            except ConnectionLostError as exc:
                retry_s = await self.lost(exc, retry_s)
                continue
            if retry_s != MIN_RETRY_S:
                log.warning("server %s is back", self.rq.server)
                retry_s = MIN_RETRY_S
            if batch.deliveries:
                partial = self.linger > 0 and len(batch.deliveries) < max_count
                self._partial_at = loop.time() if partial else None
                return batch.deliveries
            self._partial_at = None
            wait = self.idle_timeout
            if batch.wait_ms is not None:
                wait = min(wait, batch.wait_ms / 1000)
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wait = min(wait, remaining)
            await self.wait_for_hint(wait)
        return []

"""A consumer: leases batches of runs without busy polling, and keeps maintenance going.

Waiting: every script that makes work available (enqueue, nack, redrive, reclaim) or
frees slots (ack, release) publishes a hint on ``<prefix>:wake``. A consumer stays
subscribed; before each dequeue attempt it clears its event, so a hint that arrives
while it dequeues is never lost. When a dequeue finds nothing, it sleeps until a hint,
the earliest future head (delayed runs, backoff), or ``idle_timeout`` — whichever is
first. An idle consumer therefore costs the server one tiny pipeline per
``idle_timeout``; a new message is picked up within milliseconds of its enqueue.

Maintenance (requeueing runs whose lease lapsed, expiring runs whose TTL passed) runs
on a timer, also while a consumer waits; a short ``SET NX PX`` lock makes one consumer
per interval do it, and one read per shard skips the scripts when nothing is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from fairq.models import Delivery
from fairq.store import RunQueue, wall_clock_ms

log = logging.getLogger("fairq.consumer")

#: Longest time one consumer's maintenance lock keeps the others from maintaining (s).
MAX_MAINTENANCE_LOCK_S = 1.0


class Consumer:
    """Leases batches from a :class:`RunQueue`.

    Args:
        rq: the run queue.
        idle_timeout: longest sleep without a hint (seconds).
        maintenance_interval: how often lapsed leases and TTLs are processed (seconds).
    """

    def __init__(
        self,
        rq: RunQueue,
        *,
        idle_timeout: float = 1.0,
        maintenance_interval: float = 1.0,
    ) -> None:
        self.rq = rq
        self.idle_timeout = idle_timeout
        self.maintenance_interval = maintenance_interval
        self._wake = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._pubsub_client: Any = None
        self._next_maintenance = 0.0
        self.closed = False

    async def start(self) -> Consumer:
        """Subscribe to wake-up hints (idempotent)."""
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="fairq-wake-listener")
        return self

    def _pubsub_source(self) -> Any:
        client = self.rq.client
        if isinstance(client, RedisCluster):
            # Classic PUBLISH is broadcast to every node of a cluster: any node will do.
            node = client.get_default_node()
            return aioredis.Redis(host=node.host, port=int(node.port), **_auth(client))
        return client

    async def _listen(self) -> None:
        backoff = 0.05
        while not self.closed:
            try:
                self._pubsub_client = self._pubsub_source()
                pubsub = self._pubsub_client.pubsub(ignore_subscribe_messages=True)
                async with pubsub:
                    await pubsub.subscribe(self.rq.keys.wake_channel)
                    self._wake.set()  # (re)subscribed: anything may have happened meanwhile
                    backoff = 0.05
                    while not self.closed:
                        message = await pubsub.get_message(timeout=None)
                        if message is not None:
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("wake-up subscription lost (%s); retrying", exc)
                self._wake.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def close(self) -> None:
        self.closed = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await self._listener
            self._listener = None
        if self._pubsub_client is not None and self._pubsub_client is not self.rq.client:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub_client.aclose()

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
        lock = f"{self.rq.keys.prefix}:maintenance-lock"
        # The lock only stops consumers sharing a prefix from duplicating work; capped so
        # that one with a long interval (or a dead one) cannot hold everyone else off.
        ms = max(1, int(min(self.maintenance_interval, MAX_MAINTENANCE_LOCK_S) * 1000))
        if force:
            await self.rq.reclaim_lapsed_leases()
            await self.rq.expire_ttl()
        elif await self.rq.client.set(lock, b"1", nx=True, px=ms):
            # one cheap read first: an idle system runs no script at all
            leases, ttls = await self.rq.maintenance_due()
            if leases:
                await self.rq.reclaim_lapsed_leases(shards=leases)
            if ttls:
                await self.rq.expire_ttl(shards=ttls)

    async def wait_for_hint(self, wait: float) -> None:
        """Sleep up to ``wait`` seconds, or until a hint arrives.

        Maintenance stays on its timer meanwhile: a consumer waiting out a long
        ``idle_timeout`` still reclaims lapsed leases every ``maintenance_interval``
        (a reclaim publishes a hint, which ends the wait).
        """
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

    async def dequeue(self, max_count: int) -> tuple[list[Delivery], int | None]:
        """One attempt: leased runs, and (when none) the earliest head score in ms (a
        future one tells how long to sleep). Subclasses narrow what is dequeued."""
        batch = await self.rq.dequeue(max_count)
        return batch, (None if batch else await self.rq.next_due_ms())

    async def next_batch(
        self,
        max_count: int = 10,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Delivery]:
        """Lease up to ``max_count`` runs, waiting (without polling) until some are ready.

        Returns an empty list only when ``timeout`` (seconds) passes or the consumer closes.
        """
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.closed:
            self._wake.clear()
            await self.maintain()
            batch, due = await self.dequeue(max_count)
            if batch:
                return batch
            wait = self.idle_timeout
            now = wall_clock_ms()
            if due is not None and due > now:
                # a delayed run (or a backoff) becomes ready then; ready-but-gated work
                # waits for the hint an ack or release publishes instead
                wait = min(wait, (due - now) / 1000)
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wait = min(wait, remaining)
            await self.wait_for_hint(wait)
        return []


def _auth(client: RedisCluster) -> dict[str, Any]:
    kwargs: dict[str, Any] = getattr(client.get_default_node(), "connection_kwargs", {}) or {}
    return {k: kwargs[k] for k in ("username", "password") if k in kwargs}

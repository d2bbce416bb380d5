"""Maintenance: requeue runs whose lease lapsed, expire runs whose TTL passed, and sample
who is backlogged for the shares record (:mod:`fairq.store.shares`).

Both run as scripts on the server's clock, shard by shard. :meth:`MaintenanceOps.maintain`
is what consumers call on a timer: a short ``SET NX PX`` lock makes one process per
interval do it, and one read of every shard (on the server's clock) skips the scripts
when nothing is due, so an idle system runs no script at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from fairq.keys import ShardKeys
from fairq.store import validate
from fairq.store._core import StoreCore

#: Longest time one process's maintenance lock keeps the others from maintaining (s).
MAX_MAINTENANCE_LOCK_S: Final = 1.0


class MaintenanceOps(StoreCore):
    if TYPE_CHECKING:

        async def rebalance_spread(self, *, now_ms: int | None = None) -> None: ...

        async def sample_shares(
            self,
            *,
            now_ms: int | None = None,
            shards: Iterable[int] | None = None,
            queues: int = ...,
            flows: int = ...,
        ) -> int: ...

    def _shard_keys(self, shards: Iterable[int] | None) -> list[ShardKeys]:
        if shards is None:
            return self.keys.shards()
        return [self.keys.shard(i) for i in shards]

    async def maintenance_due(self, *, now_ms: int | None = None) -> tuple[list[int], list[int]]:
        """Shards with a lapsed lease, and shards with a passed TTL (one round trip),
        judged on the server's clock (or ``now_ms``)."""
        leases, ttls, _ = await self._due(now_ms)
        return leases, ttls

    async def _due(self, now_ms: int | None) -> tuple[list[int], list[int], list[int]]:
        """:meth:`maintenance_due`, and the shards with ready work (to sample)."""
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        shards = self.keys.shards()

        def build(pipe: Any) -> None:
            for s in shards:
                pipe.zrange(s.leases, 0, 0, withscores=True)
                pipe.zrange(s.ttl, 0, 0, withscores=True)
                pipe.zrange(s.heads, 0, 0, withscores=True)

        if now_ms is None:
            now, raw = await self.timed_pipeline(build)
        else:
            now, raw = now_ms, await self.pipeline(build)

        def due(column: int) -> list[int]:
            return [
                s.shard for i, s in enumerate(shards)
                if raw[3 * i + column] and raw[3 * i + column][0][1] <= now
            ]  # fmt: skip

        return due(0), due(1), due(2)

    async def reclaim_lapsed_leases(
        self, *, now_ms: int | None = None, batch: int = 100, shards: Iterable[int] | None = None
    ) -> int:
        """Requeue runs whose lease lapsed (lost consumers), on every shard (or ``shards``)."""
        return await self._sweep("reclaim", now_ms, batch, shards)

    async def expire_ttl(
        self, *, now_ms: int | None = None, batch: int = 100, shards: Iterable[int] | None = None
    ) -> int:
        """Expire queued runs whose TTL passed, on every shard (or ``shards``); returns how many."""
        return await self._sweep("expire_ttl", now_ms, batch, shards)

    async def _sweep(
        self, operation: str, now_ms: int | None, batch: int, shards: Iterable[int] | None
    ) -> int:
        """Run a shard-wide maintenance script on each shard; the runs it handled."""
        validate.integer("batch", batch, 1, validate.MAX_MAINTENANCE_BATCH)
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        total = 0
        for s in self._shard_keys(shards):
            reply = await self.call(operation, self.order_for_shard(s.shard), s.tag,
                                    [str(batch)], now_ms)  # fmt: skip
            self.decode(operation, reply[0])
            total += int(reply[1])
        return total

    async def maintain(self, *, interval_s: float = 1.0, force: bool = False) -> bool:
        """Reclaim lapsed leases, expire TTLs and sample the backlog (the shares record),
        at most once per interval across every process sharing the prefix. Returns whether
        this call did the work."""
        validate.number("interval_s", interval_s, 0.001, 86_400)
        if force:
            await self.reclaim_lapsed_leases()
            await self.expire_ttl()
            await self.sample_shares()
            await self.rebalance_spread()
            return True
        # The lock only stops processes sharing a prefix from duplicating work; capped so
        # that one with a long interval (or a dead one) cannot hold everyone else off.
        ms = max(1, int(min(interval_s, MAX_MAINTENANCE_LOCK_S) * 1000))
        if not await self.read(self.client.set(self.keys.maintenance_lock, b"1", nx=True, px=ms)):
            return False
        leases, ttls, ready = await self._due(None)
        if leases:
            await self.reclaim_lapsed_leases(shards=leases)
        if ttls:
            await self.expire_ttl(shards=ttls)
        if ready:  # who is backlogged now (fairq.store.shares)
            await self.sample_shares(shards=ready)
        # idle quota of spread environments back where work waits (store/quotas.py)
        await self.rebalance_spread()
        return True

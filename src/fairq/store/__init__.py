"""The run queue: fairq's typed API over its Lua scripts, and the only owner of the keyspace.

Every state change is one atomic script touching one hash slot, on the server's clock.
Nothing about scheduling lives in process memory, so any number of :class:`RunQueue`
objects (in any number of processes) may share a server. No module outside this package
touches the Redis client.

Layout: :mod:`._core` (client, script calls, error translation), :mod:`.enqueue`,
:mod:`.dequeue` (+ :mod:`.selection`), :mod:`.finish`, :mod:`.maintenance`,
:mod:`.admin` (limits, options, caps, rates, weights), :mod:`.readers`, :mod:`.shares`
(shares received vs entitled); the scripts
(:mod:`.scripts`, ``lua/``), their context (:mod:`.context`), reply codes
(:mod:`.status`), stored options (:mod:`.options`) and input checks (:mod:`.validate`).

Clocks: every method that needs "now" takes ``now_ms``, a *logical* clock for tests and
the simulator. Without it the scripts use the server's clock (``TIME``), so leases,
delays, TTLs and rate limits never depend on a client's clock.
"""

from __future__ import annotations

import random

from fairq.config import MAX_DEQUEUE_COUNT, RunQueueConfig
from fairq.server import AnyRedis
from fairq.store._core import StoreCore, wall_clock_ms
from fairq.store.admin import AdminOps, Change
from fairq.store.backlog import Backlog, BacklogOps
from fairq.store.dequeue import DequeueOps
from fairq.store.enqueue import EnqueueOps
from fairq.store.finish import FinishOps
from fairq.store.layout import LayoutOps
from fairq.store.maintenance import MaintenanceOps
from fairq.store.position import RunPosition
from fairq.store.readers import HistoryBucket, ReaderOps, RecentRun
from fairq.store.runs import RunOps
from fairq.store.selection import SelectionStrategy
from fairq.store.shares import SharesOps
from fairq.store.validate import payload as encode_payload


class RunQueue(
    EnqueueOps,
    DequeueOps,
    FinishOps,
    RunOps,
    MaintenanceOps,
    LayoutOps,
    AdminOps,
    BacklogOps,
    ReaderOps,
    SharesOps,
):
    """Enqueue, dequeue, finish and inspect runs; set limits and options.

    Args:
        client: an asyncio Redis or RedisCluster client (bytes responses).
        config: options; server-side settings win over its scheduling defaults.
        rng: randomness for the shard order, the environment shuffle and backoff jitter
            (seed it in tests).
    """

    def __init__(
        self,
        client: AnyRedis,
        config: RunQueueConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        StoreCore.__init__(self, client, config, rng=rng)
        self.selection = SelectionStrategy(self.rng)
        self._batches = {}
        self._sending = set()
        self._drainers = set()
        self._views = {}
        self._floor_hints = {}
        self._leaks = {}
        self._rebalanced = {}
        self._credits = {}


__all__ = [
    "MAX_DEQUEUE_COUNT",
    "Backlog",
    "Change",
    "HistoryBucket",
    "RecentRun",
    "RunPosition",
    "RunQueue",
    "encode_payload",
    "wall_clock_ms",
]

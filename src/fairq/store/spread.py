"""Dequeueing an environment spread over several partitions: which partition goes next.

An environment with one partition is served by one dequeue call, as always. One spread
over ``S`` partitions (:mod:`fairq.store.placement`) is served partition by partition:
the consumer knows every partition's state (below), ranks the partitions with ready
work, and calls the dequeue script on the first, then on the next while the batch is
not full. Each call serves its partition exactly as a whole environment is served
(limits, then the order).

A partition's state, read in one pipelined round trip: the heads-index scores of the
queues served (what is ready, what is due when), and in the fair order the partition's
tenant virtual time (``V:tt[~floor]``) and the lowest tag copy of each queue's servable
tenants (``B:tq``).

Ranking (the fair order): every partition keeps its tenants' tags on the same scale
(``quantum / weight`` per run started), so the partition whose next start tag is lowest
holds the tenant global start-time fair queueing would serve next. A partition's next
start tag is its lowest servable tenant's tag, never below the *floor hint*: the
environment's virtual time, the lowest next start tag of any partition with servable
tenants (every backlogged tenant is at or above it; the highest the process has seen,
so a tenant that joined a lagging partition at its stale floor cannot pull it down).
A tenant that (re)joins a partition whose own floor lags is so treated as joining at the
environment's virtual time, and the hint is written back (``ZADD XX GT`` of the
partition floors, in the next read's pipeline) so that the lagging partition's scripts
place newcomers from it. In the age order: the partition with the oldest ready head
goes first. The deviation this leaves from one
global order is bounded (docs/cluster.md): it grows with the batch size and the number
of consumers, not with ``S``.

No round trip of its own in the common case: after a dequeue that leased runs, the next
state is read at once in the background (it sees that dequeue's effects) and the next
dequeue of the same environment uses it when it is younger than
:data:`PREFETCH_MAX_AGE_S`. A dequeue that follows one that found nothing (an idle
consumer woken by a hint) reads a fresh state, as does one on a logical clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import Delivery, DequeueBatch
from fairq.store._core import StoreCore

#: How old a state read after the previous dequeue may be for the next one to use it (s).
PREFETCH_MAX_AGE_S: Final = 1.0
#: How often a process rebalances a spread environment's quotas on demand, at most (s).
REBALANCE_EVERY_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What a consumer knows of one partition before it chooses where to dequeue."""

    partition: int
    #: the oldest ready head of the queues served (ms); None: nothing ready
    oldest_ready: float | None
    #: the earliest head that is not ready yet (ms); None: none
    next_due: float | None
    #: the partition's tenant virtual time (None: none, or the age order)
    floor: float | None = None
    #: the lowest tag copy of a servable tenant of the queues served (None: none)
    lowest_tag: float | None = None
    #: slots its environment limit (its quota) leaves free now (None: not read)
    room: int | None = None


@dataclass(frozen=True, slots=True)
class SpreadView:
    """Every partition's state, read at once."""

    now: int
    states: list[PartitionState]
    fair: bool
    #: when it was read (this process's monotonic clock)
    read_at: float

    @property
    def floor_hint(self) -> float | None:
        """The environment's tenant virtual time as this view shows it: the lowest next
        start tag of a partition with servable tenants (what one global order would
        serve next: every backlogged tenant's tag is at least that), else, with none,
        the highest partition floor (the start tag of the run most recently begun)."""
        backlogged = [
            max(s.lowest_tag, s.floor if s.floor is not None else s.lowest_tag)
            for s in self.states
            if s.lowest_tag is not None
        ]
        if backlogged:
            return min(backlogged)
        floors = [s.floor for s in self.states if s.floor is not None]
        return max(floors) if floors else None


def partition_state(
    partition: int,
    scores: Sequence[Any],
    now: int,
    fair_rows: Sequence[Any] | None = None,
    room: int | None = None,
) -> PartitionState:
    """A partition's state from the heads-index scores of its queues' members, the room
    its environment limit leaves, and, in the fair order, its floor's score and each
    queue's lowest ``B:tq`` entry."""
    ready = [float(s) for s in scores if s is not None and float(s) <= now]
    future = [float(s) for s in scores if s is not None and float(s) > now]
    floor = lowest = None
    if fair_rows is not None:
        floor_raw, *lows = fair_rows
        floor = None if floor_raw is None else float(floor_raw)
        tags = [float(row[0][1]) for row in lows if row]
        lowest = min(tags) if tags else None
    return PartitionState(
        partition,
        min(ready) if ready else None,
        min(future) if future else None,
        floor,
        lowest,
        room,
    )


def next_start_tag(state: PartitionState, hint: float | None) -> float:
    """A partition's next start tag: its lowest servable tenant's, never below its own
    floor or the environment's (the hint); a partition with ready work but no servable
    tenant listed (new flows the dequeue registers) starts at the floor."""
    floors = [f for f in (state.floor, hint) if f is not None]
    tag = state.lowest_tag if state.lowest_tag is not None else (max(floors) if floors else 0.0)
    return max([tag, *floors])


def rank_partitions(view: SpreadView, hint: float | None = None) -> list[int]:
    """The partitions with ready work, the one to serve first first (``hint``: the
    environment's virtual time, when known better than the view shows it)."""
    ready = [s for s in view.states if s.oldest_ready is not None]
    if hint is None or (view.floor_hint is not None and view.floor_hint > hint):
        hint = view.floor_hint
    if view.fair:
        ready.sort(key=lambda s: (next_start_tag(s, hint), s.oldest_ready, s.partition))
    else:
        ready.sort(key=lambda s: (s.oldest_ready, s.partition))
    return [s.partition for s in ready]


def quota_short(view: SpreadView, max_count: int) -> bool:
    """Whether a partition with work has fewer slots under its quota than a batch could
    take: quota may sit unused elsewhere (or in the ledger)."""
    return any(
        s.oldest_ready is not None and s.room is not None and s.room < max_count
        for s in view.states
    )


def next_wait_ms(states: Sequence[PartitionState], now: int) -> int | None:
    """How long until a partition's earliest future head is ready (None: none known)."""
    due = [s.next_due for s in states if s.next_due is not None]
    return max(0, int(min(due)) - now) if due else None


class Leased:
    """What one dequeue pass leased over several script calls, and what they said."""

    def __init__(self, max_count: int) -> None:
        self.max_count = max_count
        self.runs: list[Delivery] = []
        self.wait: int | None = None
        self.gated = False

    @property
    def room(self) -> int:
        """How many more runs the pass may lease."""
        return self.max_count - len(self.runs)

    def add(self, batch: DequeueBatch) -> None:
        self.runs += batch.deliveries
        self.gated = self.gated or batch.gated
        if batch.wait_ms is not None:
            self.wait = batch.wait_ms if self.wait is None else min(self.wait, batch.wait_ms)

    def batch(self) -> DequeueBatch:
        return DequeueBatch(self.runs, self.wait, self.gated)


#: (env id, queues served): the key of a prefetched view.
_ViewKey = tuple[str, tuple[str, ...]]


class SpreadOps(StoreCore):
    #: The state read after each dequeue of a spread environment, for its next dequeue.
    _views: dict[_ViewKey, asyncio.Task[SpreadView]]
    #: The highest floor seen per spread environment (written back to lagging partitions).
    _floor_hints: dict[str, float]

    #: When this process last rebalanced each spread environment on demand (monotonic s).
    _rebalanced: dict[str, float]

    if TYPE_CHECKING:

        async def rebalance(
            self, env: Environment, *, now_ms: int | None = None, locked: bool = True
        ) -> int: ...

    async def spread_view(
        self, env: Environment, queues: Sequence[str], partitions: int, now_ms: int | None
    ) -> SpreadView:
        """Every partition's state for ``queues`` (one round trip), raising the floor of
        partitions that lag the environment's virtual time known so far."""
        fair = self.order_for(env) == "fair"
        members = [K.heads_member(k, env, q) for q in queues for k in (K.KIND_QUEUE, K.KIND_CK)]
        shards = self.keys.partition_shards(env, partitions)
        hint = self._floor_hints.get(env.id)
        raise_floor = fair and hint is not None
        width = 3 + (1 + len(queues) + raise_floor if fair else 0)

        def build(pipe: Any) -> None:
            for p, shard in enumerate(shards):
                e = self.keys.env(env, p)
                pipe.zmscore(self.keys.shard(shard).heads, members)
                pipe.hmget(e.config, ["concurrency", "burst_factor"])
                pipe.scard(e.inflight)
                if fair:
                    if raise_floor:
                        pipe.zadd(e.tenant_tags, {K.FLOOR_MEMBER: hint}, xx=True, gt=True)
                    pipe.zscore(e.tenant_tags, K.FLOOR_MEMBER)
                    for q in queues:
                        pipe.zrange(self.keys.queue(env, q, p).ready_tenants, 0, 0, withscores=True)

        if now_ms is None:
            now, rows = await self.timed_pipeline(build)
        else:
            now, rows = now_ms, await self.pipeline(build)
        states = []
        for p in range(len(shards)):
            heads, limits, inflight, *fair_rows = rows[p * width : (p + 1) * width]
            room = self._room(limits, int(inflight))
            fair_part = fair_rows[int(raise_floor) :] if fair else None
            states.append(partition_state(p, heads or [], now, fair_part, room))
        view = SpreadView(now, states, fair, time.monotonic())
        if view.floor_hint is not None:
            self._floor_hints[env.id] = max(view.floor_hint, hint or -math.inf)
        return view

    def _room(self, limits: Sequence[Any], inflight: int) -> int:
        """Slots a partition's own limit (its quota of the environment's) leaves free."""
        limit_raw, burst_raw = limits
        limit = int(limit_raw) if limit_raw is not None else self.config.default_env_concurrency
        burst = float(burst_raw) if burst_raw is not None else self.config.default_burst_factor
        return int(limit * burst) - inflight

    async def _view_for(
        self, env: Environment, queues: Sequence[str], partitions: int, now_ms: int | None
    ) -> tuple[SpreadView, bool]:
        """The view a dequeue uses: the one read after the previous dequeue (when young
        enough, on the server's clock), else a fresh one. Returns it and whether it was
        prefetched."""
        task = self._views.pop((env.id, tuple(queues)), None)
        if task is not None and now_ms is None:
            with contextlib.suppress(Exception):
                view = await task
                if (
                    time.monotonic() - view.read_at < PREFETCH_MAX_AGE_S
                    and len(view.states) == partitions
                ):
                    return view, True
        elif task is not None:
            task.cancel()
        return await self.spread_view(env, queues, partitions, now_ms), False

    def _prefetch(self, env: Environment, queues: Sequence[str], partitions: int) -> None:
        """Read the next view now, in the background (it sees the dequeue just made)."""
        key = (env.id, tuple(queues))
        old = self._views.pop(key, None)
        if old is not None:
            old.cancel()
        task = asyncio.get_running_loop().create_task(
            self.spread_view(env, queues, partitions, None), name="fairq-view"
        )
        task.add_done_callback(_retrieve)
        self._views[key] = task

    async def spread_plan(
        self,
        env: Environment,
        queues: Sequence[str],
        partitions: int,
        max_count: int,
        now_ms: int | None,
    ) -> tuple[SpreadView, list[int]]:
        """The view a dequeue of a spread environment acts on, and the partitions to
        try in order (those with ready work and a slot under their quota), after moving
        quota to where work waits when it looks out of place."""
        view, prefetched = await self._view_for(env, queues, partitions, now_ms)
        ranked = rank_partitions(view, self._floor_hints.get(env.id))
        if not ranked and prefetched:  # work may have arrived since it was read
            view = await self.spread_view(env, queues, partitions, now_ms)
            ranked = rank_partitions(view, self._floor_hints.get(env.id))
        if quota_short(view, max_count) and await self.quota_wanted(env, now_ms):
            # quota moved to where work waits (from partitions that do not use theirs, or
            # the pool); read again
            view = await self.spread_view(env, queues, partitions, now_ms)
            ranked = rank_partitions(view, self._floor_hints.get(env.id))
        full = {s.partition for s in view.states if s.room is not None and s.room <= 0}
        return view, [p for p in ranked if p not in full]

    def spread_done(
        self,
        env: Environment,
        queues: Sequence[str],
        partitions: int,
        view: SpreadView,
        leased: Leased,
        now_ms: int | None,
    ) -> DequeueBatch:
        """After the dequeue calls of a spread environment: read the next view in the
        background when runs were leased (on the server's clock); else say how long to
        wait, and when a partition had no slot under its quota, that a freed slot wakes
        consumers."""
        if leased.runs and now_ms is None:
            self._prefetch(env, queues, partitions)
        if not leased.runs and leased.wait is None:
            if any(s.room is not None and s.room <= 0 for s in view.states):
                leased.gated = True
            leased.wait = next_wait_ms(view.states, view.now)
        return leased.batch()

    async def quota_wanted(self, env: Environment, now_ms: int | None) -> bool:
        """A dequeue was held back by a limit: rebalance the environment's quotas (at
        most every REBALANCE_EVERY_S per process on the server's clock; at once on a
        logical clock). Returns whether any quota moved."""
        if now_ms is None:
            last = self._rebalanced.get(env.id)
            if last is not None and time.monotonic() - last < REBALANCE_EVERY_S:
                return False
            self._rebalanced[env.id] = time.monotonic()
        return await self.rebalance(env, now_ms=now_ms) > 0

    async def close(self) -> None:
        for task in self._views.values():
            task.cancel()
        self._views.clear()
        await super().close()


def _retrieve(task: asyncio.Task[SpreadView]) -> None:
    """A background read that failed is retried by the next dequeue (it reads afresh)."""
    if not task.cancelled():
        task.exception()

"""Autoscaling signals: a queue's backlog that more workers could serve now, against the
backlog its gates hold (more workers would not help) and its runs not due yet.

Read from the same snapshot as a run's position (:mod:`fairq.store.position`): reads
only. A queue's ready runs are split flow by flow (oldest head first in the age order,
by tenant tag in the fair order; the priority levels in strict order, each level's
flows sharing the queue's caps and rates): a flow may start as many as every gate above it has
room for now, and what it may not is *held*, counted under the tightest gate:

* ``paused``: every ready run of a paused queue;
* ``env_limit``, ``queue_total``, ``key_cap``, ``tenant_cap``: a cap's free slots are
  servable, the rest of its backlog held (a key capped at 2 with 10 ready runs and none
  in flight: 2 servable, 8 held);
* ``queue_rate``, ``tenant_rate``, ``key_rate``: the whole tokens a bucket has now are
  servable, the rest held (the tokens that arrive later are not counted ahead).

Approximations: the environment's free slots are offered to each queue on its own, so
the servable runs of an environment's queues can add up to more than its free slots
(:func:`env_backlog` caps their sum); the flows beyond the first
:data:`~fairq.store.position.MAX_FLOWS` of a queue (by head) count as ready and face the
queue's and the environment's gates only; a borrowing queue's borrowed slots are not
counted as servable.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from fairq.keys import Environment
from fairq.store.position import Bucket, Flow, PositionOps, QueueSnapshot, flow_keyless

#: The gates held backlog is counted under (bounded: these are metric label values).
HELD_GATES: Final = (
    "paused", "env_limit", "queue_total", "queue_rate", "key_cap", "tenant_cap",
    "tenant_rate", "key_rate",
)  # fmt: skip

_INF: Final = math.inf


@dataclass(frozen=True, slots=True)
class Backlog:
    """A queue's (or an environment's) queued runs, split by what more workers could do.

    Attributes:
        servable: ready runs no gate holds: more workers could start them now.
        held: ready runs held, by gate (every gate of :data:`HELD_GATES`, 0 when none).
        delayed: queued runs not due yet (delayed, backing off).
        running: runs in flight.
    """

    servable: int
    held: dict[str, int]
    delayed: int
    running: int
    now_ms: int

    @property
    def held_total(self) -> int:
        return sum(self.held.values())

    def to_json(self) -> dict[str, object]:
        return {
            "servable": self.servable, "held": self.held_total, "held_by": dict(self.held),
            "delayed": self.delayed, "running": self.running,
        }  # fmt: skip


@dataclass(slots=True)
class _Rooms:
    """What the gates above a queue's flows still have room for, as flows take it."""

    env: float
    total: float
    queue_tokens: float
    pools: dict[str, float] = field(default_factory=dict)
    tenants: dict[str, float] = field(default_factory=dict)
    tenant_tokens: dict[str, float] = field(default_factory=dict)


def _tokens(snap: QueueSnapshot, bucket: Bucket | None) -> float:
    return _INF if bucket is None else float(bucket.peek(snap.now_ms)[0])


def _serve_order(snap: QueueSnapshot) -> list[Flow]:
    """The flows in the order a dequeue reaches them (near enough): the priority levels
    in strict order, then by tag (fair order) or head (age order)."""
    if snap.order == "fair":
        return sorted(snap.flows, key=lambda f: (f.level, f.tag or 0.0, f.head_ms or 0, f.flow))
    return sorted(snap.flows, key=lambda f: (f.level, f.head_ms or 0, f.flow))


def _flow_limits(snap: QueueSnapshot, f: Flow, rooms: _Rooms) -> list[tuple[str, float]]:
    """The room of each gate over one flow, in GATES order (set up on first sight)."""
    pool = "" if flow_keyless(f.flow) else f.flow
    if pool not in rooms.pools:
        room = snap.key_room(f)
        rooms.pools[pool] = _INF if room is None else float(room)
    if f.tenant not in rooms.tenants:
        room = snap.tenant_room(f)
        rooms.tenants[f.tenant] = _INF if room is None else float(room)
        rooms.tenant_tokens[f.tenant] = _tokens(snap, f.tenant_rate)
    return [
        ("env_limit", rooms.env), ("queue_total", rooms.total),
        ("queue_rate", rooms.queue_tokens), ("key_cap", rooms.pools[pool]),
        ("tenant_cap", rooms.tenants[f.tenant]),
        ("tenant_rate", rooms.tenant_tokens[f.tenant]), ("key_rate", _tokens(snap, f.key_rate)),
    ]  # fmt: skip


def _take(rooms: _Rooms, f: Flow, n: int) -> None:
    pool = "" if flow_keyless(f.flow) else f.flow
    rooms.env -= n
    rooms.total -= n
    rooms.queue_tokens -= n
    rooms.pools[pool] -= n
    rooms.tenants[f.tenant] -= n
    rooms.tenant_tokens[f.tenant] -= n


def split_backlog(snap: QueueSnapshot) -> Backlog:
    """A queue's backlog on one partition (see the module's docstring)."""
    held = dict.fromkeys(HELD_GATES, 0)
    delayed = sum(f.queued - f.ready for f in snap.flows)
    ready = sum(f.ready for f in snap.flows) + snap.unread_queued
    running = snap.queue_running
    if snap.paused:
        held["paused"] = ready
        return Backlog(0, held, delayed, running, snap.now_ms)
    rooms = _Rooms(
        env=max(0.0, float(snap.env_limit_burst - snap.env_running)),
        total=_INF if snap.total is None else max(0.0, float(snap.total - snap.queue_running)),
        queue_tokens=_tokens(snap, snap.queue_rate),
    )
    servable = 0
    for f in _serve_order(snap):
        if f.ready <= 0:
            continue
        take, bound = f.ready, None
        for gate, room in _flow_limits(snap, f, rooms):
            if room < take:
                take, bound = max(0, int(room)), gate
        if bound is not None:
            held[bound] += f.ready - take
        _take(rooms, f, take)
        servable += take
    if snap.unread_queued:  # the flows not read one by one: the queue's gates only
        take, bound = snap.unread_queued, None
        for gate, room in (("env_limit", rooms.env), ("queue_total", rooms.total),
                           ("queue_rate", rooms.queue_tokens)):  # fmt: skip
            if room < take:
                take, bound = max(0, int(room)), gate
        if bound is not None:
            held[bound] += snap.unread_queued - take
        servable += take
    return Backlog(servable, held, delayed, running, snap.now_ms)


def summed(parts: Sequence[Backlog], now_ms: int) -> Backlog:
    """Backlogs added up (a queue over its partitions)."""
    held = dict.fromkeys(HELD_GATES, 0)
    for p in parts:
        for gate, n in p.held.items():
            held[gate] += n
    return Backlog(
        servable=sum(p.servable for p in parts), held=held,
        delayed=sum(p.delayed for p in parts), running=sum(p.running for p in parts),
        now_ms=now_ms,
    )  # fmt: skip


def env_backlog(queues: Sequence[Backlog], env_free: int, now_ms: int) -> Backlog:
    """An environment's backlog over its queues: their servable runs beyond its free
    slots (each queue was offered them all) are held by its limit."""
    total = summed(queues, now_ms)
    over = max(0, total.servable - max(0, env_free))
    held = dict(total.held)
    held["env_limit"] += over
    return Backlog(total.servable - over, held, total.delayed, total.running, now_ms)


class BacklogOps(PositionOps):
    async def queue_backlog(
        self, env: Environment, queue: str, *, now_ms: int | None = None
    ) -> Backlog:
        """A queue's backlog now, summed over the environment's partitions (reads only)."""
        (backlog,) = await self.queues_backlog(env, [queue], now_ms=now_ms)
        return backlog

    async def queues_backlog(
        self, env: Environment, queues: Sequence[str], *, now_ms: int | None = None
    ) -> list[Backlog]:
        """:meth:`queue_backlog` of several queues of one environment, read at once."""
        now = await self.now_or_server(now_ms)
        rows = await asyncio.gather(*(self.queue_snapshots(env, q, now) for q in queues))
        return [summed([split_backlog(s) for s in snaps], now) for snaps in rows]


__all__ = ["HELD_GATES", "Backlog", "BacklogOps", "env_backlog", "split_backlog", "summed"]

"""Which environments and queues a consumer tries first, per master-queue shard.

The reference strategy: read the shard's ready members (oldest heads first, at most
``parent_queue_limit``), drop every environment already at its concurrency limit
(with burst), shuffle the environments uniformly, and inside each environment try the
queues oldest head first.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import TYPE_CHECKING

from fairq import keys as K
from fairq.keys import Environment

if TYPE_CHECKING:
    from fairq.store import RunQueue

#: (environment, queue, kind) where kind is ``q`` (keyless runs) or ``ck`` (variants).
PlanItem = tuple[Environment, str, str]


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SelectionStrategy:
    """Orders a shard's queues for one dequeue pass."""

    def __init__(self, rng: random.Random, parent_queue_limit: int = 1000) -> None:
        self.rng = rng
        self.parent_queue_limit = parent_queue_limit

    def order(
        self,
        members: list[tuple[str, float]],
        env_busy: dict[Environment, int],
        env_limit_with_burst: dict[Environment, int],
    ) -> list[PlanItem]:
        """Pure part of the strategy: members (oldest first) to an ordered plan."""
        by_env: dict[Environment, list[tuple[float, str, str]]] = defaultdict(list)
        for member, score in members:
            kind, env, queue = K.parse_master_member(member)
            by_env[env].append((score, queue, kind))
        envs = [e for e in by_env if env_busy.get(e, 0) < env_limit_with_burst.get(e, 1)]
        envs.sort()  # deterministic before the seeded shuffle
        self.rng.shuffle(envs)
        plan: list[PlanItem] = []
        for env in envs:
            for _score, queue, kind in sorted(by_env[env]):
                plan.append((env, queue, kind))
        return plan

    async def read_members(
        self, rq: RunQueue, shards: list[int], now_ms: int
    ) -> dict[int, list[tuple[str, float]]]:
        """Every listed shard's ready master-queue members, oldest first (one round trip)."""
        pipe = rq.client.pipeline(transaction=False)
        for shard in shards:
            pipe.zrangebyscore(
                rq.keys.shard(shard).master, "-inf", now_ms, start=0,
                num=self.parent_queue_limit, withscores=True,
            )  # fmt: skip
        replies = await pipe.execute()
        return {
            shard: [(_s(m), float(sc)) for m, sc in raw]
            for shard, raw in zip(shards, replies, strict=True)
            if raw
        }

    async def plan(self, rq: RunQueue, members: list[tuple[str, float]]) -> list[PlanItem]:
        """Read the env gates of a shard's members (one round trip) and order them."""
        if not members:
            return []
        envs = sorted({K.parse_master_member(m)[1] for m, _ in members})
        pipe = rq.client.pipeline(transaction=False)
        for env in envs:
            e = rq.keys.env(env)
            pipe.scard(e.inflight)
            pipe.hmget(e.limits, ["concurrency", "burst_factor"])
        replies = await pipe.execute()
        busy: dict[Environment, int] = {}
        limit: dict[Environment, int] = {}
        for i, env in enumerate(envs):
            busy[env] = int(replies[2 * i])
            conc, burst = replies[2 * i + 1]
            c = int(conc) if conc is not None else rq.config.default_env_concurrency
            b = float(burst) if burst is not None else rq.config.default_burst_factor
            limit[env] = int(c * b)
        return self.order(members, busy, limit)

"""Dequeueing: one script call serves one environment; the selection strategy orders the
environments of a shard when a dequeue is not limited to one environment."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fairq import keys as K
from fairq.errors import InvalidLimitError
from fairq.keys import Environment
from fairq.models import Delivery, DequeueBatch
from fairq.store import validate
from fairq.store._core import text_of
from fairq.store.run_hash import DELIVERY_FIELDS, DELIVERY_OFFSET, KEEP_OUTCOME
from fairq.store.selection import EnvPlan, SelectionStrategy
from fairq.store.spread import Leased, SpreadOps

#: Where each field of a delivered run is in its slice of a dequeue reply.
_RUN_ID = DELIVERY_OFFSET["run_id"]
_QUEUE = DELIVERY_OFFSET["queue"]
_PAYLOAD = DELIVERY_OFFSET["payload"]
_CK = DELIVERY_OFFSET["ck"]
_TENANT = DELIVERY_OFFSET["tenant"]
_ATTEMPTS = DELIVERY_OFFSET["attempts"]
_LEASE_TOKEN = DELIVERY_OFFSET["lease_token"]
_SCORE = DELIVERY_OFFSET["score"]
_ENQUEUED_AT = DELIVERY_OFFSET["enqueued_at"]
_TIMEOUT = DELIVERY_OFFSET["timeout"]
_OUTCOME_POLICY = DELIVERY_OFFSET["outcome_policy"]
_TRACE = DELIVERY_OFFSET["trace"]


class DequeueOps(SpreadOps):
    selection: SelectionStrategy

    if TYPE_CHECKING:

        async def queues(self, env: Environment) -> list[str]: ...

    def _deliveries(self, env: Environment, raw: list[Any], partition: int = 0) -> list[Delivery]:
        out = []
        for i in range(0, len(raw), len(DELIVERY_FIELDS)):
            ck, tenant = text_of(raw[i + _CK]), text_of(raw[i + _TENANT])
            out.append(
                Delivery(
                    env=env,
                    queue=text_of(raw[i + _QUEUE]),
                    run_id=text_of(raw[i + _RUN_ID]),
                    payload_json=text_of(raw[i + _PAYLOAD]),
                    concurrency_key=K.decode_concurrency_key(ck) if ck else None,
                    attempt=int(raw[i + _ATTEMPTS]),
                    lease_token=int(raw[i + _LEASE_TOKEN]),
                    score_ms=int(float(raw[i + _SCORE])),
                    enqueued_at_ms=int(float(raw[i + _ENQUEUED_AT])),
                    tenant=K.decode_tenant(tenant) if tenant else None,
                    timeout_ms=int(raw[i + _TIMEOUT]) or None,
                    keep_outcome=text_of(raw[i + _OUTCOME_POLICY]) == KEEP_OUTCOME,
                    trace_context=text_of(raw[i + _TRACE]) or None,
                    partition=partition,
                )
            )
        return out

    async def dequeue_env(
        self,
        env: Environment,
        queues: Sequence[str],
        max_count: int,
        *,
        lease_ms: int | None = None,
        now_ms: int | None = None,
        kinds: str = "",
        charge_env: bool = False,
        partition: int = 0,
        pool: int | None = None,
    ) -> DequeueBatch:
        """One dequeue script call: up to ``max_count`` runs of ``env`` (of one of its
        partitions) from ``queues`` (``kinds``: "" all runs, "q" keyless only, "ck" keyed
        only), for consumer pool ``pool`` (:func:`fairq.keys.pool_id`; default: the pool
        of ``queues``)."""
        for q in queues:
            K.validate_name("queue", q, allow_slash=True)
        if len(queues) > validate.MAX_DEQUEUE_QUEUES:
            raise InvalidLimitError(
                "queues", len(queues), f"at most {validate.MAX_DEQUEUE_QUEUES} per dequeue"
            )
        if not queues:
            return DequeueBatch([])
        lease = validate.lease_ms(self.config.lease_ms if lease_ms is None else lease_ms)
        pool = K.pool_id(queues) if pool is None else pool
        reply = await self.call_for_env(
            "dequeue",
            env,
            [
                env.id,
                str(max_count),
                str(lease),
                kinds,
                "1" if charge_env else "0",
                str(pool),
                *queues,
            ],
            now_ms,
            partition,
        )
        self.decode("dequeue", reply[0])
        wait = int(reply[1])
        return DequeueBatch(
            self._deliveries(env, reply[3], partition),
            None if wait < 0 else wait,
            bool(int(reply[2])),
        )

    async def dequeue_batch(
        self,
        max_count: int = 10,
        *,
        env: Environment | None = None,
        queues: Sequence[str] | None = None,
        lease_ms: int | None = None,
        now_ms: int | None = None,
        shards: Iterable[int] | None = None,
    ) -> DequeueBatch:
        """Lease up to ``max_count`` runs, and say how long to wait when there are none.

        With ``env`` (and optionally ``queues``, e.g. a worker's task queues) one script
        call serves that environment, gated by its limits (an environment spread over
        several partitions: its partitions in the order of :mod:`.spread`). Without,
        every shard's heads are read in one round trip (with the server's clock), the
        shards are tried in random order and each shard's ready environments in the
        selection strategy's order, one script call per environment.

        Raises:
            InvalidLimitError: ``max_count`` not an integer in 1..1000, or a bad lease.
            InvalidNameError: a bad queue name.
        """
        _check_dequeue_args(max_count, lease_ms, now_ms)
        pool = K.pool_id(queues)  # the consumer's: the queues it serves (0: all of them)
        if env is not None:
            names = list(queues) if queues is not None else await self.queues(env)
            placement = await self.placement(env)
            if placement.served > 1:
                return await self.dequeue_spread(
                    env, names, placement.served, max_count, lease_ms=lease_ms, now_ms=now_ms,
                    pool=pool,
                )  # fmt: skip
            return await self.dequeue_env(
                env, names, max_count, lease_ms=lease_ms, now_ms=now_ms, pool=pool
            )
        shard_ids = list(range(self.keys.shard_count)) if shards is None else list(shards)
        self.rng.shuffle(shard_ids)
        now, heads = await self._heads(shard_ids, now_ms)
        leased = Leased(max_count)
        spread = await self._spread_envs(heads, now, queues)
        spread_ids = set(spread)
        for shard in shard_ids:
            ready = [(m, score) for m, score in heads[shard] if score <= now]
            # an environment spread over partitions is served across all of them where
            # it is first met, in its partitions' order (spread.py)
            for env_id in sorted({_env_id(m) for m, _ in ready} & spread.keys()):
                spread_env, names, served = spread.pop(env_id)
                if leased.room > 0:
                    leased.add(
                        await self.dequeue_spread(
                            spread_env, names, served, leased.room, lease_ms=lease_ms,
                            now_ms=now_ms, charge_env=True, pool=pool,
                        )
                    )  # fmt: skip
            ready = [(m, score) for m, score in ready if _env_id(m) not in spread_ids]
            for plan in await self._plan(shard, ready) if ready else []:
                if leased.room <= 0:
                    break
                if queues is not None:
                    # the consumer's whole list, not only its ready queues: the script
                    # reads their heads anyway, and their pool's coverage of the
                    # environment's queues is then judged on what the consumer serves
                    if not set(plan.queues) & set(queues):
                        continue
                    plan = replace(plan, queues=list(queues))
                leased.add(
                    await self.dequeue_env(
                        plan.env, plan.queues, leased.room, lease_ms=lease_ms, now_ms=now_ms,
                        charge_env=True, partition=plan.partition, pool=pool,
                    )
                )  # fmt: skip
            if leased.room <= 0:
                break
        if not leased.runs and leased.wait is None:
            leased.wait = _wait_for_heads(heads, now, leased.gated)
        return leased.batch()

    async def dequeue(
        self,
        max_count: int = 10,
        *,
        env: Environment | None = None,
        queues: Sequence[str] | None = None,
        lease_ms: int | None = None,
        now_ms: int | None = None,
        shards: Iterable[int] | None = None,
    ) -> list[Delivery]:
        """Lease up to ``max_count`` runs (see :meth:`dequeue_batch`)."""
        batch = await self.dequeue_batch(
            max_count, env=env, queues=queues, lease_ms=lease_ms, now_ms=now_ms, shards=shards
        )
        return batch.deliveries

    async def dequeue_spread(
        self,
        env: Environment,
        queues: Sequence[str],
        partitions: int,
        max_count: int,
        *,
        lease_ms: int | None = None,
        now_ms: int | None = None,
        charge_env: bool = False,
        pool: int | None = None,
    ) -> DequeueBatch:
        """Up to ``max_count`` runs of an environment spread over ``partitions``: its
        partitions in the order of :meth:`spread_plan`, one dequeue call each, until the
        batch is full."""
        if not queues:
            return DequeueBatch([])
        view, ranked = await self.spread_plan(env, queues, partitions, max_count, now_ms)
        leased = Leased(max_count)
        for partition in ranked:
            leased.add(
                await self.dequeue_env(
                    env, queues, leased.room, lease_ms=lease_ms, now_ms=now_ms,
                    charge_env=charge_env, partition=partition, pool=pool,
                )
            )  # fmt: skip
            if leased.room <= 0:
                break
        return self.spread_done(env, queues, partitions, view, leased, now_ms)

    async def dequeue_from_queue(
        self,
        env: Environment,
        queue: str,
        *,
        keyed: bool | None = None,
        max_count: int = 10,
        lease_ms: int | None = None,
        now_ms: int | None = None,
    ) -> list[Delivery]:
        """One dequeue call on one queue of one environment: its keyless runs
        (``keyed=False``), its keyed runs (``keyed=True``), or both (None)."""
        validate.max_count(max_count)
        kinds = "" if keyed is None else (K.KIND_CK if keyed else K.KIND_QUEUE)
        batch = await self.dequeue_env(
            env, [queue], max_count, lease_ms=lease_ms, now_ms=now_ms, kinds=kinds
        )
        return batch.deliveries

    async def dequeue_variant(
        self,
        env: Environment,
        queue: str,
        concurrency_key: str | None,
        *,
        tenant: str | None = None,
        max_count: int = 1,
        lease_ms: int | None = None,
        now_ms: int | None = None,
    ) -> list[Delivery]:
        """Lease ready runs of one flow (a key, or the keyless runs with None, of the
        named ``tenant`` or of none), oldest first, whatever the queue's order: for
        reference models that pick the flow themselves. The env gate, the flow's caps
        (key, tenant, total) and its rate limits apply, and the run is counted for the
        flow's named tenant; no fair-order state moves. In an environment spread over
        partitions, the flow is looked for in the partition of its tenant (the named
        one, else the key)."""
        validate.max_count(max_count)
        K.validate_name("queue", queue, allow_slash=True)
        ck = "" if concurrency_key is None else K.encode_concurrency_key(concurrency_key)
        named = "" if tenant is None else K.encode_tenant(tenant)
        lease = validate.lease_ms(self.config.lease_ms if lease_ms is None else lease_ms)
        partition = (await self.placement(env)).partition_of(named, ck)
        reply = await self.call(
            "dequeue_variant", "age", self.keys.tag_of(env, partition),
            [env.id, queue, ck, str(max_count), str(lease), named], now_ms,
        )  # fmt: skip
        self.decode("dequeue_variant", reply[0])
        return self._deliveries(env, reply[3], partition)

    # ------------------------------------------------------------------ selection

    async def _spread_envs(
        self,
        heads: dict[int, list[tuple[str, float]]],
        now: int,
        queues: Sequence[str] | None,
    ) -> dict[str, tuple[Environment, list[str], int]]:
        """The environments spread over partitions that have ready heads: env id ->
        (env, its ready queues in any partition, partitions served)."""
        known = await self.spread_placements()
        if not known:
            return {}
        found: dict[str, set[str]] = {}
        for members in heads.values():
            for member, score in members:
                env_id = _env_id(member)
                if score <= now and env_id in known:
                    queue = member.split(":", 4)[4]
                    if queues is None or queue in queues:
                        found.setdefault(env_id, set()).add(queue)
        return {
            env_id: (Environment.parse(env_id), sorted(names), known[env_id].served)
            for env_id, names in found.items()
        }

    async def _heads(
        self, shards: list[int], now_ms: int | None
    ) -> tuple[int, dict[int, list[tuple[str, float]]]]:
        """The clock and every shard's heads-index members, oldest first (at most
        ``parent_queue_limit`` each, ready ones before future ones): one round trip on
        one server, whatever the number of shards."""
        limit = self.selection.parent_queue_limit

        def heads(pipe: Any) -> None:
            for shard in shards:
                pipe.zrangebyscore(
                    self.keys.shard(shard).heads, "-inf", "+inf", start=0, num=limit,
                    withscores=True,
                )  # fmt: skip

        if now_ms is None:
            now, rows = await self.timed_pipeline(heads)
        else:
            now, rows = now_ms, await self.pipeline(heads)
        return now, {
            shard: [(text_of(m), float(sc)) for m, sc in raw]
            for shard, raw in zip(shards, rows, strict=True)
        }

    async def _plan(self, shard: int, members: list[tuple[str, float]]) -> list[EnvPlan]:
        """A shard's ready environments (from its ready ``members``), in the selection
        strategy's order."""
        s = self.keys.shard(shard)
        plans = []
        for plan in self.selection.group(members):
            partition = self.keys.partition_at(plan.env, shard)
            if partition is not None:  # (None: a member no fairq process writes)
                plans.append(replace(plan, partition=partition))
        if len(plans) <= 1:
            return plans  # nothing to order; its dequeue script applies its limit itself
        envs = [p.env for p in plans]
        where = {p.env: p.partition for p in plans}

        def gates(pipe: Any) -> None:
            for env in envs:
                e = self.keys.env(env, where[env])
                pipe.scard(e.inflight)
                pipe.hmget(e.config, ["concurrency", "burst_factor"])
            pipe.zmscore(s.env_tags, [*(e.id for e in envs), K.FLOOR_MEMBER])

        replies = await self.pipeline(gates)
        busy: dict[Environment, int] = {}
        limit: dict[Environment, int] = {}
        for i, env in enumerate(envs):
            busy[env] = int(replies[2 * i])
            conc, burst = replies[2 * i + 1]
            c = int(conc) if conc is not None else self.config.default_env_concurrency
            b = float(burst) if burst is not None else self.config.default_burst_factor
            limit[env] = int(c * b)
        tags_raw = list(replies[-1] or [None] * (len(envs) + 1))
        floor_raw = tags_raw.pop()
        tags: dict[Environment, float] | None = None
        if self.fair or floor_raw is not None or any(t is not None for t in tags_raw or []):
            floor = float(floor_raw) if floor_raw is not None else 0.0
            tags = {
                env: max(floor, float(t) if t is not None else floor)
                for env, t in zip(envs, tags_raw or [None] * len(envs), strict=True)
            }
        ordered = self.selection.order(members, busy, limit, tags)
        return [replace(p, partition=where[p.env]) for p in ordered]


def _check_dequeue_args(max_count: int, lease_ms: int | None, now_ms: int | None) -> None:
    """Raise for a bad ``max_count``, ``lease_ms`` or ``now_ms`` of a dequeue."""
    validate.max_count(max_count)
    if lease_ms is not None:
        validate.lease_ms(lease_ms)
    if now_ms is not None:
        validate.time_ms("now_ms", now_ms)


def _wait_for_heads(heads: dict[int, list[tuple[str, float]]], now: int, gated: bool) -> int | None:
    """How long a dequeue that leased nothing says to wait (ms; None: no heads).

    The earliest head of any shard: a ready one the gates skipped means try again now;
    one a script found behind a limit (``gated``) is woken by the slot that frees, so
    only future heads count then."""
    earliest = [
        score for members in heads.values() for _, score in members if not gated or score > now
    ]
    return max(0, int(min(earliest)) - now) if earliest else None


def _env_id(member: str) -> str:
    """The environment id of a heads-index member (``kind:org:project:env:queue``)."""
    return ":".join(member.split(":", 4)[1:4])

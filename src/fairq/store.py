"""The run queue: fairq's typed API over its Lua scripts (the only module that calls them).

Every state change is one atomic script touching one hash slot. Nothing about
scheduling lives in process memory, so any number of :class:`RunQueue` objects (in any
number of processes) may share a server.

Clocks: every method that needs "now" takes ``now_ms``; by default it is wall-clock
milliseconds. Tests and the simulator pass a logical clock instead.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fairq import keys as K
from fairq.config import MAX_LIMIT, MAX_WEIGHT, RunQueueConfig
from fairq.errors import (
    InvalidLimitError,
    PayloadError,
    QueueSizeLimitExceededError,
    RunNotFoundError,
)
from fairq.keys import Environment, KeySchema
from fairq.models import (
    AckStatus,
    CancelOutcome,
    DeadLetter,
    Delivery,
    EnqueueRequest,
    EnqueueResult,
    EnqueueStatus,
    EnvStats,
    ExpiredRun,
    NackOutcome,
    QueueStats,
    VariantStats,
)
from fairq.scripts import VTIME_SCRIPTS, registry
from fairq.selection import SelectionStrategy
from fairq.server import AnyRedis

#: Script calls one enqueue_many keeps in flight at once (bounds connections used).
MAX_CONCURRENT_CALLS = 8
#: Largest batch one dequeue call may ask for.
MAX_DEQUEUE_COUNT = 1000


def wall_clock_ms() -> int:
    """Wall-clock milliseconds."""
    return int(time.time() * 1000)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def encode_payload(payload: Any, max_bytes: int) -> str:
    """JSON-encode a payload, refusing what JSON cannot hold or what is too large.

    Raises:
        PayloadError: not JSON-serialisable, or larger than ``max_bytes``.
    """
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes, larger than the maximum {max_bytes}")
    return text


#: Longest lease one dequeue or heartbeat may grant (ms): one day.
MAX_LEASE_MS = 86_400_000


def _check_lease(lease_ms: int) -> int:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int):
        raise InvalidLimitError("lease_ms", lease_ms, "must be an integer number of ms")
    if not 1 <= lease_ms <= MAX_LEASE_MS:
        raise InvalidLimitError("lease_ms", lease_ms, f"must be in 1..{MAX_LEASE_MS}")
    return lease_ms


def _check_limit(name: str, value: int, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLimitError(name, value, "must be an integer")
    if not minimum <= value <= MAX_LIMIT:
        raise InvalidLimitError(name, value, f"must be in {minimum}..{MAX_LIMIT}")
    return value


class RunQueue:
    """Enqueue, dequeue, ack, nack and inspect runs.

    Args:
        client: an asyncio Redis or RedisCluster client (bytes responses).
        config: options; ``config.vtime.enabled`` selects the fair order.
        rng: randomness for the environment shuffle and backoff jitter (seed it in tests).
    """

    def __init__(
        self,
        client: AnyRedis,
        config: RunQueueConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.config = config or RunQueueConfig()
        self.keys = KeySchema(self.config.prefix, self.config.shard_count)
        self.rng = rng or random.Random()
        self.selection = SelectionStrategy(self.rng)
        self._scripts = registry()
        vt = self.config.vtime
        self._context_tail = [
            str(self.config.counter_ttl_seconds),
            repr(float(vt.quantum)),
            str(vt.state_ttl_seconds),
            vt.join_policy,
            repr(float(vt.arrival_cap)),
            str(vt.idle_max_entries),
            self.keys.wake_channel,
            str(self.config.default_env_concurrency),
            repr(float(self.config.default_burst_factor)),
            str(self.config.default_queue_size_limit),
            str(self.config.max_per_key_per_call),
            str(vt.scan_window_multiplier),
        ]

    # ------------------------------------------------------------------ plumbing

    @property
    def fair(self) -> bool:
        """Whether the fair (virtual-time) order is on."""
        return self.config.vtime.enabled

    def script_name(self, operation: str) -> str:
        """The script an operation runs: its ``_vtime`` twin when the fair order is on."""
        twin = f"{operation}_vtime"
        return twin if self.fair and twin in VTIME_SCRIPTS else operation

    def _ctx(self, now: int | None) -> list[str]:
        return [str(wall_clock_ms() if now is None else int(now)), *self._context_tail]

    async def _run(self, operation: str, keys: list[str], args: list[Any], now: int | None) -> Any:
        script = self._scripts[self.script_name(operation)]
        return await script(self.client, keys, [*self._ctx(now), *args])

    async def close(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------------ enqueue

    async def enqueue(
        self,
        env: Environment,
        queue: str,
        run_id: str,
        payload: Any = None,
        *,
        concurrency_key: str | None = None,
        delay_ms: int = 0,
        available_at_ms: int | None = None,
        priority_ms: int = 0,
        ttl_ms: int | None = None,
        now_ms: int | None = None,
    ) -> EnqueueStatus:
        """Queue one run.

        Args:
            env: its environment.
            queue: its queue (letters, digits, ``_ . - /``).
            run_id: unique per environment; enqueueing an existing id is a no-op.
            payload: any JSON-serialisable value.
            concurrency_key: the CK variant (tenant, user…) the run belongs to.
            delay_ms: make it available this long after ``now``.
            available_at_ms: or at this absolute time (overrides ``delay_ms``).
            priority_ms: a time credit: the run orders as if it were this much older.
            ttl_ms: expire it (never deliver it) if not dequeued within this time.
            now_ms: the clock (default: wall clock).

        Returns:
            ``ENQUEUED`` or ``DUPLICATE``.

        Raises:
            QueueSizeLimitExceededError: the queue is at its size limit (nothing written).
            InvalidNameError, PayloadError, InvalidLimitError: bad input (nothing written).
        """
        request = EnqueueRequest(
            env, queue, run_id, payload, concurrency_key, delay_ms, available_at_ms,
            priority_ms, ttl_ms,
        )  # fmt: skip
        (result,) = await self.enqueue_many([request], now_ms=now_ms)
        if result.status is EnqueueStatus.REJECTED:
            raise QueueSizeLimitExceededError(queue, result.queue_size_limit)
        return result.status

    def _encode_request(self, r: EnqueueRequest, now: int) -> list[str]:
        K.validate_name("run id", r.run_id)
        encoded_ck = (
            "" if r.concurrency_key is None else K.encode_concurrency_key(r.concurrency_key)
        )
        for name, value in (("delay_ms", r.delay_ms), ("priority_ms", r.priority_ms)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= 10 * 365 * 86_400_000
            ):
                raise InvalidLimitError(
                    name, value, "must be an integer number of ms in 0..10 years"
                )
        if r.available_at_ms is not None and (
            isinstance(r.available_at_ms, bool)
            or not isinstance(r.available_at_ms, int)
            or r.available_at_ms < 0
        ):
            raise InvalidLimitError(
                "available_at_ms", r.available_at_ms, "must be a non-negative integer (ms)"
            )
        if r.ttl_ms is not None and (
            isinstance(r.ttl_ms, bool) or not isinstance(r.ttl_ms, int) or r.ttl_ms <= 0
        ):
            raise InvalidLimitError("ttl_ms", r.ttl_ms, "must be a positive integer number of ms")
        available = r.available_at_ms if r.available_at_ms is not None else now + r.delay_ms
        score = int(available) - r.priority_ms
        ttl_deadline = 0 if r.ttl_ms is None else now + r.ttl_ms
        payload = encode_payload(r.payload, self.config.max_payload_bytes)
        return [r.run_id, encoded_ck, str(score), payload, str(ttl_deadline), str(now)]

    async def enqueue_many(
        self, requests: Sequence[EnqueueRequest], *, now_ms: int | None = None
    ) -> list[EnqueueResult]:
        """Queue several runs; one script call per base queue, pipelined.

        Every request is validated before anything is written. Returns one result per
        request, in order: enqueued, duplicate, or rejected by the queue size limit.
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        groups: dict[tuple[Environment, str], list[int]] = defaultdict(list)
        encoded: list[list[str]] = []
        for i, r in enumerate(requests):
            self.keys.queue(r.env, r.queue)  # validates names
            encoded.append(self._encode_request(r, now))
            groups[(r.env, r.queue)].append(i)
        results: list[EnqueueResult | None] = [None] * len(requests)
        script = self._scripts[self.script_name("enqueue")]

        async def enqueue_group(env: Environment, queue: str, indexes: list[int]) -> None:
            q = self.keys.queue(env, queue)
            e = self.keys.env(env)
            s = self.keys.shard(self.keys.shard_of(env))
            args = [*self._ctx(now), env.id, queue]
            for i in indexes:
                args.extend(encoded[i])
            reply = await script(
                self.client, [q.base, e.prefix, s.master, s.ttl, s.envs, s.message_root], args
            )
            limit = int(reply[-1])
            for i, code in zip(indexes, reply[:-1], strict=True):
                status = {1: EnqueueStatus.ENQUEUED, 0: EnqueueStatus.DUPLICATE}.get(
                    int(code), EnqueueStatus.REJECTED
                )
                results[i] = EnqueueResult(requests[i].run_id, status, limit)

        # one script call per base queue (each atomic on its own), a few in flight at once
        limiter = asyncio.Semaphore(MAX_CONCURRENT_CALLS)

        async def limited(env: Environment, queue: str, indexes: list[int]) -> None:
            async with limiter:
                await enqueue_group(env, queue, indexes)

        await asyncio.gather(*(limited(env, q, ix) for (env, q), ix in groups.items()))
        return [r for r in results if r is not None]

    # ------------------------------------------------------------------ dequeue

    async def dequeue(
        self,
        max_count: int = 10,
        *,
        lease_ms: int | None = None,
        now_ms: int | None = None,
        shards: Iterable[int] | None = None,
    ) -> list[Delivery]:
        """Lease up to ``max_count`` runs, choosing environments and queues fairly.

        Per shard: read the master queue's ready members, drop environments at their
        limit, shuffle environments, take each environment's queues oldest first, and
        run the queue's dequeue script until ``max_count`` runs are leased.
        """
        if not 1 <= max_count <= MAX_DEQUEUE_COUNT:
            raise InvalidLimitError("max_count", max_count, f"must be in 1..{MAX_DEQUEUE_COUNT}")
        if lease_ms is not None:
            _check_lease(lease_ms)
        now = wall_clock_ms() if now_ms is None else now_ms
        shard_ids = list(range(self.keys.shard_count)) if shards is None else list(shards)
        self.rng.shuffle(shard_ids)
        out: list[Delivery] = []
        ready = await self.selection.read_members(self, shard_ids, now)
        for shard in shard_ids:
            if shard not in ready:
                continue
            plan = await self.selection.plan(self, ready[shard])
            for env, queue, kind in plan:
                if len(out) >= max_count:
                    return out
                out.extend(
                    await self.dequeue_from_queue(
                        env, queue, keyed=(kind == K.KIND_CK), max_count=max_count - len(out),
                        lease_ms=lease_ms, now_ms=now,
                    )
                )  # fmt: skip
            if len(out) >= max_count:
                break
        return out

    async def dequeue_from_queue(
        self,
        env: Environment,
        queue: str,
        *,
        keyed: bool,
        max_count: int = 10,
        lease_ms: int | None = None,
        now_ms: int | None = None,
    ) -> list[Delivery]:
        """One dequeue script call on one base queue: its keyless runs (``keyed=False``)
        or its concurrency-key variants (``keyed=True``, age or fair order)."""
        if not 1 <= max_count <= MAX_DEQUEUE_COUNT:
            raise InvalidLimitError("max_count", max_count, f"must be in 1..{MAX_DEQUEUE_COUNT}")
        lease = _check_lease(self.config.lease_ms if lease_ms is None else lease_ms)
        q = self.keys.queue(env, queue)
        e = self.keys.env(env)
        s = self.keys.shard(self.keys.shard_of(env))
        operation = "dequeue_ck" if keyed else "dequeue_queue"
        reply = await self._run(
            operation,
            [q.base, e.prefix, s.master, s.leases, s.ttl, s.expired, s.message_root],
            [env.id, queue, str(max_count), str(lease)],
            now_ms,
        )
        return [
            Delivery(
                env=env,
                queue=queue,
                run_id=_s(reply[i]),
                payload_json=_s(reply[i + 1]),
                concurrency_key=K.decode_concurrency_key(_s(reply[i + 2]))
                if reply[i + 2]
                else None,
                attempt=int(reply[i + 3]),
                delivery=int(reply[i + 4]),
                score_ms=int(float(reply[i + 5])),
                enqueued_at_ms=int(float(reply[i + 6])),
            )
            for i in range(0, len(reply), 7)
        ]

    # ------------------------------------------------------------------ finishing

    async def _per_shard(
        self,
        operation: str,
        deliveries: Sequence[Delivery],
        keys: Callable[[K.ShardKeys], list[str]],
        head: list[str],
        now_ms: int | None,
    ) -> list[int]:
        """Run a batch script once per shard over (lease member, delivery) pairs and return
        its per-run codes in the order of ``deliveries`` (duplicates included)."""
        positions: dict[int, list[int]] = defaultdict(list)
        for i, d in enumerate(deliveries):
            positions[self.keys.shard_of(d.env)].append(i)
        codes = [0] * len(deliveries)
        for shard, indexes in positions.items():
            args = list(head)
            for i in indexes:
                args += [deliveries[i].lease_member, str(deliveries[i].delivery)]
            reply = await self._run(operation, keys(self.keys.shard(shard)), args, now_ms)
            for i, code in zip(indexes, reply, strict=True):
                codes[i] = int(code)
        return codes

    async def ack(
        self, deliveries: Sequence[Delivery], *, now_ms: int | None = None
    ) -> list[AckStatus]:
        """Finish runs: free their slots and delete them (one script call per shard)."""
        statuses = {1: AckStatus.ACKED, 0: AckStatus.UNKNOWN, -1: AckStatus.LEASE_LOST}
        codes = await self._per_shard(
            "ack", deliveries, lambda s: [s.leases, s.message_root], [], now_ms
        )
        return [statuses[c] for c in codes]

    async def nack(
        self,
        delivery: Delivery,
        *,
        retry_at_ms: int | None = None,
        increment_attempt: bool = True,
        max_attempts: int | None = None,
        now_ms: int | None = None,
    ) -> NackOutcome:
        """Give a run back for a retry (after backoff) or dead-letter it at its last attempt.

        Args:
            retry_at_ms: when it may run again; default ``now + backoff(attempt)``.
            increment_attempt: count this as a failed attempt.
            max_attempts: override the retry policy's maximum.
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        policy = self.config.retry
        attempt = delivery.attempt + (1 if increment_attempt else 0)
        if retry_at_ms is None:
            retry_at_ms = now + (policy.delay_ms(attempt, self.rng) if increment_attempt else 0)
        limit = policy.max_attempts if max_attempts is None else max_attempts
        s = self.keys.shard(self.keys.shard_of(delivery.env))
        reply = await self._run(
            "nack",
            [s.leases, s.master, s.message_root],
            [delivery.lease_member, str(delivery.delivery), str(int(retry_at_ms)),
             "1" if increment_attempt else "0", str(limit)],
            now,
        )  # fmt: skip
        return {1: NackOutcome.REQUEUED, 2: NackOutcome.DEAD_LETTERED}.get(
            int(reply[0]), NackOutcome.LEASE_LOST
        )

    async def heartbeat(
        self,
        deliveries: Sequence[Delivery],
        *,
        lease_ms: int | None = None,
        now_ms: int | None = None,
    ) -> list[bool]:
        """Extend leases; ``False`` for a run whose lease was already lost."""
        lease = _check_lease(self.config.lease_ms if lease_ms is None else lease_ms)
        codes = await self._per_shard(
            "heartbeat", deliveries, lambda s: [s.leases, s.message_root], [str(lease)], now_ms
        )
        return [c == 1 for c in codes]

    async def release(
        self, deliveries: Sequence[Delivery], *, now_ms: int | None = None
    ) -> list[bool]:
        """Free the concurrency slots of leased runs but keep them leased."""
        codes = await self._per_shard("release", deliveries, lambda s: [s.message_root], [], now_ms)
        return [c == 1 for c in codes]

    # ------------------------------------------------------------------ maintenance

    def _shard_keys(self, shards: Iterable[int] | None) -> list[K.ShardKeys]:
        if shards is None:
            return self.keys.shards()
        return [self.keys.shard(i) for i in shards]

    async def maintenance_due(self, *, now_ms: int | None = None) -> tuple[list[int], list[int]]:
        """Shards with a lapsed lease, and shards with a passed TTL (one round trip).

        Lets a timer skip the maintenance scripts when there is nothing to do, so an
        idle consumer costs one cheap read per shard instead of two script calls.
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        shards = self.keys.shards()
        pipe = self.client.pipeline(transaction=False)
        for s in shards:
            pipe.zrangebyscore(s.leases, "-inf", now, start=0, num=1)
            pipe.zrangebyscore(s.ttl, "-inf", now, start=0, num=1)
        raw = await pipe.execute()
        leases = [s.shard for i, s in enumerate(shards) if raw[2 * i]]
        ttls = [s.shard for i, s in enumerate(shards) if raw[2 * i + 1]]
        return leases, ttls

    async def reclaim_lapsed_leases(
        self, *, now_ms: int | None = None, batch: int = 100, shards: Iterable[int] | None = None
    ) -> int:
        """Requeue runs whose lease lapsed (lost consumers), on every shard (or ``shards``)."""
        total = 0
        for s in self._shard_keys(shards):
            reply = await self._run(
                "reclaim", [s.leases, s.master, s.message_root], [str(batch)], now_ms
            )
            total += int(reply[0])
        return total

    async def expire_ttl(
        self, *, now_ms: int | None = None, batch: int = 100, shards: Iterable[int] | None = None
    ) -> int:
        """Expire queued runs whose TTL passed, on every shard (or ``shards``); returns how many."""
        total = 0
        for s in self._shard_keys(shards):
            reply = await self._run(
                "expire_ttl", [s.ttl, s.master, s.message_root, s.expired], [str(batch)], now_ms
            )
            total += int(reply[0])
        return total

    async def read_expired(
        self, *, after: dict[int, str] | None = None, count: int = 100
    ) -> tuple[list[ExpiredRun], dict[int, str]]:
        """Expired runs reported after the given per-shard stream ids.

        Returns the runs and the new per-shard positions (pass them back next time).
        """
        positions = dict(after or {})
        runs: list[ExpiredRun] = []
        for s in self.keys.shards():
            start = positions.get(s.shard, "0-0")
            entries: Any = await self.client.xrange(
                s.expired, min=f"({start}" if start != "0-0" else "-", count=count
            )
            for entry_id, fields in entries or []:
                f = {_s(k): _s(v) for k, v in (fields or {}).items()}
                runs.append(
                    ExpiredRun(
                        env=Environment.parse(f["env"]),
                        queue=f["queue"],
                        run_id=f["run"],
                        concurrency_key=K.decode_concurrency_key(f["ck"]) if f["ck"] else None,
                        expired_at_ms=int(float(f["at"])),
                    )
                )
                positions[s.shard] = _s(entry_id)
        return runs, positions

    # ------------------------------------------------------------------ dead letters

    async def dead_letters(self, env: Environment, *, limit: int = 100) -> list[DeadLetter]:
        """The environment's dead-lettered runs, oldest first."""
        e = self.keys.env(env)
        members: Any = await self.client.zrange(e.dlq, 0, limit - 1, withscores=True)
        out: list[DeadLetter] = []
        for member, score in members:
            run_id = _s(member)
            h = await self.client.hmget(e.message(run_id), ["q", "k", "a", "p"])
            if h[0] is None:
                continue
            out.append(
                DeadLetter(
                    env=env,
                    queue=_s(h[0]),
                    run_id=run_id,
                    concurrency_key=K.decode_concurrency_key(_s(h[1])) if h[1] else None,
                    attempt=int(h[2] or 0),
                    dead_lettered_at_ms=int(score),
                    payload_json=_s(h[3]),
                )
            )
        return out

    async def redrive(self, env: Environment, run_id: str, *, now_ms: int | None = None) -> None:
        """Move a dead-lettered run back to its queue with attempt 0.

        Raises:
            RunNotFoundError: the run is not in the environment's dead-letter queue.
        """
        K.validate_name("run id", run_id)
        now = wall_clock_ms() if now_ms is None else now_ms
        e = self.keys.env(env)
        s = self.keys.shard(self.keys.shard_of(env))
        done = await self._run(
            "redrive", [e.prefix, s.master, s.message_root], [env.id, run_id, str(now)], now
        )
        if int(done) != 1:
            raise RunNotFoundError(run_id, f"the dead-letter queue of {env}")

    async def cancel(
        self, env: Environment, run_id: str, *, now_ms: int | None = None
    ) -> CancelOutcome:
        """Remove a run that has not started (queued or dead-lettered) in one script call.

        A queued run leaves its queue (counters, index and master queue follow); a
        running run is not touched (``RUNNING``).
        """
        K.validate_name("run id", run_id)
        e = self.keys.env(env)
        s = self.keys.shard(self.keys.shard_of(env))
        code = await self._run(
            "cancel", [e.prefix, s.master, s.ttl, s.message_root], [env.id, run_id], now_ms
        )
        return {
            1: CancelOutcome.CANCELLED,
            2: CancelOutcome.REMOVED_FROM_DLQ,
            -1: CancelOutcome.RUNNING,
        }.get(int(code), CancelOutcome.UNKNOWN)

    # ------------------------------------------------------------------ limits

    async def set_env_limits(
        self,
        env: Environment,
        *,
        concurrency: int | None = None,
        burst_factor: float | None = None,
        queue_size_limit: int | None = None,
    ) -> None:
        """Set an environment's concurrency limit, burst factor and default queue size limit."""
        fields: dict[str, str] = {}
        if concurrency is not None:
            fields["concurrency"] = str(
                _check_limit("env concurrency limit", concurrency, minimum=0)
            )
        if burst_factor is not None:
            if (
                isinstance(burst_factor, bool)
                or not isinstance(burst_factor, int | float)
                or not 1.0 <= float(burst_factor) <= 100.0
            ):
                raise InvalidLimitError("burst factor", burst_factor, "must be a number in 1..100")
            fields["burst_factor"] = repr(float(burst_factor))
        if queue_size_limit is not None:
            fields["max_queue_size"] = str(_check_limit("queue size limit", queue_size_limit))
        if fields:
            await self.client.hset(self.keys.env(env).limits, mapping=fields)  # type: ignore[arg-type]
            await self._limits_changed()

    async def remove_env_limits(self, env: Environment) -> None:
        """Back to the configured defaults."""
        await self.client.delete(self.keys.env(env).limits)
        await self._limits_changed()

    async def _limits_changed(self) -> None:
        # a raised, removed or resumed limit may let gated runs go: hint waiting consumers
        await self.client.publish(self.keys.wake_channel, "limits")

    async def set_queue_concurrency(self, env: Environment, queue: str, limit: int | None) -> None:
        """Set a queue's concurrency limit (applies to each CK variant); 0 pauses; None removes."""
        q = self.keys.queue(env, queue)
        if limit is None:
            await self.client.hdel(q.limits, "concurrency")
        else:
            await self.client.hset(
                q.limits, "concurrency", str(_check_limit("queue concurrency limit", limit))
            )
        await self._limits_changed()

    async def pause_queue(self, env: Environment, queue: str) -> None:
        await self.set_queue_concurrency(env, queue, 0)

    async def resume_queue(self, env: Environment, queue: str) -> None:
        await self.set_queue_concurrency(env, queue, None)

    async def set_queue_size_limit(self, env: Environment, queue: str, limit: int | None) -> None:
        """Cap a queue's queued runs (keyless + all variants); None removes (0 = no cap)."""
        q = self.keys.queue(env, queue)
        if limit is None:
            await self.client.hdel(q.limits, "max_size")
        else:
            await self.client.hset(
                q.limits, "max_size", str(_check_limit("queue size limit", limit))
            )

    async def set_concurrency_key_weight(
        self, env: Environment, queue: str, concurrency_key: str, weight: float | None
    ) -> None:
        """Weight a variant in the fair order (advance = quantum / weight); None resets to 1."""
        q = self.keys.queue(env, queue)
        ck = K.encode_concurrency_key(concurrency_key)
        if weight is None:
            await self.client.hdel(q.ck_weights, ck)
            return
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not (1.0 / MAX_WEIGHT <= float(weight) <= MAX_WEIGHT)
        ):
            raise InvalidLimitError(
                "weight", weight, f"must be a number in {1 / MAX_WEIGHT}..{MAX_WEIGHT}"
            )
        await self.client.hset(q.ck_weights, ck, repr(float(weight)))

    # ------------------------------------------------------------------ readers

    async def queue_stats(
        self, env: Environment, queue: str, *, breakdown: bool = False
    ) -> QueueStats:
        """Queued and running across keyless runs and every CK variant (one round trip)."""
        (stats,) = await self.queues_stats(env, [queue], breakdown=breakdown)
        return stats

    async def queues_stats(
        self, env: Environment, queues: Sequence[str], *, breakdown: bool = False
    ) -> list[QueueStats]:
        """:meth:`queue_stats` for several queues of one environment, in one round trip."""
        e = self.keys.env(env)
        pipe = self.client.pipeline(transaction=False)
        qkeys = [self.keys.queue(env, name) for name in queues]
        for q in qkeys:
            pipe.zcard(q.queued)
            pipe.scard(q.inflight)
            pipe.get(q.ck_queued_counter)
            pipe.get(q.ck_running_counter)
            pipe.zcard(q.ck_index)
            pipe.scard(q.ck_busy)
            pipe.hmget(q.limits, ["concurrency", "max_size"])
            pipe.zrange(q.queued, 0, 0, withscores=True)
            pipe.zrange(q.ck_index, 0, 0, withscores=True)
        pipe.hget(e.limits, "max_queue_size")
        raw = await pipe.execute()
        env_size = raw[-1]
        out: list[QueueStats] = []
        for i, (name, q) in enumerate(zip(queues, qkeys, strict=True)):
            (zq, si, ckq, ckr, idx, busy, limits, head, ckhead) = raw[i * 9 : i * 9 + 9]
            if (ckq is None and idx) or (ckr is None and busy):
                ckq, ckr = await self._run("seed_counters", [q.base], [], None)
            heads = [float(h[0][1]) for h in (head, ckhead) if h]
            size = limits[1] if limits[1] is not None else env_size
            variants = await self._variants(env, name) if breakdown else []
            out.append(
                QueueStats(
                    env=env,
                    queue=name,
                    queued=int(zq) + int(ckq or 0),
                    running=int(si) + int(ckr or 0),
                    concurrency_limit=None if limits[0] is None else int(limits[0]),
                    queue_size_limit=None if size is None else int(size),
                    oldest_score_ms=int(min(heads)) if heads else None,
                    variants=variants,
                )
            )
        return out

    async def _variants(self, env: Environment, queue: str, limit: int = 500) -> list[VariantStats]:
        q = self.keys.queue(env, queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(q.ck_index, 0, limit - 1, withscores=True)
        pipe.smembers(q.ck_busy)
        indexed, busy = await pipe.execute()
        names = [_s(m) for m, _ in indexed]
        names += sorted({_s(m) for m in busy} - set(names))[: max(0, limit - len(names))]
        if not names:
            return []
        heads = {_s(m): int(sc) for m, sc in indexed}
        pipe = self.client.pipeline(transaction=False)
        for ck in names:
            pipe.zcard(q.variant_queued(ck))
            pipe.scard(q.variant_inflight(ck))
        pipe.zmscore(q.vtime, names)
        pipe.hmget(q.ck_weights, names)
        raw = await pipe.execute()
        tags, weights = raw[-2], raw[-1]
        return [
            VariantStats(
                concurrency_key=K.decode_concurrency_key(ck),
                queued=int(raw[2 * i]),
                running=int(raw[2 * i + 1]),
                oldest_score_ms=heads.get(ck),
                virtual_tag=None if tags[i] is None else float(tags[i]),
                weight=1.0 if weights[i] is None else float(weights[i]),
            )
            for i, ck in enumerate(names)
        ]

    async def env_stats(self, env: Environment) -> EnvStats:
        e = self.keys.env(env)
        pipe = self.client.pipeline(transaction=False)
        pipe.scard(e.inflight)
        pipe.hmget(e.limits, ["concurrency", "burst_factor", "max_queue_size"])
        pipe.zcard(e.dlq)
        running, limits, dlq = await pipe.execute()
        return EnvStats(
            env=env,
            running=int(running),
            concurrency_limit=int(limits[0])
            if limits[0] is not None
            else self.config.default_env_concurrency,
            burst_factor=float(limits[1])
            if limits[1] is not None
            else self.config.default_burst_factor,
            queue_size_limit=int(limits[2]) if limits[2] is not None else None,
            dead_lettered=int(dlq),
        )

    async def environments(self) -> list[Environment]:
        """Every environment that ever enqueued, across shards."""
        envs: set[Environment] = set()
        for s in self.keys.shards():
            for member in await self.client.smembers(s.envs):
                envs.add(Environment.parse(_s(member)))
        return sorted(envs)

    async def queues(self, env: Environment) -> list[str]:
        """Every queue of an environment that ever had a run."""
        return sorted(_s(m) for m in await self.client.smembers(self.keys.env(env).queues))

    async def run_state(self, env: Environment, run_id: str) -> str | None:
        """``queued`` | ``running`` | ``dlq``, or None when the run is gone (acked/expired)."""
        state = await self.client.hget(self.keys.env(env).message(run_id), "st")
        return None if state is None else _s(state)

    async def next_due_ms(self) -> int | None:
        """The earliest head score over every master queue (None when all are empty)."""
        pipe = self.client.pipeline(transaction=False)
        for s in self.keys.shards():
            pipe.zrange(s.master, 0, 0, withscores=True)
        heads = [float(r[0][1]) for r in await pipe.execute() if r]
        return int(min(heads)) if heads else None


__all__ = ["MAX_DEQUEUE_COUNT", "RunQueue", "encode_payload", "wall_clock_ms"]

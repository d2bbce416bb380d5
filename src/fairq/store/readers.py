"""Readers: counts, settings, dead letters, runs and history, for dashboards and CLIs.

Readers use pipelines (one round trip each where possible) and never write, except
that a reader finding a CK counter missing while variants hold runs seeds it through
``seed_counters.lua``, so a keyed backlog never shows as 0.
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from fairq import keys as K
from fairq.keys import Environment, EnvKeys, QueueKeys
from fairq.models import (
    AuditEntry,
    DeadLetter,
    EnvStats,
    LevelCount,
    QueueStats,
    TenantTag,
    VariantStats,
)  # fmt: skip
from fairq.outcomes import STATE_STATUS, RunInfo, RunStatus, decode_outcome
from fairq.store import run_hash, validate
from fairq.store._core import StoreCore, text_of
from fairq.store.history import (
    HISTORY_BUCKET_MS,
    HISTORY_COUNTERS,
    HISTORY_OVERFLOW_FIELD,
    HISTORY_TENANT_PREFIX,
    HISTORY_WINDOW_MS,
    RECENT_FIELDS,
)
from fairq.store.options import QUEUE_OPTIONS
from fairq.store.quotas import ENV_SCOPE, parse_ledger

#: Variant rows a queue breakdown returns at most.
MAX_VARIANTS: Final = 500
#: At most this many dead letters one :meth:`ReaderOps.dead_letters` call returns.
MAX_DEAD_LETTERS: Final = 10_000


#: The environment fields a queue's settings fall back to.
ENV_DEFAULTS: Final = (
    "max_queue_size", "order", "max_per_key", "charge", "quantum", "window", "join",
    "arrival_cap",
)  # fmt: skip

#: What the readers read of a run hash (fairq.store.run_hash field names).
_OWNER_READ: Final = ("queue", "ck")
#: What places a running run in its queue's priority levels.
_LEVEL_READ: Final = ("queue", "level")
#: What locates a running run's flow: its queue, key and the tenant its slot counts under.
_FLOW_OWNER_READ: Final = ("queue", "ck", "slot_tenant")
_DEAD_LETTER_READ: Final = (
    "queue", "ck", "attempts", "payload", "error", "tenant", "traceback",
)  # fmt: skip
_RUN_READ: Final = (
    "state", "attempts", "queue", "ck", "tenant", "enqueued_at", "score", "lease_start",
    "payload", "error", "cancel_requested", "progress", "traceback",
)  # fmt: skip


#: The priority levels other than the base one (whose keys are the queue's own).
_OTHER_LEVELS: Final = [lv for lv in range(1, K.MAX_LEVELS + 1) if lv != K.BASE_LEVEL]


def _levels_of(bits: str | None) -> tuple[int, ...]:
    """The levels a queue's ``levels`` option lists (bit L set: level L has held runs)."""
    value = int(bits) if bits else 0
    return tuple(lv for lv in range(1, K.MAX_LEVELS + 1) if value >> lv & 1)


#: What queues_stats reads per queue.
_STATS_READS: Final = 7 + len(_OTHER_LEVELS)


@dataclass(frozen=True, slots=True)
class HistoryBucket:
    """What happened to a queue in one 10-second window."""

    start_ms: int
    served: int
    completed: int
    failed: int
    retried: int
    dead_lettered: int
    expired: int
    cancelled: int
    timed_out: int
    run_ms: int
    #: Runs served per tenant (None: keyless runs of the queue's default tenant).
    by_tenant: dict[str | None, int]
    #: Runs served to tenants beyond the bucket's bound on tenant fields (counted together).
    other_tenants: int = 0
    #: Summed wait of the runs served (ms from when each could run to its dequeue).
    wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class RecentRun:
    """A finished run from a queue's recent list."""

    run_id: str
    status: RunStatus
    finished_at_ms: int
    attempts: int
    duration_ms: int | None
    concurrency_key: str | None
    tenant: str | None


def _key_tag(stored: Any, parked: Any, floor: float | None) -> float | None:
    """A key's place in the fair order as it would compete now: its tag in V:tt, else the
    one it was parked with, never below the floor (None in the age order)."""
    tag = None if stored is None else float(stored)
    if tag is None and parked is not None:
        tag = float(text_of(parked)[2:])
    if floor is None:
        return tag
    return floor if tag is None or tag < floor else tag


def _recent_run(item: str) -> RecentRun:
    """One entry of a queue's recent list: the line the scripts write (its fields are
    RECENT_FIELDS), or the JSON object earlier fairq versions wrote (such entries age out
    of the bounded list)."""
    if item.startswith("{"):
        data = json.loads(item)
        status, at, attempts = data["status"], data["at"], data.get("attempts") or 0
        duration, key = data.get("duration_ms"), data.get("key") or ""
        tenant, run = data.get("tenant") or "", str(data["run"])
    else:
        line = dict(zip(RECENT_FIELDS, item.split(" ", len(RECENT_FIELDS) - 1), strict=True))
        status, at, attempts = line["status"], line["finished_at"], line["attempts"]
        duration, key, tenant, run = line["run_ms"], line["ck"], line["tenant"], line["run_id"]
    return RecentRun(
        run_id=run,
        status=RunStatus(status),
        finished_at_ms=int(at),
        attempts=int(attempts),
        duration_ms=None if duration in ("", None) else int(duration),
        concurrency_key=K.decode_concurrency_key(key) if key else None,
        tenant=K.decode_tenant(tenant) if tenant else None,
    )


def summed_queue_stats(
    parts: list[QueueStats], total: int | None, rate: tuple[float, int] | None
) -> QueueStats:
    """One queue's stats over an environment's partitions: the first partition's
    settings (every partition has the same, but for its shares of the total and of the
    rate limit: ``total`` and ``rate`` are the cluster-wide ones), the counts summed, the
    oldest head of all."""
    heads = [p.oldest_score_ms for p in parts if p.oldest_score_ms is not None]
    return replace(
        parts[0],
        total_concurrency_limit=total,
        rate=None if rate is None else rate[0],
        rate_burst=None if rate is None else rate[1],
        queued=sum(p.queued for p in parts),
        running=sum(p.running for p in parts),
        delayed=sum(p.delayed for p in parts),
        oldest_score_ms=min(heads) if heads else None,
        variants=[v for p in parts for v in p.variants],
        partitions=len(parts),
    )


def _opt(raw: Any) -> str | None:
    return None if raw is None else text_of(raw)


def _read_stats(pipe: Any, e: EnvKeys, qkeys: list[QueueKeys], fields: list[str]) -> None:
    """Queue the reads of :meth:`ReaderOps.queues_stats` on ``pipe``: the environment's
    runs in flight and settings, then :data:`_STATS_READS` reads per queue."""
    pipe.scard(e.inflight)
    pipe.hmget(e.config, fields)
    for q in qkeys:
        pipe.zcard(q.queued)
        pipe.scard(q.inflight)
        pipe.get(q.ck_queued_counter)
        pipe.get(q.ck_running_counter)
        pipe.zcard(q.ck_index)
        pipe.zrange(q.queued, 0, 0, withscores=True)
        pipe.zrange(q.ck_index, 0, 0, withscores=True)
        for level in _OTHER_LEVELS:  # keyless runs of the other priority levels
            pipe.zcard(q.at_level(level).queued)


class ReaderOps(StoreCore):
    async def queue_stats(
        self, env: Environment, queue: str, *, breakdown: bool = False
    ) -> QueueStats:
        """Queued and running across keyless runs and every CK variant, and the queue's
        settings (one round trip)."""
        (stats,) = await self.queues_stats(env, [queue], breakdown=breakdown)
        return stats

    async def queues_stats(
        self, env: Environment, queues: Sequence[str], *, breakdown: bool = False
    ) -> list[QueueStats]:
        """:meth:`queue_stats` for several queues of one environment, in one round trip
        (one per partition, at once, for an environment spread over several: the counts
        are their sums)."""
        served = (await self.placement(env)).served
        if served == 1:
            return await self._queues_stats_at(env, queues, breakdown, 0)
        parts = await asyncio.gather(
            *(self._queues_stats_at(env, queues, breakdown, p) for p in range(served))
        )
        caps = await self.read(self.client.hgetall(self.keys.env(env).quota))
        ledger = parse_ledger(caps)
        return [
            summed_queue_stats(list(rows), ledger.caps.get(name), ledger.rates.get(name))
            for name, rows in zip(queues, zip(*parts, strict=True), strict=True)
        ]

    async def _queues_stats_at(
        self, env: Environment, queues: Sequence[str], breakdown: bool, partition: int
    ) -> list[QueueStats]:
        """:meth:`queues_stats` of one partition."""
        e = self.keys.env(env, partition)
        qkeys = [self.keys.queue(env, name, partition) for name in queues]
        fields = [*ENV_DEFAULTS]
        for name in queues:
            fields += [K.config_field(name, o) for o in QUEUE_OPTIONS]
        now, raw = await self.timed_pipeline(lambda pipe: _read_stats(pipe, e, qkeys, fields))
        env_running = int(raw[0])
        config = raw[1]
        base = len(ENV_DEFAULTS)
        env_opts = dict(zip(ENV_DEFAULTS, (_opt(v) for v in config[:base]), strict=True))
        out: list[QueueStats] = []
        width = len(QUEUE_OPTIONS)
        keyed_running: dict[str, int] | None = None
        for i, name in enumerate(queues):
            at = 2 + i * _STATS_READS
            zq, si, ckq, ckr, idx, head, ckhead = raw[at : at + 7]
            zq = int(zq) + sum(int(n) for n in raw[at + 7 : at + _STATS_READS])
            qc = dict(
                zip(
                    QUEUE_OPTIONS,
                    (_opt(v) for v in config[base + i * width : base + (i + 1) * width]),
                    strict=True,
                )
            )
            # a missing counter while keyed runs exist (queued ones in the index; running
            # ones, found in the env's in-flight set) is seeded from the truth
            if ckr is None and not idx and env_running:
                if keyed_running is None:
                    keyed_running = await self._keyed_running(env, partition)
                if keyed_running.get(name):
                    idx = 1
            if (ckq is None and idx) or (ckr is None and idx):
                ckq, ckr = await self._seed_counters(env, name, partition)
            heads = [float(h[0][1]) for h in (head, ckhead) if h]
            variants = await self._variants(env, name, partition) if breakdown else []
            oldest = int(min(heads)) if heads else None
            queued = int(zq) + int(ckq or 0)
            out.append(
                self._queue_stats(
                    env, name, qc, env_opts, queued=queued, running=int(si) + int(ckr or 0),
                    oldest=oldest, delayed=queued if oldest is not None and oldest > now else 0,
                    variants=variants,
                )
            )  # fmt: skip
        return out

    async def _seed_counters(self, env: Environment, queue: str, partition: int) -> tuple[Any, Any]:
        """Seed a queue's missing CK counters from its keyed runs; the (queued, running)
        counts they now hold."""
        seeded = await self.call(
            "seed_counters", "age", self.keys.tag_of(env, partition), [env.id, queue], None
        )
        return seeded[1], seeded[2]

    def _queue_stats(
        self,
        env: Environment,
        name: str,
        qc: dict[str, str | None],
        env_opts: dict[str, str | None],
        *,
        queued: int,
        running: int,
        oldest: int | None,
        delayed: int,
        variants: list[VariantStats],
    ) -> QueueStats:
        """One queue's stats from its counts and its settings (``qc``: the queue's
        options; ``env_opts``: the environment's defaults, then this process's)."""
        size = qc["max_size"] if qc["max_size"] is not None else env_opts["max_queue_size"]
        return QueueStats(
            env=env,
            queue=name,
            queued=queued,
            running=running,
            concurrency_limit=None if qc["concurrency"] is None else int(qc["concurrency"]),
            queue_size_limit=None if size is None else int(size),
            oldest_score_ms=oldest,
            variants=variants,
            is_paused=qc["paused"] == "1",
            total_concurrency_limit=None if qc["total"] is None else int(qc["total"]),
            order=qc["order"] or env_opts["order"] or ("fair" if self.fair else "age"),
            max_per_key_per_call=int(qc["max_per_key"] or env_opts["max_per_key"] or 0)
            or self.config.max_per_key_per_call,
            charge=qc["charge"] or env_opts["charge"] or self.config.vtime.charge,
            rate=None if qc["rate"] is None else float(qc["rate"]),
            rate_burst=None if qc["rate_burst"] is None else int(qc["rate_burst"]),
            borrow=qc["borrow"] == "1",
            delayed=delayed,
            priority_levels=int(qc["priority_levels"] or K.DEFAULT_PRIORITY_LEVELS),
            levels_used=_levels_of(qc["levels"]),
            **self._fair_settings(qc, env_opts),
            options={
                k: v for k, v in qc.items() if v is not None and not QUEUE_OPTIONS[k].internal
            },
        )

    async def level_counts(self, env: Environment, queue: str) -> dict[int, LevelCount]:
        """Runs queued and running at each priority level of a queue (levels with
        neither left out), summed over the environment's partitions. Reads every level's
        queued sets (at most MAX_VARIANTS keyed flows each) and the hashes of the
        environment's runs in flight (bounded by its limit)."""
        queued: dict[int, int] = {}
        running: dict[int, int] = {}
        for p in range((await self.placement(env)).served):
            for level, n in (await self._queued_by_level(env, queue, p)).items():
                queued[level] = queued.get(level, 0) + n
            for level, n in (await self._running_by_level(env, queue, p)).items():
                running[level] = running.get(level, 0) + n
        return {
            level: LevelCount(queued.get(level, 0), running.get(level, 0))
            for level in sorted(queued.keys() | running.keys())
        }

    async def _queued_by_level(
        self, env: Environment, queue: str, partition: int
    ) -> dict[int, int]:
        q = self.keys.queue(env, queue, partition)
        levels = range(1, K.MAX_LEVELS + 1)

        def indexes(pipe: Any) -> None:
            for level in levels:
                pipe.zcard(q.at_level(level).queued)
                pipe.zrange(q.at_level(level).ck_index, 0, MAX_VARIANTS - 1)

        raw = await self.pipeline(indexes)

        def sizes(pipe: Any) -> None:
            for level in levels:
                for flow in raw[2 * level - 1]:
                    pipe.zcard(q.at_level(level).variant_queued(text_of(flow)))

        keyed = iter(await self.pipeline(sizes))
        out: dict[int, int] = {}
        for level in levels:
            n = int(raw[2 * level - 2]) + sum(int(next(keyed)) for _ in raw[2 * level - 1])
            if n:
                out[level] = n
        return out

    async def _running_by_level(
        self, env: Environment, queue: str, partition: int
    ) -> dict[int, int]:
        e = self.keys.env(env, partition)
        ids = [text_of(r) for r in await self.read(self.client.smembers(e.inflight))]

        def owners(pipe: Any) -> None:
            for run_id in ids:
                pipe.hmget(e.message(run_id), run_hash.stored(_LEVEL_READ))

        out: dict[int, int] = {}
        for row in await self.pipeline(owners) if ids else []:
            owner, level = run_hash.read(_LEVEL_READ, row)
            if owner is not None and text_of(owner) == queue:
                lv = int(level) if level is not None else K.BASE_LEVEL
                out[lv] = out.get(lv, 0) + 1
        return out

    async def _keyed_running(self, env: Environment, partition: int) -> dict[str, int]:
        """Keyed runs holding a slot, per queue, read from the env's in-flight runs."""
        e = self.keys.env(env, partition)
        ids = [text_of(r) for r in await self.read(self.client.smembers(e.inflight))]

        def owners(pipe: Any) -> None:
            for run_id in ids:
                pipe.hmget(e.message(run_id), run_hash.stored(_OWNER_READ))

        counts: dict[str, int] = {}
        for row in await self.pipeline(owners) if ids else []:
            queue, key = run_hash.read(_OWNER_READ, row)
            if queue is not None and key:
                counts[text_of(queue)] = counts.get(text_of(queue), 0) + 1
        return counts

    async def _variants(self, env: Environment, queue: str, partition: int) -> list[VariantStats]:
        q = self.keys.queue(env, queue, partition)
        e = self.keys.env(env, partition)

        def first(pipe: Any) -> None:
            pipe.zrange(q.ck_index, 0, MAX_VARIANTS - 1, withscores=True)
            pipe.smembers(e.inflight)

        indexed, running_ids = await self.pipeline(first)
        names = [text_of(m) for m, _ in indexed]
        heads = {text_of(m): int(sc) for m, sc in indexed}
        if running_ids:
            # variants whose runs are all running have left the index: find them through
            # the env's in-flight runs (bounded by its concurrency limit)
            ids = sorted(text_of(r) for r in running_ids)

            def owners(pipe: Any) -> None:
                for run_id in ids:
                    pipe.hmget(e.message(run_id), run_hash.stored(_FLOW_OWNER_READ))

            extra = sorted(
                {
                    K.flow_of(text_of(k), text_of(n) if n else "")
                    for qn, k, n in (
                        run_hash.read(_FLOW_OWNER_READ, row) for row in await self.pipeline(owners)
                    )
                    if qn is not None and text_of(qn) == queue and (k or n)
                }
                - set(names)
            )
            names += extra[: max(0, MAX_VARIANTS - len(names))]
        if not names:
            return []

        # a variant is a flow: a key, or a named tenant's key (or its keyless runs)
        split = [K.split_flow(flow) for flow in names]
        keys = [key for _, key in split]

        def build(pipe: Any) -> None:
            for flow in names:
                pipe.zcard(q.variant_queued(flow))
                pipe.scard(q.variant_inflight(flow))
            pipe.hmget(q.key_weights, keys)
            pipe.hmget(q.key_caps, keys)
            pipe.zmscore(e.tenant_tags, [*names, K.FLOOR_MEMBER])
            pipe.hmget(q.parked, [f"t:{flow}" for flow in names])

        raw = await self.pipeline(build)
        weights, caps, tags, parked = raw[-4], raw[-3], raw[-2], raw[-1]
        floor = None if tags[-1] is None else float(tags[-1])
        out = []
        for i, flow in enumerate(names):
            named, key = split[i]
            out.append(
                VariantStats(
                    concurrency_key=K.decode_concurrency_key(key) if key else None,
                    queued=int(raw[2 * i]),
                    running=int(raw[2 * i + 1]),
                    oldest_score_ms=heads.get(flow),
                    virtual_tag=None if named else _key_tag(tags[i], parked[i], floor),
                    weight=1.0 if weights[i] is None else float(weights[i]),
                    tenant=K.decode_concurrency_key(named) if named else None,
                    cap=None if caps[i] is None else int(caps[i]),
                )
            )
        return out

    async def env_stats(self, env: Environment) -> EnvStats:
        """The environment's counts (summed over its partitions) and settings."""
        e = self.keys.env(env)
        s = self.keys.shard(self.keys.shard_of(env))
        served = (await self.placement(env)).served

        def build(pipe: Any) -> None:
            pipe.hmget(e.config, ["concurrency", "burst_factor", *ENV_DEFAULTS])
            pipe.hget(s.env_weights, env.id)
            if served > 1:
                pipe.hgetall(e.quota)
            for partition in range(served):
                part = self.keys.env(env, partition)
                pipe.scard(part.inflight)
                pipe.zcard(part.dlq)

        limits, weight, *counts = await self.pipeline(build)
        if served > 1:  # its limit is the cluster-wide cap partitions hold quotas of
            limits = [parse_ledger(counts.pop(0)).caps.get(ENV_SCOPE), *limits[1:]]
        running, dlq = sum(int(n) for n in counts[0::2]), sum(int(n) for n in counts[1::2])
        defaults = dict(zip(ENV_DEFAULTS, (_opt(v) for v in limits[2:]), strict=True))
        fair = self._fair_settings({}, defaults)
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
            order=defaults["order"] or ("fair" if self.fair else "age"),
            weight=1.0 if weight is None else float(weight),
            max_per_key_per_call=int(defaults["max_per_key"] or 0)
            or self.config.max_per_key_per_call,
            charge=defaults["charge"] or self.config.vtime.charge,
            partitions=served,
            **fair,
        )

    def _fair_settings(
        self, queue: dict[str, str | None], env: dict[str, str | None]
    ) -> dict[str, Any]:
        """quantum, window, join, arrival_cap in force: the queue's, else the env's, else
        this process's defaults."""
        vt = self.config.vtime
        quantum, window, join, cap = (
            queue.get(n) or env.get(n) for n in ("quantum", "window", "join", "arrival_cap")
        )
        return {
            "quantum": float(quantum) if quantum else vt.quantum,
            "window": int(window) if window else vt.scan_window_multiplier,
            "join": join or vt.join_policy,
            "arrival_cap": float(cap) if cap else vt.arrival_cap,
        }

    async def command_stats(self) -> dict[str, int]:
        """Successful calls per command since the server's last reset, summed over every
        master (``INFO commandstats``: calls - failed_calls, so a first EVALSHA that met
        NOSCRIPT is not counted). For benchmarks and the simulator's cost figures."""
        from fairq.server import info_per_node

        totals: dict[str, int] = {}
        for stats in (await self.read(info_per_node(self.client, "commandstats"))).values():
            for name, row in stats.items():
                command = str(name).removeprefix("cmdstat_")
                if isinstance(row, dict):
                    calls = int(row.get("calls", 0)) - int(row.get("failed_calls", 0))
                    totals[command] = totals.get(command, 0) + calls
        return totals

    async def schedule_ticks(self, env: Environment, names: Sequence[str]) -> dict[str, int]:
        """The last claimed tick (ms) of each named schedule that has one (the latest of
        the environment's partitions: a schedule's runs go to its tenant's)."""
        if not names:
            return {}
        rows = await self.per_partition(env, lambda pipe, e: pipe.hmget(e.schedules, list(names)))
        out: dict[str, int] = {}
        for raw in rows:
            for n, v in zip(names, raw, strict=True):
                if v is not None:
                    out[n] = max(out.get(n, 0), int(v))
        return out

    async def env_order_setting(self, env: Environment) -> str | None:
        """The order stored for the environment (None: none set; process defaults apply)."""
        raw = await self.read(self.client.hget(self.keys.env(env).config, "order"))
        return _opt(raw)

    async def environments(self) -> list[Environment]:
        """Every environment that ever enqueued, across shards."""
        shards = self.keys.shards()

        def build(pipe: Any) -> None:
            for s in shards:
                pipe.smembers(s.envs)

        envs: set[Environment] = set()
        for members in await self.pipeline(build):
            for m in members:
                envs.add(Environment.parse(text_of(m)))
        return sorted(envs)

    async def queues(self, env: Environment) -> list[str]:
        """Every queue of an environment that ever had a run (in any of its partitions)."""
        rows = await self.per_partition(env, lambda pipe, e: pipe.smembers(e.queues))
        return sorted({text_of(m) for members in rows for m in members})

    async def per_partition(
        self, env: Environment, command: Callable[[Any, EnvKeys], None]
    ) -> list[Any]:
        """One command per partition of the environment (its keys given), in one round
        trip: the replies, partition 0 first."""
        served = (await self.placement(env)).served

        def build(pipe: Any) -> None:
            for partition in range(served):
                command(pipe, self.keys.env(env, partition))

        return await self.pipeline(build)

    async def tenant_tags(self, env: Environment) -> list[TenantTag]:
        """The environment's tenants in the fair order, lowest virtual tag first
        (for inspection; a tag below the floor counts as the floor)."""

        def build(pipe: Any, e: EnvKeys) -> None:
            pipe.zrange(e.tenant_tags, 0, 999, withscores=True)
            pipe.zscore(e.tenant_tags, K.FLOOR_MEMBER)
            pipe.hgetall(e.tenant_weights)

        rows = await self.per_partition(env, build)
        out = []
        for i in range(0, len(rows), 3):
            entries, floor_raw, weights = rows[i : i + 3]
            floor = float(floor_raw) if floor_raw is not None else 0.0
            w = {text_of(k): float(v) for k, v in weights.items()}
            out += [
                TenantTag(
                    K.decode_tenant(text_of(m)), max(floor, float(sc)), w.get(text_of(m), 1.0)
                )
                for m, sc in entries
                if text_of(m) != K.FLOOR_MEMBER
            ]
        return sorted(out, key=lambda t: t.virtual_tag)[:1000]

    async def tenant_floor(self, env: Environment) -> float | None:
        """The environment's tenant virtual time (None before any fair serve; the
        highest of its partitions')."""
        rows = await self.per_partition(
            env, lambda pipe, e: pipe.zscore(e.tenant_tags, K.FLOOR_MEMBER)
        )
        floors = [float(raw) for raw in rows if raw is not None]
        return max(floors) if floors else None

    # ------------------------------------------------------------------ dead letters, runs

    async def dead_letters(self, env: Environment, *, limit: int = 100) -> list[DeadLetter]:
        """The environment's dead-lettered runs, oldest first (with their last error)."""
        validate.integer("limit", limit, 1, MAX_DEAD_LETTERS)
        rows = await self.per_partition(
            env, lambda pipe, e: pipe.zrange(e.dlq, 0, limit - 1, withscores=True)
        )
        # (score, run id, partition), oldest first across the partitions
        members = sorted(
            (float(score), text_of(m), partition)
            for partition, row in enumerate(rows)
            for m, score in row
        )[:limit]
        if not members:
            return []

        def build(pipe: Any) -> None:
            for _, run_id, partition in members:
                message = self.keys.env(env, partition).message(run_id)
                pipe.hmget(message, run_hash.stored(_DEAD_LETTER_READ))

        out: list[DeadLetter] = []
        for (score, run_id, _), raw in zip(members, await self.pipeline(build), strict=True):
            h = run_hash.by_name(_DEAD_LETTER_READ, raw)
            if h["queue"] is None:
                continue
            ck, tenant = h["ck"], h["tenant"]
            out.append(
                DeadLetter(
                    env=env,
                    queue=text_of(h["queue"]),
                    run_id=run_id,
                    concurrency_key=K.decode_concurrency_key(text_of(ck)) if ck else None,
                    attempt=int(h["attempts"]),
                    dead_lettered_at_ms=int(score),
                    payload_json=text_of(h["payload"]),
                    error=_opt(h["error"]) or None,
                    tenant=K.decode_tenant(text_of(tenant)) if tenant else None,
                    traceback=_opt(h["traceback"]) or None,
                )
            )
        return out

    async def get_run(self, env: Environment, run_id: str) -> RunInfo | None:
        """A run's status: from the queue while it exists, else its kept outcome; None
        when fairq knows nothing of it (never enqueued, completed without a kept outcome,
        or its outcome's retention passed)."""
        K.validate_name("run id", run_id)

        def build(pipe: Any, e: EnvKeys) -> None:
            pipe.hmget(e.message(run_id), run_hash.stored(_RUN_READ))
            pipe.get(e.outcome(run_id))

        rows = await self.per_partition(env, build)
        # the partition that knows the run (a run id lives in one partition at a time)
        at = next(
            (
                i
                for i in range(0, len(rows), 2)
                if any(v is not None for v in rows[i]) or rows[i + 1]
            ),
            0,
        )
        raw, outcome_raw = rows[at], rows[at + 1]
        outcome = decode_outcome(run_id, outcome_raw) if outcome_raw else None
        h = run_hash.by_name(_RUN_READ, raw)
        if h["state"] is None:
            return outcome
        state = text_of(h["state"])
        progress = None
        if h["progress"]:
            fraction, _, note = text_of(h["progress"]).partition(":")
            progress = (float(fraction), note)
        ck, tenant, score, started = h["ck"], h["tenant"], h["score"], h["lease_start"]
        return RunInfo(
            run_id=run_id,
            status=STATE_STATUS.get(state, RunStatus.QUEUED),
            queue=_opt(h["queue"]),
            concurrency_key=K.decode_concurrency_key(text_of(ck)) if ck else None,
            tenant=K.decode_tenant(text_of(tenant)) if tenant else None,
            attempts=int(h["attempts"]),
            enqueued_at_ms=int(float(h["enqueued_at"])) if h["enqueued_at"] else None,
            due_at_ms=int(float(score)) if score and state == "queued" else None,
            started_at_ms=int(float(started)) if started and state == "running" else None,
            payload_json=_opt(h["payload"]),
            error=_opt(h["error"]) or (outcome.error if outcome else None),
            traceback=_opt(h["traceback"]) or (outcome.traceback if outcome else None),
            finished_at_ms=outcome.finished_at_ms if outcome and state == "dlq" else None,
            cancel_requested=h["cancel_requested"] is not None,
            progress=progress,
        )

    async def recent_runs(
        self, env: Environment, queue: str, *, limit: int = 100
    ) -> list[RecentRun]:
        """The queue's most recently finished runs, newest first."""
        validate.integer("limit", limit, 1, 100_000)
        rows = await self.per_queue_partition(
            env, queue, lambda pipe, q: pipe.lrange(q.recent, 0, limit - 1)
        )
        runs = [[_recent_run(text_of(item)) for item in raw] for raw in rows]
        if len(runs) == 1:
            return runs[0]
        merged = heapq.merge(*runs, key=lambda r: r.finished_at_ms, reverse=True)
        return list(merged)[:limit]

    async def per_queue_partition(
        self, env: Environment, queue: str, command: Callable[[Any, QueueKeys], None]
    ) -> list[Any]:
        """One command per partition of a queue (its keys given), in one round trip."""
        served = (await self.placement(env)).served
        qkeys = [self.keys.queue(env, queue, partition) for partition in range(served)]

        def build(pipe: Any) -> None:
            for q in qkeys:
                command(pipe, q)

        return await self.pipeline(build)

    async def history(
        self, env: Environment, queue: str, *, window_ms: int, now_ms: int | None = None
    ) -> list[HistoryBucket]:
        """The queue's 10-second history buckets over the last ``window_ms`` (at most one
        hour kept), oldest first, empty buckets included."""
        validate.integer("window_ms", window_ms, HISTORY_BUCKET_MS, HISTORY_WINDOW_MS)
        if now_ms is None:
            now_ms = await self.server_time_ms()
        last = now_ms // HISTORY_BUCKET_MS
        first = last - window_ms // HISTORY_BUCKET_MS + 1
        buckets = range(first, last + 1)

        def build(pipe: Any, q: QueueKeys) -> None:
            for bucket in buckets:
                pipe.hgetall(q.history(bucket))

        rows = await self.per_queue_partition(env, queue, build)
        out = []
        for i, bucket in enumerate(buckets):
            f: dict[str, int] = {}
            for fields in rows[i :: len(buckets)]:  # the bucket in every partition
                for k, v in fields.items():
                    f[text_of(k)] = f.get(text_of(k), 0) + int(float(v))
            by_tenant: dict[str | None, int] = {}
            for name, n in f.items():
                if name == HISTORY_OVERFLOW_FIELD:
                    continue
                if name.startswith(HISTORY_TENANT_PREFIX):
                    tenant = name[len(HISTORY_TENANT_PREFIX) :]
                    by_tenant[
                        None if tenant.startswith("/") else K.decode_concurrency_key(tenant)
                    ] = n
            out.append(
                HistoryBucket(
                    start_ms=bucket * HISTORY_BUCKET_MS,
                    by_tenant=by_tenant,
                    other_tenants=f.get(HISTORY_OVERFLOW_FIELD, 0),
                    **{counter: f.get(counter, 0) for counter in HISTORY_COUNTERS},
                )
            )
        return out

    async def audit_log(self, env: Environment, *, limit: int = 100) -> list[AuditEntry]:
        """The environment's recorded admin actions, newest first."""
        validate.integer("limit", limit, 1, validate.AUDIT_KEEP)
        raw = await self.read(self.client.lrange(self.keys.env(env).audit, 0, limit - 1))
        out = []
        for item in raw:
            data = json.loads(text_of(item))
            out.append(
                AuditEntry(
                    at_ms=int(data["at"]), who=str(data["who"]), action=str(data["action"]),
                    target=str(data["target"]), detail=str(data.get("detail", "")),
                )
            )  # fmt: skip
        return out

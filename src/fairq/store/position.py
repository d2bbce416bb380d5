"""Where a run stands, and what holds a queue's backlog: reads only.

Both :meth:`PositionOps.run_position` (one queued run: the runs ahead of it in its flow,
its rank in the order, the gates holding it, an estimated start) and
:mod:`fairq.store.backlog` (a queue's ready runs that more workers could serve now vs
those held by caps, rates or a pause) read the same snapshot of one queue on one shard:
:meth:`PositionOps.queue_snapshot`, a few pipelines of reads and nothing written. Every
key it reads is named by :func:`read_keys`, from the :mod:`fairq.keys` schema, and by
nothing else here: a new family of queued structures (a level of its own) is one change
there.

The gates are the scripts' (``include/gates.lua``), evaluated in Python on the values
read: environment slots (limit x burst), the queue's pause, total cap and rate; a flow's
key cap (its override, else min(queue limit, environment limit); the keyless runs share
the queue's limit); its tenant's cap; the tenant's and the key's rate limits (token
buckets refilled to the read's clock).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from fairq import keys as K
from fairq.config import MAX_LIMIT
from fairq.keys import Environment, EnvKeys, KeySchema, QueueKeys
from fairq.outcomes import FINISH_STATUSES, STATE_STATUS, RunInfo, RunStatus
from fairq.store import run_hash
from fairq.store._core import text_of
from fairq.store.history import HISTORY_BUCKET_MS
from fairq.store.readers import ReaderOps, _key_tag

#: Flows of a queue a snapshot reads at most (those with the oldest heads).
MAX_FLOWS: Final = 1000
#: Runs holding a capped flow's slots whose lease start an estimate reads at most.
MAX_LEASE_READS: Final = 1000
#: How far back the throughput behind an estimated start reaches (ms).
THROUGHPUT_WINDOW_MS: Final = 60_000

#: The gates a run can be held by, in the order they are reported.
GATES: Final = (
    "paused", "delayed", "env_limit", "queue_total", "queue_rate", "key_cap", "tenant_cap",
    "tenant_rate", "key_rate",
)  # fmt: skip

#: What a snapshot reads of each history bucket: runs started, the summed run time of
#: the runs finished, and the runs finished by how.
_HISTORY_READ: Final = ("served", "run_ms", *FINISH_STATUSES)
#: What a position reads of the run hash.
_RUN_READ: Final = ("state", "queue", "ck", "tenant", "score", "level")
#: What locates a running run's slots (for counters a reader finds missing).
_RUNNING_READ: Final = ("queue", "ck", "slot_tenant")
#: The environment's and the queue's config fields a snapshot reads.
_ENV_FIELDS: Final = ("concurrency", "burst_factor", "order", "quantum")
_QUEUE_FIELDS: Final = (
    "concurrency", "paused", "total", "rate", "rate_burst", "key_rate", "key_rate_burst",
    "tenant_rate", "tenant_rate_burst", "order", "quantum",
)  # fmt: skip


# ---------------------------------------------------------------------- key names


#: Every priority level, highest first.
LEVELS: Final = tuple(range(1, K.MAX_LEVELS + 1))


@dataclass(frozen=True, slots=True)
class ReadKeys:
    """The keys a snapshot of one queue (on one partition) reads: the queue's own (slots,
    counters, caps, rate buckets, history: shared by its priority levels) and each
    level's order keys (queued sets, index of keyed flows, parked members, tenant tags)."""

    env: EnvKeys
    queue: QueueKeys
    #: Each level's order keys (QueueKeys.at_level).
    levels: dict[int, QueueKeys]
    #: Each level's tenant tags (the environment's, under its level's name).
    tenant_tags: dict[int, str]

    def flow_queued(self, level: int, flow: str) -> str:
        """A flow's queued set at a level (the keyless runs of no named tenant: the
        level's own)."""
        if flow == K.KEYLESS_FLOW:
            return self.levels[level].queued
        return self.levels[level].variant_queued(flow)

    def flow_slots(self, flow: str) -> str:
        """The slot set a flow's runs hold (every keyless flow shares the queue's; every
        level the same)."""
        if flow_keyless(flow):
            return self.queue.inflight
        return self.queue.variant_inflight(flow)

    def history(self, bucket: int) -> str:
        return self.queue.history(bucket)


def read_keys(schema: KeySchema, env: Environment, queue: str, partition: int) -> ReadKeys:
    """Every key name the position and backlog readers use, from the key schema."""
    e, q = schema.env(env, partition), schema.queue(env, queue, partition)
    tags = K.ENV_KEYS["tenant_tags"]
    return ReadKeys(
        env=e,
        queue=q,
        levels={level: q.at_level(level) for level in LEVELS},
        tenant_tags={level: f"{K.level_name(e.prefix, level)}:{tags}" for level in LEVELS},
    )


def flow_keyless(flow: str) -> bool:
    """Whether a flow's runs hold the queue's keyless slots (they have no key)."""
    return flow == K.KEYLESS_FLOW or flow.endswith(K.FLOW_TENANT_SEPARATOR)


def flow_tenant(queue: str, flow: str) -> tuple[str, bool]:
    """A flow's tenant as the scripts name it (its named tenant, else its key, else
    ``/<queue>``), and whether it is a named tenant."""
    if flow == K.KEYLESS_FLOW:
        return "/" + queue, False
    named, _ = K.split_flow(flow)
    return (named, True) if named is not None else (flow, False)


# ---------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Gate:
    """One gate holding a run (or a flow's backlog) now.

    ``name`` is one of :data:`GATES`; ``limit`` the cap or rate (runs / s), ``used`` the
    runs holding its slots (a cap) or the whole tokens left (a rate); ``until_ms`` when it
    opens by itself (a rate's next token, a delayed run's due time; None: when a slot
    frees or someone resumes the queue)."""

    name: str
    limit: float | None = None
    used: float | None = None
    until_ms: int | None = None

    def describe(self) -> str:
        text = {
            "paused": "the queue is paused",
            "delayed": "not due yet",
            "env_limit": "the environment's concurrency limit",
            "queue_total": "the queue's total concurrency cap",
            "queue_rate": "the queue's rate limit",
            "key_cap": "its key's concurrency cap",
            "tenant_cap": "its tenant's concurrency cap",
            "tenant_rate": "its tenant's rate limit",
            "key_rate": "its key's rate limit",
        }[self.name]
        if self.limit is not None and self.name.endswith("_rate"):
            text += f" ({self.limit:g}/s)"
        elif self.limit is not None:
            text += f" ({int(self.used or 0)}/{int(self.limit)} in flight)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"gate": self.name, "limit": self.limit, "used": self.used,
                "until_ms": self.until_ms, "text": self.describe()}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StartEstimate:
    """An estimate (not a promise) of when a queued run starts: the runs of its queue
    expected to start before it, at the queue's recent throughput."""

    at_ms: int
    #: Runs of the queue expected to start before it.
    runs_before: int
    #: Runs the queue started per second over the window.
    throughput_per_s: float
    window_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "runs_before": self.runs_before,
                "throughput_per_s": self.throughput_per_s, "window_ms": self.window_ms,
                "estimate": True}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunPosition:
    """Where a run stands. Only a queued run has a place; any other reports its status.

    Attributes:
        ahead_in_flow: runs of its flow (its key's queued set, or the keyless runs) that
            start before it: those ahead of it at its priority level, and the flow's
            ready runs at higher levels.
        rank: its tenant's place among the queue's ready tenants (1 = next): by virtual
            tag in the fair order, by the head's age among the queue's flows in the age
            order (``ranked_among`` how many compete).
        gates: what holds it now (empty: it starts on the next dequeue that reaches it).
        estimate: None when the queue is paused or started nothing in the window.
    """

    run_id: str
    status: RunStatus
    now_ms: int
    queue: str | None = None
    concurrency_key: str | None = None
    tenant: str | None = None
    order: str | None = None
    ahead_in_flow: int | None = None
    flow_queued: int | None = None
    rank: int | None = None
    ranked_among: int | None = None
    gates: tuple[Gate, ...] = ()
    estimate: StartEstimate | None = None
    #: Its priority level (1 is the highest), and the ready runs of the queue's higher
    #: levels (they start first: the levels are served in strict order).
    level: int | None = None
    ahead_at_higher_levels: int | None = None

    @classmethod
    def of_info(cls, info: RunInfo, now_ms: int) -> RunPosition:
        """A run that is not queued: its status only."""
        return cls(info.run_id, info.status, now_ms, info.queue, info.concurrency_key,
                   info.tenant)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "status": self.status.value, "now_ms": self.now_ms,
            "queue": self.queue, "key": self.concurrency_key, "tenant": self.tenant,
            "order": self.order, "level": self.level,
            "ahead_at_higher_levels": self.ahead_at_higher_levels,
            "ahead_in_flow": self.ahead_in_flow,
            "flow_queued": self.flow_queued, "rank": self.rank,
            "ranked_among": self.ranked_among, "gates": [g.to_json() for g in self.gates],
            "estimated_start": None if self.estimate is None else self.estimate.to_json(),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket as the scripts keep it: rate (runs / s), burst, raw state."""

    rate: float
    burst: int
    raw: str | None

    def peek(self, now_ms: int) -> tuple[int, int]:
        """Whole tokens now, and when the next token arrives (ms) (gates.lua's
        bucket_peek)."""
        tokens, updated = float(self.burst), now_ms
        if self.raw:
            t, _, u = self.raw.partition(":")
            tokens, updated = float(t), int(float(u))
        if now_ms > updated:
            tokens = min(self.burst, tokens + (now_ms - updated) * self.rate / 1000)
        tokens = min(tokens, float(self.burst))
        whole = math.floor(tokens + 1e-9)
        next_at = now_ms + math.ceil((1 - (tokens - whole)) * 1000 / self.rate - 1e-9)
        return whole, next_at


@dataclass(slots=True)
class Flow:
    """One flow of a queue as read: its runs, its slots, its tenant and its limits."""

    flow: str
    tenant: str
    named: bool
    head_ms: int | None
    #: Its priority level (1 is the highest).
    level: int = K.BASE_LEVEL
    queued: int = 0
    ready: int = 0
    #: Slots its runs hold (keyless flows: every keyless run of the queue's).
    slots: int = 0
    key_cap: int = MAX_LIMIT
    tenant_cap: int | None = None
    key_rate: Bucket | None = None
    tenant_rate: Bucket | None = None
    #: Its tenant's virtual tag (fair order: V:tt, else its parked tag, never below the
    #: floor) and weight.
    tag: float | None = None
    weight: float = 1.0
    #: Runs of the flow with a score below the run asked about (age-order estimate).
    before_score: int = 0
    #: When the runs holding its slots started (read only when its cap binds a run).
    lease_starts: list[int] | None = None


@dataclass(slots=True)
class QueueSnapshot:
    """One queue on one partition at ``now_ms``: limits, counts and its flows."""

    queue: str
    now_ms: int
    order: str
    quantum: float
    env_limit_burst: int
    env_running: int
    #: The per-variant limit: min(queue limit, environment limit).
    limit: int
    paused: bool
    total: int | None
    queue_running: int
    queue_rate: Bucket | None
    #: Runs of named tenants in flight, by encoded tenant.
    tenant_running: dict[str, int]
    flows: list[Flow] = field(default_factory=list)
    #: Queued runs of flows beyond :data:`MAX_FLOWS` (not read one by one).
    unread_queued: int = 0
    #: Runs the queue started per history bucket over the throughput window.
    served: list[tuple[int, int]] = field(default_factory=list)
    #: Runs finished over the window and their summed run time (ms), from the history.
    finished: int = 0
    run_ms: int = 0
    #: Whether the keyed runs in flight were counted (the lazy counter was there).
    ck_running_known: bool = True

    def flow(self, name: str, level: int = K.BASE_LEVEL) -> Flow | None:
        return next((f for f in self.flows if f.flow == name and f.level == level), None)

    def at_level(self, level: int) -> QueueSnapshot:
        """The same snapshot with only the flows of one priority level."""
        return replace(self, flows=[f for f in self.flows if f.level == level])

    def key_room(self, f: Flow) -> int | None:
        """Slots left under the flow's key cap (None: it cannot bind, as in gates.lua)."""
        if f.key_cap >= self.env_limit_burst:
            return None
        return f.key_cap - f.slots

    def tenant_room(self, f: Flow) -> int | None:
        """Slots left under the flow's tenant cap (None: none binds)."""
        if f.tenant_cap is None:
            return None
        if f.named:
            if f.tenant_cap >= self.env_limit_burst:
                return None
            return f.tenant_cap - self.tenant_running.get(f.tenant, 0)
        if f.tenant_cap >= f.key_cap:  # a key's own tenant: only a lower cap binds
            return None
        return f.tenant_cap - f.slots

    def mean_run_ms(self) -> float | None:
        """The mean run time of the runs finished over the window (None: none finished)."""
        return self.run_ms / self.finished if self.finished else None

    def throughput_per_s(self) -> float:
        """Runs started per second over the window: from the first bucket that started
        any (or the window's start) to now."""
        started = [(start, n) for start, n in self.served if n > 0]
        if not started:
            return 0.0
        since = max(started[0][0], self.now_ms - THROUGHPUT_WINDOW_MS)
        span_ms = max(self.now_ms - since, HISTORY_BUCKET_MS // 10)
        return sum(n for _, n in started) * 1000 / span_ms


@dataclass(frozen=True, slots=True)
class _Run:
    """The queued run a position is read for."""

    run_id: str
    flow: str
    score: int
    level: int


@dataclass(slots=True)
class _FirstRead:
    """What the first round of a snapshot found that the second needs."""

    #: (level, flow) of every flow read, highest level first.
    flows: list[tuple[int, str]]
    heads: dict[tuple[int, str], int]
    floors: dict[int, float | None]
    limits: dict[str, Any]
    index_size: int
    ck_queued: int | None


def flow_gates(snap: QueueSnapshot, f: Flow, *, score_ms: int | None = None) -> list[Gate]:
    """The gates holding a flow (and a run of it with ``score_ms``) now, in GATES order."""
    now = snap.now_ms
    out: list[Gate] = []
    if snap.paused:
        out.append(Gate("paused"))
    if score_ms is not None and score_ms > now:
        out.append(Gate("delayed", until_ms=score_ms))
    if snap.env_running >= snap.env_limit_burst:
        out.append(Gate("env_limit", snap.env_limit_burst, snap.env_running))
    if snap.total is not None and snap.queue_running >= snap.total:
        out.append(Gate("queue_total", snap.total, snap.queue_running))
    out += _rate_gate("queue_rate", snap.queue_rate, now)
    key_room = snap.key_room(f)
    if key_room is not None and key_room <= 0:
        out.append(Gate("key_cap", f.key_cap, f.slots))
    tenant_room = snap.tenant_room(f)
    if tenant_room is not None and tenant_room <= 0:
        cap = f.tenant_cap or 0
        out.append(Gate("tenant_cap", cap, cap - tenant_room))
    out += _rate_gate("tenant_rate", f.tenant_rate, now)
    out += _rate_gate("key_rate", f.key_rate, now)
    return out


def _rate_gate(name: str, bucket: Bucket | None, now_ms: int) -> list[Gate]:
    if bucket is None:
        return []
    whole, next_at = bucket.peek(now_ms)
    return [] if whole >= 1 else [Gate(name, bucket.rate, whole, next_at)]


def _opt(raw: Any) -> str | None:
    return None if raw is None else text_of(raw)


def _int(raw: Any) -> int | None:
    return None if raw is None else int(float(text_of(raw)))


def _rate(raw: Any) -> tuple[float, int] | None:
    """A stored ``rate:burst`` override."""
    if raw is None:
        return None
    rate, _, burst = text_of(raw).partition(":")
    return float(rate), int(float(burst or 1))


def _weight(raw: Any) -> float:
    return 1.0 if raw is None else float(raw)


def _bucket(rate: tuple[float, int] | None, raw: Any) -> Bucket | None:
    return None if rate is None else Bucket(rate[0], rate[1], _opt(raw))


# ---------------------------------------------------------------------- reads


class PositionOps(ReaderOps):
    async def run_position(
        self, env: Environment, run_id: str, *, now_ms: int | None = None
    ) -> RunPosition | None:
        """Where a run stands (see :class:`RunPosition`); None when fairq knows nothing
        of it. Reads only, on the run's shard."""
        K.validate_name("run id", run_id)
        now = await self.now_or_server(now_ms)
        rows = await self.per_partition(
            env, lambda pipe, e: pipe.hmget(e.message(run_id), run_hash.stored(_RUN_READ))
        )
        at = next((i for i, r in enumerate(rows) if r[0] is not None), None)
        h = run_hash.by_name(_RUN_READ, rows[at]) if at is not None else None
        if h is None or STATE_STATUS.get(text_of(h["state"])) is not RunStatus.QUEUED:
            info = await self.get_run(env, run_id)
            return None if info is None else RunPosition.of_info(info, now)
        assert at is not None
        queue, ck, tenant = text_of(h["queue"]), text_of(h["ck"]), text_of(h["tenant"])
        score = int(float(text_of(h["score"])))
        level = _int(h["level"]) or K.BASE_LEVEL
        flow = K.flow_of(ck, tenant)
        run = _Run(run_id, flow, score, level)
        snap, rank = await self.queue_snapshot(env, queue, at, now, run=run)
        own = snap.flow(flow, level)
        assert own is not None
        ahead = (rank or 0) + sum(f.ready for f in snap.flows if f.flow == flow and f.level < level)
        if _cap_binds(snap, own, ahead):
            own.lease_starts = await self._lease_starts(read_keys(self.keys, env, queue, at), own)
        return build_position(snap, run, rank or 0, ahead, ck, tenant)

    async def _lease_starts(self, keys: ReadKeys, own: Flow) -> list[int]:
        """When each run holding one of the flow's slots started (its lease start)."""
        ids = [text_of(r) for r in await self.read(self.client.smembers(keys.flow_slots(own.flow)))]

        def build(pipe: Any) -> None:
            for run_id in ids[:MAX_LEASE_READS]:
                pipe.hget(keys.env.message(run_id), run_hash.RUN_FIELDS["lease_start"].stored)

        rows = await self.pipeline(build) if ids else []
        return [int(float(text_of(v))) for v in rows if v is not None]

    async def queue_snapshot(
        self,
        env: Environment,
        queue: str,
        partition: int,
        now_ms: int,
        *,
        run: _Run | None = None,
    ) -> tuple[QueueSnapshot, int | None]:
        """One queue on one partition (see :class:`QueueSnapshot`), and with ``run`` the
        runs ahead of that run in its flow at its level."""
        keys = read_keys(self.keys, env, queue, partition)
        snap, first = await self._snapshot_queue(keys, queue, now_ms)
        if run is not None and (run.level, run.flow) not in first.flows:
            first.flows.append((run.level, run.flow))
        ahead = await self._snapshot_flows(keys, snap, first, run)
        if first.index_size > MAX_FLOWS and first.ck_queued is not None:
            read = sum(f.queued for f in snap.flows if f.flow != K.KEYLESS_FLOW)
            snap.unread_queued = max(0, first.ck_queued - read)
        if (snap.total is not None and not snap.ck_running_known) or any(
            f.named and f.tenant_cap is not None for f in snap.flows
        ):
            await self._running_truth(env, partition, snap, keys)
        return snap, ahead

    async def _snapshot_queue(
        self, keys: ReadKeys, queue: str, now: int
    ) -> tuple[QueueSnapshot, _FirstRead]:
        """Round 1: the config, the counts, the flows with the oldest heads, history."""
        q = keys.queue
        fields = [*_ENV_FIELDS, *(K.config_field(queue, n) for n in _QUEUE_FIELDS)]
        last = now // HISTORY_BUCKET_MS
        buckets = range((now - THROUGHPUT_WINDOW_MS) // HISTORY_BUCKET_MS, last + 1)

        def build(pipe: Any) -> None:
            pipe.hmget(keys.env.config, fields)
            pipe.scard(keys.env.inflight)
            pipe.scard(q.inflight)
            pipe.get(q.ck_running_counter)
            pipe.get(q.ck_queued_counter)
            pipe.hget(q.buckets, "q")
            for b in buckets:
                pipe.hmget(keys.history(b), _HISTORY_READ)
            for level in LEVELS:
                pipe.zrange(keys.levels[level].ck_index, 0, MAX_FLOWS - 1, withscores=True)
                pipe.zcard(keys.levels[level].ck_index)
                pipe.zrange(keys.levels[level].queued, 0, 0, withscores=True)
                pipe.zscore(keys.tenant_tags[level], K.FLOOR_MEMBER)

        raw = await self.pipeline(build)
        config, env_running, keyless_slots, ck_running, ck_queued, qbucket = raw[:6]
        served, per_level = raw[6 : 6 + len(buckets)], raw[6 + len(buckets) :]
        e = dict(zip(_ENV_FIELDS, config[: len(_ENV_FIELDS)], strict=True))
        c = dict(zip(_QUEUE_FIELDS, config[len(_ENV_FIELDS) :], strict=True))
        env_limit = _int(e["concurrency"]) or self.config.default_env_concurrency
        burst = float(text_of(e["burst_factor"])) if e["burst_factor"] else None
        burst = burst or self.config.default_burst_factor
        concurrency = _int(c["concurrency"])
        rate = None if c["rate"] is None else (float(c["rate"]), _int(c["rate_burst"]) or 1)
        order = _opt(c["order"]) or _opt(e["order"]) or ("fair" if self.fair else "age")
        snap = QueueSnapshot(
            queue=queue,
            now_ms=now,
            order=order,
            quantum=float(_opt(c["quantum"]) or _opt(e["quantum"]) or self.config.vtime.quantum),
            env_limit_burst=math.floor(env_limit * burst),
            env_running=int(env_running),
            limit=min(MAX_LIMIT if concurrency is None else concurrency, env_limit),
            paused=_opt(c["paused"]) == "1",
            total=_int(c["total"]),
            queue_running=int(keyless_slots) + (_int(ck_running) or 0),
            queue_rate=_bucket(rate, qbucket),
            tenant_running={},
            served=[
                (b * HISTORY_BUCKET_MS, _int(n[0]) or 0)
                for b, n in zip(buckets, served, strict=True)
            ],
            finished=sum(_int(v) or 0 for row in served for v in row[2:]),
            run_ms=sum(_int(row[1]) or 0 for row in served),
        )
        snap.ck_running_known = ck_running is not None
        heads: dict[tuple[int, str], int] = {}
        floors: dict[int, float | None] = {}
        index_size = 0
        for i, level in enumerate(LEVELS):
            index, size, keyless_head, floor = per_level[i * 4 : i * 4 + 4]
            if keyless_head:
                heads[(level, K.KEYLESS_FLOW)] = int(keyless_head[0][1])
            heads.update(((level, text_of(m)), int(sc)) for m, sc in index)
            floors[level] = None if floor is None else float(floor)
            index_size = max(index_size, int(size))
        read = _FirstRead(
            flows=list(heads), heads=heads, floors=floors, limits=c, index_size=index_size,
            ck_queued=_int(ck_queued),
        )  # fmt: skip
        return snap, read

    async def _snapshot_flows(
        self,
        keys: ReadKeys,
        snap: QueueSnapshot,
        first: _FirstRead,
        run: _Run | None,
    ) -> int | None:
        """Round 2: each flow's runs, slots, caps, rates and tag (and the run's rank in
        its flow at its level)."""
        q, c, now = keys.queue, first.limits, snap.now_ms
        entries = first.flows
        names = [name for _, name in entries]
        tenants = [flow_tenant(snap.queue, name) for name in names]
        fkeys = [K.split_flow(name)[1] for name in names]
        key_rate = (
            None if c["key_rate"] is None
            else (float(c["key_rate"]), _int(c["key_rate_burst"]) or 1)
        )  # fmt: skip
        tenant_rate = (
            None if c["tenant_rate"] is None
            else (float(c["tenant_rate"]), _int(c["tenant_rate_burst"]) or 1)
        )  # fmt: skip

        def build(pipe: Any) -> None:
            for (level, name), (tenant, _) in zip(entries, tenants, strict=True):
                pipe.zcard(keys.flow_queued(level, name))
                pipe.zcount(keys.flow_queued(level, name), "-inf", now)
                pipe.scard(keys.flow_slots(name))
                pipe.zscore(keys.tenant_tags[level], tenant)
                pipe.hget(keys.levels[level].parked, f"t:{tenant}")
                if run is not None:
                    pipe.zcount(keys.flow_queued(level, name), "-inf", f"({run.score}")
            tenant_names = [t for t, _ in tenants]
            pipe.hmget(q.key_caps, [k or "~" for k in fkeys])
            pipe.hmget(q.key_rates, [k or "~" for k in fkeys])
            pipe.hmget(q.tenant_caps, tenant_names)
            pipe.hmget(q.tenant_rates, tenant_names)
            pipe.hmget(q.tenant_running, [*tenant_names, ""])  # '': the seeded marker
            pipe.hmget(q.buckets, [*(f"t:{t}" for t in tenant_names), *(f"k:{n}" for n in names)])
            pipe.hmget(keys.env.tenant_weights, tenant_names)
            pipe.hmget(q.key_weights, [k or "~" for k in fkeys])
            if run is not None:
                pipe.zrank(keys.flow_queued(run.level, run.flow), run.run_id)

        if not names:
            return None
        raw = await self.pipeline(build)
        width = 6 if run is not None else 5
        per_flow, rest = raw[: width * len(names)], raw[width * len(names) :]
        kcaps, krates, tcaps, trates, trunning, bucket_raw, weights, key_weights = rest[:8]
        n = len(names)
        for i, (level, name) in enumerate(entries):
            tenant, named = tenants[i]
            keyless = flow_keyless(name)
            queued, ready, slots, tag, parked = per_flow[i * width : i * width + 5]
            f = Flow(
                flow=name, tenant=tenant, named=named, head_ms=first.heads.get((level, name)),
                level=level, queued=int(queued), ready=int(ready), slots=int(slots),
                key_cap=snap.limit if keyless or kcaps[i] is None else int(kcaps[i]),
                tenant_cap=_int(tcaps[i]),
                tenant_rate=_bucket(_rate(trates[i]) or tenant_rate, bucket_raw[i]),
                key_rate=None if keyless else _bucket(_rate(krates[i]) or key_rate,
                                                      bucket_raw[n + i]),
                weight=_weight(weights[i] if named or keyless else key_weights[i]),
                tag=None if snap.order != "fair" else _key_tag(tag, parked, first.floors[level]),
                before_score=int(per_flow[i * width + 5]) if run is not None else 0,
            )  # fmt: skip
            if named and (trunning[i] is not None or trunning[-1] is not None):
                # a seeded hash holds only the tenants with runs in flight
                snap.tenant_running[tenant] = int(trunning[i] or 0)
            snap.flows.append(f)
        rank = rest[8] if run is not None else None
        return None if rank is None else int(rank)

    async def _running_truth(
        self, env: Environment, partition: int, snap: QueueSnapshot, keys: ReadKeys
    ) -> None:
        """Counters the scripts keep lazily and a reader found missing (the queue's keyed
        runs in flight, a named tenant's), counted from the runs holding environment
        slots (at most the environment's limit x burst)."""
        missing_ck = not snap.ck_running_known
        tenants = {f.tenant for f in snap.flows if f.named and f.tenant not in snap.tenant_running}
        if not missing_ck and not tenants:
            return
        ids = [text_of(r) for r in await self.read(self.client.smembers(keys.env.inflight))]

        def owners(pipe: Any) -> None:
            for run_id in ids:
                pipe.hmget(keys.env.message(run_id), run_hash.stored(_RUNNING_READ))

        keyed, by_tenant = 0, dict.fromkeys(tenants, 0)
        for row in await self.pipeline(owners) if ids else []:
            queue, ck, slot_tenant = run_hash.read(_RUNNING_READ, row)
            if queue is None or text_of(queue) != snap.queue:
                continue
            keyed += 1 if ck else 0
            name = text_of(slot_tenant) if slot_tenant else ""
            if name in by_tenant:
                by_tenant[name] += 1
        if missing_ck:
            snap.queue_running += keyed
        snap.tenant_running.update(by_tenant)

    async def queue_snapshots(
        self, env: Environment, queue: str, now_ms: int
    ) -> list[QueueSnapshot]:
        """:meth:`queue_snapshot` of every partition of the environment."""
        served = (await self.placement(env)).served
        rows = await asyncio.gather(
            *(self.queue_snapshot(env, queue, p, now_ms) for p in range(served))
        )
        return [snap for snap, _ in rows]


# ---------------------------------------------------------------------- position


def build_position(
    snap: QueueSnapshot, run: _Run, rank_in_level: int, ahead: int, ck: str, tenant: str
) -> RunPosition:
    """A queued run's position from its queue's snapshot: ``rank_in_level`` runs ahead of
    it in its flow at its level, ``ahead`` with the flow's runs at higher levels."""
    own = snap.flow(run.flow, run.level)
    assert own is not None
    level = snap.at_level(run.level)
    rank, among = _rank(level, own)
    gates = tuple(flow_gates(snap, own, score_ms=run.score))
    higher = sum(f.ready for f in snap.flows if f.level < run.level)
    return RunPosition(
        run_id=run.run_id,
        status=RunStatus.QUEUED,
        now_ms=snap.now_ms,
        queue=snap.queue,
        concurrency_key=K.decode_concurrency_key(ck) if ck else None,
        tenant=K.decode_tenant(tenant) if tenant else None,
        order=snap.order,
        ahead_in_flow=ahead,
        flow_queued=own.queued,
        rank=rank,
        ranked_among=among,
        gates=gates,
        estimate=estimate_start(level, own, run.score, rank_in_level, ahead, higher, gates),
        level=run.level,
        ahead_at_higher_levels=higher,
    )


def _tenant_heads(snap: QueueSnapshot) -> dict[str, tuple[float, int, str]]:
    """The queue's ready tenants -> their sort key in the fair order (tag, then the
    oldest head, then the name: the serve's tie-break)."""
    out: dict[str, tuple[float, int, str]] = {}
    for f in snap.flows:
        if f.ready <= 0 or f.head_ms is None:
            continue
        key = (f.tag or 0.0, f.head_ms, f.tenant)
        out[f.tenant] = min(out.get(f.tenant, key), key)
    return out


def _rank(snap: QueueSnapshot, own: Flow) -> tuple[int | None, int]:
    """Its tenant's rank (fair order) or its flow's (age order) among the ready ones."""
    if snap.order == "fair":
        tenants = _tenant_heads(snap)
        mine = tenants.get(own.tenant) or (own.tag or 0.0, own.head_ms or snap.now_ms, own.tenant)
        others = [k for t, k in tenants.items() if t != own.tenant]
        return 1 + sum(k < mine for k in others), len(others) + 1
    ready = [(f.head_ms, f.flow) for f in snap.flows if f.ready > 0 and f.head_ms is not None]
    mine_age = (own.head_ms if own.head_ms is not None else snap.now_ms, own.flow)
    others_age = [k for k in ready if k[1] != own.flow]
    return 1 + sum(k < mine_age for k in others_age), len(others_age) + 1


def runs_before(snap: QueueSnapshot, own: Flow, ahead: int) -> int:
    """Runs of the queue expected to start before a run ``ahead`` places into ``own``.

    Age order: the runs ahead in its flow and every queued run of the queue's other flows
    with a lower score (an equal score in another flow is not counted). Fair order, a fluid
    model of the start-time fair queueing: its tenant needs ``a + 1`` more turns, where
    ``a`` counts its runs ahead in its flow and, for a tenant with several keys, up to as
    many of each other key's (its keys take turns); each other ready tenant starts a run
    for every quantum / weight its tag is below the run's start tag, at most its backlog.
    """
    if snap.order != "fair":  # its own flow by rank: runs of one score go by run id
        return ahead + sum(f.before_score for f in snap.flows if f is not own)
    tenant_ahead = ahead + sum(
        min(f.ready, ahead) for f in snap.flows if f.tenant == own.tenant and f is not own
    )
    heads = _tenant_heads(snap)
    mine = heads.get(own.tenant) or (own.tag or 0.0, own.head_ms or 0, own.tenant)
    target = mine[0] + tenant_ahead * snap.quantum / own.weight
    backlog: dict[str, int] = {}
    weight: dict[str, float] = {}
    for f in snap.flows:
        if f.tenant != own.tenant and f.tenant in heads:
            backlog[f.tenant] = backlog.get(f.tenant, 0) + f.ready
            weight[f.tenant] = f.weight
    others = 0
    for t, n in backlog.items():
        tag, step = heads[t][0], snap.quantum / weight[t]
        turns = math.ceil((target - tag) / step - 1e-9) if target > tag else 0
        if abs(tag + turns * step - target) < 1e-9 and heads[t] < mine:
            turns += 1  # a tie at the run's start tag goes to the tenant ranked first
        others += min(n, max(0, turns))
    return tenant_ahead + others


def _cap_binds(snap: QueueSnapshot, own: Flow, ahead: int) -> bool:
    """Whether a keyed flow's cap holds the run ``ahead`` places into it (it has fewer
    free slots than runs up to it), with runs in flight to time."""
    room = snap.key_room(own)
    keyed = not flow_keyless(own.flow)
    return keyed and room is not None and own.slots > 0 and ahead + 1 > max(0, room)


def _slot_start(now: int, free_at: list[int], waiting: int, mean: float) -> int:
    """When the run after ``waiting`` others starts through slots free at ``free_at``,
    each run taking ``mean`` ms."""
    slots = list(free_at)
    heapq.heapify(slots)
    for _ in range(waiting):
        heapq.heappush(slots, math.ceil(heapq.heappop(slots) + mean))
    return max(now, slots[0])


def _cap_bound(snap: QueueSnapshot, own: Flow, ahead: int) -> int:
    """The earliest start its key's cap allows (and its tenant's, for a named tenant's
    runs): the runs ahead of it in the capped scope through the cap's slots at the mean
    run time. A key's slots in flight free when their runs reach the mean run time (read
    from their lease starts); a tenant's, fluidly (cap runs per mean run time)."""
    mean = snap.mean_run_ms()
    if mean is None:
        return 0
    now, bound = snap.now_ms, 0
    room = snap.key_room(own)
    if room is not None and own.key_cap > 0:
        starts = own.lease_starts or []
        busy = [max(now, math.ceil(ls + mean)) for ls in starts]
        busy += [math.ceil(now + mean / 2)] * max(0, min(own.slots, own.key_cap) - len(busy))
        free = [now] * max(0, room)
        bound = _slot_start(now, free + busy, ahead, mean)
    tenant_room = snap.tenant_room(own)
    if tenant_room is not None and own.tenant_cap:
        waiting = ahead + sum(
            min(f.queued, ahead) for f in snap.flows if f.tenant == own.tenant and f is not own
        )
        short = waiting + 1 - max(0, tenant_room)
        if short > 0:
            bound = max(bound, now + math.ceil(short * mean / own.tenant_cap))
    return bound


def estimate_start(
    snap: QueueSnapshot,
    own: Flow,
    score: int,
    ahead_in_level: int,
    ahead: int,
    higher: int,
    gates: Sequence[Gate],
) -> StartEstimate | None:
    """When a queued run is expected to start: after the runs before it (the ready runs
    of the higher priority levels, then :func:`runs_before` at its level, ``snap`` being
    the snapshot at its level) at the queue's recent throughput, no earlier than it is
    due, and no earlier than its key's and tenant's rate limits and caps allow its runs
    ahead of it in its flow (``ahead``, at every level)."""
    if any(g.name == "paused" for g in gates):
        return None
    rate = snap.throughput_per_s()
    if rate <= 0:
        return None
    before = higher + runs_before(snap, own, ahead_in_level)
    at = snap.now_ms + math.ceil(before * 1000 / rate)
    for bucket in (own.key_rate, own.tenant_rate):
        if bucket is not None:
            whole, next_at = bucket.peek(snap.now_ms)
            short = ahead + 1 - whole
            if short > 0:
                at = max(at, next_at + math.ceil((short - 1) * 1000 / bucket.rate))
    at = max(at, _cap_bound(snap, own, ahead))
    return StartEstimate(
        at_ms=max(at, score), runs_before=before, throughput_per_s=rate,
        window_ms=THROUGHPUT_WINDOW_MS,
    )  # fmt: skip


__all__ = [
    "GATES",
    "Gate",
    "PositionOps",
    "QueueSnapshot",
    "RunPosition",
    "StartEstimate",
    "flow_gates",
    "read_keys",
]

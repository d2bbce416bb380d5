"""The Lua fair order against the pure-Python reference model (tests/sfq_model.py),
and the membership closure invariant, on seeded random workloads.

Ported to the two-level order: one environment with several queues, named and default
tenants, keyless runs, key and tenant weights, key / tenant / queue caps, tenant
changes and the loss of the floor key; in some seeds rate limits, total caps,
borrowing and charging by run time. After EVERY operation the served (run, queue,
key, tenant) sequence and the stored order state (V:tt with its ~floor, per queue B:tq,
B:park, B:parkdue, the token buckets and the key sets with their !floor) must equal the
model's exactly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from tests.sfq_model import CAP_RECHECK_MS, KEYLESS, QueueModel, SfqModel, flow_of, flow_tenant
from tests.state import delete_tenant_floor, s, tenant_key_state

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue

#: Long and topology-independent: run on the single server only.
pytestmark = pytest.mark.single_server

T0 = 1_000_000
TENANTS = ["T0", "T1", "T2"]


@dataclass(frozen=True)
class Options:
    """One seeded workload's settings (defaults = the process defaults)."""

    env_limit: int = 10
    queues: tuple[str, ...] = ("q0", "q1", "q2")
    quantum: float = 1.0
    window: int = 3
    join: str = "floor"
    arrival_cap: float = 1.0
    max_per_key: int | None = None
    keyless: float = 0.15  # share of enqueues without a key
    keys: int = 10  # concurrency keys in use
    named: float = 0.6  # share of keys that start in a named tenant
    max_count: int = 10  # a dequeue asks for 1 to this many runs
    #: the limits under the order too: rate limits (queue, key, tenant: defaults and
    #: overrides), total caps and borrowing, changed at random
    limits: bool = False
    charge: bool = False  # every queue charges by run time (charge = "duration")
    #: share of enqueues made by an age-order process (nothing registered: discovery
    #: must find the flow)
    unregistered: float = 0.0


def model_pool(model: SfqModel) -> int:
    """The scripts' id of the model's current consumer pool (its sorted queue names)."""
    return 0 if model.pool == "*" else K.pool_id(model.pool.split(","))


async def read_state(
    rq: RunQueue, env: Environment, queues: tuple[str, ...], pool: int = 0
) -> dict[str, Any]:
    """The order's stored state (the tenant tags of consumer pool ``pool``), in one round
    trip."""
    e = rq.keys.env(env)

    def build(pipe: Any) -> None:
        pipe.zrange(K.pool_name(e.prefix, pool) + ":tt", 0, -1, withscores=True)
        for name in queues:
            q = rq.keys.queue(env, name)
            pipe.zrange(q.ready_tenants, 0, -1, withscores=True)
            pipe.hgetall(q.parked)
            pipe.zrange(q.parked_due, 0, -1, withscores=True)
            pipe.hgetall(q.buckets)
            for t in TENANTS:
                pipe.zrange(q.tenant_keys(K.encode_tenant(t)), 0, -1, withscores=True)
                pipe.hget(q.solo_keys, K.encode_tenant(t))

    replies = iter(await rq.pipeline(build))
    tt = {s(m): float(v) for m, v in next(replies)}
    out: dict[str, Any] = {"tfloor": tt.pop(K.FLOOR_MEMBER, None), "tt": tt}
    for name in queues:
        out[f"{name}.tq"] = {s(m): float(v) for m, v in next(replies)}
        out[f"{name}.park"] = {s(k): s(v) for k, v in next(replies).items()}
        out[f"{name}.parkdue"] = {s(m): int(float(v)) for m, v in next(replies)}
        out[f"{name}.buckets"] = {s(k): s(v) for k, v in next(replies).items()}
        floors = out[f"{name}.kfloor"] = {}
        for t in TENANTS:
            keys, floor = tenant_key_state(t, next(replies), next(replies))
            if floor is not None:
                floors[t] = floor
            if keys:
                out[f"{name}.keys.{t}"] = keys
    return out


def model_state(model: SfqModel, queues: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"tt": dict(model.tt), "tfloor": model.tfloor}
    for name in queues:
        q = model.queue(name)
        out[f"{name}.tq"] = dict(q.tq)
        out[f"{name}.park"] = dict(q.park)
        out[f"{name}.parkdue"] = dict(q.parkdue)
        out[f"{name}.buckets"] = dict(q.buckets)
        out[f"{name}.kfloor"] = dict(q.kfloor)
        for t in TENANTS:
            if q.keysets.get(t):
                out[f"{name}.keys.{t}"] = dict(q.keysets[t])
    return out


def delivered(batch: list[Delivery]) -> list[tuple[str, str, str, str]]:
    """(run, queue, flow, tenant) of each delivery (the workloads' names need no encoding)."""
    return [
        (d.run_id, d.queue, flow_of(d.concurrency_key, d.tenant), d.tenant or "") for d in batch
    ]


#: rate limits a workload sets (runs per second, burst): about as fast as the runs
#: arrive, so they bind now and then
RATES: dict[str, list[float]] = {
    "queue": [150.0, 300.0, 600.0],
    "key": [20.0, 50.0, 100.0],
    "tenant": [40.0, 100.0, 250.0],
}


async def set_key_cap(
    rq: RunQueue, env: Environment, q: QueueModel, key: str, cap: int | None
) -> None:
    """A key's cap in queue ``q`` (None removes it), in the store and the model."""
    await rq.set_key_concurrency(env, q.name, key, cap)
    q.kcaps.pop(key, None) if cap is None else q.kcaps.__setitem__(key, cap)


async def set_tenant_cap(
    rq: RunQueue, env: Environment, q: QueueModel, tenant: str, cap: int | None
) -> None:
    """A tenant's cap in queue ``q`` (None removes it), in the store and the model."""
    await rq.set_tenant_concurrency(env, q.name, tenant, cap)
    q.tcaps.pop(tenant, None) if cap is None else q.tcaps.__setitem__(tenant, cap)


async def change_limit(
    rq: RunQueue,
    env: Environment,
    model: SfqModel,
    rng: random.Random,
    queues: list[str],
    keys: list[str],
) -> str:
    """One random change of the limits under the order (in the store and the model):
    a rate limit (a queue's, every key's / tenant's, or one key's / tenant's, set or
    removed), a total cap, or borrowing on / off. Returns the kind of change."""
    queue = rng.choice(queues)
    q = model.queue(queue)
    which = rng.random()
    if which < 0.1:
        q.borrow = rng.random() < 0.7
        await rq.set_queue_options(env, queue, borrow=True if q.borrow else None)
        return "borrow"
    if which < 0.25:
        total = rng.choice([None, None, 3, 5, 8])
        await rq.set_queue_total_concurrency(env, queue, total)
        q.total = total
        return "total"
    if which < 0.45:  # low caps: the flows borrowing lends slots to
        cap = rng.choice([None, 1, 1, 2])
        if rng.random() < 0.5:
            await set_key_cap(rq, env, q, rng.choice(keys), cap)
        else:
            await set_tenant_cap(rq, env, q, rng.choice(TENANTS), cap)
        return "cap"
    scope = rng.choice(["queue", "key", "tenant", "one key", "one tenant", "one tenant"])
    per_second = rng.choice(RATES[scope.removeprefix("one ")])
    burst = rng.randint(1, 3)
    limit = None if rng.random() < 0.25 else (per_second, burst)
    rate = None if limit is None else per_second
    if scope == "one key":
        key = rng.choice(keys)
        await rq.set_rate_limit(env, queue, rate, burst=burst, key=key)
        q.key_rates.pop(key, None) if limit is None else q.key_rates.__setitem__(key, limit)
    elif scope == "one tenant":
        tenant = rng.choice([*TENANTS, *keys[:3]])  # a key is its own tenant by default
        await rq.set_rate_limit(env, queue, rate, burst=burst, tenant=tenant)
        if limit is None:
            q.tenant_rates.pop(tenant, None)
        else:
            q.tenant_rates[tenant] = limit
    elif scope == "queue":
        await rq.set_rate_limit(env, queue, rate, burst=burst)
        q.rate = limit
    else:
        await rq.set_rate_limit(env, queue, rate, burst=burst, per=scope)  # type: ignore[arg-type]
        setattr(q, f"{scope}_rate", limit)
    return "rate"


async def run_workload(
    rq: RunQueue,
    env: Environment,
    model: SfqModel,
    opts: Options,
    rng: random.Random,
    steps: int,
    *,
    compare_state: bool = True,
    after_step: Callable[[], Awaitable[None]] | None = None,
    age_rq: RunQueue | None = None,
) -> dict[str, int]:
    """Drive the same random operations through the Lua and the model, comparing after
    every operation. Returns how many of each operation ran (and runs served)."""
    workload = Workload(rq, env, model, opts, rng, age_rq)
    await workload.setup()
    for step in range(steps):
        await workload.step(step, compare_state)
        if after_step is not None:
            await after_step()
    return workload.counts


class Workload:
    """One random workload: the same operations on the Lua (``rq``) and the model."""

    def __init__(
        self,
        rq: RunQueue,
        env: Environment,
        model: SfqModel,
        opts: Options,
        rng: random.Random,
        age_rq: RunQueue | None,
    ) -> None:
        self.rq, self.env, self.model, self.opts, self.rng = rq, env, model, opts, rng
        self.age_rq = age_rq
        self.queues = list(opts.queues)
        self.keys = ([f"k{i}" for i in range(opts.keys - 2)] + ["zz", "a"])[: opts.keys]
        self.tenant_of: dict[str, str | None] = {
            k: rng.choice(TENANTS) if rng.random() < opts.named else None for k in self.keys
        }
        self.inflight: dict[str, Delivery] = {}
        self.counts: dict[str, int] = {}
        self.now = T0
        self.counter = 0
        self.where = ""  # the step, for a failed assertion

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n

    async def setup(self) -> None:
        rq, env, model = self.rq, self.env, self.model
        if self.opts.limits:
            for queue in self.queues:
                await rq.set_queue_options(env, queue, borrow=True)
                model.queue(queue).borrow = True
        if self.opts.charge:
            for queue in self.queues:
                await rq.set_queue_options(env, queue, charge="duration")
                model.queue(queue).charge = True

    async def compare(self, where: str) -> None:
        stored = await read_state(self.rq, self.env, self.opts.queues, model_pool(self.model))
        assert stored == model_state(self.model, self.opts.queues), where

    async def step(self, step: int, compare_state: bool) -> None:
        """One random operation (its kind by one draw), then the states compared."""
        rng = self.rng
        self.now += rng.randint(1, 5)
        self.where = f"step {step}"
        if self.opts.limits and rng.random() < 0.06:
            kind = await change_limit(self.rq, self.env, self.model, rng, self.queues, self.keys)
        else:
            op = rng.random()
            kind, run = next((k, r) for upto, k, r in self.operations() if op < upto)
            await run()
        self.count(kind)
        if compare_state:
            await self.compare(f"{self.where} ({kind})")

    def operations(self) -> list[tuple[float, str, Callable[[], Awaitable[None]]]]:
        """Each operation with the draw below which it is chosen."""
        return [
            (0.33, "enqueue", self.enqueue),
            (0.63, "dequeue", self.dequeue),
            (0.79, "ack", self.ack),
            (0.85, "nack", self.nack),
            (0.89, "cap", self.cap),
            (0.93, "weight", self.weight),
            (0.97, "tenant", self.retenant),
            (0.98, "floor", self.lose_floor),
            (0.99, "jump", self.jump),
            (1.0, "idle", self.idle),
        ]

    async def enqueue(self) -> None:
        rng, opts, now = self.rng, self.opts, self.now
        for _ in range(rng.randint(1, 4)):
            queue = rng.choice(self.queues)
            key = None if rng.random() < opts.keyless else rng.choice(self.keys)
            tenant = rng.choice([*TENANTS, None]) if key is None else self.tenant_of[key]
            run = f"r{self.counter}"
            self.counter += 1
            score = now - rng.randint(0, 500) if rng.random() < 0.85 else now + rng.randint(1, 40)
            if opts.unregistered and rng.random() < opts.unregistered:
                assert self.age_rq is not None
                await self.age_rq.enqueue(
                    self.env, queue, run, None, concurrency_key=key, tenant=tenant,
                    available_at_ms=score, now_ms=now,
                )  # fmt: skip
                self.model.enqueue_unregistered(queue, run, key, tenant, score)
                self.count("unregistered")
                continue
            await self.rq.enqueue(self.env, queue, run, None, concurrency_key=key, tenant=tenant,
                                  available_at_ms=score, now_ms=now)  # fmt: skip
            self.model.enqueue(queue, run, key, tenant, score, now)

    async def dequeue(self) -> None:
        rng, queues, model = self.rng, self.queues, self.model
        max_count = rng.randint(1, self.opts.max_count)
        chosen = queues if rng.random() < 0.7 else rng.sample(queues, rng.randint(1, len(queues)))
        batch = await self.rq.dequeue(max_count, env=self.env, queues=chosen, now_ms=self.now)
        want = [
            (r, q, f, model.runs[r].ta) for r, q, f in model.dequeue(chosen, max_count, self.now)
        ]
        assert delivered(batch) == want, self.where
        for d in batch:
            self.inflight[d.run_id] = d
        self.count("served", len(batch))

    async def ack(self) -> None:
        inflight = self.inflight
        for run in self.rng.sample(sorted(inflight), k=min(len(inflight), self.rng.randint(1, 5))):
            await self.rq.ack([inflight.pop(run)], now_ms=self.now)
            self.model.ack(run, self.now)

    async def nack(self) -> None:
        rng, now = self.rng, self.now
        if self.inflight:
            run = rng.choice(sorted(self.inflight))
            retry_at = now if rng.random() < 0.6 else now + rng.randint(1, 30)
            await self.rq.nack(self.inflight.pop(run), retry_at_ms=retry_at, now_ms=now)
            self.model.nack(run, retry_at, now)

    async def cap(self) -> None:
        rng, rq, env = self.rng, self.rq, self.env
        queue = rng.choice(self.queues)
        q = self.model.queue(queue)
        cap = rng.choice([None, None, 1, 2, 3])
        which = rng.random()
        if which < 0.4:
            await set_key_cap(rq, env, q, rng.choice(self.keys), cap)
        elif which < 0.8:
            await set_tenant_cap(rq, env, q, rng.choice(TENANTS), cap)
        else:
            await rq.set_queue_concurrency(env, queue, cap)
            q.concurrency = cap

    async def weight(self) -> None:
        rng, rq, env, model = self.rng, self.rq, self.env, self.model
        w = rng.choice([None, 0.5, 1.0, 2.0, 3.0])
        if rng.random() < 0.5:
            key = rng.choice(self.keys)
            for queue in self.queues:  # one weight per key in every queue (see sfq_model)
                await rq.set_concurrency_key_weight(env, queue, key, w)
                q = model.queue(queue)
                q.key_weights.pop(key, None) if w is None else q.key_weights.__setitem__(key, w)
        else:
            t = rng.choice(TENANTS)
            await rq.set_tenant_weight(env, t, w)
            model.tw.pop(t, None) if w is None else model.tw.__setitem__(t, w)

    async def retenant(self) -> None:
        self.tenant_of[self.rng.choice(self.keys)] = self.rng.choice([*TENANTS, None])

    async def lose_floor(self) -> None:
        await delete_tenant_floor(self.rq, self.env, model_pool(self.model))
        self.model.delete_floor()

    async def jump(self) -> None:
        """Past the re-check of cap-parked members."""
        self.now += CAP_RECHECK_MS + self.rng.randint(0, 1000)

    async def idle(self) -> None:
        return None


SEEDS: list[tuple[int, Options]] = [
    (1, Options()),
    (2, Options(max_per_key=1, env_limit=6)),
    (3, Options(join="behind_leader", arrival_cap=4.0)),
    (4, Options(window=1, queues=("q0", "q1"))),
    (5, Options(quantum=0.5, max_per_key=3, env_limit=12)),
    (6, Options(join="behind_leader", window=2, keyless=0.3)),
    (7, Options(queues=("q0",), env_limit=8)),
    (8, Options(keys=40, named=0.95, queues=("q0", "q1"), env_limit=12)),
    # tenants of ~30 keys in one queue: big key sets, their keys picked again and again
    (9, Options(keys=90, named=1.0, queues=("q0",), env_limit=24)),
    # tenants of 40-50 keys served many times per call (one run per key per call in one):
    # the serve reads more of a key set, past its first entries, again and again
    (10, Options(keys=120, named=1.0, env_limit=200, max_per_key=1, max_count=30)),
    (11, Options(keys=150, named=1.0, env_limit=200, quantum=0.5, max_count=30)),
    # the limits under the order: rates (parking until the next token), total caps,
    # borrowing; and charging by run time
    (12, Options(limits=True, env_limit=30)),
    (13, Options(limits=True, charge=True, env_limit=30)),
    (14, Options(limits=True, keys=40, named=0.95, env_limit=40)),
    (15, Options(charge=True, max_per_key=2, join="behind_leader")),
    (16, Options(limits=True, charge=True, queues=("q0", "q1"), env_limit=40, max_count=20)),
    # runs enqueued by an age-order process: found by discovery, registered by the join
    # rules, the queue's 'unregistered' flag making later calls read every head
    (17, Options(unregistered=0.5, keys=60, named=0.8, env_limit=20)),
    (18, Options(unregistered=0.4, keys=200, named=1.0, env_limit=60, max_count=30)),
]
#: the seeds whose tenants hold more keys than a serve reads first: at least how many times
#: their serves read more of a key set
MANY_KEYS = {9: 3, 10: 10, 11: 5}
STEPS = 1500
#: the run time charged as one quantum where queues charge by run time (runs here take
#: a few to a few hundred ms of the logical clock)
CHARGE_UNIT_MS = 25


@pytest.mark.parametrize(("seed", "opts"), SEEDS, ids=[f"seed{s}" for s, _ in SEEDS])
async def test_lua_fair_order_matches_reference_model(
    make_queue: Any, env: Environment, seed: int, opts: Options
) -> None:
    """Given 1500 random operations (enqueues on random keys / tenants / queues with past
    and future scores, dequeues over all or some queues with random max_count, acks,
    nacks with retry times, cap, weight and tenant changes, loss of the floor key, clock
    jumps past the cap parks' re-check; in some seeds also rate limits of queues, keys
    and tenants, total caps, borrowing and charging by run time), the
    Lua serves exactly the model's (run, queue, key, tenant) sequence and leaves exactly
    the model's stored state (the token buckets included) after every operation.
    18 seeds: 27,000 operations; where tenants hold many keys, the serves read more of
    their key sets many times; where limits change, rates hold runs back and capped
    flows borrow; where queues charge by run time, finished runs correct their tags;
    where an age-order process enqueues, discovery registers what it finds."""
    started = time.monotonic()
    rq = await make_queue(
        vtime={"enabled": True, "quantum": opts.quantum, "scan_window_multiplier": opts.window,
               "join_policy": opts.join, "arrival_cap": opts.arrival_cap,
               "charge_unit_ms": CHARGE_UNIT_MS},
        max_per_key_per_call=opts.max_per_key,
    )  # fmt: skip
    await rq.set_env_limits(env, concurrency=opts.env_limit)
    model = SfqModel(
        env_limit=opts.env_limit, quantum=opts.quantum, window=opts.window, join=opts.join,
        arrival_cap=opts.arrival_cap, max_per_key=opts.max_per_key,
        charge_unit_ms=CHARGE_UNIT_MS,
    )  # fmt: skip
    age_rq = await make_queue() if opts.unregistered else None
    counts = await run_workload(rq, env, model, opts, random.Random(seed), STEPS, age_rq=age_rq)
    assert counts["served"] > 400, counts
    assert min(counts.get(k, 0) for k in ("cap", "weight", "tenant", "nack")) > 10, counts
    if seed in MANY_KEYS:
        assert model.reads_more >= MANY_KEYS[seed], (seed, model.reads_more)
    # calls with more candidate pairs than runs read a key set one entry short first, or
    # only the discovered keys' tags
    assert model.short_reads > 20 and model.probes > 8, (seed, model.short_reads, model.probes)
    if opts.limits:
        assert min(counts.get(k, 0) for k in ("rate", "total", "borrow")) > 3, counts
        assert model.rate_held > 20 and model.borrowed > 5, (model.rate_held, model.borrowed)
    if opts.charge:
        assert model.charged > 200, model.charged
    if opts.unregistered:
        assert counts["unregistered"] > 150, counts
        assert model.joined_by_discovery > 40 and model.full_reads > 20, (
            model.joined_by_discovery, model.full_reads,
        )  # fmt: skip
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("max_per_key", [1, 4])
async def test_lua_age_order_matches_reference_model(
    make_queue: Any, env: Environment, max_per_key: int
) -> None:
    """The model's age order is the age-order script's order (so scenario figures of the
    model and of the real path mean the same thing)."""
    rq: RunQueue = await make_queue(max_per_key_per_call=max_per_key)
    await rq.set_env_limits(env, concurrency=8)
    model = SfqModel(env_limit=8)
    rng = random.Random(11 + max_per_key)
    keys = [f"k{i}" for i in range(7)]
    inflight: dict[str, Delivery] = {}
    now, counter, served = T0, 0, 0
    for step in range(300):
        now += rng.randint(1, 5)
        op = rng.random()
        if op < 0.4:
            for _ in range(rng.randint(1, 4)):
                key, run = rng.choice(keys), f"r{counter}"
                counter += 1
                score = (
                    now - rng.randint(0, 500) if rng.random() < 0.9 else now + rng.randint(1, 30)
                )
                await rq.enqueue(env, "q0", run, None, concurrency_key=key,
                                 available_at_ms=score, now_ms=now)  # fmt: skip
                model.enqueue("q0", run, key, None, score)
        elif op < 0.75:
            max_count = rng.randint(1, 10)
            got = await rq.dequeue_from_queue(
                env, "q0", keyed=True, max_count=max_count, now_ms=now
            )
            want = model.dequeue_age("q0", max_count, now, per_key=max_per_key)
            assert [(d.run_id, d.queue, d.concurrency_key) for d in got] == want, f"step {step}"
            inflight.update((d.run_id, d) for d in got)
            served += len(got)
        elif inflight:
            for run in rng.sample(sorted(inflight), k=min(len(inflight), rng.randint(1, 5))):
                await rq.ack([inflight.pop(run)], now_ms=now)
                model.ack(run)
    assert served > 120


async def test_every_queued_flow_is_registered_or_parked(make_queue: Any, env: Environment) -> None:
    """Membership closure: after every one of 600 random operations (enqueue, batched
    dequeue, ack, nack with and without backoff, caps, tenants) every flow with queued
    runs is a candidate of the fair order: its pair in B:tq (a named tenant's key also in
    the tenant's key set) or parked (the key, or its tenant)."""
    opts = Options()
    rq = await make_queue(vtime={"enabled": True})
    await rq.set_env_limits(env, concurrency=opts.env_limit)
    model = SfqModel(env_limit=opts.env_limit)
    checks = 0

    async def closed() -> None:
        nonlocal checks
        st = await read_state(rq, env, opts.queues, model_pool(model))
        for name in opts.queues:
            q = model.queue(name)
            tq, park = st[f"{name}.tq"], st[f"{name}.park"]
            for flow, runs in q.queued.items():
                if not runs:
                    continue
                named = flow_tenant(flow)
                tenant = named or (f"/{name}" if flow == KEYLESS else flow)
                if named and named != flow:
                    keyset = st.get(f"{name}.keys.{named}", {})
                    assert flow in keyset or f"k:{flow}" in park, (name, flow)
                    if flow in keyset:
                        assert tenant in tq or f"t:{tenant}" in park, (name, flow, tenant)
                else:
                    assert tenant in tq or f"t:{tenant}" in park, (name, flow)
                checks += 1

    await run_workload(
        rq, env, model, opts, random.Random(99), 600, compare_state=False, after_step=closed
    )
    assert checks > 3000

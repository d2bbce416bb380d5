"""Randomised: a queue's total cap and its counters against a Python model, 5,000
operations per order.

One queue holds keyless runs, runs of six keys serving as their own tenants and runs of
three keys of two named tenants. A seeded loop drives enqueue (keyless / keyed / named
tenant, some delayed), dequeue (1..6 runs), ack, nack (requeue with a backoff, or
dead-letter at the last attempt), release, cancel (queued: gone; running: requested,
and a later nack ends it cancelled), deletion of the queue's lazy CK counters, and
changes of the total cap (None, 0, 1, 3, 8), of key caps and of a tenant cap, on a
logical clock.

After every operation ``queue_stats`` running / queued equal the model exactly (and,
every fifth, the raw counters, when present, equal the model's keyed counts). After
every dequeue: no new run started beyond the total cap, a key's cap or a tenant's cap
(runs started before a cap was lowered may stay above it); and while no key or tenant
cap is set the call served exactly ``min(asked, room under the total cap, ready runs)``:
the total cap is the only thing that held work back. (The first half of the operations
changes only the total cap, the second half key and tenant caps too.)
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from tests.integration.limits_support import Order, both_orders, queue_for

from fairq.keys import Environment
from fairq.models import (
    AckStatus,
    CancelOutcome,
    Delivery,
    EnqueueStatus,
    NackOutcome,
    ReleaseStatus,
)
from fairq.store import RunQueue

#: Long and topology-independent: run on the single server only.
pytestmark = pytest.mark.single_server

QUEUE = "mixed"
OPERATIONS = 5_000
OWN_KEYS = ("a", "b", "c", "d", "e", "f")
#: key -> its named tenant
TENANT_KEYS = {"t1a": "T1", "t1b": "T1", "t2a": "T2"}
MAX_ATTEMPTS = 3
LEASE_MS = 86_400_000
#: Above every total the model reaches (so the env limit never binds).
ENV_LIMIT = 1_000


@dataclass
class Run:
    run_id: str
    ck: str | None
    tenant: str | None
    state: str  # 'queued' | 'running'
    score: int
    slot: bool = False
    delivery: Delivery | None = None
    #: a cancel was asked while it ran: a nack ends it cancelled (a cancel wins)
    cancel_requested: bool = False


@dataclass
class Model:
    runs: dict[str, Run] = field(default_factory=dict)
    total: int | None = None
    key_caps: dict[str, int] = field(default_factory=dict)
    tenant_caps: dict[str, int] = field(default_factory=dict)

    def queued(self) -> int:
        return sum(r.state == "queued" for r in self.runs.values())

    def holders(self) -> list[Run]:
        return [r for r in self.runs.values() if r.slot]

    def ready(self, now: int) -> int:
        return sum(r.state == "queued" and r.score <= now for r in self.runs.values())

    def keyed(self) -> tuple[int, int]:
        """(queued, slot-holding) runs with a concurrency key."""
        rs = [r for r in self.runs.values() if r.ck is not None]
        return sum(r.state == "queued" for r in rs), sum(r.slot for r in rs)


class Driver:
    """Applies one random operation to the server and to the model, then compares."""

    WEIGHTS: ClassVar[dict[str, int]] = {
        "op_enqueue": 30,
        "op_dequeue": 26,
        "op_ack": 14,
        "op_nack": 7,
        "op_release": 4,
        "op_cancel": 5,
        "op_delete_counters": 4,
        "op_total_cap": 4,
        "op_key_cap": 2,
        "op_tenant_cap": 1,
    }
    OVERRIDE_OPS: ClassVar[tuple[str, ...]] = ("op_key_cap", "op_tenant_cap")

    def __init__(self, rq: RunQueue, env: Environment, rnd: random.Random) -> None:
        self.rq, self.env, self.rnd = rq, env, rnd
        self.model = Model()
        self.now = 50_000_000
        self.serial = 0
        self.q = rq.keys.queue(env, QUEUE)
        self.ops: Counter[str] = Counter()
        self.events: Counter[str] = Counter()

    def _pick(self, state: str) -> Run | None:
        runs = [r for r in self.model.runs.values() if r.state == state]
        return self.rnd.choice(runs) if runs else None

    async def op_enqueue(self) -> None:
        rnd = self.rnd
        self.serial += 1
        run_id = f"r{self.serial}"
        kind = rnd.random()
        ck: str | None
        tenant: str | None = None
        if kind < 0.3:
            ck = None
        elif kind < 0.75:
            ck = rnd.choice(OWN_KEYS)
        else:
            ck = rnd.choice(list(TENANT_KEYS))
            tenant = TENANT_KEYS[ck]
        delay = 0 if rnd.random() < 0.8 else rnd.randint(1, 400)
        got = await self.rq.enqueue(
            self.env, QUEUE, run_id, None, concurrency_key=ck, tenant=tenant,
            delay_ms=delay, now_ms=self.now,
        )  # fmt: skip
        assert got is EnqueueStatus.ENQUEUED
        self.model.runs[run_id] = Run(run_id, ck, tenant, "queued", self.now + delay)

    def _slots(self) -> tuple[Counter[str], Counter[str]]:
        """Slot holders per key and per named tenant."""
        keys: Counter[str] = Counter()
        tenants: Counter[str] = Counter()
        for r in self.model.holders():
            if r.ck is not None:
                keys[r.ck] += 1
            if r.tenant is not None:
                tenants[r.tenant] += 1
        return keys, tenants

    async def op_dequeue(self) -> None:
        m = self.model
        ask = self.rnd.randint(1, 6)
        running = len(m.holders())
        ready = m.ready(self.now)
        keys_before, tenants_before = self._slots()
        got = await self.rq.dequeue(ask, env=self.env, queues=[QUEUE], lease_ms=LEASE_MS,
                                    now_ms=self.now)  # fmt: skip
        room = ENV_LIMIT - running
        if m.total is not None:
            room = min(room, max(0, m.total - running))
        assert len(got) <= min(ask, room, ready)
        if not m.key_caps and not m.tenant_caps:
            assert len(got) == min(ask, room, ready), (ask, room, ready)
            self.events["exact"] += 1
        new_keys = Counter(d.concurrency_key for d in got if d.concurrency_key is not None)
        new_tenants = Counter(d.tenant for d in got if d.tenant is not None)
        for k, n in new_keys.items():
            if k in m.key_caps:
                assert keys_before[k] + n <= max(m.key_caps[k], keys_before[k]), k
        for t, n in new_tenants.items():
            if t in m.tenant_caps:
                assert tenants_before[t] + n <= max(m.tenant_caps[t], tenants_before[t]), t
        for d in got:
            run = m.runs[d.run_id]
            assert run.state == "queued" and run.score <= self.now, d.run_id
            assert d.tenant == run.tenant
            run.state, run.slot, run.delivery = "running", True, d
        self.events["served"] += len(got)
        if m.total is not None and len(got) < ask and ready > len(got):
            self.events["held_by_total"] += 1

    async def op_ack(self) -> None:
        run = self._pick("running")
        if run is None:
            return
        assert run.delivery is not None
        assert await self.rq.ack([run.delivery], now_ms=self.now) == [AckStatus.ACKED]
        del self.model.runs[run.run_id]

    async def op_nack(self) -> None:
        run = self._pick("running")
        if run is None:
            return
        d = run.delivery
        assert d is not None
        delay = self.rnd.choice([0, 0, 50, 300])
        got = await self.rq.nack(d, retry_delay_ms=delay, max_attempts=MAX_ATTEMPTS,
                                 now_ms=self.now)  # fmt: skip
        if run.cancel_requested:
            assert got is NackOutcome.CANCELLED
            del self.model.runs[run.run_id]
        elif d.attempt + 1 >= MAX_ATTEMPTS:
            assert got is NackOutcome.DEAD_LETTERED
            del self.model.runs[run.run_id]
            self.events["dead_lettered"] += 1
        else:
            assert got is NackOutcome.REQUEUED
            run.state, run.slot, run.score, run.delivery = "queued", False, self.now + delay, None

    async def op_release(self) -> None:
        run = self._pick("running")
        if run is None:
            return
        assert run.delivery is not None
        expected = ReleaseStatus.RELEASED if run.slot else ReleaseStatus.NOT_HELD
        assert await self.rq.release([run.delivery], now_ms=self.now) == [expected]
        run.slot = False
        self.events[expected.value] += 1

    async def op_cancel(self) -> None:
        run = self._pick("queued" if self.rnd.random() < 0.8 else "running")
        if run is None:
            return
        got = await self.rq.cancel(self.env, run.run_id, now_ms=self.now)
        if run.state == "queued":
            assert got is CancelOutcome.CANCELLED
            del self.model.runs[run.run_id]
        else:
            assert got is CancelOutcome.CANCEL_REQUESTED
            run.cancel_requested = True
        self.events[got.value] += 1

    async def op_delete_counters(self) -> None:
        keys = self.rnd.choice(
            [[self.q.ck_queued_counter], [self.q.ck_running_counter],
             [self.q.ck_queued_counter, self.q.ck_running_counter]]
        )  # fmt: skip
        await self.rq.client.delete(*keys)

    async def op_total_cap(self) -> None:
        cap = self.rnd.choice([None, 0, 1, 3, 3, 8, 8])
        await self.rq.set_queue_total_concurrency(self.env, QUEUE, cap)
        self.model.total = cap

    async def op_key_cap(self) -> None:
        key = self.rnd.choice([*OWN_KEYS[:2], "t1a"])
        cap = self.rnd.choice([None, None, 0, 1, 2])
        await self.rq.set_key_concurrency(self.env, QUEUE, key, cap)
        if cap is None:
            self.model.key_caps.pop(key, None)
        else:
            self.model.key_caps[key] = cap

    async def op_tenant_cap(self) -> None:
        cap = self.rnd.choice([None, None, 1, 2])
        await self.rq.set_tenant_concurrency(self.env, QUEUE, "T1", cap)
        if cap is None:
            self.model.tenant_caps.pop("T1", None)
        else:
            self.model.tenant_caps["T1"] = cap

    async def step(self, *, overrides: bool) -> None:
        """One random operation (key / tenant cap changes only with ``overrides``)."""
        self.now += self.rnd.randint(0, 30)
        weights = {n: w for n, w in self.WEIGHTS.items() if overrides or n not in self.OVERRIDE_OPS}
        name = self.rnd.choices(list(weights), weights=list(weights.values()))[0]
        self.ops[name] += 1
        await getattr(self, name)()

    async def check(self, step: int) -> None:
        m = self.model
        stats = await self.rq.queue_stats(self.env, QUEUE)
        expected = (len(m.holders()), m.queued())
        assert (stats.running, stats.queued) == expected, (step, self.ops)
        assert stats.total_concurrency_limit == m.total
        if step % 5:
            return
        raw_q, raw_r = await self.rq.client.mget(
            self.q.ck_queued_counter, self.q.ck_running_counter
        )
        keyed_q, keyed_r = m.keyed()
        if raw_q is not None:
            assert int(raw_q) == keyed_q, step
        if raw_r is not None:
            assert int(raw_r) == keyed_r, step


@both_orders
async def test_total_cap_and_counters_match_the_model(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """5,000 random operations: counters exact after each, no start beyond any cap, and
    work-conserving up to the total cap while no key/tenant cap is set."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_env_limits(env, concurrency=ENV_LIMIT)
    driver = Driver(rq, env, random.Random(f"limits-{order}"))
    for step in range(OPERATIONS):
        # first half: the total cap alone; second half: key and tenant caps too
        await driver.step(overrides=step >= OPERATIONS // 2)
        await driver.check(step)
    # the run exercised what it is about
    assert driver.events["held_by_total"] >= 50, driver.events
    assert driver.events["served"] >= 800, driver.events
    assert driver.events["exact"] >= 500, driver.events
    for event in ("dead_lettered", "released", "not_held", "cancelled", "cancel_requested"):
        assert driver.events[event] > 0, driver.events
    assert min(driver.ops.values()) >= 15, driver.ops

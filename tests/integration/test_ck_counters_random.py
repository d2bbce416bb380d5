"""Randomised: the CK counters and every reader agree with an independent ground truth
after each of 5,000 operations.

One base queue holds keyless runs and runs in six concurrency-key variants. A seeded
loop drives enqueue (single and batch, with delays, TTLs and duplicates), dequeue,
ack (also with spent lease tokens), nack (requeue and dead-letter), release,
heartbeat, TTL expiry on a logical clock, lease reclaim, redrive, counter deletion (a
counter's TTL running out), and changes of the queue's concurrency and size limits.

The ground truth is a Python model of every run's state, updated from what each call
returns (deliveries, the runs' expiry outcomes) and checked against it (the statuses the
model predicts). After every step the raw counter keys (when present) and
``queue_stats(breakdown=True)``, and after every fifth step the variant keys'
ZCARD/SCARD, the CK index and the environment's in-flight set, must equal the model:
zero difference. The size limit is checked on the way: an enqueue is rejected exactly
when the model's queued total is at the limit.

Ported to the rewritten store: the expiry stream is gone, so a run the model expects to
have expired (queued, its TTL passed) is looked up with ``get_run``: its hash is gone and
its outcome says ``expired`` (with its key), or it is still queued. ``B:ckbusy`` is gone
by design: the keys check compares the environment's in-flight set (the running truth
the counters are seeded from) with the model's slot holders instead. Heartbeat, release
and a stale nack return the new enums (a stale nack of a run that no longer exists is
``UNKNOWN``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from fairq.config import RetryPolicy
from fairq.errors import QueueSizeLimitExceededError
from fairq.keys import Environment
from fairq.models import (
    AckStatus,
    Delivery,
    EnqueueRequest,
    EnqueueStatus,
    HeartbeatStatus,
    NackOutcome,
    ReleaseStatus,
)
from fairq.outcomes import RunStatus
from fairq.store import RunQueue
from fairq.store.run_hash import RUN_FIELDS

MakeQueue = Callable[..., Awaitable[RunQueue]]

QUEUE = "task/random"
VARIANTS = ("a", "b", "c", "d", "e", "f")
OPERATIONS = 5_000
FAIR_ORDER_OPERATIONS = 1_000
LEASE_MS = 2_000
MAX_ATTEMPTS = 3
COUNTER_TTL_S = 86_400


@dataclass
class Run:
    """What the model knows about one live run (acked and expired runs are dropped)."""

    run_id: str
    ck: str | None
    state: str  # 'queued' | 'running' | 'dlq'
    score: int
    ttl_deadline: int = 0
    attempt: int = 0
    slot: bool = False
    lease_deadline: int = 0
    delivery: Delivery | None = None


@dataclass
class Model:
    runs: dict[str, Run] = field(default_factory=dict)
    size_limit: int = 0
    #: Deliveries whose lease token is spent (acked, nacked, reclaimed).
    spent: list[Delivery] = field(default_factory=list)

    def tally(self) -> dict[str | None, tuple[int, int]]:
        """(queued, holding a slot) per variant; ``None`` = the keyless runs."""
        queued: Counter[str | None] = Counter()
        running: Counter[str | None] = Counter()
        for r in self.runs.values():
            if r.state == "queued":
                queued[r.ck] += 1
            if r.slot:
                running[r.ck] += 1
        return {ck: (queued[ck], running[ck]) for ck in (None, *VARIANTS)}

    def in_state(self, state: str) -> list[Run]:
        return [r for r in self.runs.values() if r.state == state]


class Driver:
    """Applies one random operation to the server and the model, then compares."""

    def __init__(self, rq: RunQueue, env: Environment, rnd: random.Random) -> None:
        self.rq = rq
        self.env = env
        self.rnd = rnd
        self.model = Model()
        self.now = 10_000_000
        self.serial = 0
        self.q = rq.keys.queue(env, QUEUE)
        self.ops: dict[str, int] = {}
        #: Outcomes worth having seen at least once (asserted at the end).
        self.events: Counter[str] = Counter()

    # ---------------------------------------------------------------- operations

    def _new_request(self) -> EnqueueRequest:
        rnd = self.rnd
        if self.model.runs and rnd.random() < 0.08:
            run_id = rnd.choice(list(self.model.runs))  # a duplicate
        else:
            self.serial += 1
            run_id = f"r{self.serial}"
        ck = None if rnd.random() < 0.3 else rnd.choice(VARIANTS)
        delay = 0 if rnd.random() < 0.7 else rnd.randint(1, 1_500)
        ttl = rnd.randint(50, 2_000) if rnd.random() < 0.3 else None
        return EnqueueRequest(self.env, QUEUE, run_id, {"n": self.serial}, ck, delay, ttl_ms=ttl)

    def _expect_enqueue(self, r: EnqueueRequest) -> EnqueueStatus:
        m = self.model
        if r.run_id in m.runs:
            self.events["duplicate"] += 1
            return EnqueueStatus.DUPLICATE
        if m.size_limit > 0 and sum(t[0] for t in m.tally().values()) + 1 > m.size_limit:
            self.events["rejected"] += 1
            return EnqueueStatus.REJECTED
        m.runs[r.run_id] = Run(
            r.run_id, r.concurrency_key, "queued", self.now + r.delay_ms,
            0 if r.ttl_ms is None else self.now + r.ttl_ms,
        )  # fmt: skip
        return EnqueueStatus.ENQUEUED

    async def op_enqueue(self) -> None:
        r = self._new_request()
        expected = self._expect_enqueue(r)
        try:
            got = await self.rq.enqueue(
                self.env, QUEUE, r.run_id, r.payload, concurrency_key=r.concurrency_key,
                delay_ms=r.delay_ms, ttl_ms=r.ttl_ms, now_ms=self.now,
            )  # fmt: skip
        except QueueSizeLimitExceededError as exc:
            assert exc.maximum_size == self.model.size_limit
            got = EnqueueStatus.REJECTED
        assert got is expected, (r, expected, got)

    async def op_enqueue_many(self) -> None:
        batch = [self._new_request() for _ in range(self.rnd.randint(2, 6))]
        expected = [self._expect_enqueue(r) for r in batch]
        results = await self.rq.enqueue_many(batch, now_ms=self.now)
        assert [x.status for x in results] == expected

    def _take(self, d: Delivery) -> None:
        run = self.model.runs[d.run_id]
        assert run.state == "queued" and run.score <= self.now, (run, d)
        assert not 0 < run.ttl_deadline <= self.now, ("delivered after its TTL", run)
        assert d.attempt == run.attempt and d.concurrency_key == run.ck
        run.state, run.slot, run.delivery = "running", True, d
        run.lease_deadline, run.ttl_deadline = self.now + LEASE_MS, 0

    async def _sync_expired(self) -> set[str]:
        """Drop the runs that expired (hash gone, outcome ``expired``) from the model."""
        due = [
            r
            for r in self.model.runs.values()
            if r.state == "queued" and 0 < r.ttl_deadline <= self.now
        ]
        ids = set()
        for run in due:  # only these can have expired: nothing else is looked up
            info = await self.rq.get_run(self.env, run.run_id)
            assert info is not None, run
            if info.status is RunStatus.QUEUED:
                continue  # due, but no script has met it yet
            assert info.status is RunStatus.EXPIRED, (run, info)
            assert info.concurrency_key == run.ck and info.queue == QUEUE, (run, info)
            del self.model.runs[run.run_id]
            ids.add(run.run_id)
            self.events["expired"] += 1
        return ids

    async def op_dequeue(self) -> None:
        count = self.rnd.randint(1, 6)
        how = self.rnd.random()
        if how < 0.5:
            got = await self.rq.dequeue(count, now_ms=self.now)
        else:
            got = await self.rq.dequeue_from_queue(
                self.env, QUEUE, keyed=how < 0.8, max_count=count, now_ms=self.now
            )
        for d in got:
            self._take(d)
        await self._sync_expired()

    def _pick(self, state: str) -> Run | None:
        runs = self.model.in_state(state)
        return self.rnd.choice(runs) if runs else None

    def _spend(self, run: Run) -> Delivery:
        assert run.delivery is not None
        self.model.spent.append(run.delivery)
        if len(self.model.spent) > 50:
            self.model.spent.pop(0)
        return run.delivery

    def _stale_status(self, d: Delivery) -> AckStatus:
        run = self.model.runs.get(d.run_id)
        if run is None:
            return AckStatus.UNKNOWN
        return AckStatus.LEASE_LOST  # a spent token never matches the current delivery

    async def op_ack(self) -> None:
        if self.model.spent and self.rnd.random() < 0.15:
            d = self.rnd.choice(self.model.spent)
            assert await self.rq.ack([d], now_ms=self.now) == [self._stale_status(d)]
            return
        run = self._pick("running")
        if run is None:
            return
        d = self._spend(run)
        assert await self.rq.ack([d], now_ms=self.now) == [AckStatus.ACKED]
        del self.model.runs[run.run_id]

    async def op_nack(self) -> None:
        if self.model.spent and self.rnd.random() < 0.1:
            d = self.rnd.choice(self.model.spent)
            stale = NackOutcome.LEASE_LOST if d.run_id in self.model.runs else NackOutcome.UNKNOWN
            assert await self.rq.nack(d, now_ms=self.now) is stale
            return
        run = self._pick("running")
        if run is None:
            return
        d = self._spend(run)
        increment = self.rnd.random() < 0.8
        retry_at = self.now + self.rnd.randint(0, 800)
        got = await self.rq.nack(
            d, retry_at_ms=retry_at, increment_attempt=increment, now_ms=self.now
        )
        run.slot = False
        run.attempt += 1 if increment else 0
        if increment and run.attempt >= MAX_ATTEMPTS:
            assert got is NackOutcome.DEAD_LETTERED
            run.state = "dlq"
            self.events["dead_lettered"] += 1
        else:
            assert got is NackOutcome.REQUEUED
            run.state, run.score = "queued", retry_at

    async def op_release(self) -> None:
        run = self._pick("running")
        if run is None:
            return
        assert run.delivery is not None
        expected = ReleaseStatus.RELEASED if run.slot else ReleaseStatus.NOT_HELD
        assert await self.rq.release([run.delivery], now_ms=self.now) == [expected]
        run.slot = False

    async def op_heartbeat(self) -> None:
        run = self._pick("running")
        if run is None:
            return
        assert run.delivery is not None
        assert await self.rq.heartbeat([run.delivery], lease_ms=LEASE_MS, now_ms=self.now) == [
            HeartbeatStatus.EXTENDED
        ]
        run.lease_deadline = self.now + LEASE_MS

    async def op_expire_ttl(self) -> None:
        due = {
            r.run_id
            for r in self.model.runs.values()
            if r.state == "queued" and 0 < r.ttl_deadline <= self.now
        }
        assert await self.rq.expire_ttl(now_ms=self.now, batch=10_000) == len(due)
        assert await self._sync_expired() == due

    async def op_reclaim(self) -> None:
        lapsed = [r for r in self.model.in_state("running") if r.lease_deadline <= self.now]
        got = await self.rq.reclaim_lapsed_leases(now_ms=self.now, batch=10_000)
        assert got == len(lapsed)
        self.events["reclaimed"] += len(lapsed)
        for run in lapsed:
            self._spend(run)
            run.state, run.slot = "queued", False

    async def op_redrive(self) -> None:
        run = self._pick("dlq")
        if run is None:
            return
        await self.rq.redrive(self.env, run.run_id, now_ms=self.now)
        run.state, run.score, run.attempt = "queued", self.now, 0

    async def op_delete_counters(self) -> None:
        keys = self.rnd.choice(
            [
                [self.q.ck_queued_counter],
                [self.q.ck_running_counter],
                [self.q.ck_queued_counter, self.q.ck_running_counter],
            ]
        )
        await self.rq.client.delete(*keys)

    async def op_limits(self) -> None:
        if self.rnd.random() < 0.5:
            limit = self.rnd.choice([None, 0, 15, 30, 60])
            await self.rq.set_queue_size_limit(self.env, QUEUE, limit)
            self.model.size_limit = limit or 0
        else:
            concurrency = self.rnd.choice([None, None, 1, 3, 0])
            await self.rq.set_queue_concurrency(self.env, QUEUE, concurrency)

    WEIGHTS: ClassVar[dict[str, int]] = {
        "op_enqueue": 28,
        "op_enqueue_many": 5,
        "op_dequeue": 22,
        "op_ack": 12,
        "op_nack": 9,
        "op_release": 4,
        "op_heartbeat": 3,
        "op_expire_ttl": 4,
        "op_reclaim": 3,
        "op_redrive": 2,
        "op_delete_counters": 6,
        "op_limits": 2,
    }

    async def step(self) -> None:
        self.now += self.rnd.randint(0, 40) if self.rnd.random() < 0.97 else 2_500
        name = self.rnd.choices(list(self.WEIGHTS), weights=list(self.WEIGHTS.values()))[0]
        self.ops[name] = self.ops.get(name, 0) + 1
        await getattr(self, name)()

    # ---------------------------------------------------------------- comparison

    async def check(self, step: int) -> None:
        """The raw counters (where present) and ``queue_stats(breakdown=True)``."""
        q = self.q
        truth = self.model.tally()
        ck_queued = sum(truth[ck][0] for ck in VARIANTS)
        ck_running = sum(truth[ck][1] for ck in VARIANTS)
        pipe = self.rq.client.pipeline(transaction=False)
        pipe.get(q.ck_queued_counter)
        pipe.get(q.ck_running_counter)
        pipe.ttl(q.ck_queued_counter)
        pipe.ttl(q.ck_running_counter)
        counter_q, counter_r, ttl_q, ttl_r = await pipe.execute()
        where = f"step {step}"
        # raw counters, where present, are exact and carry a bounded TTL
        if counter_q is not None:
            assert int(counter_q) == ck_queued, where
            assert 0 < ttl_q <= COUNTER_TTL_S, where
        if counter_r is not None:
            assert int(counter_r) == ck_running, where
            assert 0 < ttl_r <= COUNTER_TTL_S, where
        # the reader (which re-seeds a missing counter)
        stats = await self.rq.queue_stats(self.env, QUEUE, breakdown=True)
        expected = (truth[None][0] + ck_queued, truth[None][1] + ck_running)
        assert (stats.queued, stats.running) == expected, where
        assert {v.concurrency_key: (v.queued, v.running) for v in stats.variants} == {
            ck: truth[ck] for ck in VARIANTS if truth[ck] != (0, 0)
        }, where

    async def check_keys(self, step: int) -> None:
        """The variant keys, CK index and the env's in-flight set themselves."""
        q = self.q
        truth = self.model.tally()
        pipe = self.rq.client.pipeline(transaction=False)
        pipe.zcard(q.queued)
        pipe.scard(q.inflight)
        pipe.zrange(q.ck_index, 0, -1)
        pipe.smembers(self.rq.keys.env(self.env).inflight)
        for ck in VARIANTS:
            pipe.zcard(q.variant_queued(ck))
            pipe.scard(q.variant_inflight(ck))
        raw = await pipe.execute()
        base_q, base_r, index, inflight = raw[:4]
        where = f"step {step}"
        assert (base_q, base_r) == truth[None], where
        seen = [(raw[4 + 2 * i], raw[5 + 2 * i]) for i in range(len(VARIANTS))]
        assert seen == [truth[ck] for ck in VARIANTS], where
        assert {x.decode() for x in index} == {ck for ck in VARIANTS if truth[ck][0]}, where
        # the running truth: every slot holder (keyless and keyed) is in the env's set
        assert {x.decode() for x in inflight} == {
            r.run_id for r in self.model.runs.values() if r.slot
        }, where

    async def check_states(self) -> None:
        """Every model run's state matches its message hash."""
        ids = list(self.model.runs)
        pipe = self.rq.client.pipeline(transaction=False)
        for run_id in ids:
            pipe.hget(self.rq.keys.env(self.env).message(run_id), RUN_FIELDS["state"].stored)
        states = await pipe.execute()
        for run_id, state in zip(ids, states, strict=True):
            assert state is not None and state.decode() == self.model.runs[run_id].state, run_id


@pytest.mark.parametrize(
    ("order", "operations"),
    [
        pytest.param("age", OPERATIONS, marks=pytest.mark.single_server),
        ("fair", FAIR_ORDER_OPERATIONS),
    ],
)
async def test_every_reader_matches_ground_truth(
    make_queue: MakeQueue, env: Environment, order: str, operations: int
) -> None:
    """5,000 random operations (the age order); after each, zero difference between the
    readers, the counters, the variant keys and the model. The fair order shares the
    counter helpers but has its own scripts, so a shorter run covers it too."""
    rq = await make_queue(
        shard_count=1,
        lease_ms=LEASE_MS,
        default_env_concurrency=12,
        max_per_key_per_call=2,
        retry=RetryPolicy(max_attempts=MAX_ATTEMPTS, randomize=False),
        vtime={"enabled": order == "fair"},
    )
    driver = Driver(rq, env, random.Random(f"ck-counters-{order}"))
    for step in range(operations):
        await driver.step()
        await driver.check(step)
        if step % 5 == 4:
            await driver.check_keys(step)
        if step % 250 == 249:
            await driver.check_states()
    # the run must have exercised every operation, and reached interesting states
    assert set(driver.ops) == set(Driver.WEIGHTS), driver.ops
    wanted = {"duplicate", "rejected", "expired", "dead_lettered", "reclaimed"}
    assert all(driver.events[e] > 0 for e in wanted), driver.events
    assert driver.serial > operations // 5

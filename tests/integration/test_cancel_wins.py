"""A cancel asked while a run runs wins: no path gives the run another attempt.

The scripts that would (nack: a retry or a dead letter; reclaim: a lapsed lease) end a
run whose cancellation was asked as ``cancelled`` instead, with its slot freed; a
redrive starts clean. The model test drives random interleavings of cancel with
enqueue, dequeue, ack, nack, heartbeat, reclaim, redrive and TTL expiry on a logical
clock (every call's ``now_ms``) and compares the stored state with a Python model after
every step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Final

import pytest
from tests.state import run_fields

from fairq.errors import RunNotFoundError
from fairq.keys import Environment
from fairq.models import (
    AckStatus,
    CancelOutcome,
    Delivery,
    Finish,
    HeartbeatStatus,
    NackOutcome,
)
from fairq.outcomes import KeptOutcome, RunStatus
from fairq.store import RunQueue

T0: Final = 1_700_000_000_000
LEASE_MS: Final = 1_000
#: Attempts before a run is dead-lettered.
MAX_ATTEMPTS: Final = 3


def s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def running(rq: RunQueue, env: Environment, queue: str = "q") -> set[str]:
    return {s(m) for m in await rq.client.smembers(rq.keys.queue(env, queue).inflight)}  # type: ignore[misc]


# ---------------------------------------------------------------- each path


async def _cancelled_while_running(rq: RunQueue, env: Environment, run_id: str) -> Delivery:
    await rq.enqueue(env, "q", run_id, {"n": 1}, now_ms=T0)
    (delivery,) = await rq.dequeue(1, env=env, queues=["q"], lease_ms=LEASE_MS, now_ms=T0)
    assert await rq.cancel(env, run_id, now_ms=T0 + 1) is CancelOutcome.CANCEL_REQUESTED
    return delivery


@pytest.mark.parametrize("increment", [True, False], ids=["failed attempt", "given back"])
async def test_a_nack_of_a_run_asked_to_cancel_ends_it_cancelled(
    make_queue: Any, env: Environment, increment: bool
) -> None:
    """A retry (or a run given back on shutdown) of a run whose cancel was asked while
    it ran: the run ends cancelled, keeps the attempt's error, frees its slot, and is
    never delivered again."""
    rq: RunQueue = await make_queue()
    d = await _cancelled_while_running(rq, env, "r1")
    outcome = await rq.nack(d, retry_delay_ms=0, increment_attempt=increment, error="boom",
                            now_ms=T0 + 2)  # fmt: skip
    assert outcome is NackOutcome.CANCELLED
    info = await rq.get_run(env, "r1")
    assert info is not None
    assert (info.status, info.error, info.attempts) == (
        RunStatus.CANCELLED, "boom", 1 if increment else 0,
    )  # fmt: skip
    assert await running(rq, env) == set()
    assert await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 10_000) == []
    assert (await rq.queue_stats(env, "q")).queued == 0


async def test_a_last_attempt_of_a_run_asked_to_cancel_is_cancelled_not_dead_lettered(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    d = await _cancelled_while_running(rq, env, "r1")
    assert await rq.nack(d, max_attempts=1, now_ms=T0 + 2) is NackOutcome.CANCELLED
    assert await rq.dead_letters(env) == []
    info = await rq.get_run(env, "r1")
    assert info is not None and info.status is RunStatus.CANCELLED


async def test_a_lapsed_lease_of_a_run_asked_to_cancel_ends_it_cancelled(
    make_queue: Any, env: Environment
) -> None:
    """Its worker died after the cancel: the reclaim ends the run cancelled instead of
    requeueing it, and frees its slot."""
    rq: RunQueue = await make_queue()
    await _cancelled_while_running(rq, env, "r1")
    assert await rq.reclaim_lapsed_leases(now_ms=T0 + LEASE_MS + 1) == 0  # none requeued
    info = await rq.get_run(env, "r1")
    assert info is not None and info.status is RunStatus.CANCELLED
    assert await running(rq, env) == set()
    assert await rq.client.zcard(rq.keys.shard(rq.keys.shard_of(env)).leases) == 0
    assert await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 10_000) == []


async def test_a_redriven_run_starts_clean(make_queue: Any, env: Environment) -> None:
    """A dead letter that carries a cancel mark and a progress note (as an older fairq
    could leave one) is redriven without them: its next delivery is not told to stop."""
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(1, env=env, queues=["q"], lease_ms=LEASE_MS, now_ms=T0)
    assert await rq.nack(d, max_attempts=1, now_ms=T0 + 1) is NackOutcome.DEAD_LETTERED
    key = rq.keys.env(env).message("r1")
    await rq.client.hset(key, mapping={"cx": T0, "pg": "0.5000:half"})  # type: ignore[misc]
    await rq.redrive(env, "r1", now_ms=T0 + 2)
    fields = await run_fields(rq, env, "r1")
    assert "cx" not in fields and "pg" not in fields
    (again,) = await rq.dequeue(1, env=env, queues=["q"], lease_ms=LEASE_MS, now_ms=T0 + 3)
    assert await rq.heartbeat([again], now_ms=T0 + 4) == [HeartbeatStatus.EXTENDED]


async def test_a_completion_that_races_the_cancel_stays_completed(
    make_queue: Any, env: Environment
) -> None:
    """The run finished before its worker heard the cancel: its ack records the real
    outcome (the work was done), and the mark goes with the run's hash."""
    rq: RunQueue = await make_queue()
    d = await _cancelled_while_running(rq, env, "r1")
    done = Finish(d, "completed", KeptOutcome("1"))
    assert await rq.finish([done], now_ms=T0 + 2) == [AckStatus.ACKED]
    info = await rq.get_run(env, "r1")
    assert info is not None and (info.status, info.result) == (RunStatus.COMPLETED, 1)
    assert await run_fields(rq, env, "r1") == {}


# ---------------------------------------------------------------- the model


@dataclass
class Run:
    """What the model knows of one run."""

    state: str  # queued | running | dlq | done
    attempts: int = 0
    token: int = 0
    score: int = 0
    ttl: int = 0  # TTL deadline (ms), 0 = none
    lease: int = 0  # lease deadline (ms) while running
    cancel: bool = False  # a cancel was asked while it ran
    final: RunStatus | None = None


class Model:
    """The run life cycle as the scripts should keep it (one keyless queue)."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        #: Cancels that won over a retry, a dead letter or a lapsed lease.
        self.wins = 0

    def queued(self) -> dict[str, int]:
        return {r: m.score for r, m in self.runs.items() if m.state == "queued"}

    def _end(self, m: Run, status: RunStatus) -> None:
        m.state, m.final, m.cancel, m.ttl = "done", status, False, 0

    def enqueue(self, run_id: str, now: int, ttl_ms: int) -> None:
        self.runs[run_id] = Run("queued", score=now, ttl=now + ttl_ms if ttl_ms else 0)

    def dequeue(self, now: int) -> str | None:
        """The claim of one run: due TTLs at the head expire (8 looks at most)."""
        ready = sorted((m.score, r) for r, m in self.runs.items()
                       if m.state == "queued" and m.score <= now)  # fmt: skip
        for _, run_id in ready[:8]:
            m = self.runs[run_id]
            if m.ttl and m.ttl <= now:
                self._end(m, RunStatus.EXPIRED)
                continue
            m.state, m.token, m.ttl, m.lease = "running", m.token + 1, 0, now + LEASE_MS
            return run_id
        return None

    def _held(self, d: Delivery) -> tuple[Run | None, str]:
        m = self.runs.get(d.run_id)
        if m is None or m.state == "done":
            return None, "unknown"
        if m.state != "running" or m.token != d.lease_token:
            return None, "lease_lost"
        return m, "held"

    def ack(self, d: Delivery, status: RunStatus) -> AckStatus:
        m, how = self._held(d)
        if m is None:
            return AckStatus.UNKNOWN if how == "unknown" else AckStatus.LEASE_LOST
        self._end(m, status)
        return AckStatus.ACKED

    def nack(self, d: Delivery, now: int, delay: int, increment: bool) -> NackOutcome:
        m, how = self._held(d)
        if m is None:
            return NackOutcome.UNKNOWN if how == "unknown" else NackOutcome.LEASE_LOST
        m.attempts += 1 if increment else 0
        if m.cancel:
            self._end(m, RunStatus.CANCELLED)
            self.wins += 1
            return NackOutcome.CANCELLED
        if increment and m.attempts >= MAX_ATTEMPTS:
            m.state = "dlq"
            return NackOutcome.DEAD_LETTERED
        m.state, m.score = "queued", now + delay
        return NackOutcome.REQUEUED

    def heartbeat(self, d: Delivery, now: int) -> HeartbeatStatus:
        m, how = self._held(d)
        if m is None:
            return HeartbeatStatus.UNKNOWN if how == "unknown" else HeartbeatStatus.LEASE_LOST
        m.lease = now + LEASE_MS
        return HeartbeatStatus.CANCEL_REQUESTED if m.cancel else HeartbeatStatus.EXTENDED

    def cancel(self, run_id: str) -> CancelOutcome:
        m = self.runs.get(run_id)
        if m is None:
            return CancelOutcome.UNKNOWN
        if m.state == "done":
            return CancelOutcome.ALREADY_FINISHED
        if m.state == "running":
            m.cancel = True
            return CancelOutcome.CANCEL_REQUESTED
        was = m.state
        self._end(m, RunStatus.CANCELLED)
        return CancelOutcome.REMOVED_FROM_DLQ if was == "dlq" else CancelOutcome.CANCELLED

    def redrive(self, run_id: str, now: int) -> bool:
        m = self.runs.get(run_id)
        if m is None or m.state != "dlq":
            return False
        m.state, m.attempts, m.score, m.cancel = "queued", 0, now, False
        return True

    def reclaim(self, now: int) -> int:
        requeued = 0
        for m in self.runs.values():
            if m.state == "running" and m.lease <= now:
                if m.cancel:
                    self._end(m, RunStatus.CANCELLED)
                    self.wins += 1
                else:
                    m.state = "queued"  # at its old score
                    requeued += 1
        return requeued

    def expire(self, now: int) -> int:
        due = [m for m in self.runs.values() if m.state == "queued" and m.ttl and m.ttl <= now]
        for m in due:
            self._end(m, RunStatus.EXPIRED)
        return len(due)


STATE_STATUS: Final = {
    "queued": RunStatus.QUEUED, "running": RunStatus.RUNNING, "dlq": RunStatus.DEAD_LETTERED,
}  # fmt: skip


async def check_runs(rq: RunQueue, env: Environment, model: Model, run_ids: set[str]) -> None:
    for run_id in sorted(run_ids):
        m = model.runs[run_id]
        info = await rq.get_run(env, run_id)
        assert info is not None, run_id
        want = m.final if m.state == "done" else STATE_STATUS[m.state]
        got = (info.status, info.attempts, info.cancel_requested)
        assert got == (want, m.attempts, m.cancel), (run_id, m)


async def check_keys(rq: RunQueue, env: Environment, model: Model) -> None:
    """The queue, its slots, the leases, the dead letters and the TTL index."""
    queue, shard = rq.keys.queue(env, "q"), rq.keys.shard(rq.keys.shard_of(env))
    queued = await rq.client.zrange(queue.queued, 0, -1, withscores=True)
    assert {s(r): int(sc) for r, sc in queued} == model.queued()
    runs = model.runs.items()
    assert await running(rq, env) == {r for r, m in runs if m.state == "running"}
    prefix = env.id + ":"
    leases = await rq.client.zrange(shard.leases, 0, -1, withscores=True)
    assert {s(m)[len(prefix) :]: int(sc) for m, sc in leases} == {
        r: m.lease for r, m in runs if m.state == "running"
    }
    dlq = {s(r) for r in await rq.client.zrange(rq.keys.env(env).dlq, 0, -1)}
    assert dlq == {r for r, m in runs if m.state == "dlq"}
    ttl = {s(m)[len(prefix) :] for m in await rq.client.zrange(shard.ttl, 0, -1)}
    assert ttl == {r for r, m in runs if m.state == "queued" and m.ttl}


def _finish(d: Delivery, status: RunStatus) -> Finish:
    return Finish(d, status.value, KeptOutcome())


@pytest.mark.single_server
async def test_cancel_interleaved_with_every_other_operation_matches_the_model(
    make_queue: Any, env: Environment
) -> None:
    """6,000 random operations (a third of them cancels, acks, nacks, reclaims and
    redrives of runs in every state, with stale deliveries among them), each checked
    against the model: the reply, every run it touched, and the queue, slots, leases,
    dead letters and TTL index."""
    rq: RunQueue = await make_queue(lease_ms=LEASE_MS, default_env_concurrency=1000)
    rng = random.Random(24)
    model = Model()
    now = T0
    issued: list[Delivery] = []
    made = 0
    seen: dict[str, int] = {}
    for step in range(6000):
        before = {r: replace(m) for r, m in model.runs.items()}
        live = [r for r, m in model.runs.items() if m.state != "done"]
        op = rng.choices(
            ["enqueue", "dequeue", "ack", "nack", "heartbeat", "cancel", "redrive", "reclaim",
             "expire", "tick"],
            [3 if len(live) < 12 else 0, 5, 2, 3, 1, 4, 1, 1, 1, 4],
        )[0]  # fmt: skip
        target: str | None = None
        if op == "enqueue":
            target = f"r{made:05d}"
            made += 1
            ttl = rng.choice([0, 0, rng.randint(200, 3000)])
            await rq.enqueue(env, "q", target, ttl_ms=ttl or None, now_ms=now)
            model.enqueue(target, now, ttl)
        elif op == "dequeue":
            got = await rq.dequeue(1, env=env, queues=["q"], lease_ms=LEASE_MS, now_ms=now)
            want = model.dequeue(now)
            assert [d.run_id for d in got] == ([want] if want else []), step
            issued += got
        elif op in ("ack", "nack", "heartbeat") and issued:
            d = rng.choice(issued[-20:])
            target = d.run_id
            if op == "ack":
                status = rng.choice([RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT])
                m = model.runs[target]
                attempts = m.attempts if status is RunStatus.COMPLETED else m.attempts + 1
                want_ack = model.ack(d, status)
                if want_ack is AckStatus.ACKED:
                    m.attempts = attempts
                assert await rq.finish([_finish(d, status)], now_ms=now) == [want_ack]
            elif op == "nack":
                delay, increment = rng.choice([0, 0, 300, 2000]), rng.random() < 0.8
                got_nack = await rq.nack(d, retry_delay_ms=delay, increment_attempt=increment,
                                         max_attempts=MAX_ATTEMPTS, now_ms=now)  # fmt: skip
                assert got_nack is model.nack(d, now, delay, increment), (step, d)
            else:
                assert await rq.heartbeat([d], lease_ms=LEASE_MS, now_ms=now) == [
                    model.heartbeat(d, now)
                ], step
        elif op in ("cancel", "redrive") and model.runs:
            target = rng.choice(live or list(model.runs)) if rng.random() < 0.9 else (
                rng.choice(list(model.runs)))  # fmt: skip
            if op == "cancel":
                assert await rq.cancel(env, target, now_ms=now) is model.cancel(target), step
            else:
                expected = model.redrive(target, now)
                try:
                    await rq.redrive(env, target, now_ms=now)
                    assert expected, step
                except RunNotFoundError:
                    assert not expected, step
        elif op == "reclaim":
            assert await rq.reclaim_lapsed_leases(now_ms=now) == model.reclaim(now), step
        elif op == "expire":
            assert await rq.expire_ttl(now_ms=now) == model.expire(now), step
        else:
            now += rng.randint(0, 600)
        seen[op] = seen.get(op, 0) + 1
        touched = {r for r, m in model.runs.items() if before.get(r) != m}
        if target is not None and target in model.runs:
            touched.add(target)
        await check_runs(rq, env, model, touched)
        await check_keys(rq, env, model)
        if step % 500 == 0:
            await check_runs(rq, env, model, set(model.runs))
    await check_runs(rq, env, model, set(model.runs))
    # the interleavings happened: cancels that won over a retry or a lapsed lease
    print(f"\n{model.wins} cancels won; operations {seen}")
    assert model.wins >= 30, (model.wins, seen)
    assert seen["cancel"] >= 800 and seen["reclaim"] >= 150, seen

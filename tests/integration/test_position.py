"""Where a run stands (RunQueue.run_position), checked against what then happened: the
runs its position said were ahead of it in its flow are exactly the runs of its flow that
started before it; the gates it reports are the ones that hold it (a dequeue then starts
nothing of it, and does once the gate is lifted); the estimated start, on a queue drained
at a steady rate, is within a stated tolerance of the real one.

Logical clock: every call passes ``now_ms``.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.integration.limits_support import T0, Order, both_orders, enqueue_runs, queue_for

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import Delivery, EnqueueRequest
from fairq.outcomes import RunStatus
from fairq.store import RunPosition, RunQueue

Q = "pos"
#: A history bucket's start: the drains begin on one, so the window's span is exact.
START = 10_000_000

#: (key, tenant, runs) of the mixed backlog: keys, a tenant with two keys, keyless runs.
FLOWS: list[tuple[str | None, str | None, int]] = [
    ("a", None, 5), ("b", None, 3), (None, None, 4), ("u1", "T", 3), ("u2", "T", 2),
    (None, "T", 2),
]  # fmt: skip


async def _mixed_backlog(rq: RunQueue, env: Environment) -> dict[str, tuple[str | None, ...]]:
    """The FLOWS backlog, interleaved in time; run id -> its flow (key, tenant)."""
    flows: dict[str, tuple[str | None, ...]] = {}
    for i, (key, tenant, n) in enumerate(FLOWS):
        for run in await enqueue_runs(rq, env, Q, f"f{i}-", n, key=key, tenant=tenant,
                                      at=T0 + i * 3):  # fmt: skip
            flows[run] = (key, tenant)
    return flows


async def _drain(
    rq: RunQueue, env: Environment, start: int, step: int = 100
) -> list[tuple[int, str]]:
    """(start time, run id) of every run, one dequeue of one run per ``step`` ms, acked."""
    out: list[tuple[int, str]] = []
    t = start
    for _ in range(1000):
        got = await rq.dequeue(1, env=env, queues=[Q], now_ms=t)
        if not got:
            break
        out += [(t, d.run_id) for d in got]
        await rq.ack(got, now_ms=t)
        t += step
    return out


@both_orders
async def test_runs_ahead_in_flow_are_those_that_started_first(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Every queued run's ahead_in_flow is the number of runs of its own flow started
    before it when the queue is then drained; the first run served was the next of a
    flow whose rank was 1."""
    rq = await queue_for(make_queue, order)
    flows = await _mixed_backlog(rq, env)
    now = T0 + 100
    positions = {run: await rq.run_position(env, run, now_ms=now) for run in flows}
    for run, p in positions.items():
        assert p is not None and p.status is RunStatus.QUEUED and p.gates == ()
        assert p.order == order and p.queue == Q
        assert (p.concurrency_key, p.tenant) == flows[run]
        assert p.ranked_among == (6 if order == "age" else 4)  # 4 tenants: a, b, /Q, T
    started = await _drain(rq, env, now)
    assert sorted(r for _, r in started) == sorted(flows)
    seen: dict[tuple[str | None, ...], int] = {}
    for _, run in started:
        flow = flows[run]
        assert positions[run].ahead_in_flow == seen.get(flow, 0), run  # type: ignore[union-attr]
        seen[flow] = seen.get(flow, 0) + 1
    first = positions[started[0][1]]
    assert first is not None and first.rank == 1 and first.ahead_in_flow == 0
    ranks = sorted(p.rank for p in positions.values() if p and p.ahead_in_flow == 0)
    assert ranks[0] == 1 and ranks[-1] == first.ranked_among


async def test_started_and_unknown_runs_report_their_state(
    make_queue: Any, env: Environment
) -> None:
    rq = await queue_for(make_queue, "fair")
    runs = await enqueue_runs(rq, env, Q, "r", 2, key="k")
    (got,) = await rq.dequeue(1, env=env, queues=[Q], now_ms=T0 + 10)
    running = await rq.run_position(env, got.run_id, now_ms=T0 + 10)
    assert running is not None and running.status is RunStatus.RUNNING
    assert running.ahead_in_flow is None and running.estimate is None
    await rq.ack([got], now_ms=T0 + 11)
    assert await rq.run_position(env, got.run_id, now_ms=T0 + 12) is None  # no kept outcome
    waiting = await rq.run_position(env, runs[1], now_ms=T0 + 12)
    assert waiting is not None and waiting.ahead_in_flow == 0 and waiting.flow_queued == 1
    assert await rq.run_position(env, "never", now_ms=T0 + 12) is None


def _gates(p: RunPosition | None) -> list[str]:
    assert p is not None
    return [g.name for g in p.gates]


async def _one_started(rq: RunQueue, env: Environment, now: int, **flow: Any) -> list[Delivery]:
    await rq.enqueue(env, Q, "holder", None, now_ms=now - 2, available_at_ms=now - 2, **flow)
    got = await rq.dequeue(1, env=env, queues=[Q], now_ms=now - 1)
    assert [d.run_id for d in got] == ["holder"]
    return got


#: scope -> (how to set the gate, the waiting run's key and tenant, the gate expected)
GATE_CASES: dict[str, tuple[str, dict[str, str | None], str]] = {
    "key_cap": ("key_cap", {"concurrency_key": "k"}, "key_cap"),
    "tenant_cap": ("tenant_cap", {"concurrency_key": "k2", "tenant": "T"}, "tenant_cap"),
    "queue_total": ("total", {"concurrency_key": "k2"}, "queue_total"),
    "env_limit": ("env", {}, "env_limit"),
    "key_rate": ("key_rate", {"concurrency_key": "k"}, "key_rate"),
    "tenant_rate": ("tenant_rate", {"concurrency_key": "k2", "tenant": "T"}, "tenant_rate"),
    "queue_rate": ("queue_rate", {}, "queue_rate"),
}


async def _set_gate(rq: RunQueue, env: Environment, how: str) -> None:
    if how == "key_cap":
        await rq.set_key_concurrency(env, Q, "k", 1)
    elif how == "tenant_cap":
        await rq.set_tenant_concurrency(env, Q, "T", 1)
    elif how == "total":
        await rq.set_queue_total_concurrency(env, Q, 1)
    elif how == "env":
        await rq.set_env_limits(env, concurrency=1)
    elif how == "key_rate":
        await rq.set_rate_limit(env, Q, 1.0, key="k")
    elif how == "tenant_rate":
        await rq.set_rate_limit(env, Q, 1.0, tenant="T")
    else:
        await rq.set_rate_limit(env, Q, 1.0)


def _holder_flow(case: str) -> dict[str, str | None]:
    if case in ("key_cap", "key_rate"):
        return {"concurrency_key": "k"}
    if case in ("tenant_cap", "tenant_rate"):
        return {"concurrency_key": "k1", "tenant": "T"}
    return {"concurrency_key": "other"}


@both_orders
@pytest.mark.parametrize("case", list(GATE_CASES))
async def test_the_gate_reported_is_the_one_that_holds(
    make_queue: Any, env: Environment, order: Order, case: str
) -> None:
    """One run started, then the gate holds the next: the position names exactly that
    gate (a rate's with the time of its next token), a dequeue starts nothing, and with
    the holder finished (caps) or a second later (rates) it starts and no gate is left."""
    rq = await queue_for(make_queue, order)
    how, flow, expected = GATE_CASES[case]
    await _set_gate(rq, env, how)
    now = T0 + 1_000
    holder = await _one_started(rq, env, now, **_holder_flow(case))
    await rq.enqueue(env, Q, "waiting", None, now_ms=now, available_at_ms=now, **flow)
    p = await rq.run_position(env, "waiting", now_ms=now)
    assert _gates(p) == [expected]
    assert p is not None and p.rank == 1 and p.ahead_in_flow == 0
    gate = p.gates[0]
    if expected.endswith("_rate"):
        assert gate.limit == 1.0 and gate.until_ms == now - 1 + 1000
    else:
        assert gate.limit == 1 and gate.used == 1 and gate.until_ms is None
    assert await rq.dequeue(5, env=env, queues=[Q], now_ms=now) == []
    later = now + 1_000
    if not expected.endswith("_rate"):
        await rq.ack(holder, now_ms=now)
        later = now + 1
    assert _gates(await rq.run_position(env, "waiting", now_ms=later)) == []
    got = await rq.dequeue(5, env=env, queues=[Q], now_ms=later)
    assert [d.run_id for d in got] == ["waiting"]


async def test_pause_and_delay_are_reported(make_queue: Any, env: Environment) -> None:
    rq = await queue_for(make_queue, "fair")
    now = T0 + 1_000
    await rq.enqueue(env, Q, "later", None, concurrency_key="k", available_at_ms=now + 500,
                     now_ms=now)  # fmt: skip
    p = await rq.run_position(env, "later", now_ms=now)
    assert _gates(p) == ["delayed"] and p is not None and p.gates[0].until_ms == now + 500
    await rq.pause_queue(env, Q)
    p = await rq.run_position(env, "later", now_ms=now + 600)
    assert _gates(p) == ["paused"] and p is not None and p.estimate is None
    assert await rq.dequeue(5, env=env, queues=[Q], now_ms=now + 600) == []
    await rq.resume_queue(env, Q)
    assert _gates(await rq.run_position(env, "later", now_ms=now + 600)) == []


#: The estimate's stated tolerance: 15 % of the wait it predicts, plus two steps.
TOLERANCE = 0.15


@both_orders
async def test_estimated_start_is_near_the_real_one(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Backlogs of 6, 20 and 30 runs on three tenants (one with two keys), drained at 10
    runs/s: after 3 s, each queued run's estimated start is within 15 % (+ 200 ms) of the
    time it really started."""
    rq = await queue_for(make_queue, order)
    requests = []
    for tenant, keys, n in (("A", ["a"], 6), ("B", ["b1", "b2"], 20), ("C", ["c"], 30)):
        for i in range(n):
            requests.append(
                EnqueueRequest(env, Q, f"{tenant}{i}", None, concurrency_key=keys[i % len(keys)],
                               tenant=tenant, available_at_ms=START - 1000 + len(requests))
            )  # fmt: skip
    await rq.enqueue_many(requests, now_ms=START - 1)
    warm = await _drain_for(rq, env, START, 30)
    now = START + 30 * 100
    positions = {
        r.run_id: await rq.run_position(env, r.run_id, now_ms=now)
        for r in requests
        if r.run_id not in warm
    }
    actual = {run: t for t, run in await _drain(rq, env, now)}
    assert len(actual) == len(positions) == 26
    for run, p in positions.items():
        assert p is not None and p.estimate is not None
        assert p.estimate.throughput_per_s == pytest.approx(10.0)
        wait = actual[run] - now
        assert abs(p.estimate.at_ms - actual[run]) <= TOLERANCE * wait + 200, (run, p, wait)


async def _drain_for(rq: RunQueue, env: Environment, start: int, steps: int) -> set[str]:
    runs: set[str] = set()
    for i in range(steps):
        got = await rq.dequeue(1, env=env, queues=[Q], now_ms=start + i * 100)
        runs |= {d.run_id for d in got}
        await rq.ack(got, now_ms=start + i * 100)
    return runs


async def test_a_spread_environment_reads_the_run_s_partition(
    make_queue: Any, env: Environment
) -> None:
    """Over 3 partitions: each run's position is read where its tenant lives (ahead in
    flow as enqueued), and the backlog adds the partitions up (a key capped at 1 holds 3
    of its 4 runs); dequeueing until nothing starts takes exactly the servable runs."""
    rq = await queue_for(make_queue, "fair", shard_count=8, max_per_key_per_call=100)
    await rq.set_partitions(env, 3)
    await rq.set_key_concurrency(env, Q, "k0", 1)
    runs = {i: await enqueue_runs(rq, env, Q, f"t{i}-", 4, key=f"k{i}", tenant=f"T{i}")
            for i in range(6)}  # fmt: skip
    homes = {K.tenant_partition(K.encode_tenant(f"T{i}"), f"k{i}", 3) for i in runs}
    assert len(homes) >= 2  # the runs really are spread
    now = T0 + 100
    for i, ids in runs.items():
        for n, run in enumerate(ids):
            p = await rq.run_position(env, run, now_ms=now)
            assert p is not None and (p.tenant, p.ahead_in_flow, p.flow_queued) == (f"T{i}", n, 4)
    b = await rq.queue_backlog(env, Q, now_ms=now)
    assert (b.servable, b.held["key_cap"], b.held_total) == (21, 3, 3)
    started = 0
    for _ in range(10):
        got = await rq.dequeue(100, env=env, queues=[Q], now_ms=now)
        started += len(got)
    assert started == b.servable


async def _run_workers(
    rq: RunQueue,
    env: Environment,
    running: list[tuple[int, Delivery]],
    start: int,
    until: int,
    *,
    slots: int,
    run_ms: int,
) -> dict[str, int]:
    """Workers with ``slots`` slots on a logical clock stepped by 50 ms: runs finish
    ``run_ms`` after they start (acked then), freed slots are filled at once; ``running``
    (finish time, delivery) is kept across calls. Returns each run's start time."""
    started: dict[str, int] = {}
    for t in range(start, until, 50):
        done = [d for end, d in running if end <= t]
        if done:
            await rq.ack(done, now_ms=t)
            running[:] = [(end, d) for end, d in running if end > t]
        if len(running) < slots:
            got = await rq.dequeue(slots - len(running), env=env, queues=[Q], now_ms=t)
            running += [(t + run_ms, d) for d in got]
            started.update((d.run_id, t) for d in got)
    return started


@both_orders
async def test_a_capped_key_s_estimate_follows_its_cap(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """8 worker slots, runs of 1 s; a key capped at 1 beside five uncapped keys: the
    capped key's runs start one a second, not at the queue's 8/s, and each estimate is
    within 100 ms of its real start (without the cap's bound the first is 0.5 s early
    and the later ones more; taking the run in flight for one just started, 0.5 s late)."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_key_concurrency(env, Q, "capped", 1)
    await enqueue_runs(rq, env, Q, "c", 10, key="capped", at=START - 5_000)
    for i in range(5):
        await enqueue_runs(rq, env, Q, f"u{i}-", 40, key=f"u{i}", at=START - 4_000 + i * 100)
    running: list[tuple[int, Delivery]] = []
    warm = await _run_workers(rq, env, running, START, START + 4_500, slots=8, run_ms=1_000)
    now = START + 4_500
    waiting = [f"c{i}" for i in range(10) if f"c{i}" not in warm]
    assert len(waiting) == 5
    positions = {run: await rq.run_position(env, run, now_ms=now) for run in waiting}
    actual = await _run_workers(rq, env, running, now, now + 12_000, slots=8, run_ms=1_000)
    assert [actual[run] - now for run in waiting] == [500 + 1_000 * n for n in range(5)]
    for n, run in enumerate(waiting):
        p = positions[run]
        assert p is not None and p.estimate is not None and p.ahead_in_flow == n
        assert [g.name for g in p.gates] == ["key_cap"]
        assert abs(p.estimate.at_ms - actual[run]) <= 100, (run, p.estimate, actual[run])


#: (key, tenant, level, runs) of a backlog over three priority levels.
LEVEL_FLOWS: list[tuple[str | None, str | None, int | None, int]] = [
    ("a", None, None, 3), ("a", None, 1, 2), ("b", None, 2, 2), (None, None, 1, 2),
    ("b", None, None, 2), ("u", "T", 5, 2),
]  # fmt: skip


@both_orders
async def test_priority_levels_go_first_in_a_position(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Runs on several flows at levels 1, 2, 3 (the default) and 5: a run's ahead_in_flow
    counts its flow's runs at higher levels too, ahead_at_higher_levels the queue's, and a
    one-by-one drain starts exactly those before it; the estimate counts them."""
    rq = await queue_for(make_queue, order)
    flows: dict[str, tuple[str | None, str | None]] = {}
    levels: dict[str, int | None] = {}
    t = T0
    for i, (key, tenant, level, n) in enumerate(LEVEL_FLOWS):
        for j in range(n):
            run = f"l{i}-{j}"
            t += 1
            await rq.enqueue(env, Q, run, None, concurrency_key=key, tenant=tenant,
                             priority=level, available_at_ms=t, now_ms=t)  # fmt: skip
            flows[run], levels[run] = (key, tenant), level
    now = T0 + 100
    positions = {run: await rq.run_position(env, run, now_ms=now) for run in flows}
    started = await _drain(rq, env, now)
    assert sorted(r for _, r in started) == sorted(flows)
    order_of = {run: i for i, (_, run) in enumerate(started)}
    for run, p in positions.items():
        assert p is not None and p.level == (levels[run] or 3)
        before = [r for r in flows if order_of[r] < order_of[run]]
        assert p.ahead_in_flow == sum(flows[r] == flows[run] for r in before), run
        higher = [r for r in flows if (levels[r] or 3) < p.level]
        assert p.ahead_at_higher_levels == len(higher)
        assert set(higher) <= set(before)
    # the first level-3 run waits for the 6 runs of levels 1 and 2
    first3 = positions["l0-0"]
    assert first3 is not None and first3.ahead_in_flow == 2 and first3.ahead_at_higher_levels == 6

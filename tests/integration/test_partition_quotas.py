"""Cluster-wide caps of a spread environment: each partition holds a quota leased from a
ledger, and the quotas never sum above the cap, so runs in flight never exceed it, in
any partition layout, mid-rebalance or after a step of a move is lost.

Step-driven on a logical clock (every dequeue and finish passes ``now_ms``); the
invariants are read from the server after every step: runs in flight over all
partitions, each partition's quota (its own limit) against what it holds, the ledger's
grants against the cap.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from typing import Any

import pytest

from fairq.errors import InvalidLimitError
from fairq.keys import Environment, encode_tenant, tenant_partition
from fairq.models import Delivery, EnqueueRequest
from fairq.store import RunQueue
from fairq.store.quotas import ENV_SCOPE, NO_TOTAL, quota_targets

QUEUE = "jobs"
T0 = 1_000_000
STEP_MS = 1_000


def tenants_in(partitions: int, per_partition: int) -> list[str]:
    """``per_partition`` tenant names in each partition."""
    names: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(n) < per_partition for n in names.values()):
        name = f"tenant{i}"
        p = tenant_partition(encode_tenant(name), "", partitions)
        if len(names[p]) < per_partition:
            names[p].append(name)
        i += 1
    return [n for p in sorted(names) for n in names[p]]


async def spread(make_queue: Any, env: Environment, partitions: int, **limits: int) -> RunQueue:
    rq: RunQueue = await make_queue(shard_count=8, vtime={"enabled": True})
    if "concurrency" in limits:
        await rq.set_env_limits(env, concurrency=limits["concurrency"])
    if "total" in limits:
        await rq.set_queue_total_concurrency(env, QUEUE, limits["total"])
    await rq.set_partitions(env, partitions)
    return rq


async def in_flight(rq: RunQueue, env: Environment, partitions: int) -> list[int]:
    return [int(await rq.client.scard(rq.keys.env(env, p).inflight)) for p in range(partitions)]


async def quotas(rq: RunQueue, env: Environment, partitions: int, scope: str) -> list[int]:
    field = "concurrency" if scope == ENV_SCOPE else f"q:{scope}:total"
    raw = [await rq.client.hget(rq.keys.env(env, p).config, field) for p in range(partitions)]
    return [NO_TOTAL if v is None else int(v) for v in raw]


async def check_invariants(
    rq: RunQueue, env: Environment, partitions: int, scope: str, cap: int
) -> list[int]:
    """Quotas within the cap, grants within the cap, each partition within its quota."""
    held = await in_flight(rq, env, partitions)
    q = await quotas(rq, env, partitions, scope)
    ledger = await rq.ledger(env)
    assert sum(held) <= cap, (held, q)
    assert sum(q) <= cap, q
    assert ledger.granted(scope) <= cap, ledger
    for p in range(partitions):
        assert held[p] <= q[p] <= ledger.grants.get((scope, p), 0), (p, held, q, ledger)
    return held


async def drive(
    rq: RunQueue,
    env: Environment,
    partitions: int,
    scope: str,
    cap: int,
    *,
    steps: int,
    hold: int,
    rng: random.Random,
) -> list[int]:
    """Dequeue every step, finish each run ``hold`` steps later (some nacked back),
    checking the invariants after every step. Returns the runs in flight per step."""
    running: deque[tuple[int, list[Delivery]]] = deque()
    totals = []
    for step in range(steps):
        now = T0 + step * STEP_MS
        while running and running[0][0] <= step:
            _, batch = running.popleft()
            for d in batch:
                if rng.random() < 0.1:
                    await rq.nack(d, retry_delay_ms=0, increment_attempt=False, now_ms=now)
                else:
                    await rq.ack([d], now_ms=now)
        got = await rq.dequeue(rng.randint(1, 6), env=env, queues=[QUEUE], now_ms=now)
        if got:
            running.append((step + hold, got))
        if step % 7 == 0:
            await rq.rebalance(env, now_ms=now)
        totals.append(sum(await check_invariants(rq, env, partitions, scope, cap)))
    return totals


async def backlog(rq: RunQueue, env: Environment, tenants: list[str], runs: int) -> None:
    requests = [
        EnqueueRequest(env, QUEUE, f"{t}-{i}", None, tenant=t, available_at_ms=T0 - 1_000)
        for t in tenants
        for i in range(runs)
    ]
    await rq.enqueue_many(requests, now_ms=T0)


@pytest.mark.parametrize("partitions", [3, 6])
async def test_the_environment_limit_holds_across_partitions(
    make_queue: Any, env: Environment, partitions: int
) -> None:
    rq = await spread(make_queue, env, partitions, concurrency=5)
    await backlog(rq, env, tenants_in(partitions, 2), 40)
    totals = await drive(
        rq, env, partitions, ENV_SCOPE, 5, steps=120, hold=3, rng=random.Random(partitions)
    )
    # the cap was reached, and mostly used (briefly under-used while quota moves)
    assert max(totals) == 5
    assert sum(totals[10:]) / len(totals[10:]) >= 3.5, totals
    assert (await rq.env_stats(env)).concurrency_limit == 5


async def test_a_queue_total_holds_across_partitions(make_queue: Any, env: Environment) -> None:
    rq = await spread(make_queue, env, 3, total=4)
    await backlog(rq, env, tenants_in(3, 2), 40)
    totals = await drive(rq, env, 3, QUEUE, 4, steps=100, hold=2, rng=random.Random(5))
    assert max(totals) == 4
    assert (await rq.queue_stats(env, QUEUE)).total_concurrency_limit == 4


async def test_idle_quota_goes_where_work_waits_in_one_pass(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=6)
    busy, idle = tenants_in(3, 1)[1], tenants_in(3, 1)[2]
    await backlog(rq, env, [idle], 1)
    got = await rq.dequeue(6, env=env, queues=[QUEUE], now_ms=T0)
    await rq.ack(got, now_ms=T0)
    await rq.rebalance(env, now_ms=T0)
    assert await quotas(rq, env, 3, ENV_SCOPE) == [2, 2, 2]  # no work anywhere: even
    await backlog(rq, env, [busy], 20)
    await rq.rebalance(env, now_ms=T0 + 1)
    q = await quotas(rq, env, 3, ENV_SCOPE)
    assert q[tenant_partition(encode_tenant(busy), "", 3)] == 6, q
    got = await rq.dequeue(10, env=env, queues=[QUEUE], now_ms=T0 + 2)
    assert len(got) == 6


async def test_release_gives_back_only_what_a_partition_does_not_use(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=9)
    tenant = tenants_in(3, 1)[0]
    await backlog(rq, env, [tenant], 20)
    got = await rq.dequeue(4, env=env, queues=[QUEUE], now_ms=T0)
    assert {d.partition for d in got} == {0} and len(got) == 4
    reply = await rq._partition_call(env, 0, ["release", ENV_SCOPE, str(NO_TOTAL)], T0)
    assert int(reply[2]) == 4  # its 4 runs in flight stay covered
    assert await rq.dequeue(4, env=env, queues=[QUEUE], now_ms=T0) == []


async def test_a_lost_step_leaves_quota_unused_until_a_reconciliation(
    make_queue: Any, env: Environment
) -> None:
    """A grant whose partition step never came (the mover died) and a release whose
    ledger step never came: the cap is under-used, never over; reconcile heals both."""
    rq = await spread(make_queue, env, 3, concurrency=6)
    a, b = tenants_in(3, 1)[1:]
    await backlog(rq, env, [a, b], 20)
    await rq.rebalance(env, now_ms=T0)
    before = await quotas(rq, env, 3, ENV_SCOPE)
    assert sum(before) == 6
    # a release without its return: partition of a gives 2 back, the ledger never hears
    pa = tenant_partition(encode_tenant(a), "", 3)
    await rq._partition_call(env, pa, ["release", ENV_SCOPE, "2"], T0)
    assert (await rq.ledger(env)).granted(ENV_SCOPE) == 6
    assert sum(await quotas(rq, env, 3, ENV_SCOPE)) == 4
    await rq.rebalance(env, now_ms=T0 + 1)  # nothing to grant: the ledger thinks all is out
    assert sum(await quotas(rq, env, 3, ENV_SCOPE)) == 4
    assert await rq.reconcile(env, now_ms=T0 + 2)
    ledger = await rq.ledger(env)
    assert ledger.granted(ENV_SCOPE) == 4
    await rq.rebalance(env, now_ms=T0 + 3)
    assert sum(await quotas(rq, env, 3, ENV_SCOPE)) == 6
    await check_invariants(rq, env, 3, ENV_SCOPE, 6)


async def test_a_grant_begun_before_a_reconciliation_is_refused_after_it(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=6)
    await rq.clamp(env, ENV_SCOPE, range(3), T0)  # everything back in the ledger
    reply = await rq._ledger_call(env, ["grant", ENV_SCOPE, "1", "3"], T0)
    granted, epoch = int(reply[1]), int(reply[2])
    assert granted == 3
    assert await rq.reconcile(env, now_ms=T0 + 1)  # partition 1 holds 0: its grant is 0 now
    assert (await rq.ledger(env)).granted(ENV_SCOPE) == 0
    late = await rq._partition_call(env, 1, ["add", ENV_SCOPE, "3", str(epoch)], T0 + 2)
    assert int(late[1]) == 0  # fenced
    await check_invariants(rq, env, 3, ENV_SCOPE, 6)


async def test_changing_the_limit_of_a_spread_environment_changes_its_cap(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=6)
    await backlog(rq, env, tenants_in(3, 1), 10)
    await rq.rebalance(env, now_ms=T0)
    await rq.set_env_limits(env, concurrency=3)
    assert (await rq.ledger(env)).caps[ENV_SCOPE] == 3
    await rq.rebalance(env, now_ms=T0 + 1)
    assert sum(await quotas(rq, env, 3, ENV_SCOPE)) <= 3
    assert len(await rq.dequeue(10, env=env, queues=[QUEUE], now_ms=T0 + 2)) == 3
    await rq.clear_env_limits(env, "concurrency")  # back to the default, cluster-wide
    assert (await rq.ledger(env)).caps[ENV_SCOPE] == rq.config.default_env_concurrency
    await rq.set_queue_total_concurrency(env, QUEUE, 2)
    assert (await rq.ledger(env)).caps[QUEUE] == 2
    await rq.set_queue_total_concurrency(env, QUEUE, None)
    assert QUEUE not in (await rq.ledger(env)).caps
    assert set(await quotas(rq, env, 3, QUEUE)) == {NO_TOTAL}


async def test_back_to_one_partition_gives_it_the_whole_cap(
    make_queue: Any, env: Environment
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=6)
    await rq.set_partitions(env, 1, now_ms=T0)
    await rq.set_partitions(env, 1, now_ms=T0 + 60_000)
    assert await quotas(rq, env, 3, ENV_SCOPE) == [6, 0, 0]
    assert (await rq.ledger(env)).caps == {}
    assert (await rq.env_stats(env)).concurrency_limit == 6


@pytest.mark.parametrize(
    "args",
    [["steal", "*"], ["grant", "*", "999", "1"], ["grant", "a:b", "0", "1"],
     ["return", "*", "0", "1", "x"], ["cap", "*", "-1"], ["begin", "0"], ["end", "1", "*", "0"]],
)  # fmt: skip
async def test_a_bad_ledger_call_is_refused_and_changes_nothing(
    make_queue: Any, env: Environment, args: list[str]
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=6)
    before = await rq.client.hgetall(rq.keys.env(env).quota)
    with pytest.raises(InvalidLimitError):
        await rq._ledger_call(env, args, T0)
    assert await rq.client.hgetall(rq.keys.env(env).quota) == before


@pytest.mark.parametrize(
    "args",
    [["take", "*"], ["add", "*", "-1", "0"], ["release", "a:b", "1"], ["fence", "x", "*"]],
)
async def test_a_bad_partition_quota_call_is_refused_and_changes_nothing(
    make_queue: Any, env: Environment, args: list[str]
) -> None:
    rq = await spread(make_queue, env, 3, concurrency=6)
    config = rq.keys.env(env, 1).config
    before = await rq.client.hgetall(config)
    with pytest.raises(InvalidLimitError):
        await rq._partition_call(env, 1, args, T0)
    assert await rq.client.hgetall(config) == before


def test_quota_targets_keep_what_is_used_and_share_the_rest_by_demand() -> None:
    assert quota_targets(10, [2, 0, 1], [1, 1, 0])[0] == [6, 3, 1]
    assert quota_targets(10, [2, 0, 1], [0, 0, 0])[0] == [5, 2, 3]  # no demand: evenly
    assert quota_targets(4, [3, 3, 0], [1, 1, 1])[0] == [3, 3, 0]  # over the cap: nothing more
    assert sum(quota_targets(7, [0, 0, 0], [1, 1, 1])[0]) == 7


def test_a_cap_smaller_than_the_partitions_with_work_rotates_by_credit() -> None:
    """One slot, three partitions owed a third each: over three passes each gets it once
    (without the credit the lowest partition would get it every time)."""
    credit = None
    winners = []
    for _ in range(6):
        targets, credit = quota_targets(1, [0, 0, 0], [1.0, 1.0, 1.0], credit)
        winners.append(targets.index(1))
    assert sorted(winners) == [0, 0, 1, 1, 2, 2]


async def test_grants_made_at_once_never_sum_above_the_cap(
    make_queue: Any, env: Environment
) -> None:
    """Movers in several processes may ask at once: the ledger grants the cap at most."""
    rq = await spread(make_queue, env, 3, concurrency=6)
    await rq.clamp(env, ENV_SCOPE, range(3), T0)  # everything back in the ledger
    replies = await asyncio.gather(
        *(rq._ledger_call(env, ["grant", ENV_SCOPE, str(i % 3), "2"], T0) for i in range(12))
    )
    assert sum(int(r[1]) for r in replies) == 6
    assert (await rq.ledger(env)).granted(ENV_SCOPE) == 6


async def test_a_queue_rate_limit_is_shared_equally_and_shown_whole(
    make_queue: Any, env: Environment
) -> None:
    """A spread environment's queue rate is cluster-wide: each partition holds an equal
    share of the rate and of the burst, so together they never start more than the rate
    (a burst smaller than the partitions is at least 1 run each)."""
    rq: RunQueue = await make_queue(shard_count=8, vtime={"enabled": True})
    await rq.set_rate_limit(env, QUEUE, 6.0, burst=6)
    await rq.set_partitions(env, 3)
    for p in range(3):
        config = rq.keys.env(env, p).config
        assert float(await rq.client.hget(config, f"q:{QUEUE}:rate")) == 2.0
        assert await rq.client.hget(config, f"q:{QUEUE}:rate_burst") == b"2"
    stats = await rq.queue_stats(env, QUEUE)
    assert (stats.rate, stats.rate_burst) == (6.0, 6)
    await backlog(rq, env, tenants_in(3, 1), 30)
    started = 0
    for step in range(10):  # 10 s of logical time at 6 runs/s, burst 6: at most 66
        got = await rq.dequeue(50, env=env, queues=[QUEUE], now_ms=T0 + step * STEP_MS)
        started += len(got)
        await rq.ack(got, now_ms=T0 + step * STEP_MS)
    assert started <= 6 * 9 + 6, started
    await rq.set_rate_limit(env, QUEUE, 3.0)  # the burst in force stays
    assert float(await rq.client.hget(rq.keys.env(env, 2).config, f"q:{QUEUE}:rate")) == 1.0
    await rq.set_rate_limit(env, QUEUE, None)
    for p in range(3):
        assert await rq.client.hget(rq.keys.env(env, p).config, f"q:{QUEUE}:rate") is None
    assert (await rq.queue_stats(env, QUEUE)).rate is None
    # back to one partition (an empty environment): partition 0 holds the whole rate
    other = Environment(env.org, env.project, "other")
    await rq.set_rate_limit(other, QUEUE, 3.0, burst=1)
    await rq.set_partitions(other, 3)
    await rq.set_partitions(other, 1, now_ms=T0)
    await rq.set_partitions(other, 1, now_ms=T0 + 60_000)
    config = rq.keys.env(other, 0).config
    assert float(await rq.client.hget(config, f"q:{QUEUE}:rate")) == 3.0

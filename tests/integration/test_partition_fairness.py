"""Tenant shares across the partitions of a spread environment hold the single-partition
result: 1-key against 9-key tenants and weights 1 : 2 : 4, with S = 3 and S = 6, within
5 % of the shares the same workload gets with S = 1 (and so of the fair shares).

Step-driven on a logical clock: every tenant has a backlog older than the first step;
each step is one ``dequeue(b, env=...)`` (the store's partition ranking, one dequeue call
per partition until the batch is full) and the runs are acked at once, so only the order
decides who is served. The tenants are chosen so that they live in different partitions
(the case a per-partition order alone gets wrong). Each share test also checks that
serving the partitions round-robin instead (what a consumer that ignores the tags would
do) misses the bound, so the check is one the ranking must earn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from fairq.keys import Environment, encode_tenant, tenant_partition
from fairq.models import EnqueueRequest
from fairq.store import RunQueue

QUEUE = "jobs"
T0 = 1_000_000
STEP_MS = 1_000
#: Runs every tenant has queued (more than any measurement serves).
BACKLOG = 2_000


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0
    keys: int = 1


def tenants_apart(count: int, partitions: int) -> list[str]:
    """``count`` tenant names that live in ``count`` different partitions of ``partitions``
    (the first names ``tenant0``, ``tenant1``, … that do)."""
    names: dict[int, str] = {}
    i = 0
    while len(names) < count:
        name = f"tenant{i}"
        names.setdefault(tenant_partition(encode_tenant(name), "", partitions), name)
        i += 1
    return list(names.values())


async def backlogged(rq: RunQueue, env: Environment, tenants: Sequence[Tenant]) -> None:
    await rq.set_env_limits(env, concurrency=10_000)
    for t in tenants:
        if t.weight != 1:
            await rq.set_tenant_weight(env, t.name, t.weight)
    requests = [
        EnqueueRequest(
            env, QUEUE, f"{t.name}-{i}", None, tenant=t.name,
            concurrency_key=f"{t.name}-k{i % t.keys}", available_at_ms=T0 - 10_000 + i,
        )
        for t in tenants
        for i in range(BACKLOG)
    ]  # fmt: skip
    await rq.enqueue_many(requests, now_ms=T0)


async def served_shares(
    rq: RunQueue, env: Environment, tenants: Sequence[Tenant], *, batch: int, runs: int
) -> tuple[dict[str, float], float]:
    """Each tenant's share of the first ``runs`` serves, and the largest lag of a tenant
    behind its fair count at any step (runs)."""
    counts: Counter[str] = Counter()
    weights = {t.name: t.weight for t in tenants}
    total_weight = sum(weights.values())
    lag = 0.0
    step = 0
    while sum(counts.values()) < runs:
        now = T0 + step * STEP_MS
        got = await rq.dequeue(batch, env=env, queues=[QUEUE], now_ms=now)
        assert got, "every tenant is backlogged"
        for d in got:
            assert d.tenant is not None
            counts[d.tenant] += 1
        await rq.ack(got, now_ms=now)
        n = sum(counts.values())
        lag = max(lag, *(n * w / total_weight - counts[t] for t, w in weights.items()))
        step += 1
    n = sum(counts.values())
    return {t.name: counts[t.name] / n for t in tenants}, lag


async def shares_with(
    make_queue: Any, base: Environment, tenants: Sequence[Tenant], partitions: int, batch: int
) -> tuple[dict[str, float], float]:
    """The shares (and the largest lag) the workload gets with ``partitions``, in an
    environment of its own."""
    env = Environment(base.org, base.project, f"{base.name}-s{partitions}-b{batch}")
    rq: RunQueue = await make_queue(shard_count=8, vtime={"enabled": True})
    if partitions > 1:
        await rq.set_partitions(env, partitions)
    await backlogged(rq, env, tenants)
    return await served_shares(rq, env, tenants, batch=batch, runs=1_400)


def assert_within(measured: dict[str, float], reference: dict[str, float], bound: float) -> None:
    for tenant, share in reference.items():
        assert abs(measured[tenant] / share - 1) <= bound, (tenant, measured, reference)


@pytest.mark.parametrize("partitions", [3, 6])
async def test_weights_1_2_4_hold_across_partitions(
    make_queue: Any, env: Environment, partitions: int
) -> None:
    names = tenants_apart(3, partitions)
    tenants = [Tenant(n, w) for n, w in zip(names, (1, 2, 4), strict=True)]
    single, _ = await shares_with(make_queue, env, tenants, 1, 10)
    spread, lag = await shares_with(make_queue, env, tenants, partitions, 10)
    assert_within(single, {t.name: t.weight / 7 for t in tenants}, 0.05)
    assert_within(spread, single, 0.05)
    assert lag <= 10 * 4 + 2  # the bound of docs/cluster.md: b x w_max / w_min + 2


@pytest.mark.parametrize("partitions", [3, 6])
async def test_a_9_key_tenant_gets_what_a_1_key_tenant_gets_across_partitions(
    make_queue: Any, env: Environment, partitions: int
) -> None:
    names = tenants_apart(2, partitions)
    tenants = [Tenant(names[0], keys=1), Tenant(names[1], keys=9)]
    single, _ = await shares_with(make_queue, env, tenants, 1, 10)
    spread, _ = await shares_with(make_queue, env, tenants, partitions, 10)
    assert_within(single, {t.name: 0.5 for t in tenants}, 0.05)
    assert_within(spread, single, 0.05)


async def test_round_robin_over_partitions_misses_the_bound(
    make_queue: Any, env: Environment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranking earns the bound: serving the partitions in turn (each batch from the
    next one, whatever its tags) gives the weight-1 tenant a third of the serves."""
    names = tenants_apart(3, 3)
    tenants = [Tenant(n, w) for n, w in zip(names, (1, 2, 4), strict=True)]
    turn = iter(range(1_000_000))

    def in_turn(view: Any, hint: float | None = None) -> list[int]:
        ready = [s.partition for s in view.states if s.oldest_ready is not None]
        first = next(turn) % len(ready)
        return ready[first:] + ready[:first]

    monkeypatch.setattr("fairq.store.spread.rank_partitions", in_turn)
    spread, _ = await shares_with(make_queue, env, tenants, 3, 10)
    with pytest.raises(AssertionError):
        assert_within(spread, {t.name: t.weight / 7 for t in tenants}, 0.05)


async def test_a_tenant_joining_a_lagging_partition_gets_no_credit(
    make_queue: Any, env: Environment
) -> None:
    """Two tenants share the service for a while in two partitions; a third joins in a
    partition nobody used yet (its floor at 0). It gets its share from then on, not the
    backlog of service a floor of 0 would give it."""
    a, b, late = tenants_apart(3, 3)
    rq: RunQueue = await make_queue(shard_count=8, vtime={"enabled": True})
    await rq.set_partitions(env, 3)
    await backlogged(rq, env, [Tenant(a), Tenant(b)])
    await served_shares(rq, env, [Tenant(a), Tenant(b)], batch=10, runs=600)
    requests = [
        EnqueueRequest(env, QUEUE, f"{late}-{i}", None, tenant=late, available_at_ms=T0)
        for i in range(BACKLOG)
    ]
    await rq.enqueue_many(requests, now_ms=T0 + 100 * STEP_MS)
    counts: Counter[str] = Counter()
    for step in range(30):
        got = await rq.dequeue(10, env=env, queues=[QUEUE], now_ms=T0 + (100 + step) * STEP_MS)
        counts.update(d.tenant for d in got)
        await rq.ack(got, now_ms=T0 + (100 + step) * STEP_MS)
    # 300 serves over three tenants: the newcomer gets about a third, not all
    assert 80 <= counts[late] <= 125, counts

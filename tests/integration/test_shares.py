"""Shares received vs entitled (RunQueue.tenant_shares, sample_shares.lua and the finish
scripts' shares record), against a Python computation from the served history.

Each workload is step-driven on a logical clock: a step (STEP_MS) acks the runs whose
hold ended, enqueues that step's arrivals, takes one backlog sample and makes one dequeue
call for the free slots. The test keeps its own history (who was backlogged at each
sample, each run's tenant, lease start and hold) and computes what the reader must say:
per 10-second bucket, entitled(t) = received(bucket) x mean over the bucket's samples of
w_t / sum of the backlogged tenants' weights (0 while t is not backlogged).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.integration.limits_support import T0, Order, enqueue_runs, queue_for

from fairq.errors import FairqError, InvalidLimitError
from fairq.keys import Environment
from fairq.models import Delivery, TenantShare, TenantShares
from fairq.store import RunQueue
from fairq.store.share_record import SHARES_BUCKET_MS, SHARES_TTL_S

Q = "owed"
STEP_MS = 1_000
#: A clock origin on a bucket boundary, far from 0 and from the server's clock.
START = (T0 // SHARES_BUCKET_MS + 10) * SHARES_BUCKET_MS


@dataclass
class History:
    """What the drive served: the test's own record."""

    #: per sample: (now, {tenant: weight} of the tenants backlogged then)
    samples: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    #: per run: (tenant, lease start, run time ms)
    runs: list[tuple[str, int, int]] = field(default_factory=list)
    runs_of: Counter[str] = field(default_factory=Counter)


def expected(
    h: History, now: int, window_s: int, *, duration: bool
) -> dict[str, tuple[float, float]]:
    """tenant -> (received, entitled) over the window ending at ``now`` (every bucket of
    the window is sampled in these workloads, so no sample is held over)."""
    last = now // SHARES_BUCKET_MS
    first = last - window_s * 1000 // SHARES_BUCKET_MS + 1
    received: dict[int, Counter[str]] = defaultdict(Counter)
    for tenant, start, ms in h.runs:
        received[start // SHARES_BUCKET_MS][tenant] += ms / 1000 if duration else 1
    shares: dict[int, list[dict[str, float]]] = defaultdict(list)
    for at, weights in h.samples:
        total = sum(weights.values())
        shares[at // SHARES_BUCKET_MS].append({t: w / total for t, w in weights.items()})
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for b in range(first, last + 1):
        total = sum(received[b].values())
        for tenant, n in received[b].items():
            out[tenant][0] += n
        for sample in shares[b]:
            for tenant, s in sample.items():
                out[tenant][1] += total * s / len(shares[b])
    return {t: (r, e) for t, (r, e) in out.items()}


def by_tenant(shares: TenantShares) -> dict[str | None, TenantShare]:
    return {t.tenant: t for t in shares.tenants}


def assert_matches(got: TenantShares, want: dict[str, tuple[float, float]]) -> None:
    rows = by_tenant(got)
    assert set(rows) == set(want)
    for tenant, (received, entitled) in want.items():
        assert rows[tenant].received == pytest.approx(received, rel=1e-9, abs=1e-9), tenant
        assert rows[tenant].entitled == pytest.approx(entitled, rel=1e-9, abs=1e-9), tenant
    assert got.received == pytest.approx(sum(r for r, _ in want.values()), rel=1e-9)
    assert got.unsampled == 0


async def drive(
    rq: RunQueue,
    env: Environment,
    steps: int,
    *,
    weights: dict[str, float],
    arrivals: Callable[[int], dict[str, int]],
    hold: Callable[[Delivery], int],
    slots: int,
) -> History:
    """The step loop (module docstring); ``arrivals(step)``: tenant -> runs to enqueue."""
    h = History()
    pending: Counter[str] = Counter()
    running: list[tuple[int, int, Delivery]] = []
    for step in range(steps):
        now = START + step * STEP_MS
        done = [d for end, _, d in running if end <= step]
        for end, start, d in running:
            if end <= step:
                tenant = str(d.tenant)
                h.runs.append((tenant, start, now - start))
                h.runs_of[tenant] += 1
        running = [r for r in running if r[0] > step]
        if done:
            await rq.ack(done, now_ms=now)
        for tenant, n in arrivals(step).items():
            if n:
                await enqueue_runs(rq, env, Q, f"{tenant}.{step}-", n, tenant=tenant, at=now - n)
                pending[tenant] += n
        await rq.sample_shares(now_ms=now)
        h.samples.append((now, {t: weights.get(t, 1.0) for t, n in pending.items() if n > 0}))
        got = await rq.dequeue(slots - len(running), env=env, queues=[Q], now_ms=now)
        for d in got:
            pending[str(d.tenant)] -= 1
            running.append((step + hold(d), now, d))
    return h


async def weighted_queue(make_queue: Any, env: Environment, order: Order, slots: int,
                         weights: dict[str, float], **options: Any) -> RunQueue:  # fmt: skip
    rq = await queue_for(make_queue, order)
    await rq.set_env_limits(env, concurrency=slots)
    if options:
        await rq.set_queue_options(env, Q, **options)
    for tenant, w in weights.items():
        await rq.set_tenant_weight(env, tenant, w)
    return rq


async def test_weights_1_2_4_all_backlogged(make_queue: Any, env: Environment) -> None:
    weights = {"a": 1.0, "b": 2.0, "c": 4.0}
    rq = await weighted_queue(make_queue, env, "fair", 7, weights)
    # every tenant keeps a backlog: 10 new runs a step each, 7 served a step in all
    h = await drive(rq, env, 60, weights=weights, arrivals=lambda s: dict.fromkeys(weights, 10),
                    hold=lambda d: 1, slots=7)  # fmt: skip
    now = START + 60 * STEP_MS
    got = await rq.tenant_shares(env, Q, window=300, now_ms=now)
    assert got.unit == "runs" and got.samples == 60
    assert_matches(got, expected(h, now, 300, duration=False))
    rows = by_tenant(got)
    # entitled splits what was received 1:2:4 (everyone was backlogged at every sample)
    total = sum(r.entitled for r in rows.values())
    assert total == pytest.approx(got.received)
    for tenant, w in weights.items():
        assert rows[tenant].entitled == pytest.approx(got.received * w / 7)
        assert rows[tenant].share == pytest.approx(w / 7)
    # the fair order gave 1:2:4, so every ratio is ~1
    assert rows["c"].received == pytest.approx(2 * rows["b"].received, rel=0.05)
    assert rows["b"].received == pytest.approx(2 * rows["a"].received, rel=0.05)
    for row in rows.values():
        assert row.ratio == pytest.approx(1.0, abs=0.05)


async def test_age_order_is_shown_owing_the_light_tenants(
    make_queue: Any, env: Environment
) -> None:
    """The same weights under the age order: runs go oldest first, not 1:2:4, so the
    ratios show who was short-changed (entitled does not depend on the order)."""
    weights = {"a": 1.0, "b": 2.0, "c": 4.0}
    rq = await weighted_queue(make_queue, env, "age", 7, weights)
    h = await drive(rq, env, 30, weights=weights, arrivals=lambda s: dict.fromkeys(weights, 10),
                    hold=lambda d: 1, slots=7)  # fmt: skip
    now = START + 30 * STEP_MS
    got = await rq.tenant_shares(env, Q, window=60, now_ms=now)
    assert_matches(got, expected(h, now, 60, duration=False))
    rows = by_tenant(got)
    assert rows["c"].entitled == pytest.approx(4 * rows["a"].entitled)
    ratio_a, ratio_c = rows["a"].ratio, rows["c"].ratio
    assert ratio_a is not None and ratio_c is not None
    assert ratio_a > 1.5 and ratio_c < 0.8


async def test_a_tenant_that_idles_is_not_entitled_while_idle(
    make_queue: Any, env: Environment
) -> None:
    rq = await weighted_queue(make_queue, env, "fair", 4, {})

    # a is always backlogged; b brings 56 runs at steps 0 and 60, about 2 served a step,
    # so it has work in steps 0-27 and 60-87 and none in 30-59
    def arrivals(step: int) -> dict[str, int]:
        return {"a": 6, "b": 56 if step in (0, 60) else 0}

    h = await drive(rq, env, 90, weights={}, arrivals=arrivals, hold=lambda d: 1, slots=4)
    idle_end = START + 60 * STEP_MS - 1  # the window of steps 30..59: b idle throughout
    idle = await rq.tenant_shares(env, Q, window=30, now_ms=idle_end)
    rows = by_tenant(idle)
    assert "b" not in rows  # neither served nor backlogged
    assert rows["a"].received == idle.received == 4 * 30
    assert rows["a"].entitled == pytest.approx(idle.received)
    assert rows["a"].share == pytest.approx(1.0)
    assert_matches(idle, expected(h, idle_end, 30, duration=False))
    # b back (steps 60..79, backlogged throughout): entitled to half of what was served,
    # and the fair order gave it half (it rejoined at the floor, banking nothing)
    back_end = START + 80 * STEP_MS - 1
    back = await rq.tenant_shares(env, Q, window=20, now_ms=back_end)
    assert_matches(back, expected(h, back_end, 20, duration=False))
    b = by_tenant(back)["b"]
    assert b.entitled == pytest.approx(back.received / 2)
    assert b.ratio == pytest.approx(1.0, abs=0.05)
    # over the whole 90 s, b was backlogged in about 56 of the 90 samples: its mean
    # share is half of that part of the time
    end = START + 90 * STEP_MS - 1
    whole = await rq.tenant_shares(env, Q, window=90, now_ms=end)
    assert_matches(whole, expected(h, end, 90, duration=False))
    seen = sum(1 for _, weights in h.samples if "b" in weights)
    assert 50 <= seen <= 60
    assert by_tenant(whole)["b"].share == pytest.approx(0.5 * seen / 90)


async def test_duration_charging_counts_slot_seconds(make_queue: Any, env: Environment) -> None:
    rq = await weighted_queue(make_queue, env, "fair", 4, {}, charge="duration")
    # a's runs hold a slot 1 step, b's 3 steps: equal slot time means 3 a runs per b run
    h = await drive(rq, env, 90, weights={}, arrivals=lambda s: {"a": 4, "b": 4},
                    hold=lambda d: 1 if d.tenant == "a" else 3, slots=4)  # fmt: skip
    now = START + 90 * STEP_MS
    got = await rq.tenant_shares(env, Q, window=60, now_ms=now)
    assert got.unit == "slot-seconds"
    want = expected(h, now, 60, duration=True)
    assert_matches(got, want)
    rows = by_tenant(got)
    # received is slot-seconds, not runs: b got a third as many runs for the same time
    runs = expected(h, now, 60, duration=False)
    assert runs["a"][0] == pytest.approx(3 * runs["b"][0], rel=0.15)
    assert rows["a"].received == pytest.approx(rows["b"].received, rel=0.15)
    assert rows["b"].received == pytest.approx(3 * runs["b"][0])
    for row in rows.values():
        assert row.entitled == pytest.approx(got.received / 2)


async def test_keys_inside_a_tenant_share_by_key_weight(make_queue: Any, env: Environment) -> None:
    rq = await queue_for(make_queue, "fair")
    await rq.set_env_limits(env, concurrency=4)
    await rq.set_concurrency_key_weight(env, Q, "k3", 3)
    now = START
    for key in ("k1", "k3"):
        await enqueue_runs(rq, env, Q, f"{key}-", 20, key=key, tenant="t", at=now - 40)
    await enqueue_runs(rq, env, Q, "u-", 20, tenant="u", at=now - 40)
    await rq.sample_shares(now_ms=now)
    done = await rq.dequeue(4, env=env, queues=[Q], now_ms=now)
    await rq.ack(done, now_ms=now + 500)
    got = await rq.tenant_shares(env, Q, window=10, now_ms=now + 500)
    rows = by_tenant(got)
    assert rows["t"].share == pytest.approx(0.5) and rows["u"].share == pytest.approx(0.5)
    keys = {k.key: k for k in rows["t"].by_key}
    assert keys["k3"].entitled == pytest.approx(4 * 0.5 * 3 / 4)
    assert keys["k1"].entitled == pytest.approx(4 * 0.5 * 1 / 4)
    assert [k.key for k in rows["u"].by_key] == [None]
    assert sum(k.received for r in rows.values() for k in r.by_key) == 4


async def test_a_bucket_without_a_sample_holds_the_last_one(
    make_queue: Any, env: Environment
) -> None:
    rq = await queue_for(make_queue, "fair")
    await enqueue_runs(rq, env, Q, "a-", 5, tenant="a", at=START - 10)
    await rq.sample_shares(now_ms=START)
    late = START + 3 * SHARES_BUCKET_MS  # three buckets on, no sample since
    got = await rq.dequeue(2, env=env, queues=[Q], now_ms=late)
    await rq.ack(got, now_ms=late + 10)
    row = by_tenant(await rq.tenant_shares(env, Q, window=10, now_ms=late + 10))["a"]
    assert row.entitled == 2 and row.received == 2
    much_later = START + 20 * SHARES_BUCKET_MS  # past the hold: nobody is entitled
    got = await rq.dequeue(2, env=env, queues=[Q], now_ms=much_later)
    await rq.ack(got, now_ms=much_later + 10)
    shares = await rq.tenant_shares(env, Q, window=10, now_ms=much_later + 10)
    assert shares.unsampled == 2 and by_tenant(shares)["a"].entitled == 0
    assert by_tenant(shares)["a"].ratio is None


async def test_buckets_expire_and_are_bounded(make_queue: Any, env: Environment) -> None:
    rq = await queue_for(make_queue, "fair")
    await enqueue_runs(rq, env, Q, "x-", 3, tenant="x", at=START - 10)
    await rq.sample_shares(now_ms=START)
    key = rq.keys.queue(env, Q).shares(START // SHARES_BUCKET_MS)
    ttl = await rq.client.ttl(key)
    assert 0 < ttl <= SHARES_TTL_S
    fields = await rq.client.hgetall(key)
    assert fields == {b"n": b"1", b"s:x/": b"1"}  # tenant x's runs without a key


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 0}, {"window": 15}, {"window": 3610}, {"window": 1.5}, {"window": True},
     {"window": 60, "now_ms": -1}],
)  # fmt: skip
async def test_bad_reads_are_refused(make_queue: Any, env: Environment, kwargs: Any) -> None:
    rq = await queue_for(make_queue, "fair")
    with pytest.raises(InvalidLimitError):
        await rq.tenant_shares(env, Q, **kwargs)


@pytest.mark.parametrize("kwargs", [{"queues": 0}, {"flows": 10_001}, {"now_ms": -5}])
async def test_bad_samples_are_refused_and_write_nothing(
    make_queue: Any, env: Environment, kwargs: Any
) -> None:
    rq = await queue_for(make_queue, "fair")
    await enqueue_runs(rq, env, Q, "x-", 3, tenant="x", at=START - 10)
    with pytest.raises(FairqError):
        await rq.sample_shares(**kwargs)
    key = rq.keys.queue(env, Q).shares(START // SHARES_BUCKET_MS)
    assert await rq.client.exists(key) == 0


async def test_the_script_refuses_bad_bounds(make_queue: Any, env: Environment) -> None:
    rq = await queue_for(make_queue, "fair")
    await enqueue_runs(rq, env, Q, "x-", 3, tenant="x", at=START - 10)
    tag = rq.keys.tag_of(env)
    for args in (["0", "10"], ["10", "x"], ["10", "10001"]):
        with pytest.raises(FairqError):
            await rq.call("sample_shares", "age", tag, args, START)
    assert await rq.client.exists(rq.keys.queue(env, Q).shares(START // SHARES_BUCKET_MS)) == 0


async def test_maintenance_samples_ready_queues(make_queue: Any, env: Environment) -> None:
    rq = await queue_for(make_queue, "fair")
    assert await rq.maintain(interval_s=0.001)  # nothing ready: nothing sampled, no error
    await enqueue_runs(rq, env, Q, "x-", 3, tenant="x", at=0)
    await rq.client.delete(rq.keys.maintenance_lock)
    assert await rq.maintain(interval_s=0.001)
    now = await rq.server_time_ms()
    shares = await rq.tenant_shares(env, Q, window=10, now_ms=now)
    assert shares.samples >= 1
    assert math.isclose(by_tenant(shares).get("x", TenantShare("x", 0, 0, 0)).share, 1.0)


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_only_the_highest_ready_priority_level_is_entitled(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Strict priority: while tenant a has ready runs at level 1, b's level-3 backlog is
    owed nothing (the order serves none of it); once a's level drains, b is entitled to
    everything served."""
    rq = await queue_for(make_queue, order)
    await rq.set_env_limits(env, concurrency=10)
    for i in range(3):
        await rq.enqueue(env, Q, f"a{i}", None, concurrency_key="a", priority=1, now_ms=START)
        await rq.enqueue(env, Q, f"b{i}", None, concurrency_key="b", now_ms=START)
    await rq.sample_shares(now_ms=START + 1)
    first = [
        d for _ in range(3) for d in await rq.dequeue(1, env=env, queues=[Q], now_ms=START + 2)
    ]
    assert [d.concurrency_key for d in first] == ["a"] * 3
    await rq.ack(first, now_ms=START + 3)
    await rq.sample_shares(now_ms=START + 4)  # only b has work now
    rest = [d for _ in range(3) for d in await rq.dequeue(1, env=env, queues=[Q], now_ms=START + 5)]
    assert [d.concurrency_key for d in rest] == ["b"] * 3
    await rq.ack(rest, now_ms=START + 6)
    rows = by_tenant(await rq.tenant_shares(env, Q, window=10, now_ms=START + 9_999))
    # one sample each: a alone at level 1 (share 1), then b alone (share 1)
    assert rows["a"].share == pytest.approx(0.5) and rows["b"].share == pytest.approx(0.5)
    assert rows["a"].received == rows["b"].received == 3


async def test_a_sample_reads_the_oldest_ready_flows_up_to_its_bound(
    make_queue: Any, env: Environment
) -> None:
    rq = await queue_for(make_queue, "fair")
    for i, tenant in enumerate(("old", "mid", "new")):
        await enqueue_runs(rq, env, Q, f"{tenant}-", 2, tenant=tenant, at=START - 100 + 10 * i)
    assert await rq.sample_shares(now_ms=START, flows=2) == 1
    fields = await rq.client.hgetall(rq.keys.queue(env, Q).shares(START // SHARES_BUCKET_MS))
    assert fields == {b"n": b"1", b"s:old/": b"0.5", b"s:mid/": b"0.5"}


async def test_a_spread_environment_is_owed_partition_by_partition(
    make_queue: Any, env: Environment
) -> None:
    """Each partition has a fair order of its own: a tenant is entitled to its weight's
    share of what its partition served (the reader sums the partitions)."""
    from fairq.keys import encode_tenant, tenant_partition

    rq = await queue_for(make_queue, "fair", shard_count=8)
    await rq.set_partitions(env, 2)
    names = [f"t{i}" for i in range(40)]
    by_part = {
        p: [t for t in names if tenant_partition(encode_tenant(t), "", 2) == p] for p in (0, 1)
    }
    runs = {by_part[0][0]: 10, by_part[0][1]: 10, by_part[1][0]: 20}
    for tenant, n in runs.items():
        await enqueue_runs(rq, env, Q, f"{tenant}-", n, tenant=tenant, at=START - 100)
    await rq.sample_shares(now_ms=START)
    for _ in range(100):
        got = await rq.dequeue(8, env=env, queues=[Q], now_ms=START)
        if not got:
            break
        await rq.ack(got, now_ms=START + 100)
    rows = by_tenant(await rq.tenant_shares(env, Q, window=10, now_ms=START + 100))
    # env-wide it would be 40 / 3 each; per partition 20 x 1/2, 20 x 1/2 and 20 x 1
    assert {t: (r.received, r.entitled) for t, r in rows.items()} == {
        t: (float(n), float(n)) for t, n in runs.items()
    }

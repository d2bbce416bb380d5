"""Rate limits (token buckets on the script clock) under both orders: starts per second
over 10 s of logical time for a key, a tenant, a queue and the per-key default; the
burst at the start; ``wait_ms`` = the time to the next token; a rate-limited key keeps
its fair-order tag while it waits; and a Consumer waiting on a bucket does not poll.

Logical clock: every call passes ``now_ms``, stepped by 10 ms, except the Consumer test,
which runs on the server's clock for a second and a half.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from tests.integration.commandstats import command_counts, reset_stats
from tests.integration.limits_support import (
    T0,
    Order,
    both_orders,
    enqueue_runs,
    queue_for,
)
from tests.state import parked, tenant_floor, tenant_keys, tenant_tags

from fairq.consumer import Consumer
from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue

Q = "rated"
START = T0 + 100_000
STEP_MS = 10
SECONDS = 10
RATE = 10.0
BURST = 5

#: scope -> (set_rate_limit keyword arguments, the flows' (key, tenant) list)
SCOPES: dict[str, tuple[dict[str, Any], list[tuple[str | None, str | None]]]] = {
    "key": ({"key": "k"}, [("k", None)]),
    "tenant": ({"tenant": "T"}, [("u1", "T"), ("u2", "T")]),
    "queue": ({}, [(None, None), ("k", None)]),
}


async def _backlog(
    rq: RunQueue, env: Environment, flows: list[tuple[str | None, str | None]], n: int
) -> None:
    for i, (key, tenant) in enumerate(flows):
        await enqueue_runs(rq, env, Q, f"f{i}-", n, key=key, tenant=tenant, at=T0 + i)


async def _starts(
    rq: RunQueue, env: Environment, *, seconds: int = SECONDS, max_count: int = 20
) -> list[tuple[int, Delivery]]:
    """(ms from START, delivery) of every start over ``seconds`` of logical time; each
    step makes one dequeue call and acks what it got (only the buckets hold work back)."""
    out: list[tuple[int, Delivery]] = []
    for t in range(0, seconds * 1000, STEP_MS):
        got = await rq.dequeue(max_count, env=env, queues=[Q], now_ms=START + t)
        out += [(t, d) for d in got]
        if got:
            await rq.ack(got, now_ms=START + t)
    return out


@both_orders
@pytest.mark.parametrize("scope", list(SCOPES))
async def test_starts_follow_the_rate_after_the_burst(
    make_queue: Any, env: Environment, order: Order, scope: str
) -> None:
    """Rate 10/s, burst 5 on a key / a tenant (two keys) / the queue (keyless + a key),
    every flow backlogged: exactly the burst starts at t=0, then 10/s +-5% over 10 s of
    logical time (no more than one token's worth early at any time)."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    kwargs, flows = SCOPES[scope]
    await rq.set_rate_limit(env, Q, RATE, burst=BURST, **kwargs)
    await _backlog(rq, env, flows, 200)
    starts = await _starts(rq, env)
    at_zero = [d for t, d in starts if t == 0]
    assert len(at_zero) == BURST
    after = len(starts) - BURST
    assert after / SECONDS == pytest.approx(RATE, rel=0.05), after
    # never ahead of the bucket: by time t at most burst + rate * t starts
    for i, (t, _) in enumerate(starts):
        assert i + 1 <= BURST + RATE * t / 1000 + 1e-9, (i, t)


@both_orders
async def test_the_per_key_default_limits_every_key_on_its_own(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """``per="key"`` 5/s, burst 2: three backlogged keys each start 2 at t=0 and then
    5/s +-5%; a key with its own override (20/s) follows its override instead."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_rate_limit(env, Q, "5/s", burst=2, per="key")
    await rq.set_rate_limit(env, Q, "1200/m", burst=2, key="fast")
    for k in ("a", "b", "c", "fast"):
        await enqueue_runs(rq, env, Q, f"{k}-", 300, key=k)
    starts = await _starts(rq, env)
    per_key = Counter(d.concurrency_key for _, d in starts)
    first = Counter(d.concurrency_key for t, d in starts if t == 0)
    assert first == {"a": 2, "b": 2, "c": 2, "fast": 2}
    for k in ("a", "b", "c"):
        assert (per_key[k] - 2) / SECONDS == pytest.approx(5.0, rel=0.05), per_key
    assert (per_key["fast"] - 2) / SECONDS == pytest.approx(20.0, rel=0.05), per_key


@both_orders
async def test_a_rate_limit_holds_back_only_its_flow(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A key limited to 1/s does not slow an unlimited key of the same queue: the free
    key's 50 runs all start in the first second while the limited key starts one."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_rate_limit(env, Q, 1, key="slow")
    await enqueue_runs(rq, env, Q, "s-", 20, key="slow")
    await enqueue_runs(rq, env, Q, "f-", 50, key="free", at=T0 + 100)
    starts = await _starts(rq, env, seconds=1, max_count=5)
    per_key = Counter(d.concurrency_key for _, d in starts)
    assert per_key == {"slow": 1, "free": 50}


# --------------------------------------------------------------------------- wait_ms


async def _token_waits(
    make_queue: Any, env: Environment, order: Order, scope: str
) -> list[tuple[int, int, int | None]]:
    """Rate 4/s (a token per 250 ms), burst 2, only rate-limited work ready: calls at
    the listed times -> (time, runs served, wait_ms), and the exact wait each empty call
    should report (None where the call serves)."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    kwargs, flows = SCOPES[scope]
    await rq.set_rate_limit(env, Q, "240/m", burst=2, **kwargs)
    await _backlog(rq, env, flows, 20)
    out = []
    for t in (0, 0, 100, 249, 250, 250, 600, 600, 2000, 2000):
        batch = await rq.dequeue_batch(10, env=env, queues=[Q], now_ms=START + t)
        out.append((t, len(batch.deliveries), None if batch.deliveries else batch.wait_ms))
    return out


#: (time, runs served, wait_ms of the empty calls): 2 at once (the burst); a token per
#: 250 ms; at 600 ms 1.4 tokens (one run, 0.6 of a token to go); at 2000 ms refilled up
#: to the burst only.
TOKEN_WAITS: list[tuple[int, int, int | None]] = [
    (0, 2, None), (0, 0, 250), (100, 0, 150), (249, 0, 1), (250, 1, None), (250, 0, 250),
    (600, 1, None), (600, 0, 150), (2000, 2, None), (2000, 0, 250),
]  # fmt: skip


@both_orders
@pytest.mark.parametrize("scope", list(SCOPES))
async def test_wait_ms_is_the_time_to_the_next_token(
    make_queue: Any, env: Environment, order: Order, scope: str
) -> None:
    """Only rate-limited work ready: each empty call says how long until the next token,
    to the millisecond (partial tokens included); the call at that time gets the run."""
    assert await _token_waits(make_queue, env, order, scope) == TOKEN_WAITS


@both_orders
@pytest.mark.parametrize("scope", list(SCOPES))
async def test_wait_ms_is_never_before_the_next_token(
    make_queue: Any, env: Environment, order: Order, scope: str
) -> None:
    """The same calls: the same runs served, and every wait is the time to the next
    token or at most 1 ms more (never early: a consumer waking on it finds the token)."""
    got = await _token_waits(make_queue, env, order, scope)
    assert [(t, n) for t, n, _ in got] == [(t, n) for t, n, _ in TOKEN_WAITS]
    for (_, _, wait), (_, _, exact) in zip(got, TOKEN_WAITS, strict=True):
        if exact is None:
            assert wait is None or wait >= 0
        else:
            assert wait is not None and exact <= wait <= exact + 1, got


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_wait_ms_is_the_earlier_of_a_token_and_a_delayed_run(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A rate-limited key (next token in 1000 ms) and a delayed run of a free key: the
    wait is whichever comes first."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_rate_limit(env, Q, 1, key="k")
    await enqueue_runs(rq, env, Q, "k-", 5, key="k")
    await rq.enqueue(env, Q, "late", None, concurrency_key="free", available_at_ms=START + 400,
                     now_ms=START)  # fmt: skip
    await rq.enqueue(env, Q, "later", None, concurrency_key="free2",
                     available_at_ms=START + 5000, now_ms=START)  # fmt: skip
    first = await rq.dequeue(10, env=env, queues=[Q], now_ms=START)
    assert [d.run_id for d in first] == ["k-0"]
    empty = await rq.dequeue_batch(10, env=env, queues=[Q], now_ms=START + 100)
    assert (empty.deliveries, empty.wait_ms) == ([], 300)
    assert [d.run_id for d in await rq.dequeue(10, env=env, queues=[Q], now_ms=START + 400)] == [
        "late"
    ]
    empty = await rq.dequeue_batch(10, env=env, queues=[Q], now_ms=START + 500)
    assert (empty.deliveries, empty.wait_ms) == ([], 500)


# --------------------------------------------------------------------------- fair order tags


async def test_a_rate_limited_key_keeps_its_tag_while_it_waits(
    make_queue: Any, env: Environment
) -> None:
    """Fair order, one run per call every 100 ms: keys ``b`` and ``c`` free, ``a`` at
    1/s. While ``a`` waits for a token its tag in V:tt does not move (no service, no
    advance; it is only pruned once the floor passes it); each of its serves advances
    it by exactly one quantum from where it rejoins (its tag, or the floor). It starts
    once per second (burst 1 at t=0), and b and c share the other serves evenly."""
    rq = await queue_for(make_queue, "fair")
    await rq.set_rate_limit(env, Q, 1, key="a")
    for k in ("a", "b", "c"):
        await enqueue_runs(rq, env, Q, f"{k}-", 60, key=k)
    served: Counter[str | None] = Counter()
    tag = None
    moves = 0
    for step in range(50):
        now = START + step * 100
        floor = await tenant_floor(rq, env) or 0.0
        before = (await tenant_tags(rq, env)).get("a")
        got = await rq.dequeue(1, env=env, queues=[Q], now_ms=now)
        await rq.ack(got, now_ms=now)
        after = (await tenant_tags(rq, env)).get("a")
        assert len(got) == 1  # the free keys are always there: no empty call
        served[got[0].concurrency_key] += 1
        if got[0].concurrency_key == "a":
            moves += 1
            assert after == max(floor, before if before is not None else floor) + 1.0
            tag = after
        elif after is None:
            # pruned: the floor passed it (a tag below the floor carries no credit)
            assert tag is not None and tag < (await tenant_floor(rq, env) or 0.0)
        else:
            assert after == tag  # waiting: unchanged
    assert served["a"] == 5  # t = 0, 1, 2, 3, 4 s
    assert moves == 5
    assert abs(served["b"] - served["c"]) <= 1, served


async def test_a_rate_limited_key_keeps_its_tag_inside_its_tenant(
    make_queue: Any, env: Environment
) -> None:
    """Fair order: tenant T's key ``slow`` (1/s) and key ``quick`` (free). While
    ``slow`` waits, T keeps being served through ``quick`` (no empty call), and
    ``slow``'s tag inside T is unchanged until its next token; it starts once a second."""
    rq = await queue_for(make_queue, "fair")
    await rq.set_rate_limit(env, Q, 1, key="slow")
    await enqueue_runs(rq, env, Q, "s-", 30, key="slow", tenant="T")
    await enqueue_runs(rq, env, Q, "q-", 60, key="quick", tenant="T")
    served: Counter[str | None] = Counter()
    last: float | None = None
    for step in range(30):
        now = START + step * 100
        got = await rq.dequeue(1, env=env, queues=[Q], now_ms=now)
        assert len(got) == 1
        await rq.ack(got, now_ms=now)
        served[got[0].concurrency_key] += 1
        tags = await rq_key_tags(rq, env)
        if got[0].concurrency_key == "slow":
            last = tags.get("slow", last)
        elif "slow" in tags and last is not None:
            assert tags["slow"] == last
    assert served == {"slow": 3, "quick": 27}


async def rq_key_tags(rq: RunQueue, env: Environment) -> dict[str, float]:
    """T's key tags, parked keys included (a parked key keeps its tag in B:park)."""
    tags = await tenant_keys(rq, env, Q, "T")
    for member, value in (await parked(rq, env, Q)).items():
        if member.startswith("k:"):
            tags[member[2:]] = float(value[2:])
    return tags


# --------------------------------------------------------------------------- no polling

#: Commands a client sends itself (not from inside a script), besides script calls.
ROUND_TRIP_COMMANDS = ("time", "subscribe", "client|setinfo", "set", "ping", "hello")


@both_orders
async def test_a_consumer_waiting_on_a_bucket_does_not_poll(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A Consumer (idle timeout 30 s) finds only a rate-limited key whose next token is
    1.5 s away: it sleeps until the token (returning the run 1.4-4.5 s of real time
    after the first, within its 5 s timeout) at a cost of at most 3 dequeue script
    calls, 10 round trips and 100 server commands in all, script-internal ones included
    (a consumer polling every millisecond would make about 1,500 calls)."""
    rq = await queue_for(make_queue, order)
    await rq.set_rate_limit(env, Q, "40/m", burst=1, key="k")  # a token per 1.5 s
    for i in range(3):
        await rq.enqueue(env, Q, f"r{i}", None, concurrency_key="k")
    async with Consumer(rq, env=env, queues=[Q], idle_timeout=30, maintenance_interval=30) as c:
        started = time.perf_counter()  # before r0 takes the token: the next is 1.5 s on
        first = await c.next_batch(5, timeout=5)
        assert [d.run_id for d in first] == ["r0"]
        await rq.ack(first)
        await reset_stats(rq.client)
        second = await c.next_batch(5, timeout=5)
        waited = time.perf_counter() - started
        counts = await command_counts(rq.client)
    print(f"\n[{order}] waited {waited:.2f} s on the bucket: {sum(counts.values())} commands")
    assert [d.run_id for d in second] == ["r1"]
    assert 1.4 <= waited < 4.5  # the token, not its timeout
    scripts = counts.get("fcall", 0) + counts.get("evalsha", 0)
    trips = scripts + sum(counts.get(c, 0) for c in ROUND_TRIP_COMMANDS)
    print(f"[{order}] {scripts} script calls, {trips} round trips: {counts}")
    assert scripts <= 3, counts
    assert trips <= 10, counts
    assert sum(counts.values()) <= 100, counts

"""Issue 13, limits layered under the order: the total cap of a queue, per-key and
per-tenant cap overrides, gated keys in the fair order's candidate window, bad limits,
and what each layer costs the server per dequeue call.

Real server, logical clocks (``now_ms``), both orders where the limit applies to both.
The random-operation model and the multi-process check of the total cap are in
test_limits_random.py; rate limits in test_rates.py; borrowing and charging in
test_borrow_and_charge.py.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from tests.integration.limits_support import (
    T0,
    Order,
    both_orders,
    enqueue_runs,
    queue_for,
)
from tests.state import parked

from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue

Q = "jobs"
NOW = T0 + 10_000


async def saturate(
    rq: RunQueue, env: Environment, *, now: int = NOW, max_count: int = 10, calls: int = 20
) -> list[Delivery]:
    """Dequeue until a call brings nothing (nothing is acked here)."""
    out: list[Delivery] = []
    for _ in range(calls):
        got = await rq.dequeue(max_count, env=env, queues=[Q], now_ms=now)
        if not got:
            break
        out += got
    return out


def per_key(ds: list[Delivery]) -> Counter[str | None]:
    return Counter(d.concurrency_key for d in ds)


# --------------------------------------------------------------------------- total cap


@both_orders
async def test_total_cap_bounds_keyed_and_keyless_runs_together(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Total cap 3 over keyless runs and three keys: a call serves exactly
    min(max_count, 3 - running, queued) runs (work-conserving up to the cap, never over
    it), through 40 rounds of random partial acks and batch sizes."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_queue_total_concurrency(env, Q, 3)
    await enqueue_runs(rq, env, Q, "n", 30)
    for k in ("a", "b", "c"):
        await enqueue_runs(rq, env, Q, f"{k}-", 30, key=k)
    rnd = random.Random(13)
    held: list[Delivery] = []
    served: list[Delivery] = []
    now = NOW
    for _ in range(40):
        now += 10
        rnd.shuffle(held)
        cut = rnd.randint(0, len(held))
        done, held = held[:cut], held[cut:]
        if done:
            await rq.ack(done, now_ms=now)
        before = await rq.queue_stats(env, Q)
        ask = rnd.randint(1, 6)
        got = await rq.dequeue(ask, env=env, queues=[Q], now_ms=now)
        held += got
        after = await rq.queue_stats(env, Q)
        assert len(got) == min(ask, 3 - before.running, before.queued)
        assert after.running == before.running + len(got) <= 3
        assert after.total_concurrency_limit == 3
        served += got
    assert set(per_key(served)) == {None, "a", "b", "c"}  # all flows took part


@both_orders
async def test_total_cap_change_takes_effect_on_the_next_call(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Lowering the cap below what runs stops new starts until the queue drains under it;
    raising it lets the difference start at once; removing it (None) leaves only the
    per-key and env limits."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_queue_total_concurrency(env, Q, 5)
    await enqueue_runs(rq, env, Q, "n", 20)
    await enqueue_runs(rq, env, Q, "k", 20, key="k")
    first = await saturate(rq, env)
    assert len(first) == 5

    await rq.set_queue_total_concurrency(env, Q, 2)
    assert await saturate(rq, env) == []
    await rq.ack(first[:3], now_ms=NOW)  # 2 running = the new cap
    assert await saturate(rq, env) == []
    await rq.ack(first[3:4], now_ms=NOW)  # 1 running
    assert len(await saturate(rq, env)) == 1

    await rq.set_queue_total_concurrency(env, Q, 6)
    assert len(await saturate(rq, env)) == 4
    await rq.set_queue_total_concurrency(env, Q, None)
    rest = await saturate(rq, env)
    stats = await rq.queue_stats(env, Q)
    assert stats.total_concurrency_limit is None
    assert len(rest) == 30  # the 40 runs, 4 acked, 6 running: nothing else binds
    assert (stats.running, stats.queued) == (36, 0)


@both_orders
async def test_filling_the_total_cap_reports_gated_work(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A call that stops at the total cap with ready work left says so (``gated``), so
    that the ack freeing a slot wakes waiting consumers (max_per_key 10)."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_queue_total_concurrency(env, Q, 3)
    await enqueue_runs(rq, env, Q, "n", 5)
    await enqueue_runs(rq, env, Q, "k", 5, key="k")
    batch = await rq.dequeue_batch(10, env=env, queues=[Q], now_ms=NOW)
    assert len(batch.deliveries) == 3
    assert batch.gated


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_filling_the_total_cap_reports_gated_work_with_one_run_per_key(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """The same with the default max_per_key (1 in the age order): two keys and keyless
    runs, total cap 3; the call serves 3 and must report the ready work it left."""
    rq = await queue_for(make_queue, order)
    await rq.set_queue_total_concurrency(env, Q, 3)
    for i in range(5):
        await rq.enqueue(env, Q, f"n{i}", None, now_ms=T0 + i)
        await rq.enqueue(env, Q, f"k{i}", None, concurrency_key=f"k{i % 2}", now_ms=T0 + i)
    batch = await rq.dequeue_batch(10, env=env, queues=[Q], now_ms=NOW)
    assert len(batch.deliveries) == 3
    assert batch.gated


# --------------------------------------------------------------------------- key caps


@both_orders
async def test_key_caps_above_and_below_the_per_key_limit_hold_through_acks(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Per-key limit 2; key ``big`` has its own cap 5, ``small`` 1, ``plain`` none: at
    saturation each runs exactly its cap, through 10 rounds of acks of random runs.
    Removing ``big``'s override (None) brings it back to the queue's 2."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_queue_concurrency(env, Q, 2)
    await rq.set_key_concurrency(env, Q, "big", 5)
    await rq.set_key_concurrency(env, Q, "small", 1)
    for k in ("big", "small", "plain"):
        await enqueue_runs(rq, env, Q, f"{k}-", 40, key=k)
    caps = {"big": 5, "small": 1, "plain": 2}
    rnd = random.Random(5)
    held = await saturate(rq, env)
    assert per_key(held) == caps
    for _ in range(10):
        rnd.shuffle(held)
        done, held = held[:3], held[3:]
        await rq.ack(done, now_ms=NOW)
        held += await saturate(rq, env)
        assert per_key(held) == caps

    await rq.set_key_concurrency(env, Q, "big", None)
    big = [d for d in held if d.concurrency_key == "big"]
    await rq.ack(big, now_ms=NOW)
    held = [d for d in held if d.concurrency_key != "big"] + await saturate(rq, env)
    assert per_key(held) == {"big": 2, "small": 1, "plain": 2}
    stats = await rq.queue_stats(env, Q, breakdown=True)
    assert {v.concurrency_key: v.running for v in stats.variants} == {
        "big": 2, "small": 1, "plain": 2
    }  # fmt: skip


@both_orders
async def test_a_key_cap_of_zero_holds_the_key_and_only_it(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A key with cap 0 starts nothing while the other keys are served; clearing its cap
    lets it start on the next call (it was not lost while held back)."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_key_concurrency(env, Q, "off", 0)
    await enqueue_runs(rq, env, Q, "off-", 3, key="off")
    await enqueue_runs(rq, env, Q, "on-", 3, key="on", at=T0 + 100)
    got = await saturate(rq, env)
    assert per_key(got) == {"on": 3}
    await rq.set_key_concurrency(env, Q, "off", None)
    assert per_key(await saturate(rq, env, now=NOW + 1)) == {"off": 3}


# --------------------------------------------------------------------------- tenant caps


@both_orders
async def test_tenant_caps_bound_a_tenant_across_its_keys(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Per-key limit 3. Tenant ``acme`` (4 keys) with its own cap 2 runs 2 across its
    keys; tenant ``zeta`` (4 keys, no override) has no cap of its own: each of its keys
    runs up to the per-key limit (12 in all: naming a tenant never slows it down).
    Removing acme's override (None) gives it the same 12."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_queue_concurrency(env, Q, 3)
    await rq.set_tenant_concurrency(env, Q, "acme", 2)
    for t in ("acme", "zeta"):
        for i in range(4):
            await enqueue_runs(rq, env, Q, f"{t}{i}-", 10, key=f"{t}{i}", tenant=t)
    held = await saturate(rq, env)
    assert Counter(d.tenant for d in held) == {"acme": 2, "zeta": 12}
    for _ in range(3):
        done, held = held[:2], held[2:]
        await rq.ack(done, now_ms=NOW)
        held += await saturate(rq, env)
        assert Counter(d.tenant for d in held) == {"acme": 2, "zeta": 12}

    await rq.set_tenant_concurrency(env, Q, "acme", None)
    await rq.ack([d for d in held if d.tenant == "acme"], now_ms=NOW)
    held = [d for d in held if d.tenant != "acme"] + await saturate(rq, env)
    assert Counter(d.tenant for d in held) == {"acme": 12, "zeta": 12}


@both_orders
async def test_a_tenant_cap_on_a_key_serving_as_its_own_tenant(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """A key without a named tenant is its own tenant: a tenant cap under that name
    below the key's cap binds (2 of per-key 4); a key cap below it binds instead."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    await rq.set_queue_concurrency(env, Q, 4)
    await rq.set_tenant_concurrency(env, Q, "solo", 2)
    await rq.set_tenant_concurrency(env, Q, "tight", 3)
    await rq.set_key_concurrency(env, Q, "tight", 1)
    for k in ("solo", "tight", "free"):
        await enqueue_runs(rq, env, Q, f"{k}-", 10, key=k)
    assert per_key(await saturate(rq, env)) == {"solo": 2, "tight": 1, "free": 4}


# --------------------------------------------------------------------------- window


async def _capped_crowd(rq: RunQueue, env: Environment, crowd: int) -> list[Delivery]:
    """Per-key limit 1; ``crowd`` keys each run one run (served and drained), then each
    queues a second one while the first still runs (so it is at its cap and registered
    in the order). Returns the running runs."""
    await rq.set_env_limits(env, concurrency=1000)
    await rq.set_queue_concurrency(env, Q, 1)
    for k in range(crowd):
        await rq.enqueue(env, Q, f"c{k}-0", None, concurrency_key=f"c{k}", now_ms=T0)
    running = await saturate(rq, env, now=T0 + 1, max_count=100)
    assert len(running) == crowd
    for k in range(crowd):
        await rq.enqueue(env, Q, f"c{k}-1", None, concurrency_key=f"c{k}", now_ms=T0 + 2)
    return running


async def test_keys_at_their_cap_do_not_block_free_keys_in_the_fair_order(
    make_queue: Any, env: Environment
) -> None:
    """3 free keys (own cap 5) were busy (30 runs each, done); then 80 keys with cap 1
    each run one run and queue a second (at their cap, registered in the order, at the
    same tag as the free keys); then the free keys queue a run: the first dequeue call
    serves the 3 free keys (no empty call while they have work)."""
    rq = await queue_for(make_queue, "fair")
    for f in ("f0", "f1", "f2"):
        await rq.set_key_concurrency(env, Q, f, 5)
        await enqueue_runs(rq, env, Q, f"{f}-old", 30, key=f, at=T0 - 1000)
    while done := await rq.dequeue(50, env=env, queues=[Q], now_ms=T0 - 1):
        await rq.ack(done, now_ms=T0 - 1)
    await _capped_crowd(rq, env, 80)
    for f in ("f0", "f1", "f2"):
        await rq.set_key_concurrency(env, Q, f, 5)
        await rq.enqueue(env, Q, f"{f}-0", None, concurrency_key=f, now_ms=T0 + 3)
    first = await rq.dequeue_batch(3, env=env, queues=[Q], now_ms=T0 + 10)
    assert sorted(d.run_id for d in first.deliveries) == ["f0-0", "f1-0", "f2-0"]


async def test_keys_parked_at_their_cap_stay_out_of_the_window(
    make_queue: Any, env: Environment
) -> None:
    """Once a call has found the 80 capped keys (parking them), free keys arriving later
    are served by the first call after their arrival; the parked keys come back as
    their slots free (one ack: exactly that key's next run)."""
    rq = await queue_for(make_queue, "fair")
    running = await _capped_crowd(rq, env, 80)
    for _ in range(30):
        if not (await rq.dequeue_batch(3, env=env, queues=[Q], now_ms=T0 + 5)).gated:
            break
    assert len(await parked(rq, env, Q)) == 80
    for f in ("f0", "f1", "f2"):
        await rq.set_key_concurrency(env, Q, f, 5)
        await rq.enqueue(env, Q, f"{f}-0", None, concurrency_key=f, now_ms=T0 + 6)
    first = await rq.dequeue(3, env=env, queues=[Q], now_ms=T0 + 10)
    assert sorted(d.run_id for d in first) == ["f0-0", "f1-0", "f2-0"]
    await rq.ack([running[17]], now_ms=T0 + 11)
    again = await rq.dequeue(3, env=env, queues=[Q], now_ms=T0 + 12)
    assert [d.run_id for d in again] == [f"{running[17].concurrency_key}-1"]

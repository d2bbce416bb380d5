"""Tenants in the fair order: the product requirements, on a real server.

Step-driven like tests/integration/test_vtime_fairness.py (whose harness this reuses):
each step acks the runs whose logical hold ended, enqueues that step's arrivals with
explicit scores, then makes ONE dequeue call with ``now_ms``. Default settings (fair
order on, env limit 4, max_count 10) unless a test is about a setting. Shares are
measured per tenant (and per key) over the serves made while every tenant compared
had queued work, and each share test also runs the age order on the same workload to
show the check is not one every work-conserving order passes.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from tests.integration.test_vtime_fairness import (
    MAX_COUNT,
    OLD,
    STEP_MS,
    T_BASE,
    Arrival,
    Outcome,
    fresh_key_flood,
    poisson_arrivals,
    run_scenario,
)
from tests.state import (
    delete_tenant_floor,
    key_floor,
    ready_tenants,
    tenant_floor,
    tenant_keys,
    tenant_tags,
)

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import CancelOutcome, EnqueueRequest
from fairq.store import RunQueue

QUEUE = "jobs"
T0 = 1_000_000
NOW = T0 + 100_000


def env_named(name: str) -> Environment:
    return Environment("org1", "proj1", name)


async def fair(make_queue: Any, **config: Any) -> RunQueue:
    rq: RunQueue = await make_queue(vtime={"enabled": True}, **config)
    return rq


def tenant_of(o: Outcome, run: str) -> str:
    a = o.arrival[run]
    return a.tenant or a.ck


def backlog_window(o: Outcome, tenants: list[str]) -> tuple[int, int]:
    """The steps [start, end) in which every listed tenant had queued runs (arrived, not
    yet served) at the start of the step."""
    first_arrival = [
        min(a.step for a in o.arrival.values() if (a.tenant or a.ck) == t) for t in tenants
    ]
    last_served = [max(o.served_at[r] for r in o.arrival if tenant_of(o, r) == t) for t in tenants]
    return max(first_arrival), min(last_served)


def window_counts(o: Outcome, tenants: list[str], by: str = "tenant") -> Counter[str]:
    """Serves of the listed tenants in their backlogged window, per tenant (``by`` =
    "tenant"), per key ("ck") or per queue ("queue")."""
    start, end = backlog_window(o, tenants)
    return Counter(
        tenant_of(o, r) if by == "tenant" else getattr(o.arrival[r], by)
        for r in o.order
        if start <= o.served_at[r] < end and tenant_of(o, r) in tenants
    )


def backlogged_shares(o: Outcome, tenants: list[str]) -> tuple[dict[str, float], int]:
    """Each tenant's share of the serves made in the window where all were backlogged,
    and how many serves that window holds."""
    counts = window_counts(o, tenants)
    total = sum(counts.values())
    return {t: counts[t] / total for t in tenants}, total


def old_backlog(
    tenant: str | None,
    keys: list[str],
    count: int,
    queues: list[str] | None = None,
    offset: int = 0,
) -> list[Arrival]:
    """``count`` runs at step 0 spread round-robin over ``keys`` (and ``queues``), with
    distinct old timestamps (``offset`` makes one tenant's older than another's)."""
    out = []
    for i in range(count):
        k = keys[i % len(keys)]
        q = queues[i % len(queues)] if queues else QUEUE
        out.append(Arrival(0, k, f"{tenant or k}-{i}", OLD + offset + i, tenant, q))
    return out


async def both_orders(
    make_queue: Any, arr: list[Arrival], name: str, **kwargs: Any
) -> tuple[Outcome, Outcome]:
    age: RunQueue = await make_queue()
    on = await fair(make_queue)
    o_age = await run_scenario(age, env_named(f"age{name}"), arr, **kwargs)
    o_fair = await run_scenario(on, env_named(f"fair{name}"), arr, **kwargs)
    return o_age, o_fair


# ---------------------------------------------------------------- shares


async def test_tenant_shares_over_keys_one_key_vs_nine(make_queue: Any) -> None:
    """Tenant A (one key) vs tenant B (nine keys), both backlogged: each gets half of the
    service (+-5%), and B's half is shared evenly by its keys (each within 1 serve of
    the others); the age order gives B everything (its heads are older)."""
    arr = old_backlog("A", ["a"], 150, offset=1000) + old_backlog(
        "B", [f"b{i}" for i in range(9)], 400
    )
    age, on = await both_orders(make_queue, arr, "keys")
    shares, n = backlogged_shares(on, ["A", "B"])
    assert n >= 250
    assert shares["A"] == pytest.approx(0.5, abs=0.05), shares
    per_key = window_counts(on, ["A", "B"], "ck")
    b_keys = [per_key[f"b{i}"] for i in range(9)]
    assert max(b_keys) - min(b_keys) <= 1, per_key
    age_shares, _ = backlogged_shares(age, ["A", "B"])
    assert age_shares["A"] < 0.3, age_shares


async def test_tenant_shares_over_queues_one_queue_vs_nine(make_queue: Any) -> None:
    """Tenant B's runs over 9 queues of the env vs tenant A in one, one consumer over all
    ten queues: each tenant gets half (+-5%), B's half spread over its queues; the age
    order gives B everything."""
    queues = [f"q{i}" for i in range(10)]
    arr = old_backlog("A", ["a"], 150, ["q0"], offset=1000) + old_backlog(
        "B", ["b"], 400, queues[1:]
    )
    age, on = await both_orders(make_queue, arr, "queues", queues=queues)
    shares, n = backlogged_shares(on, ["A", "B"])
    assert n >= 250
    assert shares["A"] == pytest.approx(0.5, abs=0.05), shares
    per_queue = window_counts(on, ["A", "B"], "queue")
    b_queues = [per_queue[q] for q in queues[1:]]
    assert max(b_queues) - min(b_queues) <= 0.1 * per_queue["q0"], per_queue
    age_shares, _ = backlogged_shares(age, ["A", "B"])
    assert age_shares["A"] < 0.3, age_shares


async def test_tenant_shares_with_a_fresh_key_per_message(make_queue: Any) -> None:
    """Tenant B mints a fresh key for every message (all carrying tenant B) vs tenant A on
    one key, both backlogged: each gets half (+-5%); the age order gives B everything."""
    arr = old_backlog("A", ["a"], 150, offset=1000) + old_backlog(
        "B", [f"fresh{i:03d}" for i in range(400)], 400
    )
    age, on = await both_orders(make_queue, arr, "fresh")
    shares, n = backlogged_shares(on, ["A", "B"])
    assert n >= 250
    assert shares["A"] == pytest.approx(0.5, abs=0.05), shares
    age_shares, _ = backlogged_shares(age, ["A", "B"])
    assert age_shares["A"] < 0.3, age_shares


async def test_tenant_weights_1_2_4_at_default_settings(make_queue: Any) -> None:
    """Tenant weights 1:2:4 (three keys each, all backlogged, default settings): served
    shares within +-5% of 1/7 : 2/7 : 4/7."""
    weights = {"w1": 1.0, "w2": 2.0, "w4": 4.0}
    arr: list[Arrival] = []
    for j, t in enumerate(weights):
        arr += old_backlog(t, [f"{t}k{i}" for i in range(3)], 300, offset=j)
    on = await fair(make_queue)
    env = env_named("weights")
    for t, w in weights.items():
        await on.set_tenant_weight(env, t, w)
    o = await run_scenario(on, env, arr)
    shares, n = backlogged_shares(o, list(weights))
    assert n >= 350
    for t, w in weights.items():
        assert shares[t] == pytest.approx(w / 7, abs=0.05), shares


async def test_a_lone_key_drains_at_full_capacity(make_queue: Any) -> None:
    """A lone backlogged key of a named tenant uses every slot: its makespan equals the
    age order's at full capacity (max_per_key_per_call = max_count), i.e. 60 runs in
    4 slots x hold 3 = 15 rounds (43 steps); the age order at its default (1 run per key
    per call) needs more."""
    arr = old_backlog("solo", ["only"], 60)
    full: RunQueue = await make_queue(max_per_key_per_call=MAX_COUNT)
    o_full = await run_scenario(full, env_named("agefull"), arr)
    age, on = await both_orders(make_queue, arr, "lone")
    assert on.steps == o_full.steps == 43
    assert age.steps > on.steps


# ---------------------------------------------------------------- waits


async def test_key_flood_does_not_hurt_a_steady_tenant(make_queue: Any) -> None:
    """A tenant minting a fresh key per message (all carrying its tenant) vs a steady
    one-key tenant: the steady tenant's mean wait is at most 1.2x its age-order wait on
    the same workload; an honest newcomer tenant arriving at step 30 is served within
    one round of the tenants (no other tenant served twice before it)."""
    arr = fresh_key_flood(0, tenant="attacker")
    arr += [
        Arrival(30 + 4 * i, "honest", f"honest-{i}", T_BASE + (30 + 4 * i) * STEP_MS + 1)
        for i in range(3)
    ]
    age, on = await both_orders(make_queue, arr, "flood")
    w_on, w_age = on.mean_wait("steady"), age.mean_wait("steady")
    assert w_on <= 1.2 * w_age, (w_on, w_age)
    first = on.first_served("honest")
    before: Counter[str] = Counter()
    for run in on.order:
        if on.arrival[run].ck == "honest":
            break
        if on.served_at[run] >= 30:
            before[tenant_of(on, run)] += 1
    assert max(before.values(), default=0) <= 1, (before, first)
    assert first - 30 <= 3  # one hold: the first slot that frees


async def test_light_tenant_among_10000_busy_keys_is_served_within_2_steps(
    make_queue: Any,
) -> None:
    """One light tenant arriving (step 5) among 10,000 backlogged keys of another tenant is
    first served within 2 dequeue steps of arriving (the age order: not in the 7 steps
    measured; its heads are the newest)."""
    results = {}
    for fair_order in (True, False):
        rq: RunQueue = await (fair(make_queue) if fair_order else make_queue())
        env = env_named(f"busy{fair_order}")
        await rq.set_env_limits(env, concurrency=4)
        await rq.enqueue_many(
            [
                EnqueueRequest(
                    env,
                    QUEUE,
                    f"b{i}",
                    None,
                    concurrency_key=f"busy{i:05d}",
                    available_at_ms=OLD + i,
                    tenant="busy",
                )
                for i in range(10_000)
            ],
            now_ms=T_BASE,
        )
        holding: list[tuple[int, Any]] = []
        first = None
        for step in range(12):
            now = T_BASE + step * STEP_MS
            await rq.ack([d for s, d in holding if s + 3 <= step], now_ms=now)
            holding = [(s, d) for s, d in holding if s + 3 > step]
            if step == 5:
                for i in range(3):
                    await rq.enqueue(
                        env, QUEUE, f"light{i}", None, concurrency_key="l", tenant="light",
                        available_at_ms=now + i, now_ms=now,
                    )  # fmt: skip
            batch = await rq.dequeue(10, env=env, queues=[QUEUE], now_ms=now + 10)
            holding += [(step, d) for d in batch]
            if first is None and any(d.tenant == "light" for d in batch):
                first = step
        results[fair_order] = first
    first_fair = results[True]
    assert first_fair is not None and first_fair - 5 <= 1, results  # steps 5 or 6
    assert results[False] is None, results


def balanced_tenants(seed: int) -> list[Arrival]:
    """8 symmetric keys in 2 named tenants (4 each), ~1 arrival per step (75% capacity)."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    for i in range(8):
        out += [
            Arrival(a.step, a.ck, a.run, a.timestamp, f"T{i // 4}")
            for a in poisson_arrivals(rng, f"bal{i}", 13, 0, 8.0)
        ]
    return out


async def test_balanced_arrivals_no_key_waits_more_than_125_percent_of_age(
    make_queue: Any,
) -> None:
    """Balanced arrivals over keys of two tenants: the worst KEY's mean wait (per key,
    not per tenant; summed over seeds 1-4) is at most 1.25x the age order's worst key."""
    worst_age = worst_fair = 0.0
    for seed in (1, 2, 3, 4):
        age, on = await both_orders(make_queue, balanced_tenants(seed), f"bal{seed}")
        worst_age += max(age.mean_wait(k) for k in age.key_names())
        worst_fair += max(on.mean_wait(k) for k in on.key_names())
    assert worst_fair <= 1.25 * worst_age, (worst_fair, worst_age)


# ---------------------------------------------------------------- gated keys


@pytest.mark.parametrize("gated_tenant", [None, "bulk"])
async def test_gated_keys_do_not_hide_servable_ones(
    make_queue: Any, gated_tenant: str | None
) -> None:
    """80 keys at their per-key cap (1, runs held 100 steps, one more run queued each) and
    quick keys named to sort last (zquick0..9, short runs, arriving from step 10, when
    every gated key is at its cap), env limit 100: every quick run is served within 1
    step of arriving, and no dequeue comes back empty while a slot is free and a
    servable run (ready, its key below its cap) exists."""
    rng = random.Random(3)
    gated = [f"g{i:02d}" for i in range(80)]
    arr = [
        Arrival(0, k, f"{k}-{j}", OLD + i * 10 + j, gated_tenant)
        for i, k in enumerate(gated)
        for j in range(2)
    ]
    for i in range(10):  # from step 10: every gated key is at its cap with a run queued
        arr += [
            Arrival(a.step, a.ck, a.run, a.timestamp)
            for a in poisson_arrivals(rng, f"zquick{i}", 6, 10, 5.0)
        ]
    assert max(a.step for a in arr) < 100
    rq = await fair(make_queue)
    env = env_named(f"gated{gated_tenant}")
    for k in gated:
        await rq.set_key_concurrency(env, QUEUE, k, 1)

    def hold(a: Arrival) -> int:
        return 1 if a.ck.startswith("zquick") else 100

    def cap(ck: str) -> int:
        return 1 if ck.startswith("g") else 1_000

    o = await run_scenario(rq, env, arr, env_limit=100, hold=hold, key_cap=cap)
    quick_waits = [w for k in o.key_names() if k.startswith("zquick") for w in o.waits(k)]
    assert len(quick_waits) == 60 and max(quick_waits) <= 1, quick_waits
    assert o.empty_steps == 0


async def test_key_parked_at_cap_zero_comes_back_when_the_cap_is_raised(
    make_queue: Any, env: Environment
) -> None:
    """A key (or a tenant) held back by a cap of 0 is served once the cap is raised (a
    cap-parked key that holds no slot can never be unparked by a freed slot)."""
    rq = await fair(make_queue)
    await rq.set_queue_concurrency(env, QUEUE, 0)
    await rq.set_tenant_concurrency(env, QUEUE, "acme", 0)
    await rq.enqueue(env, QUEUE, "a0", None, concurrency_key="a", available_at_ms=T0, now_ms=T0)
    await rq.enqueue(env, QUEUE, "b0", None, concurrency_key="b", tenant="acme",
                     available_at_ms=T0, now_ms=T0)  # fmt: skip
    assert await rq.dequeue(5, env=env, queues=[QUEUE], now_ms=T0 + 1) == []
    await rq.set_queue_concurrency(env, QUEUE, None)
    await rq.set_tenant_concurrency(env, QUEUE, "acme", None)
    served = await rq.dequeue(5, env=env, queues=[QUEUE], now_ms=T0 + 2)
    assert sorted(d.run_id for d in served) == ["a0", "b0"]


# ---------------------------------------------------------------- floor faults


async def _busy_pair(rq: RunQueue, env: Environment, runs: int, calls: int, max_count: int) -> None:
    for i in range(runs):
        for k in "AB":
            await rq.enqueue(env, QUEUE, f"{k}{i}", None, concurrency_key=k,
                             available_at_ms=T0 + 10 + i, now_ms=T0 + 10)  # fmt: skip
    for _ in range(calls):
        batch = await rq.dequeue(max_count, env=env, queues=[QUEUE], now_ms=NOW)
        await rq.ack(batch, now_ms=NOW)


async def test_key_joining_right_after_a_batch_gets_no_extra_credit(
    make_queue: Any, env: Environment
) -> None:
    """One call of 10 serves A and B five times each (start tags 0..4); a key joining
    right after starts at the last start tag begun (4), not at the batch's lowest (0): in
    the next 6 serves it gets a fair third (2), not a run of 5."""
    rq = await fair(make_queue)
    await _busy_pair(rq, env, 30, 1, 10)
    assert await tenant_tags(rq, env) == {"A": 5.0, "B": 5.0}
    assert await tenant_floor(rq, env) == 4.0
    for i in range(10):
        await rq.enqueue(env, QUEUE, f"C{i}", None, concurrency_key="C",
                         available_at_ms=T0 + 500 + i, now_ms=T0 + 500)  # fmt: skip
    assert (await ready_tenants(rq, env, QUEUE))["C"] == 4.0
    order = [d.concurrency_key for d in await rq.dequeue(6, env=env, queues=[QUEUE], now_ms=NOW)]
    assert order[0] == "C" and order.count("C") == 2, order


async def test_floor_key_lost_newcomer_does_not_take_every_serve(
    make_queue: Any, env: Environment
) -> None:
    """V:tfloor deleted while tags remain (and a long-drained tenant's low tag is still in
    V:tt): a newcomer does not take every following serve; in the next 10 it gets at most
    a fair third plus its one joining serve (5)."""
    rq: RunQueue = await make_queue(vtime={"enabled": True, "admission": "floor"})
    await rq.enqueue(env, QUEUE, "old0", None, concurrency_key="old", available_at_ms=T0, now_ms=T0)
    await rq.ack(await rq.dequeue(5, env=env, queues=[QUEUE], now_ms=T0 + 1), now_ms=T0 + 1)
    await _busy_pair(rq, env, 60, 20, 2)
    assert (await tenant_tags(rq, env)).items() >= {"A": 20.0, "B": 20.0}.items()
    await delete_tenant_floor(rq, env)
    for i in range(30):
        await rq.enqueue(env, QUEUE, f"N{i}", None, concurrency_key="new",
                         available_at_ms=T0 + 200 + i, now_ms=T0 + 200)  # fmt: skip
    order: list[str | None] = []
    for _ in range(5):
        batch = await rq.dequeue(2, env=env, queues=[QUEUE], now_ms=NOW)
        await rq.ack(batch, now_ms=NOW)
        order += [d.concurrency_key for d in batch]
    assert order.count("new") <= 5, order


async def test_discovery_after_an_age_order_enqueue_applies_the_join_rules(
    make_queue: Any, env: Environment
) -> None:
    """Runs enqueued by an age-order process are not registered; the fair dequeue that
    discovers them registers them by the join rules: a tenant that drained with credit
    above the floor ('heavy', kept tag 20) comes back at its tag, not at the floor, and is
    not served before the others reach it; a tenant new to the queue ('N') joins at the
    floor, and its keys at its key floor (0 for a new key set)."""
    rq = await fair(make_queue)
    await _busy_pair(rq, env, 40, 6, 2)
    assert await tenant_tags(rq, env) == {"A": 6.0, "B": 6.0}
    assert await tenant_floor(rq, env) == 5.0
    await rq.client.zadd(rq.keys.env(env).tenant_tags, {"heavy": 20.0})  # drained with credit
    age: RunQueue = await make_queue()
    for i in range(5):
        await age.enqueue(env, QUEUE, f"hh{i}", None, concurrency_key="heavy",
                          available_at_ms=T0 + i, now_ms=T0 + 300)  # fmt: skip
        for k in ("n1", "n2"):
            await age.enqueue(env, QUEUE, f"{k}-{i}", None, concurrency_key=k, tenant="N",
                              available_at_ms=T0 + 400 + i, now_ms=T0 + 300)  # fmt: skip
    tq = await ready_tenants(rq, env, QUEUE)
    assert "heavy" not in tq and "N" not in tq
    first = await rq.dequeue(4, env=env, queues=[QUEUE], now_ms=NOW)
    await rq.ack(first, now_ms=NOW)
    # N joined at the floor (5) below A and B (6): served first; heavy waits at 20
    assert [d.concurrency_key for d in first] == ["n1", "A", "B", "n2"]
    assert await ready_tenants(rq, env, QUEUE) == {"A": 7.0, "B": 7.0, "N": 7.0, "heavy": 20.0}
    assert await tenant_keys(rq, env, QUEUE, "N") == {"n1": 1.0, "n2": 1.0}  # key floor 0
    order = []
    for _ in range(12):
        batch = await rq.dequeue(1, env=env, queues=[QUEUE], now_ms=NOW)
        await rq.ack(batch, now_ms=NOW)
        order += [d.tenant or d.concurrency_key for d in batch]
    assert Counter(order) == {"A": 4, "B": 4, "N": 4}, order  # heavy not before 20


async def test_floor_survives_a_tick_with_fractional_tags(
    make_queue: Any, env: Environment
) -> None:
    """A key of weight 1.5 (step 2/3) served one run per call: after every call the floor
    is exactly the start tag of the run just begun, and it is never lost when it crosses
    a tick (pruning removes tags strictly below the floor, never the floor itself)."""
    rq = await fair(make_queue)
    await rq.set_concurrency_key_weight(env, QUEUE, "x", 1.5)
    for i in range(40):
        await rq.enqueue(env, QUEUE, f"x{i}", None, concurrency_key="x",
                         available_at_ms=T0 + i, now_ms=T0)  # fmt: skip
    tag = 0.0
    for call in range(30):
        batch = await rq.dequeue(1, env=env, queues=[QUEUE], now_ms=NOW)
        await rq.ack(batch, now_ms=NOW)
        start, tag = tag, tag + 1 / 1.5
        assert await tenant_floor(rq, env) == start, call
        assert await tenant_tags(rq, env) == {"x": tag}, call


async def test_cold_start_discovery_registers_named_tenants_by_the_join_rules(
    make_queue: Any, env: Environment
) -> None:
    """Cold start: tenant A (one key) and tenant B (nine keys) enqueued by an age-order
    process (nothing registered), then fair dequeues: the first call registers both
    tenants at the floor (0) and B's keys at its key floor (0), and the tenant level
    applies from the first call on: 10 one-run calls split 5 / 5 (the age order would
    serve B's older heads only)."""
    age: RunQueue = await make_queue()
    for i in range(20):
        await age.enqueue(env, QUEUE, f"b{i}", None, concurrency_key=f"b{i % 9}", tenant="B",
                          available_at_ms=T0 + i, now_ms=T0)  # fmt: skip
        await age.enqueue(env, QUEUE, f"a{i}", None, concurrency_key="a", tenant="A",
                          available_at_ms=T0 + 100 + i, now_ms=T0)  # fmt: skip
    rq = await fair(make_queue)
    assert await ready_tenants(rq, env, QUEUE) == {}
    first = await rq.dequeue(10, env=env, queues=[QUEUE], now_ms=NOW)
    assert Counter(d.tenant for d in first) == {"A": 5, "B": 5}
    assert set(await ready_tenants(rq, env, QUEUE)) == {"A", "B"}
    keys_b = await tenant_keys(rq, env, QUEUE, "B")
    assert set(keys_b) == {f"b{i}" for i in range(9)}
    assert sorted(keys_b.values()) == [0.0] * 4 + [1.0] * 5  # 5 served once, from 0


async def _tenant_layout(
    rq: RunQueue, env: Environment, tenant: str
) -> tuple[tuple[float, float, str] | None, bool]:
    """A named tenant's entry in the queue's one-key hash (B:tsolo: its key floor, its
    key's tag and the key), and whether it has a key set."""
    q = rq.keys.queue(env, QUEUE)
    encoded = K.encode_tenant(tenant)
    solo = await rq.client.hget(q.solo_keys, encoded)  # type: ignore[misc]
    has_set = await rq.client.exists(q.tenant_keys(encoded)) == 1
    return (None if solo is None else K.parse_solo_entry(solo)), has_set


async def test_a_tenant_with_one_key_is_kept_in_one_hash_until_a_second_key_joins(
    make_queue: Any, env: Environment
) -> None:
    """Tenant A's keys in the queue, through one key, two, none and one again: while it
    has one key in play, that key's tag and A's key floor are its entry in the queue's
    one-key hash and A has no key set; a second key moves them into a key set (the new
    key at the key floor, served first); when its keys drain, the set keeps the floor,
    and the next lone key goes back to the hash at that floor. A cancel that drains the
    lone key takes A out of the candidates and leaves the floor."""
    rq = await fair(make_queue)
    for i in range(4):
        await rq.enqueue(env, QUEUE, f"a{i}", None, concurrency_key="a", tenant="A",
                         available_at_ms=T0 + i, now_ms=T0)  # fmt: skip
    assert await _tenant_layout(rq, env, "A") == ((0.0, 0.0, "A/a"), False)
    batch = await rq.dequeue(3, env=env, queues=[QUEUE], now_ms=NOW)
    await rq.ack(batch, now_ms=NOW)
    assert [d.run_id for d in batch] == ["a0", "a1", "a2"]
    # the key's tag 3 (three quanta), the key floor 2 (the start tag of the last run)
    assert await _tenant_layout(rq, env, "A") == ((2.0, 3.0, "A/a"), False)
    assert await tenant_keys(rq, env, QUEUE, "A") == {"a": 3.0}
    for i in range(2):
        await rq.enqueue(env, QUEUE, f"b{i}", None, concurrency_key="b", tenant="A",
                         available_at_ms=T0 + 10 + i, now_ms=T0)  # fmt: skip
    assert await _tenant_layout(rq, env, "A") == (None, True)
    assert await tenant_keys(rq, env, QUEUE, "A") == {"a": 3.0, "b": 2.0}
    assert await key_floor(rq, env, QUEUE, "A") == 2.0
    order = []
    for _ in range(3):
        batch = await rq.dequeue(1, env=env, queues=[QUEUE], now_ms=NOW)
        await rq.ack(batch, now_ms=NOW)
        order += [d.run_id for d in batch]
    assert order == ["b0", "a3", "b1"]  # b from the floor (2), then a and b at 3
    assert await _tenant_layout(rq, env, "A") == (None, True)
    assert await tenant_keys(rq, env, QUEUE, "A") == {}
    assert await key_floor(rq, env, QUEUE, "A") == 3.0
    assert "A" not in await ready_tenants(rq, env, QUEUE)
    await rq.enqueue(env, QUEUE, "c0", None, concurrency_key="c", tenant="A",
                     available_at_ms=T0 + 20, now_ms=T0)  # fmt: skip
    assert await _tenant_layout(rq, env, "A") == ((3.0, 3.0, "A/c"), False)
    assert "A" in await ready_tenants(rq, env, QUEUE)
    assert await rq.cancel(env, "c0", now_ms=NOW) is CancelOutcome.CANCELLED
    assert await _tenant_layout(rq, env, "A") == (None, True)
    assert await key_floor(rq, env, QUEUE, "A") == 3.0
    assert "A" not in await ready_tenants(rq, env, QUEUE)


async def test_a_one_key_entry_written_as_text_is_served_and_rewritten(
    make_queue: Any, env: Environment
) -> None:
    """An entry of the one-key hash in the text form an older fairq wrote (``floor tag
    key``; B's key floor 5 and its key's tag 7.5) is read as it says: the next serve takes
    the key from 7.5 and writes the entry back in the binary form (key floor 7.5, the
    start tag of the run served; tag 8.5). A tenant with no entry and no key set reads as
    neither."""
    rq = await fair(make_queue)
    for i in range(2):
        await rq.enqueue(env, QUEUE, f"b{i}", None, concurrency_key="b", tenant="B",
                         available_at_ms=T0 + i, now_ms=T0)  # fmt: skip
    q = rq.keys.queue(env, QUEUE)
    encoded = K.encode_tenant("B")
    await rq.client.hset(q.solo_keys, encoded, "5 7.5 " + K.flow_of("b", encoded))  # type: ignore[misc]
    assert await _tenant_layout(rq, env, "B") == ((5.0, 7.5, "B/b"), False)
    batch = await rq.dequeue(1, env=env, queues=[QUEUE], now_ms=NOW)
    assert [d.run_id for d in batch] == ["b0"]
    raw = await rq.client.hget(q.solo_keys, encoded)  # type: ignore[misc]
    assert raw == K.solo_entry(7.5, 8.5, "B/b")
    assert await _tenant_layout(rq, env, "B") == ((7.5, 8.5, "B/b"), False)
    assert await _tenant_layout(rq, env, "C") == (None, False)


async def test_a_key_found_beside_a_lone_key_moves_its_tenant_into_a_key_set(
    make_queue: Any, env: Environment
) -> None:
    """Tenant A has one key registered (its entry in the one-key hash) when a dequeue
    finds a second key of A that an age-order process enqueued (nothing registered it):
    the call moves A into a key set, registers the new key at A's key floor (0) and
    serves both by the key order inside A (equal tags: the older head first)."""
    rq = await fair(make_queue)
    for i in range(5):
        await rq.enqueue(env, QUEUE, f"a{i}", None, concurrency_key="a", tenant="A",
                         available_at_ms=T0 + i, now_ms=T0)  # fmt: skip
    age: RunQueue = await make_queue()
    await age.enqueue(env, QUEUE, "b0", None, concurrency_key="b", tenant="A",
                      available_at_ms=T0 + 50, now_ms=T0)  # fmt: skip
    assert await _tenant_layout(rq, env, "A") == ((0.0, 0.0, "A/a"), False)
    batch = await rq.dequeue(3, env=env, queues=[QUEUE], now_ms=NOW)
    assert [d.run_id for d in batch] == ["a0", "b0", "a1"]
    assert await _tenant_layout(rq, env, "A") == (None, True)
    assert await tenant_keys(rq, env, QUEUE, "A") == {"a": 2.0}  # b drained
    assert await key_floor(rq, env, QUEUE, "A") == 1.0  # a1 began at 1

"""The fair order (order_fair.lua) and its registration hooks, on one queue.

Test names follow the plan's tests 1-13 and 18 (seed 000), then the corrections of
issue 4 item 4, the join policies, weights and serves per key per call. Every test
is Given / When / Then on a real server with explicit clocks.

Ported to the two-level store (notes/migration.md): a key that is its own tenant (the
default) has its tag in V:tt (written when it is served) and its registration copy in
B:tq; the floor is the ``~floor`` member of V:tt = the start tag of the run most
recently begun (tags it passed are pruned on every tick of 8); drained
tenants keep their tag in V:tt (no idle index); keys at a cap are parked (B:park); the
fair order's default serves per key per call is the whole call. Tests that are about
"one serve per variant per call" pin ``max_per_key_per_call=1``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from tests.state import (
    delete_tenant_floor,
    fair_keys,
    key_floor,
    parked,
    ready_tenants,
    s,
    set_tenant_keys,
    tenant_floor,
    tenant_keys,
    tenant_tags,
)

from fairq import keys as K
from fairq.errors import InvalidLimitError
from fairq.keys import Environment
from fairq.models import Delivery
from fairq.server import connect, is_cluster_url
from fairq.store import RunQueue

QUEUE = "jobs"
T0 = 1_000_000
NOW = T0 + 100_000  # every test's dequeue clock: all T0-based heads are ready


async def enq(
    rq: RunQueue, env: Environment, ck: str, run: str, at: int, tenant: str | None = None
) -> None:
    """Enqueue one run on variant ``ck`` whose head score is ``at``."""
    await rq.enqueue(
        env, QUEUE, run, None, concurrency_key=ck, tenant=tenant, available_at_ms=at, now_ms=at
    )


async def deq(
    rq: RunQueue, env: Environment, max_count: int = 10, now: int = NOW
) -> list[Delivery]:
    return await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=max_count, now_ms=now)


async def tags(rq: RunQueue, env: Environment) -> dict[str, float]:
    """The authoritative tenant tags (V:tt): written when a tenant is served."""
    return await tenant_tags(rq, env)


async def copies(rq: RunQueue, env: Environment) -> dict[str, float]:
    """The tenants registered as servable in the queue (B:tq) -> their tag copy."""
    return await ready_tenants(rq, env, QUEUE)


async def floor_of(rq: RunQueue, env: Environment) -> float | None:
    return await tenant_floor(rq, env)


async def set_tags(rq: RunQueue, env: Environment, values: dict[str, float]) -> None:
    """Overwrite tenant tags (the plan's direct seeding, to build exact situations): the
    authoritative V:tt entry and, where registered, the B:tq copy."""
    await rq.client.zadd(rq.keys.env(env).tenant_tags, values)
    await rq.client.zadd(rq.keys.queue(env, QUEUE).ready_tenants, values, xx=True)


async def set_floor(rq: RunQueue, env: Environment, value: float) -> None:
    """Overwrite the floor (the ``~floor`` member of V:tt)."""
    await rq.client.zadd(rq.keys.env(env).tenant_tags, {K.FLOOR_MEMBER: value})


async def fair_queue(make_queue: Any, **vtime: Any) -> RunQueue:
    extra = {k: vtime.pop(k) for k in ("max_per_key_per_call",) if k in vtime}
    rq: RunQueue = await make_queue(vtime={"enabled": True, **vtime}, **extra)
    return rq


def keys_of(batch: list[Delivery]) -> list[str | None]:
    return [d.concurrency_key for d in batch]


# ---------------------------------------------------------------- plan tests 1-13


async def test_vtime_order_beats_head_order(make_queue: Any, env: Environment) -> None:
    """Plan 1. Given 30 old runs on 'heavy' and 3 newer runs on 'light', when serving one
    run per call, the fair order serves light within its first 6 calls while the age
    order drains heavy first; with max_count 10 and max_per_key_per_call 1 (pinned: the
    fair default is now the whole call) each call serves each variant at most once."""
    results: dict[bool, list[str | None]] = {}
    for fair in (False, True):
        rq: RunQueue = await make_queue(vtime={"enabled": fair})
        env_x = Environment("org1", "proj1", "fair" if fair else "age")
        for i in range(30):
            await enq(rq, env_x, "heavy", f"h{i}", T0 + i)
        for i in range(3):
            await enq(rq, env_x, "light", f"l{i}", T0 + 1000 + i)
        order: list[str | None] = []
        for _ in range(33):
            batch = await deq(rq, env_x, max_count=1)
            order += keys_of(batch)
            await rq.ack(batch, now_ms=NOW)
        results[fair] = order
    assert results[True][:6].count("light") == 3
    assert results[False][:30] == ["heavy"] * 30

    rq = await fair_queue(make_queue, max_per_key_per_call=1)
    for i in range(30):
        await enq(rq, env, "heavy", f"h{i}", T0 + i)
    for i in range(3):
        await enq(rq, env, "light", f"l{i}", T0 + 1000 + i)
    light_calls = []
    for call in range(3):
        batch = await deq(rq, env, max_count=10)
        assert max(Counter(keys_of(batch)).values()) == 1
        if "light" in keys_of(batch):
            light_calls.append(call)
        await rq.ack(batch, now_ms=NOW)
    assert light_calls == [0, 1, 2]


async def test_tags_advance_per_serve_within_one_batched_call(
    make_queue: Any, env: Environment
) -> None:
    """Plan 2. Given 5 variants registered at tag 0 with two runs each, one call with
    max_count 5 serves all five and leaves each tag at exactly 1 (advanced inside the
    call). Adapted: registration puts the copy in B:tq; V:tt is written by the serve."""
    rq = await fair_queue(make_queue)
    for i in range(5):
        await enq(rq, env, f"v{i}", f"r{i}a", T0 + i)
        await enq(rq, env, f"v{i}", f"r{i}b", T0 + 10 + i)
    assert await copies(rq, env) == {f"v{i}": 0.0 for i in range(5)}
    assert await tags(rq, env) == {}
    batch = await deq(rq, env, max_count=5)
    assert sorted(keys_of(batch)) == [f"v{i}" for i in range(5)]  # type: ignore[type-var]
    assert await tags(rq, env) == {f"v{i}": 1.0 for i in range(5)}
    assert await copies(rq, env) == {f"v{i}": 1.0 for i in range(5)}


async def test_floor_is_monotonic_and_read_repairs(make_queue: Any, env: Environment) -> None:
    """Plan 3. Given two busy keys, the floor sampled after every call never decreases and
    equals the start tag of the last run served (one below the lowest tag) at the end; with
    the floor key deleted, the next call restores it from the tags (never below the lowest
    tag)."""
    rq = await fair_queue(make_queue)
    for i in range(30):
        await enq(rq, env, "a", f"a{i}", T0 + i)
        await enq(rq, env, "b", f"b{i}", T0 + 100 + i)
    seen: list[float] = []
    for _ in range(20):
        batch = await deq(rq, env, max_count=2)
        await rq.ack(batch, now_ms=NOW)
        seen.append(await floor_of(rq, env) or 0.0)
    assert seen == sorted(seen) and seen[-1] >= 19
    assert seen[-1] == min((await tags(rq, env)).values()) - 1  # floor = last served start tag
    await delete_tenant_floor(rq, env)
    await deq(rq, env, max_count=1)
    assert await floor_of(rq, env) == 20.0  # read-repaired to the lowest stored tag


async def test_new_key_joins_at_the_floor_not_zero_nor_behind_backlog(
    make_queue: Any, env: Environment
) -> None:
    """Plan 4 / 11 (join policy 'floor', the default). Given tags near 20, a fresh key
    enqueued through the normal path gets the floor, is served in the very next call,
    and then carries floor + quantum (not 1)."""
    rq = await fair_queue(make_queue)
    for i in range(40):
        await enq(rq, env, "a", f"a{i}", T0 + i)
        await enq(rq, env, "b", f"b{i}", T0 + 100 + i)
    for _ in range(20):
        await rq.ack(await deq(rq, env, max_count=2), now_ms=NOW)
    floor = await floor_of(rq, env)
    assert floor == 19.0
    await enq(rq, env, "fresh", "f0", T0 + 5000)
    await enq(rq, env, "fresh", "f1", T0 + 5001)
    assert (await copies(rq, env))["fresh"] == floor
    batch = await deq(rq, env, max_count=1)
    assert keys_of(batch) == ["fresh"]
    assert (await tags(rq, env))["fresh"] == floor + 1


async def test_no_service_no_advance_for_a_gated_variant(make_queue: Any, env: Environment) -> None:
    """Plan 5. Given queue concurrency 1 and variant a's slot held, a dequeue skips a
    (its tag unchanged; new design: it stays parked at its cap) and serves the others."""
    rq = await fair_queue(make_queue)
    await rq.set_queue_concurrency(env, QUEUE, 1)
    for i in range(3):
        for ck in ("a", "b", "c"):
            await enq(rq, env, ck, f"{ck}{i}", T0 + i * 10 + ord(ck))
    first = await deq(rq, env, max_count=10)
    assert sorted(keys_of(first)) == ["a", "b", "c"]  # type: ignore[type-var]
    await rq.ack([d for d in first if d.concurrency_key != "a"], now_ms=NOW)
    before = (await tags(rq, env))["a"]
    second = await deq(rq, env, max_count=10)
    assert sorted(keys_of(second)) == ["b", "c"]  # type: ignore[type-var]
    assert (await tags(rq, env))["a"] == before
    assert (await parked(rq, env, QUEUE)).get("t:a") == f"c:{before:g}"
    assert "a" not in await copies(rq, env)


async def test_drained_variant_leaves_both_indexes(make_queue: Any, env: Environment) -> None:
    """Plan 6. A variant served to empty is removed from the CK index and from the
    candidates (B:tq); adapted: its tag stays in V:tt (parked credit, no idle index)."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "once", "o0", T0)
    await enq(rq, env, "other", "x0", T0 + 1)
    await enq(rq, env, "other", "x1", T0 + 2)
    assert keys_of(await deq(rq, env, max_count=2)) == ["once", "other"]
    q = rq.keys.queue(env, QUEUE)
    assert await rq.client.zscore(q.ck_index, "once") is None
    assert "once" not in await copies(rq, env)
    assert "other" in await copies(rq, env)
    assert (await tags(rq, env))["once"] == 1.0


async def test_state_ttls_are_set_and_refreshed(make_queue: Any, env: Environment) -> None:
    """Plan 7. After a dequeue the tag index (V:tt, with the floor) and the candidate
    copies (B:tq) carry a TTL in (0, state_ttl_seconds]; a later write refreshes it.
    Adapted: V:tt's TTL is refreshed when the floor crosses a multiple of 8 (not on every
    call); a registration refreshes B:tq's."""
    rq = await fair_queue(make_queue, state_ttl_seconds=100)
    e, q = rq.keys.env(env), rq.keys.queue(env, QUEUE)
    for i in range(12):
        await enq(rq, env, "a", f"a{i}", T0 + i)
    await enq(rq, env, "b", "b0", T0 + 50)
    await deq(rq, env, max_count=2)  # b drains (its tag stays in V:tt), a advances
    for key in (e.tenant_tags, q.ready_tenants):
        assert 0 < await rq.client.pttl(key) <= 100_000, key
    await rq.client.pexpire(e.tenant_tags, 5_000)
    await deq(rq, env, max_count=1)  # floor 1 -> 2: no tick
    assert await rq.client.pttl(e.tenant_tags) <= 5_000
    for _ in range(8):
        await rq.ack(await deq(rq, env, max_count=1), now_ms=NOW)
    assert await floor_of(rq, env) == 9.0  # crossed 8
    assert await rq.client.pttl(e.tenant_tags) > 5_000
    await rq.client.pexpire(q.ready_tenants, 5_000)
    await enq(rq, env, "c", "c0", T0 + 60)
    assert await rq.client.pttl(q.ready_tenants) > 5_000


async def test_pass2_serves_an_unregistered_variant_and_registers_it(
    make_queue: Any, env: Environment
) -> None:
    """Plan 8. Given a variant whose registration was lost (an age-order enqueue), a
    dequeue still serves it (discovery) and registers it."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "lost", "l0", T0)
    await enq(rq, env, "lost", "l1", T0 + 1)
    await rq.client.zrem(rq.keys.queue(env, QUEUE).ready_tenants, "lost")
    batch = await deq(rq, env, max_count=1)
    assert keys_of(batch) == ["lost"]
    assert (await tags(rq, env))["lost"] == 1.0
    assert (await copies(rq, env))["lost"] == 1.0


async def test_future_scheduled_variant_is_skipped_without_advance(
    make_queue: Any, env: Environment
) -> None:
    """Plan 9. A variant whose head lies in the future is not served and keeps its tag;
    adapted: it is parked until its head is due (then served)."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "later", "f0", NOW + 60_000)
    await enq(rq, env, "now", "n0", T0)
    await enq(rq, env, "now", "n1", T0 + 1)
    batch = await deq(rq, env, max_count=10)
    assert keys_of(batch) == ["now", "now"]
    assert "later" not in await tags(rq, env)  # never served: never advanced
    assert (await parked(rq, env, QUEUE))["t:later"] == "d:0"
    assert await deq(rq, env, max_count=10, now=NOW + 59_999) == []
    assert keys_of(await deq(rq, env, max_count=10, now=NOW + 60_000)) == ["later"]
    assert (await tags(rq, env))["later"] == 2.0  # max(floor 1, its join tag 0) + 1


async def test_enqueue_registers_at_the_current_floor_with_nx(
    make_queue: Any, env: Environment
) -> None:
    """Plan 10. A fresh key registers at the floor (5); enqueueing onto a key whose tag
    is 9 leaves 9 (registration never rewinds)."""
    rq = await fair_queue(make_queue)
    for i in range(20):
        await enq(rq, env, "a", f"a{i}", T0 + i)
        await enq(rq, env, "b", f"b{i}", T0 + 50 + i)
    for _ in range(6):
        await rq.ack(await deq(rq, env, max_count=2), now_ms=NOW)
    floor = await floor_of(rq, env)
    assert floor == 5.0
    await enq(rq, env, "fresh", "f0", T0 + 900)
    assert (await copies(rq, env))["fresh"] == floor
    await set_tags(rq, env, {"a": 9.0})
    await enq(rq, env, "a", "a-late", T0 + 901)
    assert (await copies(rq, env))["a"] == 9.0
    assert (await tags(rq, env))["a"] == 9.0


async def test_enqueue_always_registers_there_is_no_fast_path(
    make_queue: Any, env: Environment
) -> None:
    """Plan 12, adapted: fairq has no direct-to-worker fast path, so even an enqueue onto
    an idle queue with free capacity registers the variant (and nothing else differs)."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "idle", "i0", T0)
    assert await copies(rq, env) == {"idle": 0.0}


async def test_nack_reregisters_a_drained_variant(make_queue: Any, env: Environment) -> None:
    """Plan 13. A variant drained by its only dequeue and then nacked (immediate retry)
    is back in both indexes, at max(floor, its kept tag), and is served again."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "a", "a0", T0)
    (d,) = await deq(rq, env, max_count=10)
    q = rq.keys.queue(env, QUEUE)
    assert await rq.client.zscore(q.ck_index, "a") is None and "a" not in await copies(rq, env)
    await rq.nack(d, retry_at_ms=NOW, now_ms=NOW)
    assert await rq.client.zscore(q.ck_index, "a") is not None
    assert (await copies(rq, env))["a"] == max(await floor_of(rq, env) or 0.0, 1.0) == 1.0
    assert keys_of(await deq(rq, env, max_count=10)) == ["a"]


async def test_flag_off_creates_no_vtime_keys_and_serves_in_head_order(
    make_queue: Any, env: Environment
) -> None:
    """Plan 18. With the flag off, a mixed sequence (enqueues on 3 keys with distinct
    head ages, batched dequeues, a nack, acks) creates no fair-order key (V:tt, V:tfloor,
    B:tq, B:park, B:parkdue, key sets, env tags), and one-per-call dequeues
    follow head order."""
    rq: RunQueue = await make_queue()
    assert not rq.fair
    heads = {"c": T0, "a": T0 + 10, "b": T0 + 20}
    for ck, at in heads.items():
        for i in range(3):
            await enq(rq, env, ck, f"{ck}{i}", at + 100 * i)
    order: list[str | None] = []
    for _ in range(3):
        batch = await deq(rq, env, max_count=1)
        order += keys_of(batch)
        await rq.ack(batch, now_ms=NOW)
    assert order == ["c", "a", "b"]
    batch = await deq(rq, env, max_count=10)
    await rq.nack(batch[0], retry_at_ms=NOW, now_ms=NOW)
    await rq.ack(batch[1:], now_ms=NOW)
    await deq(rq, env, max_count=10)
    assert await fair_keys(rq) == []


# ---------------------------------------------------------------- corrections (item 4)


async def test_drained_key_reenters_at_its_parked_tag_not_the_floor(
    make_queue: Any, env: Environment
) -> None:
    """A key served 10 times in one call (tag 0 -> 10) that drains keeps 10 in V:tt; when
    it returns it comes back at max(floor, 10) (drain-and-re-enter cannot reset credit).
    Adapted: the floor is now the start tag of the last run begun (9, it followed the
    key that was alone), so a newcomer joins at 9 and is served before the returning key
    although the returning key's head is older (at the floor it would go first)."""
    rq = await fair_queue(make_queue, max_per_key_per_call=10)
    for i in range(10):
        await enq(rq, env, "burst", f"b{i}", T0 + i)
    assert len(await deq(rq, env, max_count=10)) == 10
    assert (await tags(rq, env))["burst"] == 10.0
    assert "burst" not in await copies(rq, env)
    assert await floor_of(rq, env) == 9.0
    for i in range(12):
        await enq(rq, env, "steady", f"s{i}", T0 + 100 + i)
    await enq(rq, env, "burst", "b-again", T0 + 50)
    assert await copies(rq, env) == {"burst": 10.0, "steady": 9.0}
    order: list[str | None] = []
    for _ in range(11):
        batch = await deq(rq, env, max_count=1)
        order += keys_of(batch)
        await rq.ack(batch, now_ms=NOW)
    assert order.index("burst") == 1


async def test_gated_or_future_variants_do_not_spend_window_slots(
    make_queue: Any, env: Environment
) -> None:
    """Window 1 (max_count 1, multiplier 1): a gated or future-headed variant with the
    lowest tag does not use up the window; the next-lowest tag ('second') is served,
    not nothing and not the variant with the oldest head ('oldest', the age order's pick).
    New design: the blocker is parked (cap: until a slot frees; future: until due)."""
    for blocker in ("gated", "future"):
        rq = await fair_queue(make_queue, scan_window_multiplier=1)
        e = Environment("org1", "proj1", blocker)
        await rq.set_queue_concurrency(e, QUEUE, 1)
        if blocker == "gated":
            await enq(rq, e, "blocker", "g0", T0 - 10)
            await enq(rq, e, "blocker", "g1", T0 - 9)
            assert keys_of(await deq(rq, e, max_count=1, now=T0 - 10)) == ["blocker"]
        else:
            await enq(rq, e, "blocker", "f0", NOW + 10_000)
        await enq(rq, e, "oldest", "o0", T0)
        await enq(rq, e, "second", "s0", T0 + 50)
        await set_tags(rq, e, {"blocker": 0.0, "second": 1.0, "oldest": 2.0})
        await set_floor(rq, e, 0.0)
        assert keys_of(await deq(rq, e, max_count=1)) == ["second"], blocker
        want = "c:0" if blocker == "gated" else "d:0"
        assert (await parked(rq, e, QUEUE))["t:blocker"] == want, blocker


async def test_cold_start_registers_every_variant_in_the_first_call(
    make_queue: Any, env: Environment
) -> None:
    """Enqueue 40 variants x 3 runs with the flag off, then dequeue with the flag on:
    every variant is first served within 4 calls (not after the first batch's keys
    drain, ~12 calls). Adapted: discovery registers the max(n x window, 3n) = 30 oldest
    ready heads per call, so after the first call those 30 are registered and after the
    second every indexed variant is."""
    off: RunQueue = await make_queue()
    keys = [f"k{i:02d}" for i in range(40)]
    for j in range(3):
        for i, ck in enumerate(keys):
            await enq(off, env, ck, f"{ck}-{j}", T0 + j * 1000 + i)
    # the floor join (admission 'floor'): discovery alone decides when a variant joins
    on = await fair_queue(make_queue, admission="floor")
    q = on.keys.queue(env, QUEUE)
    assert await fair_keys(on) == []
    first_served: dict[str, int] = {}
    for call in range(12):
        batch = await deq(on, env, max_count=10)
        for d in batch:
            first_served.setdefault(d.concurrency_key or "", call)
        registered = set(await copies(on, env)) | set(await tags(on, env))
        if call == 0:
            assert registered == set(keys[:30])
        if call == 1:
            indexed = {s(m) for m in await on.client.zrange(q.ck_index, 0, -1)}
            assert indexed <= registered
        await on.ack(batch, now_ms=NOW)
    assert len(first_served) == 40 and max(first_served.values()) <= 3


async def test_floor_advances_past_a_gated_low_tag(make_queue: Any, env: Environment) -> None:
    """A gated variant stuck at tag 0 does not pin the floor: the floor follows the start
    tags actually served, and a newcomer joins there (not at 0, which would let it take
    many serves in a row ahead of the active keys)."""
    rq = await fair_queue(make_queue, max_per_key_per_call=10, admission="floor")
    await rq.set_queue_concurrency(env, QUEUE, 1)
    await enq(rq, env, "gated", "g0", T0)
    await enq(rq, env, "gated", "g1", T0 + 1)
    await deq(rq, env, max_count=1)  # gated now holds its only slot, tag 1
    await set_tags(rq, env, {"gated": 0.0})
    for i in range(10):
        await enq(rq, env, "a", f"a{i}", T0 + 10 + i)
        await enq(rq, env, "b", f"b{i}", T0 + 20 + i)
    for _ in range(8):
        batch = await deq(rq, env, max_count=10)
        assert "gated" not in keys_of(batch)
        await rq.ack(batch, now_ms=NOW)
    assert (await tags(rq, env))["gated"] == 0.0
    floor = await floor_of(rq, env)
    assert floor == 7.0  # the start tag of the last run begun
    for i in range(5):
        await enq(rq, env, "newcomer", f"n{i}", T0 + 500 + i)
    assert (await copies(rq, env))["newcomer"] == floor
    order = keys_of(await deq(rq, env, max_count=3))
    assert order.count("newcomer") == 1


async def test_equal_tags_go_to_the_longest_waiting_key_not_the_name(
    make_queue: Any, env: Environment
) -> None:
    """Ten attackers 'a0'..'a9' and a light key 'zzz' all at tag 0: the light key's head
    is the oldest, so one-per-call serving takes 'zzz' first although its name sorts last."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "zzz", "z0", T0)
    for i in range(10):
        for j in range(3):
            await enq(rq, env, f"a{i}", f"a{i}-{j}", T0 + 10 + i + 100 * j)
    assert keys_of(await deq(rq, env, max_count=1)) == ["zzz"]


async def test_batch_ties_use_the_current_head_not_the_first(
    make_queue: Any, env: Environment
) -> None:
    """With several serves per key per call, a tie that arises inside the batch goes to
    the key whose *current* head is older: zzz (100, 500) and a (200, 300) serve
    zzz, a, a, zzz (a stale head or the name would give zzz, a, zzz, a); the same at the
    fair order's default (the whole call)."""
    for per_key in (4, None):
        rq = await fair_queue(make_queue, max_per_key_per_call=per_key)
        e = Environment("org1", "proj1", f"pk{per_key}")
        for run, ck, at in (
            ("z1", "zzz", 100), ("z2", "zzz", 500), ("a1", "a", 200), ("a2", "a", 300),
        ):  # fmt: skip
            await enq(rq, e, ck, run, T0 + at)
        assert keys_of(await deq(rq, e, max_count=4)) == ["zzz", "a", "a", "zzz"]


# ---------------------------------------------------------------- join policy


async def test_join_policy_behind_leader_starts_one_quantum_behind_the_leader(
    make_queue: Any, env: Environment
) -> None:
    """'behind_leader' (adapted: it places a key that is new to its *tenant*): in tenant
    acme with key tags a=10 (the leader), b=3 and key floor 3, a brand-new key starts at
    leader + quantum (11), at most arrival_cap above the key floor (cap 2: 5); a tenant
    that drained with a kept tag (7 > floor 3) still returns at max(floor, 7)."""
    for cap, want in ((1000.0, 11.0), (2.0, 5.0)):
        rq = await fair_queue(make_queue, join_policy="behind_leader", arrival_cap=cap)
        e = Environment("org1", "proj1", f"cap{int(cap)}")
        await enq(rq, e, "a", "a0", T0, tenant="acme")
        await enq(rq, e, "b", "b0", T0 + 1, tenant="acme")
        assert await tenant_keys(rq, e, QUEUE, "acme") == {"a": 0.0, "b": 0.0}
        assert await key_floor(rq, e, QUEUE, "acme") == 0.0  # written with the first key
        await set_tenant_keys(rq, e, QUEUE, "acme", {"a": 10.0, "b": 3.0, K.KEY_FLOOR_MEMBER: 3.0})
        await set_floor(rq, e, 3.0)
        await rq.client.zadd(rq.keys.env(e).tenant_tags, {"back": 7.0})
        await enq(rq, e, "fresh", "f0", T0 + 2, tenant="acme")
        await enq(rq, e, "back", "k0", T0 + 3)
        kt = await tenant_keys(rq, e, QUEUE, "acme")
        assert (kt["fresh"], (await copies(rq, e))["back"]) == (want, 7.0), cap


@pytest.mark.parametrize("where", ["queue", "env"])
async def test_join_settings_stored_on_the_server_apply_at_enqueue(
    make_queue: Any, where: str
) -> None:
    """The join policy, arrival cap and quantum set on the server (for the queue, or for
    its environment) decide where an enqueue places a key new to its tenant, over the
    process defaults (floor, quantum 1): leader 10 + quantum 2 = 12, or at most the
    arrival cap 2 above the key floor 3 = 5."""
    for cap, want in ((1000.0, 12.0), (2.0, 5.0)):
        rq = await fair_queue(make_queue)
        e = Environment("org1", "proj1", f"{where}{int(cap)}")
        settings = {"join": "behind_leader", "arrival_cap": cap, "quantum": 2.0}
        if where == "queue":
            await rq.set_queue_options(e, QUEUE, **settings)
        else:
            await rq.set_env_options(e, **settings)
        await enq(rq, e, "a", "a0", T0, tenant="acme")
        await enq(rq, e, "b", "b0", T0 + 1, tenant="acme")
        await set_tenant_keys(rq, e, QUEUE, "acme", {"a": 10.0, "b": 3.0, K.KEY_FLOOR_MEMBER: 3.0})
        await set_floor(rq, e, 3.0)
        await enq(rq, e, "fresh", "f0", T0 + 2, tenant="acme")
        assert (await tenant_keys(rq, e, QUEUE, "acme"))["fresh"] == want, (where, cap)


@pytest.mark.parametrize("via", ["enqueue", "dequeue"])
async def test_a_key_set_with_its_floor_under_the_old_member_moves_it(
    make_queue: Any, env: Environment, via: str
) -> None:
    """A key set written before the key floor's member was renamed holds its floor 5 as
    ``~floor`` (keys a 10, b 3 with two runs). The first script that needs the floor moves it to
    ``!floor`` and uses it: a new key joins at 5, not at the lowest tag 3; a serve of b
    starts it at 5 (tag 6 after), and ``~floor`` is never served as a key."""
    rq = await fair_queue(make_queue)
    await enq(rq, env, "a", "a0", T0, tenant="acme")
    await enq(rq, env, "b", "b0", T0 + 1, tenant="acme")
    await enq(rq, env, "b", "b1", T0 + 2, tenant="acme")
    kk = rq.keys.queue(env, QUEUE).tenant_keys(K.encode_tenant("acme"))
    await rq.client.zrem(kk, K.KEY_FLOOR_MEMBER)
    await set_tenant_keys(rq, env, QUEUE, "acme", {"a": 10.0, "b": 3.0, K.FLOOR_MEMBER: 5.0})
    if via == "enqueue":
        await enq(rq, env, "fresh", "f0", T0 + 3, tenant="acme")
        want = {"a": 10.0, "b": 3.0, "fresh": 5.0}
    else:
        assert keys_of(await deq(rq, env, max_count=1)) == ["b"]
        want = {"a": 10.0, "b": 6.0}
    members = {s(m) for m in await rq.client.zrange(kk, 0, -1)}
    assert K.FLOOR_MEMBER not in members
    assert await tenant_keys(rq, env, QUEUE, "acme") == want
    assert await key_floor(rq, env, QUEUE, "acme") == 5.0


async def test_join_policy_floor_is_the_default(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    assert rq.config.vtime.join_policy == "floor"


# ---------------------------------------------------------------- weights


@pytest.mark.parametrize(("max_count", "max_per_key"), [(1, 1), (7, 10), (7, None)])
async def test_weights_1_2_4_give_shares_1_2_4_sevenths(
    make_queue: Any, env: Environment, max_count: int, max_per_key: int | None
) -> None:
    """Under saturation (every key always backlogged), key weights 1:2:4 (each key its
    own tenant) give served shares within +-5% of 1/7 : 2/7 : 4/7."""
    rq = await fair_queue(make_queue, max_per_key_per_call=max_per_key)
    weights = {"w1": 1.0, "w2": 2.0, "w4": 4.0}
    for ck, w in weights.items():
        await rq.set_concurrency_key_weight(env, QUEUE, ck, w)
        for i in range(250):
            await enq(rq, env, ck, f"{ck}-{i}", T0 + i)
    served: Counter[str] = Counter()
    while sum(served.values()) < 350:
        batch = await deq(rq, env, max_count=max_count)
        served.update(d.concurrency_key for d in batch if d.concurrency_key)
        await rq.ack(batch, now_ms=NOW)
    total = sum(served.values())
    for ck, w in weights.items():
        assert served[ck] / total == pytest.approx(w / 7, abs=0.05), served


@pytest.mark.parametrize("weight", [0, -1, 0.0001, 1001, float("inf"), float("nan"), True, "2"])
async def test_weight_must_be_positive_and_bounded(
    make_queue: Any, env: Environment, weight: Any
) -> None:
    rq = await fair_queue(make_queue)
    with pytest.raises(InvalidLimitError):
        await rq.set_concurrency_key_weight(env, QUEUE, "k", weight)


async def test_weight_none_resets_to_one(make_queue: Any, env: Environment) -> None:
    rq = await fair_queue(make_queue)
    q = rq.keys.queue(env, QUEUE)
    await rq.set_concurrency_key_weight(env, QUEUE, "k", 3)
    assert await rq.client.hget(q.key_weights, "k") == b"3.0"
    await rq.set_concurrency_key_weight(env, QUEUE, "k", None)
    assert await rq.client.hget(q.key_weights, "k") is None


# ---------------------------------------------------------------- serves per key per call


@pytest.mark.parametrize(("fair", "want"), [(False, 1), (True, 10)])
async def test_default_serves_per_variant_per_call(
    make_queue: Any, env: Environment, fair: bool, want: int
) -> None:
    """The default serves per key per call: 1 in the age order; adapted: the whole call
    in the fair order (it interleaves keys by itself); pinning 1 restores one."""
    rq: RunQueue = await make_queue(vtime={"enabled": fair})
    for i in range(20):
        await enq(rq, env, "only", f"o{i}", T0 + i)
    assert len(await deq(rq, env, max_count=10)) == want
    pinned = await fair_queue(make_queue, max_per_key_per_call=1)
    e = Environment("org1", "proj1", "pinned")
    for i in range(20):
        await enq(pinned, e, "only", f"o{i}", T0 + i)
    assert len(await deq(pinned, e, max_count=10)) == 1


async def test_several_serves_per_call_follow_tag_order(make_queue: Any, env: Environment) -> None:
    """max_per_key_per_call 10: one call serves a key several times, in pure SFQ order:
    with weights 1 (x) and 3 (y) the served start tags never decrease and y takes 3 of
    every 4 serves."""
    rq = await fair_queue(make_queue, max_per_key_per_call=10)
    await rq.set_concurrency_key_weight(env, QUEUE, "y", 3)
    for i in range(10):
        await enq(rq, env, "x", f"x{i}", T0 + i)
        await enq(rq, env, "y", f"y{i}", T0 + 100 + i)
    batch = await deq(rq, env, max_count=8)
    order = keys_of(batch)
    assert order.count("x") == 2 and order.count("y") == 6
    tag = {"x": 0.0, "y": 0.0}
    starts = []
    for ck in order:
        assert ck is not None
        starts.append(tag[ck])
        tag[ck] += 1.0 if ck == "x" else 1 / 3
    assert starts == sorted(starts)
    assert await tags(rq, env) == pytest.approx(tag)


async def test_several_serves_per_call_in_age_mode_follow_head_order(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(max_per_key_per_call=10)
    for i in range(3):
        await enq(rq, env, "a", f"a{i}", T0 + 2 * i)
        await enq(rq, env, "b", f"b{i}", T0 + 2 * i + 1)
    batch = await deq(rq, env, max_count=10)
    assert [d.run_id for d in batch] == ["a0", "b0", "a1", "b1", "a2", "b2"]


@pytest.mark.parametrize("tenants", [1, 2])
async def test_a_tenant_with_many_keys_serves_them_round_robin_within_one_call(
    make_queue: Any, env: Environment, tenants: int
) -> None:
    """40 keys per tenant, 3 runs each, the runs of key k due at T0 + 2k, + 100 + 2k and
    + 200 + 2k; one call of 100: every key of a tenant is served once (in head order:
    equal tags go to the longest-waiting head) before any is served twice, and with two
    tenants they alternate run by run. The key set is read a few entries at a time, and
    a key just served goes back in its place behind the others."""
    rq = await fair_queue(make_queue)
    names = [f"t{t}" for t in range(tenants)]
    for r in range(3):
        for t, name in enumerate(names):
            for k in range(40):
                at = T0 + 100 * r + 2 * k + t
                await enq(rq, env, f"k{k:02}", f"{name}-{r}-{k:02}", at, tenant=name)
    batch = await deq(rq, env, max_count=100)
    assert len(batch) == 100
    for name in names:
        mine = [d.run_id for d in batch if d.tenant == name]
        assert mine == [f"{name}-{r}-{k:02}" for r in range(3) for k in range(40)][: 100 // tenants]
    if tenants == 2:
        assert [d.tenant for d in batch] == names * 50


@pytest.mark.parametrize("fair", [False, True])
async def test_per_key_gate_applies_per_serve(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    """Queue concurrency 2 with 10 serves allowed per key: one call takes exactly 2."""
    rq: RunQueue = await make_queue(vtime={"enabled": fair}, max_per_key_per_call=10)
    await rq.set_queue_concurrency(env, QUEUE, 2)
    for i in range(10):
        await enq(rq, env, "k", f"k{i}", T0 + i)
    assert len(await deq(rq, env, max_count=10)) == 2
    assert await deq(rq, env, max_count=10) == []


# ---------------------------------------------------------------- the sets' encoding


async def encoding(rq: RunQueue, key: str) -> str:
    return s(await rq.client.object("encoding", key))


async def test_sets_of_many_tenants_become_skiplists_on_a_tick_and_small_ones_stay_lists(
    make_queue: Any,
) -> None:
    """A server keeps a sorted set of up to 128 members as a compact list, where a tag's
    update scans the members before it. On a tick (the floor crossing a multiple of 8) a
    serve converts V:tt, the B:tq copies and the key sets it wrote that hold 32 members or
    more, and leaves no member behind. Given the floor at 7.5, 40 keys serving as their
    own tenants (3 runs each): 5 calls of 10 serve everyone at 7.5 and then start the
    second round at 8.5 (a tick); so does 1 call for 5 keys in another environment. A
    tenant of 40 keys (2 runs each) is alone in a third environment: its 10th serve
    starts at 9 (a tick)."""
    rq = await fair_queue(make_queue)
    big, small, one = (Environment("org1", "proj1", n) for n in ("big", "small", "one"))
    for e, n, calls in ((big, 40, 5), (small, 5, 1)):
        for i in range(n):
            for r in range(3):
                await enq(rq, e, f"k{i}", f"r{i}-{r}", T0 + 3 * i + r)
        await set_floor(rq, e, 7.5)
        for _ in range(calls):
            assert len(await deq(rq, e)) == 10
    for i in range(40):
        for r in range(2):
            await enq(rq, one, f"k{i}", f"r{i}-{r}", T0 + 2 * i + r, tenant="acme")
    assert len(await deq(rq, one)) == 10
    kk = rq.keys.queue(one, QUEUE).tenant_keys(K.encode_tenant("acme"))
    assert await encoding(rq, kk) == "skiplist"
    assert len(await tenant_keys(rq, one, QUEUE, "acme")) == 40
    for e, want, n in ((big, "skiplist", 40), (small, "listpack", 5)):
        env_tt, tq = rq.keys.env(e).tenant_tags, rq.keys.queue(e, QUEUE).ready_tenants
        assert (await encoding(rq, env_tt), await encoding(rq, tq)) == (want, want), e
        assert (len(await tags(rq, e)), len(await copies(rq, e))) == (n, n), e
        assert await floor_of(rq, e) == 8.5
    for key in (kk, rq.keys.env(big).tenant_tags):
        assert all(not s(m).startswith("~wide") for m in await rq.client.zrange(key, 0, -1))


async def test_a_server_refusing_object_serves_the_same_and_leaves_sets_as_lists(
    make_queue: Any, redis_url: str
) -> None:
    """The conversion asks the server for a set's encoding (OBJECT); a user whose ACL
    refuses that command dequeues as before (the same 10 runs per call, the floor at 8.5
    after the tick), and the 40 tenants' sets stay compact lists."""
    if is_cluster_url(redis_url):
        pytest.skip("one server's ACL")
    admin = await fair_queue(make_queue)
    user = f"noobject-{admin.config.prefix}"
    await admin.client.acl_setuser(
        user, enabled=True, nopass=True, categories=["+@all"], commands=["-object"],
        keys=["*"], channels=["*"],
    )  # fmt: skip
    scheme, rest = redis_url.split("://", 1)
    rq = RunQueue(await connect(f"{scheme}://{user}:x@{rest.split('@')[-1]}"), admin.config)
    try:
        e = Environment("org1", "proj1", "acl")
        for i in range(40):
            for r in range(3):
                await enq(rq, e, f"k{i}", f"r{i}-{r}", T0 + 3 * i + r)
        await set_floor(rq, e, 7.5)
        for _ in range(5):
            assert len(await deq(rq, e)) == 10
        assert await floor_of(rq, e) == 8.5
        env_tt, tq = rq.keys.env(e).tenant_tags, rq.keys.queue(e, QUEUE).ready_tenants
        assert (await encoding(admin, env_tt), await encoding(admin, tq)) == ("listpack",) * 2
    finally:
        await rq.close()
        await admin.client.acl_deluser(user)

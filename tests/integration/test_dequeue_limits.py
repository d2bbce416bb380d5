"""Dequeue gates: env limit (with burst), queue limit (0 = paused), per-variant
min(queue limit, env limit), and removing limits."""

from __future__ import annotations

from typing import Any

import pytest
from tests.state import heads, run_state

from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue
from fairq.store.options import ENV_OPTIONS, QUEUE_OPTIONS

T0 = 1_700_000_000_000


async def drain(rq: RunQueue, *, now: int = T0 + 1_000, rounds: int = 30) -> list[Delivery]:
    """Dequeue until a call returns nothing (leases are never released here)."""
    out: list[Delivery] = []
    for _ in range(rounds):
        batch = await rq.dequeue(10, now_ms=now)
        if not batch:
            break
        out += batch
    return out


# --------------------------------------------------------------------------- env limit


async def test_a_plain_dequeue_leases_a_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    (d,) = await rq.dequeue(10, now_ms=T0)
    assert d.run_id == "r1"
    assert (await rq.queue_stats(env, "q")).running == 1
    assert (await rq.env_stats(env)).running == 1
    assert await run_state(rq, env, "r1") == "running"


async def test_env_limit_blocks_a_second_run(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=1)
    await rq.enqueue(env, "a", "r1", now_ms=T0)
    await rq.enqueue(env, "b", "r2", now_ms=T0 + 1)

    got = await drain(rq)

    assert [d.run_id for d in got] == ["r1"]
    assert (await rq.queue_stats(env, "b")).queued == 1


async def test_env_limit_caps_a_batch(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=3)
    for i in range(10):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0 + i)
    assert [d.run_id for d in await rq.dequeue(10, now_ms=T0 + 10)] == ["r0", "r1", "r2"]
    assert await rq.dequeue(10, now_ms=T0 + 10) == []


async def test_default_env_limit_applies_without_a_setting(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(default_env_concurrency=2)
    for i in range(5):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0)
    assert len(await drain(rq)) == 2
    assert (await rq.env_stats(env)).concurrency_limit == 2


async def test_envs_have_independent_limits(make_queue: Any) -> None:
    rq: RunQueue = await make_queue(default_env_concurrency=1)
    a, b = Environment("o", "p", "a"), Environment("o", "p", "b")
    for e in (a, b):
        for i in range(3):
            await rq.enqueue(e, "q", f"r{i}", now_ms=T0)
    got = await drain(rq)
    assert sorted(d.env for d in got) == [a, b]


# --------------------------------------------------------------------------- burst


async def test_burst_lets_a_second_run_through_on_another_queue(
    make_queue: Any, env: Environment
) -> None:
    """Limit 1 x burst 2: a 2nd run on another queue, not a 3rd, not a 2nd on the same queue."""
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=1, burst_factor=2.0)
    await rq.enqueue(env, "a", "a1", now_ms=T0)
    await rq.enqueue(env, "a", "a2", now_ms=T0 + 1)
    await rq.enqueue(env, "b", "b1", now_ms=T0 + 2)
    await rq.enqueue(env, "c", "c1", now_ms=T0 + 3)

    got = await drain(rq)

    assert len(got) == 2
    assert len({d.queue for d in got}) == 2  # never two on the same queue
    assert (await rq.env_stats(env)).running == 2
    # the same queue alone: only one, even with burst room left
    stats = {q: await rq.queue_stats(env, q) for q in ("a", "b", "c")}
    assert all(s.running <= 1 for s in stats.values())
    assert sum(s.queued for s in stats.values()) == 2


async def test_burst_does_not_raise_a_single_queues_cap(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=1, burst_factor=2.0)
    await rq.enqueue(env, "a", "a1", now_ms=T0)
    await rq.enqueue(env, "a", "a2", now_ms=T0 + 1)
    assert [d.run_id for d in await drain(rq)] == ["a1"]


async def test_burst_third_queue_is_refused(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=1, burst_factor=2.0)
    for i, q in enumerate(["a", "b", "c"]):
        await rq.enqueue(env, q, f"{q}1", now_ms=T0 + i)
    first = await rq.dequeue(1, now_ms=T0 + 10)
    second = await rq.dequeue(1, now_ms=T0 + 10)
    third = await rq.dequeue(1, now_ms=T0 + 10)
    assert len(first) == len(second) == 1
    assert third == []


async def test_fractional_burst_floors(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=3, burst_factor=1.5)  # floor(4.5) = 4
    for q in "abcdef":
        await rq.enqueue(env, q, f"{q}1", now_ms=T0)
    assert len(await drain(rq)) == 4


# --------------------------------------------------------------------------- queue limit


async def test_queue_limit_one(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "a", 1)
    await rq.enqueue(env, "a", "a1", now_ms=T0)
    await rq.enqueue(env, "a", "a2", now_ms=T0 + 1)
    await rq.enqueue(env, "b", "b1", now_ms=T0 + 2)
    await rq.enqueue(env, "b", "b2", now_ms=T0 + 3)

    got = await drain(rq)

    assert sorted(d.run_id for d in got) == ["a1", "b1", "b2"]
    stats = await rq.queue_stats(env, "a")
    assert (stats.queued, stats.running, stats.concurrency_limit) == (1, 1, 1)


async def test_queue_limit_caps_a_batch(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 4)
    for i in range(10):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0 + i)
    assert len(await rq.dequeue(10, now_ms=T0 + 10)) == 4
    assert await rq.dequeue(10, now_ms=T0 + 10) == []


async def test_queue_limit_is_capped_by_the_env_limit(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=2, burst_factor=3.0)
    await rq.set_queue_concurrency(env, "q", 10)
    for i in range(10):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0)
    assert len(await drain(rq)) == 2  # min(10, 2), burst does not apply per queue


async def test_paused_queue_serves_nothing_until_resumed(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key="k", now_ms=T0)
    await rq.enqueue(env, "other", "o1", now_ms=T0)
    await rq.pause_queue(env, "q")

    got = await drain(rq)

    assert [d.run_id for d in got] == ["o1"]
    stats = await rq.queue_stats(env, "q")
    assert stats.paused and stats.queued == 2 and stats.running == 0

    await rq.resume_queue(env, "q")
    assert sorted(d.run_id for d in await drain(rq)) == ["r1", "r2"]
    assert not (await rq.queue_stats(env, "q")).paused


async def test_pausing_keeps_runs_already_leased(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    await rq.enqueue(env, "q", "r2", now_ms=T0 + 1)
    (d,) = await rq.dequeue(1, now_ms=T0 + 1)
    await rq.pause_queue(env, "q")
    assert await drain(rq) == []
    assert await run_state(rq, env, d.run_id) == "running"


# --------------------------------------------------------------------------- per variant


async def test_queue_limit_applies_to_each_concurrency_key(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    for ck in ("a", "b", "c"):
        for i in range(3):
            await rq.enqueue(env, "q", f"{ck}{i}", concurrency_key=ck, now_ms=T0 + i)

    got = await drain(rq)

    assert sorted(d.run_id for d in got) == ["a0", "b0", "c0"]  # one per variant, no aggregate
    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert (stats.queued, stats.running) == (6, 3)
    assert {v.concurrency_key: v.running for v in stats.variants} == {"a": 1, "b": 1, "c": 1}


async def test_variant_gate_is_min_of_queue_and_env_limit(
    make_queue: Any, env: Environment
) -> None:
    """Env limit 2 x burst 3 = 6 in total, but each variant is capped at min(unlimited, 2)."""
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=2, burst_factor=3.0)
    for ck in ("a", "b", "c", "d"):
        for i in range(5):
            await rq.enqueue(env, "q", f"{ck}{i}", concurrency_key=ck, now_ms=T0 + i)

    got = await drain(rq)

    per_key: dict[str | None, int] = {}
    for d in got:
        per_key[d.concurrency_key] = per_key.get(d.concurrency_key, 0) + 1
    assert len(got) == 6
    assert all(n <= 2 for n in per_key.values())
    assert (await rq.env_stats(env)).running == 6


async def test_variant_gate_uses_the_smaller_queue_limit(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=5)
    await rq.set_queue_concurrency(env, "q", 2)
    for i in range(6):
        await rq.enqueue(env, "q", f"a{i}", concurrency_key="a", now_ms=T0 + i)
    assert len(await drain(rq)) == 2


async def test_one_dequeue_serves_at_most_one_run_per_variant(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    for i in range(5):
        await rq.enqueue(env, "q", f"a{i}", concurrency_key="a", now_ms=T0 + i)
        await rq.enqueue(env, "q", f"b{i}", concurrency_key="b", now_ms=T0 + i)
    got = await rq.dequeue(10, now_ms=T0 + 10)
    assert sorted(d.run_id for d in got) == ["a0", "b0"]


async def test_max_per_key_per_call_raises_the_per_variant_batch(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(max_per_key_per_call=3)
    for i in range(5):
        await rq.enqueue(env, "q", f"a{i}", concurrency_key="a", now_ms=T0 + i)
    got = await rq.dequeue(10, now_ms=T0 + 10)
    assert [d.run_id for d in got] == ["a0", "a1", "a2"]


# --------------------------------------------------------------------------- removal


async def test_removing_the_queue_limit_unblocks(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    for i in range(3):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0 + i)
    assert len(await drain(rq)) == 1
    await rq.set_queue_concurrency(env, "q", None)
    assert len(await drain(rq)) == 2
    assert (await rq.queue_stats(env, "q")).concurrency_limit is None


async def test_removing_env_limits_restores_the_defaults(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(default_env_concurrency=3)
    await rq.set_env_limits(env, concurrency=1, burst_factor=2.0)
    for i in range(5):
        await rq.enqueue(env, "q", f"r{i}", now_ms=T0 + i)
    assert len(await drain(rq)) == 1
    await rq.remove_env_limits(env)
    assert len(await drain(rq)) == 2  # default 3 in total
    stats = await rq.env_stats(env)
    assert (stats.concurrency_limit, stats.burst_factor, stats.running) == (3, 1.0, 3)


async def test_env_limit_zero_stops_the_env(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=0)
    await rq.enqueue(env, "q", "r1", now_ms=T0)
    assert await drain(rq) == []


@pytest.mark.parametrize("keyed", [False, True])
async def test_at_limit_queue_keeps_its_master_entry(
    make_queue: Any, env: Environment, keyed: bool
) -> None:
    """A gated queue is not forgotten: once a slot frees, it is served again."""
    rq: RunQueue = await make_queue()
    await rq.set_queue_concurrency(env, "q", 1)
    ck = "k" if keyed else None
    await rq.enqueue(env, "q", "r1", concurrency_key=ck, now_ms=T0)
    await rq.enqueue(env, "q", "r2", concurrency_key=ck, now_ms=T0 + 1)
    (d,) = await drain(rq)
    assert await drain(rq) == []
    assert min((await heads(rq, env)).values()) == T0 + 1
    await rq.ack([d])
    assert [x.run_id for x in await drain(rq)] == ["r2"]


# --------------------------------------------------------------------------- overrides, rates


@pytest.mark.parametrize("fair", [False, True], ids=["age", "fair"])
async def test_a_key_cap_above_the_per_key_limit_raises_that_keys_room(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    rq: RunQueue = await make_queue(max_per_key_per_call=10, vtime={"enabled": fair})
    await rq.set_queue_concurrency(env, "q", 2)
    await rq.set_key_concurrency(env, "q", "big", 5)
    await rq.set_key_concurrency(env, "q", "small", 1)
    for k in ("big", "small"):
        for i in range(6):
            await rq.enqueue(env, "q", f"{k}{i}", concurrency_key=k, now_ms=T0 + i)

    got = sorted(d.run_id for d in await drain(rq))

    assert got == ["big0", "big1", "big2", "big3", "big4", "small0"]


@pytest.mark.parametrize("fair", [False, True], ids=["age", "fair"])
async def test_a_rate_limited_key_reports_the_wait_to_its_next_token(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    rq: RunQueue = await make_queue(vtime={"enabled": fair})
    await rq.set_rate_limit(env, "q", 0.5, burst=1, key="k")  # one run per 2 s
    for i in range(3):
        await rq.enqueue(env, "q", f"r{i}", concurrency_key="k", now_ms=T0 - 10)

    seen = []
    for at in (0, 0, 100, 1999, 2000, 2100):
        batch = await rq.dequeue_batch(5, env=env, queues=["q"], now_ms=T0 + at)
        seen.append(([d.run_id for d in batch.deliveries], batch.wait_ms))

    assert seen == [
        (["r0"], 2000 if fair else None),
        ([], 2000),
        ([], 1900),
        ([], 1),
        (["r1"], 2000 if fair else None),
        ([], 1900),
    ]


async def test_dequeue_variant_honours_rates_and_counts_the_named_tenant(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_rate_limit(env, "q", 0.5, burst=1, key="k")
    await rq.set_tenant_concurrency(env, "q", "acme", 1)
    for i in range(3):
        await rq.enqueue(env, "q", f"r{i}", concurrency_key="k", now_ms=T0 - 10)
        await rq.enqueue(env, "q", f"a{i}", concurrency_key=f"u{i}", tenant="acme", now_ms=T0 - 10)

    by_rate = [
        [d.run_id for d in await rq.dequeue_variant(env, "q", "k", now_ms=T0)] for _ in "xyz"
    ]
    by_tenant = [
        [
            (d.run_id, d.tenant)
            for d in await rq.dequeue_variant(env, "q", f"u{i}", tenant="acme", now_ms=T0)
        ]
        for i in range(3)
    ]

    assert by_rate == [["r0"], [], []]
    assert by_tenant == [[("a0", "acme")], [], []]
    served = (await rq.history(env, "q", window_ms=10_000, now_ms=T0))[-1].by_tenant
    assert served == {"k": 1, "acme": 1}


# --------------------------------------------------------------------------- config read


@pytest.mark.parametrize("others", [0, 7], ids=["few fields", "more fields than the call names"])
async def test_a_queues_options_hold_however_many_fields_its_config_has(
    make_queue: Any, env: Environment, others: int
) -> None:
    """A dequeue reads the whole config hash when it holds fewer fields than the call
    would name, else the listed queues' fields: both give the same limits."""
    rq: RunQueue = await make_queue()
    await rq.set_env_limits(env, concurrency=3)
    await rq.set_queue_concurrency(env, "q", 1)
    await rq.set_queue_options(env, "p", paused=True)
    for i in range(others):  # other queues' options, none of them listed by the dequeue
        await rq.set_queue_options(
            env, f"o{i}", concurrency=5, max_size=50, total=9, rate=2.0, rate_burst=3,
            key_rate=1.0, key_rate_burst=2, tenant_rate=1.0, tenant_rate_burst=2, borrow=True,
        )  # fmt: skip
    fields = await rq.client.hlen(rq.keys.env(env).config)
    named = len(ENV_OPTIONS) + 2 * len(QUEUE_OPTIONS)  # the fields of a call listing q and p
    assert (fields >= named) == (others > 0)
    for i in range(3):
        await rq.enqueue(env, "q", f"q{i}", now_ms=T0 + i)
        await rq.enqueue(env, "p", f"p{i}", now_ms=T0 + i)

    got = await rq.dequeue(10, env=env, queues=["q", "p"], now_ms=T0 + 10)

    assert [d.run_id for d in got] == ["q0"]  # q's limit of 1; p is paused
    await rq.set_queue_concurrency(env, "q", None)
    got = await rq.dequeue(10, env=env, queues=["q", "p"], now_ms=T0 + 10)
    assert [d.run_id for d in got] == ["q1", "q2"]  # the env's limit of 3

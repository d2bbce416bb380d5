"""The Lua fair order against the pure-Python reference model (tests/sfq_model.py),
and the membership closure invariant, on seeded random workloads."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from tests.sfq_model import SfqModel

from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue

QUEUE = "jobs"
T0 = 1_000_000


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def _vt_state(
    rq: RunQueue, env: Environment
) -> tuple[dict[str, float], float | None, dict[str, float]]:
    q = rq.keys.queue(env, QUEUE)
    vtime = {_s(m): float(s) for m, s in await rq.client.zrange(q.vtime, 0, -1, withscores=True)}
    floor_raw = await rq.client.get(q.vtime_floor)
    idle = {
        _s(m): float(s) for m, s in await rq.client.zrange(q.vtime_idle, 0, -1, withscores=True)
    }
    return vtime, None if floor_raw is None else float(floor_raw), idle


async def _run_workload(
    rq: RunQueue,
    env: Environment,
    model: SfqModel,
    rng: random.Random,
    steps: int,
    *,
    keys: list[str],
    weights: bool,
    compare_state: bool,
    after_step: Callable[[], Any] | None = None,
) -> int:
    """Drive the same random operations through Lua and the model; returns serves."""
    now = T0
    inflight: dict[str, Delivery] = {}
    counter = 0
    served_total = 0
    for _step in range(steps):
        now += rng.randint(1, 5)
        op = rng.random()
        if op < 0.38:
            for _ in range(rng.randint(1, 4)):
                ck = rng.choice(keys)
                run = f"r{counter}"
                counter += 1
                # mostly past heads with distinct ages, sometimes in the future
                score = (
                    now - rng.randint(0, 500) if rng.random() < 0.9 else now + rng.randint(1, 30)
                )
                await rq.enqueue(env, QUEUE, run, None, concurrency_key=ck,
                                 available_at_ms=score, now_ms=now)  # fmt: skip
                model.enqueue(ck, run, score)
        elif op < 0.75:
            max_count = rng.randint(1, 10)
            got = await rq.dequeue_from_queue(
                env, QUEUE, keyed=True, max_count=max_count, now_ms=now
            )
            expect = model.dequeue(max_count, now)
            assert [(d.run_id, d.concurrency_key) for d in got] == expect, f"step {_step}"
            for d in got:
                inflight[d.run_id] = d
            served_total += len(got)
        elif op < 0.92 and inflight:
            for run in rng.sample(sorted(inflight), k=min(len(inflight), rng.randint(1, 5))):
                await rq.ack([inflight.pop(run)], now_ms=now)
                model.ack(run)
        elif op < 0.97 and inflight:
            run = rng.choice(sorted(inflight))
            retry_at = now if rng.random() < 0.6 else now + rng.randint(1, 20)
            await rq.nack(inflight.pop(run), retry_at_ms=retry_at, now_ms=now)
            model.nack(run, retry_at)
        elif weights:
            ck = rng.choice(keys)
            w = rng.choice([0.5, 1.0, 2.0, 3.0, 4.0])
            await rq.set_concurrency_key_weight(env, QUEUE, ck, w)
            model.set_weight(ck, w)
        if compare_state:
            vtime, floor, idle = await _vt_state(rq, env)
            assert vtime == pytest.approx(model.vtime), f"vtime differs at step {_step}"
            assert floor == model.floor, f"floor differs at step {_step}"
            assert idle == pytest.approx(model.vidle), f"vidle differs at step {_step}"
        if after_step is not None:
            await after_step()
    return served_total


@pytest.mark.parametrize(
    ("seed", "options"),
    [
        (1, {}),
        (2, {"max_per_key": 3}),
        (3, {"join_policy": "behind_leader", "arrival_cap": 4.0}),
        (4, {"window_multiplier": 1, "queue_limit": 2}),
        (5, {"quantum": 0.5, "max_per_key": 10}),
        (6, {"env_limit": 6, "queue_limit": 3}),
    ],
)
async def test_lua_fair_order_matches_reference_model(
    make_queue: Any, env: Environment, seed: int, options: dict[str, Any]
) -> None:
    """Given random enqueue/dequeue/ack/nack/weight workloads, the fair-order Lua serves
    exactly the model's order and leaves exactly the model's tags, floor and parked tags."""
    env_limit = options.get("env_limit", 12)
    queue_limit = options.get("queue_limit")
    vt = {
        "enabled": True,
        "quantum": options.get("quantum", 1.0),
        "scan_window_multiplier": options.get("window_multiplier", 3),
        "join_policy": options.get("join_policy", "floor"),
        "arrival_cap": options.get("arrival_cap", 2.0**32),
    }
    rq = await make_queue(vtime=vt, max_per_key_per_call=options.get("max_per_key", 1))
    await rq.set_env_limits(env, concurrency=env_limit)
    if queue_limit is not None:
        await rq.set_queue_concurrency(env, QUEUE, queue_limit)
    model = SfqModel(
        mode="fair", env_limit=env_limit, queue_limit=queue_limit, quantum=vt["quantum"],
        window_multiplier=vt["scan_window_multiplier"], join_policy=vt["join_policy"],
        arrival_cap=vt["arrival_cap"], max_per_key=options.get("max_per_key", 1),
    )  # fmt: skip
    keys = [f"k{i}" for i in range(9)] + ["zzz", "a"]
    served = await _run_workload(
        rq, env, model, random.Random(seed), 220, keys=keys, weights=True, compare_state=True
    )
    assert served > 100


@pytest.mark.parametrize("max_per_key", [1, 4])
async def test_lua_age_order_matches_reference_model(
    make_queue: Any, env: Environment, max_per_key: int
) -> None:
    """The model's age order is the flag-off script's order (so scenario figures of the
    model and of the real path mean the same thing)."""
    rq = await make_queue(max_per_key_per_call=max_per_key)
    await rq.set_env_limits(env, concurrency=8)
    model = SfqModel(mode="age", env_limit=8, max_per_key=max_per_key)
    keys = [f"k{i}" for i in range(7)]
    served = await _run_workload(
        rq, env, model, random.Random(11 + max_per_key), 200, keys=keys, weights=False,
        compare_state=False,
    )  # fmt: skip
    assert served > 80


async def test_ckindex_members_always_registered_in_vtime(
    make_queue: Any, env: Environment
) -> None:
    """Membership closure: after every one of >= 200 random operations (enqueue, batched
    dequeue, ack, nack with and without backoff) every variant in the CK index has a tag
    in the virtual-time index."""
    rq = await make_queue(vtime={"enabled": True})
    await rq.set_env_limits(env, concurrency=6)
    q = rq.keys.queue(env, QUEUE)
    model = SfqModel(mode="fair", env_limit=6)
    checks = 0

    async def closed() -> None:
        nonlocal checks
        indexed = {_s(m) for m in await rq.client.zrange(q.ck_index, 0, -1)}
        tagged = {_s(m) for m in await rq.client.zrange(q.vtime, 0, -1)}
        assert indexed <= tagged, f"unregistered variants: {sorted(indexed - tagged)}"
        checks += 1

    keys = [f"t{i}" for i in range(8)]
    await _run_workload(
        rq, env, model, random.Random(99), 260, keys=keys, weights=False, compare_state=False,
        after_step=closed,
    )  # fmt: skip
    assert checks == 260

"""Priority levels against the reference model: the tiered order is the two-level fair
order of each level (tests/sfq_model.py, one model per level, each with its own tags and
floors), levels served strictly in order inside one dequeue call (level 1 gets the call's
budget first, level 2 what it left, ...).

The workloads keep every limit out of play (no caps, an environment limit no call
reaches), so the levels share nothing but the call's budget and the weights, and the model
of a level is exactly the fair order of its runs. Caps and rates across levels are tested
in test_priority.py. After every operation the served sequence and each level's stored
order state equal the models'.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from tests.sfq_model import SfqModel, flow_of
from tests.state import s, tenant_key_state

from fairq import keys as K
from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue

pytestmark = pytest.mark.single_server

T0 = 1_000_000
TENANTS = ["T0", "T1", "T2"]
QUEUES = ("q0", "q1")
LEVELS = (1, 2, 3, 5)
ENV_LIMIT = 100_000


async def level_state(rq: RunQueue, env: Environment, level: int, pool: int) -> dict[str, Any]:
    """One level's stored order state: its tenant tags (with the floor), and per queue
    its ready tenants, parks and tenants' key sets."""
    e = rq.keys.env(env)

    def build(pipe: Any) -> None:
        pipe.zrange(K.pool_name(K.level_name(e.prefix, level), pool) + ":tt", 0, -1,
                    withscores=True)  # fmt: skip
        for name in QUEUES:
            q = rq.keys.queue(env, name).at_level(level)
            pipe.zrange(q.ready_tenants, 0, -1, withscores=True)
            pipe.hgetall(q.parked)
            for t in TENANTS:
                pipe.zrange(q.tenant_keys(K.encode_tenant(t)), 0, -1, withscores=True)
                pipe.hget(q.solo_keys, K.encode_tenant(t))

    replies = iter(await rq.pipeline(build))
    tt = {s(m): float(v) for m, v in next(replies)}
    out: dict[str, Any] = {"tfloor": tt.pop(K.FLOOR_MEMBER, None), "tt": tt}
    for name in QUEUES:
        out[f"{name}.tq"] = {s(m): float(v) for m, v in next(replies)}
        out[f"{name}.park"] = {s(k): s(v) for k, v in next(replies).items()}
        for t in TENANTS:
            keys, _ = tenant_key_state(t, next(replies), next(replies))
            if keys:
                out[f"{name}.keys.{t}"] = keys
    return out


def model_state(model: SfqModel) -> dict[str, Any]:
    out: dict[str, Any] = {"tt": dict(model.tt), "tfloor": model.tfloor}
    for name in QUEUES:
        q = model.queue(name)
        out[f"{name}.tq"] = dict(q.tq)
        out[f"{name}.park"] = dict(q.park)
        for t in TENANTS:
            if q.keysets.get(t):
                out[f"{name}.keys.{t}"] = dict(q.keysets[t])
    return out


def delivered(batch: list[Delivery]) -> list[tuple[str, str, str]]:
    return [(d.run_id, d.queue, flow_of(d.concurrency_key, d.tenant)) for d in batch]


async def run_tiered(rq: RunQueue, env: Environment, rng: random.Random, steps: int) -> int:
    models = {level: SfqModel(env_limit=ENV_LIMIT) for level in LEVELS}
    level_of: dict[str, int] = {}
    keys = [f"k{i}" for i in range(8)]
    tenant_of = {k: rng.choice([*TENANTS, None]) for k in keys}
    inflight: dict[str, Delivery] = {}
    now, counter, served = T0, 0, 0
    for step in range(steps):
        now += rng.randint(1, 5)
        op = rng.random()
        where = f"step {step}"
        if op < 0.4:
            for _ in range(rng.randint(1, 4)):
                queue, level = rng.choice(QUEUES), rng.choice(LEVELS)
                key = None if rng.random() < 0.15 else rng.choice(keys)
                tenant = rng.choice([*TENANTS, None]) if key is None else tenant_of[key]
                run = f"r{counter}"
                counter += 1
                score = (
                    now - rng.randint(0, 300) if rng.random() < 0.9 else now + rng.randint(1, 30)
                )
                await rq.enqueue(env, queue, run, None, concurrency_key=key, tenant=tenant,
                                 available_at_ms=score, priority=level, now_ms=now)  # fmt: skip
                models[level].enqueue(queue, run, key, tenant, score, now)
                level_of[run] = level
        elif op < 0.7:
            max_count = rng.randint(1, 10)
            batch = await rq.dequeue(max_count, env=env, queues=list(QUEUES), now_ms=now)
            want: list[tuple[str, str, str]] = []
            for level in LEVELS:  # strictly by level, each with what the levels above left
                if len(want) < max_count:
                    want += models[level].dequeue(list(QUEUES), max_count - len(want), now)
            assert delivered(batch) == want, where
            inflight.update((d.run_id, d) for d in batch)
            served += len(batch)
        elif op < 0.85:
            for run in rng.sample(sorted(inflight), k=min(len(inflight), rng.randint(1, 5))):
                await rq.ack([inflight.pop(run)], now_ms=now)
                models[level_of[run]].ack(run, now)
        elif op < 0.93:
            if inflight:
                run = rng.choice(sorted(inflight))
                retry_at = now if rng.random() < 0.6 else now + rng.randint(1, 30)
                await rq.nack(inflight.pop(run), retry_at_ms=retry_at, now_ms=now)
                models[level_of[run]].nack(run, retry_at, now)
        elif op < 0.97:
            t, w = rng.choice(TENANTS), rng.choice([None, 0.5, 2.0, 3.0])
            await rq.set_tenant_weight(env, t, w)  # one weight for every level
            for m in models.values():
                m.tw.pop(t, None) if w is None else m.tw.__setitem__(t, w)
        else:
            tenant_of[rng.choice(keys)] = rng.choice([*TENANTS, None])
        for level in LEVELS:
            pool = 0 if models[level].pool == "*" else K.pool_id(list(QUEUES))
            stored = await level_state(rq, env, level, pool)
            assert stored == model_state(models[level]), (where, level)
    return served


SEEDS = [21, 22, 23, 24]
STEPS = 2600


@pytest.mark.parametrize("seed", SEEDS)
async def test_tiered_order_matches_one_fair_model_per_level(
    make_queue: Any, env: Environment, seed: int
) -> None:
    """2,600 random operations per seed (4 seeds: 10,400): enqueues at levels 1, 2, 3 and
    5 on random keys / tenants / queues with past and future scores, dequeues of 1..10,
    acks, nacks with retry times, tenant weights and tenant changes. The Lua serves exactly
    the tiered model's sequence and leaves each level's order state equal to its model's."""
    rq = await make_queue(vtime={"enabled": True})
    await rq.set_env_limits(env, concurrency=ENV_LIMIT)
    served = await run_tiered(rq, env, random.Random(seed), STEPS)
    assert served > 1000

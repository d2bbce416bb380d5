"""White-box views of the store's state for tests (tests may read keys; src may not).

Each helper reads the keys the schema (fairq.keys) names, so a test can assert on the
exact stored state of the order, the counters and the runs.
"""

from __future__ import annotations

from typing import Any

from fairq import keys as K
from fairq.keys import Environment
from fairq.store import RunQueue
from fairq.store.run_hash import RUN_FIELDS


def s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def run_state(rq: RunQueue, env: Environment, run_id: str) -> str | None:
    """``queued`` | ``running`` | ``dlq``, or None when the run's hash is gone."""
    message = rq.keys.env(env).message(run_id)
    raw = await rq.client.hget(message, RUN_FIELDS["state"].stored)  # type: ignore[misc]
    return None if raw is None else s(raw)


async def run_fields(rq: RunQueue, env: Environment, run_id: str) -> dict[str, str]:
    raw = await rq.client.hgetall(rq.keys.env(env).message(run_id))  # type: ignore[misc]
    return {s(k): s(v) for k, v in raw.items()}


async def heads(rq: RunQueue, env: Environment) -> dict[str, float]:
    """The env's members of its shard's queue-heads index -> score."""
    shard = rq.keys.shard(rq.keys.shard_of(env))
    raw = await rq.client.zrange(shard.heads, 0, -1, withscores=True)
    return {s(m): float(sc) for m, sc in raw if s(m).split(":", 1)[1].startswith(env.id + ":")}


async def tenant_tags(rq: RunQueue, env: Environment) -> dict[str, float]:
    """Every stored tenant tag of the env (V:tt), by encoded tenant (a key serving as
    its own tenant is its encoded key)."""
    raw = await rq.client.zrange(rq.keys.env(env).tenant_tags, 0, -1, withscores=True)
    return {s(m): float(sc) for m, sc in raw if s(m) != K.FLOOR_MEMBER}


async def tenant_floor(rq: RunQueue, env: Environment) -> float | None:
    """The env's tenant virtual time (the ``~floor`` member of V:tt)."""
    raw = await rq.client.zscore(rq.keys.env(env).tenant_tags, K.FLOOR_MEMBER)
    return None if raw is None else float(raw)


async def delete_tenant_floor(rq: RunQueue, env: Environment, pool: int = 0) -> None:
    """Lose the floor (as when its key expires) while the tags remain (of consumer pool
    ``pool``: 0 = a consumer of every queue)."""
    tags = K.pool_name(rq.keys.env(env).prefix, pool) + ":tt"
    await rq.client.zrem(tags, K.FLOOR_MEMBER)


async def ready_tenants(rq: RunQueue, env: Environment, queue: str) -> dict[str, float]:
    """Tenants registered as servable in a queue (B:tq) -> their tag copy."""
    raw = await rq.client.zrange(rq.keys.queue(env, queue).ready_tenants, 0, -1, withscores=True)
    return {s(m): float(sc) for m, sc in raw}


def tenant_key_state(
    tenant: str, key_set: list[tuple[Any, float]], solo: Any
) -> tuple[dict[str, float], float | None]:
    """A named tenant's keys in a queue (flow -> tag inside the tenant) and its key floor,
    from its key set (``ZRANGE ... WITHSCORES``) and its ``B:tsolo`` entry (``HGET``):
    the order keeps a tenant with one key in play in the entry, the others in the set,
    never both (asserted)."""
    keys = {s(m): float(sc) for m, sc in key_set}
    floor = keys.pop(K.KEY_FLOOR_MEMBER, None)
    if solo is None:
        return keys, floor
    assert not key_set, f"tenant {tenant!r} has both a key set {keys} and a solo entry"
    floor, tag, flow = K.parse_solo_entry(solo)
    return {flow: tag}, floor


async def _tenant_key_state(
    rq: RunQueue, env: Environment, queue: str, tenant: str
) -> tuple[dict[str, float], float | None]:
    q = rq.keys.queue(env, queue)
    encoded = K.encode_tenant(tenant)
    key_set = await rq.client.zrange(q.tenant_keys(encoded), 0, -1, withscores=True)
    solo = await rq.client.hget(q.solo_keys, encoded)  # type: ignore[misc]
    return tenant_key_state(tenant, key_set, solo)


async def tenant_keys(rq: RunQueue, env: Environment, queue: str, tenant: str) -> dict[str, float]:
    """The keys of a named tenant in a queue (its key set, or its one key in B:tsolo) ->
    their tag inside the tenant, by key (its flow ``N/K`` shown as ``K``, its keyless flow
    ``N/`` as ''; an unnamed key serving as the tenant keeps its name)."""
    keys, _ = await _tenant_key_state(rq, env, queue, tenant)
    return {K.split_flow(m)[1]: tag for m, tag in keys.items()}


async def set_tenant_keys(
    rq: RunQueue, env: Environment, queue: str, tenant: str, tags: dict[str, float]
) -> None:
    """Write tags into a named tenant's key set, by key (``K.KEY_FLOOR_MEMBER`` for its
    floor; ``K.FLOOR_MEMBER`` for a floor under the name sets had before). A tenant kept
    in B:tsolo moves into its key set first (as a second key joining moves it)."""
    q = rq.keys.queue(env, queue)
    encoded = K.encode_tenant(tenant)
    solo = await rq.client.hget(q.solo_keys, encoded)  # type: ignore[misc]
    if solo is not None:
        floor, tag, flow = K.parse_solo_entry(solo)
        await rq.client.zadd(q.tenant_keys(encoded), {K.KEY_FLOOR_MEMBER: floor, flow: tag})
        await rq.client.hdel(q.solo_keys, encoded)  # type: ignore[misc]
    members = {
        m
        if m in (K.KEY_FLOOR_MEMBER, K.FLOOR_MEMBER)
        else K.flow_of(K.encode_concurrency_key(m), encoded): v
        for m, v in tags.items()
    }
    await rq.client.zadd(q.tenant_keys(encoded), members)


async def key_floor(rq: RunQueue, env: Environment, queue: str, tenant: str) -> float | None:
    """A named tenant's key virtual time in a queue (the ``!floor`` member of its key set,
    or the floor of its B:tsolo entry)."""
    _, floor = await _tenant_key_state(rq, env, queue, tenant)
    return floor


async def parked(rq: RunQueue, env: Environment, queue: str) -> dict[str, str]:
    """Tenants (``t:N``) and keys (``k:K``) taken out of the fair order while gated."""
    raw = await rq.client.hgetall(rq.keys.queue(env, queue).parked)  # type: ignore[misc]
    return {s(k): s(v) for k, v in raw.items()}


async def ck_index(rq: RunQueue, env: Environment, queue: str) -> dict[str, float]:
    raw = await rq.client.zrange(rq.keys.queue(env, queue).ck_index, 0, -1, withscores=True)
    return {s(m): float(sc) for m, sc in raw}


async def counters(rq: RunQueue, env: Environment, queue: str) -> tuple[int | None, int | None]:
    """(B:ckqueued, B:ckrunning) as stored (None = missing)."""
    q = rq.keys.queue(env, queue)
    a = await rq.client.get(q.ck_queued_counter)
    b = await rq.client.get(q.ck_running_counter)
    return (None if a is None else int(a)), (None if b is None else int(b))


async def fair_keys(rq: RunQueue) -> list[str]:
    """Every fair-order key of this prefix (none may exist with the age order only)."""
    suffixes = (
        f":{K.ENV_KEYS['tenant_tags']}", f":{K.ENV_KEYS['tenant_weights']}",
        f":{K.QUEUE_KEYS['ready_tenants']}", f":{K.QUEUE_KEYS['solo_keys']}",
        f":{K.QUEUE_KEYS['parked']}", f":{K.QUEUE_KEYS['parked_due']}",
        f":{K.SHARD_KEYS['env_tags']}", f":{K.TENANT_KEYS['keys']}",
    )  # fmt: skip
    out = []
    async for key in rq.client.scan_iter(match="{" + rq.keys.prefix + ".*", count=1000):
        name = s(key)
        if name.endswith(suffixes):
            out.append(name)
    return sorted(out)


async def keyspace(rq: RunQueue) -> dict[str, bytes]:
    """Every key of the prefix -> its DUMP (a byte-exact snapshot of the state)."""
    out: dict[str, bytes] = {}
    for pattern in ("{" + rq.keys.prefix + ".*", rq.keys.prefix + ":*"):
        async for key in rq.client.scan_iter(match=pattern, count=1000):
            dumped = await rq.client.dump(key)
            if dumped is not None:
                out[s(key)] = dumped
    return out

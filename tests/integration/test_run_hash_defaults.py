"""A run hash stores no field at its default: a new run's key (when it has none), its
attempts and its lease token are absent until they differ (as its tenant, TTL, outcome
policy and trace always were), and every reader (the scripts' generated
readers, the Python ones) returns a missing field as its default."""

from __future__ import annotations

from typing import Any

import pytest
from tests import state

from fairq.keys import Environment
from fairq.models import AckStatus
from fairq.outcomes import RunStatus
from fairq.store import run_hash
from fairq.store.run_hash import RUN_FIELDS

T0 = 1_700_000_000_000


def stored(*names: str) -> set[str]:
    return {RUN_FIELDS[name].stored for name in names}


BARE = ("queue", "payload", "score", "enqueued_at", "state")


@pytest.mark.parametrize("fair", [False, True], ids=["age-order", "fair-order"])
async def test_a_new_run_stores_its_fields_with_a_default_only_once_they_differ(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    rq = await make_queue(vtime={"enabled": fair})
    await rq.enqueue(env, "q", "plain", {"n": 1}, now_ms=T0)
    await rq.enqueue(env, "q", "keyed", {"n": 2}, concurrency_key="a", now_ms=T0 + 1)
    assert set(await state.run_fields(rq, env, "plain")) == stored(*BARE)
    assert set(await state.run_fields(rq, env, "keyed")) == stored(*BARE, "ck")

    # the readers see the defaults: a fresh run has made no attempt
    info = await rq.get_run(env, "plain")
    assert info is not None and (info.attempts, info.concurrency_key) == (0, None)
    first = await rq.dequeue(2, env=env, queues=["q"], now_ms=T0 + 10)
    assert sorted((d.run_id, d.attempt, d.lease_token) for d in first) == [
        ("keyed", 0, 1),
        ("plain", 0, 1),
    ]
    plain = next(d for d in first if d.run_id == "plain")
    assert await rq.nack(plain, retry_delay_ms=0, now_ms=T0 + 20) is not None
    fields = await state.run_fields(rq, env, "plain")
    assert (fields[RUN_FIELDS["attempts"].stored], fields[RUN_FIELDS["lease_token"].stored]) == (
        "1",
        "1",
    )
    (again,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 30)
    assert (again.run_id, again.attempt, again.lease_token) == ("plain", 1, 2)


async def test_a_run_hash_with_its_defaults_written_out_serves_the_same(
    make_queue: Any, env: Environment
) -> None:
    """A hash that holds the defaults (as an enqueue once wrote them) reads the same."""
    rq = await make_queue()
    await rq.enqueue(env, "q", "old", {}, now_ms=T0)
    message = rq.keys.env(env).message("old")
    await rq.client.hset(  # type: ignore[misc]
        message,
        mapping={RUN_FIELDS["ck"].stored: "", RUN_FIELDS["attempts"].stored: "0",
                 RUN_FIELDS["lease_token"].stored: "0"},
    )  # fmt: skip
    (d,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 10)
    assert (d.run_id, d.concurrency_key, d.attempt, d.lease_token) == ("old", None, 0, 1)
    assert await rq.ack([d], now_ms=T0 + 20) == [AckStatus.ACKED]


async def test_a_running_keyless_run_of_a_named_tenant_is_its_tenants_flow_in_the_stats(
    make_queue: Any, env: Environment
) -> None:
    """The stats find a running run's flow from its hash (its variant has left the
    index): a keyless run of a named tenant has no key field at all, and its flow is the
    tenant's keyless one (not a key spelled 'None')."""
    rq = await make_queue(vtime={"enabled": True})
    await rq.enqueue(env, "q", "r1", {}, tenant="acme", now_ms=T0)
    assert len(await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 10)) == 1
    assert RUN_FIELDS["ck"].stored not in await state.run_fields(rq, env, "r1")
    stats = await rq.queue_stats(env, "q", breakdown=True)
    assert [(v.tenant, v.concurrency_key) for v in stats.variants] == [("acme", None)]
    info = await rq.get_run(env, "r1")
    assert info is not None and info.status is RunStatus.RUNNING and info.concurrency_key is None


def test_the_python_reader_returns_a_missing_field_with_a_default_as_it() -> None:
    names = ("queue", "ck", "attempts", "lease_token", "lease_start")
    assert run_hash.read(names, [b"q", None, None, None, None]) == [b"q", "", "0", "0", None]
    assert run_hash.by_name(names, [None] * 5) == {
        "queue": None, "ck": "", "attempts": "0", "lease_token": "0", "lease_start": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match="2 values for 5"):
        run_hash.read(names, [None, None])
    optional = ("tenant", "slot_tenant", "ttl_deadline", "outcome_policy", "trace", "level")
    assert run_hash.read(optional, [None] * 6) == ["", "", "0", "", "", None]


def test_the_generated_readers_return_a_missing_field_with_a_default_as_it() -> None:
    lua = run_hash.lua_run_hash(["claim"])
    assert "f[2] or '0'" in lua  # attempts
    assert "f[6] or '0'" in lua  # lease_token
    assert "f[5] or '0'" in lua and "f[9] or ''" in lua  # ttl_deadline, trace
    assert "f[1] or" not in lua  # payload: no default

"""Bad input gets a clear FairqError subclass and leaves the stored state unchanged."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from fairq.errors import (
    FairqError,
    InvalidLimitError,
    InvalidNameError,
    PayloadError,
    ServerUnavailableError,
)
from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.server import connect
from fairq.store import RunQueue

T0 = 1_700_000_000_000

BadCall = Callable[[RunQueue, Environment], Awaitable[object]]


async def snapshot(rq: RunQueue) -> dict[bytes, bytes | None]:
    """Every key of the test's prefix, serialised (single-key commands: cluster-safe)."""
    keys = [k async for k in rq.client.scan_iter(match=f"{{{rq.keys.prefix}.*", count=1000)]
    return {k: await rq.client.dump(k) for k in sorted(keys)}


async def seeded(make_queue: Any, env: Environment, **config: Any) -> RunQueue:
    rq: RunQueue = await make_queue(**config)
    await rq.set_env_limits(env, concurrency=5)
    await rq.set_queue_concurrency(env, "q", 3)
    await rq.enqueue(env, "q", "queued", {"a": 1}, now_ms=T0)
    await rq.enqueue(env, "q", "keyed", concurrency_key="k", now_ms=T0)
    await rq.enqueue(env, "q", "running", now_ms=T0 - 1)
    await rq.dequeue(1, now_ms=T0)
    return rq


CASES: dict[str, tuple[type[FairqError], BadCall]] = {
    "queue with ':'": (InvalidNameError, lambda rq, e: rq.enqueue(e, "a:b", "r", now_ms=T0)),
    "queue with space": (InvalidNameError, lambda rq, e: rq.enqueue(e, "a b", "r", now_ms=T0)),
    "queue with braces": (InvalidNameError, lambda rq, e: rq.enqueue(e, "{q}", "r", now_ms=T0)),
    "empty queue": (InvalidNameError, lambda rq, e: rq.enqueue(e, "", "r", now_ms=T0)),
    "run id with ':'": (InvalidNameError, lambda rq, e: rq.enqueue(e, "q", "r:1", now_ms=T0)),
    "run id with '*'": (InvalidNameError, lambda rq, e: rq.enqueue(e, "q", "*", now_ms=T0)),
    "empty run id": (InvalidNameError, lambda rq, e: rq.enqueue(e, "q", "", now_ms=T0)),
    "empty concurrency key": (
        InvalidNameError,
        lambda rq, e: rq.enqueue(e, "q", "r", concurrency_key="", now_ms=T0),
    ),
    "huge concurrency key": (
        InvalidNameError,
        lambda rq, e: rq.enqueue(e, "q", "r", concurrency_key="x" * 300, now_ms=T0),
    ),
    "negative delay": (
        InvalidLimitError,
        lambda rq, e: rq.enqueue(e, "q", "r", delay_ms=-1, now_ms=T0),
    ),
    "fractional delay": (
        InvalidLimitError,
        lambda rq, e: rq.enqueue(e, "q", "r", delay_ms=1.5, now_ms=T0),  # type: ignore[arg-type]
    ),
    "negative priority": (
        InvalidLimitError,
        lambda rq, e: rq.enqueue(e, "q", "r", priority_ms=-1, now_ms=T0),
    ),
    "zero ttl": (InvalidLimitError, lambda rq, e: rq.enqueue(e, "q", "r", ttl_ms=0, now_ms=T0)),
    "boolean ttl": (
        InvalidLimitError,
        lambda rq, e: rq.enqueue(e, "q", "r", ttl_ms=True, now_ms=T0),
    ),
    "non-numeric available_at": (
        InvalidLimitError,
        lambda rq, e: rq.enqueue(e, "q", "r", available_at_ms="soon", now_ms=T0),  # type: ignore[arg-type]
    ),
    "oversized payload": (
        PayloadError,
        lambda rq, e: rq.enqueue(e, "q", "r", "x" * 100, now_ms=T0),
    ),
    "object payload": (PayloadError, lambda rq, e: rq.enqueue(e, "q", "r", object(), now_ms=T0)),
    "set payload": (PayloadError, lambda rq, e: rq.enqueue(e, "q", "r", {1, 2}, now_ms=T0)),
    "bytes payload": (PayloadError, lambda rq, e: rq.enqueue(e, "q", "r", b"raw", now_ms=T0)),
    "NaN payload": (
        PayloadError,
        lambda rq, e: rq.enqueue(e, "q", "r", {"x": float("nan")}, now_ms=T0),
    ),
    "one bad run in a batch": (
        PayloadError,
        lambda rq, e: rq.enqueue_many(
            [EnqueueRequest(e, "q", "good"), EnqueueRequest(e, "q", "bad", object())], now_ms=T0
        ),
    ),
    "negative env limit": (InvalidLimitError, lambda rq, e: rq.set_env_limits(e, concurrency=-1)),
    "huge env limit": (
        InvalidLimitError,
        lambda rq, e: rq.set_env_limits(e, concurrency=2**40),
    ),
    "string env limit": (
        InvalidLimitError,
        lambda rq, e: rq.set_env_limits(e, concurrency="5"),  # type: ignore[arg-type]
    ),
    "boolean env limit": (
        InvalidLimitError,
        lambda rq, e: rq.set_env_limits(e, concurrency=True),
    ),
    "burst below one": (InvalidLimitError, lambda rq, e: rq.set_env_limits(e, burst_factor=0.5)),
    "burst too high": (InvalidLimitError, lambda rq, e: rq.set_env_limits(e, burst_factor=101)),
    "NaN burst": (
        InvalidLimitError,
        lambda rq, e: rq.set_env_limits(e, burst_factor=float("nan")),
    ),
    "boolean burst": (InvalidLimitError, lambda rq, e: rq.set_env_limits(e, burst_factor=True)),
    "valid limit with a bad burst": (
        InvalidLimitError,
        lambda rq, e: rq.set_env_limits(e, concurrency=9, burst_factor=0),
    ),
    "negative queue limit": (
        InvalidLimitError,
        lambda rq, e: rq.set_queue_concurrency(e, "q", -1),
    ),
    "huge queue limit": (
        InvalidLimitError,
        lambda rq, e: rq.set_queue_concurrency(e, "q", 10**10),
    ),
    "queue limit on a bad queue": (
        InvalidNameError,
        lambda rq, e: rq.set_queue_concurrency(e, "a:b", 1),
    ),
    "negative size limit": (
        InvalidLimitError,
        lambda rq, e: rq.set_queue_size_limit(e, "q", -1),
    ),
    "zero weight": (
        InvalidLimitError,
        lambda rq, e: rq.set_concurrency_key_weight(e, "q", "k", 0),
    ),
    "huge weight": (
        InvalidLimitError,
        lambda rq, e: rq.set_concurrency_key_weight(e, "q", "k", 1e9),
    ),
    "dequeue of nothing": (InvalidLimitError, lambda rq, e: rq.dequeue(0, now_ms=T0)),
    "dequeue of too many": (InvalidLimitError, lambda rq, e: rq.dequeue(1001, now_ms=T0)),
    "negative lease": (
        InvalidLimitError,
        lambda rq, e: rq.dequeue(1, lease_ms=-5, now_ms=T0),
    ),
    "zero heartbeat lease": (InvalidLimitError, lambda rq, e: rq.heartbeat([], lease_ms=0)),
    "redrive with a bad run id": (InvalidNameError, lambda rq, e: rq.redrive(e, "a:b")),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_input_is_refused_without_changing_anything(
    make_queue: Any, env: Environment, case: str
) -> None:
    error, call = CASES[case]
    rq = await seeded(make_queue, env, max_payload_bytes=64)
    before = await snapshot(rq)
    assert before

    with pytest.raises(error) as info:
        await call(rq, env)

    assert isinstance(info.value, FairqError)
    assert str(info.value)  # a message a user can act on
    assert await snapshot(rq) == before


@pytest.mark.parametrize(
    "parts",
    [("o:x", "p", "e"), ("o", "p/q", "e"), ("o", "p", "e:1"), ("o", "p", "{e}"), ("", "p", "e")],
)
def test_separators_in_environment_names_are_refused(parts: tuple[str, str, str]) -> None:
    with pytest.raises(InvalidNameError) as info:
        Environment(*parts)
    assert isinstance(info.value, ValueError)


async def test_payload_errors_name_the_problem(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(max_payload_bytes=64)
    with pytest.raises(PayloadError, match="larger than the maximum 64"):
        await rq.enqueue(env, "q", "r", "x" * 100, now_ms=T0)
    with pytest.raises(PayloadError, match="not JSON"):
        await rq.enqueue(env, "q", "r", object(), now_ms=T0)


async def test_invalid_name_errors_carry_their_fields(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    with pytest.raises(InvalidNameError) as info:
        await rq.enqueue(env, "task:1", "r", now_ms=T0)
    assert (info.value.kind, info.value.value) == ("queue", "task:1")
    assert "task:1" in str(info.value)


async def test_a_dead_server_url_names_the_url() -> None:
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(ServerUnavailableError) as info:
        await connect(url)
    assert info.value.url == url
    assert url in str(info.value)


async def test_a_dead_server_url_hides_the_password() -> None:
    url = "redis://user:s3cret@127.0.0.1:1/0"
    with pytest.raises(ServerUnavailableError) as info:
        await connect(url)
    assert "s3cret" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)


async def test_a_missing_unix_socket_names_the_path() -> None:
    url = "unix:///nonexistent/fairq.sock"
    with pytest.raises(ServerUnavailableError) as info:
        await connect(url)
    assert "/nonexistent/fairq.sock" in str(info.value)


async def test_a_malformed_url_is_a_server_error() -> None:
    with pytest.raises(ServerUnavailableError):
        await connect("http://localhost:6379")

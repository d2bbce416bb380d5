"""The lean connection fairq's script calls go on (store/wire.py), against the real server:
the same replies and errors as redis-py, pipelined calls matched in order, cancelled
calls, a killed connection, credentials and databases, and more than one event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from fairq.errors import ConnectionLostError
from fairq.keys import Environment
from fairq.server import connect, is_cluster_url
from fairq.store import RunQueue
from fairq.store.wire import (
    ERRORS_BY_CODE,
    ERRORS_BY_ERR_MESSAGE,
    ScriptWire,
    WireAddress,
    script_wire,
)


@pytest.fixture
async def client(redis_url: str) -> Any:
    if is_cluster_url(redis_url):
        pytest.skip("the wire serves one server; a cluster keeps redis-py's client")
    c = await connect(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
async def wire(client: Any) -> Any:
    w = script_wire(client)
    assert isinstance(w, ScriptWire)
    yield w
    await w.aclose()


async def raw(client: Any, *command: Any) -> Any:
    """A command's reply as redis-py's connection parses it (no response callback: FCALL,
    the one command the wire carries for fairq, has none)."""
    conn = await client.connection_pool.get_connection()
    try:
        await conn.send_command(*command)
        return await conn.read_response()
    finally:
        await client.connection_pool.release(conn)


async def test_replies_and_errors_are_those_of_redis_py(
    client: Any, wire: ScriptWire, prefix: str
) -> None:
    nested = "return {1, 'two', {3, false, 'x'}, redis.status_reply('OK')}"
    commands: list[tuple[Any, ...]] = [
        ("PING",),
        ("SET", "{k}:s", b"\x00bytes\xff"),
        ("GET", "{k}:s"),
        ("GET", "{k}:none"),
        ("INCRBY", "{k}:n", 5),
        ("RPUSH", "{k}:l", "a", 2, 3.5),
        ("LRANGE", "{k}:l", 0, -1),
        ("EVAL", nested, 0),
        ("EVAL", "return 2.9", 0),  # Lua numbers come back truncated to integers
    ]

    def named(command: tuple[Any, ...], side: str) -> tuple[Any, ...]:
        k = f"{prefix}:wire:{side}"
        return tuple(a.replace("{k}", k) if isinstance(a, str) else a for a in command)

    for command in commands:  # each side on keys of its own, in the same order
        ours = await wire.execute_command(*named(command, "ours"))
        theirs = await raw(client, *named(command, "theirs"))
        assert ours == theirs, command
    for bad, kind in [
        (("GET",), ResponseError),
        (("EVALSHA", "0" * 40, 0), NoScriptError),
        (("EVAL", "return redis.error_reply('FQ9 refused here')", 0), ResponseError),
    ]:
        with pytest.raises(kind) as ours_raised:
            await wire.execute_command(*bad)
        with pytest.raises(kind) as theirs_raised:
            await client.execute_command(*bad)
        assert type(ours_raised.value) is type(theirs_raised.value)
        assert str(ours_raised.value) == str(theirs_raised.value)
    # after the errors the connection still pairs replies with their calls
    assert await wire.execute_command("ECHO", "still in step") == b"still in step"


#: Error replies a script can send, one for every entry of the wire's tables and others.
ERROR_REPLIES = [
    *(f"{code} the server says no" for code in ERRORS_BY_CODE),
    *(f"ERR {message}" for message in ERRORS_BY_ERR_MESSAGE),
    "ERR something else",
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "FQ12 refused",
]


async def raised(call: Awaitable[Any]) -> RedisError:
    """The error a call raised (failing the test when it raised none)."""
    try:
        await call
    except RedisError as exc:
        return exc
    raise AssertionError("no error raised")


async def test_every_error_reply_raises_what_redis_py_raises(client: Any, wire: ScriptWire) -> None:
    """The wire's own table of error codes (redis-py's parser is private) gives the
    exception type and message redis-py's connection gives for the same reply."""
    for reply in ERROR_REPLIES:
        script = ("EVAL", f"return redis.error_reply('{reply}')", 0)
        ours, theirs = (
            await raised(wire.execute_command(*script)),
            await raised(raw(client, *script)),
        )
        assert (type(ours), str(ours)) == (type(theirs), str(theirs)), reply
    assert await wire.execute_command("ECHO", "still in step") == b"still in step"


async def test_concurrent_calls_share_the_connection_each_with_its_own_reply(
    wire: ScriptWire,
) -> None:
    replies = await asyncio.gather(*(wire.execute_command("ECHO", f"m{i}") for i in range(500)))
    assert replies == [f"m{i}".encode() for i in range(500)]


async def test_a_cancelled_call_leaves_the_replies_in_step(
    client: Any, wire: ScriptWire, prefix: str
) -> None:
    key = f"{prefix}:wire:empty"
    await wire.execute_command("PING")  # connected: the BLPOP is sent at once
    # blocks far longer than a slow machine's pause: cancelled before any reply
    slow = asyncio.ensure_future(wire.execute_command("BLPOP", key, 30))
    await asyncio.sleep(0.05)
    slow.cancel()
    # sent after the cancelled one: its reply comes after BLPOP's (the pushed item), and
    # is its own
    mine = asyncio.ensure_future(wire.execute_command("ECHO", "mine"))
    await client.rpush(key, "x")
    assert await asyncio.wait_for(mine, 10) == b"mine"
    assert slow.cancelled()


async def _kill_wire_connection(client: Any, wire: ScriptWire) -> None:
    protocol = wire._protocol
    assert protocol is not None and protocol.transport is not None
    host, port = protocol.transport.get_extra_info("sockname")[:2]
    assert await raw(client, "CLIENT", "KILL", "ADDR", f"{host}:{port}", "SKIPME", "yes") == 1


async def test_a_killed_connection_is_made_again_and_retries_follow_the_client(
    client: Any, wire: ScriptWire, prefix: str
) -> None:
    await wire.execute_command("PING")
    await _kill_wire_connection(client, wire)
    assert await wire.execute_command("ECHO", "after") == b"after"  # a new connection

    # a call in flight when the connection dies: fairq's client retries nothing itself
    # (the store reports ConnectionLostError, its callers retry) ...
    waiting = asyncio.ensure_future(wire.execute_command("BLPOP", f"{prefix}:wire:q", 5))
    await asyncio.sleep(0.1)
    await _kill_wire_connection(client, wire)
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(waiting, 5)
    # ... and with a Retry on the client, the call is sent again, as redis-py would
    wire._retry = Retry(NoBackoff(), 2)
    waiting = asyncio.ensure_future(wire.execute_command("BLPOP", f"{prefix}:wire:q", 5))
    await asyncio.sleep(0.1)
    await _kill_wire_connection(client, wire)
    await asyncio.sleep(0.1)
    await client.rpush(f"{prefix}:wire:q", "x")
    assert await asyncio.wait_for(waiting, 5) == [f"{prefix}:wire:q".encode(), b"x"]


async def test_without_retries_an_unreachable_server_is_a_connection_error() -> None:
    address = WireAddress("127.0.0.1", 1, None, None, None, 0, 1.0)
    once = ScriptWire(address, Retry(NoBackoff(), 0))
    with pytest.raises(RedisConnectionError):
        await once.execute_command("PING")
    with pytest.raises(RedisConnectionError):
        await ScriptWire(address).execute_command("PING")


async def test_a_store_on_an_unreachable_server_raises_connection_lost(env: Environment) -> None:
    rq = RunQueue(await connect("redis://127.0.0.1:1/0", check=False))
    rq._meta_checked = True  # straight to the script call
    assert isinstance(rq._script_client, ScriptWire)
    rq._script_client._retry = Retry(NoBackoff(), 1)
    with pytest.raises(ConnectionLostError):
        await rq.enqueue(env, "q", "r1")
    await rq.close()


async def test_credentials_and_database_of_the_url_are_used(
    client: Any, redis_url: str, prefix: str, env: Environment
) -> None:
    user, password = f"{prefix}-wire", "s3cret-pass"
    await client.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    try:
        host_port = redis_url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
        url = f"redis://{user}:{password}@{host_port}/3"
        rq = RunQueue(await connect(url))
        assert isinstance(rq._script_client, ScriptWire)
        await rq.enqueue(env, "q", "in-db-3")
        assert (await rq.queue_stats(env, "q")).queued == 1
        db3 = aioredis.from_url(url)
        db0 = aioredis.from_url(redis_url)
        try:
            assert await db3.exists(rq.keys.env(env).message("in-db-3")) == 1
            assert await db0.exists(rq.keys.env(env).message("in-db-3")) == 0
        finally:
            await rq.purge()
            await rq.close()
            await db3.aclose()
            await db0.aclose()
        wrong = RunQueue(await connect(redis_url, check=False))
        wrong._script_client.address = WireAddress(  # type: ignore[union-attr]
            *host_port.rsplit(":", 1)[:1], int(host_port.rsplit(":", 1)[1]), None, user,
            "not-the-password", 0, 2.0,
        )  # fmt: skip
        wrong._meta_checked = True
        with pytest.raises(ConnectionLostError):
            await wrong.enqueue(env, "q", "never")
        await wrong.close()
    finally:
        await client.execute_command("ACL", "DELUSER", user)


async def test_one_wire_serves_calls_from_another_event_loop(wire: ScriptWire) -> None:
    assert await wire.execute_command("ECHO", "here") == b"here"
    seen: list[Any] = []

    async def there() -> Any:
        try:
            return await wire.execute_command("ECHO", "there")
        finally:
            await wire.aclose()  # that loop's connection, closed before the loop ends

    def elsewhere() -> None:
        seen.append(asyncio.run(there()))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert seen == [b"there"]
    assert await wire.execute_command("ECHO", "here again") == b"here again"


async def test_the_store_sends_its_scripts_on_the_wire(
    make_queue: Any, env: Environment, redis_url: str
) -> None:
    rq: RunQueue = await make_queue()
    if is_cluster_url(redis_url):
        assert rq._script_client is rq.client  # a cluster keeps redis-py's client
        return
    assert isinstance(rq._script_client, ScriptWire)
    await rq.enqueue(env, "q", "r1", {"x": 1})
    (d,) = await rq.dequeue_from_queue(env, "q", max_count=1)
    assert (d.run_id, d.payload) == ("r1", {"x": 1})
    assert rq._script_client._protocol is not None  # the calls went this way


async def test_a_connection_whose_first_caller_was_cancelled_is_kept_then_closed(
    wire: ScriptWire,
) -> None:
    made: list[Any] = []
    connect = wire._connect

    async def counting(loop: Any) -> Any:
        made.append(await connect(loop))
        return made[-1]

    wire._connect = counting  # type: ignore[method-assign]
    first = asyncio.ensure_future(wire.execute_command("PING"))
    await asyncio.sleep(0)  # the connection is being made for it
    first.cancel()
    assert await wire.execute_command("ECHO", "next") == b"next"
    assert len(made) == 1 and wire._protocol is made[0]  # the same one, not a second
    await wire.aclose()
    assert made[0].transport.is_closing()

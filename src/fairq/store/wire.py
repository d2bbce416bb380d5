"""Script calls on a lean connection: one pipelined RESP2 connection per event loop.

Every state change of fairq is one script call, so the client's cost per awaited call
bounds a producer that triggers one run at a time. redis-py's asyncio client spends most
of an awaited call in its own machinery (on the benchmark machine: a PING took 188 µs of
wall time and 187 µs of CPU through it, 68 µs and 50 µs on a bare asyncio protocol).
:class:`ScriptWire` sends fairq's script calls (``FCALL``, and ``FUNCTION LOAD`` when a
server lost its libraries) on a connection of its own: a call writes its command at once
(hiredis packs it), the replies (parsed by hiredis) resolve the calls in the order they
were sent, so concurrent calls share the connection without waiting for each other.

Everything else (readers, pipelines, blocking reads, pub/sub) stays on the redis-py
client, and so does every script call where the wire does not apply: a cluster, TLS, or
a connection class of the caller's own (:func:`script_wire` says). Replies and errors are
those redis-py gives (bytes, ints, lists; ``ResponseError`` and its subclasses by the
same table). A connection found closed is made again before a call is sent; a call in
flight when its connection breaks is sent again only if the client has a ``retry``
policy (fairq's own client has none: the store reports ``ConnectionLostError`` and its
callers back off), as redis-py would do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import hiredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ExecAbortError,
    MasterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq.packing import HiredisPacking

#: Seconds a connection attempt may take (the redis-py client's default in fairq).
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class WireAddress:
    """Where and how to connect: a TCP address or a Unix socket, credentials, database."""

    host: str
    port: int
    path: str | None
    username: str | None
    password: str | None
    db: int
    connect_timeout_s: float


def _is_plain(cls: type) -> bool:
    """Whether a pool's connection class is redis-py's plain TCP or Unix-socket one (or
    fairq's packing subclass of it)."""
    if issubclass(cls, HiredisPacking):
        cls = cls.__bases__[-1]
    return cls is Connection or cls is UnixDomainSocketConnection


def wire_address(client: Any) -> WireAddress | None:
    """The address of a redis-py asyncio client's server, when the wire can serve its
    script calls (a plain TCP or Unix-socket connection; None for a cluster, TLS, or a
    connection class fairq does not know)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not _is_plain(pool.connection_class):
        return None
    kw = pool.connection_kwargs
    if kw.get("credential_provider") is not None or kw.get("protocol") not in (None, 2, "2"):
        return None
    timeout = kw.get("socket_connect_timeout")
    return WireAddress(
        host=str(kw.get("host", "localhost")),
        port=int(kw.get("port", 6379)),
        path=kw.get("path"),
        username=kw.get("username"),
        password=kw.get("password"),
        db=int(kw.get("db", 0) or 0),
        connect_timeout_s=float(timeout) if timeout else CONNECT_TIMEOUT_S,
    )


#: The exception redis-py raises for an error reply, by the reply's first word (a server,
#: not a cluster: the wire never serves one). Other replies are a ResponseError.
ERRORS_BY_CODE: dict[str, type[RedisError]] = {
    "OOM": OutOfMemoryError,
    "LOADING": BusyLoadingError,
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "MASTERDOWN": MasterDownError,
    "EXECABORT": ExecAbortError,
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
    "NOPERM": NoPermissionError,
}

#: The ``ERR`` replies redis-py raises as something other than a ResponseError.
ERRORS_BY_ERR_MESSAGE: dict[str, type[RedisError]] = {
    "invalid password": AuthenticationError,
    "max number of clients reached": RedisConnectionError,
}


def error_of_reply(reply: str) -> RedisError:
    """The exception for an error reply, as redis-py's own parser makes it: the message
    without its code, except for a plain ``ResponseError``, whose message is all of it."""
    code, _, message = reply.partition(" ")
    kind = ERRORS_BY_ERR_MESSAGE.get(message) if code == "ERR" else ERRORS_BY_CODE.get(code)
    if kind is not None:
        return kind(message)
    return ResponseError(message if code == "ERR" else reply)


class _Protocol(asyncio.Protocol):
    """One connection: commands out as they come, replies matched to them in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reader = hiredis.Reader()
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:  # the stream is unreadable: drop it
                self.abort(RedisConnectionError(f"bad reply from the server: {exc}"))
                return
            if reply is False:
                return
            future = self.waiting.popleft()
            if future.done():  # its caller was cancelled; the reply is consumed anyway
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(error_of_reply(str(reply)))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError(f"connection to the server lost: {exc or 'closed'}"))

    def fail(self, error: RedisError) -> None:
        self.closed = True
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)

    def abort(self, error: RedisError) -> None:
        self.fail(error)
        if self.transport is not None:
            self.transport.abort()

    def send(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Write one command; the future resolves with its reply."""
        future = self.loop.create_future()
        packed = hiredis.pack_command(args)  # TypeError for what it cannot pack: nothing sent
        self.waiting.append(future)
        assert self.transport is not None
        self.transport.write(packed)
        return future


class ScriptWire:
    """Script calls for one server on a lean connection (made on first use in each event
    loop, made again after it broke). Offers the two client methods fairq's scripts use:
    :meth:`fcall` and :meth:`execute_command`."""

    def __init__(self, address: WireAddress, retry: Any = None) -> None:
        self.address = address
        self._retry = retry  # the redis-py client's Retry (None: no retries)
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    async def fcall(self, function: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self.execute_command("FCALL", function, numkeys, *keys_and_args)

    async def execute_command(self, *args: Any) -> Any:
        """Send one command and await its reply (redis-py's reply and error types).

        Raises:
            redis.exceptions.ConnectionError: the server could not be reached (after the
                client's retries).
            redis.exceptions.ResponseError: the server refused the command.
        """
        try:
            return await self._once(args)
        except (RedisConnectionError, RedisTimeoutError) as first:
            if self._retry is None or isinstance(first, AuthenticationError):
                raise
            self._forget()
            return await self._retry.call_with_retry(lambda: self._once(args), self._failed)

    async def _failed(self, _error: Exception) -> None:
        self._forget()

    def _once(self, args: tuple[Any, ...]) -> Awaitable[Any]:
        """Send on the open connection of the running loop (no coroutine when there is
        one), else once it is made."""
        protocol = self._protocol
        if (
            protocol is not None
            and not protocol.closed
            and protocol.loop is asyncio.get_running_loop()
        ):
            return protocol.send(args)
        return self._connect_and_send(args)

    async def _connect_and_send(self, args: tuple[Any, ...]) -> Any:
        return await (await self._connected()).send(args)

    async def _connected(self) -> _Protocol:
        """A new connection in the running loop (made once for all callers that need it)."""
        loop = asyncio.get_running_loop()
        task = self._connecting
        if task is None or task.done() or task.get_loop() is not loop:
            self._forget()
            task = self._connecting = loop.create_task(self._connect(loop))
        # shielded: a caller that is cancelled leaves the connection to the others
        return await asyncio.shield(task)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        a = self.address
        protocol: _Protocol | None = None
        try:
            async with asyncio.timeout(a.connect_timeout_s):
                if a.path is not None:
                    _, protocol = await loop.create_unix_connection(lambda: _Protocol(loop), a.path)
                else:
                    _, protocol = await loop.create_connection(
                        lambda: _Protocol(loop), a.host, a.port
                    )
                if a.password is not None:
                    login = (a.username, a.password) if a.username else (a.password,)
                    await protocol.send(("AUTH", *login))
                if a.db:
                    await protocol.send(("SELECT", a.db))
        except BaseException as exc:
            if protocol is not None:
                _close(protocol)
            if isinstance(exc, TimeoutError):
                raise RedisTimeoutError("timed out connecting to the server") from None
            if isinstance(exc, OSError):
                raise RedisConnectionError(f"cannot connect to the server: {exc}") from None
            raise
        if self._connecting is not asyncio.current_task():
            # closed (or replaced by another loop's connection) meanwhile: not kept
            _close(protocol)
            raise RedisConnectionError("the connection was closed while it was made")
        # kept here, not by the caller: a connection whose callers were all cancelled is
        # still the one the next call uses (and the one aclose closes)
        self._protocol, self._connecting = protocol, None
        return protocol

    def _forget(self) -> None:
        """Drop the connection (it broke, or belongs to another loop)."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            _close(protocol)

    async def aclose(self) -> None:
        """Close the connection (calls still waiting fail with ConnectionError). A
        connection being made is not kept: it closes itself when it is made."""
        task, self._connecting = self._connecting, None
        if task is not None and not task.done() and task.get_loop() is _running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError):
                await task
        self._forget()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _close(protocol: _Protocol) -> None:
    """Close a connection from whichever loop runs now (its own loop may be another)."""
    transport = protocol.transport
    if transport is None or transport.is_closing():
        return
    if protocol.loop is _running_loop():
        transport.close()
    elif not protocol.loop.is_closed():
        with contextlib.suppress(RuntimeError):
            protocol.loop.call_soon_threadsafe(transport.close)


def script_wire(client: Any) -> ScriptWire | None:
    """The wire for a redis-py asyncio client's script calls (None where it does not
    apply: see :func:`wire_address`)."""
    address = wire_address(client)
    if address is None:
        return None
    return ScriptWire(address, client.connection_pool.connection_kwargs.get("retry"))

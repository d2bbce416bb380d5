"""The store's core: the client, the key schema, script calls and error translation.

Every part of :class:`fairq.store.RunQueue` calls scripts through :meth:`StoreCore.call`
and reads through :meth:`StoreCore.read`, which translate driver errors once, here:
a broken connection becomes :class:`ConnectionLostError` naming the server.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, NoReturn, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ClusterError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq.config import RunQueueConfig
from fairq.errors import (
    ConfigurationMismatchError,
    ConnectionLostError,
    FairqError,
    ScriptProtocolError,
)
from fairq.keys import Environment, KeySchema
from fairq.server import AnyRedis
from fairq.store.cluster_routing import route_fcall_by_keys
from fairq.store.context import ScriptContext
from fairq.store.placement import Placement, PlacementCache
from fairq.store.scripts import Order, Script, ScriptRegistry, registry
from fairq.store.status import ReplyMemo, Status, decode
from fairq.store.wire import script_wire

T = TypeVar("T")

#: Errors that mean "not now" rather than "no": the replies CLUSTERDOWN, MASTERDOWN,
#: TRYAGAIN, and a write reaching a replica mid-failover (READONLY); and the cluster
#: client's own, raised outside redis-py's RedisError tree, when it cannot map a slot to a
#: node or reach or agree on the cluster's layout while a node restarts or fails over.
TRANSIENT_SERVER_ERRORS: Final = (ClusterError, TryAgainError, ReadOnlyError, RedisClusterException)

#: How long a process remembers that an environment has fair-order queues (s); after
#: that it tries the age-order scripts again (which refuse, if the fair order is still
#: in use, before writing anything).
FAIR_MEMORY_S: Final = 60.0


def wall_clock_ms() -> int:
    """This process's wall clock, in ms (only for display: scripts use the server's)."""
    return int(time.time() * 1000)


def text_of(value: Any) -> str:
    """A reply value (bytes or str) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def describe_client(client: AnyRedis) -> str:
    """Where a client connects, for error messages (no credentials)."""
    try:
        if isinstance(client, RedisCluster):
            node = client.get_default_node()
            return f"redis+cluster://{node.host}:{node.port}"
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    except Exception:  # never let a message about one error raise another
        return "the Redis/Valkey server"


class StoreCore:
    """What every part of the store shares."""

    def __init__(
        self,
        client: AnyRedis,
        config: RunQueueConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        route_fcall_by_keys(client)
        self.client = client
        #: script calls go on a lean connection where one applies (not on a cluster)
        self._script_client: Any = script_wire(client) or client
        self.config = config or RunQueueConfig()
        self.keys = KeySchema(self.config.prefix, self.config.shard_count)
        self.rng = rng or random.Random()
        self.server = describe_client(client)
        self._scripts: ScriptRegistry = registry()
        self._context = ScriptContext.from_config(self.config, self.keys.wake_channel)
        self._fair_envs: dict[str, float] = {}
        self._meta_checked = False
        #: this process's copy of the placement record (see store/placement.py)
        self.placements = PlacementCache()

    # ------------------------------------------------------------------ order twins

    @property
    def fair(self) -> bool:
        """Whether the fair order is this process's default for queues with no setting."""
        return self.config.vtime.enabled

    def order_for(self, env: Environment) -> Order:
        """Which build of the order-dependent scripts to run for an environment: the fair
        one when it is this process's default or the environment uses it (learned from a
        script that refused to act in the age order)."""
        if self.fair:
            return "fair"
        seen = self._fair_envs.get(env.id)
        if seen is not None and time.monotonic() - seen < FAIR_MEMORY_S:
            return "fair"
        return "age"

    def order_for_shard(self, shard: int) -> Order:
        """The build for a shard-wide script: fair if any environment of it is known fair."""
        if self.fair:
            return "fair"
        now = time.monotonic()
        for env_id, seen in self._fair_envs.items():
            if now - seen < FAIR_MEMORY_S:
                env = Environment.parse(env_id)
                served = self.placements.get(env_id).served
                if shard in self.keys.partition_shards(env, served):
                    return "fair"
        return "age"

    async def placement(self, env: Environment) -> Placement:
        """The environment's partitions (this process's copy of the placement record,
        read again when it is older than PLACEMENT_REFRESH_S)."""
        await self._fresh_placements()
        return self.placements.get(env.id)

    async def spread_placements(self) -> dict[str, Placement]:
        """The environments spread over several partitions (or draining some), by id."""
        await self._fresh_placements()
        return self.placements.spread()

    async def _fresh_placements(self) -> None:
        if not self._meta_checked:
            await self.check_meta()
        if not self.placements.fresh(time.monotonic()):
            await self.refresh_placements()

    async def refresh_placements(self) -> None:
        """Read the placement record again (one round trip)."""
        record = await self.read(self.client.hgetall(self.keys.placement))
        self.placements.load(record, time.monotonic())

    def learn_fair(self, env: Environment) -> None:
        self._fair_envs[env.id] = time.monotonic()

    # ------------------------------------------------------------------ calls

    async def check_meta(self) -> None:
        """Record this process's shard count on the server at first use, or check it.

        Raises:
            ConfigurationMismatchError: another process recorded a different shard count
                for this prefix (its keys would land on other shards).
        """
        if self._meta_checked:
            return
        meta = self.keys.meta
        count = str(self.config.shard_count)

        def agree(pipe: Any) -> None:
            pipe.hsetnx(meta, "shard_count", count)
            pipe.hget(meta, "shard_count")
            pipe.hgetall(self.keys.placement)  # read with it: no round trip of its own

        _, recorded, placements = await self.pipeline(agree)
        self.placements.load(placements, time.monotonic())
        if recorded is not None and text_of(recorded) != count:
            raise ConfigurationMismatchError(
                f"prefix {self.config.prefix!r} uses {text_of(recorded)} shards on this server, "
                f"this process {count}: set FAIRQ_SHARD_COUNT={text_of(recorded)} (changing the "
                "shard count of a prefix needs a migration: see docs/cluster.md)"
            )
        self._meta_checked = True

    async def call(
        self,
        operation: str,
        order: Order,
        tag: str,
        args: list[Any],
        now_ms: int | None,
    ) -> Any:
        """Run one script (the build for ``order``) with its context and ``args``."""
        if not self._meta_checked:
            await self.check_meta()
        script, argv = self.script_argv(operation, order, args, now_ms)
        return await self.read(script(self._script_client, [tag], argv))

    def script_argv(
        self, operation: str, order: Order, args: list[Any], now_ms: int | None
    ) -> tuple[Script, list[Any]]:
        """The build of ``operation`` for ``order``, and its ARGV: the context, then ``args``."""
        script = self._scripts.get(operation, order)
        return script, [*self._context.argv(script.context, now_ms), *args]

    def refused_as_fair(self, env: Environment, order: Order, reply: Any) -> bool:
        """Whether an age-order build refused ``env`` because it uses the fair order (now
        learned): the caller then runs the fair build."""
        if order == "age" and status_of(reply) == Status.NEEDS_FAIR:
            self.learn_fair(env)
            return True
        return False

    async def call_for_env(
        self,
        operation: str,
        env: Environment,
        args: list[Any],
        now_ms: int | None,
        partition: int = 0,
    ) -> Any:
        """Run an order-dependent script for an environment (on one of its partitions);
        when its age-order build refuses (the environment uses the fair order), run the
        fair build instead."""
        tag = self.keys.tag_of(env, partition)
        order = self.order_for(env)
        reply = await self.call(operation, order, tag, args, now_ms)
        if self.refused_as_fair(env, order, reply):
            reply = await self.call(operation, "fair", tag, args, now_ms)
        return reply

    async def read(self, awaitable: Awaitable[T]) -> T:
        """Await a client call, translating a broken connection into ConnectionLostError."""
        try:
            return await awaitable
        except Exception as exc:
            raise_translated(exc, self.server)

    def decode(self, operation: str, code: object) -> Status:
        return decode(operation, code)

    async def pipeline(self, build: Callable[[Any], None]) -> list[Any]:
        """Run the commands ``build`` adds to a non-transactional pipeline (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        build(pipe)
        return list(await self.read(pipe.execute()))

    async def timed_pipeline(self, build: Callable[[Any], None]) -> tuple[int, list[Any]]:
        """:meth:`pipeline` and the server's clock (ms) read with it: in the same round
        trip on one server; beside it on a cluster (whose pipelines take only keyed
        commands)."""
        if isinstance(self.client, RedisCluster):
            now, rows = await asyncio.gather(self.server_time_ms(), self.pipeline(build))
            return now, rows

        def with_clock(pipe: Any) -> None:
            pipe.time()
            build(pipe)

        rows = await self.pipeline(with_clock)
        return _ms(rows[0]), rows[1:]

    async def server_time_ms(self) -> int:
        """The server's clock (ms): what every script's "now" is."""
        return _ms(await self.read(self.client.time()))

    async def now_or_server(self, now_ms: int | None) -> int:
        """``now_ms`` when given, else the server's clock."""
        return now_ms if now_ms is not None else await self.server_time_ms()

    async def close(self) -> None:
        if self._script_client is not self.client:
            await self._script_client.aclose()
        await self.client.aclose()


def _ms(clock: Any) -> int:
    """A ``TIME`` reply in ms."""
    return int(clock[0]) * 1000 + int(clock[1]) // 1000


def raise_translated(exc: Exception, server: str) -> NoReturn:
    """Raise an error a client call raised: a driver error as fairq's (:func:`translated`);
    fairq's own errors (some of which are ConnectionErrors) and anything else unchanged."""
    if isinstance(exc, FairqError):
        raise exc
    mapped = translated(exc, server)
    if mapped is exc:
        raise exc
    raise mapped from exc


def translated(exc: Exception, server: str) -> Exception:
    """The fairq error for a driver error (the exception itself when it is none)."""
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)):
        return ConnectionLostError(server, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TRANSIENT_SERVER_ERRORS):
        # the cluster cannot serve for now (failing over, a node back from a restart, a
        # layout the client cannot map yet): as good as away, and retried the same way
        return ConnectionLostError(server, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, ResponseError):
        return FairqError(f"the server at {server} refused a command: {exc}")
    if isinstance(exc, RedisError):
        return FairqError(f"the server at {server} failed: {exc}")
    return exc


def status_of(reply: Any) -> Status | None:
    """The whole-call status a script's reply starts with (a list's first item, or the first
    word of a text reply such as the enqueue script's); None for a reply without one."""
    if isinstance(reply, list) and reply:
        try:
            return Status(int(reply[0]))
        except (TypeError, ValueError):
            raise ScriptProtocolError("script", reply) from None
    if isinstance(reply, bytes):
        return _TEXT_STATUS(reply)
    if isinstance(reply, str):
        return _leading_status(reply)
    return None


def _leading_status(reply: bytes | str) -> Status | None:
    first = reply.split(maxsplit=1)[:1]
    if first and first[0].isdigit():
        try:
            return Status(int(first[0]))
        except ValueError:
            return None
    return None


#: The whole-call status of short text replies (a one-run enqueue's), looked up.
_TEXT_STATUS: Final = ReplyMemo[Status | None](_leading_status)
